//! Test builders and a scripted mock API server (controller-rs style): each test lists the API
//! calls one reconcile must make, in order; the mock answers them and fails the test on any
//! other call, and a timeout catches a call that never comes.
//!
//! The provider is the real reference component (`target/components/reference.wasm`), which
//! invents running VMs without a hypervisor, bound under a ProviderConfig `reference` with no
//! grant.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use super::Context;
use super::caches::{Caches, Writers};
use crate::crd::{
    ComponentRef, FINALIZER, OrphanSweep, ProviderConfig, ProviderConfigSpec, Proxy, ProxySpec,
    ProxyStatus, SweepMode,
};
use crate::installation::Installation;
use crate::operator::{Operator, Settings};
use crate::provider_config_reconciler::ProviderConfigState;
use crate::timing::Timing;

pub type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The ProviderConfig every fixture Proxy names.
pub const PROVIDER_CONFIG: &str = "reference";

/// Fixture Proxies (the resource type lives in `egress-crd`, so these are a trait's).
pub trait ProxyFixture {
    /// A Proxy `px` in `default` naming [`PROVIDER_CONFIG`], with a UID and generation 1.
    fn test() -> Proxy;
    /// With the operator's finalizer.
    fn finalized(self) -> Proxy;
    /// Being deleted.
    fn deleting(self) -> Proxy;
    /// With a VM already recorded.
    fn with_vm(self, provider_id: &str) -> Proxy;
    /// Naming another ProviderConfig.
    fn naming(self, provider_config: &str) -> Proxy;
}

impl ProxyFixture for Proxy {
    fn test() -> Proxy {
        let mut proxy = Proxy::new(
            "px",
            ProxySpec {
                provider_config_ref: PROVIDER_CONFIG.into(),
                ..ProxySpec::default()
            },
        );
        proxy.metadata.namespace = Some("default".into());
        proxy.metadata.uid = Some("5b1c8a36-2f4e-4f0b-9d7e-0a1b2c3d4e5f".into());
        proxy.metadata.generation = Some(1);
        proxy.metadata.resource_version = Some("7".into());
        proxy
    }

    fn finalized(mut self) -> Proxy {
        self.metadata.finalizers = Some(vec![FINALIZER.into()]);
        self
    }

    fn deleting(mut self) -> Proxy {
        self.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        self
    }

    fn with_vm(mut self, provider_id: &str) -> Proxy {
        self.status = Some(ProxyStatus {
            provider_id: Some(provider_id.into()),
            ..ProxyStatus::default()
        });
        self
    }

    fn naming(mut self, provider_config: &str) -> Proxy {
        self.spec.provider_config_ref = provider_config.into();
        self
    }
}

/// The calls one reconcile is expected to make.
pub enum Scenario {
    /// Only the finalizer is added.
    FinalizerAdded,
    /// The finalizer's patch is refused with a 422: its `test` saw other finalizers than the
    /// cache (which had not yet seen the finalizer just added).
    FinalizerPatchStale,
    /// The status is applied (checked by the closure), then one Event per reason, in order.
    StatusApplied(fn(&Value), &'static [&'static str]),
    /// The status apply is refused with this HTTP status (and a `metav1.Status` body).
    StatusRefused(u16),
    /// Events with these reasons, then the finalizer is removed; `before_removal` checks the
    /// world when the removal arrives.
    EventsThenFinalizerRemoved(&'static [&'static str], Box<dyn Fn() + Send>),
}

/// Answers what `scenario` expects, then fails on anything more.
pub struct Verifier(ApiServerHandle);

impl Verifier {
    pub fn run(self, scenario: Scenario) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut handle = self.0;
            match scenario {
                Scenario::FinalizerAdded => finalizer_added(&mut handle).await,
                Scenario::FinalizerPatchStale => {
                    let (request, send) = next(&mut handle).await;
                    assert_eq!(request.method(), http::Method::PATCH);
                    let mut refused = json_response(&json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "Invalid", "code": 422,
                        "message": "the server rejected our request due to an error in our request",
                    }));
                    *refused.status_mut() = http::StatusCode::UNPROCESSABLE_ENTITY;
                    send.send_response(refused);
                }
                Scenario::StatusRefused(code) => {
                    let (request, send) = next(&mut handle).await;
                    assert!(request.uri().path().ends_with("/status"));
                    let mut refused = json_response(&json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "code": code,
                        "message": format!("the test's API server answers {code}"),
                    }));
                    *refused.status_mut() = http::StatusCode::from_u16(code).unwrap();
                    send.send_response(refused);
                }
                Scenario::StatusApplied(check, reasons) => {
                    status_applied(&mut handle, check).await;
                    for reason in reasons {
                        event_posted(&mut handle, reason).await;
                    }
                }
                Scenario::EventsThenFinalizerRemoved(reasons, before_removal) => {
                    for reason in reasons {
                        event_posted(&mut handle, reason).await;
                    }
                    let (request, send) = next(&mut handle).await;
                    before_removal();
                    assert_eq!(request.method(), http::Method::PATCH);
                    assert_eq!(
                        request.uri().path(),
                        "/apis/egress-operator.io/v1alpha1/namespaces/default/proxies/px"
                    );
                    let body = body_json(request).await;
                    assert_eq!(
                        body,
                        json!([
                            {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
                            {"op": "remove", "path": "/metadata/finalizers/0"},
                        ])
                    );
                    let mut gone = Proxy::test().deleting();
                    gone.metadata.finalizers = None;
                    send.send_response(json_response(&gone));
                }
            }
        })
    }
}

async fn next(
    handle: &mut ApiServerHandle,
) -> (
    Request<Body>,
    tower_test::mock::SendResponse<Response<Body>>,
) {
    handle
        .next_request()
        .await
        .expect("the reconcile makes this API call")
}

async fn body_json(request: Request<Body>) -> Value {
    let bytes = request.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        // Server-side apply bodies are YAML, which kube writes as JSON text anyway.
        serde_norway::from_slice(&bytes).expect("a JSON or YAML body")
    })
}

fn json_response(value: &impl serde::Serialize) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

async fn finalizer_added(handle: &mut ApiServerHandle) {
    let (request, send) = next(handle).await;
    assert_eq!(request.method(), http::Method::PATCH);
    assert_eq!(
        request.uri().path(),
        "/apis/egress-operator.io/v1alpha1/namespaces/default/proxies/px"
    );
    assert_eq!(
        request.headers()["content-type"],
        "application/json-patch+json"
    );
    let body = body_json(request).await;
    assert_eq!(
        body,
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ])
    );
    send.send_response(json_response(&Proxy::test().finalized()));
}

async fn status_applied(handle: &mut ApiServerHandle, check: fn(&Value)) {
    let (request, send) = next(handle).await;
    assert_eq!(request.method(), http::Method::PATCH);
    assert_eq!(
        request.uri().path(),
        "/apis/egress-operator.io/v1alpha1/namespaces/default/proxies/px/status"
    );
    let query = request.uri().query().unwrap_or_default().to_owned();
    assert!(query.contains("fieldManager=egress-operator"), "{query}");
    assert!(query.contains("force=true"), "{query}");
    assert_eq!(
        request.headers()["content-type"],
        "application/apply-patch+yaml"
    );
    let body = body_json(request).await;
    assert_eq!(body["apiVersion"], "egress-operator.io/v1alpha1");
    assert_eq!(body["kind"], "Proxy");
    check(&body["status"]);
    let mut written = Proxy::test().finalized();
    written.status = serde_json::from_value(body["status"].clone()).ok();
    send.send_response(json_response(&written));
}

async fn event_posted(handle: &mut ApiServerHandle, reason: &str) {
    let (request, send) = next(handle).await;
    assert_eq!(
        request.method(),
        http::Method::POST,
        "an Event for {reason}"
    );
    assert_eq!(
        request.uri().path(),
        "/apis/events.k8s.io/v1/namespaces/default/events"
    );
    let body = body_json(request).await;
    assert_eq!(body["reason"], reason);
    assert_eq!(body["reportingController"], super::REPORTER);
    assert_eq!(body["regarding"]["kind"], "Proxy");
    assert_eq!(body["regarding"]["name"], "px");
    send.send_response(json_response(&body));
}

/// A context over a mock API server and a real operator serving the reference component, and
/// the mock's verifier. Its caches hold the ProviderConfig [`PROVIDER_CONFIG`], bound.
pub struct TestContext {
    pub context: Arc<Context>,
    pub verifier: Verifier,
    _writers: Writers,
    _components: tempfile::TempDir,
}

impl TestContext {
    pub async fn new() -> TestContext {
        let components = tempfile::tempdir().unwrap();
        let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/components/reference.wasm");
        assert!(
            built.exists(),
            "{} is missing: run `just build-components` first",
            built.display()
        );
        std::fs::copy(&built, components.path().join("reference.wasm")).unwrap();
        let mut settings = Settings::new(
            Installation::new("test-cluster").unwrap(),
            components.path().to_path_buf(),
        );
        settings.timing = Timing {
            not_ready_retry: Duration::from_secs(7),
            ..Timing::default()
        };
        let operator = Operator::start(settings)
            .await
            .expect("the operator starts");

        let (caches, mut writers) = Caches::detached();
        let pc = ProviderConfig::new(
            PROVIDER_CONFIG,
            ProviderConfigSpec {
                component: ComponentRef {
                    file: "reference.wasm".into(),
                    ..ComponentRef::default()
                },
                config: json!({}),
                // The reference imports wasi:http: a ProviderConfig that does not grant it
                // serves no Proxy. Its calls here make no request.
                grant: serde_json::from_value(json!({
                    "http": {"origins": ["http://pve.example:8006"]}
                }))
                .expect("a grant"),
                // Sweeps are the core's tests': the provider sees only the calls a test makes.
                orphan_sweep: OrphanSweep {
                    mode: SweepMode::Off,
                    ..OrphanSweep::default()
                },
                ..ProviderConfigSpec::default()
            },
        );
        let state = ProviderConfigState {
            name: PROVIDER_CONFIG.into(),
            generation: 1,
            spec: pc.spec.clone(),
            status: Default::default(),
        };
        let outcome = operator
            .provider_configs
            .reconcile(
                &operator.providers,
                &state,
                &super::caches::StoreObjects(&caches),
                async { Some(Default::default()) },
            )
            .await;
        assert!(
            outcome.rebound,
            "the reference component binds: {outcome:?}"
        );
        writers
            .provider_configs
            .apply_watcher_event(&Event::Apply(pc));

        let (mock_service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock_service, "default");
        let (rebound, _) = tokio::sync::broadcast::channel(4);
        let context = Arc::new(Context {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: super::REPORTER.into(),
                    instance: Some("test".into()),
                },
            ),
            client,
            operator,
            caches,
            rebound,
        });
        TestContext {
            context,
            verifier: Verifier(handle),
            _writers: writers,
            _components: components,
        }
    }
}

/// Waits for the mock to have answered everything, failing after a second.
pub async fn timeout_after_1s(verifier: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(Duration::from_secs(1), verifier)
        .await
        .expect("the expected API calls were made in time")
        .expect("the scenario held");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_mode::api_retry;
    use crate::kube_mode::proxy::{error_policy, reconcile};
    use crate::kube_mode::{Error, provider_config};
    use kube::runtime::controller::Action;

    #[tokio::test]
    async fn binding_the_provider_config_counts_its_validate_config_and_check_calls() {
        let test = TestContext::new().await;
        let metrics = &test.context.operator.metrics;
        assert_eq!(metrics.calls(PROVIDER_CONFIG, "validate-config", "ok"), 1);
        assert_eq!(metrics.calls(PROVIDER_CONFIG, "check", "ok"), 1);
    }

    #[tokio::test]
    async fn a_failed_provider_config_reconcile_is_counted_by_its_error_label() {
        let test = TestContext::new().await;
        let pc = Arc::new(ProviderConfig::new(
            PROVIDER_CONFIG,
            ProviderConfigSpec::default(),
        ));
        let error = Error::Unnamed("namespace");
        let action = provider_config::error_policy(pc, &error, Arc::clone(&test.context));
        assert_eq!(action, Action::requeue(api_retry(&test.context)));
        let metrics = &test.context.operator.metrics;
        assert_eq!(metrics.reconcile_failures("providerconfig", "unnamed"), 1);
    }

    #[tokio::test]
    async fn a_new_proxy_gets_the_finalizer_before_anything_else() {
        let test = TestContext::new().await;
        let mocks = test.verifier.run(Scenario::FinalizerAdded);
        let action = reconcile(Arc::new(Proxy::test()), Arc::clone(&test.context))
            .await
            .expect("reconciled");
        assert_eq!(action, Action::await_change());
        timeout_after_1s(mocks).await;
        let metrics = &test.context.operator.metrics;
        assert_eq!(
            metrics.calls(PROVIDER_CONFIG, "create", "ok"),
            0,
            "no VM before the finalizer holds the Proxy"
        );
    }

    /// Issue 22: the first reconcile of a new Proxy met a 422 from the finalizer's patch (the
    /// cache had not seen the finalizer just added) and logged it as a warning. It is a requeue.
    #[tokio::test]
    async fn a_stale_finalizer_patch_is_a_short_requeue_not_a_failure() {
        let test = TestContext::new().await;
        let mocks = test.verifier.run(Scenario::FinalizerPatchStale);
        let proxy = Arc::new(Proxy::test());
        let error = reconcile(Arc::clone(&proxy), Arc::clone(&test.context))
            .await
            .expect_err("the patch was refused");
        timeout_after_1s(mocks).await;
        assert!(error.is_stale_finalizer_patch(), "{error}");
        let timing = test.context.operator.reconciler.timing();
        assert_eq!(
            error_policy(proxy, &error, Arc::clone(&test.context)),
            Action::requeue(timing.backoff_base)
        );
        assert_eq!(
            test.context
                .operator
                .metrics
                .calls(PROVIDER_CONFIG, "create", "ok"),
            0,
            "no VM before the finalizer holds the Proxy"
        );
    }

    #[tokio::test]
    async fn a_created_vm_is_applied_as_status_with_the_field_manager_and_recorded() {
        let test = TestContext::new().await;
        let mocks = test.verifier.run(Scenario::StatusApplied(
            |status| {
                assert_eq!(status["phase"], "Running");
                assert!(
                    status["providerId"]
                        .as_str()
                        .unwrap()
                        .starts_with("ref/proxy-")
                );
                assert!(
                    status["addresses"][0]
                        .as_str()
                        .unwrap()
                        .starts_with("198.51.100.")
                );
                let ready = status["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["type"] == "Ready")
                    .unwrap();
                assert_eq!(ready["status"], "True");
                assert_eq!(status["observedGeneration"], 1);
                assert_eq!(status["provider"]["providerConfig"], PROVIDER_CONFIG);
            },
            &["VMCreated", "Ready"],
        ));
        let action = reconcile(
            Arc::new(Proxy::test().finalized()),
            Arc::clone(&test.context),
        )
        .await
        .expect("reconciled");
        assert_eq!(action, Action::requeue(Timing::default().resync));
        timeout_after_1s(mocks).await;
        assert_eq!(
            test.context
                .operator
                .metrics
                .calls(PROVIDER_CONFIG, "create", "ok"),
            1
        );
    }

    /// Issue 31: whatever the API server answers a status write (forbidden, gone, a conflict,
    /// an expired version, invalid, too many requests, a server error), the reconcile is retried
    /// after the API wait and counted as a `kube` failure: never a crash, never a Proxy left
    /// waiting for a change. Nothing is lost: the VM made is found again by name on the retry.
    #[tokio::test]
    async fn every_refusal_of_a_status_write_is_retried() {
        for code in [403, 404, 409, 410, 422, 429, 500] {
            let test = TestContext::new().await;
            let mocks = test.verifier.run(Scenario::StatusRefused(code));
            let proxy = Arc::new(Proxy::test().finalized());
            let error = reconcile(Arc::clone(&proxy), Arc::clone(&test.context))
                .await
                .expect_err("the status write was refused");
            timeout_after_1s(mocks).await;
            assert_eq!(error.metric_label(), "reconcile", "{code}: {error}");
            assert!(error.to_string().contains(&code.to_string()), "{error}");
            assert_eq!(
                error_policy(proxy, &error, Arc::clone(&test.context)),
                Action::requeue(api_retry(&test.context)),
                "{code}"
            );
        }
    }

    #[tokio::test]
    async fn a_proxy_naming_a_missing_provider_config_is_not_ready_with_that_reason() {
        let test = TestContext::new().await;
        let mocks = test.verifier.run(Scenario::StatusApplied(
            |status| {
                assert_eq!(status["phase"], "Pending");
                let ready = status["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["type"] == "Ready")
                    .unwrap();
                assert_eq!(ready["status"], "False");
                assert_eq!(ready["reason"], "ProviderConfigNotFound");
            },
            &[],
        ));
        let proxy = Proxy::test().finalized().naming("nowhere");
        let action = reconcile(Arc::new(proxy), Arc::clone(&test.context))
            .await
            .expect("reconciled");
        assert_eq!(action, Action::requeue(Duration::from_secs(7)));
        timeout_after_1s(mocks).await;
    }

    #[tokio::test]
    async fn a_deletion_deletes_the_vm_then_removes_the_finalizer() {
        let test = TestContext::new().await;
        let metrics = test.context.operator.metrics.clone();
        let mocks = test.verifier.run(Scenario::EventsThenFinalizerRemoved(
            &["VMDeleted"],
            Box::new(move || {
                assert_eq!(
                    metrics.calls(PROVIDER_CONFIG, "delete", "ok"),
                    1,
                    "the VM is deleted before the finalizer goes"
                );
            }),
        ));
        let proxy = Proxy::test()
            .finalized()
            .deleting()
            .with_vm("ref/proxy-abc");
        reconcile(Arc::new(proxy), Arc::clone(&test.context))
            .await
            .expect("finalized");
        timeout_after_1s(mocks).await;
    }

    #[tokio::test]
    async fn a_deletion_without_its_provider_keeps_the_finalizer_and_comes_back() {
        let test = TestContext::new().await;
        let mocks = test.verifier.run(Scenario::StatusApplied(
            |status| {
                assert_eq!(status["phase"], "Deleting");
                assert_eq!(status["providerId"], "ref/proxy-abc");
            },
            &[],
        ));
        let proxy = Arc::new(
            Proxy::test()
                .finalized()
                .deleting()
                .with_vm("ref/proxy-abc")
                .naming("gone"),
        );
        let error = reconcile(Arc::clone(&proxy), Arc::clone(&test.context))
            .await
            .expect_err("the finalizer stays");
        assert_eq!(error.metric_label(), "cleanuppending");
        assert_eq!(
            error_policy(proxy, &error, Arc::clone(&test.context)),
            Action::requeue(Duration::from_secs(7))
        );
        let metrics = &test.context.operator.metrics;
        assert_eq!(metrics.reconcile_failures("proxy", "cleanuppending"), 1);
        // Only the status write: no finalizer patch (the verifier fails on any extra call).
        timeout_after_1s(mocks).await;
        assert_eq!(
            test.context
                .operator
                .metrics
                .calls(PROVIDER_CONFIG, "delete", "ok"),
            0
        );
    }
}
