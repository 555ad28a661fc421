//! Grants changed while the broker serves: added, replaced and removed without a restart, with
//! the secret and the CA resolved from the host's objects (as the operator does from Kubernetes
//! Secrets) and held in memory.

use std::collections::HashMap;
use std::sync::Mutex;

use egress_capability_http::{Broker, HttpGrant};
use egress_runtime::Capability as _;
use egress_runtime::egress::EgressError;
use egress_runtime::grant::{GrantContext, GrantHost, SecretKeyRef};

use crate::support::*;

/// A host's Secrets and ConfigMaps by name (their one key is `value`).
#[derive(Default)]
struct Objects(Mutex<HashMap<String, String>>);

impl Objects {
    fn put(&self, name: &str, value: &str) {
        self.0.lock().unwrap().insert(name.into(), value.into());
    }
}

impl GrantHost for Objects {
    fn secret(&self, reference: &SecretKeyRef) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        self.0
            .lock()
            .unwrap()
            .get(&reference.name)
            .map(|value| zeroize::Zeroizing::new(value.clone().into_bytes()))
            .ok_or_else(|| format!("no Secret {}", reference.name))
    }

    fn config_map(&self, reference: &SecretKeyRef) -> Result<String, String> {
        self.0
            .lock()
            .unwrap()
            .get(&reference.name)
            .cloned()
            .ok_or_else(|| format!("no ConfigMap {}", reference.name))
    }

    fn file(&self, _path: &std::path::Path) -> Result<(), String> {
        Err("no files here".into())
    }
}

fn grant(origin: &str) -> HttpGrant {
    serde_json::from_value(serde_json::json!({
        "origins": [origin],
        "credential": {"header": "Authorization", "format": "Bearer {secret}", "secretRef": {"name": "token", "key": "value"}},
        "tls": {"caConfigMapRef": {"name": "ca", "key": "value"}, "http1Only": true},
    }))
    .unwrap()
}

fn set(
    broker: &Broker,
    identity: &str,
    grant: &HttpGrant,
    objects: &Objects,
) -> Result<(), String> {
    broker
        .set_grant(
            identity,
            grant,
            &GrantContext {
                digests: &[],
                host: objects,
            },
        )
        .map_err(|error| error.to_string())
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
    let broker = Broker::new();
    let url = format!("{}/", server.origin());

    let denied = send(&broker, "tenant-a", get(&url, &[])).await;
    assert!(
        matches!(denied, Err(EgressError::HttpRequestDenied)),
        "{denied:?}"
    );

    // The secret and the CA come from the host's objects, not files.
    let objects = Objects::default();
    objects.put("token", "first-token\n");
    objects.put("ca", &ca.pem());
    set(&broker, "tenant-a", &grant(&server.origin()), &objects).unwrap();
    assert_eq!(broker.identities(), ["tenant-a"]);
    send(&broker, "tenant-a", get(&url, &[])).await.unwrap();
    assert_eq!(
        server.seen()[0].headers["authorization"],
        "Bearer first-token"
    );

    // Rotated: the host sets the grant again, and the next request uses the new secret.
    objects.put("token", "second-token");
    set(&broker, "tenant-a", &grant(&server.origin()), &objects).unwrap();
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
    assert!(set(&broker, "tenant-a", &bad, &objects).is_err());
    // As does a grant whose Secret is missing, naming it.
    let mut missing = grant(&server.origin());
    missing
        .credential
        .as_mut()
        .unwrap()
        .secret_ref
        .as_mut()
        .unwrap()
        .name = "gone".into();
    let error = set(&broker, "tenant-a", &missing, &objects).unwrap_err();
    assert!(
        error.contains("credential.secretRef") && error.contains("gone"),
        "{error}"
    );
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
    let broker = Broker::new();
    let header = http::HeaderName::from_static("x-api-key");
    assert!(!broker.is_forbidden_header(&header));
    let mut custom = grant("https://127.0.0.1:1");
    custom.credential.as_mut().unwrap().header = "X-Api-Key".into();
    let objects = Objects::default();
    objects.put("token", "k");
    objects.put("ca", &Ca::new("x").pem());
    set(&broker, "t", &custom, &objects).unwrap();
    assert!(broker.is_forbidden_header(&header));
    broker.remove_grant("t");
    assert!(!broker.is_forbidden_header(&header));
}
