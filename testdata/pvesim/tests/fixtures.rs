//! Ties every simulator text to `testdata/proxmox/*.json`: each test drives the simulator into
//! the situation a fixture records and asserts status, reason phrase and body match it.
//! Run-dependent values (UPID hex fields, pid, pstart, starttime, uptime) are normalised first.

mod common;

use std::time::Duration;

use common::{Answer, Api, LATENCY, encode};
use pvesim::{FaultAction, FaultRule, RunState, SimConfig, Trigger};
use serde_json::{Value, json};

/// Every fixture file and the test that checks it; `every_fixture_is_checked` keeps this honest.
const CHECKED: &[&str] = &[
    "version.json",
    "err_vm_missing.json",
    "clone_taken_vmid.json",
    "err_locked_clone.json",
    "start_while_clone_locked_response.json",
    "resources_mid_clone.json",
    "task_status_ok.json",
    "agent_not_running.json",
    "agent_not_configured.json",
    "agent_vm_stopped.json",
    "agent_network_get_interfaces.json",
    "status_paused.json",
    "status_stopped.json",
    "err_forbidden_volume_delete.json",
    "content_delete_response.json",
    "task_status_volume_missing.json",
    "err_no_ticket.json",
    "err_auth_failed.json",
    "err_tag_invalid.json",
    "err_tag_hyphen.json",
    "err_upload_extension.json",
    "upload_overwrite_response.json",
    "clone_storage_no_images.json",
    "resize_same_size_response.json",
    "resize_shrink_response.json",
    "task_status_stopped_error.json",
    "task_status_warnings.json",
];

fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proxmox")
}

fn load(name: &str) -> Value {
    let text =
        std::fs::read_to_string(fixture_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Blanks what differs per run: UPID hex fields and the numeric task/VM clocks.
fn normalize(value: &mut Value) {
    match value {
        Value::String(s) if s.starts_with("UPID:") => {
            let mut fields: Vec<String> = s.split(':').map(str::to_string).collect();
            for hex in fields.iter_mut().skip(2).take(3) {
                *hex = "…".into();
            }
            *s = fields.join(":");
        }
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                if ["pid", "pstart", "starttime", "uptime"].contains(&key.as_str())
                    && field.is_number()
                {
                    *field = json!("<run-dependent>");
                } else {
                    normalize(field);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

fn assert_fixture(name: &str, status: u16, reason: &str, body: &Value) {
    assert!(CHECKED.contains(&name), "{name} missing from CHECKED");
    let fixture = load(name);
    assert_eq!(fixture["status"], status, "{name}: status");
    assert_eq!(fixture["reason"], reason, "{name}: reason phrase");
    let (mut expected, mut actual) = (fixture["body"].clone(), body.clone());
    normalize(&mut expected);
    normalize(&mut actual);
    assert_eq!(actual, expected, "{name}: body");
}

fn check(name: &str, answer: &Answer) {
    assert_fixture(name, answer.status, &answer.reason, &answer.body);
}

#[test]
fn every_fixture_is_checked() {
    let mut on_disk: Vec<String> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    on_disk.sort();
    let mut checked: Vec<String> = CHECKED.iter().map(|s| s.to_string()).collect();
    checked.sort();
    assert_eq!(on_disk, checked);
}

#[tokio::test]
async fn version_and_auth_fixtures() {
    let api = Api::start().await;
    check("version.json", &api.get("/version").await);
    check(
        "err_no_ticket.json",
        &api.with_auth(None).send("GET", "/version", &[]).await,
    );
    let wrong = format!(
        "PVEAPIToken={}=wrong",
        api.sim.token().split_once('=').unwrap().0
    );
    check(
        "err_auth_failed.json",
        &api.with_auth(Some(wrong))
            .send("GET", "/version", &[])
            .await,
    );
    check(
        "err_vm_missing.json",
        &api.get("/nodes/pv1-1/qemu/999999/config").await,
    );
}

#[tokio::test]
async fn clone_lifecycle_fixtures() {
    let api = Api::start_with(SimConfig {
        task_latency: Duration::from_millis(150),
        ..SimConfig::default()
    })
    .await;
    let storage = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[
                ("newid", "199999"),
                ("name", "proxy-a"),
                ("full", "1"),
                ("storage", "local"),
            ],
        )
        .await;
    check("clone_storage_no_images.json", &storage);

    let clone = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[
                ("newid", "199999"),
                ("name", "proxy-reconaaaaaaaaaaa"),
                ("full", "1"),
            ],
        )
        .await
        .upid();
    let resources = api.get("/cluster/resources?type=vm").await;
    let mid_clone: Vec<Value> = resources
        .data()
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["vmid"] == 199_999)
        .cloned()
        .collect();
    assert_fixture(
        "resources_mid_clone.json",
        resources.status,
        &resources.reason,
        &json!({"data": mid_clone}),
    );
    check(
        "err_locked_clone.json",
        &api.put("/nodes/pv1-1/qemu/199999/config", &[("cores", "2")])
            .await,
    );
    let start = api.post("/nodes/pv1-1/qemu/199999/status/start", &[]).await;
    check("start_while_clone_locked_response.json", &start);
    let clone_again = api
        .post(
            "/nodes/pv1-1/qemu/9001/clone",
            &[("newid", "199999"), ("name", "proxy-b")],
        )
        .await;
    check("clone_taken_vmid.json", &clone_again);

    api.wait_task(&clone).await;
    check("task_status_ok.json", &api.task_status(&clone).await);
    api.wait_task(&start.upid()).await;
}

#[tokio::test]
async fn agent_and_status_fixtures() {
    let api = Api::start_with(SimConfig {
        task_latency: LATENCY,
        agent_delay: Duration::from_millis(250),
        ..SimConfig::default()
    })
    .await;
    api.clone_template(199_999, &[]).await;
    // The MAC of the recorded clone's net0.
    api.sim.state().set_config(
        199_999,
        "net0",
        Some("virtio=BC:24:11:EE:48:83,bridge=vmbr0"),
    );
    // And the address its agent reported (the simulator derives one per VMID otherwise).
    api.sim.state().set_guest_ip(199_999, "192.168.0.150");
    let agent = "/nodes/pv1-1/qemu/199999/agent/network-get-interfaces";
    check("agent_vm_stopped.json", &api.get(agent).await);
    check(
        "status_stopped.json",
        &api.get("/nodes/pv1-1/qemu/199999/status/current").await,
    );
    api.wait_task(
        &api.post("/nodes/pv1-1/qemu/199999/status/start", &[])
            .await
            .upid(),
    )
    .await;
    check("agent_not_running.json", &api.get(agent).await);
    tokio::time::sleep(Duration::from_millis(260)).await;
    check("agent_network_get_interfaces.json", &api.get(agent).await);
    api.wait_task(
        &api.post("/nodes/pv1-1/qemu/199999/status/suspend", &[])
            .await
            .upid(),
    )
    .await;
    check(
        "status_paused.json",
        &api.get("/nodes/pv1-1/qemu/199999/status/current").await,
    );
    api.sim.state().set_run_state(199_999, RunState::Stopped);
    api.put("/nodes/pv1-1/qemu/199999/config", &[("delete", "agent")])
        .await;
    api.sim.state().set_run_state(199_999, RunState::Running);
    check("agent_not_configured.json", &api.get(agent).await);
}

#[tokio::test]
async fn config_resize_and_task_fixtures() {
    let api = Api::start().await;
    api.clone_template(199_999, &[]).await;
    let config = "/nodes/pv1-1/qemu/199999/config";
    check(
        "err_tag_invalid.json",
        &api.put(config, &[("tags", "proxy operator")]).await,
    );
    check(
        "err_tag_hyphen.json",
        &api.put(config, &[("tags", "egress-proxy")]).await,
    );

    let same = api
        .put(
            "/nodes/pv1-1/qemu/199999/resize",
            &[("disk", "scsi0"), ("size", "3G")],
        )
        .await;
    check("resize_same_size_response.json", &same);
    api.wait_task(&same.upid()).await;
    let shrink = api
        .put(
            "/nodes/pv1-1/qemu/199999/resize",
            &[("disk", "scsi0"), ("size", "2G")],
        )
        .await;
    check("resize_shrink_response.json", &shrink);
    api.wait_task(&shrink.upid()).await;
    check(
        "task_status_stopped_error.json",
        &api.task_status(&shrink.upid()).await,
    );

    api.sim.faults().add(FaultRule::new(
        "POST",
        "/nodes/*/qemu/*/status/start",
        Trigger::Nth(1),
        FaultAction::TaskWarnings(1),
    ));
    let start = api
        .post("/nodes/pv1-1/qemu/199999/status/start", &[])
        .await
        .upid();
    api.wait_task(&start).await;
    check("task_status_warnings.json", &api.task_status(&start).await);
}

#[tokio::test]
async fn storage_fixtures() {
    let api = Api::start().await;
    check(
        "err_upload_extension.json",
        &api.upload("proxy-seeds", "proxy-a-seed", b"x").await,
    );
    api.wait_task(
        &api.upload("proxy-seeds", "proxy-a-seed.iso", b"one")
            .await
            .upid(),
    )
    .await;
    let overwrite = api.upload("proxy-seeds", "proxy-a-seed.iso", b"two").await;
    check("upload_overwrite_response.json", &overwrite);
    api.wait_task(&overwrite.upid()).await;

    let local = format!(
        "/nodes/pv1-1/storage/local/content/{}",
        encode("local:iso/proxy-a-seed.iso")
    );
    check(
        "err_forbidden_volume_delete.json",
        &api.delete(&local).await,
    );
    let seed = format!(
        "/nodes/pv1-1/storage/proxy-seeds/content/{}",
        encode("proxy-seeds:iso/proxy-a-seed.iso")
    );
    let first = api.delete(&seed).await;
    check("content_delete_response.json", &first);
    api.wait_task(&first.upid()).await;
    let again = api.delete(&seed).await.upid();
    api.wait_task(&again).await;
    check(
        "task_status_volume_missing.json",
        &api.task_status(&again).await,
    );
}
