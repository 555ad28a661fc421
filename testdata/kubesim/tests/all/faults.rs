//! Injected faults and the request log, seen through kube's client.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use kubesim::{FaultAction, FaultRule};

use crate::common::{api_code, configmap, start};

fn rule(method: &str, path: &str, times: u32, action: FaultAction) -> FaultRule {
    FaultRule {
        method: method.into(),
        path: path.into(),
        times,
        action,
    }
}

#[tokio::test]
async fn injected_failures_hit_only_the_next_matching_requests() {
    let (sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &configmap("a", &[], &[]))
        .await
        .unwrap();

    sim.inject(rule(
        "GET",
        "/api/v1/namespaces/*/configmaps/*",
        1,
        FaultAction::Status(500),
    ));
    assert_eq!(api_code(api.get("a").await), (500, "InternalError".into()));
    api.get("a").await.expect("only one request was hit");

    sim.inject(rule("*", "/api/**", 1, FaultAction::Drop));
    match api.get("a").await {
        Err(kube::Error::Api(status)) => panic!("a dropped connection is no API error: {status:?}"),
        Err(_) => {}
        Ok(_) => panic!("the connection should have been dropped"),
    }
    api.get("a").await.expect("the next connection works");

    // kube retries 503 by default: the client never sees the injected one.
    sim.clear_requests();
    sim.inject(rule(
        "GET",
        "/api/v1/namespaces/default/configmaps/a",
        1,
        FaultAction::Status(503),
    ));
    api.get("a").await.expect("retried");
    let statuses: Vec<u16> = sim.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 200]);
}
