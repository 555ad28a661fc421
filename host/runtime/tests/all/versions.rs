//! Contract versions served side by side: every 0.1.0 component loads unchanged, a 0.2.0
//! component works through the same runtime, patch releases are served by their minor, and
//! anything outside the window is refused naming it.

use std::path::Path;

use egress_runtime::{
    CallContext, CheckReason, CreateRequest, LoadError, Request, Response, Runtime,
};

use crate::common::{component_bytes, component_path, runtime};

async fn load(runtime: &Runtime, name: &str) -> std::sync::Arc<egress_runtime::Provider> {
    runtime
        .load_file(&component_path(name))
        .await
        .unwrap_or_else(|error| panic!("{name} loads: {error}"))
}

#[tokio::test]
async fn every_0_1_0_component_loads_unchanged_and_needs_what_it_imports() {
    let runtime = runtime();
    for (name, capabilities) in [
        ("reference", &["http"][..]),
        ("misbehave", &[][..]),
        ("hostile", &["http"][..]),
    ] {
        let provider = load(&runtime, name).await;
        assert_eq!(provider.contract_version().to_string(), "0.1.0", "{name}");
        assert_eq!(provider.capabilities(), capabilities, "{name}");
        assert_eq!(provider.description().contract_version, "0.1.0");
        let response = provider
            .call(Request::Describe, &CallContext::default())
            .await
            .unwrap_or_else(|error| panic!("{name} describes itself: {error}"));
        assert_eq!(response, Response::Describe(provider.description().clone()));
    }
}

#[tokio::test]
async fn the_proxmox_provider_speaks_0_2_0_for_its_paused_state() {
    // The paused state (issue 32) exists only in 0.2.0, so the Proxmox provider moved up;
    // the Python Proxmox provider stays on 0.1.0 (tests/python_proxmox.rs).
    let provider = load(&runtime(), "proxmox").await;
    assert_eq!(provider.contract_version().to_string(), "0.2.0");
    assert_eq!(provider.description().contract_version, "0.2.0");
    assert_eq!(provider.capabilities(), ["http"]);
}

#[tokio::test]
async fn a_0_2_0_component_works_through_the_same_runtime() {
    let runtime = runtime();
    let provider = load(&runtime, "contract-v2").await;
    assert_eq!(provider.contract_version().to_string(), "0.2.0");
    assert_eq!(provider.description().contract_version, "0.2.0");
    assert!(
        provider.description().capabilities.is_empty(),
        "0.2.0 declares none"
    );
    assert_eq!(provider.capabilities(), ["http"], "read from its imports");
    let imports = provider.imports();
    assert!(
        imports.contains(&"egress:log/log@0.1.0".to_owned()),
        "{imports:?}"
    );
    assert!(
        !imports
            .iter()
            .any(|import| import.starts_with("egress:libvirt")),
        "an HTTP-only provider does not import libvirt: {imports:?}"
    );
    assert!(
        provider
            .exports()
            .contains(&"egress:provider/provider@0.2.0#list-by-tag".to_owned())
    );

    let ctx = CallContext::default();
    let request = CreateRequest {
        name: "web".into(),
        uid: "uid-1".into(),
        tags: Vec::new(),
        user_data: String::new(),
        config: "{}".into(),
        placement: None,
    };
    match provider
        .call(
            Request::Create {
                request: request.clone(),
            },
            &ctx,
        )
        .await
    {
        Ok(Response::Create(vm)) => {
            assert_eq!(vm.provider_id, "v2/web");
            assert_eq!(vm.uid, "uid-1");
            assert_eq!(
                vm.host.as_deref(),
                Some("host-a"),
                "no request: the first host"
            );
        }
        other => panic!("create answers the VM: {other:?}"),
    }
    // A pool's placement request reaches the guest, and the host it chose comes back.
    let placed = |avoid: &[&str], required| {
        let mut request = request.clone();
        request.placement = Some(egress_runtime::types::Placement {
            avoid_hosts: avoid.iter().map(|host| host.to_string()).collect(),
            required,
        });
        Request::Create { request }
    };
    match provider.call(placed(&["host-a"], true), &ctx).await {
        Ok(Response::Create(vm)) => assert_eq!(vm.host.as_deref(), Some("host-b")),
        other => panic!("create answers the VM: {other:?}"),
    }
    let every = ["host-a", "host-b", "host-c"];
    let shortage = provider.call(placed(&every, true), &ctx).await.unwrap_err();
    assert_eq!(
        shortage.class(),
        egress_runtime::ErrorClass::QuotaExceeded,
        "{shortage}"
    );
    let get = Request::Get {
        config: "{}".into(),
        provider_id: "other/1".into(),
    };
    let error = provider.call(get, &ctx).await.unwrap_err();
    assert_eq!(
        error.class(),
        egress_runtime::ErrorClass::NotFound,
        "{error}"
    );
}

#[tokio::test]
async fn a_0_2_0_guest_learns_why_the_host_refused_as_a_value() {
    // The runtime's default egress grants nothing: the guest sees `HTTP-request-denied` and,
    // asking the broker interface, `not-granted`.
    let provider = load(&runtime(), "contract-v2").await;
    let check = Request::Check {
        config: r#"{"endpoint":"https://192.0.2.1:8006"}"#.into(),
    };
    match provider.call(check, &CallContext::default()).await {
        Ok(Response::Check(result)) => {
            assert_eq!(result.reason, CheckReason::Forbidden, "{result:?}");
            assert!(
                result
                    .message
                    .starts_with("refusal: not-granted; error code: ")
                    && result.message.ends_with("HttpRequestDenied"),
                "{result:?}"
            );
        }
        other => panic!("check answers: {other:?}"),
    }
}

/// `bytes` with every `from` replaced by `to` (same length, so the binary stays valid).
fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> (Vec<u8>, usize) {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut count = 0;
    let mut at = 0;
    while let Some(found) = out[at..].windows(from.len()).position(|w| w == from) {
        let start = at + found;
        out[start..start + to.len()].copy_from_slice(to);
        at = start + to.len();
        count += 1;
    }
    (out, count)
}

#[tokio::test]
async fn a_patch_release_of_a_served_minor_is_served_by_that_minor() {
    // The reference provider as if built against a 0.1.1 contract: its interface names
    // (`…@0.1.1`) and its `contract-version` say 0.1.1.
    let (bytes, replaced) = replace_all(&component_bytes("reference"), b"0.1.0", b"0.1.1");
    assert!(replaced > 3, "{replaced}");
    let provider = runtime()
        .load_bytes("reference", &bytes, Path::new("reference-0.1.1.wasm"))
        .await
        .expect("a patch release loads");
    assert_eq!(provider.contract_version().to_string(), "0.1.1");
    assert!(
        provider
            .exports()
            .contains(&"egress:provider/provider@0.1.1".to_owned())
    );
    let create = Request::Create {
        request: CreateRequest {
            name: "web".into(),
            uid: "uid-1".into(),
            tags: Vec::new(),
            user_data: String::new(),
            config: "{}".into(),
            placement: None,
        },
    };
    let response = provider.call(create, &CallContext::default()).await;
    assert!(matches!(response, Ok(Response::Create(_))), "{response:?}");
}

#[tokio::test]
async fn a_version_outside_the_window_is_refused_naming_it() {
    // 0.1.0 → 0.3.0 and 0.0.9: just outside the window on either side.
    for (to, exported) in [(&b"0.3.0"[..], "0.3.0"), (&b"0.0.9"[..], "0.0.9")] {
        let (bytes, _) = replace_all(&component_bytes("misbehave"), b"0.1.0", to);
        let path = Path::new("/providers/outside.wasm");
        let error = runtime()
            .load_bytes("outside", &bytes, path)
            .await
            .expect_err("refused");
        assert!(
            matches!(error, LoadError::UnsupportedContract { .. }),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "/providers/outside.wasm: exports egress:provider/provider@{exported}; this host serves contract versions >=0.1.0, <0.3.0"
            )
        );
    }
}

#[tokio::test]
async fn describe_must_name_the_exported_version() {
    // Only the export says 0.1.1; `describe` still says 0.1.0.
    let (bytes, _) = replace_all(
        &component_bytes("misbehave"),
        b"provider/provider@0.1.0",
        b"provider/provider@0.1.1",
    );
    let error = runtime()
        .load_bytes("misbehave", &bytes, Path::new("m.wasm"))
        .await
        .expect_err("refused");
    assert!(
        matches!(error, LoadError::InvalidDescription { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().ends_with(
            "contract-version is `0.1.0` but the component exports egress:provider/provider@0.1.1"
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_component_importing_libvirt_is_refused_by_a_host_without_it() {
    let path = component_path("libvirt-probe");
    let error = runtime()
        .load_bytes("libvirt-probe", &component_bytes("libvirt-probe"), &path)
        .await
        .expect_err("no libvirt capability here");
    assert!(
        matches!(error, LoadError::UnknownImport { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "{}: imports egress:libvirt/libvirt@0.1.0, which this host does not provide",
            path.display()
        )
    );
}
