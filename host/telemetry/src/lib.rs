//! # egress-telemetry
//!
//! What the operator tells its watchers, in both modes:
//!
//! - [`metrics`]: the Prometheus families (controller-runtime's reconcile names, provider calls,
//!   recoveries, image loads), one [`Metrics`](metrics::Metrics) handle cloned into each
//!   reconciler;
//! - [`server`]: `/healthz`, `/readyz` and `/metrics` on one port;
//! - [`logging`]: the log lines on stderr, text or JSON, with a level per provider changed
//!   while the operator runs.
//!
//! It knows nothing of the reconcilers: they call [`Metrics`](metrics::Metrics)' methods with
//! their own labels.

#![warn(missing_docs)]

pub mod logging;
pub mod metrics;
pub mod server;
