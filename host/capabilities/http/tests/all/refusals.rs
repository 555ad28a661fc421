//! Why the broker refused, as the guest learns it: the `contract-v2` component (contract 0.2.0)
//! asks `egress:http-broker/broker.last-refusal` after a failed request and answers its `check`
//! from the typed refusal, not from the `internal-error` string (which it still gets, and
//! prints).

use std::path::PathBuf;
use std::sync::Arc;

use egress_runtime::types::{CheckReason, CheckResult, Response};
use egress_runtime::{CallContext, Request, Runtime, RuntimeConfig};

use crate::support::*;

const IDENTITY: &str = "contract-v2";

fn component() -> PathBuf {
    testkit::component(IDENTITY)
}

/// `check` of contract-v2 against `origin`, with `grant` given to its identity.
async fn check(grant: Option<serde_json::Value>, origin: &str) -> CheckResult {
    let broker = match grant {
        Some(grant) => broker(IDENTITY, grant),
        None => egress_capability_http::Broker::new(),
    };
    let runtime = Runtime::new(
        RuntimeConfig::default()
            .cache_dir(None)
            .capability(Arc::new(broker)),
    )
    .unwrap();
    let provider = runtime.load_file(&component()).await.unwrap();
    let request = Request::Check {
        config: serde_json::json!({ "endpoint": origin }).to_string(),
    };
    match provider.call(request, &CallContext::default()).await {
        Ok(Response::Check(result)) => result,
        other => panic!("check answers: {other:?}"),
    }
}

async fn server(ca: &Ca) -> Server {
    Server::start(
        ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(|_| Reply::ok("{}")),
    )
    .await
}

#[tokio::test]
async fn an_unreadable_secret_reaches_the_guest_as_credentials_unavailable() {
    let ca = Ca::new("refusals CA");
    let files = Files::new();
    files.write("ca.pem", &ca.pem());
    let server = server(&ca).await;
    // The secret file is never written.
    let grant = proxmox_grant(
        &server.origin(),
        &files.path("missing-token"),
        &files.path("ca.pem"),
    );
    let result = check(Some(grant), &server.origin()).await;
    assert_eq!(
        result.reason,
        CheckReason::CredentialsUnavailable,
        "{result:?}"
    );
    // The typed refusal, and the wasi:http code kept beside it (as the guest's Debug prints it).
    assert!(
        result
            .message
            .starts_with("refusal: credentials-unavailable; error code: ")
            && result
                .message
                .ends_with(r#"InternalError(Some("credentials-unavailable"))"#),
        "{}",
        result.message
    );
    assert!(server.seen().is_empty(), "nothing left the host");
}

#[tokio::test]
async fn each_refusal_is_named_and_a_success_clears_it() {
    let ca = Ca::new("refusals CA");
    let files = Files::new();
    files.write("token", "pve-token-refusals");
    files.write("ca.pem", &ca.pem());
    let server = server(&ca).await;
    let grant =
        |ca_file: &str| proxmox_grant(&server.origin(), &files.path("token"), &files.path(ca_file));

    let granted = check(Some(grant("ca.pem")), &server.origin()).await;
    assert_eq!(granted.reason, CheckReason::Ok, "{granted:?}");

    let not_granted = check(None, &server.origin()).await;
    assert_eq!(not_granted.reason, CheckReason::Forbidden);
    assert!(
        not_granted.message.starts_with("refusal: not-granted;"),
        "{not_granted:?}"
    );

    let denied = check(Some(grant("ca.pem")), "https://127.0.0.1:1").await;
    assert!(denied.message.starts_with("refusal: denied;"), "{denied:?}");

    let no_ca = check(Some(grant("not-yet.pem")), &server.origin()).await;
    assert!(
        no_ca.message.starts_with("refusal: ca-unavailable;"),
        "{no_ca:?}"
    );

    files.write("empty.pem", "not a certificate\n");
    let bad_ca = check(Some(grant("empty.pem")), &server.origin()).await;
    assert_eq!(bad_ca.reason, CheckReason::CertificateInvalid, "{bad_ca:?}");
    assert!(
        bad_ca.message.starts_with("refusal: ca-invalid;"),
        "{bad_ca:?}"
    );
}
