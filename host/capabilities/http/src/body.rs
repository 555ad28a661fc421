//! Bodies in both directions: the guest's request body streamed out unchanged, and the server's
//! response body streamed in under the grant's size cap and deadline, redacted on the way.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use egress_runtime::egress::{EgressBody, EgressError};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use sync_wrapper::SyncWrapper;
use tokio::time::{Instant, Sleep};

use crate::client::{classify, describe};
use crate::redact::{Redactor, StreamRedactor};

/// The guest's request body as reqwest wants it (`Sync`; the guest's body is only `Send`, and
/// is only ever polled through `&mut`, so `SyncWrapper` makes that sound).
pub struct RequestBody(SyncWrapper<EgressBody>);

impl RequestBody {
    /// Wraps the guest's body; nothing is buffered.
    pub fn new(body: EgressBody) -> Self {
        Self(SyncWrapper::new(body))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        Pin::new(self.get_mut().0.get_mut()).poll_frame(cx)
    }

    fn size_hint(&self) -> SizeHint {
        // `SyncWrapper` gives no `&` access; an unknown size makes the client stream (chunked on
        // HTTP/1.1) unless the guest sent a Content-Length, which is kept.
        SizeHint::default()
    }
}

/// The response body the guest reads.
pub struct ResponseBody {
    inner: reqwest::Body,
    /// Bytes the guest may still receive.
    remaining: u64,
    limit: u64,
    /// The grant's total deadline for the exchange.
    deadline: Instant,
    /// A timer for `deadline`, armed the first time the body has to wait for the server: most
    /// answers are read whole without waiting, and a timer costs a lock on the timer wheel.
    timer: Option<Pin<Box<Sleep>>>,
    redactor: Option<StreamRedactor>,
    /// Trailers that arrived while redacted data was still held back.
    pending_trailers: Option<http::HeaderMap>,
    finished: bool,
}

impl ResponseBody {
    /// Guards `inner`: at most `limit` bytes, done by `deadline`, redacted with `redactor`;
    /// boxed as the body type wasi:http takes.
    pub fn guard(
        inner: reqwest::Body,
        limit: u64,
        deadline: Instant,
        redactor: Option<Redactor>,
    ) -> EgressBody {
        Self {
            inner,
            remaining: limit,
            limit,
            deadline,
            timer: None,
            redactor: redactor.map(Redactor::stream),
            pending_trailers: None,
            finished: false,
        }
        .boxed_unsync()
    }

    fn redact_trailers(&self, mut trailers: http::HeaderMap) -> http::HeaderMap {
        if let Some(redactor) = &self.redactor {
            crate::redact::redact_headers(redactor.redactor(), &mut trailers);
        }
        trailers
    }

    /// The server's next frame; the deadline's error once it passed while the server kept the
    /// body waiting; a failed read as the code the guest gets.
    fn poll_server(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_pending() {
            let deadline = self.deadline;
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(EgressError::HttpResponseTimeout)));
            }
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(|error| read_failed(&error))))
    }

    /// What the guest gets of one frame of the server's: `None` when nothing yet (redaction
    /// holds data back, or the frame is neither data nor trailers).
    fn pass(&mut self, frame: Frame<Bytes>) -> Option<Result<Frame<Bytes>, EgressError>> {
        match frame.into_data() {
            Ok(data) => self.pass_data(data),
            Err(frame) => {
                let trailers = frame.into_trailers().ok()?;
                Some(Ok(self.pass_trailers(trailers)))
            }
        }
    }

    /// Data, counted against the cap and redacted.
    fn pass_data(&mut self, data: Bytes) -> Option<Result<Frame<Bytes>, EgressError>> {
        let len = data.len() as u64;
        if len > self.remaining {
            self.finished = true;
            return Some(Err(EgressError::HttpResponseBodySize(Some(self.limit))));
        }
        self.remaining -= len;
        match self.redactor.as_mut() {
            Some(redactor) => {
                let out = redactor.push(&data);
                // All held back: an occurrence may be starting.
                (!out.is_empty()).then(|| Ok(Frame::data(out)))
            }
            None => Some(Ok(Frame::data(data))),
        }
    }

    /// Trailers come after the data redaction still holds back, so that goes first and the
    /// trailers wait for the next poll.
    fn pass_trailers(&mut self, trailers: http::HeaderMap) -> Frame<Bytes> {
        let tail = self.finish_redaction();
        if tail.is_empty() {
            Frame::trailers(self.redact_trailers(trailers))
        } else {
            self.pending_trailers = Some(trailers);
            Frame::data(tail)
        }
    }

    /// What redaction still holds back, now that no more data comes.
    fn finish_redaction(&mut self) -> Bytes {
        self.redactor
            .as_mut()
            .map(StreamRedactor::finish)
            .unwrap_or_default()
    }
}

/// A failed read of the body, as the guest's error code: a failure of unknown kind is an
/// incomplete response, since the headers had arrived.
fn read_failed(error: &reqwest::Error) -> EgressError {
    let (code, kind) = classify(error);
    tracing::warn!(error.type = kind, cause = %describe(error), "response body failed");
    match code {
        EgressError::InternalError(_) => EgressError::HttpResponseIncomplete,
        other => other,
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        let this = &mut *self;
        if let Some(trailers) = this.pending_trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(this.redact_trailers(trailers)))));
        }
        if this.finished {
            return Poll::Ready(None);
        }
        if Instant::now() >= this.deadline {
            this.finished = true;
            return Poll::Ready(Some(Err(EgressError::HttpResponseTimeout)));
        }
        loop {
            let frame = match ready!(this.poll_server(cx)) {
                None => {
                    this.finished = true;
                    let tail = this.finish_redaction();
                    return Poll::Ready((!tail.is_empty()).then(|| Ok(Frame::data(tail))));
                }
                Some(Err(code)) => {
                    this.finished = true;
                    return Poll::Ready(Some(Err(code)));
                }
                Some(Ok(frame)) => frame,
            };
            if let Some(passed) = this.pass(frame) {
                return Poll::Ready(Some(passed));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.pending_trailers.is_none()
    }
}
