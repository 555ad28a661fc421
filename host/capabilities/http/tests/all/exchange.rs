//! The broker's promises on `egress:http-broker/exchange`, the whole-exchange path: the `hostile`
//! component's attacks sent whole (`"via": "exchange"`) through the real runtime and broker, over
//! real TLS. (`hostile.rs` runs the compressed echo and the endless upload over both paths.)

use std::sync::Arc;

use egress_runtime::{Budget, CallError, Limits, Runtime, RuntimeConfig};

use crate::hostile::{SECRET, Setup, Via, attack, component, serving_4_mib_answers, stopped};
use crate::memory::{SnapshotCreator, contains};
use crate::reflection::encoded_echoes;
use crate::support::*;

fn exchange(attack: serde_json::Value) -> serde_json::Value {
    Via::Exchange.attack(attack)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reflected_credential_reaches_the_guest_redacted_in_headers_and_body() {
    let setup = Setup::new();
    let server = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(|seen| {
            let authorization = seen.headers["authorization"].to_str().unwrap().to_owned();
            let mut reply = Reply::ok(&encoded_echoes(&authorization).join("\n"));
            reply.headers.push(("x-echo".into(), authorization));
            // A header only the host may hold, as on `wasi:http`: never handed to the guest.
            reply
                .headers
                .push(("cookie".into(), "session=marker-cookie".into()));
            reply
        }),
    )
    .await;
    let creator = SnapshotCreator::default();
    let runtime = Runtime::new(
        RuntimeConfig::default()
            .cache_dir(None)
            .memory_creator(Arc::new(creator.clone()))
            .capability(Arc::new(broker("hostile", setup.grant(&server.origin())))),
    )
    .unwrap();
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    creator.snapshots.lock().unwrap().clear();

    let answer = attack(
        &hostile,
        exchange(serde_json::json!({"attack": "reflect", "endpoint": server.origin(), "showHeaders": true})),
    )
    .await;
    let body = answer
        .strip_prefix("HTTP 200 : ")
        .unwrap_or_else(|| panic!("{answer}"));
    let unredacted = encoded_echoes(&format!("PVEAPIToken={SECRET}"));
    // One form per line, then a line per header; the host escapes the newlines of a provider's
    // message.
    let mut forms: Vec<&str> = body.split("\\n").collect();
    let headers = forms.split_off(unredacted.len().min(forms.len()));
    let echo = headers.iter().find(|line| line.starts_with("x-echo: "));
    assert!(
        echo.is_some_and(|echo| echo.contains("[redacted]") && !echo.contains(SECRET)),
        "{headers:?}"
    );
    assert!(
        !headers.iter().any(|line| line.starts_with("cookie")),
        "{headers:?}"
    );
    assert_eq!(forms.len(), unredacted.len(), "{body}");
    for (form, original) in forms.iter().zip(&unredacted) {
        assert!(
            form.contains("[redacted]") && form.len() < original.len() / 2 + 16,
            "not redacted: {form} (was {original})"
        );
    }
    // Headers as well: nothing of the secret in any memory the guest had, in any form.
    let snapshots = creator.snapshots.lock().unwrap().clone();
    assert!(
        snapshots
            .iter()
            .any(|memory| contains(memory, "[redacted]")),
        "the scan reads nothing"
    );
    for memory in &snapshots {
        for needle in [SECRET.to_owned(), hex::encode(SECRET)] {
            assert!(!contains(memory, &needle), "guest memory holds {needle}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_grant_forbids_is_refused_before_any_connection() {
    let setup = Setup::new();
    let (server, runtime) = granted_server(&setup, Limits::default()).await;
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    let cases = [
        (
            serde_json::json!({"method": "TRACE"}),
            "transport: ErrorCode::HttpRequestDenied (refused: Refusal::Denied)",
        ),
        (
            serde_json::json!({"method": "CONNECT"}),
            "transport: ErrorCode::HttpRequestDenied (refused: Refusal::Denied)",
        ),
        (
            serde_json::json!({"range": "bytes=0-9"}),
            "transport: ErrorCode::HttpRequestDenied (refused: Refusal::Denied)",
        ),
        (
            serde_json::json!({"headers": [["Authorization", "PVEAPIToken=mine"]]}),
            "header forbidden: Authorization",
        ),
        (
            serde_json::json!({"headers": [["cookie", "a=b"]]}),
            "header forbidden: cookie",
        ),
        (
            serde_json::json!({"headers": [["host", "elsewhere.example"]]}),
            "header forbidden: host",
        ),
        (
            serde_json::json!({"headers": [["content-length", "99"]]}),
            "header forbidden: content-length",
        ),
        (
            serde_json::json!({"headers": [["x-bad\n", "v"]]}),
            // (The host escapes the newline of the provider's message.)
            "header invalid: x-bad\\n",
        ),
    ];
    for (extra, expected) in cases {
        let mut config = serde_json::json!({"attack": "reflect", "endpoint": server.origin()});
        for (key, value) in extra.as_object().unwrap() {
            config[key] = value.clone();
        }
        assert_eq!(attack(&hostile, exchange(config)).await, expected);
    }
    assert!(server.seen().is_empty(), "nothing reached the origin");

    // Outside the grant's origins, and for an identity without a grant.
    let elsewhere = serde_json::json!({"attack": "reflect", "endpoint": "https://127.0.0.1:1"});
    assert_eq!(
        attack(&hostile, exchange(elsewhere)).await,
        "transport: ErrorCode::HttpRequestDenied (refused: Refusal::Denied)"
    );
    let ungranted = setup.runtime(
        "someone-else",
        setup.grant(&server.origin()),
        RuntimeConfig::default(),
    );
    let hostile = ungranted.load_file(&component("hostile")).await.unwrap();
    let reflect = serde_json::json!({"attack": "reflect", "endpoint": server.origin()});
    assert_eq!(
        attack(&hostile, exchange(reflect)).await,
        "transport: ErrorCode::HttpRequestDenied (refused: Refusal::NotGranted)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn whole_responses_count_against_the_bytes_received_budget_and_the_transfer_bound() {
    let setup = Setup::new();
    let server = serving_4_mib_answers(&setup).await;
    let with = |limits: Limits| {
        setup.runtime(
            "hostile",
            setup.grant(&server.origin()),
            RuntimeConfig::default().limits(limits),
        )
    };
    let download = |times: u64| {
        exchange(
            serde_json::json!({"attack": "download", "endpoint": server.origin(), "times": times}),
        )
    };

    // Three whole 4 MiB answers against a budget of 10 MiB: the third stops the call.
    let runtime = with(Limits::default().http_bytes_received(10 << 20));
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    let error = stopped(&hostile, download(3)).await;
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::HttpBytesReceived,
                limit: 10_485_760,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        attack(&hostile, download(2)).await,
        "downloaded 8388608; closed"
    );

    // The host holds at most the call's transfer budget of one answer, whatever the guest asks.
    let runtime = with(Limits::default().transfer_bytes(2 << 20));
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    assert_eq!(
        attack(&hostile, download(1)).await,
        "downloaded 0; transport: ErrorCode::HttpResponseBodySize(Some(2097152))"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_header_list_past_its_budget_stops_the_call_as_on_wasi_http() {
    let setup = Setup::new();
    let (server, runtime) = granted_server(&setup, Limits::default()).await;
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    let fill = "v".repeat(40 << 10);
    let fill = exchange(serde_json::json!({
        "attack": "reflect", "endpoint": server.origin(), "headers": [["x-fill", fill]],
    }));
    let error = stopped(&hostile, fill).await;
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::HeaderBytes,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(server.seen().is_empty());
}

/// A whole request body is arguments of one call into the host: past the call's transfer budget
/// it is refused before the host copies it out of the guest, and nothing reaches the origin.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_past_the_transfer_budget_is_never_copied_out_of_the_guest() {
    let setup = Setup::new();
    let (server, runtime) = granted_server(&setup, Limits::default().transfer_bytes(1 << 20)).await;
    let hostile = runtime.load_file(&component("hostile")).await.unwrap();
    let upload = exchange(serde_json::json!({
        "attack": "upload", "endpoint": server.origin(), "bodyKib": 4 << 10,
    }));
    let error = stopped(&hostile, upload).await;
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::TransferBytes,
                limit: 1_048_576,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(server.seen().is_empty(), "nothing reached the origin");
}

/// A server that answers `reached`, and a runtime with `limits` granting the hostile component
/// its origin.
async fn granted_server(setup: &Setup, limits: Limits) -> (Server, Runtime) {
    let server = Server::start(
        &setup.ca,
        &["127.0.0.1"],
        Protocol::Http1,
        handler(|_| Reply::ok("reached")),
    )
    .await;
    let runtime = setup.runtime(
        "hostile",
        setup.grant(&server.origin()),
        RuntimeConfig::default().limits(limits),
    );
    (server, runtime)
}
