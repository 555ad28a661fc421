//! The simulated host: guests, storages, volumes, tasks and the request log, behind one mutex.
//! [`SimState`] is the test-facing handle for inspecting and seeding it.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::model;
use crate::services::Services;

/// Whether a guest is a QEMU VM or an LXC container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestKind {
    /// A QEMU virtual machine (`/nodes/{node}/qemu`).
    Qemu,
    /// An LXC container; listed in `/cluster/resources` but invisible to the qemu endpoints.
    Lxc,
}

/// The run state behind `status` / `qmpstatus` (F14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// `status: stopped`, `qmpstatus: stopped`.
    Stopped,
    /// `status: running`, `qmpstatus: running`.
    Running,
    /// `status: running`, `qmpstatus: paused` (resources say plain running): `qm suspend`.
    Paused,
    /// `status: running`, `qmpstatus: suspended`: the guest suspended itself (ACPI S3);
    /// `status/resume` wakes it.
    Suspended,
    /// `status: running`, `qmpstatus: io-error`: QEMU paused it on a storage error.
    IoError,
    /// `status: running`, `qmpstatus: guest-panicked`: the guest's kernel panicked.
    GuestPanicked,
    /// `status: running`, `qmpstatus: internal-error`.
    InternalError,
    /// `status: running`, `qmpstatus: watchdog`: its watchdog fired and paused it.
    Watchdog,
}

impl RunState {
    /// `status` and `qmpstatus` as `status/current` reports them (F14).
    pub fn words(self) -> (&'static str, &'static str) {
        match self {
            RunState::Stopped => ("stopped", "stopped"),
            RunState::Running => ("running", "running"),
            RunState::Paused => ("running", "paused"),
            RunState::Suspended => ("running", "suspended"),
            RunState::IoError => ("running", "io-error"),
            RunState::GuestPanicked => ("running", "guest-panicked"),
            RunState::InternalError => ("running", "internal-error"),
            RunState::Watchdog => ("running", "watchdog"),
        }
    }

    /// The run state `qmpstatus` names, for the admin API.
    pub fn from_qmp(qmpstatus: &str) -> Option<RunState> {
        [
            RunState::Stopped,
            RunState::Running,
            RunState::Paused,
            RunState::Suspended,
            RunState::IoError,
            RunState::GuestPanicked,
            RunState::InternalError,
            RunState::Watchdog,
        ]
        .into_iter()
        .find(|run| run.words().1 == qmpstatus)
    }
}

/// The storage a guest or volume lives on. Every node has each storage; a `shared` one is the
/// same storage seen from every node (its volumes and disks are the cluster's), any other is a
/// storage of each node's own (its volumes are that node's).
#[derive(Debug, Clone)]
pub(crate) struct Storage {
    pub id: String,
    pub plugin: &'static str,
    pub content: Vec<&'static str>,
    /// `shared: 1` in `storage.cfg`: what a clone with `target` needs (qemu-server's clone).
    pub shared: bool,
}

/// The storage every node shares when the simulator runs several nodes (an RBD pool, `shared`
/// by nature): the templates' disks live there by default then, so clones to another node work.
pub const SHARED_STORAGE: &str = "ceph-vms";

/// The storage of each node's own that holds the templates' disks on a single node (F19).
pub const LOCAL_DISK_STORAGE: &str = "local-lvm";

#[derive(Debug, Clone)]
pub(crate) struct Guest {
    /// The node whose `qemu-server` (or `lxc`) directory holds its config.
    pub node: String,
    pub kind: GuestKind,
    pub config: BTreeMap<String, String>,
    pub run: RunState,
    pub started: Option<(Instant, u64)>,
    /// Mid-clone: the conf is still qemu-server's temporary file, nameless (F8).
    pub placeholder: bool,
    /// The UPID of a task holding this guest's config flock (clone, destroy).
    pub busy: Option<String>,
    pub guest_ip: String,
}

impl Guest {
    pub fn lock(&self) -> Option<&str> {
        self.config.get("lock").map(String::as_str)
    }

    /// `onboot: 1`: the node starts it when it boots.
    pub fn starts_on_boot(&self) -> bool {
        self.config
            .get("onboot")
            .is_some_and(|onboot| onboot == "1")
    }

    /// `template: 1`: it cannot run.
    pub fn is_template(&self) -> bool {
        self.config.get("template").is_some_and(|t| t == "1")
    }

    /// Powers it off, as a stop does: the agent goes with it (F5: `VM <vmid> is not running`).
    pub fn power_off(&mut self) {
        self.run = RunState::Stopped;
        self.started = None;
    }
}

/// The address the simulated guest agent of `vmid` reports on ens18 (F21 records the shape, with
/// 192.168.0.150 for the recorded clone): one of its own per VMID in 192.168.0.0/16, as each VM
/// on a real network gets its own lease, so a table of several proxies shows them apart.
pub fn guest_ip(vmid: u32) -> String {
    const HOSTS: u32 = 254;
    let host = vmid % (HOSTS * HOSTS);
    format!("192.168.{}.{}", host / HOSTS, host % HOSTS + 1)
}

/// The address of VM `vmid`'s proxy service when the simulator runs with a service port: one of
/// its own per VMID on loopback, in 127.77.0.0/16 (all of 127/8 is local on Linux, so it can be
/// bound without setup), reported by its guest agent in place of [`guest_ip`]. VMIDs 65534 apart
/// share one.
pub fn service_ip(vmid: u32) -> String {
    const HOSTS: u32 = 65534;
    let host = vmid % HOSTS + 1;
    format!("127.77.{}.{}", host >> 8, host & 0xff)
}

#[derive(Debug, Clone)]
pub(crate) struct Task {
    /// The node that runs it (the URL's node), named in its UPID; only it serves its status.
    pub node: String,
    pub upid: String,
    pub task_type: String,
    pub id: String,
    pub user: String,
    pub tokenid: Option<String>,
    pub pid: u32,
    pub pstart: u32,
    pub starttime: u64,
    pub exitstatus: Option<String>,
    pub log: Vec<String>,
}

/// One stored volume (ISO images) with its bytes.
#[derive(Debug, Clone)]
pub(crate) struct Volume {
    pub bytes: bytes::Bytes,
    pub ctime: u64,
}

/// One served request, as tests read it from [`SimState::request_log`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path as requested, including `/api2/json`, without the query.
    pub path: String,
    /// Status answered; `None` when the connection was reset without an answer.
    pub status: Option<u16>,
    /// Whether the body came with a `Transfer-Encoding` (chunked) rather than a
    /// `Content-Length` or no body at all: what a client that frames its requests exactly never
    /// sends.
    pub chunked: bool,
}

pub(crate) struct Inner {
    /// The cluster's nodes, in order; the first holds the templates.
    pub nodes: Vec<String>,
    pub guests: BTreeMap<u32, Guest>,
    pub storages: Vec<Storage>,
    /// Stored volumes (ISO images) by node and volid: they live on a storage of each node's own
    /// (the only kind here that holds ISO images), so each node has its own.
    pub volumes: BTreeMap<(String, String), Volume>,
    pub tasks: BTreeMap<String, Task>,
    pub next_pid: u32,
    pub pstart: u32,
    pub requests: Vec<RequestRecord>,
    /// Each VM's proxy service, when the simulator runs with a service port.
    pub services: Option<Services>,
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Inner {
    pub fn storage(&self, id: &str) -> Option<&Storage> {
        self.storages.iter().find(|s| s.id == id)
    }

    /// The node holding the templates, where guests added without a node go.
    pub fn first_node(&self) -> &str {
        &self.nodes[0]
    }

    /// Whether `node` is one of the cluster's.
    pub fn is_node(&self, node: &str) -> bool {
        self.nodes.iter().any(|known| known == node)
    }

    /// The address a new guest's agent reports: [`service_ip`] with services, else [`guest_ip`].
    pub fn address_of(&self, vmid: u32) -> String {
        match self.services {
            Some(_) => service_ip(vmid),
            None => guest_ip(vmid),
        }
    }

    /// The lowest VMID in [100, 1_000_000) not used by any guest.
    pub fn next_free_vmid(&self) -> Option<u32> {
        (100..1_000_000).find(|id| !self.guests.contains_key(id))
    }
}

/// The state's lock. Releasing it makes the VMs' services follow what changed
/// ([`Services::follow`]), wherever the change was made: API tasks, host events, test seeding.
pub(crate) struct StateGuard<'a>(MutexGuard<'a, Inner>);

impl Deref for StateGuard<'_> {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.0
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let inner = &mut *self.0;
        if let Some(services) = &mut inner.services {
            services.follow(&inner.guests);
        }
    }
}

/// Test handle on the simulated host: inspect and seed guests, volumes, tasks and the request log.
#[derive(Clone)]
pub struct SimState {
    inner: Arc<Mutex<Inner>>,
}

/// A snapshot of one guest.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestView {
    /// The VMID.
    pub vmid: u32,
    /// The node it lives on: the one whose `/nodes/{node}/qemu/{vmid}/…` paths reach it.
    pub node: String,
    /// QEMU or LXC.
    pub kind: GuestKind,
    /// The config keys as `GET …/config` returns them (without `digest`).
    pub config: BTreeMap<String, String>,
    /// Run state.
    pub run_state: RunState,
    /// The `lock` property, if set.
    pub lock: Option<String>,
    /// True while the clone that creates it has not finished (F8).
    pub mid_clone: bool,
}

/// A snapshot of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskView {
    /// The UPID.
    pub upid: String,
    /// Task type, e.g. `qmclone`.
    pub task_type: String,
    /// Task id (a VMID, a storage, or empty).
    pub id: String,
    /// `None` while running, else `OK`, `WARNINGS: n` or the error text.
    pub exitstatus: Option<String>,
    /// The task log lines.
    pub log: Vec<String>,
}

impl SimState {
    /// A host of `nodes` (at least one), its templates' disks on `template_storage`; `Err` when
    /// that storage does not hold VM disks.
    pub(crate) fn new(
        nodes: &[String],
        template_storage: &str,
        services: Option<Services>,
    ) -> Result<Self, String> {
        let storage = |id: &str, plugin, content: &[&'static str], shared| Storage {
            id: id.to_string(),
            plugin,
            content: content.to_vec(),
            shared,
        };
        let mut storages = vec![
            storage(
                "local",
                "dir",
                &["iso", "vztmpl", "backup", "import"],
                false,
            ),
            storage(LOCAL_DISK_STORAGE, "lvmthin", &["images", "rootdir"], false),
            storage("proxy-seeds", "dir", &["iso"], false),
        ];
        if nodes.len() > 1 {
            storages.push(storage(SHARED_STORAGE, "rbd", &["images", "rootdir"], true));
        }
        if !storages
            .iter()
            .any(|s| s.id == template_storage && s.content.contains(&"images"))
        {
            let holding: Vec<&str> = storages
                .iter()
                .filter(|s| s.content.contains(&"images"))
                .map(|s| s.id.as_str())
                .collect();
            return Err(format!(
                "the templates' storage {template_storage:?} holds no VM disks here (these do: {})",
                holding.join(", ")
            ));
        }
        let inner = Inner {
            nodes: nodes.to_vec(),
            guests: BTreeMap::new(),
            storages,
            volumes: BTreeMap::new(),
            tasks: BTreeMap::new(),
            next_pid: 0x0017_C594,
            pstart: 0x0ADB_2769,
            requests: Vec::new(),
            services,
        };
        let state = SimState {
            inner: Arc::new(Mutex::new(inner)),
        };
        state.preload_templates(template_storage);
        Ok(state)
    }

    pub(crate) fn lock(&self) -> StateGuard<'_> {
        StateGuard(
            self.inner
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// F19: 9001 is the suitable Debian template; 9000 (Ubuntu) carries a cloud-init drive on
    /// ide2 and VLAN tag 4 on net0. The meta line is the one F11 saw copied into clones. Their
    /// disks live on `storage` (F19 recorded `local-lvm`), on the first node.
    fn preload_templates(&self, storage: &str) {
        let disk = |volume: &str, options: &str| format!("{storage}:{volume}{options}");
        let (efidisk, scsi0) = (
            disk(
                "base-9001-disk-0",
                ",efitype=4m,pre-enrolled-keys=1,size=4M",
            ),
            disk("base-9001-disk-1", ",iothread=1,size=3G"),
        );
        let (cloudinit, ubuntu_disk) = (
            disk("vm-9000-cloudinit", ",media=cdrom"),
            disk("base-9000-disk-0", ",size=3584M"),
        );
        let debian = [
            ("agent", "1"),
            ("bios", "ovmf"),
            ("boot", "order=scsi0"),
            ("cores", "2"),
            ("cpu", "x86-64-v2-AES"),
            ("efidisk0", &efidisk),
            ("machine", "q35"),
            ("memory", "2048"),
            ("meta", "creation-qemu=11.0.3,ctime=1790145676"),
            ("name", "debian-13-template"),
            ("net0", "virtio=BC:24:11:5A:3C:01,bridge=vmbr0"),
            ("ostype", "l26"),
            ("scsi0", &scsi0),
            ("scsihw", "virtio-scsi-single"),
            ("serial0", "socket"),
            ("smbios1", "uuid=6f1c2b1e-5d0e-4a53-9c7b-3f1b8f0a9001"),
            ("template", "1"),
            ("vga", "serial0"),
            ("vmgenid", "2b0d3e3c-1a43-4c4f-8d2b-5a7e0c1f9001"),
        ];
        let ubuntu = [
            ("agent", "1"),
            ("boot", "order=scsi0"),
            ("cores", "2"),
            ("ide2", &cloudinit),
            ("memory", "2048"),
            ("meta", "creation-qemu=9.0.2,ctime=1751230000"),
            ("name", "ubuntu-24.04-template"),
            ("net0", "virtio=BC:24:11:7E:21:90,bridge=vmbr0,tag=4"),
            ("ostype", "l26"),
            ("scsi0", &ubuntu_disk),
            ("scsihw", "virtio-scsi-pci"),
            ("smbios1", "uuid=0c7d9a51-3e2b-4f0a-b1d4-8e6f2a7c9000"),
            ("template", "1"),
        ];
        self.add_qemu_vm(9001, &debian);
        self.add_qemu_vm(9000, &ubuntu);
    }

    /// Adds (or replaces) a stopped QEMU VM with this config, on the first node.
    pub fn add_qemu_vm(&self, vmid: u32, config: &[(&str, &str)]) {
        let config = config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut inner = self.lock();
        let guest_ip = inner.address_of(vmid);
        let node = inner.first_node().to_string();
        inner.guests.insert(
            vmid,
            Guest {
                node,
                kind: GuestKind::Qemu,
                config,
                run: RunState::Stopped,
                started: None,
                placeholder: false,
                busy: None,
                guest_ip,
            },
        );
    }

    /// Adds `count` stopped QEMU VMs that belong to someone else (named `other-<vmid>`, no
    /// ownership mark), at the lowest free VMIDs from 1000, on the first node: a cluster of a
    /// given size, for measuring what an operation costs as the cluster grows. Returns their
    /// VMIDs.
    pub fn add_other_vms(&self, count: usize) -> Vec<u32> {
        let mut inner = self.lock();
        let node = inner.first_node().to_string();
        let mut added = Vec::with_capacity(count);
        let mut vmid = 1000;
        while added.len() < count {
            let guest_ip = inner.address_of(vmid);
            if let std::collections::btree_map::Entry::Vacant(free) = inner.guests.entry(vmid) {
                let config = [
                    ("name".to_string(), format!("other-{vmid}")),
                    ("memory".to_string(), "2048".to_string()),
                    ("cores".to_string(), "2".to_string()),
                    ("boot".to_string(), "order=scsi0".to_string()),
                    (
                        "scsi0".to_string(),
                        format!("local-lvm:vm-{vmid}-disk-0,size=8G"),
                    ),
                    (
                        "net0".to_string(),
                        "virtio=BC:24:11:00:00:01,bridge=vmbr0".to_string(),
                    ),
                    ("tags".to_string(), "other".to_string()),
                ];
                free.insert(Guest {
                    node: node.clone(),
                    kind: GuestKind::Qemu,
                    config: config.into_iter().collect(),
                    run: RunState::Stopped,
                    started: None,
                    placeholder: false,
                    busy: None,
                    guest_ip,
                });
                added.push(vmid);
            }
            vmid += 1;
        }
        added
    }

    /// Adds a stopped LXC container named `hostname`, on the first node.
    pub fn add_lxc(&self, vmid: u32, hostname: &str) {
        let config = BTreeMap::from([
            ("hostname".to_string(), hostname.to_string()),
            ("memory".to_string(), "512".to_string()),
            ("cores".to_string(), "1".to_string()),
        ]);
        let mut inner = self.lock();
        let guest_ip = inner.address_of(vmid);
        let node = inner.first_node().to_string();
        inner.guests.insert(
            vmid,
            Guest {
                node,
                kind: GuestKind::Lxc,
                config,
                run: RunState::Stopped,
                started: None,
                placeholder: false,
                busy: None,
                guest_ip,
            },
        );
    }

    /// Sets or clears a guest's `lock` property (e.g. `backup`, `suspended`). False if absent.
    pub fn set_lock(&self, vmid: u32, lock: Option<&str>) -> bool {
        let mut inner = self.lock();
        let Some(guest) = inner.guests.get_mut(&vmid) else {
            return false;
        };
        match lock {
            Some(lock) => guest.config.insert("lock".into(), lock.into()),
            None => guest.config.remove("lock"),
        };
        true
    }

    /// Forces a guest's run state; `Running` counts as started now (the agent delay restarts).
    pub fn set_run_state(&self, vmid: u32, run: RunState) -> bool {
        let mut inner = self.lock();
        let Some(guest) = inner.guests.get_mut(&vmid) else {
            return false;
        };
        guest.run = run;
        guest.started = match run {
            RunState::Stopped => None,
            _ => guest.started.or(Some((Instant::now(), unix_now()))),
        };
        true
    }

    /// Sets one config key of a guest directly, bypassing the API's checks. False if absent.
    pub fn set_config(&self, vmid: u32, key: &str, value: Option<&str>) -> bool {
        let mut inner = self.lock();
        let Some(guest) = inner.guests.get_mut(&vmid) else {
            return false;
        };
        match value {
            Some(value) => guest.config.insert(key.into(), value.into()),
            None => guest.config.remove(key),
        };
        true
    }

    /// Sets the IPv4 address the guest agent reports on ens18 (by default [`guest_ip`] of its
    /// VMID, or [`service_ip`] with a service port, where its service then listens).
    pub fn set_guest_ip(&self, vmid: u32, ip: &str) -> bool {
        let mut inner = self.lock();
        let Some(guest) = inner.guests.get_mut(&vmid) else {
            return false;
        };
        guest.guest_ip = ip.to_string();
        true
    }

    /// A snapshot of one guest.
    pub fn guest(&self, vmid: u32) -> Option<GuestView> {
        let inner = self.lock();
        let guest = inner.guests.get(&vmid)?;
        Some(GuestView {
            vmid,
            node: guest.node.clone(),
            kind: guest.kind,
            config: guest.config.clone(),
            run_state: guest.run,
            lock: guest.lock().map(str::to_string),
            mid_clone: guest.placeholder,
        })
    }

    /// Every VMID in use (QEMU and LXC).
    pub fn vmids(&self) -> Vec<u32> {
        self.lock().guests.keys().copied().collect()
    }

    /// Stores a volume directly (e.g. a stale seed ISO) on the first node. `volid` is
    /// `<storage>:iso/<file>`.
    pub fn add_volume(&self, volid: &str, bytes: &[u8]) {
        let volume = Volume {
            bytes: bytes::Bytes::copy_from_slice(bytes),
            ctime: unix_now(),
        };
        let mut inner = self.lock();
        let node = inner.first_node().to_string();
        inner.volumes.insert((node, volid.to_string()), volume);
    }

    /// The bytes of a stored volume, such as an uploaded seed ISO, on the first node (by name)
    /// that holds one with this volid.
    pub fn volume(&self, volid: &str) -> Option<Vec<u8>> {
        self.lock()
            .volumes
            .iter()
            .find(|((_, stored), _)| stored == volid)
            .map(|(_, v)| v.bytes.to_vec())
    }

    /// The volids stored on one storage, on every node: a volid stored on two nodes (each has
    /// its own `proxy-seeds`) is listed twice.
    pub fn volumes(&self, storage: &str) -> Vec<String> {
        let prefix = format!("{storage}:");
        self.lock()
            .volumes
            .keys()
            .map(|(_, volid)| volid)
            .filter(|v| v.starts_with(&prefix))
            .cloned()
            .collect()
    }

    /// A snapshot of one task.
    pub fn task(&self, upid: &str) -> Option<TaskView> {
        self.lock().tasks.get(upid).map(task_view)
    }

    /// Every task, oldest first.
    pub fn tasks(&self) -> Vec<TaskView> {
        let inner = self.lock();
        let mut tasks: Vec<&Task> = inner.tasks.values().collect();
        tasks.sort_by_key(|t| t.pid);
        tasks.into_iter().map(task_view).collect()
    }

    /// The requests served so far, in order.
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.lock().requests.clone()
    }

    /// The config digest `GET …/config` would report now.
    pub fn digest(&self, vmid: u32) -> Option<String> {
        self.lock()
            .guests
            .get(&vmid)
            .map(|g| model::digest(&g.config))
    }
}

fn task_view(task: &Task) -> TaskView {
    TaskView {
        upid: task.upid.clone(),
        task_type: task.task_type.clone(),
        id: task.id.clone(),
        exitstatus: task.exitstatus.clone(),
        log: task.log.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::{guest_ip, service_ip};

    #[test]
    fn each_vm_has_a_service_address_of_its_own_on_loopback() {
        let addresses: std::collections::BTreeSet<String> = (0..65534).map(service_ip).collect();
        assert_eq!(
            addresses.len(),
            65534,
            "neighbouring VMIDs share an address"
        );
        for vmid in [0, 100, 254, 255, 65533, 65534, 999_999_999] {
            let address: std::net::Ipv4Addr = service_ip(vmid).parse().unwrap();
            let [a, b, c, d] = address.octets();
            assert_eq!((a, b), (127, 77), "{address}");
            assert!((c, d) != (0, 0) && (c, d) != (255, 255), "{address}");
        }
    }

    #[test]
    fn each_vm_reports_an_address_of_its_own() {
        let addresses: std::collections::BTreeSet<String> =
            (100..100 + 1000).map(guest_ip).collect();
        assert_eq!(addresses.len(), 1000, "neighbouring VMIDs share an address");
        for vmid in [0, 253, 254, 64515, 64516, 999_999_999] {
            let address: std::net::Ipv4Addr = guest_ip(vmid).parse().unwrap();
            let [a, b, _, host] = address.octets();
            assert_eq!((a, b), (192, 168), "{address}");
            assert!((1..=254).contains(&host), "{address}: not a host address");
        }
    }
}
