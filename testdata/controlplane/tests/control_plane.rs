//! The harness against the real binaries: it starts, serves, limits a ServiceAccount by RBAC,
//! survives its own faults, and leaves no process behind.

use controlplane::ControlPlane;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ListParams, PostParams};

fn alive(pid: u32) -> bool {
    // A zombie is not alive: read its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.split(' ').nth(2).is_none_or(|state| state != "Z"))
}

fn children_named(name: &str) -> Vec<u32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let fields: Vec<&str> = stat.split(' ').collect();
            fields.get(1) == Some(&format!("({name})").as_str())
                && fields.get(3) == Some(&me.as_str())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_control_plane_serves_limits_a_service_account_and_goes_with_its_processes() {
    let mut plane = ControlPlane::start()
        .await
        .expect("the control plane starts");
    let namespaces: Api<Namespace> = Api::all(plane.client());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|namespace| namespace.metadata.name)
        .collect();
    assert!(names.contains(&"kube-system".to_owned()), "{names:?}");

    // A ServiceAccount with no role may do nothing.
    let token = plane.service_account_token("team", "nobody").await.unwrap();
    let limited = plane.client_with_token(&token).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(limited, "team");
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("a ServiceAccount without a role listed Secrets: {other:?}"),
    }

    // The API server killed and started again: etcd kept what was written.
    let maps: Api<ConfigMap> = Api::namespaced(plane.client(), "default");
    let map = serde_json::from_value(serde_json::json!({"metadata": {"name": "kept"}})).unwrap();
    maps.create(&PostParams::default(), &map).await.unwrap();
    plane.kill_apiserver();
    assert!(maps.get("kept").await.is_err(), "no API server answers");
    plane.start_apiserver().await.unwrap();
    assert!(maps.get("kept").await.is_ok());
    assert!(plane.compact().await.unwrap() > 0);
    assert!(
        plane
            .metrics()
            .await
            .unwrap()
            .contains("apiserver_request_total")
    );

    let pids: Vec<u32> = ["etcd", "kube-apiserver"]
        .iter()
        .flat_map(|name| children_named(name))
        .collect();
    assert_eq!(pids.len(), 2, "one etcd, one kube-apiserver: {pids:?}");
    drop(plane);
    assert!(
        pids.iter().all(|pid| !alive(*pid)),
        "a process outlived its control plane"
    );
}
