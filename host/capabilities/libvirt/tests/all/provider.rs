//! The libvirt provider component (`components/libvirt`) through the real runtime and this
//! capability: on a real `libvirtd` with qemu (TCG) and a dir pool in a temporary folder, create
//! imports the base image, clones it, uploads the seed, defines a domain with autostart and starts
//! it, and create of that domain once shut off starts it again; on libvirt's test driver, an
//! adopted running domain reports its address, and adopted domains gain autostart. A qcow2 base is cloned to a qcow2
//! disk. Then the adoption guard (and `not-found` for a domain without our mark), our own paused
//! or suspended domain left to a person, the quota precheck, several connections (the name looked
//! up on every one, placement, a retry continuing where a cut attempt left a volume, list-by-tag
//! and check over all of them), and the crash sweeps: a create or a delete cut before each
//! capability call (`LibvirtCapability::cut_after`, feature `fault-injection`: the call traps as
//! if the host had died there), then retried, ends with one domain, disk and seed, or with nothing
//! left.
//!
//! The test driver has no volume upload, so a create that gets as far as the seed fails there
//! (`permanent`); the placement tests on test-driver nodes read where it cloned the disk. The
//! sweep across two connections pairs the real daemon with a test-driver node whose pool is full.
//!
//! Addresses: without a guest OS there is no agent, and the real daemon's domains sit on a bare
//! bridge (no DHCP), so they run without an address (`provisioning`); the test driver answers
//! addresses for any running domain, so "running with an address" is tested there. The choice
//! between agent and lease addresses is the capability's, and the provider's pick among them is
//! a pure function (`state::first_ipv4`), table-tested in the component.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use egress_capability_libvirt::LibvirtCapability;
use egress_runtime::{
    CallContext, CallError, CheckReason, CheckResult, CreateRequest, ErrorClass, Limits, Provider,
    Request, Response, Runtime, RuntimeConfig, Tag, Vm, VmState,
};
use sha2::{Digest, Sha256};

use crate::support::*;

/// The identity the runtime gives `libvirt.wasm` (its file name), which names the grant.
const IDENTITY: &str = "libvirt";

fn component_path() -> PathBuf {
    testkit::component(IDENTITY)
}

async fn provider(capability: &LibvirtCapability) -> Arc<Provider> {
    let config = RuntimeConfig::default()
        .cache_dir(None)
        .limits(Limits::default().max_concurrent_instances(4))
        .capability(Arc::new(capability.clone()));
    let runtime = Runtime::new(config).expect("runtime builds");
    runtime.load_file(&component_path()).await.unwrap()
}

async fn call(provider: &Provider, request: Request) -> Result<Response, CallError> {
    provider.call(request, &CallContext::default()).await
}

async fn create(
    provider: &Provider,
    config: &serde_json::Value,
    name: &str,
    uid: &str,
) -> Result<Vm, CallError> {
    let request = CreateRequest {
        name: name.into(),
        uid: uid.into(),
        tags: vec![Tag {
            key: "egress.io/pool".into(),
            value: "blue".into(),
        }],
        user_data: "#cloud-config\npackages: [squid]\n".into(),
        config: config.to_string(),
        placement: None,
    };
    match call(provider, Request::Create { request }).await? {
        Response::Create(instance) => Ok(instance),
        other => panic!("create answered {other:?}"),
    }
}

async fn get(provider: &Provider, config: &serde_json::Value, id: &str) -> Result<Vm, CallError> {
    let request = Request::Get {
        config: config.to_string(),
        provider_id: id.into(),
    };
    match call(provider, request).await? {
        Response::Get(instance) => Ok(instance),
        other => panic!("get answered {other:?}"),
    }
}

async fn delete(
    provider: &Provider,
    config: &serde_json::Value,
    id: &str,
) -> Result<(), CallError> {
    let request = Request::Delete {
        config: config.to_string(),
        provider_id: id.into(),
    };
    match call(provider, request).await? {
        Response::Delete => Ok(()),
        other => panic!("delete answered {other:?}"),
    }
}

async fn list(provider: &Provider, config: &serde_json::Value, value: &str) -> Vec<Vm> {
    let request = Request::ListByTag {
        config: config.to_string(),
        key: "egress.io/pool".into(),
        value: value.into(),
    };
    match call(provider, request).await.unwrap() {
        Response::ListByTag(listing) => listing.vms,
        other => panic!("list-by-tag answered {other:?}"),
    }
}

async fn check(provider: &Provider, config: &serde_json::Value) -> CheckResult {
    let request = Request::Check {
        config: config.to_string(),
    };
    match call(provider, request).await.unwrap() {
        Response::Check(result) => result,
        other => panic!("check answered {other:?}"),
    }
}

fn class<T: std::fmt::Debug>(outcome: &Result<T, CallError>) -> Option<ErrorClass> {
    match outcome {
        Err(CallError::Provider(error)) => Some(error.class()),
        _ => None,
    }
}

fn is_cut<T>(outcome: &Result<T, CallError>) -> bool {
    matches!(outcome, Err(CallError::Trap { message }) if message.contains("fault injection"))
}

/// A domain name no other test (or test process) uses.
fn unique_name(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "egress-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The real daemon, a dir pool, an HTTPS origin serving the base image, and the provider's
/// grant and configuration for them.
struct Daemon {
    pool: DirPool,
    _ca_dir: tempfile::TempDir,
    _server: ImageServer,
    /// Test-driver nodes granted beside the daemon.
    _nodes: Vec<tempfile::TempDir>,
    capability: LibvirtCapability,
    grant: serde_json::Value,
    config: serde_json::Value,
    /// The image's format.
    format: &'static str,
    base: String,
}

/// The base image: 1 MiB of guest-visible bytes.
const IMAGE_BYTES: usize = 1 << 20;

/// The base image in `format`: [`pattern`] bytes, raw or converted by `qemu-img`.
fn image(format: &str) -> Vec<u8> {
    let raw = pattern(IMAGE_BYTES, 3);
    if format == "raw" {
        return raw;
    }
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("base.raw"), dir.path().join("base.out"));
    std::fs::write(&input, raw).unwrap();
    let converted = std::process::Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", format])
        .arg(&input)
        .arg(&output)
        .status()
        .expect("qemu-img runs (apt-get install qemu-utils)");
    assert!(converted.success(), "qemu-img convert to {format}");
    std::fs::read(output).unwrap()
}

impl Daemon {
    /// A raw base image, connection `system` only.
    async fn new() -> Self {
        Self::build("raw", |_| Vec::new()).await
    }

    /// A base image in `format`; `nodes` makes test-driver nodes (given the pool's name) whose
    /// connections the grant adds (the config names only `system`).
    async fn build(
        format: &'static str,
        nodes: impl FnOnce(&str) -> Vec<(tempfile::TempDir, serde_json::Value)>,
    ) -> Self {
        qemu_host();
        let pool = DirPool::new();
        let ca = Ca::new("images");
        let ca_dir = tempfile::tempdir().unwrap();
        let ca_file = ca_dir.path().join("ca.pem");
        ca.write_pem(&ca_file);
        let image = image(format);
        let sha256 = hex::encode(Sha256::digest(&image));
        let path = format!("/base.{format}");
        let server = ImageServer::start(&ca, HashMap::from([(path.clone(), image)])).await;
        let mut grant = pool.grant();
        grant["connections"][0]["bridges"] = serde_json::json!([TEST_BRIDGE]);
        let (node_dirs, more): (Vec<_>, Vec<_>) = nodes(&pool.name).into_iter().unzip();
        grant["connections"].as_array_mut().unwrap().extend(more);
        grant["images"] = serde_json::json!({
            "origins": [server.origin()],
            "caFile": ca_file,
        });
        let capability = capability(IDENTITY, grant.clone());
        let config = serde_json::json!({
            "connections": ["system"],
            "pool": pool.name,
            "bridge": TEST_BRIDGE,
            "image": { "url": format!("{}{path}", server.origin()), "sha256": sha256, "format": format },
            "domainType": "qemu",
            "memoryMiB": 64,
            "installGuestAgent": false,
        });
        let base = format!("egress-base-{}.{format}", &sha256[..16]);
        Self {
            pool,
            _ca_dir: ca_dir,
            _server: server,
            _nodes: node_dirs,
            capability,
            grant,
            config,
            format,
            base,
        }
    }

    fn connect() -> virt::connect::Connect {
        virt::connect::Connect::open(Some(SYSTEM_URI)).unwrap()
    }

    /// The volumes in the pool, as libvirt sees them after a refresh.
    fn volumes(&self) -> BTreeSet<String> {
        let mut connect = Self::connect();
        let pool =
            virt::storage_pool::StoragePool::lookup_by_name(&connect, &self.pool.name).unwrap();
        pool.refresh(0).unwrap();
        let names = pool.list_volumes().unwrap().into_iter().collect();
        connect.close().unwrap();
        names
    }

    /// Whether the config asks for whole copies rather than copy-on-write disks.
    fn full_copies(&self) -> bool {
        self.config["diskMode"] == "fullCopy"
    }

    /// The config with disks made in `mode` (`copyOnWrite`, the default, or `fullCopy`).
    fn in_mode(mut self, mode: &str) -> Self {
        self.config["diskMode"] = serde_json::json!(mode);
        self
    }

    /// The grant anew, with images nothing uses removed after `ms`.
    fn retaining(self, ms: u64) -> Self {
        let mut grant = self.grant.clone();
        grant["images"]["unusedRetentionMs"] = serde_json::json!(ms);
        regrant(&self.capability, IDENTITY, grant);
        self
    }

    /// The VM's disk volume: qcow2 when backed by the base, else in the image's format.
    fn disk(&self, name: &str) -> String {
        let format = if self.full_copies() {
            self.format
        } else {
            "qcow2"
        };
        format!("{name}.{format}")
    }

    /// Checks VM `name`'s disk with `qemu-img` (`-U`: a running domain holds its lock): its
    /// format, its virtual size `capacity`, backed by the base or standing alone as the config
    /// asks, and reading the image's bytes (the rest zeros).
    fn assert_disk_reads_the_image(&self, name: &str, capacity: u64, what: &str) {
        let (base, disk) = (self.pool.path(&self.base), self.pool.path(&self.disk(name)));
        let format = if self.full_copies() {
            self.format
        } else {
            "qcow2"
        };
        let output = qemu_img(&["info", "-U", "--output=json", "-f", format], &[&disk]);
        let info: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("{what}: {error}: {output:?}"));
        assert_eq!(info["virtual-size"], capacity, "{what}: {info}");
        if self.full_copies() {
            assert!(info.get("backing-filename").is_none(), "{what}: {info}");
        } else {
            assert_eq!(
                info["backing-filename"],
                base.to_str().unwrap(),
                "{what}: {info}"
            );
            assert_eq!(
                info["backing-filename-format"], self.format,
                "{what}: {info}"
            );
        }
        let compared = qemu_img(
            &["compare", "-U", "-f", self.format, "-F", format],
            &[&base, &disk],
        );
        assert!(compared.status.success(), "{what}: {compared:?}");
    }

    fn volumes_of(&self, name: &str) -> BTreeSet<String> {
        [
            self.base.clone(),
            self.disk(name),
            format!("{name}-seed.iso"),
        ]
        .into()
    }

    /// The domain's `(state, reason)`, or `None` when there is no domain of that name.
    fn domain_state(name: &str) -> Option<(u32, i32)> {
        let mut connect = Self::connect();
        let state = virt::domain::Domain::lookup_by_name(&connect, name)
            .ok()
            .map(|domain| domain.get_state().unwrap());
        connect.close().unwrap();
        state
    }

    /// Whether domain `name` has autostart, read with `virt` directly; `None` when there is no
    /// domain of that name.
    fn autostart(name: &str) -> Option<bool> {
        let mut connect = Self::connect();
        let autostart = virt::domain::Domain::lookup_by_name(&connect, name)
            .ok()
            .map(|domain| domain.get_autostart().unwrap());
        connect.close().unwrap();
        autostart
    }

    /// Removes the base volume, so the next create imports it again.
    fn forget_base(&self) {
        let mut connect = Self::connect();
        let pool =
            virt::storage_pool::StoragePool::lookup_by_name(&connect, &self.pool.name).unwrap();
        pool.refresh(0).unwrap();
        if let Ok(volume) = virt::storage_vol::StorageVol::lookup_by_name(&pool, &self.base) {
            volume.delete(0).unwrap();
        }
        connect.close().unwrap();
    }
}

/// Destroys and undefines a domain of the real daemon when a test ends, passed or not.
struct DomainGuard(String);

impl DomainGuard {
    /// Destroys and undefines the domain now, as a person with `virsh` would.
    fn remove(&self) {
        if let Ok(mut connect) = virt::connect::Connect::open(Some(SYSTEM_URI)) {
            if let Ok(domain) = virt::domain::Domain::lookup_by_name(&connect, &self.0) {
                let _ = domain.destroy();
                let _ = domain.undefine();
            }
            let _ = connect.close();
        }
    }
}

impl Drop for DomainGuard {
    fn drop(&mut self) {
        self.remove();
    }
}

const RUNNING: u32 = virt::sys::VIR_DOMAIN_RUNNING;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_list_delete_on_a_real_libvirtd() {
    let daemon = Daemon::new().await;
    let provider = provider(&daemon.capability).await;
    let name = unique_name("flow");
    let _guard = DomainGuard(name.clone());
    let uid = "6c1f0a2e-0000-4000-8000-000000000001";

    let created = create(&provider, &daemon.config, &name, uid).await.unwrap();
    assert_eq!(created.provider_id, format!("system/{name}"));
    assert_eq!(created.uid, uid);
    assert!(created.created_at.is_some(), "{created:?}");
    assert_eq!(Daemon::domain_state(&name).map(|s| s.0), Some(RUNNING));
    assert_eq!(
        Daemon::autostart(&name),
        Some(true),
        "it starts with the host"
    );
    assert_eq!(daemon.volumes(), daemon.volumes_of(&name));
    // The base holds the image's bytes, the disk is backed by it (copy-on-write, the default),
    // the seed is a NoCloud ISO.
    assert_eq!(
        std::fs::read(daemon.pool.path(&daemon.base)).unwrap(),
        pattern(IMAGE_BYTES, 3)
    );
    daemon.assert_disk_reads_the_image(&name, IMAGE_BYTES as u64, "the disk");
    let seed = std::fs::read(daemon.pool.path(&format!("{name}-seed.iso"))).unwrap();
    assert!(
        seed.windows(6)
            .any(|window| window == b"CIDATA" || window == b"cidata"),
        "the seed's label"
    );
    // The domain's UUID is the Proxy UID.
    let connect = Daemon::connect();
    let domain = virt::domain::Domain::lookup_by_name(&connect, &name).unwrap();
    assert_eq!(domain.get_uuid_string().unwrap(), uid);

    // Running without a guest: no agent, no lease on a bridge, so still provisioning.
    let got = get(&provider, &daemon.config, &created.provider_id)
        .await
        .unwrap();
    assert_eq!(got.state, VmState::Provisioning, "{got:?}");
    assert!(got.addresses.is_empty());
    assert_eq!(got.uid, uid);
    assert_eq!(got.created_at, created.created_at);

    // Idempotent: the same request adopts the running domain.
    let again = create(&provider, &daemon.config, &name, uid).await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(again.created_at, created.created_at);
    assert_eq!(daemon.volumes(), daemon.volumes_of(&name));

    let listed = list(&provider, &daemon.config, "blue").await;
    assert!(
        listed
            .iter()
            .any(|instance| instance.name == name && instance.uid == uid),
        "{listed:?}"
    );
    assert!(
        !list(&provider, &daemon.config, "green")
            .await
            .iter()
            .any(|i| i.name == name)
    );

    delete(&provider, &daemon.config, &created.provider_id)
        .await
        .unwrap();
    assert_eq!(Daemon::domain_state(&name), None);
    assert_eq!(daemon.volumes(), BTreeSet::from([daemon.base.clone()]));
    let gone = get(&provider, &daemon.config, &created.provider_id).await;
    assert_eq!(class(&gone), Some(ErrorClass::NotFound), "{gone:?}");
    delete(&provider, &daemon.config, &created.provider_id)
        .await
        .expect("delete is idempotent");
}

/// K2, the space precheck, counts what the new volumes allocate, not the disk's virtual size: a
/// pool with 10 GiB available takes a 200 GiB copy-on-write disk of a 60 GiB base (its overlay is
/// about 1 MiB), but not a whole copy of the base's 60 GiB of data: `quota-exceeded`, and nothing
/// is made.
/// A `tracing` writer appending to a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything this test binary logs from the first call on, down to `debug`, as the operator's
/// text format writes it. Global: a thread-local subscriber races other tests over `tracing`'s
/// per-callsite interest cache.
fn logs() -> &'static Captured {
    static LOGS: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        logs
    })
}

/// The provider's own lines about VM `vm`.
fn lines_about(vm: &str) -> Vec<String> {
    let logs = String::from_utf8(logs().0.lock().unwrap().clone()).unwrap();
    logs.lines()
        .filter(|line| {
            line.contains("egress_runtime::guest") && line.contains(&format!("vm={vm} "))
        })
        .map(str::to_owned)
        .collect()
}

/// K35, logs a person can debug with: a create logs one `debug` line per capability call (what
/// for, the VM, the connection, how it ended, in how many ms), as many as the host counted, and
/// one `info` line with its outcome; a get of a VM that is gone logs its `not-found`. The seed's
/// user-data, which may hold secrets, is in none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_logs_each_capability_call_and_its_outcome() {
    logs();
    let daemon = Daemon::new().await;
    let provider = provider(&daemon.capability).await;
    let name = unique_name("logged");
    let _guard = DomainGuard(name.clone());
    let secret = "s3cret-in-user-data";
    let counted = daemon.capability.calls();
    let request = CreateRequest {
        name: name.clone(),
        uid: "6c1f0a2e-0000-4000-8000-000000000015".into(),
        tags: Vec::new(),
        user_data: format!("#cloud-config\npassword: {secret}\n"),
        config: daemon.config.to_string(),
        placement: None,
    };
    let created = match call(&provider, Request::Create { request }).await.unwrap() {
        Response::Create(instance) => instance,
        other => panic!("create answered {other:?}"),
    };
    let counted = daemon.capability.calls() - counted;

    let lines = lines_about(&name);
    let calls: Vec<&String> = lines
        .iter()
        .filter(|line| line.contains("libvirt call"))
        .collect();
    // The host counts an import twice: the job, then the lookup of the volume it made.
    let imports = calls
        .iter()
        .filter(|line| line.contains("call=\"import the base image\""))
        .count();
    assert_eq!(
        calls.len() + imports,
        counted,
        "one line per call the host counted:\n{lines:#?}"
    );
    for line in &calls {
        assert!(line.contains(" DEBUG "), "{line}");
        assert!(line.contains("operation=\"create\""), "{line}");
        assert!(line.contains("connection=system"), "{line}");
        assert!(line.contains("outcome="), "{line}");
        assert!(line.contains(" ms="), "{line}");
    }
    for step in [
        "look up the domain",
        "import the base image",
        "make the disk",
        "upload the seed",
        "define the domain",
        "start the domain",
    ] {
        assert!(
            calls.iter().any(|line| line.contains(&format!("call=\"{step}\" connection=system outcome=ok"))),
            "{step}:\n{lines:#?}"
        );
    }
    let finished: Vec<&String> = lines
        .iter()
        .filter(|line| line.contains("libvirt operation finished"))
        .collect();
    assert_eq!(finished.len(), 1, "{lines:#?}");
    assert!(finished[0].contains(" INFO "), "{}", finished[0]);
    assert!(
        finished[0].contains(&format!(
            "outcome=\"ok: {} provisioning\"",
            created.provider_id
        )),
        "{}",
        finished[0]
    );
    assert!(
        lines.iter().all(|line| !line.contains(secret)),
        "{lines:#?}"
    );

    delete(&provider, &daemon.config, &created.provider_id)
        .await
        .unwrap();
    let gone = get(&provider, &daemon.config, &created.provider_id).await;
    assert_eq!(class(&gone), Some(ErrorClass::NotFound), "{gone:?}");
    let lines = lines_about(&name);
    assert!(
        lines.iter().any(|line| line.contains("operation=\"get\"")
            && line.contains("libvirt operation finished")
            && line.contains("outcome=\"not-found: domain")),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_room_for_what_the_disk_allocates_is_quota_exceeded_and_nothing_is_made() {
    const GIB: u64 = 1 << 30;
    let uid = "6c1f0a2e-0000-4000-8000-000000000002";
    let (_f, f) = test_node(
        "f",
        "images",
        &[],
        &[(NODE_BASE, 60 * GIB), ("filler", 30 * GIB)],
    );
    let capability = capability(IDENTITY, serde_json::json!({ "connections": [f] }));
    let provider = provider(&capability).await;
    let mut config = test_driver_config_on(&["f"]);
    config["diskGiB"] = serde_json::json!(200);

    config["diskMode"] = serde_json::json!("fullCopy");
    let outcome = create(&provider, &config, "full", uid).await;
    assert_eq!(
        class(&outcome),
        Some(ErrorClass::QuotaExceeded),
        "{outcome:?}"
    );
    assert!(
        format!("{outcome:?}").contains("pool images on connection f has"),
        "{outcome:?}"
    );
    let [disk, seed] = node_volumes("full");
    let raw_disk = "full.raw";
    let creating = "full.raw.creating";
    assert!(
        held(
            &capability,
            "f",
            "images",
            &[&disk, &seed, raw_disk, creating]
        )
        .await
        .is_empty()
    );

    config["diskMode"] = serde_json::json!("copyOnWrite");
    create_until_the_upload(&provider, &config, "backed", uid).await;
    assert_eq!(node_holds(&capability, "f", "backed").await.len(), 2);
}

/// K23, unused bases: once no VM uses a base, it leaves its pool after the grant's retention
/// (`images.unusedRetentionMs`), at a later create or delete; never while a disk is backed by it
/// or a domain reads it, whatever the retention. The prunes here are deletes of a VM that is
/// gone, polled until the base goes or a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_no_vm_uses_leaves_after_the_retention_and_never_while_a_disk_reads_it() {
    const RETENTION: std::time::Duration = std::time::Duration::from_secs(3);
    let daemon = Daemon::new().await.retaining(RETENTION.as_millis() as u64);
    let provider = provider(&daemon.capability).await;
    let base = || daemon.volumes().contains(&daemon.base);
    let prune = async || {
        delete(&provider, &daemon.config, "system/egress-long-gone")
            .await
            .unwrap();
    };
    let (first, second) = (unique_name("keep1"), unique_name("keep2"));
    let _guards = (DomainGuard(first.clone()), DomainGuard(second.clone()));
    let made = create(
        &provider,
        &daemon.config,
        &first,
        "6c1f0a2e-0000-4000-8000-000000000013",
    )
    .await
    .unwrap();
    create(
        &provider,
        &daemon.config,
        &second,
        "6c1f0a2e-0000-4000-8000-000000000014",
    )
    .await
    .unwrap();
    // One VM gone, the other's disk still reads the base: kept, past the retention too.
    delete(&provider, &daemon.config, &made.provider_id)
        .await
        .unwrap();
    let since = std::time::Instant::now();
    while since.elapsed() < 2 * RETENTION {
        prune().await;
        assert!(base(), "removed while a disk is backed by it");
    }
    // Another owner's domain whose disk is the base file: kept for as long as it is there.
    delete(&provider, &daemon.config, &format!("system/{second}"))
        .await
        .unwrap();
    let foreign = unique_name("foreign");
    let foreign_guard = DomainGuard(foreign.clone());
    {
        let mut connect = Daemon::connect();
        let xml = format!(
            "<domain type='qemu'><name>{foreign}</name><memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os><devices><disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{}'/><target dev='vda' bus='virtio'/></disk></devices></domain>",
            daemon.pool.path(&daemon.base).display()
        );
        virt::domain::Domain::define_xml(&connect, &xml).unwrap();
        connect.close().unwrap();
    }
    let since = std::time::Instant::now();
    let mut last_seen_used = since;
    while since.elapsed() < 2 * RETENTION {
        last_seen_used = std::time::Instant::now();
        prune().await;
        assert!(base(), "removed while a domain reads it");
    }
    foreign_guard.remove();
    // Nothing uses it now: it goes once unused for the retention, counted from the last prune
    // that saw it used, not before.
    let deadline = std::time::Instant::now() + 10 * RETENTION;
    while base() {
        assert!(std::time::Instant::now() < deadline, "the base stayed");
        prune().await;
    }
    let unused_for = last_seen_used.elapsed();
    assert!(unused_for >= RETENTION, "{unused_for:?}");
    assert_eq!(daemon.volumes(), BTreeSet::new());
}

const SHUTOFF: u32 = virt::sys::VIR_DOMAIN_SHUTOFF;

/// The hypervisor rebooted, or a person ran `virsh destroy`, on a domain made before the provider
/// set autostart: create of the same Proxy starts that domain again (same UUID, disk and seed,
/// nothing made anew) and gives it autostart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_of_our_shut_off_domain_starts_it_again_with_autostart() {
    let daemon = Daemon::new().await;
    let provider = provider(&daemon.capability).await;
    let name = unique_name("restart");
    let _guard = DomainGuard(name.clone());
    let uid = "6c1f0a2e-0000-4000-8000-00000000000e";
    let created = create(&provider, &daemon.config, &name, uid).await.unwrap();
    assert_eq!(Daemon::autostart(&name), Some(true));

    {
        let mut connect = Daemon::connect();
        let domain = virt::domain::Domain::lookup_by_name(&connect, &name).unwrap();
        domain.set_autostart(false).unwrap();
        domain.destroy().unwrap();
        connect.close().unwrap();
    }
    assert_eq!(Daemon::domain_state(&name).map(|s| s.0), Some(SHUTOFF));
    assert_eq!(Daemon::autostart(&name), Some(false));
    let stopped = get(&provider, &daemon.config, &created.provider_id)
        .await
        .unwrap();
    assert_eq!(stopped.state, VmState::Stopped, "{stopped:?}");

    let again = create(&provider, &daemon.config, &name, uid).await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(again.created_at, created.created_at, "adopted, not remade");
    assert_eq!(again.state, VmState::Provisioning, "{again:?}");
    assert_eq!(Daemon::domain_state(&name).map(|s| s.0), Some(RUNNING));
    assert_eq!(Daemon::autostart(&name), Some(true));
    let connect = Daemon::connect();
    let domain = virt::domain::Domain::lookup_by_name(&connect, &name).unwrap();
    assert_eq!(domain.get_uuid_string().unwrap(), uid);
    assert_eq!(daemon.volumes(), daemon.volumes_of(&name));

    delete(&provider, &daemon.config, &created.provider_id)
        .await
        .unwrap();
    assert_eq!(Daemon::domain_state(&name), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_cut_before_any_call_then_retried_ends_with_one_domain_disk_and_seed() {
    let daemon = Daemon::new().await;
    let provider = provider(&daemon.capability).await;
    let uid = "6c1f0a2e-0000-4000-8000-000000000003";
    let mut cuts = 0;
    for n in 0.. {
        assert!(n < 64, "create never finished within 64 calls");
        let name = unique_name("cutc");
        let _guard = DomainGuard(name.clone());
        daemon.forget_base();
        daemon.capability.cut_after(Some(n));
        let first = create(&provider, &daemon.config, &name, uid).await;
        daemon.capability.cut_after(None);
        if first.is_ok() {
            delete(&provider, &daemon.config, &format!("system/{name}"))
                .await
                .unwrap();
            break;
        }
        assert!(is_cut(&first), "cut before call {n}: {first:?}");
        cuts += 1;
        let retried = create(&provider, &daemon.config, &name, uid).await;
        let instance = retried
            .unwrap_or_else(|error| panic!("cut before call {n}: the retry failed: {error}"));
        assert_eq!(
            Daemon::domain_state(&name).map(|s| s.0),
            Some(RUNNING),
            "cut before call {n}"
        );
        assert_eq!(Daemon::autostart(&name), Some(true), "cut before call {n}");
        assert_eq!(
            daemon.volumes(),
            daemon.volumes_of(&name),
            "cut before call {n}"
        );
        assert_eq!(instance.uid, uid);
        delete(&provider, &daemon.config, &instance.provider_id)
            .await
            .unwrap();
        assert_eq!(
            daemon.volumes(),
            BTreeSet::from([daemon.base.clone()]),
            "cut before call {n}"
        );
    }
    assert!(cuts >= 10, "a create makes more calls than {cuts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_cut_before_any_call_then_retried_leaves_nothing_behind() {
    let daemon = Daemon::new().await;
    let provider = provider(&daemon.capability).await;
    let uid = "6c1f0a2e-0000-4000-8000-000000000004";
    let mut cuts = 0;
    for n in 0.. {
        assert!(n < 64, "delete never finished within 64 calls");
        let name = unique_name("cutd");
        let _guard = DomainGuard(name.clone());
        let instance = create(&provider, &daemon.config, &name, uid).await.unwrap();
        daemon.capability.cut_after(Some(n));
        let first = delete(&provider, &daemon.config, &instance.provider_id).await;
        daemon.capability.cut_after(None);
        if first.is_ok() {
            assert_eq!(Daemon::domain_state(&name), None);
            assert_eq!(daemon.volumes(), BTreeSet::from([daemon.base.clone()]));
            break;
        }
        assert!(is_cut(&first), "cut before call {n}: {first:?}");
        cuts += 1;
        delete(&provider, &daemon.config, &instance.provider_id)
            .await
            .unwrap_or_else(|error| panic!("cut before call {n}: the retry failed: {error}"));
        assert_eq!(Daemon::domain_state(&name), None, "cut before call {n}");
        assert_eq!(
            daemon.volumes(),
            BTreeSet::from([daemon.base.clone()]),
            "cut before call {n}"
        );
    }
    assert!(cuts >= 6, "a delete makes more calls than {cuts}");
}

/// §1e: a domain that vanishes at any step of a delete (someone undefined it meanwhile) still
/// has its disk and seed removed, found by name; `not-found` there would make the operator count
/// the delete as done and leave them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_that_vanishes_at_any_step_of_delete_still_has_its_volumes_removed() {
    let daemon = Daemon::new().await;
    let provider = provider(&daemon.capability).await;
    let uid = "6c1f0a2e-0000-4000-8000-000000000011";
    let mut vanished_at = 0;
    for n in 0.. {
        assert!(n < 32, "delete never finished within 32 calls");
        let name = unique_name("vanish");
        let _guard = DomainGuard(name.clone());
        let instance = create(&provider, &daemon.config, &name, uid).await.unwrap();
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hook = {
            let (name, fired) = (name.clone(), fired.clone());
            Box::new(move || {
                DomainGuard(name).remove();
                fired.store(true, Ordering::SeqCst);
            })
        };
        daemon.capability.before_call(Some((n, hook)));
        let outcome = delete(&provider, &daemon.config, &instance.provider_id).await;
        daemon.capability.before_call(None);
        outcome.unwrap_or_else(|error| panic!("vanished before call {n}: {error}"));
        assert_eq!(
            Daemon::domain_state(&name),
            None,
            "vanished before call {n}"
        );
        assert_eq!(
            daemon.volumes(),
            BTreeSet::from([daemon.base.clone()]),
            "vanished before call {n}"
        );
        if !fired.load(Ordering::SeqCst) {
            break;
        }
        vanished_at += 1;
    }
    assert!(
        vanished_at >= 6,
        "a delete makes more calls than {vanished_at}"
    );
}

/// A domain in a test-driver node's file: running unless `runstate` (a `virDomainState`, the
/// test driver's `test:runstate`) says otherwise.
struct NodeDomain {
    name: String,
    /// Raw XML inside `<metadata>`.
    metadata: String,
    runstate: Option<u32>,
}

impl NodeDomain {
    fn new(name: &str, metadata: String) -> Self {
        Self {
            name: name.into(),
            metadata,
            runstate: None,
        }
    }

    fn in_state(mut self, runstate: u32) -> Self {
        self.runstate = Some(runstate);
        self
    }
}

/// The marks' owner: the grants here name none.
const OWNER: &str = "egress-operator";

/// This provider's mark with `uid` and the tag pool=blue, as libvirt hands it back.
fn our_mark(uid: &str) -> String {
    mark_in(&namespace(OWNER), uid)
}

fn mark_in(namespace: &str, uid: &str) -> String {
    format!(
        r#"<egress:proxy xmlns:egress="{namespace}" uid="{uid}" created-at="2026-11-30T10:00:00Z"><egress:tag key="egress.io/pool" value="blue"/></egress:proxy>"#
    )
}

/// The test driver's pools hold 100 GiB whatever their XML says.
const NODE_POOL_BYTES: u64 = 100 << 30;

/// The base volume [`test_driver_config`] names (its sha256 is 64 `a`s, raw).
const NODE_BASE: &str = "egress-base-aaaaaaaaaaaaaaaa.raw";

/// A private test-driver node, `test:///<tmp>/node.xml`: network `default`, the `domains`, and a
/// dir pool `pool` holding `volumes` (name, bytes, all allocated: a large one leaves the pool
/// less available). Returns its folder and its grant entry as connection `connection`.
fn test_node(
    connection: &str,
    pool: &str,
    domains: &[NodeDomain],
    volumes: &[(&str, u64)],
) -> (tempfile::TempDir, serde_json::Value) {
    let domains: String = domains
        .iter()
        .enumerate()
        .map(|(index, domain)| {
            let runstate = domain
                .runstate
                .map(|state| format!("<test:runstate>{state}</test:runstate>"))
                .unwrap_or_default();
            format!(
                r#"<domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <metadata>{metadata}</metadata>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <interface type='network'><source network='default'/><mac address='52:54:00:00:00:{index:02x}'/></interface>
  </devices>
  {runstate}
</domain>
"#,
                name = domain.name,
                metadata = domain.metadata,
            )
        })
        .collect();
    let volumes: String = volumes
        .iter()
        .map(|(name, bytes)| {
            format!(
                "<volume type='file'><name>{name}</name><capacity unit='bytes'>{bytes}</capacity><allocation unit='bytes'>{bytes}</allocation></volume>\n"
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.xml");
    std::fs::write(
        &path,
        format!(
            r#"<node>
  <network>
    <name>default</name>
    <bridge name='virbr0'/>
    <forward/>
    <ip address='192.168.122.1' netmask='255.255.255.0'>
      <dhcp><range start='192.168.122.2' end='192.168.122.254'/></dhcp>
    </ip>
  </network>
  {domains}
  <pool type='dir'>
    <name>{pool}</name>
    <target><path>/images</path></target>
    {volumes}
  </pool>
</node>
"#
        ),
    )
    .unwrap();
    let grant = serde_json::json!({
        "name": connection,
        "uri": format!("test://{}", path.display()),
        "undefineFlags": ["managedSave", "snapshotsMetadata"],
        "pools": [pool],
        "networks": ["default"],
        "bridges": [TEST_BRIDGE],
    });
    (dir, grant)
}

/// A test-driver node holding three domains named by the test, each running: `ours` with this
/// provider's mark (UID `uid`, tag pool=blue) and its disk and seed volumes in `images`,
/// `foreign` with another UID's mark, `unmarked` with none; granted as connection `node`.
fn test_node_with_domains(
    ours: &str,
    uid: &str,
    foreign: &str,
    unmarked: &str,
) -> (tempfile::TempDir, serde_json::Value) {
    let (dir, connection) = test_node(
        "node",
        "images",
        &[
            NodeDomain::new(ours, our_mark(uid)),
            NodeDomain::new(foreign, our_mark("another-uid")),
            NodeDomain::new(unmarked, String::new()),
        ],
        &[
            (format!("{ours}.raw").as_str(), 1 << 20),
            (format!("{ours}-seed.iso").as_str(), 4096),
            (format!("{foreign}.raw").as_str(), 1 << 20),
        ],
    );
    (dir, serde_json::json!({ "connections": [connection] }))
}

/// The config for test-driver nodes named `connections`: pool `images`, network `default`.
fn test_driver_config_on(connections: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "connections": connections,
        "pool": "images",
        "network": "default",
        "image": { "url": "https://images.invalid/base.raw", "sha256": "a".repeat(64), "format": "raw" },
        "domainType": "test",
    })
}

fn test_driver_config() -> serde_json::Value {
    test_driver_config_on(&["node"])
}

/// The names of `names` that pool `pool` of connection `connection` holds, read through the
/// capability (a test-driver node's state lives in the capability's pooled connection only).
async fn held(
    capability: &LibvirtCapability,
    connection: &str,
    pool: &str,
    names: &[&str],
) -> BTreeSet<String> {
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
        HostConnection, HostStoragePool,
    };
    let mut call = Call::new(capability, IDENTITY);
    let mut view = call.view();
    let connection = ok(view.open(connection.into()).await);
    let pool = ok(view.storage_pool(connection, pool.into()).await);
    let mut found = BTreeSet::new();
    for name in names {
        let volume = ok(view
            .lookup_volume(
                wasmtime::component::Resource::new_borrow(pool.rep()),
                (*name).into(),
            )
            .await);
        if volume.is_some() {
            found.insert((*name).to_owned());
        }
    }
    found
}

/// The state of domain `name` on `connection`, read through the capability; `None` when there is
/// no such domain.
async fn node_domain_state(
    capability: &LibvirtCapability,
    connection: &str,
    name: &str,
) -> Option<egress_capability_libvirt::bindings::egress::libvirt::libvirt::DomainState> {
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
        HostConnection, HostDomain,
    };
    let mut call = Call::new(capability, IDENTITY);
    let mut view = call.view();
    let connection = ok(view.open(connection.into()).await);
    let domain = ok(view.lookup_domain(connection, name.into()).await)?;
    Some(ok(view.status(domain).await).state)
}

/// Whether domain `name` on `connection` has autostart, read through the capability.
async fn node_autostart(capability: &LibvirtCapability, connection: &str, name: &str) -> bool {
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
        HostConnection, HostDomain,
    };
    let mut call = Call::new(capability, IDENTITY);
    let mut view = call.view();
    let connection = ok(view.open(connection.into()).await);
    let domain = ok(view.lookup_domain(connection, name.into()).await).expect("the domain");
    ok(view.autostart(domain).await)
}

/// A VM's disk (copy-on-write, so qcow2) and seed on a test-driver node.
fn node_volumes(name: &str) -> [String; 2] {
    [format!("{name}.qcow2"), format!("{name}-seed.iso")]
}

async fn node_holds(
    capability: &LibvirtCapability,
    connection: &str,
    name: &str,
) -> BTreeSet<String> {
    let [disk, seed] = node_volumes(name);
    held(
        capability,
        connection,
        "images",
        &[disk.as_str(), seed.as_str()],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_running_domain_reports_its_address_and_is_deleted_on_the_test_driver() {
    let uid = "6c1f0a2e-0000-4000-8000-000000000005";
    let (_dir, grant) = test_node_with_domains("proxy-a", uid, "proxy-b", "proxy-c");
    let capability = capability(IDENTITY, grant);
    let provider = provider(&capability).await;
    let config = test_driver_config();

    // Adopted at once: no image import (its origin is not even granted), no volume made.
    let adopted = create(&provider, &config, "proxy-a", uid).await.unwrap();
    assert_eq!(adopted.provider_id, "node/proxy-a");
    assert_eq!(adopted.created_at.as_deref(), Some("2026-11-30T10:00:00Z"));

    let got = get(&provider, &config, "node/proxy-a").await.unwrap();
    assert_eq!(got.state, VmState::Running, "{got:?}");
    assert_eq!(got.addresses.len(), 1, "{got:?}");
    assert!(got.addresses[0].starts_with("192.168.122."), "{got:?}");

    let mut listed: Vec<_> = list(&provider, &config, "blue")
        .await
        .into_iter()
        .map(|i| (i.name, i.uid))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("proxy-a".to_owned(), uid.to_owned()),
            ("proxy-b".to_owned(), "another-uid".to_owned())
        ]
    );

    delete(&provider, &config, "node/proxy-a").await.unwrap();
    let gone = get(&provider, &config, "node/proxy-a").await;
    assert_eq!(class(&gone), Some(ErrorClass::NotFound), "{gone:?}");
    // Its volumes went with it; the foreign domain's disk stayed.
    assert_eq!(
        held(
            &capability,
            "node",
            "images",
            &["proxy-a.raw", "proxy-a-seed.iso", "proxy-b.raw"]
        )
        .await,
        BTreeSet::from(["proxy-b.raw".to_owned()])
    );
}

/// Issue 32: a domain made before the operator named its installation in the tags gains the
/// request's tags when create adopts it; its UID and creation time stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopting_a_domain_writes_the_requests_tags_into_its_mark() {
    let uid = "6c1f0a2e-0000-4000-8000-000000000009";
    let (_dir, grant) = test_node_with_domains("proxy-a", uid, "proxy-b", "proxy-c");
    let capability = capability(IDENTITY, grant);
    let provider = provider(&capability).await;
    let config = test_driver_config();
    let by_installation = || async {
        let request = Request::ListByTag {
            config: config.to_string(),
            key: "egress-operator.io/installation".into(),
            value: "cluster-a".into(),
        };
        match call(&provider, request).await.unwrap() {
            Response::ListByTag(listing) => listing
                .vms
                .into_iter()
                .map(|instance| instance.name)
                .collect::<Vec<_>>(),
            other => panic!("list-by-tag answered {other:?}"),
        }
    };
    assert!(by_installation().await.is_empty());

    let request = CreateRequest {
        name: "proxy-a".into(),
        uid: uid.into(),
        tags: vec![
            Tag {
                key: "egress-operator.io/installation".into(),
                value: "cluster-a".into(),
            },
            Tag {
                key: "egress.io/pool".into(),
                value: "blue".into(),
            },
        ],
        user_data: "#cloud-config\n".into(),
        config: config.to_string(),
        placement: None,
    };
    let adopted = match call(&provider, Request::Create { request }).await.unwrap() {
        Response::Create(instance) => instance,
        other => panic!("create answered {other:?}"),
    };
    assert_eq!(
        (adopted.uid.as_str(), adopted.created_at.as_deref()),
        (uid, Some("2026-11-30T10:00:00Z"))
    );
    assert_eq!(by_installation().await, ["proxy-a"]);
    let by_pool: Vec<String> = list(&provider, &config, "blue")
        .await
        .into_iter()
        .map(|instance| instance.name)
        .collect();
    assert!(by_pool.contains(&"proxy-a".to_owned()), "{by_pool:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_with_our_name_but_another_or_no_uid_is_never_adopted_or_deleted() {
    let uid = "6c1f0a2e-0000-4000-8000-000000000006";
    let (_dir, grant) = test_node_with_domains("proxy-a", uid, "proxy-b", "proxy-c");
    let capability = capability(IDENTITY, grant);
    let provider = provider(&capability).await;
    let config = test_driver_config();

    for name in ["proxy-b", "proxy-c"] {
        let outcome = create(&provider, &config, name, uid).await;
        assert_eq!(
            class(&outcome),
            Some(ErrorClass::Permanent),
            "{name}: {outcome:?}"
        );
    }
    // The unmarked one, even with the request's UID as its UUID, is not adopted while it runs.
    let outcome = delete(&provider, &config, "node/proxy-c").await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    // Not ours: get answers not-found (the contract's rule), never permanent.
    let outcome = get(&provider, &config, "node/proxy-c").await;
    assert_eq!(class(&outcome), Some(ErrorClass::NotFound), "{outcome:?}");
    // The foreign domain is still there and still running (get reads it: it carries a mark).
    let foreign = get(&provider, &config, "node/proxy-b").await.unwrap();
    assert_eq!(foreign.uid, "another-uid");
    assert_eq!(foreign.state, VmState::Running);
}

/// K15, docs/contract.md: `get` of a provider ID this provider never makes is `not-found` (the
/// operator then creates again), never `permanent`; `delete` of one stays `permanent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_of_a_malformed_provider_id_is_not_found_and_delete_of_one_permanent() {
    let (_dir, grant) = test_node_with_domains(
        "proxy-a",
        "6c1f0a2e-0000-4000-8000-000000000010",
        "proxy-b",
        "proxy-c",
    );
    let capability = capability(IDENTITY, grant);
    let provider = provider(&capability).await;
    let config = test_driver_config();
    for id in ["", "node", "node/", "/proxy-a", "node/proxy-a/x"] {
        let got = get(&provider, &config, id).await;
        assert_eq!(class(&got), Some(ErrorClass::NotFound), "{id:?}: {got:?}");
        let deleted = delete(&provider, &config, id).await;
        assert_eq!(
            class(&deleted),
            Some(ErrorClass::Permanent),
            "{id:?}: {deleted:?}"
        );
    }
    // Nothing was touched.
    assert!(get(&provider, &config, "node/proxy-a").await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_of_a_domain_without_our_mark_is_not_found_and_create_and_delete_leave_it_alone() {
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::DomainState;
    let uid = "6c1f0a2e-0000-4000-8000-000000000007";
    let ns = namespace(OWNER);
    let (_dir, connection) = test_node(
        "node",
        "images",
        &[
            NodeDomain::new("unmarked", String::new()),
            // Another owner's mark: the host shows us only our own namespace.
            NodeDomain::new("theirs", mark_in(&namespace("other-owner"), uid)),
            // An element in our namespace that is not a mark.
            NodeDomain::new(
                "not-a-mark",
                format!(r#"<e:note xmlns:e="{ns}" uid="{uid}"/>"#),
            ),
            NodeDomain::new("unmarked-off", String::new()).in_state(5),
        ],
        &[("unmarked.qcow2", 1 << 20), ("unmarked-seed.iso", 4096)],
    );
    let capability = capability(IDENTITY, serde_json::json!({ "connections": [connection] }));
    let provider = provider(&capability).await;
    let config = test_driver_config();

    for name in ["unmarked", "theirs", "not-a-mark", "unmarked-off"] {
        let id = format!("node/{name}");
        let got = get(&provider, &config, &id).await;
        assert_eq!(class(&got), Some(ErrorClass::NotFound), "{name}: {got:?}");
        assert!(format!("{got:?}").contains("not ours"), "{name}: {got:?}");
        let created = create(&provider, &config, name, uid).await;
        assert_eq!(
            class(&created),
            Some(ErrorClass::Permanent),
            "{name}: {created:?}"
        );
        let deleted = delete(&provider, &config, &id).await;
        assert_eq!(
            class(&deleted),
            Some(ErrorClass::Permanent),
            "{name}: {deleted:?}"
        );
    }
    for (name, state) in [
        ("unmarked", DomainState::Running),
        ("theirs", DomainState::Running),
        ("not-a-mark", DomainState::Running),
        ("unmarked-off", DomainState::Shutoff),
    ] {
        assert_eq!(
            node_domain_state(&capability, "node", name).await,
            Some(state),
            "{name}"
        );
    }
    assert_eq!(
        node_holds(&capability, "node", "unmarked").await.len(),
        2,
        "its volumes stay"
    );
}

/// `virDomainState`: `VIR_DOMAIN_PAUSED`, `VIR_DOMAIN_SHUTOFF`, `VIR_DOMAIN_PMSUSPENDED`.
const PAUSED: u32 = 3;
const NODE_SHUTOFF: u32 = 5;
const PM_SUSPENDED: u32 = 7;

/// Domains of ours made before the provider set autostart: create adopts them, starts the shut
/// off one, and gives both autostart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_starts_our_shut_off_domain_and_gives_every_adopted_one_autostart() {
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::DomainState;
    let uid = "6c1f0a2e-0000-4000-8000-00000000000f";
    let (_dir, connection) = test_node(
        "node",
        "images",
        &[
            NodeDomain::new("running", our_mark(uid)),
            NodeDomain::new("off", our_mark(uid)).in_state(NODE_SHUTOFF),
        ],
        &[],
    );
    let capability = capability(IDENTITY, serde_json::json!({ "connections": [connection] }));
    let provider = provider(&capability).await;
    let config = test_driver_config();

    for name in ["running", "off"] {
        assert!(!node_autostart(&capability, "node", name).await, "{name}");
    }
    assert_eq!(
        node_domain_state(&capability, "node", "off").await,
        Some(DomainState::Shutoff)
    );
    for name in ["running", "off"] {
        let adopted = create(&provider, &config, name, uid).await.unwrap();
        assert_eq!(adopted.provider_id, format!("node/{name}"));
        assert_eq!(adopted.created_at.as_deref(), Some("2026-11-30T10:00:00Z"));
        assert_eq!(
            node_domain_state(&capability, "node", name).await,
            Some(DomainState::Running),
            "{name}"
        );
        assert!(node_autostart(&capability, "node", name).await, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_paused_or_suspended_domain_is_returned_as_it_is_in_the_state_get_reports() {
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::DomainState;
    let uid = "6c1f0a2e-0000-4000-8000-000000000008";
    let (_dir, connection) = test_node(
        "node",
        "images",
        &[
            NodeDomain::new("paused", our_mark(uid)).in_state(PAUSED),
            NodeDomain::new("suspended", our_mark(uid)).in_state(PM_SUSPENDED),
        ],
        &[],
    );
    let capability = capability(IDENTITY, serde_json::json!({ "connections": [connection] }));
    let provider = provider(&capability).await;
    let config = test_driver_config();

    // Issue 32: kvm2 answered create "resume or destroy it" (permanent), which latched the Proxy
    // after a person resumed the domain. Now create returns it untouched in the state get reports:
    // paused by a person (theirs to resume), or suspended by its guest (failed: replaced, as no
    // wake-up goes through the capability).
    for (name, state, reported) in [
        ("paused", DomainState::Paused, VmState::Paused),
        ("suspended", DomainState::PmSuspended, VmState::Failed),
    ] {
        let created = create(&provider, &config, name, uid).await.unwrap();
        assert_eq!(created.state, reported, "{name}: {created:?}");
        assert_eq!(
            node_domain_state(&capability, "node", name).await,
            Some(state),
            "{name}: neither started nor resumed"
        );
        let got = get(&provider, &config, &format!("node/{name}"))
            .await
            .unwrap();
        assert_eq!(got.state, reported, "{name}: {got:?}");
        assert_eq!(got.uid, uid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_connections_create_adopts_the_domain_on_the_other_node_and_list_sees_both() {
    let uid = "6c1f0a2e-0000-4000-8000-000000000009";
    // Node a has the base image and room, so a create that did not look on b would make the VM
    // on a.
    let (_a, a) = test_node(
        "a",
        "images",
        &[NodeDomain::new("proxy-x", our_mark("uid-x"))],
        &[(NODE_BASE, 1 << 20)],
    );
    let (_b, b) = test_node(
        "b",
        "images",
        &[
            NodeDomain::new("proxy-a", our_mark(uid)),
            NodeDomain::new("proxy-c", String::new()),
        ],
        &[("proxy-a.raw", 1 << 20), ("proxy-a-seed.iso", 4096)],
    );
    let capability = capability(IDENTITY, serde_json::json!({ "connections": [a, b] }));
    let provider = provider(&capability).await;

    for placement in ["mostAvailable", "firstWithRoom"] {
        let mut config = test_driver_config_on(&["a", "b"]);
        config["placement"] = serde_json::json!(placement);
        let adopted = create(&provider, &config, "proxy-a", uid).await.unwrap();
        assert_eq!(adopted.provider_id, "b/proxy-a", "{placement}");
        assert_eq!(adopted.created_at.as_deref(), Some("2026-11-30T10:00:00Z"));
        assert!(
            node_holds(&capability, "a", "proxy-a").await.is_empty(),
            "{placement}"
        );
        // Not ours on b: never adopted, whatever a offers.
        let outcome = create(&provider, &config, "proxy-c", uid).await;
        assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
        assert!(node_holds(&capability, "a", "proxy-c").await.is_empty());
    }

    let config = test_driver_config_on(&["a", "b"]);
    let got = get(&provider, &config, "b/proxy-a").await.unwrap();
    assert_eq!(got.state, VmState::Running, "{got:?}");
    let mut listed: Vec<_> = list(&provider, &config, "blue")
        .await
        .into_iter()
        .map(|i| (i.provider_id, i.uid))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("a/proxy-x".to_owned(), "uid-x".to_owned()),
            ("b/proxy-a".to_owned(), uid.to_owned())
        ]
    );
    // Only the config's connections are listed.
    let only_b = list(&provider, &test_driver_config_on(&["b"]), "blue").await;
    assert_eq!(only_b.len(), 1, "{only_b:?}");

    let checked = check(&provider, &config).await;
    assert_eq!(checked.reason, CheckReason::Ok, "{checked:?}");
    assert!(
        checked.message.contains("a: libvirt") && checked.message.contains("b: libvirt"),
        "{checked:?}"
    );
}

/// Where a create on test-driver nodes cloned the disk: it then fails at the seed's upload,
/// which the test driver lacks.
async fn create_until_the_upload(
    provider: &Provider,
    config: &serde_json::Value,
    name: &str,
    uid: &str,
) {
    let outcome = create(provider, config, name, uid).await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    assert!(
        format!("{outcome:?}").contains("the seed's upload"),
        "{outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_follows_the_rule_and_a_retry_continues_where_a_volume_was_left() {
    let uid = "6c1f0a2e-0000-4000-8000-00000000000a";
    // a: under 1 MiB available; b: 50 GiB; c: all but the base.
    let (_a, a) = test_node(
        "a",
        "images",
        &[],
        &[
            (NODE_BASE, 1 << 20),
            ("filler", NODE_POOL_BYTES - (2 << 20) + 4096),
        ],
    );
    let (_b, b) = test_node(
        "b",
        "images",
        &[],
        &[(NODE_BASE, 1 << 20), ("filler", 50 << 30)],
    );
    let (_c, c) = test_node("c", "images", &[], &[(NODE_BASE, 1 << 20)]);
    // d and e alike: a tie.
    let (_d, d) = test_node("d", "images", &[], &[(NODE_BASE, 1 << 20)]);
    let (_e, e) = test_node("e", "images", &[], &[(NODE_BASE, 1 << 20)]);
    let capability = capability(
        IDENTITY,
        serde_json::json!({ "connections": [a, b, c, d, e] }),
    );
    let provider = provider(&capability).await;
    let config = |connections: &[&str], placement: &str, disk_gib: Option<u64>| {
        let mut config = test_driver_config_on(connections);
        config["placement"] = serde_json::json!(placement);
        if let Some(gib) = disk_gib {
            config["diskGiB"] = serde_json::json!(gib);
        }
        config
    };
    let holders = async |name: &str| {
        let mut holders = Vec::new();
        for node in ["a", "b", "c", "d", "e"] {
            let held = node_holds(&capability, node, name).await;
            if !held.is_empty() {
                holders.push((node, held.len()));
            }
        }
        holders
    };

    // firstWithRoom: a cannot take a 1 MiB disk and a seed; b can.
    create_until_the_upload(
        &provider,
        &config(&["a", "b", "c"], "firstWithRoom", None),
        "p1",
        uid,
    )
    .await;
    assert_eq!(holders("p1").await, [("b", 2)]);
    // mostAvailable: c.
    create_until_the_upload(
        &provider,
        &config(&["a", "b", "c"], "mostAvailable", None),
        "p2",
        uid,
    )
    .await;
    assert_eq!(holders("p2").await, [("c", 2)]);
    // firstWithRoom for a 200 GiB disk, larger than any pool: copy-on-write, it allocates
    // about 1 MiB, so b has room.
    create_until_the_upload(
        &provider,
        &config(&["a", "b", "c"], "firstWithRoom", Some(200)),
        "p3",
        uid,
    )
    .await;
    assert_eq!(holders("p3").await, [("b", 2)]);
    // a alone has no room for that MiB: quota-exceeded under either rule, nothing made.
    for placement in ["firstWithRoom", "mostAvailable"] {
        let outcome = create(&provider, &config(&["a"], placement, None), "p4", uid).await;
        assert_eq!(
            class(&outcome),
            Some(ErrorClass::QuotaExceeded),
            "{placement}: {outcome:?}"
        );
        assert!(holders("p4").await.is_empty(), "{placement}");
    }

    // A tie goes to list order; the clone then leaves d with less available than e, yet the
    // retry continues on d, where the attempt left the disk and the seed.
    let tie = config(&["d", "e"], "mostAvailable", None);
    create_until_the_upload(&provider, &tie, "p5", uid).await;
    assert_eq!(holders("p5").await, [("d", 2)]);
    create_until_the_upload(&provider, &tie, "p5", uid).await;
    assert_eq!(holders("p5").await, [("d", 2)]);
    // The same in the other list order: e is now the most available, but d holds p5's volumes.
    create_until_the_upload(
        &provider,
        &config(&["e", "d"], "mostAvailable", None),
        "p5",
        uid,
    )
    .await;
    assert_eq!(holders("p5").await, [("d", 2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_does_not_answer_is_left_out_of_create_and_list_and_named_by_check() {
    let uid = "6c1f0a2e-0000-4000-8000-00000000000b";
    let (_a, a) = test_node("a", "images", &[], &[(NODE_BASE, 1 << 20)]);
    let (_b, b) = test_node(
        "b",
        "images",
        &[NodeDomain::new("proxy-b", our_mark(uid))],
        &[],
    );
    // A port nobody listens on: the hypervisor is down.
    let gone = serde_json::json!({
        "name": "gone",
        "uri": "qemu+tcp://127.0.0.1:1/system",
        "pools": ["images"],
        "networks": ["default"],
    });
    let capability = capability(IDENTITY, serde_json::json!({ "connections": [a, b, gone] }));
    let provider = provider(&capability).await;

    // Issue 32: the new VM lands on a, whatever the order; the listing names gone and lists the
    // others; check says which did not answer.
    for (index, connections) in [["a", "gone"], ["gone", "a"]].into_iter().enumerate() {
        let config = test_driver_config_on(&connections);
        let name = format!("proxy-new-{index}");
        // Placed on a: its disk is cloned there (the test driver stops at the seed's upload).
        create_until_the_upload(&provider, &config, &name, &format!("{}{index}", &uid[..35])).await;
        assert!(!node_holds(&capability, "a", &name).await.is_empty());

        let request = Request::ListByTag {
            config: config.to_string(),
            key: "egress.io/pool".into(),
            value: "blue".into(),
        };
        let Ok(Response::ListByTag(listing)) = call(&provider, request).await else {
            panic!("list-by-tag failed")
        };
        assert_eq!(listing.unanswered, ["gone"]);

        let checked = check(&provider, &config).await;
        assert_eq!(checked.reason, CheckReason::Unreachable, "{checked:?}");
        assert!(checked.message.contains("connection gone"), "{checked:?}");
    }
    // With no connection answering, create fails naming it and makes nothing.
    let config = test_driver_config_on(&["gone"]);
    let outcome = create(&provider, &config, "proxy-none", uid).await;
    assert_eq!(class(&outcome), Some(ErrorClass::Transient), "{outcome:?}");
    assert!(
        format!("{outcome:?}").contains("connection gone"),
        "{outcome:?}"
    );
    // Found on another connection, the domain is adopted: adopting makes nothing new.
    let config = test_driver_config_on(&["gone", "b"]);
    let adopted = create(&provider, &config, "proxy-b", uid).await.unwrap();
    assert_eq!(adopted.provider_id, "b/proxy-b");
}

/// K33: check probes every connection at once, each within 20 s, below check's 30 s deadline:
/// two hypervisors that accept and never answer are reported `unreachable`, naming the first, in
/// time. (Probed one after the other, or each up to the grant's 30 s call timeout, the call would
/// run out its deadline instead.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_silent_hypervisors_unreachable_within_its_deadline() {
    let (_a, a) = test_node("a", "images", &[], &[]);
    let (first, second) = (Silent::start().await, Silent::start().await);
    // The grant's call timeout is the default, 30 s: as long as check's whole deadline.
    let capability = capability(
        IDENTITY,
        serde_json::json!({ "connections": [
            a,
            first.connection("silent1", "images"),
            second.connection("silent2", "images"),
        ] }),
    );
    let provider = provider(&capability).await;
    let started = std::time::Instant::now();
    let checked = check(
        &provider,
        &test_driver_config_on(&["a", "silent1", "silent2"]),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(checked.reason, CheckReason::Unreachable, "{checked:?}");
    assert_eq!(
        checked.message, "connection silent1: did not answer within 20 s",
        "{checked:?}"
    );
    assert!(took < std::time::Duration::from_secs(25), "{took:?}");
}

/// A qcow2 base gives a qcow2 disk in either mode: backed by the base by default (copy-on-write),
/// a whole copy with no backing file with `fullCopy`. Both read what the image holds (libvirt
/// read the base as qcow2, not as raw bytes to wrap), the domain reads the disk as qcow2, and a
/// delete leaves the base.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_base_gives_a_qcow2_disk_backed_by_it_or_copied_whole() {
    for mode in ["copyOnWrite", "fullCopy"] {
        let daemon = Daemon::build("qcow2", |_| Vec::new()).await.in_mode(mode);
        let provider = provider(&daemon.capability).await;
        let name = unique_name("qcow2");
        let _guard = DomainGuard(name.clone());
        let uid = "6c1f0a2e-0000-4000-8000-00000000000c";

        let created = create(&provider, &daemon.config, &name, uid).await.unwrap();
        assert_eq!(Daemon::domain_state(&name).map(|s| s.0), Some(RUNNING));
        assert_eq!(daemon.volumes(), daemon.volumes_of(&name), "{mode}");
        assert_eq!(daemon.disk(&name), format!("{name}.qcow2"));
        daemon.assert_disk_reads_the_image(&name, IMAGE_BYTES as u64, mode);
        let connect = Daemon::connect();
        let domain = virt::domain::Domain::lookup_by_name(&connect, &name).unwrap();
        let xml = domain.get_xml_desc(0).unwrap();
        assert!(
            xml.contains("<driver name='qemu' type='qcow2'/>"),
            "{mode}: {xml}"
        );

        delete(&provider, &daemon.config, &created.provider_id)
            .await
            .unwrap();
        assert_eq!(Daemon::domain_state(&name), None);
        assert_eq!(daemon.volumes(), BTreeSet::from([daemon.base.clone()]));
    }
}

/// `diskGiB` above the image's size: in either mode the disk is that large from the moment it
/// has its name, and still reads the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_is_disk_gib_large_in_either_mode_on_a_real_libvirtd() {
    for (format, mode) in [
        ("qcow2", "copyOnWrite"),
        ("qcow2", "fullCopy"),
        ("raw", "fullCopy"),
    ] {
        let daemon = Daemon::build(format, |_| Vec::new()).await.in_mode(mode);
        let provider = provider(&daemon.capability).await;
        let name = unique_name("grown");
        let _guard = DomainGuard(name.clone());
        let mut config = daemon.config.clone();
        config["diskGiB"] = serde_json::json!(1);

        let created = create(
            &provider,
            &config,
            &name,
            "6c1f0a2e-0000-4000-8000-000000000016",
        )
        .await
        .unwrap();
        daemon.assert_disk_reads_the_image(&name, 1 << 30, &format!("{format} {mode}"));
        delete(&provider, &config, &created.provider_id)
            .await
            .unwrap();
    }
}

/// Runs `qemu-img` with `args` then `files`.
fn qemu_img(args: &[&str], files: &[&PathBuf]) -> std::process::Output {
    std::process::Command::new("qemu-img")
        .args(args)
        .args(files)
        .output()
        .expect("qemu-img runs")
}

/// The kill-point sweep: a create cut before each of its capability calls in turn (the host
/// dying there), then retried, ends with one running domain, one whole disk of `diskGiB` that
/// reads the image, and one seed, in both disk modes. Making the disk is among the cuts: the
/// copy-on-write disk's one call, and a whole copy's temporary volume, copy and cleanup (gap 9:
/// a disk cut between its clone and its resize was reused as it was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_cut_anywhere_across_two_connections_converges_on_one_domain() {
    for mode in ["copyOnWrite", "fullCopy"] {
        // node: a test-driver node, listed first, whose pool (named as the real one) is full:
        // every create looks on it, then makes the VM on the real daemon.
        let daemon = Daemon::build("qcow2", |pool| {
            vec![test_node("node", pool, &[], &[("filler", NODE_POOL_BYTES)])]
        })
        .await
        .in_mode(mode);
        cut_every_call_of_a_create(&daemon).await;
    }
}

/// [`a_create_cut_anywhere_across_two_connections_converges_on_one_domain`] for one daemon.
async fn cut_every_call_of_a_create(daemon: &Daemon) {
    let provider = provider(&daemon.capability).await;
    let uid = "6c1f0a2e-0000-4000-8000-00000000000d";
    let mut config = daemon.config.clone();
    config["connections"] = serde_json::json!(["node", "system"]);
    config["diskGiB"] = serde_json::json!(1);
    let mode = config["diskMode"].clone();
    let on_node = async |name: &str| {
        let [_, seed] = node_volumes(name);
        let disk = daemon.disk(name);
        held(
            &daemon.capability,
            "node",
            &daemon.pool.name,
            &[disk.as_str(), seed.as_str()],
        )
        .await
    };
    let mut cuts = 0;
    for n in 0.. {
        assert!(n < 96, "{mode}: create never finished within 96 calls");
        let what = format!("{mode}, cut before call {n}");
        let name = unique_name("cut2");
        let _guard = DomainGuard(name.clone());
        daemon.forget_base();
        daemon.capability.cut_after(Some(n));
        let first = create(&provider, &config, &name, uid).await;
        daemon.capability.cut_after(None);
        let completed = first.is_ok();
        let instance = if let Ok(instance) = first {
            instance
        } else {
            assert!(is_cut(&first), "{what}: {first:?}");
            cuts += 1;
            create(&provider, &config, &name, uid)
                .await
                .unwrap_or_else(|error| panic!("{what}: the retry failed: {error}"))
        };
        assert_eq!(instance.provider_id, format!("system/{name}"), "{what}");
        assert_eq!(
            Daemon::domain_state(&name).map(|s| s.0),
            Some(RUNNING),
            "{what}"
        );
        assert_eq!(Daemon::autostart(&name), Some(true), "{what}");
        assert_eq!(daemon.volumes(), daemon.volumes_of(&name), "{what}");
        daemon.assert_disk_reads_the_image(&name, 1 << 30, &what);
        assert!(on_node(&name).await.is_empty(), "{what}");
        if completed {
            // node now has room and comes first: a create that did not look on every
            // connection would make a second VM there.
            free_the_filler(&daemon.capability, &daemon.pool.name).await;
            config["placement"] = serde_json::json!("firstWithRoom");
            let again = create(&provider, &config, &name, uid).await.unwrap();
            assert_eq!(again.provider_id, instance.provider_id);
            assert_eq!(again.created_at, instance.created_at);
            assert!(on_node(&name).await.is_empty());
            assert_eq!(daemon.volumes(), daemon.volumes_of(&name));
        }
        delete(&provider, &config, &instance.provider_id)
            .await
            .unwrap();
        assert_eq!(
            daemon.volumes(),
            BTreeSet::from([daemon.base.clone()]),
            "{what}"
        );
        if completed {
            break;
        }
    }
    assert!(
        cuts >= 14,
        "{mode}: a create over two connections makes more calls than {cuts}"
    );
}

/// A whole copy is published by libvirt copying the temporary disk into the disk, which the
/// host may stop waiting for (its call timed out) while libvirt goes on. A create that then finds
/// the disk beside its temporary volume must neither use the disk nor make it again: libvirt
/// refuses to delete the temporary volume while it copies from it, so the create is `transient`
/// and defines nothing; once the copy ends, the next create trusts the disk as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_still_being_copied_is_waited_for_then_trusted_never_used_or_made_again() {
    const COPIED: usize = 1 << 30;
    let daemon = Daemon::new().await.in_mode("fullCopy");
    let provider = provider(&daemon.capability).await;
    let name = unique_name("copying");
    let _guard = DomainGuard(name.clone());
    let uid = "6c1f0a2e-0000-4000-8000-000000000012";
    let (disk, creating) = (
        daemon.disk(&name),
        format!("{}.creating", daemon.disk(&name)),
    );

    // The temporary disk, as a cut attempt left it: 1 GiB that is not the image.
    let mut written = Sha256::new();
    {
        use std::io::Write;
        let chunk = pattern(64 << 20, 42);
        let mut file = std::fs::File::create(daemon.pool.path(&creating)).unwrap();
        for _ in 0..COPIED / chunk.len() {
            file.write_all(&chunk).unwrap();
            written.update(&chunk);
        }
    }
    let written = written.finalize();
    let copy = {
        let (pool, disk, creating) = (daemon.pool.name.clone(), disk.clone(), creating.clone());
        std::thread::spawn(move || {
            let mut connect = Daemon::connect();
            let pool = virt::storage_pool::StoragePool::lookup_by_name(&connect, &pool).unwrap();
            pool.refresh(0).unwrap();
            let source = virt::storage_vol::StorageVol::lookup_by_name(&pool, &creating).unwrap();
            let xml = format!(
                "<volume><name>{disk}</name><capacity unit='bytes'>{COPIED}</capacity><target><format type='raw'/></target></volume>"
            );
            virt::storage_vol::StorageVol::create_xml_from(&pool, &xml, &source, 0).unwrap();
            connect.close().unwrap();
        })
    };
    // libvirt refuses to refresh a pool while it copies: look the disk up without one.
    wait_for(
        std::time::Duration::from_secs(60),
        "the copy started",
        || {
            let mut connect = Daemon::connect();
            let pool = virt::storage_pool::StoragePool::lookup_by_name(&connect, &daemon.pool.name)
                .unwrap();
            let started = virt::storage_vol::StorageVol::lookup_by_name(&pool, &disk).is_ok();
            connect.close().unwrap();
            started
        },
    );

    let outcome = create(&provider, &daemon.config, &name, uid).await;
    assert!(
        !copy.is_finished(),
        "the copy ended before create looked: {outcome:?}"
    );
    assert_eq!(class(&outcome), Some(ErrorClass::Transient), "{outcome:?}");
    assert!(
        format!("{outcome:?}").contains("delete the temporary disk"),
        "{outcome:?}"
    );
    assert_eq!(Daemon::domain_state(&name), None, "nothing defined on it");

    copy.join().unwrap();
    create(&provider, &daemon.config, &name, uid).await.unwrap();
    assert_eq!(Daemon::domain_state(&name).map(|s| s.0), Some(RUNNING));
    assert_eq!(daemon.volumes(), daemon.volumes_of(&name));
    let mut published = Sha256::new();
    {
        use std::io::Read;
        let mut file = std::fs::File::open(daemon.pool.path(&disk)).unwrap();
        let mut buffer = vec![0; 64 << 20];
        loop {
            let read = file.read(&mut buffer).unwrap();
            if read == 0 {
                break;
            }
            published.update(&buffer[..read]);
        }
    }
    assert_eq!(
        published.finalize(),
        written,
        "the copied disk was used as it was"
    );
    delete(&provider, &daemon.config, &format!("system/{name}"))
        .await
        .unwrap();
}

/// Deletes the `filler` volume of `node`'s pool, through the capability's pooled connection.
async fn free_the_filler(capability: &LibvirtCapability, pool: &str) {
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
        HostConnection, HostStoragePool, HostVolume,
    };
    let mut call = Call::new(capability, IDENTITY);
    let mut view = call.view();
    let connection = ok(view.open("node".into()).await);
    let pool = ok(view.storage_pool(connection, pool.into()).await);
    let filler = ok(view.lookup_volume(pool, "filler".into()).await).expect("the filler");
    ok(view.delete(filler).await);
}
