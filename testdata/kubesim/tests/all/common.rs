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
