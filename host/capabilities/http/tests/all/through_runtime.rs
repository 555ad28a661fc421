//! The broker behind the real runtime, with the real reference component
//! (`target/components/reference.wasm`, built by `just build-components`).

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use egress_runtime::types::{CheckReason, Response};
use egress_runtime::{CallContext, CallError, Provider, Request, Runtime, RuntimeConfig};

use crate::memory::{SnapshotCreator, contains};
use crate::support::*;

const SECRET: &str = "pve-token-7d3c9a1e-5b2f-4e8d-a6c4-0f9e8d7c6b5a";
/// The provider's name, as the reference component's `describe` says.
const PROVIDER: &str = "reference";

fn component() -> PathBuf {
    testkit::component(PROVIDER)
}

struct Setup {
    files: Files,
    server: Server,
}

impl Setup {
    /// A server answering instance reads; every answer also echoes the Authorization it got.
    async fn new() -> Self {
        let ca = Ca::new("egress runtime test CA");
        let files = Files::new();
        files.write("token", SECRET);
        files.write("ca.pem", &ca.pem());
        let server = Server::start(
            &ca,
            &["127.0.0.1"],
            Protocol::Http1,
            handler(|seen| {
                let echo = seen
                    .headers
                    .get("authorization")
                    .map_or("", |v| v.to_str().unwrap())
                    .to_owned();
                if seen.path_and_query == "/health" {
                    return Reply {
                        status: 401,
                        ..Reply::ok(&format!("authentication failed for {echo}"))
                    };
                }
                let name = seen
                    .path_and_query
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                Reply::ok(
                    &serde_json::json!({
                        "name": name, "state": "running", "addresses": ["192.0.2.7"],
                        "uid": "uid-1", "debug": { "youSent": echo },
                    })
                    .to_string(),
                )
            }),
        )
        .await;
        Self { files, server }
    }

    fn runtime(&self, config: RuntimeConfig) -> Runtime {
        let grant = proxmox_grant(
            &self.server.origin(),
            &self.files.path("token"),
            &self.files.path("ca.pem"),
        );
        Runtime::new(
            config
                .cache_dir(None)
                .capability(Arc::new(broker(PROVIDER, grant))),
        )
        .unwrap()
    }

    fn config(&self) -> String {
        serde_json::json!({ "endpoint": self.server.origin() }).to_string()
    }
}

async fn get(provider: &Provider, config: &str, name: &str) -> Result<Response, CallError> {
    let request = Request::Get {
        config: config.to_owned(),
        provider_id: format!("ref/{name}"),
    };
    provider.call(request, &CallContext::default()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_memory_never_holds_the_secret() {
    let setup = Setup::new().await;
    let creator = SnapshotCreator::default();
    let runtime = setup.runtime(RuntimeConfig::default().memory_creator(Arc::new(creator.clone())));
    let provider = runtime.load_file(&component()).await.unwrap();
    creator.snapshots.lock().unwrap().clear();

    let config = setup.config();
    for name in ["scan-marker-one", "scan-marker-two", "scan-marker-three"] {
        let response = get(&provider, &config, name).await.unwrap();
        assert!(
            matches!(response, Response::Get(ref instance) if instance.name == name),
            "{response:?}"
        );
    }
    let check = provider
        .call(
            Request::Check {
                config: config.clone(),
            },
            &CallContext::default(),
        )
        .await
        .unwrap();
    let Response::Check(check) = check else {
        panic!("{check:?}")
    };

    let seen = setup.server.seen();
    assert_eq!(seen.len(), 4);
    assert!(
        seen.iter()
            .all(|s| s.headers["authorization"] == format!("PVEAPIToken={SECRET}").as_str())
    );

    let snapshots = creator.snapshots.lock().unwrap().clone();
    assert!(
        snapshots.len() >= 4,
        "one memory per call at least, got {}",
        snapshots.len()
    );
    // The scan sees what the guest handled: the names it asked for are in its memory.
    for marker in ["scan-marker-one", "scan-marker-two", "scan-marker-three"] {
        assert!(
            snapshots.iter().any(|memory| contains(memory, marker)),
            "{marker} not found: the scan reads nothing"
        );
    }
    let header_value = format!("PVEAPIToken={SECRET}");
    let needles = [
        SECRET.to_owned(),
        STANDARD.encode(SECRET).trim_end_matches('=').to_owned(),
        URL_SAFE_NO_PAD.encode(SECRET),
        STANDARD
            .encode(&header_value)
            .trim_end_matches('=')
            .to_owned(),
    ];
    for (index, memory) in snapshots.iter().enumerate() {
        for needle in &needles {
            assert!(
                !contains(memory, needle),
                "memory {index} ({} bytes) holds the secret in some form",
                memory.len()
            );
        }
    }
    // The 401 body quoted the token; the provider's message quotes the redacted body.
    assert_eq!(check.reason, CheckReason::Unauthorized, "{check:?}");
    assert!(
        check.message.contains("[redacted]") && !check.message.contains(SECRET),
        "{}",
        check.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_reaching_another_origin_or_setting_authorization_is_refused() {
    let setup = Setup::new().await;
    let runtime = setup.runtime(RuntimeConfig::default());
    let provider = runtime.load_file(&component()).await.unwrap();
    let port = setup.server.addr.port();

    for endpoint in [
        format!("https://localhost:{port}"),
        format!("https://127.0.0.1:{}", port.wrapping_add(1)),
        format!("http://127.0.0.1:{port}"),
    ] {
        let config = serde_json::json!({ "endpoint": endpoint }).to_string();
        let result = get(&provider, &config, "vm").await;
        assert!(
            matches!(result, Err(CallError::Provider(_))),
            "{endpoint}: {result:?}"
        );
    }

    let config = serde_json::json!({ "endpoint": setup.server.origin(), "debugSendAuthorization": "Bearer guest" }).to_string();
    let result = get(&provider, &config, "vm").await;
    match result {
        Err(CallError::Provider(error)) => {
            assert!(error.message().contains("authorization"), "{error:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(setup.server.seen().is_empty(), "nothing reached the server");

    // The same provider and grant do reach the granted origin.
    get(&provider, &setup.config(), "vm").await.unwrap();
    assert_eq!(setup.server.seen().len(), 1);
}

/// `blocking-write-and-flush` takes at most 4,096 bytes per call: a request body written in larger
/// pieces traps the instance (the reference provider once wrote 64 KiB pieces, so any `create`
/// with user data over 4 KiB trapped). Its body now goes out through `egress-guest`, piece by
/// piece as `check-write` permits, and reaches the endpoint whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_body_over_4_kib_reaches_the_endpoint_whole() {
    let ca = Ca::new("egress runtime test CA");
    let files = Files::new();
    files.write("token", SECRET);
    files.write("ca.pem", &ca.pem());
    let server = Server::start(
        &ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(|_| {
            Reply::ok(
                &serde_json::json!({"name": "big", "state": "provisioning", "addresses": []})
                    .to_string(),
            )
        }),
    )
    .await;
    let grant = proxmox_grant(
        &server.origin(),
        &files.path("token"),
        &files.path("ca.pem"),
    );
    let runtime =
        Runtime::new(RuntimeConfig::default().capability(Arc::new(broker(PROVIDER, grant))))
            .unwrap();
    let provider = runtime.load_file(&component()).await.unwrap();
    // 40 KiB of cloud-config: ten times the largest write the stream takes, not a multiple of it.
    let user_data: String = (0..40 * 1024 + 7)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let request = egress_runtime::types::CreateRequest {
        name: "big".into(),
        uid: "uid-big".into(),
        tags: Vec::new(),
        user_data: user_data.clone(),
        config: serde_json::json!({ "endpoint": server.origin() }).to_string(),
        placement: None,
    };
    let outcome = provider
        .call(Request::Create { request }, &CallContext::default())
        .await;
    assert!(matches!(outcome, Ok(Response::Create(_))), "{outcome:?}");

    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].headers["content-length"].to_str().unwrap(),
        seen[0].body.len().to_string()
    );
    let sent: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(sent["userData"].as_str(), Some(user_data.as_str()));
    assert_eq!(sent["uid"], "uid-big");
}
