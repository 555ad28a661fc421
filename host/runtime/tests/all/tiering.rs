//! Tiered compilation: a component missing from the cache serves from Winch's code at once and
//! moves to Cranelift's when the background compile is done; and every per-call bound holds on
//! Winch's code as on Cranelift's (a guest chooses nothing here, so a hostile one gets no looser
//! sandbox by arriving as a new file).

use std::sync::Arc;
use std::time::Instant;

use egress_runtime::{
    Budget, CallContext, CallError, Compilation, ErrorClass, Limits, Provider, Response, Runtime,
    RuntimeConfig, Tier,
};

use crate::common::{
    component_bytes, component_path, get_web, hostile_get, misbehave, test_limits,
    with_custom_section,
};

/// A runtime compiling as `compilation`, caching in `cache`.
fn runtime(compilation: Compilation, limits: Limits, cache: Option<&std::path::Path>) -> Runtime {
    let config = RuntimeConfig::default()
        .limits(limits)
        .cache_dir(cache.map(ToOwned::to_owned))
        .compilation(compilation);
    Runtime::new(config).expect("runtime builds")
}

/// The reference component under bytes no other test loads: a sure cache miss.
fn fresh_reference() -> Vec<u8> {
    let nonce = format!("{:?}", Instant::now());
    with_custom_section(&component_bytes("reference"), "tiering", nonce.as_bytes())
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
    let early = provider.call(get_web(), &CallContext::default()).await;
    assert!(matches!(early, Ok(Response::Get(_))), "{early:?}");

    assert_eq!(provider.optimized().await, Tier::Optimized);
    assert_eq!(bound.tier(), Tier::Optimized);
    let late = bound.call(get_web(), &CallContext::default()).await;
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

/// A runtime that compiles with Winch only and caches nothing, so that every call below runs
/// Winch's code.
fn winch(limits: Limits) -> Runtime {
    runtime(Compilation::Baseline, limits, None)
}

async fn load(runtime: &Runtime, name: &str) -> Arc<Provider> {
    let provider = runtime.load_file(&component_path(name)).await.unwrap();
    assert_eq!(provider.tier(), Tier::Baseline);
    assert_eq!(provider.optimized().await, Tier::Baseline, "Winch only");
    provider
}

#[tokio::test(flavor = "current_thread")]
async fn on_winch_a_spinning_guest_yields_its_thread_and_stops_at_its_deadline() {
    // One thread: the other call finishes first only if Winch's code checks the epoch and yields.
    crate::limits::spinning_guest_is_stopped_while_another_call_completes(winch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_winch_a_computing_guest_stops_at_its_cpu_budget() {
    crate::budgets::computing_guest_is_stopped_at_its_cpu_budget(winch).await;
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
            .call(hostile_get(attack.clone()), &CallContext::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, CallError::Budget { budget: hit, .. } if *hit == budget),
            "{attack}: {error:?}"
        );
    }
}
