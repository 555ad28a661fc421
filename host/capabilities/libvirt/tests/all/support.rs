//! What the tests share: a call's view over a real `ResourceTable`, private test-driver nodes,
//! the real `libvirtd` (started once when it is not running), per-test dir pools, and an HTTPS
//! image server with its own CA.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use egress_capability_libvirt::bindings::egress::libvirt::libvirt::Error;
use egress_capability_libvirt::{
    Grants, LibvirtCallCtx, LibvirtCapability, LibvirtCtxView, METADATA_NAMESPACE_PREFIX,
};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use wasmtime::component::ResourceTable;

/// The value of a guest call that must have succeeded.
pub fn ok<T>(outcome: wasmtime::Result<Result<T, Error>>) -> T {
    match outcome {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => panic!("the call failed: {error:?}"),
        Err(trap) => panic!("the call trapped: {trap:?}"),
    }
}

/// The guest-visible error of a guest call that must have failed.
pub fn err<T: std::fmt::Debug>(outcome: wasmtime::Result<Result<T, Error>>) -> Error {
    match outcome {
        Ok(Ok(value)) => panic!("the call succeeded: {value:?}"),
        Ok(Err(error)) => error,
        Err(trap) => panic!("the call trapped: {trap:?}"),
    }
}

/// The capability for `grant` given to provider `identity`.
pub fn capability(identity: &str, grant: serde_json::Value) -> LibvirtCapability {
    let grants =
        Grants::from_json(&serde_json::json!({ "grants": { identity: grant } }).to_string())
            .unwrap();
    LibvirtCapability::new(&grants).unwrap()
}

/// One provider call: its libvirt state and resource table, as a store would hold them.
pub struct Call {
    pub ctx: LibvirtCallCtx,
    pub table: ResourceTable,
}

impl Call {
    /// A call of `identity` with ten minutes to go.
    pub fn new(capability: &LibvirtCapability, identity: &str) -> Self {
        Self::until(
            capability,
            identity,
            Instant::now() + Duration::from_secs(600),
        )
    }

    pub fn until(capability: &LibvirtCapability, identity: &str, deadline: Instant) -> Self {
        Self {
            ctx: capability
                .prepare(identity, deadline)
                .expect("a granted provider"),
            table: ResourceTable::new(),
        }
    }

    pub fn view(&mut self) -> LibvirtCtxView<'_> {
        LibvirtCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

pub fn namespace(identity: &str) -> String {
    format!("{METADATA_NAMESPACE_PREFIX}{identity}")
}

/// A private state of libvirt's test driver: `test:///<dir>/node.xml`, with networks `default`
/// (DHCP) and `isolated`, and dir pools `images` (holding `base.qcow2`) and `other`.
pub struct TestNode {
    _dir: tempfile::TempDir,
    pub uri: String,
}

impl TestNode {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.xml");
        std::fs::write(
            &path,
            r#"<node>
  <network>
    <name>default</name>
    <bridge name='virbr0'/>
    <forward/>
    <ip address='192.168.122.1' netmask='255.255.255.0'>
      <dhcp><range start='192.168.122.2' end='192.168.122.254'/></dhcp>
    </ip>
  </network>
  <network>
    <name>isolated</name>
    <bridge name='virbr1'/>
    <ip address='192.168.100.1' netmask='255.255.255.0'/>
  </network>
  <pool type='dir'>
    <name>images</name>
    <target><path>/images</path></target>
    <volume type='file'>
      <name>base.qcow2</name>
      <capacity unit='bytes'>1073741824</capacity>
      <target><format type='qcow2'/></target>
    </volume>
  </pool>
  <pool type='dir'>
    <name>other</name>
    <target><path>/other</path></target>
  </pool>
</node>
"#,
        )
        .unwrap();
        Self {
            uri: format!("test://{}", path.display()),
            _dir: dir,
        }
    }

    /// A grant of this node as connection `node`: pool `images`, network `default`, bridge
    /// `br0`, and the undefine flags the test driver accepts.
    pub fn grant(&self) -> serde_json::Value {
        serde_json::json!({
            "connections": [{
                "name": "node",
                "uri": self.uri,
                "undefineFlags": ["managedSave", "snapshotsMetadata"],
                "pools": ["images"],
                "networks": ["default"],
                "bridges": ["br0"],
            }],
            "timeouts": { "callMs": 10000 },
        })
    }
}

/// Domain XML for the test driver: a volume of `images` and a NIC on `default`, with `metadata`
/// (raw XML) inside `<metadata>` when given.
pub fn domain_xml(name: &str, metadata: Option<&str>) -> String {
    let metadata = metadata
        .map(|element| format!("<metadata>{element}</metadata>"))
        .unwrap_or_default();
    format!(
        r#"<domain type='test'>
  <name>{name}</name>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  {metadata}
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <disk type='volume' device='disk'><source pool='images' volume='base.qcow2'/><target dev='vda' bus='virtio'/></disk>
    <interface type='network'><source network='default'/><mac address='52:54:00:00:00:01'/></interface>
  </devices>
</domain>"#
    )
}

/// Waits until `condition` holds, checking every 50 ms for at most `bound`.
pub fn wait_for(bound: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let end = Instant::now() + bound;
    while !condition() {
        assert!(Instant::now() < end, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

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

/// What the qemu driver needs before libvirtd starts without systemd (see
/// proxmox-libvirt-notes.md, "Running a real libvirtd for tests").
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
    std::fs::create_dir_all("/run/libvirt").unwrap();
}

/// A transient dir pool of the real daemon on a temporary folder, unique to one test; destroyed
/// when dropped.
pub struct DirPool {
    pub name: String,
    pub dir: tempfile::TempDir,
}

impl DirPool {
    pub fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        libvirtd();
        let name = format!(
            "egress-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::tempdir().unwrap();
        let mut connect = virt::connect::Connect::open(Some(SYSTEM_URI)).unwrap();
        let xml = format!(
            "<pool type='dir'><name>{name}</name><target><path>{}</path></target></pool>",
            dir.path().display()
        );
        virt::storage_pool::StoragePool::create_xml(&connect, &xml, 0).unwrap();
        connect.close().unwrap();
        Self { name, dir }
    }

    /// A grant of the real daemon as connection `system`, with this pool.
    pub fn grant(&self) -> serde_json::Value {
        serde_json::json!({
            "connections": [{
                "name": "system",
                "uri": SYSTEM_URI,
                "pools": [self.name],
            }],
            "timeouts": { "callMs": 30000 },
        })
    }

    pub fn path(&self, volume: &str) -> PathBuf {
        self.dir.path().join(volume)
    }
}

impl Drop for DirPool {
    fn drop(&mut self) {
        if let Ok(mut connect) = virt::connect::Connect::open(Some(SYSTEM_URI)) {
            if let Ok(pool) = virt::storage_pool::StoragePool::lookup_by_name(&connect, &self.name)
            {
                let _ = pool.destroy();
            }
            let _ = connect.close();
        }
    }
}

/// A certificate authority made for one test.
pub struct Ca {
    certificate: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        Self { certificate, key }
    }

    pub fn write_pem(&self, path: &Path) {
        std::fs::write(path, self.certificate.pem()).unwrap();
    }
}

/// An HTTPS server on 127.0.0.1 answering each path from a fixed table (404 otherwise), with a
/// leaf of its CA for `127.0.0.1`.
pub struct ImageServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ImageServer {
    pub async fn start(ca: &Ca, files: HashMap<String, Vec<u8>>) -> Self {
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = params.signed_by(&key, &ca.certificate, &ca.key).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let files = Arc::new(
            files
                .into_iter()
                .map(|(path, body)| (path, Bytes::from(body)))
                .collect::<HashMap<_, _>>(),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, files) = (acceptor.clone(), files.clone());
                tokio::spawn(async move {
                    // A refused handshake is what some tests are about.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let found = files.get(request.uri().path()).cloned();
                            async move {
                                let response = match found {
                                    Some(body) => hyper::Response::new(Full::new(body)),
                                    None => hyper::Response::builder()
                                        .status(404)
                                        .body(Full::new(Bytes::from_static(b"not found")))
                                        .unwrap(),
                                };
                                Ok::<_, std::convert::Infallible>(response)
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { addr, task }
    }

    pub fn origin(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }
}

/// Bytes that are not all alike: `length` of a counter pattern.
pub fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
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
