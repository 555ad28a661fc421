//! The seam between the reconcilers and a provider: [`ProviderCalls`].
//!
//! Both reconcilers make every provider call through this trait: the Proxy reconciler
//! ([`crate::proxy_reconciler`]) `create`, `get`, `delete` and `list-by-tag` on its
//! ProviderConfig's binding; the ProviderConfig reconciler ([`crate::provider_config_reconciler`])
//! and the orphan sweep ([`crate::sweep`]) `validate-config` on the component a spec names,
//! `check`, `list-by-tag` and `delete`. The runtime's [`Provider`] implements it; unit tests
//! implement it with a fake, so the reconcilers' decisions are tested without a compiled
//! component. [`Counted`] counts and times each call in the call metrics, and records it when its
//! ProviderConfig says so.

use std::future::Future;
use std::time::Instant;

use egress_runtime::types::{Request, Response};
use egress_runtime::{CallContext, CallError, Provider};
use egress_tap::{RecordedProvider, RecordingDir};

use crate::metrics::Metrics;

/// Something that answers provider requests.
pub trait ProviderCalls: Send + Sync {
    /// Run `request` for `context` (who it is for, recorded on the call's span).
    fn call(
        &self,
        request: Request,
        context: &CallContext,
    ) -> impl Future<Output = Result<Response, CallError>> + Send;

    /// Who answers, as a recording names it; `None` for what cannot be recorded (a fake).
    fn recorded_as(&self) -> Option<RecordedProvider> {
        None
    }
}

impl ProviderCalls for Provider {
    fn call(
        &self,
        request: Request,
        context: &CallContext,
    ) -> impl Future<Output = Result<Response, CallError>> + Send {
        Provider::call(self, request, context)
    }

    fn recorded_as(&self) -> Option<RecordedProvider> {
        Some(RecordedProvider::of(self))
    }
}

/// `calls`, each counted and timed in `metrics` (`egress_provider_calls_total`,
/// `egress_provider_call_duration_seconds`) under the ProviderConfig `provider_config`, with its
/// operation and outcome (`ok` or the error class).
pub struct Counted<'a, P> {
    /// What makes the calls.
    pub calls: &'a P,
    /// The ProviderConfig the calls are for: the `provider` label.
    pub provider_config: &'a str,
    /// Where they are counted.
    pub metrics: &'a Metrics,
    /// Where they are recorded, if the ProviderConfig records.
    pub recordings: Option<&'a RecordingDir>,
}

impl<P: ProviderCalls> ProviderCalls for Counted<'_, P> {
    async fn call(&self, request: Request, context: &CallContext) -> Result<Response, CallError> {
        let operation = request.operation();
        let started = Instant::now();
        let result = match (self.recordings, self.calls.recorded_as()) {
            (Some(dir), Some(who)) => {
                let call = |request, context: CallContext| async move {
                    self.calls.call(request, &context).await
                };
                dir.record(who, request, context, call).await
            }
            _ => self.calls.call(request, context).await,
        };
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
