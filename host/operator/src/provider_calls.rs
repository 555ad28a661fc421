//! The seam between the ProviderConfig reconciler and a provider: [`ProviderCalls`].
//!
//! The ProviderConfig reconciler ([`crate::provider_config_reconciler`]) and the orphan sweep
//! ([`crate::sweep`]) make every provider call through this trait: `validate-config` on the
//! component a spec names, `check`, `list-by-tag` and `delete` on its binding. The runtime's
//! [`Provider`] implements it; unit tests implement it with a fake, so the reconciler's steps are
//! tested without a compiled component. [`Metered`] counts and times each call in the call
//! metrics, as the Proxy reconciler does its own.

use std::future::Future;
use std::time::Instant;

use egress_runtime::types::{Request, Response};
use egress_runtime::{CallContext, CallError, Provider};

use crate::metrics::Metrics;

/// Something that answers provider requests.
pub trait ProviderCalls: Send + Sync {
    /// Run `request` for `context` (who it is for, recorded on the call's span).
    fn call(
        &self,
        request: Request,
        context: &CallContext,
    ) -> impl Future<Output = Result<Response, CallError>> + Send;
}

impl ProviderCalls for Provider {
    fn call(
        &self,
        request: Request,
        context: &CallContext,
    ) -> impl Future<Output = Result<Response, CallError>> + Send {
        Provider::call(self, request, context)
    }
}

/// `calls`, each counted and timed in `metrics` (`egress_provider_calls_total`,
/// `egress_provider_call_duration_seconds`) under the ProviderConfig `provider_config`, with its
/// operation and outcome (`ok` or the error class).
pub struct Metered<'a, P> {
    /// What makes the calls.
    pub calls: &'a P,
    /// The ProviderConfig the calls are for: the `provider` label.
    pub provider_config: &'a str,
    /// Where they are counted.
    pub metrics: &'a Metrics,
}

impl<P: ProviderCalls> ProviderCalls for Metered<'_, P> {
    async fn call(&self, request: Request, context: &CallContext) -> Result<Response, CallError> {
        let operation = request.operation();
        let started = Instant::now();
        let result = self.calls.call(request, context).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(error) => error.class().as_str(),
        };
        self.metrics.provider_call(
            self.provider_config,
            operation.as_str(),
            outcome,
            started.elapsed(),
        );
        result
    }
}
