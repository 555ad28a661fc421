//! `Broker::send` called directly, against real TLS servers on 127.0.0.1.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use egress_capability_http::{CA_UNAVAILABLE, CREDENTIALS_UNAVAILABLE};
use egress_runtime::egress::{Egress, EgressError};
use http::{HeaderName, Version};

use crate::support::*;

const SECRET: &str = "root@pam!operator=6f1c2d3e-4b5a-4c7d-9e8f-0a1b2c3d4e5f";

struct Setup {
    files: Files,
    server: Server,
}

impl Setup {
    async fn new(handler: Handler) -> Self {
        Self::with(&["127.0.0.1"], Protocol::Http1, handler).await
    }

    async fn with(names: &[&str], protocol: Protocol, handler: Handler) -> Self {
        let ca = Ca::new("egress test CA");
        let files = Files::new();
        files.write("token", &format!("{SECRET}\n"));
        files.write("ca.pem", &ca.pem());
        let server = Server::start(&ca, names, protocol, handler).await;
        Self { files, server }
    }

    fn grant(&self) -> serde_json::Value {
        proxmox_grant(
            &self.server.origin(),
            &self.files.path("token"),
            &self.files.path("ca.pem"),
        )
    }

    fn broker(&self) -> egress_capability_http::Broker {
        broker("proxmox", self.grant())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.origin())
    }
}

fn ok_json() -> Handler {
    handler(|_| Reply::ok(r#"{"data":{"version":"9.2.20"}}"#))
}

#[tokio::test]
async fn allowed_origin_is_reached_with_the_token_injected() {
    let setup = Setup::new(ok_json()).await;
    let received = send(
        &setup.broker(),
        "proxmox",
        get(&setup.url("/api2/json/version?x=1"), &[]),
    )
    .await
    .unwrap();
    assert_eq!(received.status, 200);
    assert_eq!(received.text(), r#"{"data":{"version":"9.2.20"}}"#);
    let seen = setup.server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path_and_query, "/api2/json/version?x=1");
    assert_eq!(
        seen[0].headers["authorization"],
        format!("PVEAPIToken={SECRET}").as_str()
    );
    assert_eq!(seen[0].version, Version::HTTP_11);
}

#[tokio::test]
async fn other_host_port_scheme_and_provider_are_denied_without_a_connection() {
    let setup = Setup::new(ok_json()).await;
    let broker = setup.broker();
    let port = setup.server.addr.port();
    for url in [
        format!("https://localhost:{port}/"),
        format!("https://127.0.0.1:{}/", port.wrapping_add(1)),
        format!("http://127.0.0.1:{port}/"),
        "https://127.0.0.1/".to_string(),
        format!("https://user@127.0.0.1:{port}/"),
    ] {
        let result = send(&broker, "proxmox", get(&url, &[])).await;
        assert!(
            matches!(result, Err(EgressError::HttpRequestDenied)),
            "{url}: {result:?}"
        );
    }
    let result = send(&broker, "libvirt", get(&setup.url("/"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::HttpRequestDenied)),
        "{result:?}"
    );
    assert!(setup.server.seen().is_empty());
    assert_eq!(broker.metrics().count("proxmox", "-", "denied"), 5);
}

#[tokio::test]
async fn host_header_naming_another_authority_is_denied() {
    let setup = Setup::new(ok_json()).await;
    let broker = setup.broker();
    let mut request = get(&setup.url("/"), &[]);
    request
        .headers_mut()
        .insert(http::header::HOST, "pve.evil.example".parse().unwrap());
    let result = send(&broker, "proxmox", request).await;
    assert!(
        matches!(result, Err(EgressError::HttpRequestDenied)),
        "{result:?}"
    );
    assert!(setup.server.seen().is_empty());
}

#[tokio::test]
async fn guest_credential_headers_are_forbidden_and_refused_in_send() {
    let setup = Setup::new(ok_json()).await;
    let broker = setup.broker();
    for name in ["authorization", "proxy-authorization", "cookie"] {
        assert!(
            broker.is_forbidden_header(&HeaderName::from_static(name)),
            "{name}"
        );
        let result = send(
            &broker,
            "proxmox",
            get(&setup.url("/"), &[(name, "PVEAPIToken=guest")]),
        )
        .await;
        assert!(
            matches!(result, Err(EgressError::HttpRequestDenied)),
            "{name}: {result:?}"
        );
    }
    assert!(!broker.is_forbidden_header(&HeaderName::from_static("accept")));
    assert!(setup.server.seen().is_empty());
}

#[tokio::test]
async fn a_custom_credential_header_is_forbidden_to_guests_too() {
    let setup = Setup::new(ok_json()).await;
    let mut grant = setup.grant();
    grant["credential"]["header"] = "X-Api-Key".into();
    grant["credential"]["format"] = "{secret}".into();
    let broker = broker("proxmox", grant);
    assert!(broker.is_forbidden_header(&HeaderName::from_static("x-api-key")));
    let result = send(
        &broker,
        "proxmox",
        get(&setup.url("/"), &[("x-api-key", "guess")]),
    )
    .await;
    assert!(
        matches!(result, Err(EgressError::HttpRequestDenied)),
        "{result:?}"
    );
    send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
    assert_eq!(setup.server.seen()[0].headers["x-api-key"], SECRET);
}

#[tokio::test]
async fn secret_file_is_reread_on_every_request_entry_14() {
    let setup = Setup::new(ok_json()).await;
    let broker = setup.broker();
    send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
    setup.files.write("token", "rotated-token-value\n");
    send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
    let seen = setup.server.seen();
    assert_eq!(
        seen[0].headers["authorization"],
        format!("PVEAPIToken={SECRET}").as_str()
    );
    assert_eq!(
        seen[1].headers["authorization"],
        "PVEAPIToken=rotated-token-value"
    );
}

#[tokio::test]
async fn unreadable_secret_is_credentials_unavailable_and_never_sent() {
    let setup = Setup::new(ok_json()).await;
    std::fs::remove_file(setup.files.path("token")).unwrap();
    let result = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[])).await;
    match result {
        Err(EgressError::InternalError(Some(detail))) => {
            assert_eq!(detail, CREDENTIALS_UNAVAILABLE)
        }
        other => panic!("{other:?}"),
    }
    assert!(setup.server.seen().is_empty());
}

fn echo_handler(chunk_size: usize) -> Handler {
    handler(move |seen| {
        let authorization = seen.headers["authorization"].to_str().unwrap().to_owned();
        let secret = authorization.trim_start_matches("PVEAPIToken=").to_owned();
        let body = format!(
            r#"{{"message":"bad header {authorization}","b64":"{}","raw":"{secret}"}}"#,
            STANDARD.encode(&secret)
        );
        let mut reply = Reply::chunked(
            body.as_bytes()
                .chunks(chunk_size)
                .map(<[u8]>::to_vec)
                .collect(),
        );
        reply.status = 401;
        reply.headers.push(("x-echo".into(), authorization));
        reply.headers.push((
            "www-authenticate".into(),
            format!("PVEAPIToken realm={}", STANDARD.encode(&secret)),
        ));
        reply
    })
}

fn assert_no_secret(received: &Received) {
    let encoded = STANDARD.encode(SECRET);
    for (name, value) in &received.headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(
            !value.contains(SECRET) && !value.contains(encoded.trim_end_matches('=')),
            "{name}: {value}"
        );
    }
    let body = received.text();
    assert!(
        !body.contains(SECRET) && !body.contains(encoded.trim_end_matches('=')),
        "{body}"
    );
}

#[tokio::test]
async fn a_rotated_secret_is_redacted_too_entry_14() {
    let setup = Setup::new(echo_handler(64)).await;
    let broker = setup.broker();
    let first = send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
    assert_no_secret(&first);
    // The redactor is built once per secret: a rotated one needs its own.
    let rotated = "root@pam!operator=0a0b0c0d-1111-2222-3333-444455556666";
    setup.files.write("token", rotated);
    let second = send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
    assert_eq!(
        second.text(),
        r#"{"message":"bad header [redacted]","b64":"[redacted]","raw":"[redacted]"}"#
    );
    assert_eq!(second.headers["x-echo"], "[redacted]");
}

#[tokio::test]
async fn echoed_secret_is_redacted_from_headers_and_body_phase_4() {
    for chunk_size in [7, 64, 4096] {
        let setup = Setup::new(echo_handler(chunk_size)).await;
        let received = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[]))
            .await
            .unwrap();
        assert_eq!(received.status, 401);
        assert_no_secret(&received);
        assert_eq!(received.headers["x-echo"], "[redacted]");
        assert_eq!(
            received.text(),
            r#"{"message":"bad header [redacted]","b64":"[redacted]","raw":"[redacted]"}"#,
            "chunk size {chunk_size}"
        );
    }
}

#[tokio::test]
async fn certificate_from_another_ca_is_a_certificate_error() {
    let setup = Setup::new(ok_json()).await;
    setup.files.write("ca.pem", &Ca::new("unrelated CA").pem());
    let result = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::TlsCertificateError)),
        "{result:?}"
    );
    assert!(setup.server.seen().is_empty());
}

#[tokio::test]
async fn a_changed_ca_file_is_used_from_the_next_request_entry_14() {
    let setup = Setup::new(ok_json()).await;
    let good = std::fs::read_to_string(setup.files.path("ca.pem")).unwrap();
    let broker = setup.broker();
    send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
    // Another CA: the pooled connection trusting the old one must not be reused.
    setup.files.write("ca.pem", &Ca::new("unrelated CA").pem());
    let result = send(&broker, "proxmox", get(&setup.url("/"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::TlsCertificateError)),
        "{result:?}"
    );
    setup.files.write("ca.pem", &good);
    send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
}

#[tokio::test]
async fn certificate_for_another_name_fails_unless_server_name_says_it_phase_0() {
    let setup = Setup::with(&["pv1-1.home.lab"], Protocol::Http1, ok_json()).await;
    let result = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::TlsCertificateError)),
        "{result:?}"
    );

    let mut grant = setup.grant();
    grant["tls"]["serverName"] = "pv1-1.home.lab".into();
    let received = send(
        &broker("proxmox", grant),
        "proxmox",
        get(&setup.url("/x"), &[]),
    )
    .await
    .unwrap();
    assert_eq!(received.status, 200);
    let seen = setup.server.seen();
    assert_eq!(
        seen.len(),
        1,
        "connected to the origin's address while verifying the server name"
    );
    assert_eq!(seen[0].path_and_query, "/x");
}

#[tokio::test]
async fn server_name_never_redirects_the_connection_to_another_host() {
    // The name resolves nowhere: the broker must connect to the origin's IP regardless.
    let setup = Setup::with(&["pve.invalid"], Protocol::Http1, ok_json()).await;
    let mut grant = setup.grant();
    grant["tls"]["serverName"] = "pve.invalid".into();
    send(
        &broker("proxmox", grant),
        "proxmox",
        get(&setup.url("/"), &[]),
    )
    .await
    .unwrap();
    assert_eq!(setup.server.seen().len(), 1);
}

#[tokio::test]
async fn http1_only_grant_fails_against_an_h2_only_server_f18() {
    let setup = Setup::with(&["127.0.0.1"], Protocol::H2Only, ok_json()).await;
    let result = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[])).await;
    assert!(
        result.is_err(),
        "an HTTP/1.1-only grant must not speak to an h2-only server: {result:?}"
    );
    assert!(setup.server.seen().is_empty());

    // The same server is reachable when the grant allows HTTP/2, so the failure above is the pin.
    let mut grant = setup.grant();
    grant["tls"]["http1Only"] = false.into();
    send(
        &broker("proxmox", grant),
        "proxmox",
        get(&setup.url("/"), &[]),
    )
    .await
    .unwrap();
    assert_eq!(setup.server.seen()[0].version, Version::HTTP_2);
}

#[tokio::test]
async fn missing_ca_file_is_transient_and_loaded_once_it_appears_entry_14() {
    let setup = Setup::new(ok_json()).await;
    let pem = std::fs::read_to_string(setup.files.path("ca.pem")).unwrap();
    std::fs::remove_file(setup.files.path("ca.pem")).unwrap();
    let broker = setup.broker();
    let result = send(&broker, "proxmox", get(&setup.url("/"), &[])).await;
    match result {
        Err(EgressError::InternalError(Some(detail))) => assert_eq!(detail, CA_UNAVAILABLE),
        other => panic!("{other:?}"),
    }
    setup.files.write("ca.pem", &pem);
    send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
    // Cached once loaded: a later broken file does not matter to this broker.
    setup.files.write("ca.pem", "garbage");
    send(&broker, "proxmox", get(&setup.url("/"), &[]))
        .await
        .unwrap();
}

#[tokio::test]
async fn ca_file_without_a_certificate_is_a_certificate_error_entry_14() {
    let setup = Setup::new(ok_json()).await;
    setup.files.write("ca.pem", "# not a certificate\n");
    let result = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::TlsCertificateError)),
        "{result:?}"
    );
}

#[tokio::test]
async fn slow_headers_hit_the_first_byte_timeout() {
    let setup = Setup::new(handler(|_| Reply {
        headers_delay: Duration::from_secs(5),
        ..Reply::ok("{}")
    }))
    .await;
    let mut grant = setup.grant();
    grant["timeouts"]["firstByteMs"] = 200.into();
    let result = send(
        &broker("proxmox", grant),
        "proxmox",
        get(&setup.url("/"), &[]),
    )
    .await;
    assert!(
        matches!(result, Err(EgressError::HttpResponseTimeout)),
        "{result:?}"
    );
}

#[tokio::test]
async fn slow_body_hits_the_total_timeout() {
    let setup = Setup::new(handler(|_| Reply {
        chunk_delay: Duration::from_millis(400),
        ..Reply::chunked(vec![b"{".to_vec(), b"}".to_vec(), b" ".to_vec()])
    }))
    .await;
    let mut grant = setup.grant();
    grant["timeouts"]["totalMs"] = 500.into();
    let result = send(
        &broker("proxmox", grant),
        "proxmox",
        get(&setup.url("/"), &[]),
    )
    .await;
    assert!(
        matches!(result, Err(EgressError::HttpResponseTimeout)),
        "{result:?}"
    );
}

/// A body that stops arriving is ended by the deadline alone: no later chunk comes to notice it.
#[tokio::test]
async fn stalled_body_hits_the_total_timeout() {
    let setup = Setup::new(handler(|_| Reply {
        chunk_delay: Duration::from_secs(3600),
        ..Reply::chunked(vec![b"{".to_vec(), b"}".to_vec()])
    }))
    .await;
    let mut grant = setup.grant();
    grant["timeouts"]["totalMs"] = 300.into();
    let broker = broker("proxmox", grant);
    // The bound is looked at first: a `timeout` would poll the request once more when it fires,
    // and that poll would find the deadline past without the broker's own timer. It is well
    // short of the 30 s after which something else on the connection wakes the body.
    let result = tokio::select! {
        biased;
        () = tokio::time::sleep(Duration::from_secs(10)) => {
            panic!("the broker did not end a stalled body at its deadline")
        }
        result = send(&broker, "proxmox", get(&setup.url("/"), &[])) => result,
    };
    assert!(
        matches!(result, Err(EgressError::HttpResponseTimeout)),
        "{result:?}"
    );
}

#[tokio::test]
async fn response_over_the_cap_is_a_body_size_error() {
    let big = "x".repeat(2048);
    let setup = Setup::new(handler(move |seen| {
        if seen.path_and_query == "/length" {
            Reply::ok(&big)
        } else {
            Reply::chunked(vec![big.as_bytes().to_vec(); 2])
        }
    }))
    .await;
    let mut grant = setup.grant();
    grant["maxResponseBytes"] = 1000.into();
    let broker = broker("proxmox", grant);
    // An announced length over the cap fails before the guest gets a response at all.
    let announced = broker
        .send(&site("proxmox"), get(&setup.url("/length"), &[]), None)
        .await;
    assert!(
        matches!(
            announced,
            Err(EgressError::HttpResponseBodySize(Some(2048)))
        ),
        "{:?}",
        announced.err()
    );
    // A streamed body fails when it crosses the cap.
    let result = send(&broker, "proxmox", get(&setup.url("/chunked"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::HttpResponseBodySize(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn redirects_are_handed_back_not_followed() {
    let setup = Setup::new(handler(|seen| {
        if seen.path_and_query == "/moved" {
            Reply {
                status: 302,
                headers: vec![("location".into(), "/elsewhere".into())],
                ..Reply::ok("")
            }
        } else {
            Reply::ok("followed")
        }
    }))
    .await;
    let received = send(&setup.broker(), "proxmox", get(&setup.url("/moved"), &[]))
        .await
        .unwrap();
    assert_eq!(received.status, 302);
    assert_eq!(setup.server.seen().len(), 1);
}

#[tokio::test]
async fn refused_connection_and_unresolvable_host_are_told_apart() {
    let files = Files::new();
    files.write("token", SECRET);
    files.write("ca.pem", &Ca::new("ca").pem());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("https://127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let refused = broker(
        "proxmox",
        proxmox_grant(&origin, &files.path("token"), &files.path("ca.pem")),
    );
    let result = send(&refused, "proxmox", get(&format!("{origin}/"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::ConnectionRefused)),
        "{result:?}"
    );

    let nowhere = "https://pve.does-not-exist.invalid:8006";
    let unresolved = broker(
        "proxmox",
        proxmox_grant(nowhere, &files.path("token"), &files.path("ca.pem")),
    );
    let result = send(&unresolved, "proxmox", get(&format!("{nowhere}/"), &[])).await;
    assert!(
        matches!(result, Err(EgressError::DnsError { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn invalid_grants_are_refused_with_a_reason() {
    let files = Files::new();
    let token = files.path("token");
    let ca = files.path("ca.pem");
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (serde_json::json!({"origins": []}), "origins: is empty"),
        (
            serde_json::json!({"origins": ["https://h:1/api"]}),
            "no path",
        ),
        (
            serde_json::json!({"origins": ["https://h:1"]}),
            "tls.caFile",
        ),
        (proxmox_grant("http://h:1", &token, &ca), "plain http"),
        (
            {
                let mut grant = proxmox_grant("https://h:1", &token, &ca);
                grant["credential"]["format"] = "PVEAPIToken=".into();
                grant
            },
            "exactly once",
        ),
        (
            {
                let mut grant = proxmox_grant("https://h:1", &token, &ca);
                grant["credential"]["secretRef"] = serde_json::json!({"name": "t", "key": "k"});
                grant
            },
            "exactly one of secretRef and secretFile",
        ),
        (
            {
                let mut grant = proxmox_grant("https://h:1", &token, &ca);
                grant["tls"]["caConfigMapRef"] = serde_json::json!({"name": "ca", "key": "ca.pem"});
                grant
            },
            "at most one of caSecretRef, caConfigMapRef and caFile",
        ),
        (
            {
                let mut grant = proxmox_grant("https://h:1", &token, &ca);
                grant["tls"]["serverName"] = "10.0.0.1".into();
                grant
            },
            "not a DNS name",
        ),
    ];
    for (grant, expected) in cases {
        let error = try_broker("p", grant).unwrap_err().to_string();
        assert!(
            error.contains(expected),
            "{error} should mention {expected}"
        );
    }
}

/// Every log line of this test binary from the first call on, at trace level for the HTTP stack.
/// Global, because a thread-local subscriber races with other tests over `tracing`'s callsite
/// interest cache.
fn captured_logs() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOGS: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static std::sync::Mutex<Vec<u8>> = Box::leak(Box::default());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("egress_capability_http=trace,reqwest=trace,hyper=trace,hyper_util=trace,rustls=trace,h2=trace")
            .with_ansi(false)
            .with_writer(move || Captured(logs))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    })
}

struct Captured(&'static std::sync::Mutex<Vec<u8>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn logs_never_carry_the_secret_even_at_trace_level() {
    let logs = captured_logs();
    let setup = Setup::new(echo_handler(16)).await;
    let first = setup.broker();
    send(
        &first,
        "proxmox",
        get(&setup.url("/api2/json/version?secret-looking=1"), &[]),
    )
    .await
    .unwrap();
    let _ = send(
        &first,
        "proxmox",
        get(&setup.url("/"), &[("authorization", SECRET)]),
    )
    .await;
    let _ = send(&first, "proxmox", get("https://elsewhere.example/", &[])).await;
    setup.files.write("ca.pem", "garbage");
    let _ = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[])).await;

    let logs = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        logs.contains("outgoing HTTP") && logs.contains("/api2/json/version"),
        "the request was logged: {logs}"
    );
    assert!(!logs.contains("secret-looking"), "the query is not logged");
    assert!(
        !logs.contains(SECRET) && !logs.contains(&STANDARD.encode(SECRET)[..20]),
        "{logs}"
    );
}

/// A guest hands several requests over and waits on one of them; the others are not polled
/// again until it asks. The CA load one of them started must not hold the rest up: it ran
/// inside the first request's future, holding the grant's load lock, and the second request
/// waited on that lock until the call's deadline (seen as `hostile::…bodyless…` ending in
/// `Deadline` instead of `Budget` under load).
#[tokio::test]
async fn a_request_never_polled_again_does_not_hold_up_the_others_of_its_grant() {
    let setup = Setup::new(ok_json()).await;
    let mut grant = setup.grant();
    // Without a credential to read first, the first poll goes straight to the CA load.
    grant.as_object_mut().unwrap().remove("credential");
    let broker = broker("proxmox", grant);
    let mut abandoned = broker.send(&site("proxmox"), get(&setup.url("/one"), &[]), None);
    let _ = abandoned
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    let second = tokio::time::timeout(
        Duration::from_secs(20),
        send(&broker, "proxmox", get(&setup.url("/two"), &[])),
    )
    .await
    .expect("the second request waited on a load the first one holds");
    assert_eq!(second.unwrap().status, 200);
    drop(abandoned);
}

#[tokio::test]
async fn a_refused_certificate_is_named_in_the_log_by_its_fault() {
    let logs = captured_logs();
    let unknown = Setup::new(ok_json()).await;
    unknown
        .files
        .write("ca.pem", &Ca::new("unrelated CA").pem());
    let mismatch = Setup::with(&["pv1-1.home.lab"], Protocol::Http1, ok_json()).await;
    let expired = {
        let ca = Ca::new("egress test CA");
        let files = Files::new();
        files.write("token", &format!("{SECRET}\n"));
        files.write("ca.pem", &ca.pem());
        let (chain, key) = ca.expired_leaf(&["127.0.0.1"]);
        let server = Server::presenting(chain, key, Protocol::Http1, ok_json()).await;
        Setup { files, server }
    };
    for setup in [&unknown, &mismatch, &expired] {
        let result = send(&setup.broker(), "proxmox", get(&setup.url("/"), &[])).await;
        assert!(
            matches!(result, Err(EgressError::TlsCertificateError)),
            "{result:?}"
        );
    }
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let failure = |setup: &Setup| {
        let origin = setup.server.origin();
        text.lines()
            .find(|line| line.contains("outgoing HTTP failed") && line.contains(&origin))
            .unwrap_or_else(|| panic!("no failure logged for {origin}"))
            .to_owned()
    };
    for (setup, fault) in [
        (&unknown, "unknown CA"),
        (&mismatch, "name mismatch"),
        (&expired, "expired"),
    ] {
        let line = failure(setup);
        assert!(line.contains(&format!("refused ({fault})")), "{line}");
        assert!(!line.contains(SECRET), "{line}");
    }
}
