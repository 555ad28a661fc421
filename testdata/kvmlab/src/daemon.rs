//! The real `libvirtd` (and `virtlogd`, which qemu domains need), started for this process when
//! none answers: as root, without systemd. A daemon started here gets SIGTERM when the process
//! exits.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::wait_for;

/// The URI of the real daemon.
pub const SYSTEM_URI: &str = "qemu:///system";

/// Makes sure a real `libvirtd` answers on `qemu:///system`: uses one already running, or
/// starts one for this test process (as root: the qemu driver's user and groups, `/run/libvirt`,
/// then `libvirtd` in its own process group). A daemon started here gets SIGTERM when the test
/// process exits (`PR_SET_PDEATHSIG` from a thread that lives as long as the process).
pub fn libvirtd() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        virt::error::clear_error_callback();
        if answers() {
            return;
        }
        prepare_system();
        spawn_for_life("libvirtd");
        wait_for(Duration::from_secs(30), "libvirtd answering", answers);
    });
}

fn answers() -> bool {
    match virt::connect::Connect::open(Some(SYSTEM_URI)) {
        Ok(mut connect) => {
            let _ = connect.close();
            true
        }
        Err(_) => false,
    }
}

/// What the qemu driver needs before libvirtd starts without systemd: its user and groups
/// (it refuses to start without them) and `/run/libvirt`.
fn prepare_system() {
    let run = |program: &str, args: &[&str]| {
        let _ = std::process::Command::new(program)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    };
    run("groupadd", &["-r", "kvm"]);
    run("groupadd", &["-r", "libvirt-qemu"]);
    run(
        "useradd",
        &["-r", "-g", "kvm", "-s", "/usr/sbin/nologin", "libvirt-qemu"],
    );
    std::fs::create_dir_all("/run/libvirt").expect("making /run/libvirt (run as root)");
}

/// What starting a qemu domain on the real daemon needs beyond `libvirtd`: `virtlogd` (started
/// once when its socket is missing, as `libvirtd` is), the `qemu-system-x86_64` binary, and a
/// host bridge for the NIC, [`TEST_BRIDGE`], made here when missing. Without a guest OS there is
/// no agent and, on a bridge, no lease: such domains run without an address.
pub fn qemu_host() {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        libvirtd();
        assert!(
            Path::new("/usr/bin/qemu-system-x86_64").exists(),
            "qemu-system-x86_64 is missing (apt-get install qemu-system-x86 qemu-utils)"
        );
        allow_kvm_group();
        // A socket file alone proves nothing: a virtlogd started by an earlier test process
        // ends with it and leaves its socket behind, which then refuses every connection.
        let virtlogd_answers = || std::os::unix::net::UnixStream::connect(VIRTLOGD_SOCKET).is_ok();
        if !virtlogd_answers() {
            let _ = std::fs::remove_file(VIRTLOGD_SOCKET);
            let _ = std::fs::remove_file("/run/libvirt/virtlogd-admin-sock");
            spawn_for_life("virtlogd");
            wait_for(
                Duration::from_secs(30),
                "virtlogd answering",
                virtlogd_answers,
            );
        }
        if !Path::new("/sys/class/net").join(TEST_BRIDGE).exists() {
            let made = std::process::Command::new("ip")
                .args(["link", "add", TEST_BRIDGE, "type", "bridge"])
                .status()
                .expect("ip (iproute2) runs");
            assert!(made.success(), "making bridge {TEST_BRIDGE}");
        }
        let up = std::process::Command::new("ip")
            .args(["link", "set", TEST_BRIDGE, "up"])
            .status()
            .expect("ip (iproute2) runs");
        assert!(up.success(), "bringing bridge {TEST_BRIDGE} up");
    });
}

/// Gives `/dev/kvm` the owner and mode Debian's udev rule gives it (`root:kvm`, 0660), which a
/// container's device node may lack. Without it libvirt finds KVM unusable for its qemu user,
/// judges its cached qemu capabilities stale and probes qemu again on every define (over a
/// minute each on a loaded machine).
fn allow_kvm_group() {
    use std::os::unix::fs::PermissionsExt;
    let kvm = Path::new("/dev/kvm");
    if !kvm.exists() {
        return;
    }
    let _ = std::process::Command::new("chgrp")
        .args(["kvm", "/dev/kvm"])
        .status();
    let _ = std::fs::set_permissions(kvm, std::fs::Permissions::from_mode(0o660));
}

/// Where `virtlogd` listens; qemu domains cannot start without it.
const VIRTLOGD_SOCKET: &str = "/run/libvirt/virtlogd-sock";

/// The host bridge test domains' NICs join (no address on it: nothing is routed).
pub const TEST_BRIDGE: &str = "egresstestbr0";

/// Starts `program` in its own process group, stopped with SIGTERM when this test process exits
/// (as [`libvirtd`] does); its stderr goes to `egress-test-<program>.log` in the temp folder.
fn spawn_for_life(program: &'static str) {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{program}-parent"))
        .spawn(move || {
            use std::os::unix::process::CommandExt;
            // Its errors go to a file a failed run can be read from (stdout stays quiet).
            let log = std::env::temp_dir().join(format!("egress-test-{program}.log"));
            let stderr = match std::fs::File::create(&log) {
                Ok(file) => std::process::Stdio::from(file),
                Err(_) => std::process::Stdio::null(),
            };
            let mut command = std::process::Command::new(program);
            command
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(stderr)
                .process_group(0);
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let spawned = command.spawn();
            let started = spawned.is_ok();
            let _ = sender.send(spawned.map(drop));
            if started {
                loop {
                    std::thread::park();
                }
            }
        })
        .unwrap();
    receiver
        .recv()
        .unwrap()
        .unwrap_or_else(|error| panic!("starting {program}: {error}"));
}
