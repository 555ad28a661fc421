//! The capability seam, with a capability made up for the test: `acme:exfil/upload`, which the
//! `bad-import` component imports (and which no real host has). Given to the runtime, it links;
//! each call gets the granted or the ungranted state of its identity; only components that import
//! it have it prepared; and the call's budgets bound what the guest hands it.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use egress_runtime::capability::import_matches;
use egress_runtime::grant::{GrantContext, GrantError, NoGrant};
use egress_runtime::{
    Budget, CallContext, CallError, Capability, CreateRequest, HostState, Limits, PrepareContext,
    Request, Response, Runtime, RuntimeConfig,
};
use wasmtime::StoreContextMut;
use wasmtime::component::Linker;

use crate::common::{component_bytes, component_path, shared_cache_dir, test_limits};

/// The test capability: counts the bytes granted providers upload, and how often it was prepared.
#[derive(Default)]
struct Exfil {
    granted: Vec<&'static str>,
    uploaded: Arc<AtomicUsize>,
    prepared: Arc<AtomicUsize>,
}

/// Its per-call state.
struct ExfilCall {
    granted: bool,
    uploaded: Arc<AtomicUsize>,
}

impl ExfilCall {
    fn ungranted(_deadline: std::time::Instant) -> Self {
        ExfilCall {
            granted: false,
            uploaded: Arc::default(),
        }
    }
}

impl Capability for Exfil {
    // Its grants are fixed when it is made.
    type Grant = NoGrant;

    fn name(&self) -> &'static str {
        "exfil"
    }

    fn set_grant(
        &self,
        _identity: &str,
        grant: &NoGrant,
        _context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        match *grant {}
    }

    fn remove_grant(&self, _identity: &str) {}

    fn provides(&self, import: &str) -> bool {
        import_matches(import, "acme:exfil/upload", "0.1.0")
    }

    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        linker.instance("acme:exfil/upload@0.1.0")?.func_wrap(
            "send",
            |mut store: StoreContextMut<'_, HostState>, (data,): (Vec<u8>,)| {
                let (call, _table) = store.data_mut().capability_state(ExfilCall::ungranted);
                if !call.granted {
                    return Err(wasmtime::Error::msg("exfil denied: no grant"));
                }
                call.uploaded.fetch_add(data.len(), Ordering::SeqCst);
                Ok(())
            },
        )
    }

    fn granted(&self, identity: &str) -> bool {
        self.granted.contains(&identity)
    }

    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn Any + Send> {
        self.prepared.fetch_add(1, Ordering::SeqCst);
        Box::new(ExfilCall {
            granted: self.granted(&call.site.provider),
            uploaded: Arc::clone(&self.uploaded),
        })
    }
}

fn runtime_with(exfil: Arc<Exfil>, limits: Limits) -> Runtime {
    let config = RuntimeConfig::default()
        .limits(limits)
        .cache_dir(Some(shared_cache_dir()))
        .capability(exfil);
    Runtime::new(config).expect("runtime builds")
}

fn create(user_data: String) -> Request {
    Request::Create {
        request: CreateRequest {
            name: "web".into(),
            uid: "uid-1".into(),
            tags: Vec::new(),
            user_data,
            config: "{}".into(),
            placement: None,
        },
    }
}

#[tokio::test]
async fn a_capability_given_to_the_runtime_serves_the_imports_it_provides() {
    let exfil = Arc::new(Exfil {
        granted: vec!["bad-import"],
        ..Exfil::default()
    });
    let runtime = runtime_with(Arc::clone(&exfil), test_limits());
    assert_eq!(runtime.capabilities(), ["http", "exfil"]);
    let provider = runtime
        .load_file(&component_path("bad-import"))
        .await
        .expect("the capability provides its import");
    assert_eq!(provider.capabilities(), ["exfil"]);
    let response = provider
        .call(create("hello".into()), &CallContext::default())
        .await;
    assert!(matches!(response, Ok(Response::Create(_))), "{response:?}");
    assert_eq!(exfil.uploaded.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn an_identity_without_a_grant_gets_the_ungranted_state() {
    let exfil = Arc::new(Exfil {
        granted: vec!["bad-import"],
        ..Exfil::default()
    });
    let runtime = runtime_with(Arc::clone(&exfil), test_limits());
    let loaded = runtime
        .load_file(&component_path("bad-import"))
        .await
        .unwrap();
    let other = loaded.bind("someone-else", test_limits()).unwrap();
    let error = other
        .call(create("hello".into()), &CallContext::default())
        .await
        .expect_err("denied");
    assert!(matches!(error, CallError::Trap { .. }), "{error:?}");
    assert!(error.to_string().contains("exfil denied"), "{error}");
    assert_eq!(exfil.uploaded.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn only_components_that_import_a_capability_have_it_prepared() {
    let exfil = Arc::new(Exfil::default());
    let runtime = runtime_with(Arc::clone(&exfil), test_limits());
    let reference = runtime
        .load_file(&component_path("reference"))
        .await
        .unwrap();
    assert_eq!(reference.capabilities(), ["http"]);
    reference
        .call(Request::Describe, &CallContext::default())
        .await
        .unwrap();
    assert_eq!(exfil.prepared.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_hostcall_budget_bounds_what_a_guest_hands_a_capability() {
    let exfil = Arc::new(Exfil {
        granted: vec!["bad-import"],
        ..Exfil::default()
    });
    let limits = test_limits().transfer_bytes(64 << 10);
    let runtime = runtime_with(Arc::clone(&exfil), limits);
    let provider = runtime
        .load_bytes(
            "bad-import",
            &component_bytes("bad-import"),
            Path::new("bad-import.wasm"),
        )
        .await
        .unwrap();
    let error = provider
        .call(create("x".repeat(256 << 10)), &CallContext::default())
        .await
        .expect_err("over the transfer budget");
    assert!(
        matches!(
            error,
            CallError::Budget {
                budget: Budget::TransferBytes,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(exfil.uploaded.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_capability_name_given_twice_is_refused() {
    let config = RuntimeConfig::default()
        .cache_dir(None)
        .capability(Arc::new(Exfil::default()))
        .capability(Arc::new(Exfil::default()));
    let error = Runtime::new(config).expect_err("refused");
    assert!(
        error.to_string().contains("`exfil` is given twice"),
        "{error}"
    );
}
