//! What the tests share: a call's view over a real `ResourceTable`, private test-driver nodes,
//! and from `kvmlab` the real `libvirtd` (started once when it is not running), per-test dir
//! pools, and an HTTPS image server with its own CA.

use std::time::{Duration, Instant};

use egress_capability_libvirt::bindings::egress::libvirt::libvirt::Error;
use egress_capability_libvirt::{
    LibvirtCallCtx, LibvirtCapability, LibvirtCtxView, LibvirtGrant, METADATA_NAMESPACE_PREFIX,
};
use egress_runtime::Capability as _;
use egress_runtime::grant::{FilesOnly, GrantContext, GrantError};
pub use kvmlab::{
    Ca, DirPool, ImageServer, SYSTEM_URI, TEST_BRIDGE, libvirtd, qemu_host, wait_for,
};
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
    try_capability(identity, grant).unwrap()
}

/// [`capability`], or why the grant is refused. A `digest` in the test's document pins the
/// grant, as a host does beside the document.
pub fn try_capability(
    identity: &str,
    mut grant: serde_json::Value,
) -> Result<LibvirtCapability, GrantError> {
    let digests: Vec<String> = grant
        .as_object_mut()
        .and_then(|grant| grant.remove("digest"))
        .and_then(|digest| digest.as_str().map(str::to_owned))
        .into_iter()
        .collect();
    let grant: LibvirtGrant = serde_json::from_value(grant).unwrap();
    let capability = LibvirtCapability::new();
    capability.set_grant(
        identity,
        &grant,
        &GrantContext {
            digests: &digests,
            host: &FilesOnly,
        },
    )?;
    Ok(capability)
}

/// Sets `identity`'s grant on `capability` anew, as a host does when a grant changes.
pub fn regrant(capability: &LibvirtCapability, identity: &str, grant: serde_json::Value) {
    let grant: LibvirtGrant = serde_json::from_value(grant).unwrap();
    capability
        .set_grant(
            identity,
            &grant,
            &GrantContext {
                digests: &[],
                host: &FilesOnly,
            },
        )
        .unwrap();
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
                .prepare_for(identity, "", deadline)
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

/// The metadata namespace of the marks of a grant whose owner is `owner` (`egress-operator`
/// when the grant names none).
pub fn namespace(owner: &str) -> String {
    format!("{METADATA_NAMESPACE_PREFIX}{owner}")
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

/// Bytes that are not all alike: `length` of a counter pattern.
pub fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Accepts connections and holds them open without a byte; dropping it closes them (which
/// releases the blocked libvirt threads).
pub struct Silent {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Silent {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        Self { port, task }
    }

    /// A grant of this listener alone, as connection `hung`, with calls timing out at `call_ms`.
    pub fn grant(&self, call_ms: u64) -> serde_json::Value {
        serde_json::json!({
            "connections": [self.connection("hung", "images")],
            "timeouts": { "callMs": call_ms },
        })
    }

    /// This listener's grant entry as connection `name`, with pool `pool`.
    pub fn connection(&self, name: &str, pool: &str) -> serde_json::Value {
        serde_json::json!({
            "name": name,
            "uri": format!("qemu+tcp://127.0.0.1:{}/system", self.port),
            "pools": [pool],
        })
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.task.abort();
    }
}
