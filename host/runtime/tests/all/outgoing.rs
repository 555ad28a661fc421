//! Where a guest's outgoing request runs: a request without a body is sent from the task that runs
//! the call, so its exchange never waits for another worker thread (docs/performance.md).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use egress_runtime::egress::{
    CallSite, Egress, EgressBody, EgressError, EgressFuture, RequestOptions,
};
use egress_runtime::{CallContext, ErrorClass, Request, Runtime, RuntimeConfig};
use http_body_util::{BodyExt, Full};

use crate::common::{component_path, shared_cache_dir, test_limits};

/// Answers every request `404`, and records which task polled each request's exchange first.
#[derive(Clone, Default)]
struct Recording {
    polled_on: Arc<Mutex<Vec<Option<tokio::task::Id>>>>,
}

impl Egress for Recording {
    fn granted(&self, _identity: &str) -> bool {
        true
    }

    fn send(
        &self,
        _site: &CallSite,
        _request: http::Request<EgressBody>,
        _options: Option<RequestOptions>,
    ) -> EgressFuture {
        let polled_on = Arc::clone(&self.polled_on);
        Box::pin(async move {
            polled_on.lock().unwrap().push(tokio::task::try_id());
            let body = Full::new(Bytes::from_static(br#"{"error":"no such instance"}"#))
                .map_err(|never| -> EgressError { match never {} })
                .boxed_unsync();
            Ok(http::Response::builder().status(404).body(body).unwrap())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_body_is_sent_from_the_task_that_runs_the_call() {
    let recording = Recording::default();
    let config = RuntimeConfig::default()
        .limits(test_limits())
        .cache_dir(Some(shared_cache_dir()));
    let runtime = Runtime::new(config, Arc::new(recording.clone())).unwrap();
    let provider = runtime
        .load_file(&component_path("reference"))
        .await
        .unwrap();

    // The reference provider's `get` with an endpoint is one `GET /instances/<name>`.
    let call = tokio::spawn(async move {
        let get = Request::Get {
            config: r#"{"endpoint":"https://backend.test"}"#.into(),
            provider_id: "ref/web".into(),
        };
        let answer = provider.call(get, &CallContext::default()).await;
        (tokio::task::id(), answer)
    });
    let (call_task, answer) = call.await.unwrap();

    let error = answer.expect_err("the backend answered 404");
    assert_eq!(error.class(), ErrorClass::NotFound, "{error}");
    assert_eq!(
        *recording.polled_on.lock().unwrap(),
        [Some(call_task)],
        "the one request was polled by the call's own task"
    );
}
