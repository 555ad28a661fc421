//! The capability wired into the real runtime, driven by a real component: `libvirt-probe`
//! (contract 0.2.0, imports `egress:libvirt/libvirt`) against the test driver. A granted provider
//! opens its connection; a provider without a grant, or with a grant pinned to other bytes, is
//! denied every call; libvirt's handles count against the call's handle budget.

use std::path::PathBuf;
use std::sync::Arc;

use egress_capability_libvirt::LibvirtCapability;
use egress_runtime::{
    Budget, CallContext, CallError, CheckReason, CheckResult, Limits, Provider, Request, Response,
    Runtime, RuntimeConfig,
};

use crate::support::*;

fn probe_path() -> PathBuf {
    testkit::component("libvirt-probe")
}

fn limits() -> Limits {
    Limits::default().max_concurrent_instances(4)
}

fn runtime(capability: LibvirtCapability, limits: Limits) -> Runtime {
    let config = RuntimeConfig::default()
        .cache_dir(None)
        .limits(limits)
        .capability(Arc::new(capability));
    Runtime::new(config).expect("runtime builds")
}

async fn check(provider: &Provider, config: serde_json::Value) -> Result<CheckResult, CallError> {
    let request = Request::Check {
        config: config.to_string(),
    };
    match provider.call(request, &CallContext::default()).await? {
        Response::Check(result) => Ok(result),
        other => panic!("check answered {other:?}"),
    }
}

#[tokio::test]
async fn a_granted_provider_opens_its_connection_through_the_runtime() {
    let node = TestNode::new();
    let runtime = runtime(capability("libvirt-probe", node.grant()), limits());
    assert_eq!(runtime.capabilities(), ["http", "libvirt"]);
    let provider = runtime.load_file(&probe_path()).await.unwrap();
    assert_eq!(provider.contract_version().to_string(), "0.2.0");
    assert_eq!(provider.capabilities(), ["libvirt"]);

    let result = check(&provider, serde_json::json!({"connection": "node"}))
        .await
        .unwrap();
    assert_eq!(result.reason, CheckReason::Ok, "{result:?}");
    assert!(result.message.starts_with("libvirt "), "{result:?}");

    // A connection the grant does not name.
    let result = check(&provider, serde_json::json!({"connection": "elsewhere"}))
        .await
        .unwrap();
    assert_eq!(result.reason, CheckReason::Forbidden, "{result:?}");
}

#[tokio::test]
async fn a_provider_without_a_libvirt_grant_is_denied_every_call() {
    let node = TestNode::new();
    let runtime = runtime(capability("libvirt-probe", node.grant()), limits());
    let loaded = runtime.load_file(&probe_path()).await.unwrap();
    let other = loaded.bind("someone-else", limits()).unwrap();
    let result = check(&other, serde_json::json!({"connection": "node"}))
        .await
        .unwrap();
    assert_eq!(result.reason, CheckReason::Forbidden, "{result:?}");
    assert!(
        result.message.contains("no libvirt grant"),
        "the ungranted context: {result:?}"
    );
}

#[tokio::test]
async fn a_grant_pinned_to_other_bytes_is_denied_every_call() {
    let node = TestNode::new();
    let mut grant = node.grant();
    grant["digest"] = serde_json::json!(format!("sha256:{}", "0".repeat(64)));
    let runtime = runtime(capability("libvirt-probe", grant), limits());
    let provider = runtime.load_file(&probe_path()).await.unwrap();
    let result = check(&provider, serde_json::json!({"connection": "node"}))
        .await
        .unwrap();
    assert_eq!(result.reason, CheckReason::Forbidden, "{result:?}");

    let mut pinned = node.grant();
    pinned["digest"] = serde_json::json!(provider.component_digest().to_string());
    let runtime = self::runtime(capability("libvirt-probe", pinned), limits());
    let provider = runtime.load_file(&probe_path()).await.unwrap();
    let result = check(&provider, serde_json::json!({"connection": "node"}))
        .await
        .unwrap();
    assert_eq!(result.reason, CheckReason::Ok, "its own bytes: {result:?}");
}

#[tokio::test]
async fn libvirt_handles_count_against_the_call_handle_budget() {
    let node = TestNode::new();
    let limits = limits().resource_handles(32);
    let runtime = runtime(capability("libvirt-probe", node.grant()), limits);
    let provider = runtime.load_file(&probe_path()).await.unwrap();
    let error = check(
        &provider,
        serde_json::json!({"connection": "node", "hold": 40}),
    )
    .await
    .expect_err("over the handle budget");
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::ResourceHandles,
                ..
            }
        ),
        "{error:?}"
    );
}
