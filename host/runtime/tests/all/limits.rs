//! A misbehaving guest is stopped (deadline, memory cap, trap, panic) without hurting other calls;
//! concurrency is bounded by back-pressure.

use std::time::{Duration, Instant};

use egress_runtime::{
    CallContext, CallError, ErrorClass, Limits, Operation, Request, Response, Runtime,
};

use crate::common::{component_path, get_web, misbehave, runtime_with, test_limits};

/// The spinning guest's deadline. The concurrent call gets the thread only between the spinner's
/// 10 ms slices; with the test binary's compiles taking both cores, 1 s was once not enough for it
/// to finish first (CI).
const SPIN_DEADLINE: Duration = Duration::from_secs(5);

/// A spinning guest runs into its deadline while a reference call, started once the spin is
/// under way, completes first.
pub(crate) async fn spinning_guest_is_stopped_while_another_call_completes(
    runtime_with: impl Fn(Limits) -> Runtime,
) {
    let runtime = runtime_with(test_limits().deadline(Operation::Get, SPIN_DEADLINE));
    let spinner = runtime
        .load_file(&component_path("misbehave"))
        .await
        .unwrap();
    let reference = runtime
        .load_file(&component_path("reference"))
        .await
        .unwrap();

    let spin = tokio::spawn(async move {
        let result = spinner
            .call(misbehave("spin"), &CallContext::default())
            .await;
        (result, Instant::now())
    });
    // Let the spin start. On a current-thread runtime the spinner now has the only thread: this
    // task runs again before the deadline only if the spinning guest yields it. (A yield, not a
    // sleep: the timer driver is only checked every few dozen task polls.)
    tokio::task::yield_now().await;
    let concurrent = reference.call(get_web(), &CallContext::default()).await;
    let concurrent_done = Instant::now();

    let (spin_result, spin_done) = spin.await.unwrap();
    assert!(matches!(concurrent, Ok(Response::Get(_))), "{concurrent:?}");
    match spin_result {
        Err(
            error @ CallError::Deadline {
                operation: Operation::Get,
                after,
            },
        ) => {
            assert_eq!(after, SPIN_DEADLINE);
            assert_eq!(error.class(), ErrorClass::Transient);
        }
        other => panic!("expected the deadline, got {other:?}"),
    }
    assert!(
        concurrent_done < spin_done,
        "the concurrent call finished after the spinning one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_guest_is_stopped_at_its_deadline_on_a_multi_thread_runtime() {
    spinning_guest_is_stopped_while_another_call_completes(runtime_with).await;
}

#[tokio::test(flavor = "current_thread")]
async fn spinning_guest_yields_its_thread_on_a_current_thread_runtime() {
    spinning_guest_is_stopped_while_another_call_completes(runtime_with).await;
}

#[tokio::test]
async fn memory_bomb_is_stopped_at_its_cap() {
    let limits = test_limits().memory_bytes(16 << 20);
    let provider = runtime_with(limits)
        .load_file(&component_path("misbehave"))
        .await
        .unwrap();
    let error = provider
        .call(misbehave("grow"), &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(error, CallError::MemoryCap { limit } if limit == 16 << 20),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::Permanent);
}

#[tokio::test]
async fn a_trap_is_a_permanent_trap_error() {
    let provider = runtime_with(test_limits())
        .load_file(&component_path("misbehave"))
        .await
        .unwrap();
    let error = provider
        .call(misbehave("trap"), &CallContext::default())
        .await
        .unwrap_err();
    let CallError::Trap { message } = &error else {
        panic!("expected a trap, got {error:?}")
    };
    assert!(message.contains("unreachable"), "{message}");
    assert_eq!(error.class(), ErrorClass::Permanent);
}

#[tokio::test]
async fn a_panic_is_a_trap_carrying_the_panic_message() {
    let provider = runtime_with(test_limits())
        .load_file(&component_path("misbehave"))
        .await
        .unwrap();
    let error = provider
        .call(misbehave("panic"), &CallContext::default())
        .await
        .unwrap_err();
    let CallError::Trap { message } = &error else {
        panic!("expected a trap, got {error:?}")
    };
    assert!(message.contains("deliberate panic"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_concurrency_bound_wait_their_turn() {
    let limits = test_limits().concurrency_per_provider(1);
    let provider = runtime_with(limits)
        .load_file(&component_path("misbehave"))
        .await
        .unwrap();
    let sleep = || Request::Get {
        config: r#"{"mode": "sleep", "ms": 300}"#.into(),
        provider_id: "x".into(),
    };
    let started = Instant::now();
    let context = CallContext::default();
    let (first, second) = tokio::join!(
        provider.call(sleep(), &context),
        provider.call(sleep(), &context)
    );
    assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
    // One permit: the second sleep could only start once the first ended.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "ran concurrently: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_never_gets_a_permit_is_busy_not_stuck() {
    let limits: Limits = test_limits()
        .concurrency_per_provider(1)
        .deadline(Operation::Create, Duration::from_secs(5))
        .deadline(Operation::Get, Duration::from_millis(300));
    let provider = runtime_with(limits)
        .load_file(&component_path("misbehave"))
        .await
        .unwrap();
    let holder = {
        let provider = provider.clone();
        tokio::spawn(async move {
            let request = Request::Create {
                request: egress_runtime::CreateRequest {
                    name: "holder".into(),
                    uid: String::new(),
                    tags: Vec::new(),
                    user_data: String::new(),
                    config: r#"{"mode": "sleep", "ms": 1500}"#.into(),
                    placement: None,
                },
            };
            provider.call(request, &CallContext::default()).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let error = provider
        .call(misbehave("ok"), &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            CallError::Busy {
                operation: Operation::Get,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::Transient);
    assert!(holder.await.unwrap().is_ok());
}
