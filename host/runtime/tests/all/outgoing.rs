//! Where a guest's outgoing request runs: a request without a body is sent from the task that runs
//! the call, so its exchange never waits for another worker thread (docs/performance.md), and it
//! moves on whenever the guest asks for its response, not only while the guest waits on it.

use std::sync::{Arc, Mutex};
use std::task::Poll;

use bytes::Bytes;
use egress_runtime::egress::{
    CallSite, Egress, EgressBody, EgressError, EgressFuture, RequestOptions,
};
use egress_runtime::http::HttpCapability;
use egress_runtime::{
    CallContext, CallError, ErrorClass, Request, Response, Runtime, RuntimeConfig,
};
use http_body_util::{BodyExt, Full};

use crate::common::{component_path, shared_cache_dir, test_limits};

/// Answers every request `404`, and records which task polled each request's exchange first.
/// With `pending_once`, each exchange is pending on its first poll and wakes no one: only a host
/// that polls it again of its own accord gets the answer.
#[derive(Clone, Default)]
struct Recording {
    polled_on: Arc<Mutex<Vec<Option<tokio::task::Id>>>>,
    pending_once: bool,
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
        let mut pending = self.pending_once;
        let mut first = true;
        Box::pin(std::future::poll_fn(move |_| {
            if std::mem::take(&mut first) {
                polled_on.lock().unwrap().push(tokio::task::try_id());
            }
            if std::mem::take(&mut pending) {
                return Poll::Pending;
            }
            Poll::Ready(Ok(not_found()))
        }))
    }
}

/// A `404` with a JSON body.
fn not_found() -> http::Response<EgressBody> {
    let body = Full::new(Bytes::from_static(br#"{"error":"no such instance"}"#))
        .map_err(|never| -> EgressError { match never {} })
        .boxed_unsync();
    http::Response::builder().status(404).body(body).unwrap()
}

/// A runtime with test limits over `egress`.
fn runtime_over(egress: Arc<dyn Egress>) -> Runtime {
    let config = RuntimeConfig::default()
        .limits(test_limits())
        .cache_dir(Some(shared_cache_dir()))
        .capability(Arc::new(HttpCapability::new(egress)));
    Runtime::new(config).unwrap()
}

/// The tasks that ran a call of `request` on the reference provider (from a task of its own,
/// against a [`Recording`] egress) and that polled each of its exchanges, and its answer.
async fn recorded_call(
    request: Request,
) -> (
    tokio::task::Id,
    Vec<Option<tokio::task::Id>>,
    Result<Response, CallError>,
) {
    let recording = Recording::default();
    let provider = runtime_over(Arc::new(recording.clone()))
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let call = tokio::spawn(async move {
        let answer = provider.call(request, &CallContext::default()).await;
        (tokio::task::id(), answer)
    });
    let (call_task, answer) = call.await.unwrap();
    let polled_on = recording.polled_on.lock().unwrap().clone();
    (call_task, polled_on, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_body_is_sent_from_the_task_that_runs_the_call() {
    // The reference provider's `get` with an endpoint is one `GET /instances/<name>`.
    let (call_task, polled_on, answer) = recorded_call(Request::Get {
        config: r#"{"endpoint":"https://backend.test"}"#.into(),
        provider_id: "ref/web".into(),
    })
    .await;

    let error = answer.expect_err("the backend answered 404");
    assert_eq!(error.class(), ErrorClass::NotFound, "{error}");
    assert_eq!(
        polled_on,
        [Some(call_task)],
        "the one request was polled by the call's own task"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_with_content_length_0_is_sent_from_the_task_that_runs_the_call_too() {
    // The reference provider's `delete` with an endpoint is one `DELETE /instances/<name>`,
    // which the guest crate sends with `content-length: 0` and no body (a 404 is success).
    let (call_task, polled_on, answer) = recorded_call(Request::Delete {
        config: r#"{"endpoint":"https://backend.test"}"#.into(),
        provider_id: "ref/web".into(),
    })
    .await;

    answer.expect("deleting what is gone succeeds");
    assert_eq!(polled_on, [Some(call_task)]);
}

#[tokio::test]
async fn a_guest_asking_for_its_response_without_waiting_moves_its_request_on() {
    let answers_when_asked_again = Recording {
        pending_once: true,
        ..Recording::default()
    };
    let hostile = runtime_over(Arc::new(answers_when_asked_again))
        .load_file(&component_path("hostile"))
        .await
        .unwrap();
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
