//! The libvirt provider component (`components/libvirt`) through the real runtime and this
//! capability: on a real `libvirtd` with qemu (TCG) and a dir pool in a temporary folder, create
//! imports the base image, clones it, uploads the seed, defines and starts a domain; on libvirt's
//! test driver, an adopted running domain reports its address. Then the adoption guard, the
//! quota precheck, and the crash sweeps: a create or a delete cut before each capability call
//! (`LibvirtCapability::cut_after`, feature `fault-injection`: the call traps as if the host had
//! died there), then retried, ends with one domain, disk and seed, or with nothing left.
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
    CallContext, CallError, CreateRequest, DenyAll, ErrorClass, Instance, InstanceState, Limits,
    Provider, Request, Response, Runtime, RuntimeConfig, Tag,
};
use sha2::{Digest, Sha256};

use crate::support::*;

/// The identity the runtime gives `libvirt.wasm` (its file name), which names the grant and the
/// metadata namespace.
const IDENTITY: &str = "libvirt";

fn component_path() -> PathBuf {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../target/components/libvirt.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `just build-components` first",
        path.display()
    );
    path
}

async fn provider(capability: &LibvirtCapability) -> Arc<Provider> {
    let config = RuntimeConfig::default()
        .cache_dir(None)
        .limits(Limits::default().max_concurrent_instances(4))
        .capability(Arc::new(capability.clone()));
    let runtime = Runtime::new(config, Arc::new(DenyAll)).expect("runtime builds");
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
) -> Result<Instance, CallError> {
    let request = CreateRequest {
        name: name.into(),
        uid: uid.into(),
        tags: vec![Tag {
            key: "egress.io/pool".into(),
            value: "blue".into(),
        }],
        user_data: "#cloud-config\npackages: [squid]\n".into(),
        config: config.to_string(),
    };
    match call(provider, Request::Create { request }).await? {
        Response::Create(instance) => Ok(instance),
        other => panic!("create answered {other:?}"),
    }
}

async fn get(
    provider: &Provider,
    config: &serde_json::Value,
    id: &str,
) -> Result<Instance, CallError> {
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

async fn list(provider: &Provider, config: &serde_json::Value, value: &str) -> Vec<Instance> {
    let request = Request::ListByTag {
        config: config.to_string(),
        key: "egress.io/pool".into(),
        value: value.into(),
    };
    match call(provider, request).await.unwrap() {
        Response::ListByTag(instances) => instances,
        other => panic!("list-by-tag answered {other:?}"),
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
    capability: LibvirtCapability,
    config: serde_json::Value,
    base: String,
}

/// The base image: 1 MiB, raw.
const IMAGE_BYTES: usize = 1 << 20;

impl Daemon {
    async fn new() -> Self {
        qemu_host();
        let pool = DirPool::new();
        let ca = Ca::new("images");
        let ca_dir = tempfile::tempdir().unwrap();
        let ca_file = ca_dir.path().join("ca.pem");
        ca.write_pem(&ca_file);
        let image = pattern(IMAGE_BYTES, 3);
        let sha256 = hex::encode(Sha256::digest(&image));
        let server =
            ImageServer::start(&ca, HashMap::from([("/base.raw".to_owned(), image)])).await;
        let mut grant = pool.grant();
        grant["connections"][0]["bridges"] = serde_json::json!([TEST_BRIDGE]);
        grant["images"] = serde_json::json!({
            "origins": [server.origin()],
            "caFile": ca_file,
        });
        let capability = capability(IDENTITY, grant);
        let config = serde_json::json!({
            "connection": "system",
            "pool": pool.name,
            "bridge": TEST_BRIDGE,
            "image": { "url": format!("{}/base.raw", server.origin()), "sha256": sha256, "format": "raw" },
            "domainType": "qemu",
            "memoryMiB": 64,
            "installGuestAgent": false,
        });
        let base = format!("egress-base-{}.raw", &sha256[..16]);
        Self {
            pool,
            _ca_dir: ca_dir,
            _server: server,
            capability,
            config,
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

    fn volumes_of(&self, name: &str) -> BTreeSet<String> {
        [
            self.base.clone(),
            format!("{name}.raw"),
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

impl Drop for DomainGuard {
    fn drop(&mut self) {
        if let Ok(mut connect) = virt::connect::Connect::open(Some(SYSTEM_URI)) {
            if let Ok(domain) = virt::domain::Domain::lookup_by_name(&connect, &self.0) {
                let _ = domain.destroy();
                let _ = domain.undefine();
            }
            let _ = connect.close();
        }
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
    assert_eq!(daemon.volumes(), daemon.volumes_of(&name));
    // The base holds the image's bytes, the disk is its clone, the seed is a NoCloud ISO.
    assert_eq!(
        std::fs::read(daemon.pool.path(&daemon.base)).unwrap(),
        pattern(IMAGE_BYTES, 3)
    );
    assert_eq!(
        std::fs::read(daemon.pool.path(&format!("{name}.raw"))).unwrap(),
        pattern(IMAGE_BYTES, 3)
    );
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
    assert_eq!(got.state, InstanceState::Provisioning, "{got:?}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_too_small_for_the_disk_is_quota_exceeded_and_nothing_is_made() {
    let daemon = Daemon::new().await;
    let provider = provider(&daemon.capability).await;
    let name = unique_name("quota");
    let _guard = DomainGuard(name.clone());
    let mut config = daemon.config.clone();
    config["diskGiB"] = serde_json::json!(65536);
    let outcome = create(
        &provider,
        &config,
        &name,
        "6c1f0a2e-0000-4000-8000-000000000002",
    )
    .await;
    assert_eq!(
        class(&outcome),
        Some(ErrorClass::QuotaExceeded),
        "{outcome:?}"
    );
    assert_eq!(Daemon::domain_state(&name), None);
    assert_eq!(
        daemon.volumes(),
        BTreeSet::from([daemon.base.clone()]),
        "only the shared base"
    );
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

/// A test-driver node holding three domains named by the test, each running: `ours` with this
/// provider's mark (UID `uid`, tag pool=blue) and its disk and seed volumes in `images`,
/// `foreign` with another UID's mark, `unmarked` with none.
fn test_node_with_domains(
    ours: &str,
    uid: &str,
    foreign: &str,
    unmarked: &str,
) -> (tempfile::TempDir, serde_json::Value) {
    let namespace = namespace(IDENTITY);
    let domain = |name: &str, metadata: &str, mac: &str| {
        format!(
            r#"<domain type='test'>
  <name>{name}</name>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <metadata>{metadata}</metadata>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <interface type='network'><source network='default'/><mac address='{mac}'/></interface>
  </devices>
</domain>"#
        )
    };
    let mark = |uid: &str| {
        format!(
            r#"<egress:proxy xmlns:egress="{namespace}" uid="{uid}" created-at="2026-11-30T10:00:00Z"><egress:tag key="egress.io/pool" value="blue"/></egress:proxy>"#
        )
    };
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
  {ours_domain}
  {foreign_domain}
  {unmarked_domain}
  <pool type='dir'>
    <name>images</name>
    <target><path>/images</path></target>
    <volume type='file'><name>{ours}.raw</name><capacity unit='bytes'>1048576</capacity></volume>
    <volume type='file'><name>{ours}-seed.iso</name><capacity unit='bytes'>4096</capacity></volume>
    <volume type='file'><name>{foreign}.raw</name><capacity unit='bytes'>1048576</capacity></volume>
  </pool>
</node>
"#,
            ours_domain = domain(ours, &mark(uid), "52:54:00:00:00:01"),
            foreign_domain = domain(foreign, &mark("another-uid"), "52:54:00:00:00:02"),
            unmarked_domain = domain(unmarked, "", "52:54:00:00:00:03"),
        ),
    )
    .unwrap();
    let grant = serde_json::json!({
        "connections": [{
            "name": "node",
            "uri": format!("test://{}", path.display()),
            "undefineFlags": ["managedSave", "snapshotsMetadata"],
            "pools": ["images"],
            "networks": ["default"],
        }],
    });
    (dir, grant)
}

fn test_driver_config() -> serde_json::Value {
    serde_json::json!({
        "connection": "node",
        "pool": "images",
        "network": "default",
        "image": { "url": "https://images.invalid/base.raw", "sha256": "a".repeat(64), "format": "raw" },
        "domainType": "test",
    })
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
    assert_eq!(got.state, InstanceState::Running, "{got:?}");
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
    let mut call = Call::new(&capability, IDENTITY);
    let mut view = call.view();
    use egress_capability_libvirt::bindings::egress::libvirt::libvirt::{
        HostConnection, HostStoragePool,
    };
    let connection = ok(view.open("node".into()).await);
    let pool = ok(view.storage_pool(connection, "images".into()).await);
    for (volume, present) in [
        ("proxy-a.raw", false),
        ("proxy-a-seed.iso", false),
        ("proxy-b.raw", true),
    ] {
        let found = ok(view
            .lookup_volume(
                wasmtime::component::Resource::new_borrow(pool.rep()),
                volume.into(),
            )
            .await);
        assert_eq!(found.is_some(), present, "{volume}");
    }
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
    let outcome = get(&provider, &config, "node/proxy-c").await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    // The foreign domain is still there and still running (get reads it: it carries a mark).
    let foreign = get(&provider, &config, "node/proxy-b").await.unwrap();
    assert_eq!(foreign.uid, "another-uid");
    assert_eq!(foreign.state, InstanceState::Running);
}
