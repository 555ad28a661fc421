//! Per-request metrics, labelled by provider, origin and outcome.
//!
//! `origin` is one of the grant's origins, or `-` for a denied request (whose URL is the guest's
//! and would make the label set unbounded). `outcome` is a status class (`2xx` … `5xx`),
//! `denied`, or `error`.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The labels of every broker metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The provider that sent the request.
    pub provider: String,
    /// The granted origin, or `-` when denied.
    pub origin: String,
    /// `1xx` … `5xx`, `denied` or `error`.
    pub outcome: String,
}

/// The broker's counters and histogram. Cloning shares the same series.
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<RequestLabels, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                // 5 ms to ~41 s.
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
        }
    }
}

impl Metrics {
    /// Registers the series as `egress_http_requests` and `egress_http_request_duration_seconds`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "egress_http_requests",
            "Outgoing HTTP requests of providers, by outcome",
            self.requests.clone(),
        );
        registry.register(
            "egress_http_request_duration_seconds",
            "Time from a provider's request to the response headers (or the failure)",
            self.duration.clone(),
        );
    }

    /// Counts one request and records its duration to headers.
    pub(crate) fn record(&self, provider: &str, origin: &str, outcome: &str, elapsed: Duration) {
        self.series(provider, origin, outcome).record(elapsed);
    }

    /// The series of one label set, to record into without looking them up again.
    pub(crate) fn series(&self, provider: &str, origin: &str, outcome: &str) -> Series {
        let labels = RequestLabels {
            provider: provider.to_owned(),
            origin: origin.to_owned(),
            outcome: outcome.to_owned(),
        };
        Series {
            requests: self.requests.get_or_create(&labels).clone(),
            duration: self.duration.get_or_create(&labels).clone(),
        }
    }

    /// The number of requests counted with these labels.
    pub fn count(&self, provider: &str, origin: &str, outcome: &str) -> u64 {
        let labels = RequestLabels {
            provider: provider.to_owned(),
            origin: origin.to_owned(),
            outcome: outcome.to_owned(),
        };
        self.requests
            .get(&labels)
            .map_or(0, |counter| counter.get())
    }
}

/// The two series of one label set. Clones share them.
#[derive(Clone, Debug)]
pub struct Series {
    requests: Counter,
    duration: Histogram,
}

impl Series {
    /// Counts one request and records its duration to headers.
    pub fn record(&self, elapsed: Duration) {
        self.requests.inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}

/// The outcome labels of a request that reached an origin, in slot order.
const OUTCOMES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// What became of a request that reached an origin: its status, or an error.
#[derive(Clone, Copy, Debug)]
pub enum Outcome {
    /// A response with this status.
    Status(http::StatusCode),
    /// No response.
    Error,
}

impl Outcome {
    /// Its slot in [`OUTCOMES`].
    fn slot(self) -> usize {
        match self {
            Self::Status(status) => match status.as_u16() {
                100..=199 => 0,
                200..=299 => 1,
                300..=399 => 2,
                400..=499 => 3,
                _ => 4,
            },
            Self::Error => 5,
        }
    }

    /// The `outcome` label: `2xx` for 200, `error`.
    pub fn label(self) -> &'static str {
        OUTCOMES[self.slot()]
    }
}

/// The series of one provider and origin by outcome, each looked up the first time it is
/// needed: a request then records without allocating labels or searching the families.
#[derive(Debug, Default)]
pub struct OriginSeries {
    by_outcome: [OnceLock<Series>; OUTCOMES.len()],
}

impl OriginSeries {
    /// Counts one request of `provider` to `origin` and records its duration to headers.
    pub fn record(
        &self,
        metrics: &Metrics,
        provider: &str,
        origin: &str,
        outcome: Outcome,
        elapsed: Duration,
    ) {
        self.by_outcome[outcome.slot()]
            .get_or_init(|| metrics.series(provider, origin, outcome.label()))
            .record(elapsed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_encoded_with_their_labels() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.record(
            "proxmox",
            "https://h:8006",
            "2xx",
            Duration::from_millis(12),
        );
        metrics.record(
            "proxmox",
            "https://h:8006",
            "2xx",
            Duration::from_millis(12),
        );
        assert_eq!(metrics.count("proxmox", "https://h:8006", "2xx"), 2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"egress_http_requests_total{provider="proxmox",origin="https://h:8006",outcome="2xx"} 2"#),
            "{text}"
        );
        assert_eq!(Outcome::Status(http::StatusCode::NOT_FOUND).label(), "4xx");
        assert_eq!(Outcome::Error.label(), "error");
    }

    #[test]
    fn origin_series_record_into_the_families() {
        let metrics = Metrics::default();
        let series = OriginSeries::default();
        let ok = Outcome::Status(http::StatusCode::OK);
        for _ in 0..3 {
            series.record(&metrics, "proxmox", "https://h:8006", ok, Duration::ZERO);
        }
        series.record(
            &metrics,
            "proxmox",
            "https://h:8006",
            Outcome::Error,
            Duration::ZERO,
        );
        assert_eq!(metrics.count("proxmox", "https://h:8006", "2xx"), 3);
        assert_eq!(metrics.count("proxmox", "https://h:8006", "error"), 1);
        assert_eq!(metrics.count("proxmox", "https://h:8006", "5xx"), 0);
    }
}
