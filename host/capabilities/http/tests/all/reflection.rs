//! A granted origin that reflects what it receives must not become a way to read the injected
//! credential back: no compressed or partial echo, no reflecting method, every standard
//! reversible form redacted (`Broker::send` called directly, real TLS servers on 127.0.0.1).

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use egress_runtime::egress::{CallSite, Egress, EgressError};

use crate::support::*;

const SECRET: &str = "root@pam!operator=6f1c2d3e-4b5a-4c7d-9e8f-0a1b2c3d4e5f";

struct Setup {
    ca: Ca,
    files: Files,
}

impl Setup {
    fn new() -> Self {
        let ca = Ca::new("egress reflection CA");
        let files = Files::new();
        files.write("token", SECRET);
        files.write("ca.pem", &ca.pem());
        Self { ca, files }
    }

    fn broker(&self, origin: &str) -> egress_capability_http::Broker {
        broker(
            "proxmox",
            proxmox_grant(
                origin,
                &self.files.path("token"),
                &self.files.path("ca.pem"),
            ),
        )
    }

    async fn server(&self, handler: Handler) -> Server {
        Server::start(&self.ca, &["127.0.0.1"], Protocol::Http1, handler).await
    }
}

/// Answers with everything it got, gzip-compressed whenever the request allows gzip.
fn compressing_echo(always: bool) -> Handler {
    handler(move |seen| {
        let reflected = format!("{:?}", seen.headers);
        let asked = seen
            .headers
            .get("accept-encoding")
            .is_some_and(|value| value.to_str().unwrap_or("").contains("gzip"));
        if always || asked {
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
async fn a_credentialed_request_asks_for_identity_whatever_the_guest_asked() {
    let setup = Setup::new();
    let server = setup.server(compressing_echo(false)).await;
    let broker = setup.broker(&server.origin());
    let request = get(
        &format!("{}/reflect", server.origin()),
        &[("accept-encoding", "gzip, deflate, br")],
    );
    let received = send(&broker, "proxmox", request).await.unwrap();
    assert_eq!(server.seen()[0].headers["accept-encoding"], "identity");
    assert!(received.headers.get("content-encoding").is_none());
    let body = received.text();
    assert!(
        body.contains("[redacted]") && !body.contains(SECRET),
        "{body}"
    );
}

#[tokio::test]
async fn a_compressed_answer_the_broker_did_not_ask_for_is_refused() {
    let setup = Setup::new();
    let server = setup.server(compressing_echo(true)).await;
    let broker = setup.broker(&server.origin());
    let error = send(
        &broker,
        "proxmox",
        get(&format!("{}/", server.origin()), &[]),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, EgressError::HttpResponseContentCoding(Some(coding)) if coding == "gzip"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_refused() {
    let setup = Setup::new();
    let compressed = gzip(b"hello");
    let mut raw = format!(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n{:x}\r\n",
        compressed.len()
    )
    .into_bytes();
    raw.extend_from_slice(&compressed);
    raw.extend_from_slice(b"\r\n0\r\n\r\n");
    let server = RawServer::start(&setup.ca, raw).await;
    let broker = setup.broker(&server.origin());
    let error = send(
        &broker,
        "proxmox",
        get(&format!("{}/", server.origin()), &[]),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&error, EgressError::HttpResponseTransferCoding(Some(coding)) if coding == "gzip"),
        "{error:?}"
    );
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn a_partial_answer_is_refused_and_a_range_is_never_asked_for() {
    let setup = Setup::new();
    let raw = b"HTTP/1.1 206 Partial Content\r\ncontent-range: bytes 0-9/100\r\ncontent-length: 10\r\nconnection: close\r\n\r\nroot@pam!o"
        .to_vec();
    let server = RawServer::start(&setup.ca, raw).await;
    let broker = setup.broker(&server.origin());
    let error = send(
        &broker,
        "proxmox",
        get(&format!("{}/", server.origin()), &[]),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, EgressError::HttpProtocolError), "{error:?}");

    for (name, value) in [("range", "bytes=10-20"), ("if-range", "\"etag\"")] {
        let request = get(&format!("{}/", server.origin()), &[(name, value)]);
        let error = send(&broker, "proxmox", request).await.unwrap_err();
        assert!(
            matches!(error, EgressError::HttpRequestDenied),
            "{name}: {error:?}"
        );
    }
    assert_eq!(server.requests(), 1, "the ranged requests never left");
}

#[tokio::test]
async fn reflecting_and_tunnelling_methods_are_refused_before_any_connection() {
    let setup = Setup::new();
    let server = setup.server(compressing_echo(false)).await;
    let broker = setup.broker(&server.origin());
    for method in ["TRACE", "TRACK", "CONNECT", "trace"] {
        let mut request = get(&format!("{}/", server.origin()), &[]);
        *request.method_mut() = http::Method::from_bytes(method.as_bytes()).unwrap();
        let error = send(&broker, "proxmox", request).await.unwrap_err();
        assert!(
            matches!(error, EgressError::HttpRequestDenied),
            "{method}: {error:?}"
        );
    }
    assert!(server.seen().is_empty());
}

/// Every reversible form a standard server writes when it reflects a header.
pub fn encoded_echoes(authorization: &str) -> Vec<String> {
    let line = format!("Authorization: {authorization}\r\n");
    let percent: String = authorization
        .bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect();
    vec![
        STANDARD.encode(&line),
        STANDARD.encode(format!("x{line}")),
        STANDARD.encode(format!("xy{line}")),
        URL_SAFE_NO_PAD.encode(&line),
        hex::encode(authorization),
        hex::encode(authorization).to_uppercase(),
        percent.clone(),
        percent.to_lowercase(),
        authorization.replace('=', "\\u003d"),
        authorization.replace('=', "&#61;"),
    ]
}

#[tokio::test]
async fn every_standard_reversible_form_of_a_reflected_credential_is_redacted() {
    let setup = Setup::new();
    let server = setup
        .server(handler(|seen| {
            let authorization = seen.headers["authorization"].to_str().unwrap();
            // One form per line, as written (no JSON around them, which would escape them again).
            Reply::ok(&encoded_echoes(authorization).join("\n"))
        }))
        .await;
    let broker = setup.broker(&server.origin());
    let received = send(
        &broker,
        "proxmox",
        get(&format!("{}/", server.origin()), &[]),
    )
    .await
    .unwrap();
    let body = received.text();
    let forms: Vec<&str> = body.lines().collect();
    let unredacted = encoded_echoes(&format!("PVEAPIToken={SECRET}"));
    assert_eq!(forms.len(), unredacted.len());
    for (form, original) in forms.iter().zip(&unredacted) {
        assert!(
            form.contains("[redacted]"),
            "not redacted: {form} (was {original})"
        );
        assert!(
            form.len() < original.len() / 2 + 16,
            "most of {original} survived: {form}"
        );
    }
}

#[tokio::test]
async fn a_grant_pinned_to_a_digest_serves_that_component_only() {
    let setup = Setup::new();
    let server = setup.server(compressing_echo(false)).await;
    let pinned = "a".repeat(64);
    let mut grant = proxmox_grant(
        &server.origin(),
        &setup.files.path("token"),
        &setup.files.path("ca.pem"),
    );
    grant["digest"] = serde_json::json!(format!("sha256:{pinned}"));
    let broker = broker("proxmox", grant);
    let site = |digest: &str| CallSite {
        provider: Arc::from("proxmox"),
        digest: Arc::from(digest),
        operation: "get",
    };
    let url = format!("{}/", server.origin());
    let other = broker
        .send(&site(&"b".repeat(64)), get(&url, &[]), None)
        .await;
    assert!(
        matches!(other, Err(EgressError::HttpRequestDenied)),
        "{other:?}"
    );
    assert!(server.seen().is_empty());
    let same = broker.send(&site(&pinned), get(&url, &[]), None).await;
    assert!(same.is_ok(), "{same:?}");
    assert_eq!(server.seen().len(), 1);
}

/// A secret or CA file that blocks when opened (a FIFO with no writer yet) must not stall the
/// executor: on a single-threaded runtime, the task that will write it must still get to run.
#[test]
fn reading_the_secret_and_the_ca_never_blocks_the_executor() {
    let setup = Setup::new();
    let fifo_dir = tempfile::tempdir().unwrap();
    let token_fifo = fifo_dir.path().join("token");
    let ca_fifo = fifo_dir.path().join("ca.pem");
    for fifo in [&token_fifo, &ca_fifo] {
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    }
    // If the broker ever reads on the executor, this test's single thread blocks in open(2);
    // the watchdog then feeds both FIFOs so the suite fails instead of hanging.
    let (token, ca) = (token_fifo.clone(), ca_fifo.clone());
    let watchdog_fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fired = watchdog_fired.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .is_err()
        {
            fired.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = std::fs::write(&token, SECRET);
            let _ = std::fs::write(&ca, "");
        }
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime.block_on(async {
        let server = setup.server(compressing_echo(false)).await;
        let broker = broker(
            "proxmox",
            proxmox_grant(&server.origin(), &token_fifo, &ca_fifo),
        );
        let ca_pem = setup.ca.pem();
        // Runs only if the executor is free while the broker waits on the FIFOs. Not awaited:
        // when the watchdog fed a FIFO instead, its writer would wait for a reader forever.
        let (token_writer, ca_writer) = (token_fifo.clone(), ca_fifo.clone());
        tokio::spawn(async move {
            let _ = tokio::fs::write(&token_writer, SECRET).await;
            let _ = tokio::fs::write(&ca_writer, ca_pem).await;
        });
        let received = send(
            &broker,
            "proxmox",
            get(&format!("{}/", server.origin()), &[]),
        )
        .await;
        let injected = server
            .seen()
            .first()
            .and_then(|seen| seen.headers.get("authorization").cloned());
        (received.map(|received| received.status), injected)
    });
    // A writer still blocked on a FIFO must not keep the test waiting (nor may a panic inside
    // the runtime, whose drop would wait for that writer: the checks come after).
    runtime.shutdown_background();
    let _ = done_tx.send(());
    watchdog.join().unwrap();
    assert!(
        !watchdog_fired.load(std::sync::atomic::Ordering::SeqCst),
        "the executor was blocked on a file read"
    );
    let (status, injected) = outcome;
    assert_eq!(status.unwrap(), 200);
    assert_eq!(injected.unwrap(), format!("PVEAPIToken={SECRET}").as_str());
}

/// Issue 35: the flight recorder in front of the broker, through every reflection case above (a
/// header echo, every reversible encoding, a compressed echo refused, a partial answer refused,
/// the reflecting methods denied): what a recording holds is what the guest could see, and no
/// form of the secret the broker redacts is in it, in any encoding.
#[tokio::test]
async fn a_recording_of_every_reflection_case_holds_no_form_of_the_secret() {
    use egress_tap::{Bounds, RecordedProvider, Recorder};
    use http_body_util::BodyExt;

    let setup = Setup::new();
    let echoing = setup
        .server(handler(|seen| {
            let authorization = seen.headers["authorization"].to_str().unwrap();
            let mut reply = Reply::ok(&encoded_echoes(authorization).join("\n"));
            reply
                .headers
                .push(("x-echo".into(), authorization.to_owned()));
            reply
        }))
        .await;
    let compressing = setup.server(compressing_echo(true)).await;
    let partial = RawServer::start(
        &setup.ca,
        b"HTTP/1.1 206 Partial Content\r\ncontent-range: bytes 0-9/100\r\ncontent-length: 10\r\nconnection: close\r\n\r\nroot@pam!o".to_vec(),
    )
    .await;
    let recorder = Recorder::new(Bounds::default());
    let mut requests = vec![
        get(
            &format!("{}/echo", echoing.origin()),
            &[("accept-encoding", "gzip")],
        ),
        get(&format!("{}/gzip", compressing.origin()), &[]),
        get(&format!("{}/part", partial.origin()), &[]),
    ];
    for method in ["TRACE", "CONNECT"] {
        let mut request = get(&format!("{}/", echoing.origin()), &[]);
        *request.method_mut() = http::Method::from_bytes(method.as_bytes()).unwrap();
        requests.push(request);
    }
    let mut answered = 0;
    for request in requests {
        let origin = request.uri().authority().unwrap().to_string();
        let broker: Arc<dyn Egress> = Arc::new(setup.broker(&format!("https://{origin}")));
        let outgoing = egress_runtime::Outgoing {
            site: &site("proxmox"),
            request,
            options: None,
        };
        let sent = egress_runtime::Tap::send(&*recorder, outgoing, &broker);
        if let Ok(response) = sent.await {
            response.into_body().collect().await.unwrap();
            answered += 1;
        }
    }
    assert_eq!(answered, 1, "only the plain echo is answered");
    let provider = RecordedProvider {
        identity: "proxmox".into(),
        name: "proxmox".into(),
        contract: "0.2.0".into(),
        digest: String::new(),
    };
    let recording = recorder.finish(
        provider,
        "get",
        serde_json::json!({}),
        serde_json::json!({}),
    );
    assert_eq!(recording.exchanges.len(), 5);
    let echoed = recording.exchanges[0]
        .response
        .as_ref()
        .expect("the echo answered");
    assert!(echoed.body.text.as_deref().unwrap().contains("[redacted]"));
    let refusals: Vec<_> = recording.exchanges[1..]
        .iter()
        .map(|exchange| exchange.error.as_ref().expect("refused").code.clone())
        .collect();
    assert_eq!(
        refusals,
        [
            "HTTP-response-content-coding",
            "HTTP-protocol-error",
            "HTTP-request-denied",
            "HTTP-request-denied"
        ]
    );
    let text = serde_json::to_string(&recording).unwrap();
    let authorization = format!("PVEAPIToken={SECRET}");
    let mut forms = encoded_echoes(&authorization);
    forms.extend([
        SECRET.to_owned(),
        STANDARD.encode(SECRET),
        hex::encode(SECRET),
    ]);
    // The secret's distinctive middle, in case a form was cut at a chunk's edge.
    forms.push("4b5a-4c7d-9e8f".into());
    for form in forms {
        assert!(!text.contains(&form), "the recording holds {form}:\n{text}");
    }
}
