//! Guest log lines reach the host's tracing inside the call's span, attributed to the provider's
//! identity at any level, with nothing a guest writes able to start a line or reach a terminal.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use egress_runtime::{CallContext, CreateRequest, Request};

use crate::common::{component_path, runtime};

/// A `tracing_subscriber` writer appending to a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything logged in this test binary, as the operator's text format writes it. Global, not
/// `set_default`: tracing caches per-callsite interest process-wide, and with other tests running
/// on other threads a thread-local subscriber can miss the span.
fn captured() -> &'static Buffer {
    static BUFFER: OnceLock<Buffer> = OnceLock::new();
    BUFFER.get_or_init(|| {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        buffer
    })
}

fn output() -> String {
    String::from_utf8(captured().0.lock().unwrap().clone()).unwrap()
}

fn create(config: serde_json::Value) -> Request {
    Request::Create {
        request: CreateRequest {
            name: "web".into(),
            uid: "uid-7".into(),
            tags: Vec::new(),
            user_data: String::new(),
            config: config.to_string(),
            placement: None,
        },
    }
}

#[tokio::test(flavor = "current_thread")]
async fn guest_log_lines_carry_the_call_span_fields() {
    captured();
    let provider = runtime()
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let context = CallContext {
        subject: Some("team-a/egress".into()),
        ..CallContext::default()
    };
    provider
        .call(create(serde_json::json!({})), &context)
        .await
        .unwrap();

    let output = output();
    let line = output
        .lines()
        .find(|line| line.contains("egress_runtime::guest") && line.contains("team-a/egress"))
        .unwrap_or_else(|| panic!("no guest log line in:\n{output}"));
    assert!(line.contains(" INFO "), "{line}");
    for expected in [
        "provider_call{",
        "provider=reference",
        "operation=\"create\"",
        "proxy=\"team-a/egress\"",
        "name=web uid=uid-7",
    ] {
        assert!(line.contains(expected), "missing {expected:?} in {line}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_guest_cannot_forge_a_line_or_reach_the_terminal() {
    captured();
    let provider = runtime()
        .load_file(&component_path("hostile"))
        .await
        .unwrap();
    let context = CallContext {
        subject: Some("team-b/injected".into()),
        ..CallContext::default()
    };
    provider
        .call(
            create(serde_json::json!({"attack": "log-inject"})),
            &context,
        )
        .await
        .unwrap();

    let output = output();
    let ours: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("innocent") || line.contains("FORGED"))
        .collect();
    // One line, which says who wrote it (the identity, not the `reference` it claims to be).
    assert_eq!(ours.len(), 1, "{ours:#?}");
    let line = ours[0];
    assert!(
        line.contains("provider=\"hostile\"") || line.contains("provider=hostile"),
        "{line}"
    );
    assert!(
        line.contains(r"innocent\n2026-11-30T00:00:00.000000Z"),
        "{line}"
    );
    assert!(
        line.contains(r#"k\nFORGED=1="\u{1b}[31mred\u{1b}[0m""#)
            || line.contains(r"k\nFORGED=1=\u{1b}[31mred\u{1b}[0m"),
        "{line}"
    );
    assert!(line.contains(r"\u{1b}]0;retitled\u{7}"), "{line}");
    assert!(
        !output.contains('\u{1b}') && !output.contains('\u{7}'),
        "a raw escape reached the sink"
    );
    assert!(
        !output
            .lines()
            .any(|line| line.starts_with("2026-11-30T00:00:00.000000Z")),
        "a forged line starts at the left margin"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_huge_message_is_cut_to_what_is_kept() {
    captured();
    let provider = runtime()
        .load_file(&component_path("hostile"))
        .await
        .unwrap();
    let context = CallContext {
        subject: Some("team-c/huge".into()),
        ..CallContext::default()
    };
    provider
        .call(
            create(serde_json::json!({"attack": "log-huge", "mib": 2})),
            &context,
        )
        .await
        .unwrap();
    let output = output();
    let line = output
        .lines()
        .find(|line| line.contains("egress_runtime::guest") && line.contains("team-c/huge"))
        .unwrap_or_else(|| panic!("no guest log line in:\n{output}"));
    let run = line.matches('h').count();
    assert!(
        (4096..4096 + 64).contains(&run),
        "{run} bytes of the message kept"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_0_2_0_guest_logs_through_the_same_bounded_escaping_log() {
    captured();
    let provider = runtime()
        .load_file(&component_path("contract-v2"))
        .await
        .unwrap();
    let context = CallContext {
        subject: Some("team-c/v2".into()),
        ..CallContext::default()
    };
    // contract-v2 logs `creating` with the name as a field: a name that tries to start a line.
    let request = Request::Create {
        request: CreateRequest {
            name: "web\n2026-11-30T00:00:00.000000Z  INFO v2-forged".into(),
            uid: "uid-8".into(),
            tags: Vec::new(),
            user_data: String::new(),
            config: "{}".into(),
            placement: None,
        },
    };
    // It answers with that name in its provider ID, which the host refuses as a result; the log
    // line was written before.
    let outcome = provider.call(request, &context).await;
    assert!(
        matches!(
            outcome,
            Err(egress_runtime::CallError::InvalidResult { .. })
        ),
        "{outcome:?}"
    );

    let output = output();
    let line = output
        .lines()
        .find(|line| line.contains("egress_runtime::guest") && line.contains("team-c/v2"))
        .unwrap_or_else(|| panic!("no egress:log/log line in:\n{output}"));
    for expected in [
        "provider=contract-v2",
        "operation=\"create\"",
        "creating",
        r#"name="web\n2026-11-30T00:00:00.000000Z  INFO v2-forged""#,
    ] {
        assert!(line.contains(expected), "missing {expected:?} in {line}");
    }
    assert!(
        !output.lines().any(|line| line.starts_with("2026-11-30")),
        "a forged line starts at the left margin"
    );
}
