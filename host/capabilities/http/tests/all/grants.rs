//! Grants changed while the broker serves: added, replaced and removed without a restart, with
//! the secret and the CA held in memory (as the operator does from Kubernetes Secrets).

use std::sync::Arc;

use egress_capability_http::credentials::MemorySource;
use egress_capability_http::{Broker, Grant, GrantSources, Grants};
use egress_runtime::egress::EgressError;

use crate::support::*;

fn grant(origin: &str) -> Grant {
    let grants = Grants::from_json(
        &serde_json::json!({"grants": {"x": {
            "origins": [origin],
            "credential": {"header": "Authorization", "format": "Bearer {secret}"},
            "tls": {"http1Only": true},
        }}})
        .to_string(),
    )
    .unwrap();
    grants.grants["x"].clone()
}

#[tokio::test]
async fn a_grant_added_replaced_and_removed_at_run_time_takes_effect_on_the_next_request() {
    let ca = Ca::new("run-time grants CA");
    let server = Server::start(
        &ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(|_| Reply::ok("{}")),
    )
    .await;
    let broker = Broker::new(&Grants::default()).unwrap();
    let url = format!("{}/", server.origin());

    let denied = send(&broker, "tenant-a", get(&url, &[])).await;
    assert!(
        matches!(denied, Err(EgressError::HttpRequestDenied)),
        "{denied:?}"
    );

    // The secret and the CA come from memory, not files.
    let secret = Arc::new(MemorySource::new("Secret ops/token key token"));
    secret.set(Some("first-token\n"));
    let sources = GrantSources {
        credential: Some(secret.clone()),
        ca_pem: Some(ca.pem()),
        digests: Vec::new(),
    };
    broker
        .set_grant("tenant-a", &grant(&server.origin()), sources.clone())
        .unwrap();
    assert_eq!(broker.identities(), ["tenant-a"]);
    send(&broker, "tenant-a", get(&url, &[])).await.unwrap();
    assert_eq!(
        server.seen()[0].headers["authorization"],
        "Bearer first-token"
    );

    // Rotated in memory: used from the next request.
    secret.set(Some("second-token"));
    send(&broker, "tenant-a", get(&url, &[])).await.unwrap();
    assert_eq!(
        server.seen()[1].headers["authorization"],
        "Bearer second-token"
    );

    // Only the named identity is granted; another still gets nothing.
    let other = send(&broker, "tenant-b", get(&url, &[])).await;
    assert!(
        matches!(other, Err(EgressError::HttpRequestDenied)),
        "{other:?}"
    );

    // A refused replacement leaves the previous grant serving.
    let mut bad = grant(&server.origin());
    bad.credential.as_mut().unwrap().format = "no placeholder".into();
    assert!(broker.set_grant("tenant-a", &bad, sources).is_err());
    send(&broker, "tenant-a", get(&url, &[])).await.unwrap();
    assert_eq!(server.seen().len(), 3);

    broker.remove_grant("tenant-a");
    let removed = send(&broker, "tenant-a", get(&url, &[])).await;
    assert!(
        matches!(removed, Err(EgressError::HttpRequestDenied)),
        "{removed:?}"
    );
    assert_eq!(server.seen().len(), 3);
    assert!(broker.identities().is_empty());
}

#[tokio::test]
async fn a_guest_may_not_set_a_header_a_grant_added_at_run_time_injects() {
    use egress_runtime::egress::Egress;
    let broker = Broker::new(&Grants::default()).unwrap();
    let header = http::HeaderName::from_static("x-api-key");
    assert!(!broker.is_forbidden_header(&header));
    let mut custom = grant("https://127.0.0.1:1");
    custom.credential.as_mut().unwrap().header = "X-Api-Key".into();
    let secret = Arc::new(MemorySource::new("k"));
    let sources = GrantSources {
        credential: Some(secret),
        ca_pem: Some(Ca::new("x").pem()),
        digests: Vec::new(),
    };
    broker.set_grant("t", &custom, sources).unwrap();
    assert!(broker.is_forbidden_header(&header));
    broker.remove_grant("t");
    assert!(!broker.is_forbidden_header(&header));
}
