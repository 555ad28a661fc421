//! A hostile guest cannot make the host hold more than its budgets, and each budget it breaks
//! stops its call with that budget's own error (the `hostile` and `misbehave` test components).

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_runtime::{
    Budget, CallContext, CallError, CreateRequest, ErrorClass, Limits, Operation, Provider,
    Request, Response,
};

use egress_runtime::Runtime;

use crate::common::{component_bytes, component_path, hostile_get, runtime_with, test_limits};

async fn hostile(limits: Limits) -> Arc<Provider> {
    runtime_with(limits)
        .load_file(&component_path("hostile"))
        .await
        .unwrap()
}

/// The call's error, which must be the `budget` one, permanent, with its limit in the message.
async fn budget_error(provider: &Provider, request: Request, budget: Budget) -> CallError {
    let error = provider
        .call(request, &CallContext::default())
        .await
        .unwrap_err();
    match &error {
        CallError::Budget { budget: hit, .. } if *hit == budget => {}
        other => panic!("expected the {budget} budget, got {other:?}"),
    }
    assert_eq!(error.class(), ErrorClass::Permanent);
    error
}

#[tokio::test]
async fn a_flood_of_header_lists_stops_at_the_handle_budget() {
    let limits = test_limits().resource_handles(64);
    let provider = hostile(limits).await;
    // A thousand: past the budget, far below wasmtime's own default of 100 000.
    let request =
        hostile_get(serde_json::json!({"attack": "headers", "count": 1000, "bytes": 1024}));
    let error = budget_error(&provider, request, Budget::ResourceHandles).await;
    assert!(
        error.to_string().contains("more than 64 host resources"),
        "{error}"
    );
}

#[tokio::test]
async fn an_oversized_header_list_stops_at_the_header_budget() {
    let provider = hostile(test_limits().header_bytes(16 << 10)).await;
    let request =
        hostile_get(serde_json::json!({"attack": "headers", "count": 1, "bytes": 100_000}));
    let error = budget_error(&provider, request, Budget::HeaderBytes).await;
    assert!(error.to_string().contains("16384 bytes"), "{error}");
    // Under the budget, the same attack is just a provider holding a few lists.
    let request = hostile_get(serde_json::json!({"attack": "headers", "count": 4, "bytes": 1000}));
    let answer = provider.call(request, &CallContext::default()).await;
    assert!(
        matches!(&answer, Err(CallError::Provider(error)) if error.message() == "held 4"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn results_larger_than_the_transfer_budget_are_never_copied_out() {
    let provider = hostile(test_limits().transfer_bytes(1 << 20)).await;
    for attack in ["big-error", "big-name"] {
        let request = hostile_get(serde_json::json!({"attack": attack, "mib": 20}));
        let error = budget_error(&provider, request, Budget::TransferBytes).await;
        assert!(
            error.to_string().contains("1048576 bytes"),
            "{attack}: {error}"
        );
    }
    // 120 names that alias one 1 MiB string: 120 MiB to copy, refused at the first MiB.
    let request = Request::ListByTag {
        config: serde_json::json!({"attack": "aliases", "count": 120, "mib": 1}).to_string(),
        key: "k".into(),
        value: "v".into(),
    };
    budget_error(&provider, request, Budget::TransferBytes).await;
}

#[tokio::test]
async fn a_long_error_message_under_the_budget_is_cut_and_escaped() {
    let provider = hostile(test_limits()).await;
    let request = hostile_get(serde_json::json!({"attack": "big-error", "mib": 2}));
    let Err(CallError::Provider(error)) = provider.call(request, &CallContext::default()).await
    else {
        panic!("a provider error")
    };
    assert!(error.message().len() < 4200, "{}", error.message().len());
    assert!(
        error.message().ends_with("more bytes cut)"),
        "{}",
        &error.message()[4000..]
    );
}

#[tokio::test]
async fn a_log_flood_stops_at_the_line_budget() {
    let provider = hostile(test_limits().log_lines(100)).await;
    let request = hostile_get(serde_json::json!({"attack": "log-flood", "lines": 1_000_000}));
    let started = Instant::now();
    let error = budget_error(&provider, request, Budget::LogLines).await;
    assert!(
        error.to_string().contains("more than 100 log lines"),
        "{error}"
    );
    // Stopped at line 101, not after a million.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Within the budget the same guest logs and answers.
    let request = hostile_get(serde_json::json!({"attack": "log-flood", "lines": 50}));
    let answer = provider.call(request, &CallContext::default()).await;
    assert!(
        matches!(answer, Ok(Response::Get(ref vm)) if vm.name == "flooded"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_huge_log_message_is_refused_before_it_is_copied() {
    let provider = hostile(test_limits().transfer_bytes(1 << 20)).await;
    let request = hostile_get(serde_json::json!({"attack": "log-huge", "mib": 40}));
    budget_error(&provider, request, Budget::TransferBytes).await;
    // Within one transfer it is read lazily, 4 KiB kept (see logs.rs), and the call goes on.
    let provider = hostile(test_limits()).await;
    let request = hostile_get(serde_json::json!({"attack": "log-huge", "mib": 2}));
    let answer = provider.call(request, &CallContext::default()).await;
    assert!(
        matches!(answer, Ok(Response::Get(ref vm)) if vm.name == "logged"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn log_bytes_are_budgeted_as_kept() {
    let provider = hostile(test_limits().log_bytes(4 << 10).log_lines(100_000)).await;
    // A 1 MiB message keeps 4 KiB: exactly the budget.
    let request = hostile_get(serde_json::json!({"attack": "log-huge", "mib": 1}));
    assert!(
        provider
            .call(request, &CallContext::default())
            .await
            .is_ok()
    );
    // A thousand short lines keep more than 4 KiB.
    let request = hostile_get(serde_json::json!({"attack": "log-flood", "lines": 1000}));
    let error = budget_error(&provider, request, Budget::LogBytes).await;
    assert!(
        error.to_string().contains("more than 4096 bytes of log"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_computing_guest_is_stopped_at_its_cpu_budget_long_before_its_deadline() {
    computing_guest_is_stopped_at_its_cpu_budget(runtime_with).await;
}

/// The CPU budget on a runtime made by `runtime_with` (also run on Winch's code: `tiering.rs`).
pub(crate) async fn computing_guest_is_stopped_at_its_cpu_budget(
    runtime_with: impl Fn(Limits) -> Runtime,
) {
    // A wall deadline a hundred times the CPU budget (the default is fifteen minutes; shorter
    // here so that a broken CPU budget fails this test in a minute rather than hanging it).
    let limits = test_limits()
        .cpu_time(Operation::Create, Duration::from_millis(300))
        .deadline(Operation::Create, Duration::from_secs(30));
    let provider = runtime_with(limits)
        .load_file(&component_path("misbehave"))
        .await
        .unwrap();
    let create = |config: &str| Request::Create {
        request: CreateRequest {
            name: "spinner".into(),
            uid: "u".into(),
            tags: Vec::new(),
            user_data: String::new(),
            config: config.into(),
            placement: None,
        },
    };
    let started = Instant::now();
    let error = provider
        .call(create(r#"{"mode": "spin"}"#), &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::CpuTime,
                limit: 300,
                operation: Operation::Create
            }
        ),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );

    // Waiting is not computing: a create that sleeps three times its CPU budget succeeds.
    let waited = provider
        .call(
            create(r#"{"mode": "sleep", "ms": 900}"#),
            &CallContext::default(),
        )
        .await;
    assert!(matches!(waited, Ok(Response::Create(_))), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_across_more_providers_than_instance_slots_waits_instead_of_failing() {
    // Two instance slots, six providers of up to eight calls each: eighteen calls at once.
    let limits = test_limits().max_concurrent_instances(2);
    let runtime = runtime_with(limits);
    let bytes = component_bytes("misbehave");
    let mut providers = Vec::new();
    for index in 0..6 {
        let identity = format!("misbehave-{index}");
        let provider = runtime
            .load_bytes(&identity, &bytes, &component_path("misbehave"))
            .await
            .unwrap();
        providers.push(provider);
    }
    let sleep = Request::Get {
        config: r#"{"mode": "sleep", "ms": 50}"#.into(),
        provider_id: "x".into(),
    };
    let mut calls = Vec::new();
    for provider in &providers {
        for _ in 0..3 {
            let (provider, request) = (Arc::clone(provider), sleep.clone());
            calls.push(tokio::spawn(async move {
                provider.call(request, &CallContext::default()).await
            }));
        }
    }
    for call in calls {
        let result = call.await.unwrap();
        assert!(matches!(result, Ok(Response::Get(_))), "{result:?}");
    }
}

#[tokio::test]
async fn an_unsent_body_is_buffered_only_up_to_its_budget() {
    let provider = hostile(test_limits().body_buffer_bytes(16 << 10)).await;
    let request = hostile_get(serde_json::json!({"attack": "bodies", "count": 10}));
    let answer = provider.call(request, &CallContext::default()).await;
    let Err(CallError::Provider(error)) = answer else {
        let other = answer;
        panic!("the attack's own answer, got {other:?}")
    };
    let buffered: u64 = error
        .message()
        .strip_prefix("buffered ")
        .and_then(|rest| rest.strip_suffix(" in 10"))
        .and_then(|bytes| bytes.parse().ok())
        .unwrap_or_else(|| panic!("{}", error.message()));
    // At most two chunks of 16 KiB per body, and something was buffered.
    assert!(
        buffered > 0 && buffered <= 10 * 2 * (16 << 10),
        "{buffered}"
    );
    // Enough bodies run into the handle budget.
    let request = hostile_get(serde_json::json!({"attack": "bodies", "count": 100_000}));
    budget_error(&provider, request, Budget::ResourceHandles).await;
}
