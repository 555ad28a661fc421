//! What every test needs: a simulator, a client for it, and polling instead of sleeping.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Config};
use kubesim::KubeSim;

/// A fresh simulator and a kube client connected to it over HTTP.
pub async fn start() -> (KubeSim, Client) {
    let sim = KubeSim::start().await.expect("kubesim starts");
    let config = Config::new(sim.url().parse().expect("the URL parses"));
    let client = Client::try_from(config).expect("kube accepts an http:// cluster URL");
    (sim, client)
}

/// Creates a namespace through the API.
pub async fn namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
}

/// A ConfigMap with labels and data.
pub fn configmap(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> ConfigMap {
    let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    };
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: (!labels.is_empty()).then(|| map(labels)),
            ..ObjectMeta::default()
        },
        data: Some(map(data)),
        ..ConfigMap::default()
    }
}

/// Polls `condition` every 20 ms until it holds; panics naming `what` after `limit`.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The HTTP status of a kube API error, or a panic for any other outcome.
pub fn api_code<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A raw GET of `path` with an `Accept` header: the HTTP status and the JSON body.
pub async fn get_as(client: &Client, path: &str, accept: &str) -> (u16, serde_json::Value) {
    let request = http::Request::get(path)
        .header("accept", accept)
        .body(Vec::new())
        .unwrap();
    match client.request::<serde_json::Value>(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(status)) => (status.code, serde_json::json!(status)),
        Err(other) => panic!("GET {path}: {other}"),
    }
}

/// The Accept header `kubectl get` sends.
pub const KUBECTL_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// A namespaced CRD `gizmos.kubesim.test` (short name `gz`, category `kubesim`) with the
/// status subresource and printer columns Ready, Size (integer), Owner (priority 1) and Age.
pub fn gizmo_crd() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gizmos.kubesim.test"},
        "spec": {
            "group": "kubesim.test",
            "names": {"kind": "Gizmo", "plural": "gizmos", "singular": "gizmo",
                      "shortNames": ["gz"], "categories": ["kubesim"]},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Ready", "type": "string",
                     "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Owner", "type": "string", "jsonPath": ".spec.owner", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A gizmo, for tests.",
                    "properties": {
                        "spec": {"type": "object", "required": ["size"], "properties": {
                            "size": {"type": "integer", "description": "How big."},
                            "owner": {"type": "string", "nullable": true},
                        }},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    })
}
