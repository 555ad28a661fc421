//! Operation-level tests on the host: each operation runs against a scripted [`Io`] that answers
//! an exact, ordered list of requests with Proxmox's wording and JSON shapes (F1–F21). A request
//! out of order fails the test, so these pin each operation's call order and request count (the
//! end-to-end tests against the simulator are host-side, through the runtime and broker).

use std::collections::VecDeque;

use crate::api::{Io, LogLevel, Method, Pve, Request, Response, TransportError, escape};
use crate::config::Config;
use crate::config::tests::simulator_config;
use crate::create::{create, start_vmid};
use crate::delete::delete;
use crate::egress::provider::types::{CheckReason, CreateRequest, Error, Tag, VmState};
use crate::get::get;
use crate::id::VmId;
use crate::list::list_by_tag;

/// One expected request and its answer.
struct Step {
    method: Method,
    path: String,
    status: u16,
    body: String,
}

/// One log call: level, message and fields.
#[derive(Debug)]
struct Line {
    level: LogLevel,
    message: String,
    fields: Vec<(String, String)>,
}

impl Line {
    fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    }
}

/// An [`Io`] that answers a fixed script in order and keeps the requests it saw and the lines it
/// was asked to log.
struct ScriptIo {
    script: VecDeque<Step>,
    seen: Vec<Request>,
    logs: Vec<Line>,
    clock_ms: u64,
}

impl ScriptIo {
    fn new(steps: Vec<Step>) -> Self {
        ScriptIo {
            script: steps.into(),
            seen: Vec::new(),
            logs: Vec::new(),
            clock_ms: 0,
        }
    }

    /// The body of the first write (not GET) to `path`.
    fn body_of(&self, path: &str) -> String {
        let request = self
            .seen
            .iter()
            .find(|r| r.method != Method::Get && r.path == format!("/api2/json{path}"))
            .unwrap_or_else(|| panic!("no write to {path}"));
        String::from_utf8(request.body.clone()).unwrap()
    }
}

impl Io for ScriptIo {
    fn send(&mut self, request: &Request) -> Result<Response, TransportError> {
        let step = self
            .script
            .pop_front()
            .unwrap_or_else(|| panic!("unexpected request {:?} {}", request.method, request.path));
        assert_eq!(
            (request.method, request.path.as_str()),
            (step.method, format!("/api2/json{}", step.path).as_str())
        );
        self.seen.push(request.clone());
        Ok(Response {
            status: step.status,
            body: step.body.into_bytes(),
        })
    }
    fn sleep_ms(&mut self, milliseconds: u64) {
        self.clock_ms += milliseconds;
    }
    fn monotonic_ms(&mut self) -> u64 {
        self.clock_ms
    }
    fn now_rfc3339(&mut self) -> String {
        "2026-09-18T15:02:00Z".into()
    }
    fn log(&mut self, level: LogLevel, message: &str, fields: &[(&str, &str)]) {
        self.logs.push(Line {
            level,
            message: message.to_string(),
            fields: fields
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
        });
    }
}

fn ok(method: Method, path: impl Into<String>, data: &str) -> Step {
    Step {
        method,
        path: path.into(),
        status: 200,
        body: format!("{{\"data\":{data}}}"),
    }
}

fn fail(method: Method, path: impl Into<String>, status: u16, message: &str) -> Step {
    Step {
        method,
        path: path.into(),
        status,
        body: format!("{{\"data\":null,\"message\":\"{message}\\n\"}}"),
    }
}

const NODE: &str = "pv1-1";
const OUR_MARK: &str =
    "egress-operator: managed\\nuid: uid-1\\ncreated-at: 2026-09-18T15:02:00Z\\ntag: pool=blue\\n";

fn upid(kind: &str, id: &str) -> String {
    format!("UPID:{NODE}:0017C594:0ADB2769:63EC5455:{kind}:{id}:egress@pve!operator:")
}

/// The task-status step for `upid`, finished with `exit`.
fn task_done(upid: &str, exit: &str) -> Step {
    ok(
        Method::Get,
        format!("/nodes/{NODE}/tasks/{}/status", escape(upid)),
        &format!(r#"{{"status":"stopped","exitstatus":"{exit}"}}"#),
    )
}

fn task_running(upid: &str) -> Step {
    ok(
        Method::Get,
        format!("/nodes/{NODE}/tasks/{}/status", escape(upid)),
        r#"{"status":"running"}"#,
    )
}

fn resources(entries: &str) -> Step {
    ok(
        Method::Get,
        "/cluster/resources?type=vm",
        &format!("[{entries}]"),
    )
}

const TEMPLATE_ENTRY: &str = r#"{"type":"qemu","vmid":9001,"node":"pv1-1","name":"debian-13-template","status":"stopped","template":1}"#;

fn vm_entry(vmid: u32, name: &str, status: &str) -> String {
    format!(
        r#"{{"type":"qemu","vmid":{vmid},"node":"pv1-1","name":"{name}","status":"{status}","tags":"proxy_operator"}}"#
    )
}

fn config_path(vmid: u32) -> String {
    format!("/nodes/{NODE}/qemu/{vmid}/config")
}

fn status_path(vmid: u32) -> String {
    format!("/nodes/{NODE}/qemu/{vmid}/status/current")
}

fn our_config(vmid: u32, name: &str) -> String {
    format!(
        r#"{{"name":"{name}","description":"{OUR_MARK}","onboot":"1","boot":"order=scsi0;ide2","scsi0":"local-lvm:vm-{vmid}-disk-0,size=3G","net0":"virtio=BC:24:11:EE:48:83,bridge=vmbr0","agent":"1","digest":"ab"}}"#
    )
}

fn request(config: &str) -> CreateRequest {
    CreateRequest {
        name: "proxy-a".into(),
        uid: "uid-1".into(),
        tags: vec![Tag {
            key: "pool".into(),
            value: "blue".into(),
        }],
        user_data: "#cloud-config\n".into(),
        config: config.into(),
        placement: None,
    }
}

fn run<T>(
    config: &Config,
    steps: Vec<Step>,
    operation: impl FnOnce(&mut Pve<'_, ScriptIo>) -> T,
) -> (T, ScriptIo, u32) {
    let mut io = ScriptIo::new(steps);
    let (result, requests) = {
        let mut pve = Pve::new(&mut io, config);
        let result = operation(&mut pve);
        (result, pve.requests)
    };
    assert!(
        io.script.is_empty(),
        "requests not made: {:?}",
        io.script.iter().map(|s| &s.path).collect::<Vec<_>>()
    );
    (result, io, requests)
}

fn id(vmid: u32) -> VmId {
    VmId {
        node: NODE.into(),
        vmid,
    }
}

fn agent_path(node: &str, vmid: u32) -> String {
    format!("/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces")
}

const AGENT_ENS18: &str = r#"{"result":[{"name":"lo","ip-addresses":[{"ip-address":"127.0.0.1","ip-address-type":"ipv4"}]},{"name":"ens18","ip-addresses":[{"ip-address":"192.168.4.147","ip-address-type":"ipv4"}]}]}"#;

const MISSING_100123: &str =
    "Configuration file 'nodes/pv1-1/qemu-server/100123.conf' does not exist";

#[test]
fn correction1_get_of_a_mid_clone_vm_is_transient_before_the_name_is_read() {
    let config = simulator_config();
    // On its node: status/current carries the clone's lock (the conf is the temporary file).
    let steps = vec![ok(
        Method::Get,
        status_path(100_123),
        r#"{"status":"stopped","qmpstatus":"stopped","lock":"clone"}"#,
    )];
    let (result, _, requests) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::Transient(_))), "{result:?}");
    assert_eq!(requests, 1, "the config (and its name) is never read");

    // Through the listing (the node did not know it): the nameless entry of F8.
    let steps = vec![
        fail(Method::Get, status_path(100_123), 500, MISSING_100123),
        resources(
            r#"{"type":"qemu","vmid":100123,"id":"qemu/100123","node":"pv1-1","lock":"clone","status":"unknown"}"#,
        ),
    ];
    let (result, _, requests) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::Transient(_))), "{result:?}");
    assert_eq!(requests, 2);
}

#[test]
fn running_get_reads_only_the_vms_own_endpoints_and_reports_the_address() {
    let config = simulator_config();
    let steps = vec![
        ok(
            Method::Get,
            status_path(100_123),
            r#"{"status":"running","qmpstatus":"running"}"#,
        ),
        ok(
            Method::Get,
            config_path(100_123),
            &our_config(100_123, "proxy-a"),
        ),
        ok(Method::Get, agent_path(NODE, 100_123), AGENT_ENS18),
    ];
    let (result, _, requests) = run(&config, steps, |pve| get(pve, &id(100_123)));
    let vm = result.unwrap();
    assert_eq!(requests, 3, "no cluster listing");
    assert_eq!(vm.state, VmState::Running);
    assert_eq!(vm.addresses, ["192.168.4.147"]);
    assert_eq!(
        (vm.provider_id.as_str(), vm.name.as_str(), vm.uid.as_str()),
        ("pv1-1/100123", "proxy-a", "uid-1")
    );
    assert_eq!(vm.created_at.as_deref(), Some("2026-09-18T15:02:00Z"));
}

#[test]
fn a_vm_that_migrated_is_found_through_the_listing_on_its_new_node() {
    let config = simulator_config();
    let steps = vec![
        fail(Method::Get, status_path(100_123), 500, MISSING_100123),
        resources(
            r#"{"type":"qemu","vmid":100123,"node":"pv1-2","name":"proxy-a","status":"running"}"#,
        ),
        ok(
            Method::Get,
            "/nodes/pv1-2/qemu/100123/status/current",
            r#"{"status":"running","qmpstatus":"running"}"#,
        ),
        ok(
            Method::Get,
            "/nodes/pv1-2/qemu/100123/config",
            &our_config(100_123, "proxy-a"),
        ),
        ok(Method::Get, agent_path("pv1-2", 100_123), AGENT_ENS18),
    ];
    let (result, _, _) = run(&config, steps, |pve| get(pve, &id(100_123)));
    let vm = result.unwrap();
    assert_eq!(vm.provider_id, "pv1-2/100123");
    assert_eq!(vm.state, VmState::Running);
}

#[test]
fn phase5_issue32_suspended_lock_passes_the_mark_check_then_answers_paused_without_the_agent() {
    let config = simulator_config();
    let status = r#"{"status":"stopped","qmpstatus":"stopped","lock":"suspended"}"#;
    let suspended_config =
        our_config(100_123, "proxy-a").replace(r#""digest""#, r#""lock":"suspended","digest""#);
    let steps = vec![
        ok(Method::Get, status_path(100_123), status),
        ok(Method::Get, config_path(100_123), &suspended_config),
    ];
    let (result, _, _) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert_eq!(result.unwrap().state, VmState::Paused);

    // Foreign hibernated VM at our VMID: not ours, not-found.
    let steps = vec![
        ok(Method::Get, status_path(100_123), status),
        ok(
            Method::Get,
            config_path(100_123),
            r#"{"name":"proxy-a","lock":"suspended"}"#,
        ),
    ];
    let (result, _, _) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::NotFound(_))), "{result:?}");
}

#[test]
fn f2_get_of_a_vm_that_vanished_is_not_found_and_a_missing_entry_too() {
    let config = simulator_config();
    // Gone between status and config: the listing no longer has it.
    let steps = vec![
        ok(
            Method::Get,
            status_path(100_123),
            r#"{"status":"running","qmpstatus":"running"}"#,
        ),
        fail(Method::Get, config_path(100_123), 500, MISSING_100123),
        resources(TEMPLATE_ENTRY),
    ];
    let (result, _, _) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::NotFound(_))), "{result:?}");
    // Listed, then gone from its node.
    let steps = vec![
        fail(Method::Get, status_path(100_123), 500, MISSING_100123),
        resources(&vm_entry(100_123, "proxy-a", "running")),
        fail(Method::Get, status_path(100_123), 500, MISSING_100123),
    ];
    let (result, _, _) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::NotFound(_))), "{result:?}");
    let steps = vec![
        fail(Method::Get, status_path(100_123), 500, MISSING_100123),
        resources(TEMPLATE_ENTRY),
    ];
    let (result, _, _) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::NotFound(_))), "{result:?}");
}

#[test]
fn a_refused_token_on_the_node_is_permanent_without_the_listing() {
    let config = simulator_config();
    let steps = vec![fail(Method::Get, status_path(100_123), 401, "")];
    let (result, _, requests) = run(&config, steps, |pve| get(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::Permanent(_))), "{result:?}");
    assert_eq!(requests, 1);
}

/// The steps of a clean create of `proxy-a` at its start VMID, with the given clone config and
/// start-task exit status.
fn clean_create_steps(vmid: u32, start_exit: &str) -> Vec<Step> {
    let clone = upid("qmclone", "9001");
    let upload = upid("imgcopy", "");
    let configure = upid("qmconfig", &vmid.to_string());
    let resize = upid("resize", &vmid.to_string());
    let start = upid("qmstart", &vmid.to_string());
    vec![
        resources(TEMPLATE_ENTRY),
        ok(
            Method::Get,
            config_path(9001),
            r#"{"template":1,"boot":"order=scsi0","scsi0":"local-lvm:base-9001-disk-0,size=3G","net0":"virtio=BC:24:11:00:00:01,bridge=vmbr0","agent":"1"}"#,
        ),
        ok(
            Method::Post,
            format!("/nodes/{NODE}/qemu/9001/clone"),
            &format!("\"{clone}\""),
        ),
        task_running(&clone),
        task_done(&clone, "OK"),
        ok(Method::Get, config_path(vmid), &our_config(vmid, "proxy-a")),
        ok(
            Method::Post,
            format!("/nodes/{NODE}/storage/proxy-seeds/upload"),
            &format!("\"{upload}\""),
        ),
        task_done(&upload, "OK"),
        ok(Method::Post, config_path(vmid), &format!("\"{configure}\"")),
        task_done(&configure, "OK"),
        ok(
            Method::Put,
            format!("/nodes/{NODE}/qemu/{vmid}/resize"),
            &format!("\"{resize}\""),
        ),
        task_done(&resize, "OK"),
        ok(
            Method::Post,
            format!("/nodes/{NODE}/qemu/{vmid}/status/start"),
            &format!("\"{start}\""),
        ),
        task_done(&start, start_exit),
        ok(
            Method::Get,
            status_path(vmid),
            r#"{"status":"running","qmpstatus":"prelaunch"}"#,
        ),
        ok(
            Method::Get,
            status_path(vmid),
            r#"{"status":"running","qmpstatus":"running"}"#,
        ),
    ]
}

fn create_config() -> Config {
    Config::parse(
        r#"{"apiUrl":"https://192.168.0.8:8006","nodes":["pv1-1"],"templateVmid":9001,"targetStorage":"local-lvm",
            "isoStorage":"proxy-seeds","vlanTag":4,"diskGiB":8,"budgets":{"pollMs":100}}"#,
    )
    .unwrap()
}

#[test]
fn phase6_clean_create_sequence_mark_in_clone_and_config_write() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    // F16/Phase 5: WARNINGS on the start task is success.
    let (result, io, requests) = run(&config, clean_create_steps(vmid, "WARNINGS: 1"), |pve| {
        create(pve, &request(""))
    });
    let vm = result.unwrap();
    assert_eq!(vm.provider_id, format!("pv1-1/{vmid}"));
    assert_eq!(vm.state, VmState::Provisioning);
    assert_eq!(requests, 16);
    let clone_body = io.body_of(&format!("/nodes/{NODE}/qemu/9001/clone"));
    assert_eq!(
        clone_body,
        format!(
            "newid={vmid}&name=proxy-a&description=egress-operator%3A%20managed%0Auid%3A%20uid-1%0Acreated-at%3A%202026-09-18T15%3A02%3A00Z%0Atag%3A%20pool%3Dblue%0A&full=1&storage=local-lvm"
        )
    );
    let config_body = io.body_of(&config_path(vmid));
    assert_eq!(
        config_body,
        "ide2=proxy-seeds%3Aiso%2Fproxy-a-seed.iso%2Cmedia%3Dcdrom&agent=1&onboot=1&tags=proxy_operator&net0=virtio%3DBC%3A24%3A11%3AEE%3A48%3A83%2Cbridge%3Dvmbr0%2Ctag%3D4"
    );
    assert_eq!(
        io.body_of(&format!("/nodes/{NODE}/qemu/{vmid}/resize")),
        "disk=scsi0&size=8G"
    );
    let upload = io
        .seen
        .iter()
        .find(|r| r.path.ends_with("/upload"))
        .unwrap();
    assert!(
        upload
            .content_type
            .as_deref()
            .unwrap()
            .starts_with("multipart/form-data; boundary=")
    );
    assert!(io.clock_ms >= 200, "waits slept on the clock between polls");
}

#[test]
fn f10_a_clone_whose_mark_the_backend_dropped_is_permanent_before_any_provisioning() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    let mut steps = clean_create_steps(vmid, "OK");
    // A foreign dialect of the API: the clone's config comes back without the description.
    steps[5] = ok(
        Method::Get,
        config_path(vmid),
        r#"{"name":"proxy-a","boot":"order=scsi0","scsi0":"local-lvm:vm-1-disk-0,size=3G","net0":"virtio=BC:24:11:EE:48:83,bridge=vmbr0","agent":"1"}"#,
    );
    steps.truncate(6);
    let (result, _io, requests) = run(&config, steps, |pve| create(pve, &request("")));
    match result {
        Err(Error::Permanent(message)) => {
            assert!(
                message.contains("did not keep its ownership mark"),
                "{message}"
            );
            assert!(message.contains(&format!("remove VM {vmid}")), "{message}");
        }
        other => panic!("expected permanent, got {other:?}"),
    }
    assert_eq!(requests, 6, "nothing uploaded, configured or started");
}

#[test]
fn phase6_vm_that_stops_after_start_is_transient_at_once() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    let mut steps = clean_create_steps(vmid, "OK");
    steps.truncate(steps.len() - 2);
    steps.push(ok(
        Method::Get,
        status_path(vmid),
        r#"{"status":"stopped","qmpstatus":"stopped"}"#,
    ));
    let (result, _, _) = run(&config, steps, |pve| create(pve, &request("")));
    assert!(
        matches!(&result, Err(Error::Transient(m)) if m.contains("stopped right after")),
        "{result:?}"
    );
}

#[test]
fn phase6_adopting_a_running_vm_costs_three_calls_and_never_reads_the_template() {
    let config = create_config();
    let steps = vec![
        resources(&vm_entry(100_777, "proxy-a", "running")),
        ok(
            Method::Get,
            config_path(100_777),
            &our_config(100_777, "proxy-a"),
        ),
        ok(
            Method::Get,
            status_path(100_777),
            r#"{"status":"running","qmpstatus":"paused"}"#,
        ),
    ];
    let (result, _, requests) = run(&config, steps, |pve| create(pve, &request("")));
    assert_eq!(result.unwrap().provider_id, "pv1-1/100777");
    assert_eq!(requests, 3);
}

#[test]
fn an_adopted_running_vm_gains_the_requests_tags_in_its_mark_and_onboot_in_one_write() {
    let config = create_config();
    // Made before the installation was in the tags and before onboot was set.
    let before = r#"{"name":"proxy-a","description":"egress-operator: managed\nuid: uid-1\ncreated-at: 2026-01-02T03:04:05Z\ntag: pool=blue\n","agent":"1"}"#;
    let mut request = request("");
    request.tags.push(Tag {
        key: "egress-operator.io/installation".into(),
        value: "cluster-a".into(),
    });
    let steps = vec![
        resources(&vm_entry(100_777, "proxy-a", "running")),
        ok(Method::Get, config_path(100_777), before),
        ok(
            Method::Get,
            status_path(100_777),
            r#"{"status":"running","qmpstatus":"running"}"#,
        ),
        ok(Method::Post, config_path(100_777), "null"),
    ];
    let (result, io, requests) = run(&config, steps, |pve| create(pve, &request));
    assert_eq!(result.unwrap().provider_id, "pv1-1/100777");
    assert_eq!(requests, 4);
    let body = io.body_of(&config_path(100_777));
    let expected = crate::api::form(&[
        (
            "description",
            "egress-operator: managed\nuid: uid-1\ncreated-at: 2026-01-02T03:04:05Z\n\
             tag: pool=blue\ntag: egress-operator.io/installation=cluster-a\n"
                .to_string(),
        ),
        ("onboot", "1".to_string()),
    ]);
    assert_eq!(body.as_bytes(), expected.as_slice());
}

/// Issue 32: create adopts a VM of its own whose guest suspended itself (ACPI S3) and wakes it,
/// as it starts a stopped one; a hibernated one is returned paused, untouched.
#[test]
fn create_wakes_a_suspended_vm_of_its_own_and_returns_a_hibernated_one_paused() {
    let config = create_config();
    let upid = upid("qmresume", "100777");
    let steps = vec![
        resources(&vm_entry(100_777, "proxy-a", "running")),
        ok(
            Method::Get,
            config_path(100_777),
            &our_config(100_777, "proxy-a"),
        ),
        ok(
            Method::Get,
            status_path(100_777),
            r#"{"status":"running","qmpstatus":"suspended"}"#,
        ),
        ok(
            Method::Post,
            format!("/nodes/{NODE}/qemu/100777/status/resume"),
            &format!("\"{upid}\""),
        ),
        task_done(&upid, "OK"),
    ];
    let (result, _, requests) = run(&config, steps, |pve| create(pve, &request("")));
    assert_eq!(result.unwrap().provider_id, "pv1-1/100777");
    assert_eq!(requests, 5);

    let hibernated =
        our_config(100_777, "proxy-a").replace(r#""digest""#, r#""lock":"suspended","digest""#);
    let steps = vec![
        resources(&vm_entry(100_777, "proxy-a", "stopped")),
        ok(Method::Get, config_path(100_777), &hibernated),
    ];
    let (result, _, requests) = run(&config, steps, |pve| create(pve, &request("")));
    assert_eq!(result.unwrap().state, VmState::Paused);
    assert_eq!(requests, 2, "no status read, no write, no start");
}

#[test]
fn correction2_name_ours_mark_not_is_permanent_and_nothing_is_cloned() {
    let config = create_config();
    let steps = vec![
        resources(&vm_entry(100_777, "proxy-a", "stopped")),
        ok(
            Method::Get,
            config_path(100_777),
            r#"{"name":"proxy-a","description":"egress-operator: managed\nuid: uid-2\n"}"#,
        ),
    ];
    let (result, _, _) = run(&config, steps, |pve| create(pve, &request("")));
    assert!(
        matches!(&result, Err(Error::Permanent(m)) if m.contains("another Proxy")),
        "{result:?}"
    );
}

#[test]
fn correction2_f4_on_clone_inspects_the_vmid_and_adopts_our_crashed_clone() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    let mut steps = clean_create_steps(vmid, "OK");
    steps.truncate(2); // resources, template config
    steps.extend([
        fail(
            Method::Post,
            format!("/nodes/{NODE}/qemu/9001/clone"),
            500,
            &format!("unable to create VM {vmid}: config file already exists"),
        ),
        // The racer is our own earlier attempt, still mid-clone (F8): nameless and locked.
        resources(&format!(
            r#"{{"type":"qemu","vmid":{vmid},"node":"pv1-1","lock":"clone","status":"unknown"}}"#
        )),
        ok(Method::Get, config_path(vmid), r#"{"lock":"clone"}"#),
        ok(Method::Get, config_path(vmid), &our_config(vmid, "proxy-a")),
        ok(
            Method::Get,
            status_path(vmid),
            r#"{"status":"running","qmpstatus":"running"}"#,
        ),
    ]);
    let (result, io, _) = run(&config, steps, |pve| create(pve, &request("")));
    assert_eq!(result.unwrap().provider_id, format!("pv1-1/{vmid}"));
    assert!(io.clock_ms >= 100, "the lock was waited out on the clock");
}

/// F8 and the predecessor's note on cross-node clones: a VM the cluster still lists where its
/// config is not (a clone moving to its target) is transient, never probed past: probing past it
/// would clone a second VM beside it.
#[test]
fn f8_a_vm_listed_where_its_config_is_not_is_transient_not_probed_past() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    let mid_clone = format!(
        r#"{{"type":"qemu","vmid":{vmid},"node":"pv1-1","lock":"clone","status":"unknown"}}"#
    );
    let missing =
        format!("Configuration file 'nodes/pv1-1/qemu-server/{vmid}.conf' does not exist");
    let mut steps = clean_create_steps(vmid, "OK");
    steps.truncate(2); // resources, template config
    steps[0] = resources(&format!("{TEMPLATE_ENTRY},{mid_clone}"));
    steps.extend([
        fail(Method::Get, config_path(vmid), 500, &missing),
        // Looked up again: still listed on pv1-1. No clone follows (the script ends here).
        resources(&format!("{TEMPLATE_ENTRY},{mid_clone}")),
    ]);
    let (result, _, _) = run(&config, steps, |pve| create(pve, &request("")));
    match result {
        Err(Error::Transient(message)) => assert!(
            message.contains(&format!("VM {vmid} is listed on pv1-1")),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn correction2_a_foreign_vm_at_the_start_vmid_is_probed_past() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    let next = if vmid == config.vmid_max {
        config.vmid_min
    } else {
        vmid + 1
    };
    let mut steps = clean_create_steps(next, "OK");
    steps[0] = resources(&format!(
        "{TEMPLATE_ENTRY},{}",
        vm_entry(vmid, "someone-else", "running")
    ));
    steps.insert(
        2,
        ok(Method::Get, config_path(vmid), r#"{"name":"someone-else"}"#),
    );
    let (result, io, _) = run(&config, steps, |pve| create(pve, &request("")));
    assert_eq!(result.unwrap().provider_id, format!("pv1-1/{next}"));
    assert!(
        io.body_of(&format!("/nodes/{NODE}/qemu/9001/clone"))
            .starts_with(&format!("newid={next}&"))
    );
}

#[test]
fn phase6_template_shape_is_refused_before_any_clone() {
    let config = create_config();
    let steps = vec![
        resources(TEMPLATE_ENTRY),
        ok(
            Method::Get,
            config_path(9001),
            r#"{"template":1,"boot":"order=scsi0","scsi0":"l:base-9001-disk-0,size=3G","ide2":"local-lvm:vm-9001-cloudinit,media=cdrom","net0":"virtio=X,bridge=vmbr0"}"#,
        ),
    ];
    let (result, _, _) = run(&config, steps, |pve| create(pve, &request("")));
    assert!(
        matches!(&result, Err(Error::Permanent(m)) if m.contains("cloud-init")),
        "{result:?}"
    );
}

#[test]
fn a_required_placement_that_avoids_every_node_makes_nothing_and_names_the_nodes() {
    let config = create_config();
    let steps = vec![
        resources(TEMPLATE_ENTRY),
        ok(
            Method::Get,
            config_path(9001),
            r#"{"template":1,"boot":"order=scsi0","scsi0":"local-lvm:base-9001-disk-0,size=3G","net0":"virtio=BC:24:11:00:00:01,bridge=vmbr0","agent":"1"}"#,
        ),
    ];
    let mut request = request("");
    request.placement = Some(crate::egress::provider::types::Placement {
        avoid_hosts: vec![NODE.to_string()],
        required: true,
    });
    // No clone: the run fails on any request beyond the steps.
    let (result, _, _) = run(&config, steps, |pve| create(pve, &request));
    assert!(
        matches!(&result, Err(Error::QuotaExceeded(m)) if m.contains(NODE)),
        "{result:?}"
    );
}

#[test]
fn phase6_empty_name_is_permanent_without_io() {
    let config = create_config();
    let mut nameless = request("");
    nameless.name.clear();
    let (result, _, requests) = run(&config, vec![], |pve| create(pve, &nameless));
    assert!(matches!(result, Err(Error::Permanent(_))));
    assert_eq!(requests, 0);
}

#[test]
fn phase7_delete_stops_then_deletes_the_seed_as_a_task_then_destroys() {
    let config = simulator_config();
    let stop = upid("qmstop", "100123");
    let destroy = upid("qmdestroy", "100123");
    let seed = upid("imgdel", "proxy-seeds");
    let steps = vec![
        resources(&vm_entry(100_123, "proxy-a", "running")),
        ok(
            Method::Get,
            config_path(100_123),
            &our_config(100_123, "proxy-a"),
        ),
        ok(
            Method::Get,
            status_path(100_123),
            r#"{"status":"running","qmpstatus":"running"}"#,
        ),
        ok(
            Method::Post,
            format!("/nodes/{NODE}/qemu/100123/status/stop"),
            &format!("\"{stop}\""),
        ),
        task_done(&stop, "OK"),
        // The seed before the VM: a crash between the two must leave the VM for the retry.
        ok(
            Method::Delete,
            format!(
                "/nodes/{NODE}/storage/proxy-seeds/content/proxy-seeds%3Aiso%2Fproxy-a-seed.iso"
            ),
            &format!("\"{seed}\""),
        ),
        task_done(&seed, "OK"),
        ok(
            Method::Delete,
            format!("/nodes/{NODE}/qemu/100123?purge=1&destroy-unreferenced-disks=1"),
            &format!("\"{destroy}\""),
        ),
        task_done(&destroy, "OK"),
    ];
    let (result, _, requests) = run(&config, steps, |pve| delete(pve, &id(100_123)));
    result.unwrap();
    assert_eq!(requests, 9);
}

#[test]
fn delete_is_idempotent_and_never_destroys_a_vm_that_is_not_ours() {
    let config = simulator_config();
    let (result, _, requests) = run(&config, vec![resources(TEMPLATE_ENTRY)], |pve| {
        delete(pve, &id(100_123))
    });
    assert!(result.is_ok());
    assert_eq!(requests, 1);
    let steps = vec![
        resources(&vm_entry(100_123, "proxy-a", "running")),
        fail(
            Method::Get,
            config_path(100_123),
            500,
            "Configuration file 'nodes/pv1-1/qemu-server/100123.conf' does not exist",
        ),
    ];
    assert!(
        run(&config, steps, |pve| delete(pve, &id(100_123)))
            .0
            .is_ok()
    );
    let steps = vec![
        resources(&vm_entry(100_123, "db", "running")),
        ok(
            Method::Get,
            config_path(100_123),
            r#"{"name":"db","description":"prod database"}"#,
        ),
    ];
    let (result, _, _) = run(&config, steps, |pve| delete(pve, &id(100_123)));
    assert!(matches!(result, Err(Error::Permanent(_))), "{result:?}");
}

#[test]
fn list_by_tag_reads_marks_and_leaves_out_markless_and_other_tags() {
    let config = simulator_config();
    let steps = vec![
        resources(&format!(
            "{TEMPLATE_ENTRY},{},{},{}",
            vm_entry(100_001, "proxy-a", "running"),
            vm_entry(100_002, "proxy-b", "stopped"),
            vm_entry(100_003, "hand-made", "running")
        )),
        ok(
            Method::Get,
            config_path(100_001),
            &our_config(100_001, "proxy-a"),
        ),
        ok(
            Method::Get,
            config_path(100_002),
            r#"{"name":"proxy-b","description":"egress-operator: managed\nuid: u\ntag: pool=green\n"}"#,
        ),
        ok(Method::Get, config_path(100_003), r#"{"name":"hand-made"}"#),
    ];
    let (result, _, _) = run(&config, steps, |pve| list_by_tag(pve, "pool", "blue"));
    let listing = result.unwrap();
    assert_eq!(listing.vms.len(), 1);
    assert!(listing.unanswered.is_empty());
    assert_eq!(
        (listing.vms[0].provider_id.as_str(), listing.vms[0].state),
        ("pv1-1/100001", VmState::Running)
    );
}

/// Issue 32: a node that does not answer for its VMs is named, and the others' VMs listed; a
/// refusal (a 403) still fails the whole listing.
#[test]
fn list_by_tag_names_a_node_that_does_not_answer_and_lists_the_others() {
    let config = simulator_config();
    let on = |node: &str, vmid: u32, name: &str| {
        format!(
            r#"{{"type":"qemu","vmid":{vmid},"node":"{node}","name":"{name}","status":"running","tags":"proxy_operator"}}"#
        )
    };
    let steps = vec![
        resources(&format!(
            "{},{},{}",
            on("pv1-2", 100_002, "proxy-b"),
            on("pv1-1", 100_001, "proxy-a"),
            on("pv1-2", 100_003, "proxy-c")
        )),
        fail(
            Method::Get,
            "/nodes/pv1-2/qemu/100002/config",
            595,
            "no route to host",
        ),
        ok(
            Method::Get,
            config_path(100_001),
            &our_config(100_001, "proxy-a"),
        ),
    ];
    let (result, _, requests) = run(&config, steps, |pve| list_by_tag(pve, "pool", "blue"));
    let listing = result.unwrap();
    assert_eq!(listing.unanswered, ["pv1-2"]);
    let ids: Vec<&str> = listing
        .vms
        .iter()
        .map(|vm| vm.provider_id.as_str())
        .collect();
    assert_eq!(ids, ["pv1-1/100001"]);
    assert_eq!(
        requests, 3,
        "no second read on the node that did not answer"
    );

    let refused = vec![
        resources(&on("pv1-1", 100_001, "proxy-a")),
        fail(
            Method::Get,
            config_path(100_001),
            403,
            "Permission check failed",
        ),
    ];
    let (result, _, _) = run(&config, refused, |pve| list_by_tag(pve, "pool", "blue"));
    assert!(matches!(result, Err(Error::Permanent(_))), "{result:?}");
}

#[test]
fn phase6_several_vms_with_our_name_are_permanent_before_any_inspection() {
    let config = create_config();
    let steps = vec![resources(&format!(
        "{TEMPLATE_ENTRY},{},{}",
        vm_entry(100_777, "proxy-a", "running"),
        vm_entry(100_778, "proxy-a", "stopped")
    ))];
    let (result, _, requests) = run(&config, steps, |pve| create(pve, &request("")));
    assert!(
        matches!(&result, Err(Error::Permanent(m)) if m.contains("several VMs")),
        "{result:?}"
    );
    assert_eq!(requests, 1);
}

/// P4: the predecessor logged one line per API call with identifiers; a seven-minute VLAN stall
/// could only be read from such lines. A create logs one debug line per request, naming the VM,
/// its node and the answer, and then its outcome line at info; no body reaches a line.
#[test]
fn p4_a_create_logs_one_debug_line_per_request_then_its_outcome() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    let mut io = ScriptIo::new(clean_create_steps(vmid, "OK"));
    crate::operate(&mut io, &config, "create", |pve| create(pve, &request(""))).unwrap();
    assert!(io.script.is_empty());

    let (calls, rest) = io.logs.split_at(io.logs.len() - 1);
    assert_eq!(
        calls.len(),
        io.seen.len(),
        "one line per request, nothing else"
    );
    for (line, request) in calls.iter().zip(&io.seen) {
        assert_eq!(
            (line.level, line.message.as_str()),
            (LogLevel::Debug, "proxmox api call")
        );
        assert_eq!(
            line.field("path").map(|path| format!("/api2/json{path}")),
            Some(request.path.clone())
        );
        assert_eq!(
            line.field("method"),
            Some(format!("{:?}", request.method).to_uppercase().as_str())
        );
        assert_eq!(line.field("status"), Some("200"), "{line:?}");
        assert!(
            line.field("ms").is_some_and(|ms| ms.parse::<u64>().is_ok()),
            "{line:?}"
        );
        if request.path.starts_with("/api2/json/nodes/") {
            assert_eq!(line.field("node"), Some(NODE), "{line:?}");
        }
        for (key, value) in &line.fields {
            for body_text in [
                "#cloud-config",
                "uid-1",
                "egress-operator",
                "media=cdrom",
                "ISO",
            ] {
                assert!(!value.contains(body_text), "{key}={value} carries a body");
            }
        }
    }
    let line_of = |method: &str, path: &str| {
        calls
            .iter()
            .find(|line| line.field("method") == Some(method) && line.field("path") == Some(path))
            .unwrap_or_else(|| panic!("no line for {method} {path}"))
    };
    // The clone names the template (by its listed name) and the VM it makes.
    let clone = line_of("POST", &format!("/nodes/{NODE}/qemu/9001/clone"));
    let vmid_text = vmid.to_string();
    assert_eq!(
        (
            clone.field("vmid"),
            clone.field("name"),
            clone.field("newid"),
            clone.field("newname")
        ),
        (
            Some("9001"),
            Some("debian-13-template"),
            Some(vmid_text.as_str()),
            Some("proxy-a")
        )
    );
    // Every later call on the new VM carries its VMID and name.
    for (method, path) in [
        ("POST", config_path(vmid)),
        ("PUT", format!("/nodes/{NODE}/qemu/{vmid}/resize")),
        ("POST", format!("/nodes/{NODE}/qemu/{vmid}/status/start")),
        ("GET", status_path(vmid)),
    ] {
        let line = line_of(method, &path);
        assert_eq!(
            (line.field("vmid"), line.field("name")),
            (Some(vmid_text.as_str()), Some("proxy-a")),
            "{method} {path}"
        );
    }
    assert_eq!(
        line_of("POST", &format!("/nodes/{NODE}/storage/proxy-seeds/upload")).field("file"),
        Some("proxy-a-seed.iso")
    );

    let outcome = &rest[0];
    assert_eq!(
        (outcome.level, outcome.message.as_str()),
        (LogLevel::Info, "proxmox operation finished")
    );
    let requests = io.seen.len().to_string();
    assert_eq!(
        (
            outcome.field("operation"),
            outcome.field("requests"),
            outcome.field("result")
        ),
        (
            Some("create"),
            Some(requests.as_str()),
            Some(format!("pv1-1/{vmid} proxy-a provisioning").as_str())
        )
    );
    assert!(outcome.field("ms").is_some());
}

/// P4: a refused call's line carries the status and Proxmox's text (F1: also the reason phrase),
/// and the outcome line says how the operation ended.
#[test]
fn p4_f17_a_refused_call_logs_its_status_and_text() {
    let config = create_config();
    let steps = vec![
        resources(TEMPLATE_ENTRY),
        ok(
            Method::Get,
            config_path(9001),
            r#"{"template":1,"boot":"order=scsi0","scsi0":"local-lvm:base-9001-disk-0,size=3G","net0":"virtio=BC:24:11:00:00:01,bridge=vmbr0","agent":"1"}"#,
        ),
        fail(
            Method::Post,
            format!("/nodes/{NODE}/qemu/9001/clone"),
            403,
            "Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use)",
        ),
    ];
    let mut io = ScriptIo::new(steps);
    let result = crate::operate(&mut io, &config, "create", |pve| create(pve, &request("")));
    assert!(
        matches!(&result, Err(Error::Permanent(m)) if m.contains("SDN.Use")),
        "{result:?}"
    );
    let clone = &io.logs[2];
    assert_eq!(
        (clone.field("status"), clone.field("error")),
        (
            Some("403"),
            Some("Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use)")
        )
    );
    let outcome = io.logs.last().unwrap();
    assert_eq!(outcome.field("requests"), Some("3"));
    assert!(
        outcome
            .field("result")
            .is_some_and(|result| result.starts_with("Error::Permanent(")),
        "{outcome:?}"
    );
}

/// F17: a privilege the config task's worker checks (the seed drive's `VM.Config.CDROM`) fails the
/// task, not the call; that is as permanent as the 403 would be.
#[test]
fn f17_a_config_task_that_failed_a_permission_check_is_permanent() {
    let config = create_config();
    let vmid = start_vmid("proxy-a", config.vmid_min, config.vmid_max);
    let mut steps = clean_create_steps(vmid, "OK");
    let configure = upid("qmconfig", &vmid.to_string());
    steps.truncate(9); // up to the config write
    steps.push(task_done(
        &configure,
        &format!("Permission check failed (/vms/{vmid}, VM.Config.CDROM)"),
    ));
    let (result, _, _) = run(&config, steps, |pve| create(pve, &request("")));
    assert!(
        matches!(&result, Err(Error::Permanent(m)) if m.contains("VM.Config.CDROM")),
        "{result:?}"
    );
}

/// The check's steps up to the privileges: version, nodes, listing, template, seed storage.
fn check_steps() -> Vec<Step> {
    vec![
        ok(
            Method::Get,
            "/version",
            r#"{"release":"9.2","version":"9.2.20"}"#,
        ),
        ok(
            Method::Get,
            "/nodes",
            r#"[{"node":"pv1-1","status":"online"}]"#,
        ),
        resources(TEMPLATE_ENTRY),
        ok(
            Method::Get,
            config_path(9001),
            r#"{"template":1,"boot":"order=scsi0","scsi0":"local-lvm:base-9001-disk-0,size=3G","net0":"virtio=BC:24:11:00:00:01,bridge=vmbr0","agent":"1"}"#,
        ),
        ok(
            Method::Get,
            format!("/nodes/{NODE}/storage/proxy-seeds/status"),
            r#"{"content":"iso","type":"dir"}"#,
        ),
    ]
}

fn permissions(path: &str, privileges: &[&str]) -> Step {
    let held: Vec<String> = privileges.iter().map(|p| format!("\"{p}\":1")).collect();
    ok(
        Method::Get,
        format!("/access/permissions?path={}", escape(path)),
        &format!("{{\"{path}\":{{{}}}}}", held.join(",")),
    )
}

/// The role the Phase 0 token held on `/` (F17).
const ROLE: &[&str] = &[
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "SDN.Use",
    "VM.Allocate",
    "VM.Audit",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Disk",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.GuestAgent.Audit",
    "VM.PowerMgmt",
];

/// F17: check reads each path the provider's calls are checked on, once, and names every missing
/// privilege with its path in one message.
#[test]
fn f17_check_names_every_missing_privilege_and_its_path() {
    let config = create_config(); // vlanTag 4, diskGiB 8, targetStorage local-lvm
    let without = |missing: &[&str]| -> Vec<&str> {
        ROLE.iter()
            .copied()
            .filter(|p| !missing.contains(p))
            .collect()
    };
    let mut steps = check_steps();
    steps.extend([
        permissions("/vms/9001", ROLE),
        permissions(
            "/vms",
            &without(&["VM.Config.Network", "VM.GuestAgent.Audit"]),
        ),
        permissions("/storage/local-lvm", ROLE),
        permissions("/storage/proxy-seeds", &without(&["Datastore.Allocate"])),
        permissions("/sdn/zones/localnetwork/vmbr0", ROLE),
        permissions("/sdn/zones/localnetwork/vmbr0/4", &without(&["SDN.Use"])),
    ]);
    let (answer, _, requests) = run(&config, steps, crate::check::check);
    assert_eq!(answer.reason, CheckReason::Forbidden, "{}", answer.message);
    for named in [
        "VM.Config.Network on /vms",
        "VM.GuestAgent.Audit on /vms",
        "Datastore.Allocate on /storage/proxy-seeds",
        "SDN.Use on /sdn/zones/localnetwork/vmbr0/4",
    ] {
        assert!(
            answer.message.contains(named),
            "{named}: {}",
            answer.message
        );
    }
    assert!(!answer.message.contains("VM.Clone"), "{}", answer.message);
    assert_eq!(requests, 11, "one permissions read per path");

    // Everything held: ok, and the count says what was verified.
    let mut steps = check_steps();
    for path in [
        "/vms/9001",
        "/vms",
        "/storage/local-lvm",
        "/sdn/zones/localnetwork/vmbr0",
        "/sdn/zones/localnetwork/vmbr0/4",
    ] {
        steps.push(permissions(path, ROLE));
    }
    steps.insert(
        8,
        permissions(
            "/storage/proxy-seeds",
            &["Datastore.Allocate", "Datastore.AllocateTemplate"],
        ),
    );
    let (answer, _, _) = run(&config, steps, crate::check::check);
    assert_eq!(answer.reason, CheckReason::Ok, "{}", answer.message);
    assert!(
        answer.message.contains("holds 14 of the 14"),
        "{}",
        answer.message
    );
}

/// F17: where the permissions endpoint does not answer, check still answers `ok` (the rest
/// passed, and a create that lacks a privilege fails with a 403 naming it) but says which
/// privileges it could not verify; a missing one elsewhere is still `forbidden`.
#[test]
fn f17_check_says_which_privileges_it_could_not_verify() {
    let config = simulator_config();
    let mut steps = check_steps();
    steps.extend([
        permissions("/vms/9001", ROLE),
        fail(
            Method::Get,
            format!("/access/permissions?path={}", escape("/vms")),
            501,
            "Method 'GET /api2/json/access/permissions' not implemented",
        ),
        permissions("/storage/local-lvm", ROLE),
        permissions(
            "/storage/proxy-seeds",
            &["Datastore.Allocate", "Datastore.AllocateTemplate"],
        ),
        permissions("/sdn/zones/localnetwork/vmbr0", ROLE),
    ]);
    let (answer, _, _) = run(&config, steps, crate::check::check);
    assert_eq!(answer.reason, CheckReason::Ok, "{}", answer.message);
    assert!(
        answer.message.contains("NOT verified") && answer.message.contains("/vms (HTTP 501"),
        "{}",
        answer.message
    );

    let mut steps = check_steps();
    steps.extend([
        permissions("/vms/9001", &[]),
        fail(
            Method::Get,
            format!("/access/permissions?path={}", escape("/vms")),
            501,
            "not implemented",
        ),
        permissions("/storage/local-lvm", ROLE),
        permissions(
            "/storage/proxy-seeds",
            &["Datastore.Allocate", "Datastore.AllocateTemplate"],
        ),
        permissions("/sdn/zones/localnetwork/vmbr0", ROLE),
    ]);
    let (answer, _, _) = run(&config, steps, crate::check::check);
    assert_eq!(answer.reason, CheckReason::Forbidden, "{}", answer.message);
    assert!(
        answer.message.contains("VM.Clone on /vms/9001") && answer.message.contains("NOT verified"),
        "{}",
        answer.message
    );
}
