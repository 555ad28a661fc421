//! The flight recorder: a [`Tap`] that keeps every exchange of one call, bodies teed as they
//! stream (bounded), and [`RecordingDir`], a rotated folder of recordings.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use egress_runtime::egress::{Egress, EgressBody, EgressError, EgressFuture, HostWallClock};
use egress_runtime::types::{Request, Response};
use egress_runtime::{CallContext, CallError, Outgoing, Provider, RefusalReporter, Tap, lock};
use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use serde_json::Value;

use crate::codes;
use crate::recording::{
    Body, Exchange, FORMAT, RecordedError, RecordedProvider, RecordedRequest, RecordedResponse,
    Recording, RecordingError, Timing, VERSION,
};

/// How much of a call a recording keeps: past either bound a body keeps its first bytes and is
/// marked `truncated`; the exchanges themselves are always kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The most bytes kept of one body.
    pub body_bytes: usize,
    /// The most body bytes kept for the whole call.
    pub call_bytes: usize,
}

impl Bounds {
    /// At most `body_bytes` a body and `call_bytes` a call.
    pub fn of(body_bytes: u64, call_bytes: u64) -> Bounds {
        let bytes = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Bounds {
            body_bytes: bytes(body_bytes),
            call_bytes: bytes(call_bytes),
        }
    }
}

impl Default for Bounds {
    /// 1 MiB a body, 8 MiB a call.
    fn default() -> Self {
        Bounds {
            body_bytes: 1 << 20,
            call_bytes: 8 << 20,
        }
    }
}

/// Records one call: set it as the call's tap, then [`finish`](Recorder::finish) with the
/// call's input and output.
#[derive(Debug)]
pub struct Recorder {
    started: Instant,
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    bounds: Bounds,
    /// The guest's wall-clock reads.
    clock: Vec<u64>,
    /// Body bytes kept so far in the call.
    kept: usize,
    exchanges: Vec<Pending>,
}

/// An exchange while its bodies still stream.
#[derive(Debug)]
struct Pending {
    method: String,
    uri: String,
    headers: Vec<[String; 2]>,
    sent: Kept,
    response: Option<(u16, Vec<[String; 2]>)>,
    received: Kept,
    body_error: Option<String>,
    error: Option<RecordedError>,
    timing: Timing,
}

#[derive(Debug, Default)]
struct Kept {
    bytes: Vec<u8>,
    truncated: bool,
    /// The body reached its end: a request refused before the broker read its body was not.
    whole: bool,
}

impl Recorder {
    /// A recorder for one call, keeping at most `bounds`.
    pub fn new(bounds: Bounds) -> Arc<Recorder> {
        Arc::new(Recorder {
            started: Instant::now(),
            state: Arc::new(Mutex::new(State {
                bounds,
                clock: Vec::new(),
                kept: 0,
                exchanges: Vec::new(),
            })),
        })
    }

    /// A request of the call leaves: keep its line and headers; its number. `empty`: it has no
    /// body to read.
    fn begin(&self, parts: &http::request::Parts, empty: bool) -> usize {
        let mut state = lock(&self.state);
        state.exchanges.push(Pending {
            method: parts.method.to_string(),
            uri: parts.uri.to_string(),
            headers: pairs(&parts.headers),
            sent: Kept {
                whole: empty,
                ..Kept::default()
            },
            response: None,
            received: Kept::default(),
            body_error: None,
            error: None,
            timing: Timing {
                sent_ms: millis(self.started),
                ..Timing::default()
            },
        });
        state.exchanges.len() - 1
    }

    /// `body` of exchange `index`, kept as it streams.
    fn tee(&self, body: EgressBody, index: usize, side: Side) -> EgressBody {
        let state = Arc::clone(&self.state);
        let started = self.started;
        Tee {
            inner: body,
            state,
            started,
            index,
            side,
        }
        .boxed_unsync()
    }

    /// The call's recording: `provider` ran `operation` on `input` and returned `output`.
    pub fn finish(
        &self,
        provider: RecordedProvider,
        operation: &str,
        input: Value,
        output: Value,
    ) -> Recording {
        let state = lock(&self.state);
        let exchanges = state.exchanges.iter().map(Pending::recorded).collect();
        Recording {
            clock: state.clock.clone(),
            format: FORMAT.into(),
            version: VERSION,
            provider,
            operation: operation.into(),
            input,
            output,
            exchanges,
        }
    }
}

impl Tap for Recorder {
    fn send(&self, outgoing: Outgoing<'_>, next: &Arc<dyn Egress>) -> EgressFuture {
        let (parts, body) = outgoing.request.into_parts();
        let reporter = parts.extensions.get::<RefusalReporter>().cloned();
        let index = self.begin(&parts, body.is_end_stream());
        let request = http::Request::from_parts(parts, self.tee(body, index, Side::Sent));
        let answer = Outgoing {
            request,
            ..outgoing
        }
        .send_to(next);
        let tee = Tee {
            inner: EgressBody::default(),
            state: Arc::clone(&self.state),
            started: self.started,
            index,
            side: Side::Received,
        };
        Box::pin(async move {
            let answer = answer.await;
            let mut recorded = lock(&tee.state);
            let exchange = &mut recorded.exchanges[index];
            exchange.timing.answered_ms = Some(millis(tee.started));
            match answer {
                Ok(response) => {
                    exchange.response =
                        Some((response.status().as_u16(), pairs(response.headers())));
                    drop(recorded);
                    Ok(response.map(|inner| Tee { inner, ..tee }.boxed_unsync()))
                }
                Err(error) => {
                    let (code, detail) = codes::name(&error);
                    let refusal = reporter.and_then(|reporter| reporter.reported());
                    exchange.error = Some(RecordedError {
                        code: code.into(),
                        detail,
                        refusal: refusal.map(|refusal| refusal.as_str().into()),
                    });
                    Err(error)
                }
            }
        })
    }

    fn wall_clock(&self) -> Option<Box<dyn HostWallClock>> {
        Some(Box::new(RecordingClock(Arc::clone(&self.state))))
    }
}

/// The most wall-clock reads a recording keeps; later ones are not kept, and a replay's clock
/// runs on from the last.
const MAX_CLOCK_READS: usize = 4096;

/// The host's wall clock, each read kept for the recording.
struct RecordingClock(Arc<Mutex<State>>);

impl HostWallClock for RecordingClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        let now = (SystemTime::now().duration_since(UNIX_EPOCH)).unwrap_or_default();
        let mut state = lock(&self.0);
        // A guest that reads the clock in a loop must not grow the recording without bound.
        if state.clock.len() < MAX_CLOCK_READS {
            state
                .clock
                .push(u64::try_from(now.as_nanos()).unwrap_or(u64::MAX));
        }
        now
    }
}

impl Pending {
    fn recorded(&self) -> Exchange {
        let request = RecordedRequest {
            method: self.method.clone(),
            uri: self.uri.clone(),
            headers: self.headers.clone(),
            body: Body::of(
                self.sent.bytes.clone(),
                self.sent.truncated || !self.sent.whole,
            ),
        };
        let response = self
            .response
            .as_ref()
            .map(|(status, headers)| RecordedResponse {
                status: *status,
                headers: headers.clone(),
                body: Body::of(self.received.bytes.clone(), self.received.truncated),
                body_error: self.body_error.clone(),
            });
        // A request still unanswered when the call ended (the guest gave up on it).
        let error = self.error.clone().or_else(|| {
            response.is_none().then(|| RecordedError {
                code: "HTTP-response-timeout".into(),
                detail: None,
                refusal: None,
            })
        });
        Exchange {
            request,
            response,
            error,
            timing: self.timing.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Side {
    Sent,
    Received,
}

/// A body passed through unchanged while its bytes are kept, within the bounds.
struct Tee {
    inner: EgressBody,
    state: Arc<Mutex<State>>,
    started: Instant,
    index: usize,
    side: Side,
}

impl HttpBody for Tee {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let Poll::Ready(frame) = &polled else {
            return polled;
        };
        let mut state = lock(&self.state);
        let State {
            bounds,
            kept,
            exchanges,
            ..
        } = &mut *state;
        let exchange = &mut exchanges[self.index];
        match (frame, self.side) {
            (Some(Ok(frame)), side) => {
                if let Some(data) = frame.data_ref() {
                    let body = match side {
                        Side::Sent => &mut exchange.sent,
                        Side::Received => &mut exchange.received,
                    };
                    let room = (bounds.body_bytes.saturating_sub(body.bytes.len()))
                        .min(bounds.call_bytes.saturating_sub(*kept));
                    let taken = data.len().min(room);
                    body.bytes.extend_from_slice(&data[..taken]);
                    body.truncated |= taken < data.len();
                    body.whole |= self.inner.is_end_stream();
                    *kept += taken;
                }
            }
            (Some(Err(error)), Side::Received) => {
                exchange.body_error = Some(codes::name(error).0.into());
                exchange.timing.ended_ms = Some(millis(self.started));
            }
            (None, Side::Received) => exchange.timing.ended_ms = Some(millis(self.started)),
            (None, Side::Sent) => exchange.sent.whole = true,
            (Some(Err(_)), Side::Sent) => {}
        }
        drop(state);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A folder of recordings, one file per call, rotated: at most `keep` files, the oldest removed
/// first. A recording that cannot be written (a full disk) is dropped with a warning; the call
/// it records is not affected.
#[derive(Clone, Debug)]
pub struct RecordingDir {
    dir: PathBuf,
    keep: usize,
    bounds: Bounds,
}

impl RecordingDir {
    /// Recordings in `dir` (made if missing), at most `keep` of them, each within `bounds`.
    pub fn new(dir: PathBuf, keep: usize, bounds: Bounds) -> RecordingDir {
        RecordingDir {
            dir,
            keep: keep.max(1),
            bounds,
        }
    }

    /// The bounds each recording keeps within.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Write `recording` as the newest file, named by time, a counter and the operation, then
    /// remove the oldest past `keep`. Returns the file written.
    pub fn save(&self, recording: &Recording) -> Result<PathBuf, RecordingError> {
        let io = |source| RecordingError::Io {
            path: self.dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let counter = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!(
            "{:013}-{counter:06}-{}.json",
            now.as_millis(),
            recording.operation
        );
        let path = self.dir.join(&name);
        // Written whole under a name the rotation skips, then renamed: a reader never sees half.
        let partial = self.dir.join(format!(".{name}.partial"));
        recording.write(&partial)?;
        std::fs::rename(&partial, &path).map_err(io)?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map_err(io)?
            .filter_map(|entry| Some(entry.ok()?.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
        files.sort();
        let excess = files.len().saturating_sub(self.keep);
        for old in &files[..excess] {
            let _ = std::fs::remove_file(old);
        }
        Ok(path)
    }
}

fn pairs(headers: &HeaderMap) -> Vec<[String; 2]> {
    headers
        .iter()
        .map(|(name, value)| {
            [
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ]
        })
        .collect()
}

fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl RecordedProvider {
    /// Who `provider` is, as a recording names it.
    pub fn of(provider: &Provider) -> RecordedProvider {
        let description = provider.description();
        RecordedProvider {
            identity: provider.identity().to_owned(),
            name: description.name.clone(),
            contract: description.contract_version.clone(),
            digest: provider.component_digest().to_string(),
        }
    }
}

/// A call's output as a recording holds it: `{"response": …}` or `{"error": {"class",
/// "message"}}`.
pub fn output_of(result: &Result<Response, CallError>) -> Value {
    match result {
        Ok(response) => serde_json::json!({ "response": response }),
        Err(error) => serde_json::json!({
            "error": { "class": error.class().as_str(), "message": error.to_string() }
        }),
    }
}

impl RecordingDir {
    /// Runs `call` with a [`Recorder`] as the tap of a copy of `context`, then saves the
    /// recording of `provider` answering `request`, off the executor. The call's result is
    /// returned unchanged: a recording that cannot be saved (a full disk) is logged and dropped.
    pub async fn record<F, Fut>(
        &self,
        provider: RecordedProvider,
        request: Request,
        context: &CallContext,
        call: F,
    ) -> Result<Response, CallError>
    where
        F: FnOnce(Request, CallContext) -> Fut,
        Fut: Future<Output = Result<Response, CallError>>,
    {
        let recorder = Recorder::new(self.bounds);
        let tapped = CallContext {
            tap: Some(Arc::clone(&recorder) as Arc<dyn Tap>),
            ..context.clone()
        };
        let operation = request.operation();
        let input = serde_json::to_value(&request).unwrap_or_default();
        let result = call(request, tapped).await;
        let recording = recorder.finish(provider, operation.as_str(), input, output_of(&result));
        let dir = self.clone();
        let saved = tokio::task::spawn_blocking(move || dir.save(&recording)).await;
        match saved {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "a call's recording was not saved"),
            Err(error) => tracing::warn!(%error, "a call's recording was not saved"),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_runtime::egress::{CallSite, RequestOptions};
    use egress_runtime::types::ProviderError;
    use http_body_util::Full;

    /// Reads each request whole and answers it with `body`, as a backend behind the broker does.
    struct Answering(&'static str);

    impl Egress for Answering {
        fn send(
            &self,
            _site: &CallSite,
            request: http::Request<EgressBody>,
            _options: Option<RequestOptions>,
        ) -> EgressFuture {
            let body = Full::new(Bytes::from(self.0))
                .map_err(|never| match never {})
                .boxed_unsync();
            Box::pin(async move {
                request.into_body().collect().await?;
                Ok(http::Response::new(body))
            })
        }
    }

    fn site() -> CallSite {
        CallSite {
            provider: Arc::from("p"),
            digest: Arc::from(""),
            operation: "get",
        }
    }

    fn request(body: &'static str) -> http::Request<EgressBody> {
        let body = Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync();
        http::Request::post("https://backend.test/x")
            .body(body)
            .unwrap()
    }

    fn provider() -> RecordedProvider {
        RecordedProvider {
            identity: "p".into(),
            name: "p".into(),
            contract: "0.2.0".into(),
            digest: String::new(),
        }
    }

    /// Refuses every request without reading its body, as the broker refuses a denied one.
    struct Refusing;

    impl Egress for Refusing {
        fn send(
            &self,
            _site: &CallSite,
            _request: http::Request<EgressBody>,
            _options: Option<RequestOptions>,
        ) -> EgressFuture {
            Box::pin(async { Err(EgressError::HttpRequestDenied) })
        }
    }

    #[tokio::test]
    async fn a_body_refused_before_it_was_read_is_kept_as_cut_short() {
        let recorder = Recorder::new(Bounds::default());
        let read: Arc<dyn Egress> = Arc::new(Answering("ok"));
        let refused: Arc<dyn Egress> = Arc::new(Refusing);
        for (body, next) in [
            ("read whole", &read),
            ("", &refused),
            ("never read", &refused),
        ] {
            let outgoing = Outgoing {
                site: &site(),
                request: request(body),
                options: None,
            };
            let _ = recorder.send(outgoing, next).await;
        }
        let recording = recorder.finish(provider(), "get", Value::Null, Value::Null);
        let bodies: Vec<(Option<&str>, bool)> = (recording.exchanges.iter())
            .map(|exchange| &exchange.request.body)
            .map(|body| (body.text.as_deref(), body.truncated))
            .collect();
        // A replay compares a cut-short body on its kept prefix: the refused one matches what
        // the provider sends again.
        assert_eq!(
            bodies,
            [(Some("read whole"), false), (None, false), (None, true)]
        );
    }

    #[tokio::test]
    async fn bodies_past_their_bounds_keep_their_first_bytes_and_say_so() {
        let recorder = Recorder::new(Bounds {
            body_bytes: 4,
            call_bytes: 10,
        });
        let next: Arc<dyn Egress> = Arc::new(Answering("hello world"));
        for sent in ["abcdefgh", "xy"] {
            let outgoing = Outgoing {
                site: &site(),
                request: request(sent),
                options: None,
            };
            let answer = recorder.send(outgoing, &next).await.unwrap();
            let received = answer.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(received, "hello world", "the guest gets the whole body");
        }
        let recording = recorder.finish(provider(), "get", Value::Null, Value::Null);
        let bodies: Vec<(Option<String>, bool)> = recording
            .exchanges
            .iter()
            .flat_map(|exchange| {
                let response = exchange.response.as_ref().unwrap();
                [&exchange.request.body, &response.body]
            })
            .map(|body| (body.text.clone(), body.truncated))
            .collect();
        // 4 + 4 of the call's 10, then 2 left for the second exchange's request and none after.
        let expected = [
            (Some("abcd".to_owned()), true),
            (Some("hell".to_owned()), true),
            (Some("xy".to_owned()), false),
            (None, true),
        ];
        assert_eq!(bodies, expected);
    }

    #[tokio::test]
    async fn a_recording_that_cannot_be_saved_leaves_the_call_as_it_was() {
        let files = std::env::temp_dir().join(format!("egress-tap-{}", std::process::id()));
        std::fs::write(&files, "a file where the folder would go").unwrap();
        let dir = RecordingDir::new(files.join("p"), 3, Bounds::default());
        let answered = dir
            .record(
                provider(),
                Request::Describe,
                &CallContext::default(),
                |_, context| async move {
                    assert!(context.tap.is_some(), "the call runs with the recorder");
                    Err(CallError::Provider(ProviderError::Transient(
                        "asked".into(),
                    )))
                },
            )
            .await;
        std::fs::remove_file(&files).unwrap();
        assert!(
            matches!(&answered, Err(CallError::Provider(ProviderError::Transient(why))) if why == "asked"),
            "{answered:?}"
        );
    }
}
