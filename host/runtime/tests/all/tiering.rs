//! Tiered compilation: a component missing from the cache serves from Winch's code at once and
//! moves to Cranelift's when the background compile is done; and every per-call bound holds on
//! Winch's code as on Cranelift's (a guest chooses nothing here, so a hostile one gets no looser
//! sandbox by arriving as a new file).

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_runtime::{
    Budget, CallContext, CallError, Compilation, DenyAll, ErrorClass, Limits, Operation, Provider,
    Request, Response, Runtime, RuntimeConfig, Tier,
};

use crate::common::{component_bytes, component_path, test_limits, with_custom_section};

/// A runtime compiling as `compilation`, caching in `cache`.
fn runtime(compilation: Compilation, limits: Limits, cache: Option<&std::path::Path>) -> Runtime {
    let config = RuntimeConfig::default()
        .limits(limits)
        .cache_dir(cache.map(ToOwned::to_owned))
        .compilation(compilation);
    Runtime::new(config, Arc::new(DenyAll)).expect("runtime builds")
}

/// The reference component under bytes no other test loads: a sure cache miss.
fn fresh_reference() -> Vec<u8> {
    let nonce = format!("{:?}", Instant::now());
    with_custom_section(&component_bytes("reference"), "tiering", nonce.as_bytes())
}

fn get() -> Request {
    Request::Get {
        config: "{}".into(),
        provider_id: "ref/web".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_component_serves_from_winch_then_from_cranelift_which_alone_is_cached() {
    let cache = tempfile::tempdir().unwrap();
    let tiered = runtime(Compilation::Tiered, test_limits(), Some(cache.path()));
    let bytes = fresh_reference();
    let path = component_path("reference");

    let provider = tiered.load_bytes("reference", &bytes, &path).await.unwrap();
    assert_eq!(provider.loaded_tier(), Tier::Baseline);
    assert!(!provider.from_cache());
    // A binding made before the optimized code arrives moves with the provider.
    let bound = provider.bind("bound", test_limits()).unwrap();
    let early = provider.call(get(), &CallContext::default()).await;
    assert!(matches!(early, Ok(Response::Get(_))), "{early:?}");

    assert_eq!(provider.optimized().await, Tier::Optimized);
    assert_eq!(bound.tier(), Tier::Optimized);
    let late = bound.call(get(), &CallContext::default()).await;
    assert_eq!(
        early.unwrap(),
        late.unwrap(),
        "the same answer from both tiers"
    );

    // The cache holds Cranelift's code: another runtime loads it optimized from the start.
    let again = runtime(Compilation::Tiered, test_limits(), Some(cache.path()))
        .load_bytes("reference", &bytes, &path)
        .await
        .unwrap();
    assert!(again.from_cache());
    assert_eq!(again.loaded_tier(), Tier::Optimized);
    assert_eq!(again.optimized().await, Tier::Optimized);
}

#[tokio::test]
async fn optimized_compilation_serves_cranelift_from_the_first_call() {
    let provider = runtime(Compilation::Optimized, test_limits(), None)
        .load_bytes(
            "reference",
            &fresh_reference(),
            &component_path("reference"),
        )
        .await
        .unwrap();
    assert_eq!(provider.loaded_tier(), Tier::Optimized);
    assert_eq!(provider.tier(), Tier::Optimized);
}

/// A runtime that compiles with Winch only, so that every call below runs Winch's code.
fn winch(limits: Limits) -> Runtime {
    runtime(Compilation::Baseline, limits, None)
}

async fn load(runtime: &Runtime, name: &str) -> Arc<Provider> {
    let provider = runtime.load_file(&component_path(name)).await.unwrap();
    assert_eq!(provider.tier(), Tier::Baseline);
    assert_eq!(provider.optimized().await, Tier::Baseline, "Winch only");
    provider
}

fn misbehave(mode: &str) -> Request {
    Request::Get {
        config: format!(r#"{{"mode": "{mode}"}}"#),
        provider_id: "x".into(),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn on_winch_a_spinning_guest_yields_its_thread_and_stops_at_its_deadline() {
    let runtime = winch(test_limits().deadline(Operation::Get, Duration::from_secs(1)));
    let spinner = load(&runtime, "misbehave").await;
    let reference = load(&runtime, "reference").await;
    let spin = tokio::spawn(async move {
        let result = spinner
            .call(misbehave("spin"), &CallContext::default())
            .await;
        (result, Instant::now())
    });
    // One thread: the reference call below runs before the spin ends only if Winch's code
    // checks the epoch and yields.
    tokio::task::yield_now().await;
    let concurrent = reference.call(get(), &CallContext::default()).await;
    let concurrent_done = Instant::now();
    let (spun, spin_done) = spin.await.unwrap();
    assert!(matches!(concurrent, Ok(Response::Get(_))), "{concurrent:?}");
    assert!(
        matches!(spun, Err(CallError::Deadline { after, .. }) if after == Duration::from_secs(1)),
        "{spun:?}"
    );
    assert!(concurrent_done < spin_done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_winch_a_computing_guest_stops_at_its_cpu_budget() {
    let limits = test_limits()
        .cpu_time(Operation::Get, Duration::from_millis(300))
        .deadline(Operation::Get, Duration::from_secs(30));
    let provider = load(&winch(limits), "misbehave").await;
    let error = provider
        .call(misbehave("spin"), &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::CpuTime,
                limit: 300,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn on_winch_a_memory_bomb_stops_at_its_cap_and_a_trap_is_a_trap() {
    let provider = load(&winch(test_limits().memory_bytes(16 << 20)), "misbehave").await;
    let bomb = provider
        .call(misbehave("grow"), &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(bomb, CallError::MemoryCap { limit } if limit == 16 << 20),
        "{bomb:?}"
    );
    let trap = provider
        .call(misbehave("trap"), &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&trap, CallError::Trap { message } if message.contains("unreachable")),
        "{trap:?}"
    );
    assert_eq!(trap.class(), ErrorClass::Permanent);
}

#[tokio::test]
async fn on_winch_the_transfer_and_handle_budgets_hold() {
    let limits = test_limits().transfer_bytes(1 << 20).resource_handles(64);
    let provider = load(&winch(limits), "hostile").await;
    let hostile = |attack: serde_json::Value| Request::Get {
        config: attack.to_string(),
        provider_id: "hostile/1".into(),
    };
    for (attack, budget) in [
        (
            serde_json::json!({"attack": "big-name", "mib": 20}),
            Budget::TransferBytes,
        ),
        (
            serde_json::json!({"attack": "headers", "count": 1000, "bytes": 10}),
            Budget::ResourceHandles,
        ),
    ] {
        let error = provider
            .call(hostile(attack.clone()), &CallContext::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, CallError::Budget { budget: hit, .. } if *hit == budget),
            "{attack}: {error:?}"
        );
    }
}
