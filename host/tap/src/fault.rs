//! Faults injected at the broker: what a misbehaving backend does to a provider, without the
//! backend. A [`Faults`] tap counts the call's requests and gives the chosen ones a [`Fault`];
//! the others go to the broker unchanged.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_runtime::egress::{Egress, EgressBody, EgressError, EgressFuture};
use egress_runtime::{Outgoing, Tap};
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;

/// What a chosen request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A response with this status (500, 503, …) and a short text body; the backend never sees
    /// the request.
    Status(u16),
    /// The connection reset before a response: `connection-terminated`.
    Reset,
    /// A response that never comes: the request waits out its first-byte timeout (the guest's,
    /// or `hang` when it set none) and fails with `HTTP-response-timeout`, as the broker fails it.
    NoResponse,
    /// The backend's response, whose body stops after its first bytes and then fails with
    /// `HTTP-response-timeout` once `hang` passed, as the broker's deadline ends it.
    SlowBody,
    /// The TLS handshake fails: `TLS-certificate-error`.
    Tls,
}

/// Which requests of the call get the fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Which {
    /// The n-th request only, from 1.
    Nth(usize),
    /// Every n-th request: the n-th, the 2n-th, …
    Every(usize),
    /// Every request whose path contains this text.
    PathContains(String),
    /// Every request.
    All,
}

/// Injects one fault into the chosen requests of one call.
#[derive(Debug)]
pub struct Faults {
    fault: Fault,
    which: Which,
    hang: Duration,
    seen: AtomicUsize,
    injected: Arc<AtomicUsize>,
}

impl Faults {
    /// `fault` for the requests `which` chooses; a hung request or body fails after `hang`.
    pub fn new(fault: Fault, which: Which, hang: Duration) -> Arc<Faults> {
        Arc::new(Faults {
            fault,
            which,
            hang,
            seen: AtomicUsize::new(0),
            injected: Arc::default(),
        })
    }

    /// How many requests got the fault so far.
    pub fn injected(&self) -> usize {
        self.injected.load(Ordering::Relaxed)
    }

    fn chooses(&self, number: usize, path: &str) -> bool {
        match &self.which {
            Which::Nth(n) => number == *n,
            Which::Every(n) => *n > 0 && number.is_multiple_of(*n),
            Which::PathContains(text) => path.contains(text.as_str()),
            Which::All => true,
        }
    }
}

impl Tap for Faults {
    fn send(&self, outgoing: Outgoing<'_>, next: &Arc<dyn Egress>) -> EgressFuture {
        let number = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.chooses(number, outgoing.request.uri().path()) {
            return outgoing.send_to(next);
        }
        self.injected.fetch_add(1, Ordering::Relaxed);
        let hang = self.hang;
        match self.fault {
            Fault::Status(status) => Box::pin(async move {
                let body = Full::new(Bytes::from(format!("injected fault: status {status}\n")))
                    .map_err(|never| match never {})
                    .boxed_unsync();
                http::Response::builder()
                    .status(status)
                    .header(http::header::CONTENT_TYPE, "text/plain")
                    .body(body)
                    .map_err(|_| {
                        EgressError::InternalError(Some("injected status is not a status".into()))
                    })
            }),
            Fault::Reset => Box::pin(async { Err(EgressError::ConnectionTerminated) }),
            Fault::Tls => Box::pin(async { Err(EgressError::TlsCertificateError) }),
            Fault::NoResponse => {
                let wait = (outgoing
                    .options
                    .and_then(|options| options.first_byte_timeout))
                .map_or(hang, |guest| guest.min(hang));
                Box::pin(async move {
                    tokio::time::sleep(wait).await;
                    Err(EgressError::HttpResponseTimeout)
                })
            }
            Fault::SlowBody => {
                let answer = outgoing.send_to(next);
                Box::pin(async move {
                    let response = answer.await?;
                    Ok(response.map(|body| {
                        Stalled {
                            inner: body,
                            first: true,
                            stall: Box::pin(tokio::time::sleep(hang)),
                        }
                        .boxed_unsync()
                    }))
                })
            }
        }
    }
}

/// A body that gives its first frame, then stalls until the deadline and fails.
struct Stalled {
    inner: EgressBody,
    first: bool,
    stall: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for Stalled {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        use std::task::Poll;
        if self.first {
            let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
            if let Poll::Ready(Some(Ok(frame))) = polled {
                self.first = false;
                // Half of the first frame's data, so even a one-frame body stops midway.
                return Poll::Ready(Some(Ok(match frame.into_data() {
                    Ok(data) => Frame::data(data.slice(..data.len() / 2)),
                    Err(other) => other,
                })));
            }
            if !matches!(polled, Poll::Pending) {
                self.first = false;
            }
        }
        match self.stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(EgressError::HttpResponseTimeout))),
            Poll::Pending => Poll::Pending,
        }
    }
}
