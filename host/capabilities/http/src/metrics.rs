//! Per-request metrics, labelled by provider, origin and outcome.
//!
//! `origin` is one of the grant's origins, or `-` for a denied request (whose URL is the guest's
//! and would make the label set unbounded). `outcome` is a status class (`2xx` … `5xx`),
//! `denied`, or `error`.

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
    pub fn record(&self, provider: &str, origin: &str, outcome: &str, elapsed: Duration) {
        let labels = RequestLabels {
            provider: provider.to_owned(),
            origin: origin.to_owned(),
            outcome: outcome.to_owned(),
        };
        self.requests.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
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

/// The outcome label for a status code: `2xx` for 200.
pub fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
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
        assert_eq!(status_class(http::StatusCode::NOT_FOUND), "4xx");
    }
}
