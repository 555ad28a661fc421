//! The fault-injection knobs, driven over real HTTPS.

mod common;

use std::time::{Duration, Instant};

use common::Api;
use pvesim::{FaultAction, FaultRule, RequestRecord, SimConfig, Trigger};

const CLONE: &str = "/nodes/*/qemu/*/clone";

async fn clone(api: &Api, newid: &str) -> common::Answer {
    api.post(
        "/nodes/pv1-1/qemu/9001/clone",
        &[("newid", newid), ("name", "proxy-a")],
    )
    .await
}

#[tokio::test]
async fn status_fault_answers_with_the_given_code_and_text_on_the_nth_call_only() {
    let api = Api::start().await;
    api.sim.faults().add(FaultRule::new(
        "GET",
        "/version",
        Trigger::Nth(2),
        FaultAction::Status {
            status: 596,
            message: "Connection timed out".into(),
        },
    ));
    let statuses: Vec<(u16, String)> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            let answer = api.get("/version").await;
            out.push((answer.status, answer.reason));
        }
        out
    };
    assert_eq!(statuses[0].0, 200);
    assert_eq!(statuses[1], (596, "Connection timed out".to_string()));
    assert_eq!(statuses[2].0, 200);
}

#[tokio::test]
async fn reset_closes_the_connection_without_an_answer_and_is_logged() {
    let api = Api::start().await;
    api.sim.faults().add(FaultRule::new(
        "GET",
        "/cluster/resources",
        Trigger::Always,
        FaultAction::Reset,
    ));
    let result = api.try_send("GET", "/cluster/resources?type=vm", &[]).await;
    assert!(
        result.is_err(),
        "expected a transport error, got {result:?}"
    );
    assert_eq!(
        api.get("/version").await.status,
        200,
        "other endpoints are unaffected"
    );
    let log = api.sim.state().request_log();
    assert_eq!(
        log,
        [
            RequestRecord {
                method: "GET".into(),
                path: "/api2/json/cluster/resources".into(),
                status: None,
                chunked: false,
            },
            RequestRecord {
                method: "GET".into(),
                path: "/api2/json/version".into(),
                status: Some(200),
                chunked: false,
            },
        ]
    );
}

#[tokio::test]
async fn delay_holds_the_answer_then_answers_normally() {
    let api = Api::start().await;
    api.sim.faults().add(FaultRule::new(
        "*",
        "/version",
        Trigger::Always,
        FaultAction::Delay(Duration::from_millis(120)),
    ));
    let before = Instant::now();
    let answer = api.get("/version").await;
    assert!(before.elapsed() >= Duration::from_millis(120));
    assert_eq!(answer.data()["version"], "9.2.20");
}

#[tokio::test]
async fn lock_contention_names_the_vmid_in_the_path() {
    let api = Api::start().await;
    api.sim.faults().add(FaultRule::new(
        "POST",
        CLONE,
        Trigger::Nth(1),
        FaultAction::LockContention,
    ));
    let answer = clone(&api, "199999").await;
    assert_eq!(
        (answer.status, answer.reason.as_str()),
        (
            500,
            "can't lock file '/var/lock/qemu-server/lock-9001.conf' - got timeout"
        )
    );
    assert!(
        api.sim.state().guest(199_999).is_none(),
        "a refused request changes nothing"
    );
    assert_eq!(
        clone(&api, "199999").await.status,
        200,
        "the second call goes through"
    );
}

#[tokio::test]
async fn task_fault_fails_the_clone_inside_the_task_and_removes_the_target() {
    let api = Api::start().await;
    api.sim.faults().add(FaultRule::new(
        "POST",
        CLONE,
        Trigger::Always,
        FaultAction::TaskFails("clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout".into()),
    ));
    let upid = clone(&api, "199999").await.upid();
    assert_eq!(
        api.sim.state().guest(199_999).unwrap().lock.as_deref(),
        Some("clone")
    );
    let status = api.wait_task(&upid).await;
    assert_eq!(
        status["exitstatus"],
        "clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout"
    );
    assert!(api.sim.state().guest(199_999).is_none());
}

#[tokio::test]
async fn task_fault_on_destroy_leaves_the_vm_unlocked() {
    let api = Api::start().await;
    api.clone_template(199_999, &[]).await;
    api.sim.faults().add(FaultRule::new(
        "DELETE",
        "/nodes/*/qemu/*",
        Trigger::Nth(1),
        FaultAction::TaskFails("boom".into()),
    ));
    let upid = api.delete("/nodes/pv1-1/qemu/199999?purge=1").await.upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "boom");
    let guest = api.sim.state().guest(199_999).unwrap();
    assert_eq!(guest.lock, None);
}

#[tokio::test]
async fn warnings_fault_does_the_work_and_ends_warnings_1() {
    let api = Api::start().await;
    api.clone_template(199_999, &[]).await;
    api.sim.faults().add(FaultRule::new(
        "POST",
        "/nodes/*/qemu/*/status/start",
        Trigger::Always,
        FaultAction::TaskWarnings(1),
    ));
    let upid = api
        .post("/nodes/pv1-1/qemu/199999/status/start", &[])
        .await
        .upid();
    assert_eq!(api.wait_task(&upid).await["exitstatus"], "WARNINGS: 1");
    assert_eq!(
        api.sim.state().guest(199_999).unwrap().run_state,
        pvesim::RunState::Running
    );
}

#[tokio::test]
async fn abort_after_serves_n_requests_then_resets_all_until_cleared() {
    let api = Api::start().await;
    api.sim.faults().abort_after(2);
    assert_eq!(api.get("/version").await.status, 200);
    assert_eq!(api.get("/cluster/nextid").await.status, 200);
    for path in ["/version", "/cluster/resources"] {
        assert!(
            api.try_send("GET", path, &[]).await.is_err(),
            "{path} should be reset"
        );
    }
    api.sim.faults().clear_abort();
    assert_eq!(api.get("/version").await.status, 200);
    let statuses: Vec<Option<u16>> = api
        .sim
        .state()
        .request_log()
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [Some(200), Some(200), None, None, Some(200)]);
}

#[tokio::test]
async fn rate_faults_repeat_with_the_same_seed() {
    async fn outcomes(seed: u64) -> Vec<u16> {
        let api = Api::start_with(SimConfig {
            fault_seed: seed,
            ..SimConfig::default()
        })
        .await;
        api.sim.faults().add(FaultRule::new(
            "GET",
            "/version",
            Trigger::Rate(0.5),
            FaultAction::Status {
                status: 500,
                message: "injected".into(),
            },
        ));
        let mut out = Vec::new();
        for _ in 0..16 {
            out.push(api.get("/version").await.status);
        }
        out
    }
    let first = outcomes(7).await;
    assert_eq!(first, outcomes(7).await);
    assert!(first.contains(&500) && first.contains(&200), "{first:?}");
}

#[tokio::test]
async fn removing_a_rule_stops_it() {
    let api = Api::start().await;
    let id = api.sim.faults().add(FaultRule::new(
        "*",
        "/**",
        Trigger::Always,
        FaultAction::Status {
            status: 503,
            message: "down".into(),
        },
    ));
    assert_eq!(api.get("/version").await.status, 503);
    api.sim.faults().remove(id);
    assert_eq!(api.get("/version").await.status, 200);
}
