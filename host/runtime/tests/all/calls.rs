//! Every operation of the reference provider, and each error class it can be asked to fail with.

use egress_runtime::{
    CallContext, CallError, CheckReason, CreateRequest, ErrorClass, ProviderError, Request,
    Response, Tag, VmState,
};

use crate::common::{component_path, runtime};

fn ctx() -> CallContext {
    CallContext {
        subject: Some("default/egress".into()),
        ..CallContext::default()
    }
}

#[tokio::test]
async fn reference_loads_and_describes_itself() {
    let runtime = runtime();
    let provider = runtime
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let description = provider.description();
    assert_eq!(description.name, "reference");
    assert_eq!(description.contract_version, "0.1.0");
    assert_eq!(provider.identity(), "reference");
    assert_eq!(provider.path(), component_path("reference"));
    assert_eq!(provider.component_digest().hex().len(), 64);
    assert!(
        provider
            .exports()
            .contains(&"egress:provider/provider@0.1.0".to_owned())
    );
    for operation in [
        "describe",
        "validate-config",
        "create",
        "get",
        "delete",
        "list-by-tag",
        "check",
    ] {
        let function = format!("egress:provider/provider@0.1.0#{operation}");
        assert!(
            provider.exports().contains(&function),
            "{function} missing: {:?}",
            provider.exports()
        );
    }
    assert!(
        provider
            .imports()
            .contains(&"wasi:http/outgoing-handler@0.2.12".to_owned()),
        "{:?}",
        provider.imports()
    );

    let response = provider.call(Request::Describe, &ctx()).await.unwrap();
    assert_eq!(response, Response::Describe(description.clone()));
}

#[tokio::test]
async fn validate_config_accepts_a_good_config_and_rejects_a_bad_one() {
    let provider = runtime()
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let good = Request::ValidateConfig {
        config: r#"{"delayMs": 1}"#.into(),
    };
    assert_eq!(
        provider.call(good, &ctx()).await.unwrap(),
        Response::ValidateConfig
    );

    let bad = Request::ValidateConfig {
        config: r#"{"nope": 1}"#.into(),
    };
    match provider.call(bad, &ctx()).await {
        Err(CallError::Provider(ProviderError::Permanent(message))) => {
            assert!(message.contains("unknown key `nope`"), "{message}")
        }
        other => panic!("expected a permanent provider error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_delete_list_and_check_answer() {
    let provider = runtime()
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let create = Request::Create {
        request: CreateRequest {
            name: "web".into(),
            uid: "uid-1".into(),
            tags: vec![Tag {
                key: "owner".into(),
                value: "egress".into(),
            }],
            user_data: "#cloud-config\n".into(),
            config: "{}".into(),
            placement: None,
        },
    };
    let Response::Create(created) = provider.call(create, &ctx()).await.unwrap() else {
        panic!("create answered another operation")
    };
    assert_eq!(created.provider_id, "ref/web");
    assert_eq!(created.name, "web");
    assert_eq!(created.state, VmState::Running);
    assert_eq!(created.uid, "uid-1");
    assert_eq!(created.addresses.len(), 1);
    assert!(created.created_at.is_some());

    let get = Request::Get {
        config: "{}".into(),
        provider_id: "ref/web".into(),
    };
    let Response::Get(got) = provider.call(get, &ctx()).await.unwrap() else {
        panic!("get answered another operation")
    };
    assert_eq!((got.name.as_str(), got.state), ("web", VmState::Running));

    let missing = Request::Get {
        config: "{}".into(),
        provider_id: "ref/missing-web".into(),
    };
    let error = provider.call(missing, &ctx()).await.unwrap_err();
    assert!(
        matches!(error, CallError::Provider(ProviderError::NotFound(_))),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::NotFound);

    let delete = Request::Delete {
        config: "{}".into(),
        provider_id: "ref/web".into(),
    };
    assert_eq!(
        provider.call(delete, &ctx()).await.unwrap(),
        Response::Delete
    );

    let list = Request::ListByTag {
        config: "{}".into(),
        key: "owner".into(),
        value: "egress".into(),
    };
    assert_eq!(
        provider.call(list, &ctx()).await.unwrap(),
        Response::ListByTag(egress_runtime::types::Listing::default())
    );

    let check = Request::Check {
        config: "{}".into(),
    };
    let Response::Check(result) = provider.call(check, &ctx()).await.unwrap() else {
        panic!("check answered another operation")
    };
    assert_eq!(result.reason, CheckReason::Ok);
    let misconfigured = Request::Check {
        config: "[]".into(),
    };
    let Response::Check(result) = provider.call(misconfigured, &ctx()).await.unwrap() else {
        panic!("check answered another operation")
    };
    assert_eq!(result.reason, CheckReason::Misconfigured);
}

#[tokio::test]
async fn each_error_class_reaches_the_host_with_its_class() {
    let provider = runtime()
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let classes = [
        ("transient", ErrorClass::Transient),
        ("permanent", ErrorClass::Permanent),
        ("not-found", ErrorClass::NotFound),
        ("quota-exceeded", ErrorClass::QuotaExceeded),
    ];
    for (fail_with, class) in classes {
        let config = format!(r#"{{"failWith": "{fail_with}"}}"#);
        let request = Request::Get {
            config,
            provider_id: "ref/web".into(),
        };
        match provider.call(request, &ctx()).await {
            Err(error @ CallError::Provider(_)) => assert_eq!(error.class(), class, "{error}"),
            other => panic!("failWith {fail_with}: expected a provider error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_component_bound_to_another_identity_serves_under_it_with_its_own_limits() {
    use std::time::Duration;
    let runtime = crate::common::runtime();
    let file = runtime
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    let limits = crate::common::test_limits()
        .memory_bytes(1 << 40)
        .deadline(egress_runtime::Operation::Get, Duration::from_secs(2));
    let bound = file.bind("tenant-a", limits).unwrap();
    assert_eq!(bound.identity(), "tenant-a");
    assert_eq!(file.identity(), "reference");
    assert_eq!(bound.component_digest(), file.component_digest());
    assert_eq!(bound.load_generation(), file.load_generation());
    // The memory cap is clamped to the pool's slot; the deadline is the binding's own.
    assert_eq!(
        bound.limits().memory_bytes_limit(),
        runtime.slot_memory_bytes()
    );
    assert_eq!(
        bound.limits().deadline_for(egress_runtime::Operation::Get),
        Duration::from_secs(2)
    );
    let request = Request::Get {
        config: "{}".into(),
        provider_id: "ref/web".into(),
    };
    let answer = bound.call(request, &CallContext::default()).await;
    assert!(matches!(answer, Ok(Response::Get(_))), "{answer:?}");
    let error = file
        .bind("Tenant A", crate::common::test_limits())
        .unwrap_err();
    assert!(error.to_string().contains("not 1-63 characters"), "{error}");
}
