//! The `hostile` test component, through the real runtime and broker, trying to get what it was
//! not given: another provider's grant (it describes itself as `reference`), the credential back
//! through a compressed echo, and more sockets than its budget.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use egress_runtime::{
    Budget, CallContext, CallError, Limits, Provider, Request, Runtime, RuntimeConfig,
};

use crate::memory::{SnapshotCreator, contains};
use crate::support::*;

pub const SECRET: &str = "pve-token-0c9b8a7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d";

pub use testkit::component;

pub struct Setup {
    pub files: Files,
    pub ca: Ca,
}

impl Setup {
    pub fn new() -> Self {
        let ca = Ca::new("egress hostile CA");
        let files = Files::new();
        files.write("token", SECRET);
        files.write("ca.pem", &ca.pem());
        Self { files, ca }
    }

    pub fn grant(&self, origin: &str) -> serde_json::Value {
        proxmox_grant(
            origin,
            &self.files.path("token"),
            &self.files.path("ca.pem"),
        )
    }

    pub fn runtime(
        &self,
        identity: &str,
        grant: serde_json::Value,
        config: RuntimeConfig,
    ) -> Runtime {
        Runtime::new(
            config
                .cache_dir(None)
                .capability(Arc::new(broker(identity, grant))),
        )
        .unwrap()
    }
}

/// The hostile provider's answer to `attack`, which must be its own error.
pub async fn attack(provider: &Provider, attack: serde_json::Value) -> String {
    let request = Request::Get {
        config: attack.to_string(),
        provider_id: "hostile/1".into(),
    };
    match provider.call(request, &CallContext::default()).await {
        Err(CallError::Provider(error)) => error.message().to_owned(),
        other => panic!("expected the attack's own answer, got {other:?}"),
    }
}

/// The error that stopped a `get` carrying `attack`: a budget or a trap, not the attack's answer.
pub async fn stopped(provider: &Provider, attack: serde_json::Value) -> CallError {
    let request = Request::Get {
        config: attack.to_string(),
        provider_id: "hostile/1".into(),
    };
    provider
        .call(request, &CallContext::default())
        .await
        .expect_err("the host stops the call")
}

/// Reflects the request's headers, gzip-compressed whenever the request allows gzip.
fn reflecting_server(always_gzip: bool) -> Handler {
    handler(move |seen| {
        let reflected = format!("marker-reflected {:?}", seen.headers);
        let asked = seen
            .headers
            .get("accept-encoding")
            .is_some_and(|value| value.to_str().unwrap_or("").contains("gzip"));
        if always_gzip || asked {
            let mut reply = Reply::ok("");
            reply.whole = Some(gzip(reflected.as_bytes()));
            reply
                .headers
                .push(("content-encoding".into(), "gzip".into()));
            reply
        } else {
            Reply::ok(&reflected)
        }
    })
}

#[tokio::test]
async fn describing_itself_as_another_provider_borrows_none_of_its_grant() {
    let setup = Setup::new();
    let server = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        reflecting_server(false),
    )
    .await;
    // The grant is `reference`'s; hostile.wasm describes itself as `reference`.
    let runtime = setup.runtime(
        "reference",
        setup.grant(&server.origin()),
        RuntimeConfig::default(),
    );
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    assert_eq!(hostile.description().name, "reference");
    assert_eq!(hostile.identity(), "hostile");

    let answer = attack(
        &hostile,
        serde_json::json!({"attack": "reflect", "endpoint": server.origin()}),
    )
    .await;
    assert_eq!(answer, "transport: ErrorCode::HttpRequestDenied");
    assert!(server.seen().is_empty(), "nothing reached the server");

    // The component the grant is for does reach it.
    let reference = runtime.load_file(&component("reference")).await.unwrap();
    let get = Request::Get {
        config: serde_json::json!({ "endpoint": server.origin() }).to_string(),
        provider_id: "ref/vm".into(),
    };
    let _ = reference.call(get, &CallContext::default()).await;
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_grant_pinned_to_a_digest_refuses_other_bytes_under_the_same_identity() {
    let setup = Setup::new();
    let server = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        reflecting_server(false),
    )
    .await;
    let reference_bytes = std::fs::read(component("reference")).unwrap();
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&reference_bytes))
    };
    let mut grant = setup.grant(&server.origin());
    grant["digest"] = serde_json::json!(format!("sha256:{digest}"));
    let runtime = setup.runtime("reference", grant, RuntimeConfig::default());

    // Someone puts hostile.wasm where reference.wasm was: same identity, other bytes.
    let hostile_bytes = std::fs::read(component("hostile")).unwrap();
    let impostor = runtime
        .load_bytes("reference", &hostile_bytes, &component("hostile"))
        .await
        .unwrap();
    let answer = attack(
        &impostor,
        serde_json::json!({"attack": "reflect", "endpoint": server.origin()}),
    )
    .await;
    assert_eq!(answer, "transport: ErrorCode::HttpRequestDenied");
    assert!(server.seen().is_empty());

    let reference = runtime
        .load_bytes("reference", &reference_bytes, &component("reference"))
        .await
        .unwrap();
    assert_eq!(reference.component_digest().hex(), digest);
    let get = Request::Get {
        config: serde_json::json!({ "endpoint": server.origin() }).to_string(),
        provider_id: "ref/vm".into(),
    };
    let _ = reference.call(get, &CallContext::default()).await;
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compressed_echo_never_puts_the_secret_in_guest_memory() {
    compressed_echo_is_redacted_or_refused(Via::WasiHttp).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compressed_echo_through_the_exchange_never_puts_the_secret_in_guest_memory() {
    compressed_echo_is_redacted_or_refused(Via::Exchange).await;
}

/// The way out of the sandbox an attack takes.
#[derive(Clone, Copy, Debug)]
pub enum Via {
    /// `wasi:http`, a call into the host per step.
    WasiHttp,
    /// `egress:http-broker/exchange`, a whole request per call.
    Exchange,
}

impl Via {
    /// `attack` with this way out.
    pub fn attack(self, mut attack: serde_json::Value) -> serde_json::Value {
        if let Via::Exchange = self {
            attack["via"] = "exchange".into();
        }
        attack
    }
}

async fn compressed_echo_is_redacted_or_refused(via: Via) {
    let setup = Setup::new();
    let polite = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        reflecting_server(false),
    )
    .await;
    let pushy = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        reflecting_server(true),
    )
    .await;
    let broker = broker(
        "hostile",
        serde_json::json!({
            "origins": [polite.origin(), pushy.origin()],
            "credential": {
                "header": "Authorization",
                "format": "PVEAPIToken={secret}",
                "secretFile": setup.files.path("token"),
            },
            "tls": { "caFile": setup.files.path("ca.pem"), "http1Only": true },
        }),
    );
    let creator = SnapshotCreator::default();
    let runtime = Runtime::new(
        RuntimeConfig::default()
            .cache_dir(None)
            .memory_creator(Arc::new(creator.clone()))
            .capability(Arc::new(broker)),
    )
    .unwrap();
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    creator.snapshots.lock().unwrap().clear();

    // The polite server compresses only when asked: the broker asked for identity, so the guest
    // gets the plain echo, redacted.
    for encoding in ["gzip", "deflate, gzip;q=1.0", "br, gzip"] {
        let answer = attack(
            &hostile,
            via.attack(serde_json::json!({"attack": "reflect", "endpoint": polite.origin(), "acceptEncoding": encoding})),
        )
        .await;
        assert!(
            answer.starts_with("HTTP 200 : marker-reflected"),
            "{answer}"
        );
        assert!(
            answer.contains("[redacted]") && !answer.contains(SECRET),
            "{answer}"
        );
    }
    assert!(
        polite
            .seen()
            .iter()
            .all(|seen| seen.headers["accept-encoding"] == "identity")
    );
    // The pushy server compresses anyway: refused, the guest never sees the bytes.
    let answer = attack(
        &hostile,
        via.attack(serde_json::json!({"attack": "reflect", "endpoint": pushy.origin(), "acceptEncoding": "gzip"})),
    )
    .await;
    assert!(
        answer.starts_with("transport: ErrorCode::HttpResponseContentCoding(Some(\"gzip\"))"),
        "{answer}"
    );
    assert_eq!(
        pushy.seen().len(),
        1,
        "the request was sent; its answer was refused"
    );

    let snapshots = creator.snapshots.lock().unwrap().clone();
    assert!(
        snapshots
            .iter()
            .any(|memory| contains(memory, "marker-reflected")),
        "the scan reads nothing"
    );
    let header = format!("PVEAPIToken={SECRET}");
    let needles = [
        SECRET.to_owned(),
        STANDARD.encode(SECRET).trim_end_matches('=').to_owned(),
        URL_SAFE_NO_PAD.encode(SECRET),
        STANDARD.encode(&header).trim_end_matches('=').to_owned(),
        hex::encode(SECRET),
    ];
    for (index, memory) in snapshots.iter().enumerate() {
        for needle in &needles {
            assert!(
                !contains(memory, needle),
                "memory {index} ({} bytes) holds the secret as {needle}",
                memory.len()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_hold_more_requests_in_flight_than_its_budget() {
    requests_in_flight_are_bounded(false).await;
}

/// The same without body resources: the runtime sends those requests from the call's own task,
/// by another path than wasmtime-wasi-http's (docs/performance.md).
#[tokio::test(flavor = "multi_thread")]
async fn a_guest_cannot_hold_more_bodyless_requests_in_flight_than_its_budget() {
    requests_in_flight_are_bounded(true).await;
}

async fn requests_in_flight_are_bounded(bodyless: bool) {
    let setup = Setup::new();
    let mut slow = Reply::ok("late");
    slow.headers_delay = Duration::from_millis(300);
    let server = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(move |_| slow.clone()),
    )
    .await;
    let limits = Limits::default()
        .max_concurrent_instances(8)
        .requests_in_flight(4);
    let runtime = setup.runtime(
        "hostile",
        setup.grant(&server.origin()),
        RuntimeConfig::default().limits(limits),
    );
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();

    let flood = Request::Get {
        config:
            serde_json::json!({"attack": "requests", "endpoint": server.origin(), "count": 100, "bodyless": bodyless})
                .to_string(),
        provider_id: "hostile/1".into(),
    };
    let error = hostile
        .call(flood, &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::RequestsInFlight,
                limit: 4,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        server.seen().len() <= 4,
        "{} requests reached the server",
        server.seen().len()
    );

    // Within the budget the same guest is answered.
    let within = serde_json::json!({"attack": "requests", "endpoint": server.origin(), "count": 4, "bodyless": bodyless});
    assert_eq!(attack(&hostile, within).await, "sent 4");
}

/// A provider streaming an endless request body to a granted origin is stopped at the call's
/// budget of bytes sent, with the budget named: no hypervisor API absorbs gigabytes from one call.
#[tokio::test(flavor = "multi_thread")]
async fn an_endless_upload_is_stopped_at_the_bytes_sent_budget() {
    endless_upload_is_stopped(Via::WasiHttp).await
}

/// One whole body after another through the exchange: the same budget counts them all.
#[tokio::test(flavor = "multi_thread")]
async fn an_endless_upload_through_the_exchange_is_stopped_at_the_bytes_sent_budget() {
    endless_upload_is_stopped(Via::Exchange).await
}

async fn endless_upload_is_stopped(via: Via) {
    let setup = Setup::new();
    let server = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(|_| Reply::ok("stored")),
    )
    .await;
    let runtime = setup.runtime(
        "hostile",
        setup.grant(&server.origin()),
        RuntimeConfig::default().limits(Limits::default().http_bytes_sent(1 << 20)),
    );
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    let upload = via.attack(serde_json::json!({"attack": "upload", "endpoint": server.origin()}));
    let error = stopped(&hostile, upload).await;
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::HttpBytesSent,
                limit: 1_048_576,
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("more than 1048576 bytes of HTTP request bodies"),
        "{message}"
    );
    let uploaded: usize = server.seen().iter().map(|seen| seen.body.len()).sum();
    assert!(uploaded <= 1 << 20, "{uploaded} bytes reached the origin");
}

/// Response bodies count against the call's budget of bytes received.
#[tokio::test(flavor = "multi_thread")]
async fn response_bodies_past_the_bytes_received_budget_stop_the_call() {
    bytes_received_are_budgeted(Via::WasiHttp).await
}

#[tokio::test(flavor = "multi_thread")]
async fn whole_responses_past_the_bytes_received_budget_stop_the_call() {
    bytes_received_are_budgeted(Via::Exchange).await
}

async fn bytes_received_are_budgeted(via: Via) {
    let setup = Setup::new();
    let server = serving_4_mib_answers(&setup).await;
    let download =
        via.attack(serde_json::json!({"attack": "download", "endpoint": server.origin()}));
    let with_budget = |bytes: u64| {
        setup.runtime(
            "hostile",
            setup.grant(&server.origin()),
            RuntimeConfig::default().limits(Limits::default().http_bytes_received(bytes)),
        )
    };

    let runtime = with_budget(1 << 20);
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    let error = stopped(&hostile, download.clone()).await;
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::HttpBytesReceived,
                limit: 1_048_576,
                ..
            }
        ),
        "{error:?}"
    );

    // Within the budget the whole body arrives.
    let runtime = with_budget(8 << 20);
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    assert_eq!(
        attack(&hostile, download).await,
        "downloaded 4194304; closed"
    );
}

/// A server answering every request with 4 MiB of body.
pub async fn serving_4_mib_answers(setup: &Setup) -> Server {
    let big = vec![b'd'; 4 << 20];
    Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(move |_| {
            let mut reply = Reply::ok("");
            reply.whole = Some(big.clone());
            reply
        }),
    )
    .await
}
