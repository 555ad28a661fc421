//! The egress the provider runs behind during a run: the broker, watched. It counts the requests
//! the provider sends and every attempt to set a credential header (which the sandbox refuses
//! before the broker sees a request, so the broker's own metrics cannot count it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use egress_capability_http::Broker;
use egress_runtime::egress::{CallSite, Egress, EgressBody, EgressFuture, RequestOptions};
use http::HeaderName;

/// The broker plus two counters.
pub(crate) struct Watch {
    broker: Arc<Broker>,
    sent: AtomicU64,
    credential_headers: AtomicU64,
}

impl Watch {
    pub(crate) fn new(broker: Arc<Broker>) -> Self {
        Self {
            broker,
            sent: AtomicU64::new(0),
            credential_headers: AtomicU64::new(0),
        }
    }

    /// Requests the provider has handed to the broker so far (allowed or not).
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Times the provider tried to set a credential header so far.
    pub(crate) fn credential_headers(&self) -> u64 {
        self.credential_headers.load(Ordering::Relaxed)
    }
}

/// Headers only the host sets. The grant's own header is refused too (`is_forbidden_header`),
/// but these are the ones a provider has no business naming at all.
fn is_credential(name: &HeaderName) -> bool {
    name == http::header::AUTHORIZATION
        || name == http::header::PROXY_AUTHORIZATION
        || name == http::header::COOKIE
}

impl Egress for Watch {
    fn granted(&self, identity: &str) -> bool {
        self.broker.granted(identity)
    }

    fn is_forbidden_header(&self, name: &HeaderName) -> bool {
        let forbidden = self.broker.is_forbidden_header(name);
        if forbidden && is_credential(name) {
            self.credential_headers.fetch_add(1, Ordering::Relaxed);
        }
        forbidden
    }

    fn send(
        &self,
        site: &CallSite,
        request: http::Request<EgressBody>,
        options: Option<RequestOptions>,
    ) -> EgressFuture {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.broker.send(site, request, options)
    }
}
