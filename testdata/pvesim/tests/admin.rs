//! The admin API under `/_sim/`, over real HTTPS: what the conformance suite uses to recognise
//! the simulator and count VMs (and tests set faults with); and the test-backend hook
//! `POST /_egress-test/stop` the suite stops a VM through.

mod common;

use common::{Api, admin_as as admin};
use serde_json::json;

#[tokio::test]
async fn info_names_the_simulator_and_needs_a_token() {
    let api = Api::start().await;
    let token = api.sim.token_header();
    let info = admin(&api, Some(&token), "GET", "info", "").await;
    assert_eq!(info.status, 200, "{info:?}");
    assert_eq!(info.data()["simulator"], "pvesim");
    assert_eq!(info.data()["node"], "pv1-1");
    let anonymous = admin(&api, None, "GET", "info", "").await;
    assert_eq!(anonymous.status, 401);
    let wrong = admin(
        &api,
        Some("PVEAPIToken=egress@pve!operator=nope"),
        "GET",
        "info",
        "",
    )
    .await;
    assert_eq!(wrong.status, 401);
}

#[tokio::test]
async fn faults_set_over_http_fire_on_the_api_but_never_on_the_admin_api() {
    let api = Api::start().await;
    let token = api.sim.token_header();
    let added = admin(
        &api,
        Some(&token),
        "POST",
        "faults",
        "* /** always status=503:conformance fault\n\nGET /version always lock\n",
    )
    .await;
    assert_eq!(added.status, 200, "{added:?}");
    assert_eq!(added.data()["added"], 2);
    let faulted = api.get("/nodes").await;
    assert_eq!(
        (faulted.status, faulted.reason.as_str()),
        (503, "conformance fault")
    );
    // The admin API is outside the faults, so the rule that breaks everything can be cleared.
    let cleared = admin(&api, Some(&token), "DELETE", "faults", "").await;
    assert_eq!(cleared.status, 200, "{cleared:?}");
    assert_eq!(api.get("/version").await.status, 200);
}

#[tokio::test]
async fn a_bad_fault_line_adds_nothing() {
    let api = Api::start().await;
    let token = api.sim.token_header();
    let refused = admin(
        &api,
        Some(&token),
        "POST",
        "faults",
        "GET /version always lock\nGET /version sometimes reset\n",
    )
    .await;
    assert_eq!(refused.status, 400);
    assert!(refused.message().contains("sometimes"), "{refused:?}");
    assert_eq!(
        api.get("/version").await.status,
        200,
        "the good line was not added"
    );
}

#[tokio::test]
async fn requests_and_vms_count_what_the_api_served_and_holds() {
    let api = Api::start().await;
    let token = api.sim.token_header();
    api.clone_template(120, &[]).await;
    let vms = admin(&api, Some(&token), "GET", "vms", "").await;
    let vms = vms.data().as_array().unwrap().clone();
    let named: Vec<_> = vms
        .iter()
        .filter(|vm| vm["name"] == "proxy-reconaaaaaaaaaaa")
        .collect();
    assert_eq!(named.len(), 1, "{vms:?}");
    assert_eq!(named[0]["vmid"], 120);
    assert_eq!(named[0]["template"], false);
    assert_eq!(
        vms.iter().filter(|vm| vm["template"] == true).count(),
        2,
        "the preloaded templates"
    );

    let served = api.sim.state().request_log().len();
    let counts = admin(&api, Some(&token), "GET", "requests", "").await;
    assert_eq!(
        counts.data()["total"],
        served,
        "admin requests are not logged"
    );
    assert_eq!(counts.data()["unanswered"], 0);
}

/// The conformance suite's test-backend hook (`docs/contract.md`): plain JSON marked
/// `"hook": "stop"`, the token required, a VM found by its name and stopped as by `qm stop`.
#[tokio::test]
async fn the_stop_hook_stops_a_vm_by_name_and_marks_its_answers() {
    let api = Api::start().await;
    let token = api.sim.token_header();
    api.clone_template(120, &[]).await;
    let started = api.post("/nodes/pv1-1/qemu/120/status/start", &[]).await;
    assert_eq!(started.status, 200, "{started:?}");
    let hook = |auth: Option<String>, body: &'static str| {
        let request = api
            .client
            .post(format!("{}/_egress-test/stop", api.sim.url()))
            .body(body);
        let request = match auth {
            Some(auth) => request.header("Authorization", auth),
            None => request,
        };
        async move { common::answer(request.send().await.unwrap()).await }
    };
    assert_eq!(
        hook(None, r#"{"name": "proxy-reconaaaaaaaaaaa"}"#)
            .await
            .status,
        401
    );
    let unknown = hook(Some(token.clone()), r#"{"name": "no-such-vm"}"#).await;
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_eq!(unknown.body["hook"], "stop", "{unknown:?}");
    let garbled = hook(Some(token.clone()), r#"{"vmid": 120}"#).await;
    assert_eq!(
        (garbled.status, &garbled.body["hook"]),
        (400, &json!("stop"))
    );

    let stopped = hook(Some(token.clone()), r#"{"name": "proxy-reconaaaaaaaaaaa"}"#).await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    assert_eq!(stopped.body, json!({"hook": "stop", "stopped": [120]}));
    let status = api.get("/nodes/pv1-1/qemu/120/status/current").await;
    assert_eq!(status.data()["status"], "stopped", "{status:?}");
    assert_eq!(
        api.sim
            .state()
            .request_log()
            .iter()
            .filter(|r| r.path.contains("_egress-test"))
            .count(),
        0,
        "hook requests are not logged"
    );
}
