//! What happens to guests outside the API, through the admin API and the library: `qm stop` of one
//! VM, and a node reboot that starts the `onboot=1` guests again (or, when asked, none).

mod common;

use std::time::Duration;

use common::{Answer, Api};
use pvesim::{RunState, SimConfig};
use serde_json::json;

const VMID: u32 = 199_999;

fn vm_path(vmid: u32, rest: &str) -> String {
    format!("/nodes/pv1-1/qemu/{vmid}/{rest}")
}

async fn agent(api: &Api, vmid: u32) -> Answer {
    api.get(&vm_path(vmid, "agent/network-get-interfaces"))
        .await
}

/// Clones `vmid` from the template, starts it through the API and waits until its agent answers.
async fn running_vm(api: &Api, vmid: u32) {
    api.clone_template(vmid, &[]).await;
    start(api, vmid).await;
    agent_answers(api, vmid).await;
}

async fn start(api: &Api, vmid: u32) {
    let upid = api.post(&vm_path(vmid, "status/start"), &[]).await.upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "OK");
}

async fn agent_answers(api: &Api, vmid: u32) {
    api.eventually(&format!("the agent of {vmid} answers"), || async {
        agent(api, vmid).await.status == 200
    })
    .await;
}

/// `status/current`'s `status` and `qmpstatus` (F14).
async fn status(api: &Api, vmid: u32) -> (String, String) {
    let current = api.get(&vm_path(vmid, "status/current")).await;
    let data = current.data();
    (
        data["status"].as_str().unwrap_or_default().to_string(),
        data["qmpstatus"].as_str().unwrap_or_default().to_string(),
    )
}

fn stopped() -> (String, String) {
    ("stopped".into(), "stopped".into())
}

/// The agent of a VM just started: not running yet (F5), then answering after the agent delay.
async fn agent_boots_again(api: &Api, vmid: u32) {
    let booting = agent(api, vmid).await;
    assert_eq!(
        (booting.status, booting.reason.as_str()),
        (500, "QEMU guest agent is not running"),
        "the agent delay starts again with every start"
    );
    agent_answers(api, vmid).await;
}

#[tokio::test]
async fn qm_stop_stops_the_vm_keeps_its_config_and_a_start_through_the_api_boots_it_again() {
    let api = Api::start().await;
    running_vm(&api, VMID).await;
    let config = api.get(&vm_path(VMID, "config")).await;

    let answer = api.admin("POST", &format!("vms/{VMID}/stop"), "").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(status(&api, VMID).await, stopped());
    let agent_answer = agent(&api, VMID).await;
    assert_eq!(
        (agent_answer.status, agent_answer.reason.as_str()),
        (500, "VM 199999 is not running"),
        "F5: the agent of a stopped VM"
    );
    assert_eq!(
        api.get(&vm_path(VMID, "config")).await.body,
        config.body,
        "config (and with it the disks) untouched, digest included"
    );

    start(&api, VMID).await;
    assert_eq!(
        status(&api, VMID).await,
        ("running".into(), "running".into())
    );
    agent_boots_again(&api, VMID).await;
}

#[tokio::test]
async fn qm_stop_refuses_a_locked_or_unknown_vm_and_leaves_a_stopped_one_stopped() {
    let api = Api::start().await;
    api.clone_template(VMID, &[]).await;
    assert!(api.sim.state().set_run_state(VMID, RunState::Running));
    assert!(api.sim.state().set_lock(VMID, Some("backup")));
    let locked = api.admin("POST", &format!("vms/{VMID}/stop"), "").await;
    assert_eq!(
        (locked.status, locked.reason.as_str()),
        (500, "VM is locked (backup)")
    );
    assert_eq!(
        api.sim.state().guest(VMID).unwrap().run_state,
        RunState::Running
    );

    let unknown = api.admin("POST", "vms/4242/stop", "").await;
    assert_eq!(
        (unknown.status, unknown.reason.as_str()),
        (
            500,
            "Configuration file 'nodes/pv1-1/qemu-server/4242.conf' does not exist"
        )
    );
    assert_eq!(api.admin("POST", "vms/nope/stop", "").await.status, 400);

    assert!(api.sim.state().set_lock(VMID, None));
    api.sim.stop_vm(VMID).expect("the library helper stops it");
    api.sim.stop_vm(VMID).expect("a stopped VM stays stopped");
    assert_eq!(status(&api, VMID).await, stopped());
}

#[tokio::test]
async fn node_reboot_stops_every_vm_then_startall_starts_those_marked_onboot() {
    // A task latency long enough to see every VM stopped before startall runs.
    let api = Api::start_with(SimConfig {
        task_latency: Duration::from_millis(250),
        ..SimConfig::default()
    })
    .await;
    let (onboot, plain) = (200, 201);
    running_vm(&api, onboot).await;
    running_vm(&api, plain).await;
    api.put(&vm_path(onboot, "config"), &[("onboot", "1")])
        .await;
    let config = api.get(&vm_path(onboot, "config")).await;
    assert_eq!(
        config.data()["onboot"],
        json!(1),
        "stored and returned as an integer"
    );

    let reboot = api.admin("POST", "nodes/pv1-1/reboot", "").await;
    assert_eq!(reboot.status, 200, "{reboot:?}");
    assert_eq!(reboot.data()["stopped"], json!([onboot, plain]));
    assert_eq!(status(&api, onboot).await, stopped(), "stopped at once");
    assert_eq!(status(&api, plain).await, stopped(), "stopped at once");

    let startall = reboot.data()["startall"].as_str().unwrap().to_string();
    let task = api.wait_task(&startall).await;
    assert_eq!(
        (&task["type"], &task["user"], &task["exitstatus"]),
        (&json!("startall"), &json!("root@pam"), &json!("OK"))
    );
    assert!(task.get("tokenid").is_none(), "the node's own task: {task}");
    assert_eq!(
        api.sim.state().task(&startall).unwrap().log,
        [format!("Starting VM {onboot}")]
    );
    assert_eq!(
        status(&api, onboot).await,
        ("running".into(), "running".into())
    );
    agent_boots_again(&api, onboot).await;
    assert_eq!(status(&api, plain).await, stopped(), "no onboot, no start");
}

#[tokio::test]
async fn a_reboot_that_does_not_start_onboot_guests_leaves_them_for_the_api_to_start() {
    let api = Api::start().await;
    running_vm(&api, VMID).await;
    assert!(api.sim.state().set_config(VMID, "onboot", Some("1")));

    let reboot = api
        .sim
        .reboot_node("pv1-1", false)
        .expect("the library helper");
    assert_eq!((reboot.stopped, reboot.startall), (vec![VMID], None));
    assert!(
        api.sim
            .state()
            .tasks()
            .iter()
            .all(|task| task.task_type != "startall"),
        "no startall task"
    );
    assert_eq!(status(&api, VMID).await, stopped());

    start(&api, VMID).await;
    agent_boots_again(&api, VMID).await;
}

#[tokio::test]
async fn a_reboot_of_another_node_or_with_unknown_options_is_400_and_stops_nothing() {
    let api = Api::start().await;
    api.clone_template(VMID, &[]).await;
    assert!(api.sim.state().set_run_state(VMID, RunState::Running));
    for (route, body) in [
        ("nodes/pv9-9/reboot", ""),
        ("nodes/pv1-1/reboot", r#"{"startOnBoot": false}"#),
        ("nodes/pv1-1/reboot", r#"{"startOnboot": "no"}"#),
    ] {
        let refused = api.admin("POST", route, body).await;
        assert_eq!(refused.status, 400, "{route} {body}: {refused:?}");
    }
    assert!(api.sim.reboot_node("pv9-9", true).is_err());
    assert_eq!(
        api.sim.state().guest(VMID).unwrap().run_state,
        RunState::Running
    );
}
