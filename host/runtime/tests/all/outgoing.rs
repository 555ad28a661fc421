//! Where a guest's outgoing request runs: a request without a body is sent from the task that runs
//! the call, so its exchange never waits for another worker thread (docs/performance.md), and it
//! moves on whenever the guest asks for its response, not only while the guest waits on it.

use std::sync::{Arc, Mutex};
use std::task::Poll;

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

/// Answers every request `404` on the second poll of its exchange, and never wakes whoever polled
/// the first time: only a host that polls again of its own accord gets the answer.
struct AnswersWhenAskedAgain;

impl Egress for AnswersWhenAskedAgain {
    fn granted(&self, _identity: &str) -> bool {
        true
    }

    fn send(
        &self,
        _site: &CallSite,
        _request: http::Request<EgressBody>,
        _options: Option<RequestOptions>,
    ) -> EgressFuture {
        let mut polled = false;
        Box::pin(std::future::poll_fn(move |_| {
            if !std::mem::replace(&mut polled, true) {
                return Poll::Pending;
            }
            let body = Full::new(Bytes::new())
                .map_err(|never| -> EgressError { match never {} })
                .boxed_unsync();
            Poll::Ready(Ok(http::Response::builder()
                .status(404)
                .body(body)
                .unwrap()))
        }))
    }
}

#[tokio::test]
async fn a_guest_asking_for_its_response_without_waiting_moves_its_request_on() {
    let config = RuntimeConfig::default()
        .limits(test_limits())
        .cache_dir(Some(shared_cache_dir()));
    let runtime = Runtime::new(config, Arc::new(AnswersWhenAskedAgain)).unwrap();
    let hostile = runtime.load_file(&component_path("hostile")).await.unwrap();
    // The exchange is polled once when handed over (pending, no wake-up to come), then on the
    // guest's first `get`.
    let spin = Request::Get {
        config: r#"{"attack":"spin-get","endpoint":"https://backend.test","gets":1000}"#.into(),
        provider_id: "hostile/1".into(),
    };
    let error = hostile
        .call(spin, &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("answered after 1 gets: HTTP 404"),
        "{error}"
    );
}
