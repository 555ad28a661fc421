//! Replay: the broker answers a call's requests from a [`Recording`], with no backend.
//!
//! # The matching rule
//!
//! The guest reads the recorded wall clock: the n-th time it asks, the n-th time it was given
//! when recorded. Requests are matched **in order**: the n-th request the call sends is compared with the n-th
//! recorded exchange. They match when the method, the URL and the body are equal (a body the
//! recorder truncated is compared on the bytes it kept). Headers are not compared: a provider may
//! stamp a request id or a date, and the credential was never in the recording. A match is
//! answered with the recorded response (status, headers, body, and a body error if the recorded
//! one ended in one) or the recorded error and refusal.
//!
//! The first request that does not match, or one past the end of the recording, ends the replay:
//! the guest gets `internal-error` (`replay-diverged`), and [`Replay::verdict`] names the request
//! and what differs. A call that ends with recorded exchanges never sent fails the verdict too.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use egress_runtime::egress::{Egress, EgressBody, EgressError, EgressFuture, HostWallClock};
use egress_runtime::{Description, Outgoing, Refusal, RefusalReporter, Tap, lock};
use http_body_util::BodyExt;
use hyper::body::Frame;

use crate::codes;
use crate::recording::{Exchange, Recording, RecordingError};

/// The most of a request body a replay reads to compare: what no recording of ours keeps more of.
const MAX_COMPARED_BYTES: usize = 16 << 20;

/// The detail of the `internal-error` a diverged request gets.
pub const DIVERGED: &str = "replay-diverged";

/// Answers one call from its recording.
#[derive(Debug)]
pub struct Replay {
    /// Shared with the futures of the call's requests and its clock.
    cursor: Arc<Cursor>,
}

#[derive(Debug, Default)]
struct ReplayState {
    sent: usize,
    divergence: Option<Divergence>,
}

/// Where a replay left its recording.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("replay of {file} diverged at request {index}: {what}")]
pub struct Divergence {
    /// The recording's file.
    pub file: String,
    /// The request's number, from 1.
    pub index: usize,
    /// What differs, both sides named.
    pub what: String,
}

impl Replay {
    /// A replay of `recording`, read from `source` (named in every error), for a provider
    /// described as `description`: one of another name or contract version is refused. A
    /// component of other bytes is what a replay is for, so the digest is not compared.
    pub fn new(
        recording: Recording,
        source: &str,
        description: &Description,
    ) -> Result<Arc<Replay>, RecordingError> {
        let recorded = &recording.provider;
        if recorded.name != description.name || recorded.contract != description.contract_version {
            return Err(RecordingError::OtherProvider {
                path: source.to_owned(),
                recorded: format!("{} (contract {})", recorded.name, recorded.contract),
                replaying: format!(
                    "{} (contract {})",
                    description.name, description.contract_version
                ),
            });
        }
        let cursor = Cursor {
            recording,
            source: source.to_owned(),
            state: Mutex::default(),
        };
        Ok(Arc::new(Replay {
            cursor: Arc::new(cursor),
        }))
    }

    /// The recording replayed.
    pub fn recording(&self) -> &Recording {
        &self.cursor.recording
    }

    /// Once the call returned: `Ok` when every request matched and every recorded exchange was
    /// sent; else the first divergence.
    pub fn verdict(&self) -> Result<(), Divergence> {
        let Cursor {
            recording,
            source,
            state,
        } = &*self.cursor;
        let state = lock(state);
        if let Some(divergence) = &state.divergence {
            return Err(divergence.clone());
        }
        match recording.exchanges.get(state.sent) {
            None => Ok(()),
            Some(unsent) => Err(Divergence {
                file: source.clone(),
                index: state.sent + 1,
                what: format!(
                    "the call ended without sending it; the recording has {} ({} exchanges in all)",
                    unsent.request.line(),
                    recording.exchanges.len()
                ),
            }),
        }
    }
}

/// The recording, the file it came from and how far the call got.
#[derive(Debug)]
struct Cursor {
    recording: Recording,
    source: String,
    state: Mutex<ReplayState>,
}

impl Cursor {
    /// Take the next exchange for a request, or record why there is none.
    fn answer_for(&self, method: &str, uri: &str, body: &[u8]) -> Option<Exchange> {
        let mut state = lock(&self.state);
        if state.divergence.is_some() {
            return None;
        }
        state.sent += 1;
        let index = state.sent;
        let sent = format!("{method} {uri}");
        let exchanges = &self.recording.exchanges;
        let what = match exchanges.get(index - 1) {
            None => Some(format!(
                "the provider sent {sent}, past the end of the recording ({} exchanges)",
                exchanges.len()
            )),
            Some(exchange) => difference(exchange, method, uri, body, &sent),
        };
        match what {
            None => Some(exchanges[index - 1].clone()),
            Some(what) => {
                state.divergence = Some(Divergence {
                    file: self.source.clone(),
                    index,
                    what,
                });
                None
            }
        }
    }
}

/// How a request differs from the recorded one, if it does.
fn difference(
    exchange: &Exchange,
    method: &str,
    uri: &str,
    body: &[u8],
    sent: &str,
) -> Option<String> {
    let recorded = &exchange.request;
    if recorded.method != method || recorded.uri != uri {
        return Some(format!(
            "the provider sent {sent}; the recording has {}",
            recorded.line()
        ));
    }
    let kept = recorded.body.bytes().unwrap_or_default();
    let same = if recorded.body.truncated {
        body.starts_with(&kept)
    } else {
        body == kept.as_slice()
    };
    (!same).then(|| {
        format!(
            "{sent}: the body differs; sent {}, recorded {}",
            shown(body),
            shown(&kept)
        )
    })
}

/// A body as a person reads it in an error: text up to 300 characters, else its size.
fn shown(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(text) if text.chars().count() <= 300 => format!("{text:?}"),
        Ok(text) => format!(
            "{:?}… ({} bytes)",
            text.chars().take(300).collect::<String>(),
            body.len()
        ),
        Err(_) => format!("{} bytes of binary", body.len()),
    }
}

impl Tap for Replay {
    fn send(&self, outgoing: Outgoing<'_>, _next: &Arc<dyn Egress>) -> EgressFuture {
        let (mut parts, body) = outgoing.request.into_parts();
        let reporter = RefusalReporter::take(&mut parts.extensions);
        let (method, uri) = (parts.method.to_string(), parts.uri.to_string());
        let cursor = Arc::clone(&self.cursor);
        Box::pin(async move {
            let body = http_body_util::Limited::new(body, MAX_COMPARED_BYTES)
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_default();
            let Some(exchange) = cursor.answer_for(&method, &uri, &body) else {
                return Err(EgressError::InternalError(Some(DIVERGED.into())));
            };
            answer(exchange, reporter.as_ref())
        })
    }

    fn wall_clock(&self) -> Option<Box<dyn HostWallClock>> {
        Some(Box::new(ReplayClock {
            cursor: Arc::clone(&self.cursor),
            read: Mutex::new((0, Instant::now())),
        }))
    }
}

/// The recorded wall-clock reads, in order; past them, the last one advancing with real time.
struct ReplayClock {
    cursor: Arc<Cursor>,
    /// How many reads were served, and when the last one was.
    read: Mutex<(usize, Instant)>,
}

impl HostWallClock for ReplayClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        let mut read = lock(&self.read);
        let clock = &self.cursor.recording.clock;
        let now = match clock.get(read.0) {
            Some(recorded) => Duration::from_nanos(*recorded),
            None => match clock.last() {
                Some(last) => Duration::from_nanos(*last) + read.1.elapsed(),
                None => SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default(),
            },
        };
        if read.0 < clock.len() {
            *read = (read.0 + 1, Instant::now());
        }
        now
    }
}

/// What a matched exchange gives back.
fn answer(
    exchange: Exchange,
    reporter: Option<&RefusalReporter>,
) -> Result<http::Response<EgressBody>, EgressError> {
    if let Some(error) = exchange.error {
        if let (Some(reporter), Some(refusal)) =
            (reporter, error.refusal.as_deref().and_then(Refusal::named))
        {
            reporter.report(refusal);
        }
        let code =
            codes::parse(&error.code, error.detail).unwrap_or(EgressError::InternalError(None));
        return Err(code);
    }
    let recorded = exchange
        .response
        .expect("checked when read: a response or an error");
    let mut response = http::Response::builder().status(recorded.status);
    for [name, value] in &recorded.headers {
        response = response.header(name.as_str(), value.as_str());
    }
    let error = (recorded.body_error.as_deref()).and_then(|code| codes::parse(code, None));
    let body = Recorded {
        data: Some(Bytes::from(recorded.body.bytes().unwrap_or_default())),
        error,
    };
    response.body(body.boxed_unsync()).map_err(|_| {
        EgressError::InternalError(Some("replay: a recorded header is not valid".into()))
    })
}

/// A recorded body: its bytes in one frame, then the error that ended it, if one did.
struct Recorded {
    data: Option<Bytes>,
    error: Option<EgressError>,
}

impl hyper::body::Body for Recorded {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        let next = match self.data.take() {
            Some(data) if !data.is_empty() => Some(Ok(Frame::data(data))),
            _ => self.error.take().map(Err),
        };
        std::task::Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.data.as_ref().is_none_or(Bytes::is_empty) && self.error.is_none()
    }
}
