//! SSH transports for real: an `sshd` of the test's own on 127.0.0.1 in front of the real
//! `libvirtd` (through `virt-ssh-helper`), with host keys, client keys and known_hosts made per
//! test. Checks that the grant's files are what libvirt dials with, read on every dial, and that
//! host-key and authentication failures are told apart.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{Error, HostConnection};

use crate::support::*;

/// An sshd accepting `client_key` for root, killed when dropped.
struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", ""])
        .arg("-f")
        .arg(path)
        .status()
        .expect("ssh-keygen (apt-get install openssh-client)");
    assert!(status.success());
}

/// `sshd_config` for `port`, and the known_hosts files naming it, in `dir`.
fn write_files(dir: &Path, port: u16) {
    let path = |name: &str| dir.join(name);
    std::fs::write(
        path("sshd_config"),
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n",
            path("host_key").display(),
            path("authorized_keys").display(),
        ),
    )
    .unwrap();
    let known = |key: &str| {
        let public = std::fs::read_to_string(path(&format!("{key}.pub"))).unwrap();
        let mut fields = public.split_whitespace();
        format!(
            "[127.0.0.1]:{port} {} {}\n",
            fields.next().unwrap(),
            fields.next().unwrap()
        )
    };
    std::fs::write(path("known_hosts"), known("host_key")).unwrap();
    std::fs::write(path("wrong_known_hosts"), known("other_host_key")).unwrap();
    std::fs::write(path("empty_known_hosts"), "").unwrap();
}

impl Sshd {
    fn start() -> Self {
        libvirtd();
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        for key in ["host_key", "client_key", "other_key", "other_host_key"] {
            keygen(&path(key));
        }
        std::fs::copy(path("client_key.pub"), path("authorized_keys")).unwrap();
        // Privilege separation needs it.
        std::fs::create_dir_all("/run/sshd").unwrap();
        // A free port can be taken between finding it and sshd binding it (tests run side by
        // side): an sshd that exits instead of listening is started again on another.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            write_files(dir.path(), port);
            let mut child = Command::new("/usr/sbin/sshd")
                .args(["-D", "-e", "-f"])
                .arg(path("sshd_config"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("sshd (apt-get install openssh-server)");
            // sshd says when it listens (`-e`: its log on stderr); a connection could reach
            // another test's sshd on the same port. The rest of its log is drained.
            let mut log = BufReader::new(child.stderr.take().unwrap()).lines();
            let listening = log
                .by_ref()
                .map_while(Result::ok)
                .any(|line| line.starts_with("Server listening on 127.0.0.1"));
            std::thread::spawn(move || log.for_each(drop));
            if listening {
                return Self { dir, port, child };
            }
            let _ = child.wait();
        }
        panic!("sshd did not listen on any of five free ports");
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A grant of the daemon through this sshd with `transport`, `key` and `known_hosts`.
    fn grant(&self, transport: &str, key: &str, known_hosts: &str) -> serde_json::Value {
        serde_json::json!({
            "connections": [{
                "name": "hv",
                "uri": format!("qemu+{transport}://root@127.0.0.1:{}/system", self.port),
                "sshKeyFile": self.path(key),
                "knownHostsFile": self.path(known_hosts),
            }],
            "timeouts": { "callMs": 20000 },
        })
    }

    async fn open(&self, transport: &str, key: &str, known_hosts: &str) -> Result<String, Error> {
        let capability = capability("kvm2", self.grant(transport, key, known_hosts));
        let mut call = Call::new(&capability, "kvm2");
        let mut view = call.view();
        let connection = match view.open_unpooled("hv".into()).await.unwrap() {
            Ok(connection) => connection,
            Err(error) => return Err(error),
        };
        view.version(connection).await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_granted_key_and_known_hosts_reach_the_daemon_over_libssh2_and_libssh() {
    let sshd = Sshd::start();
    for transport in ["libssh2", "libssh"] {
        let version = sshd
            .open(transport, "client_key", "known_hosts")
            .await
            .unwrap_or_else(|error| panic!("{transport}: {error:?}"));
        assert_eq!(version.split('.').count(), 3, "{version}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_or_changed_host_key_is_host_key() {
    let sshd = Sshd::start();
    for transport in ["libssh2", "libssh"] {
        for known_hosts in ["wrong_known_hosts", "empty_known_hosts"] {
            let error = sshd
                .open(transport, "client_key", known_hosts)
                .await
                .unwrap_err();
            assert!(
                matches!(error, Error::HostKey(_)),
                "{transport} {known_hosts}: {error:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_is_ssh_auth() {
    let sshd = Sshd::start();
    for transport in ["libssh2", "libssh"] {
        let error = sshd
            .open(transport, "other_key", "known_hosts")
            .await
            .unwrap_err();
        assert!(matches!(error, Error::SshAuth(_)), "{transport}: {error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_files_are_read_on_every_dial() {
    let sshd = Sshd::start();
    let capability = capability("kvm2", sshd.grant("libssh2", "client_key", "known_hosts"));
    let mut call = Call::new(&capability, "kvm2");
    ok(call.view().open_unpooled("hv".into()).await);

    // Rotated to a key the server does not accept: the next dial uses it.
    std::fs::copy(sshd.path("other_key"), sshd.path("client_key")).unwrap();
    let error = err(call.view().open_unpooled("hv".into()).await);
    assert!(matches!(error, Error::SshAuth(_)), "{error:?}");

    // Gone: the host says so without dialing, and it is not the key's fault.
    std::fs::remove_file(sshd.path("client_key")).unwrap();
    match err(call.view().open_unpooled("hv".into()).await) {
        Error::CredentialsUnavailable(message) => {
            assert!(message.contains("client_key"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// The Secrets of a host: each key of a Secret is a file of the sshd's folder, read when the
/// grant is set (as the operator resolves `sshKeySecretRef` from a Kubernetes Secret).
struct Secrets<'a>(&'a Sshd);

impl egress_runtime::grant::GrantHost for Secrets<'_> {
    fn secret(
        &self,
        reference: &egress_runtime::grant::SecretKeyRef,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        std::fs::read(self.0.path(&reference.key))
            .map(zeroize::Zeroizing::new)
            .map_err(|error| format!("no Secret key {}: {error}", reference.key))
    }

    fn config_map(
        &self,
        reference: &egress_runtime::grant::SecretKeyRef,
    ) -> Result<String, String> {
        std::fs::read_to_string(self.0.path(&reference.key)).map_err(|error| error.to_string())
    }

    fn file(&self, _path: &std::path::Path) -> Result<(), String> {
        Err("files are refused: name a Secret".into())
    }
}

/// The key and known_hosts from Secrets: written 0600 in the host's private, memory-backed key
/// directory, dialed with, replaced by a new file (and a new dial) when the grant is set again
/// with a rotated key, and removed once no grant holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_a_secret_is_a_private_file_in_memory_used_on_the_next_dial_after_rotation() {
    use egress_runtime::Capability as _;
    use std::os::unix::fs::PermissionsExt;
    let sshd = Sshd::start();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let capability =
        egress_capability_libvirt::LibvirtCapability::with_key_base(shm.path().to_owned())
            .expect("/dev/shm is memory-backed");
    let grant = |key: &str| -> egress_capability_libvirt::LibvirtGrant {
        serde_json::from_value(serde_json::json!({
            "connections": [{
                "name": "hv",
                "uri": format!("qemu+libssh2://root@127.0.0.1:{}/system", sshd.port),
                "sshKeySecretRef": {"name": "ssh", "key": key},
                "knownHostsSecretRef": {"name": "ssh", "key": "known_hosts"},
            }],
            "timeouts": { "callMs": 20000 },
        }))
        .unwrap()
    };
    let set = |key: &str| {
        capability.set_grant(
            "kvm2",
            &grant(key),
            &egress_runtime::grant::GrantContext {
                digests: &[],
                host: &Secrets(&sshd),
            },
        )
    };
    let written = || -> Vec<(String, u32)> {
        let mut files: Vec<(String, u32)> = std::fs::read_dir(shm.path())
            .unwrap()
            .flatten()
            .flat_map(|dir| std::fs::read_dir(dir.path()).unwrap().flatten())
            .map(|file| {
                let mode = file.metadata().unwrap().permissions().mode() & 0o777;
                (file.file_name().into_string().unwrap(), mode)
            })
            .collect();
        files.sort();
        files
    };

    set("client_key").unwrap();
    let dir = std::fs::read_dir(shm.path())
        .unwrap()
        .flatten()
        .next()
        .unwrap();
    assert_eq!(dir.metadata().unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(
        written(),
        [
            ("0-hv-key".to_owned(), 0o600),
            ("1-hv-known_hosts".to_owned(), 0o600)
        ]
    );
    let written_key = std::fs::read(dir.path().join("0-hv-key")).unwrap();
    assert_eq!(written_key, std::fs::read(sshd.path("client_key")).unwrap());
    let mut call = Call::new(&capability, "kvm2");
    ok(call.view().open("hv".into()).await);
    drop(call);

    // Set again with the same Secrets (every resync does): the files, and so the pooled
    // connection, are kept.
    set("client_key").unwrap();
    assert_eq!(
        written(),
        [
            ("0-hv-key".to_owned(), 0o600),
            ("1-hv-known_hosts".to_owned(), 0o600)
        ]
    );

    // Rotated to a key the server refuses: set again, the next dial uses the new file, and the
    // old key file is gone.
    set("other_key").unwrap();
    assert_eq!(
        written(),
        [
            ("1-hv-known_hosts".to_owned(), 0o600),
            ("2-hv-key".to_owned(), 0o600)
        ]
    );
    let mut call = Call::new(&capability, "kvm2");
    let error = err(call.view().open("hv".into()).await);
    assert!(matches!(error, Error::SshAuth(_)), "{error:?}");
    drop(call);

    // A Secret that is not a key is refused when the grant is set: the grant before it stays.
    let refused = set("known_hosts").unwrap_err().to_string();
    assert!(refused.contains("not an SSH private key"), "{refused}");
    assert_eq!(written().len(), 2);

    capability.remove_grant("kvm2");
    assert!(written().is_empty(), "{:?}", written());
    drop(capability);
    assert_eq!(
        std::fs::read_dir(shm.path()).unwrap().count(),
        0,
        "the directory goes at exit"
    );
}
