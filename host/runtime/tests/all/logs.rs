//! Guest log lines reach the host's tracing inside the call's span.

use std::io::Write;
use std::sync::{Arc, Mutex};

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

#[tokio::test(flavor = "current_thread")]
async fn guest_log_lines_carry_the_call_span_fields() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // Global, not `set_default`: tracing caches per-callsite interest process-wide, and with
    // other tests running on other threads a thread-local subscriber can miss the span.
    tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");

    let provider = runtime()
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let request = Request::Create {
        request: CreateRequest {
            name: "web".into(),
            uid: "uid-7".into(),
            tags: Vec::new(),
            user_data: String::new(),
            config: "{}".into(),
        },
    };
    let context = CallContext {
        proxy: Some("team-a/egress".into()),
    };
    provider.call(request, &context).await.unwrap();

    let output = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
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
