//! Kubernetes mode end to end: the operator (`kube_mode::run_with`, as `egress-operator run`
//! runs it) against a real kube-apiserver and etcd (`cluster_support`), authenticated as the
//! ServiceAccount `deploy/rbac.yaml` binds, the real Proxmox component in the runtime, its HTTP
//! through the broker with the token from a Secret and the CA from a ConfigMap, to `pvesim` over
//! TLS. Every wait polls a condition with a bound; nothing sleeps to synchronise.

use crate::cluster_support;
use crate::local_support;
use crate::oci_support;
use crate::proxmox_support;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster_support::{Cluster, OPERATOR_NAMESPACE};
use crate::metrics_support::counter;
use egress_operator::conditions::{self};
use egress_operator::crd::{
    FINALIZER, KeyRef, Phase, ProviderConfig, Proxy, ProxyPool, ProxySpec, RecoveryPolicy, UserData,
};
use egress_operator::installation::Installation;
use egress_operator::kube_mode::{self, Options};
use egress_operator::marks::{INSTALLATION_TAG, PROVIDER_CONFIG_TAG, vm_name};
use egress_operator::operator::{Operator, Settings};
use egress_operator::proxy_reconciler::{Next, Resolved};
use egress_operator::timing::Timing;
use egress_runtime::types::{CreateRequest, Request, Response, Tag};
use egress_runtime::{CallContext, Provider};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use pvesim::{FaultAction, FaultRule, Simulator, Trigger};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// The namespace of the tests' Proxies and their user-data; the operator's own Secrets and
/// ConfigMaps are in [`OPERATOR_NAMESPACE`], as `deploy/` has them.
pub(crate) const NAMESPACE: &str = "default";
/// The ProviderConfig of the simulator.
pub(crate) const PC: &str = "pve";
/// Waits are bounded by this.
pub(crate) const LIMIT: Duration = Duration::from_secs(30);

/// Short clocks: resync every second, retries from 100 ms.
pub(crate) fn timing() -> Timing {
    Timing {
        resync: Duration::from_secs(1),
        poll_min: Duration::from_millis(100),
        poll_max: Duration::from_millis(400),
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_secs(2),
        quota_retry: Duration::from_secs(2),
        not_ready_retry: Duration::from_millis(500),
    }
}

/// [`timing`] with a resync longer than any test.
fn no_resync() -> Timing {
    Timing {
        resync: Duration::from_secs(3600),
        ..timing()
    }
}

/// A cluster with the operator's CRDs and RBAC, pvesim, the token Secret and CA ConfigMap, and
/// the ProviderConfig.
pub(crate) struct World {
    pub(crate) cluster: Cluster,
    /// An admin's client: what the tests act with.
    pub(crate) client: Client,
    /// The operator's: its ServiceAccount's.
    operator_client: Client,
    pub(crate) pve: Simulator,
    files: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        World::start_with("Delete").await
    }

    /// With the ProviderConfig's orphan sweep in `sweep` mode (a sweep also requeues it).
    async fn start_with(sweep: &str) -> World {
        let rbac = std::fs::read_to_string(cluster_support::deploy().join("rbac.yaml")).unwrap();
        World::start_with_rbac(sweep, &rbac).await
    }

    /// With `rbac` in place of `deploy/rbac.yaml`.
    async fn start_with_rbac(sweep: &str, rbac: &str) -> World {
        World::start_with_sim(sweep, rbac, proxmox_support::quick_sim_config()).await
    }

    /// With pvesim started with `sim`.
    pub(crate) async fn start_with_sim(sweep: &str, rbac: &str, sim: pvesim::SimConfig) -> World {
        // The operator's log lines, shown when a test fails.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .with_test_writer()
            .with_ansi(false)
            .try_init();
        let cluster = Cluster::start_with_rbac(rbac).await;
        let client = cluster.admin.clone();
        let operator_client = cluster.operator_client().await;
        let pve = Simulator::start(sim).await.expect("pvesim starts");
        let world = World {
            cluster,
            client,
            operator_client,
            pve,
            files: tempfile::tempdir().unwrap(),
        };
        world.set_token(world.pve.token()).await;
        let ca = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "pve-ca", "namespace": OPERATOR_NAMESPACE},
            "data": {"ca.pem": world.pve.ca_pem()},
        });
        world
            .configmaps()
            .create(&PostParams::default(), &serde_json::from_value(ca).unwrap())
            .await
            .unwrap();
        // The Proxies' user-data, made before any Proxy: no stray trigger in the tests.
        let map = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "user-data", "namespace": NAMESPACE},
            "data": {"cloud-config": "#cloud-config\npackages: [squid]\n"},
        });
        Api::<ConfigMap>::namespaced(world.client.clone(), NAMESPACE)
            .create(
                &PostParams::default(),
                &serde_json::from_value(map).unwrap(),
            )
            .await
            .unwrap();
        world.create_provider_config(PC, sweep, 9001).await;
        world
    }

    fn proxies(&self) -> Api<Proxy> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn provider_configs(&self) -> Api<ProviderConfig> {
        Api::all(self.client.clone())
    }

    /// Secrets in the operator's namespace, where references without a namespace point.
    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), OPERATOR_NAMESPACE)
    }

    /// ConfigMaps in the operator's namespace.
    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), OPERATOR_NAMESPACE)
    }

    /// Create or replace the token Secret.
    async fn set_token(&self, token: &str) {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "pve-token", "namespace": OPERATOR_NAMESPACE},
            "stringData": {"token": token},
        });
        let secret: Secret = serde_json::from_value(secret).unwrap();
        self.secrets()
            .patch(
                "pve-token",
                &PatchParams::apply("test").force(),
                &Patch::Apply(secret),
            )
            .await
            .unwrap();
    }

    async fn create_provider_config(&self, name: &str, sweep: &str, template: u32) {
        let pc = json!({
            "apiVersion": "egress-operator.io/v1alpha1", "kind": "ProviderConfig",
            "metadata": {"name": name},
            "spec": self.provider_config_spec(sweep, template),
        });
        self.provider_configs()
            .create(&PostParams::default(), &serde_json::from_value(pc).unwrap())
            .await
            .unwrap();
    }

    async fn create_proxy(&self, name: &str, provider_config: &str) -> Proxy {
        let proxy = Proxy::new(
            name,
            ProxySpec {
                provider_config_ref: provider_config.into(),
                user_data: Some(UserData {
                    config_map_key_ref: Some(KeyRef {
                        name: "user-data".into(),
                        key: "cloud-config".into(),
                    }),
                    ..UserData::default()
                }),
                tags: BTreeMap::from([("team".into(), "egress".into())]),
                recovery: None,
                health_check: None,
            },
        );
        self.proxies()
            .create(&PostParams::default(), &proxy)
            .await
            .unwrap()
    }

    async fn proxy(&self, name: &str) -> Option<Proxy> {
        self.proxies().get_opt(name).await.unwrap()
    }

    async fn provider_config(&self, name: &str) -> ProviderConfig {
        self.provider_configs().get(name).await.unwrap()
    }

    /// Waits until Proxy `name` runs with an address; returns it.
    async fn until_running(&self, name: &str) -> Proxy {
        let mut last = None;
        let deadline = Instant::now() + LIMIT;
        while Instant::now() < deadline {
            if let Some(proxy) = self.proxy(name).await {
                let status = proxy.status.clone().unwrap_or_default();
                if format!("{:?}", status.phase) == "Some(Running)" && !status.addresses.is_empty()
                {
                    return proxy;
                }
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{name} never ran with an address; last status {last:#?}");
    }

    /// The reasons of the Events recorded on object `name`.
    async fn event_reasons(&self, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::all(self.client.clone());
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|event| event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|event| event.reason)
            .collect()
    }

    /// The VMs in pvesim named `name`.
    fn vms_named(&self, name: &str) -> Vec<pvesim::GuestView> {
        let state = self.pve.state();
        state
            .vmids()
            .into_iter()
            .filter_map(|vmid| state.guest(vmid))
            .filter(|guest| guest.config.get("name").map(String::as_str) == Some(name))
            .collect()
    }

    /// The Proxmox component loaded on its own (outside the operator), granted the main token:
    /// how the tests act on the hypervisor behind the operator's back.
    async fn out_of_band(&self) -> Arc<Provider> {
        let secret_file = self.files.path().join("token");
        std::fs::write(&secret_file, self.pve.token()).unwrap();
        proxmox_support::load_provider(&proxmox_support::GrantSpec {
            origin: self.pve.url(),
            secret_file,
            ca_file: self.pve.ca_file().to_path_buf(),
        })
        .await
    }

    /// The spec of a ProviderConfig of the simulator (JSON): proxmox.wasm with the token Secret
    /// and CA ConfigMap, cloning `template`, its orphan sweep in `sweep` mode every second.
    fn provider_config_spec(&self, sweep: &str, template: u32) -> Value {
        let mut config = proxmox_support::provider_config(&self.pve);
        config["templateVmid"] = json!(template);
        json!({
            "component": {"file": "proxmox.wasm"},
            "config": config,
            "grant": {"http": {
                "origins": [self.pve.url()],
                "credential": {
                    "header": "Authorization",
                    "format": "PVEAPIToken={secret}",
                    "secretRef": {"name": "pve-token", "key": "token"},
                },
                "tls": {"caConfigMapRef": {"name": "pve-ca", "key": "ca.pem"}, "http1Only": true},
                "timeouts": {"connectMs": 2000, "firstByteMs": 5000, "totalMs": 10000},
            }},
            "orphanSweep": {"mode": sweep, "intervalSeconds": 1},
        })
    }

    fn config_text(&self) -> String {
        proxmox_support::provider_config(&self.pve).to_string()
    }
}

/// One operator replica running `run_with` in this process.
pub(crate) struct Replica {
    pub(crate) operator: Arc<Operator>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<ExitCode>>,
    _components: tempfile::TempDir,
    components: PathBuf,
}

impl Replica {
    async fn start(world: &World, identity: &str) -> Replica {
        Replica::start_with(world, identity, timing()).await
    }

    /// With `timing` (a long resync proves a change, not the clock, triggered a reconcile).
    async fn start_with(world: &World, identity: &str, timing: Timing) -> Replica {
        let components = tempfile::tempdir().unwrap();
        std::fs::copy(
            proxmox_support::component(),
            components.path().join("proxmox.wasm"),
        )
        .unwrap();
        let mut settings = Settings::new(
            Installation::new(INSTALLATION).unwrap(),
            components.path().to_path_buf(),
        );
        settings.namespace = OPERATOR_NAMESPACE.into();
        settings.timing = timing;
        settings.cache_dir =
            Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube-mode-cache"));
        let operator = Operator::start(settings)
            .await
            .expect("the operator starts");
        let mut options = Options::new(OPERATOR_NAMESPACE, identity);
        options.lease_seconds = 2;
        options.lease_grace_seconds = 1;
        options.shutdown_grace = Duration::from_secs(10);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(kube_mode::run_with(
            world.operator_client.clone(),
            Arc::clone(&operator),
            options,
            async move {
                let _ = stopped.await;
            },
        ));
        Replica {
            operator,
            stop: Some(stop),
            task,
            components: components.path().to_path_buf(),
            _components: components,
        }
    }

    /// A replica that leads.
    pub(crate) async fn leader(world: &World, identity: &str) -> Replica {
        Replica::leader_with(world, identity, timing()).await
    }

    async fn leader_with(world: &World, identity: &str, timing: Timing) -> Replica {
        let replica = Replica::start_with(world, identity, timing).await;
        eventually(&format!("{identity} leads"), || async {
            lease_holder(world).await.as_deref() == Some(identity)
        })
        .await;
        replica
    }

    /// SIGTERM, as far as `run_with` can tell; its exit code.
    pub(crate) async fn stop(mut self) -> ExitCode {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("the operator stops in time")
            .expect("the operator task did not panic")
            .expect("the operator ran")
    }

    fn proxy_reconciles(&self) -> u64 {
        counter(
            &self.operator.metrics.encode(),
            "controller_runtime_reconcile_total{controller=\"proxy\"",
        )
    }
}

/// The operator's Lease as the API server holds it now.
async fn lease(world: &World) -> LeaseSpec {
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), OPERATOR_NAMESPACE);
    let lease = leases.get(kube_mode::LEASE_NAME).await.unwrap();
    lease.spec.unwrap_or_default()
}

async fn lease_holder(world: &World) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), OPERATOR_NAMESPACE);
    leases
        .get_opt(kube_mode::LEASE_NAME)
        .await
        .unwrap()
        .and_then(|lease| lease.spec?.holder_identity)
}

/// Polls `condition` every 50 ms until it holds; panics naming `what` after [`LIMIT`].
pub(crate) async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(start.elapsed() < LIMIT, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    kind: &str,
) -> (String, String) {
    egress_operator::conditions::condition(conditions, kind)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

async fn pc_condition(world: &World, kind: &str) -> (String, String) {
    let pc = world.provider_config(PC).await;
    condition(&pc.status.unwrap_or_default().conditions, kind)
}

fn vmid(provider_id: &str) -> u32 {
    proxmox_support::vmid_of(provider_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_proxy_gets_the_finalizer_and_becomes_ready_running_at_an_address() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    // Its ProviderConfig settled first: nothing but the Proxy's own changes triggers it.
    eventually("the ProviderConfig is ready", || async {
        pc_condition(&world, conditions::READY).await.0 == "True"
    })
    .await;
    let created = world.create_proxy("web", PC).await;

    let proxy = world.until_running("web").await;
    assert_eq!(proxy.finalizers(), [FINALIZER]);
    let status = proxy.status.unwrap();
    assert_eq!(
        status.addresses,
        [pvesim::guest_ip(vmid(
            status.provider_id.as_deref().unwrap()
        ))]
    );
    assert_eq!(
        condition(&status.conditions, conditions::READY),
        ("True".into(), "Running".into())
    );
    assert_eq!(status.observed_generation, Some(1));
    let uid = created.uid().unwrap();
    let vms = world.vms_named(&vm_name(&uid));
    assert_eq!(vms.len(), 1, "one VM for the Proxy");
    assert_eq!(Some(vms[0].vmid), status.provider_id.as_deref().map(vmid));
    // The status is the operator's alone, by server-side apply.
    let stored = world.proxies().get("web").await.unwrap();
    let managers: Vec<(String, String, String)> = stored
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|fields| {
            (
                fields.manager.unwrap_or_default(),
                fields.operation.unwrap_or_default(),
                fields.subresource.unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("egress-operator".into(), "Apply".into(), "status".into())),
        "{managers:?}"
    );

    // Events follow the status write: wait for them.
    eventually("VMCreated and Ready are recorded", || async {
        let reasons = world.event_reasons("web").await;
        reasons.contains(&"VMCreated".to_owned()) && reasons.contains(&"Ready".to_owned())
    })
    .await;
    let pc = world.provider_config(PC).await.status.unwrap();
    assert_eq!(
        condition(&pc.conditions, conditions::READY).0,
        "True",
        "{pc:#?}"
    );
    let loaded = pc.loaded.unwrap();
    assert_eq!(loaded.file, "proxmox.wasm");
    assert!(loaded.digest.starts_with("sha256:"));
    eventually("a ProviderLoaded Event", || async {
        world
            .event_reasons(PC)
            .await
            .contains(&"ProviderLoaded".to_owned())
    })
    .await;
    assert_eq!(replica.stop().await, ExitCode::SUCCESS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_deleted_behind_the_operators_back_is_made_again() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    world.create_proxy("web", PC).await;
    let before = world
        .until_running("web")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();

    let provider = world.out_of_band().await;
    provider
        .call(
            Request::Delete {
                config: world.config_text(),
                provider_id: before.clone(),
            },
            &CallContext::default(),
        )
        .await
        .expect("deleted behind the operator's back");
    assert!(world.pve.state().guest(vmid(&before)).is_none());

    eventually("the operator notices the VM is gone", || async {
        world
            .event_reasons("web")
            .await
            .contains(&"VMGone".to_owned())
    })
    .await;
    let after = world
        .until_running("web")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();
    assert!(
        world.pve.state().guest(vmid(&after)).is_some(),
        "a new VM at {after}"
    );
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transient_failure_is_retried_with_growing_waits_until_the_proxy_recovers() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    // Every clone answers 500 until the fault goes.
    let fault = world.pve.faults().add(FaultRule::new(
        "POST",
        "/nodes/*/qemu/*/clone",
        Trigger::Always,
        FaultAction::Status {
            status: 500,
            message: "got timeout".into(),
        },
    ));
    world.create_proxy("web", PC).await;
    let transient = || {
        counter(
            &replica.operator.metrics.encode(),
            "egress_provider_calls_total{provider=\"pve\",operation=\"create\",outcome=\"transient\"}",
        )
    };
    let mut seen_at = Vec::new();
    let start = Instant::now();
    while seen_at.len() < 5 {
        assert!(
            start.elapsed() < LIMIT,
            "only {} transient failures",
            seen_at.len()
        );
        let count = transient() as usize;
        while seen_at.len() < count {
            seen_at.push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let proxy = world.proxy("web").await.unwrap();
    let status = proxy.status.unwrap();
    assert_eq!(
        condition(&status.conditions, conditions::SYNCED),
        ("False".into(), "TransientError".into())
    );
    // Backoff: 100 ms doubling (jittered into its upper half), so the fourth wait is well over
    // twice the first.
    let first = seen_at[1] - seen_at[0];
    let fourth = seen_at[4] - seen_at[3];
    assert!(fourth > first * 2, "waits {first:?} then {fourth:?}");

    world.pve.faults().remove(fault);
    let proxy = world.until_running("web").await;
    assert_eq!(
        condition(&proxy.status.unwrap().conditions, conditions::SYNCED).0,
        "True"
    );
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permanent_refusal_is_not_retried_until_the_spec_changes() {
    let world = World::start().await;
    // Its template does not exist: create fails permanently.
    world
        .create_provider_config("pve-broken", "Off", 4242)
        .await;
    let replica = Replica::leader(&world, "a").await;
    world.create_proxy("web", "pve-broken").await;
    eventually("the Proxy failed permanently", || async {
        world
            .proxy("web")
            .await
            .and_then(|p| p.status)
            .is_some_and(|s| {
                condition(&s.conditions, conditions::READY)
                    == ("False".into(), "PermanentError".into())
            })
    })
    .await;
    let permanent = || {
        counter(
            &replica.operator.metrics.encode(),
            "egress_provider_calls_total{provider=\"pve-broken\",operation=\"create\",outcome=\"permanent\"}",
        )
    };
    assert_eq!(permanent(), 1);
    // A reconcile handed the Proxy as a watch cache may still hold it, without the status just
    // written (CI once saw a second create this way), does not ask again either.
    let mut stale = world.proxy("web").await.unwrap();
    stale.status = None;
    let outcome = replica
        .operator
        .reconciler
        .reconcile(
            &kube_mode::proxy::proxy_state(&stale, false).unwrap(),
            Resolved {
                binding: replica.operator.providers.binding("pve-broken"),
                user_data: Ok(String::new()),
            },
        )
        .await;
    assert_eq!(permanent(), 1, "a stale status brought a second create");
    assert_eq!(outcome.next, Next::AwaitChange);
    assert_eq!(
        condition(&outcome.status.conditions, conditions::READY),
        ("False".into(), "PermanentError".into()),
        "the status written stays"
    );
    // Two resyncs of the ProviderConfigs later, still no second attempt.
    let pc_checks = || {
        counter(
            &replica.operator.metrics.encode(),
            "controller_runtime_reconcile_total{controller=\"providerconfig\"",
        )
    };
    let checks = pc_checks();
    eventually("two more resyncs", || async { pc_checks() >= checks + 4 }).await;
    assert_eq!(permanent(), 1, "a permanent error is not retried");
    assert!(
        world
            .event_reasons("web")
            .await
            .contains(&"PermanentError".to_owned())
    );

    world
        .proxies()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerConfigRef": PC}})),
        )
        .await
        .unwrap();
    let proxy = world.until_running("web").await;
    let status = proxy.status.unwrap();
    assert_eq!(status.observed_generation, Some(2));
    assert_eq!(status.provider.unwrap().provider_config, PC);
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_vm_is_deleted_and_made_again() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    world.create_proxy("web", PC).await;
    let before = world
        .until_running("web")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();
    // Its guest agent removed: it can never report an address again (failed).
    assert!(
        world
            .pve
            .state()
            .set_config(vmid(&before), "agent", Some("0"))
    );

    eventually("the operator replaces the failed VM", || async {
        world
            .event_reasons("web")
            .await
            .contains(&"VMReplaced".to_owned())
    })
    .await;
    let after = world
        .until_running("web")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();
    let vm = world.pve.state().guest(vmid(&after)).unwrap();
    assert_eq!(
        vm.config.get("agent").map(String::as_str),
        Some("1"),
        "a new VM from the template"
    );
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_proxy_removes_its_vm_and_seed_before_the_finalizer_lets_it_go() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    let created = world.create_proxy("web", PC).await;
    world.until_running("web").await;
    let name = vm_name(&created.uid().unwrap());
    assert_eq!(world.vms_named(&name).len(), 1);
    assert!(
        !world.pve.state().volumes("proxy-seeds").is_empty(),
        "a seed while it runs"
    );

    world
        .proxies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Proxy is gone", || async {
        world.proxy("web").await.is_none()
    })
    .await;
    assert!(world.vms_named(&name).is_empty(), "the VM is gone");
    assert_eq!(
        world.pve.state().volumes("proxy-seeds"),
        Vec::<String>::new(),
        "the seed is gone"
    );
    replica.stop().await;
}

/// The installation of the tests' operators.
const INSTALLATION: &str = "test-cluster";

/// Makes a VM tagged as made by this installation through `provider_config`, for a Proxy that
/// does not exist.
async fn orphan(world: &World, provider_config: &str) -> String {
    let provider = world.out_of_band().await;
    let uid = "0b7c3f0e-1111-4222-8333-944455556666";
    let request = CreateRequest {
        name: vm_name(uid),
        uid: uid.into(),
        tags: vec![
            Tag {
                key: PROVIDER_CONFIG_TAG.into(),
                value: provider_config.into(),
            },
            Tag {
                key: INSTALLATION_TAG.into(),
                value: INSTALLATION.into(),
            },
        ],
        user_data: "#cloud-config\n".into(),
        config: world.config_text(),
        placement: None,
    };
    match provider
        .call(Request::Create { request }, &CallContext::default())
        .await
    {
        Ok(Response::Create(vm)) => vm.provider_id,
        other => panic!("the orphan is made: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_marked_as_ours_with_no_proxy_is_deleted_after_two_sweeps() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    // A live Proxy's VM is never an orphan.
    world.create_proxy("web", PC).await;
    let live = world
        .until_running("web")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();
    let orphan = orphan(&world, PC).await;

    eventually("the orphan is deleted", || async {
        world.pve.state().guest(vmid(&orphan)).is_none()
    })
    .await;
    // The sweep deletes, then writes its report and records its event: wait for both.
    eventually("the sweep's report and event", || async {
        let report = world
            .provider_config(PC)
            .await
            .status
            .and_then(|status| status.orphans);
        report.is_some_and(|report| report.last_sweep.is_some() && report.deleted >= 1)
            && world
                .event_reasons(PC)
                .await
                .contains(&"OrphanDeleted".to_owned())
    })
    .await;
    assert!(
        world.pve.state().guest(vmid(&live)).is_some(),
        "the live Proxy's VM stays"
    );
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_report_mode_an_orphan_is_reported_and_left_alone() {
    let world = World::start().await;
    world
        .create_provider_config("pve-report", "Report", 9001)
        .await;
    // An hour's resync: only the sweep's own one-second interval brings the ProviderConfig back.
    let replica = Replica::leader_with(&world, "a", no_resync()).await;
    let orphan = orphan(&world, "pve-report").await;

    eventually("the orphan is reported", || async {
        world
            .provider_config("pve-report")
            .await
            .status
            .and_then(|s| s.orphans)
            .is_some_and(|report| report.found.contains(&orphan))
    })
    .await;
    let report = world
        .provider_config("pve-report")
        .await
        .status
        .unwrap()
        .orphans
        .unwrap();
    assert_eq!(report.deleted, 0);
    eventually("an OrphanFound Event", || async {
        world
            .event_reasons("pve-report")
            .await
            .contains(&"OrphanFound".to_owned())
    })
    .await;
    assert!(
        world.pve.state().guest(vmid(&orphan)).is_some(),
        "reported, not deleted"
    );
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replacement_that_does_not_load_leaves_the_last_good_one_serving() {
    let world = World::start_with("Off").await;
    // No resync during the test: the registry's events alone drive the ProviderConfig.
    let replica = Replica::leader_with(&world, "a", no_resync()).await;
    eventually("the ProviderConfig is ready", || async {
        pc_condition(&world, conditions::READY).await.0 == "True"
    })
    .await;
    let good = world
        .provider_config(PC)
        .await
        .status
        .unwrap()
        .loaded
        .unwrap();

    let file = replica.components.join("proxmox.wasm");
    let bytes = std::fs::read(&file).unwrap();
    write_replacing(&file, &bytes[..bytes.len() / 3]);
    eventually("the ProviderConfig is Degraded", || async {
        pc_condition(&world, conditions::DEGRADED).await
            == ("True".into(), "ComponentRejected".into())
    })
    .await;
    // The Event is recorded after the status is written: wait for it too.
    eventually("a ComponentRejected Event", || async {
        world
            .event_reasons(PC)
            .await
            .contains(&"ComponentRejected".to_owned())
    })
    .await;
    let serving = world
        .provider_config(PC)
        .await
        .status
        .unwrap()
        .loaded
        .unwrap();
    assert_eq!(serving.digest, good.digest, "the last good one serves");
    // And it serves Proxies.
    world.create_proxy("web", PC).await;
    world.until_running("web").await;

    // A good file again: hot swapped in, a new generation, not Degraded.
    write_replacing(&file, &bytes);
    eventually("the good component is swapped in", || async {
        let status = world.provider_config(PC).await.status.unwrap();
        condition(&status.conditions, conditions::DEGRADED).0 == "False"
            && status
                .loaded
                .is_some_and(|loaded| loaded.generation > good.generation)
    })
    .await;
    replica.stop().await;
}

/// Replace `file` in one rename, as a deployment tool would.
fn write_replacing(file: &Path, bytes: &[u8]) {
    let staging = file.with_extension("staging");
    std::fs::write(&staging, bytes).unwrap();
    std::fs::rename(&staging, file).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rotated_token_secret_is_used_from_the_next_request() {
    let world = World::start_with("Off").await;
    // No resync during the test: the Secret's watch alone drives the ProviderConfig.
    let replica = Replica::leader_with(&world, "a", no_resync()).await;
    eventually("the ProviderConfig is ready", || async {
        pc_condition(&world, conditions::READY).await == ("True".into(), "CheckPassed".into())
    })
    .await;

    // The limited token authenticates but may not delete seeds: check says Forbidden.
    world.set_token(world.pve.limited_token()).await;
    eventually("the limited token is used", || async {
        pc_condition(&world, conditions::READY).await == ("False".into(), "Forbidden".into())
    })
    .await;

    // A token pvesim does not know: the next requests are refused with 401.
    let before = world.pve.state().request_log().len();
    world
        .set_token("egress@pve!operator=00000000-0000-0000-0000-000000000000")
        .await;
    eventually("the unknown token is used", || async {
        pc_condition(&world, conditions::READY).await == ("False".into(), "Unauthorized".into())
    })
    .await;
    let log = world.pve.state().request_log();
    assert!(
        log[before..].iter().any(|r| r.status == Some(401)),
        "pvesim refused the new token"
    );

    world.set_token(world.pve.token()).await;
    eventually("the good token is used again", || async {
        pc_condition(&world, conditions::READY).await.0 == "True"
    })
    .await;
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_leader_reconciles_and_a_follower_takes_over_when_it_stops() {
    let world = World::start().await;
    let a = Replica::leader(&world, "a").await;
    let b = Replica::start(&world, "b").await;
    world.create_proxy("first", PC).await;
    world.until_running("first").await;
    assert!(a.proxy_reconciles() > 0);
    assert_eq!(b.proxy_reconciles(), 0, "the follower does not reconcile");
    assert_eq!(lease_holder(&world).await.as_deref(), Some("a"));

    assert_eq!(a.stop().await, ExitCode::SUCCESS, "a graceful stop exits 0");
    eventually("b leads", || async {
        lease_holder(&world).await.as_deref() == Some("b")
    })
    .await;
    world.create_proxy("second", PC).await;
    world.until_running("second").await;
    assert!(b.proxy_reconciles() > 0, "the new leader reconciles");
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_that_loses_its_lease_stops_and_exits_non_zero() {
    let world = World::start().await;
    let a = Replica::leader(&world, "a").await;
    // The Lease names `a` as soon as its first write lands, before `a` itself has read it back
    // and started leading: an intruder taken over then leaves `a` a follower waiting out the
    // intruder's hour, never a leader that lost. Wait until `a` reconciles, i.e. leads.
    world.create_proxy("first", PC).await;
    world.until_running("first").await;
    assert!(a.proxy_reconciles() > 0, "the leader reconciles");
    // Someone else holds the lease now, freshly renewed, for a long time.
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), OPERATOR_NAMESPACE);
    // Put it back as often as the leader renews over it, until the leader sees it lost.
    let mut task = a.task;
    let start = Instant::now();
    let code = loop {
        let mut lease = leases.get(kube_mode::LEASE_NAME).await.unwrap();
        let spec = lease.spec.get_or_insert_default();
        spec.holder_identity = Some("intruder".into());
        spec.lease_duration_seconds = Some(3600);
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        // A conflict means the leader renewed in between: take it again.
        let _ = leases
            .replace(kube_mode::LEASE_NAME, &PostParams::default(), &lease)
            .await;
        match tokio::time::timeout(Duration::from_millis(200), &mut task).await {
            Ok(finished) => break finished.unwrap().unwrap(),
            Err(_) => assert!(start.elapsed() < LIMIT, "the leader never noticed"),
        }
    };
    assert_eq!(code, ExitCode::from(1));
}

#[allow(dead_code)]
fn unused(_: Value) {}

/// The clones pvesim ran: one per VM made.
fn clones(world: &World) -> usize {
    world
        .pve
        .state()
        .tasks()
        .iter()
        .filter(|task| task.task_type == "qmclone")
        .count()
}

/// Waits until Proxy `name` has been brought back `restarts` times and runs again; returns its
/// status.
async fn until_recovered(
    world: &World,
    name: &str,
    restarts: u32,
) -> egress_operator::crd::ProxyStatus {
    eventually(
        &format!("{name} recovered {restarts} time(s) and running"),
        || async {
            world
                .proxy(name)
                .await
                .and_then(|proxy| proxy.status)
                .is_some_and(|status| {
                    status.restarts == restarts
                        && status.phase == Some(Phase::Running)
                        && !status.addresses.is_empty()
                })
        },
    )
    .await;
    world.proxy(name).await.unwrap().status.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_node_reboot_that_starts_nothing_every_proxy_vm_is_started_again() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    let names = ["web", "api", "mail"];
    for name in names {
        world.create_proxy(name, PC).await;
    }
    let mut before = BTreeMap::new();
    for name in names {
        let status = world.until_running(name).await.status.unwrap();
        before.insert(name, status.provider_id.unwrap());
    }
    let vms = world.pve.state().vmids();
    let made = clones(&world);

    // The host reboots and its boot starts nothing: the operator alone brings them back.
    let reboot = world.pve.reboot_node("pv1-1", false).unwrap();
    assert_eq!(reboot.stopped.len(), 3, "{reboot:?}");
    for name in names {
        let status = until_recovered(&world, name, 1).await;
        assert_eq!(
            status.provider_id.as_ref(),
            Some(&before[name]),
            "the same VM"
        );
        let last = status.last_recovery.expect("the recovery is recorded");
        assert_eq!(
            (last.action, last.reason.as_str()),
            (RecoveryPolicy::Restart, "stopped")
        );
        // Events follow the status write.
        eventually(&format!("a VMRestarted Event on {name}"), || async {
            world
                .event_reasons(name)
                .await
                .contains(&"VMRestarted".to_owned())
        })
        .await;
    }
    assert_eq!(
        world.pve.state().vmids(),
        vms,
        "nothing made, nothing left behind"
    );
    assert_eq!(clones(&world), made, "restarted, not cloned again");
    assert_eq!(
        replica
            .operator
            .metrics
            .recoveries(PC, "restart", "stopped"),
        3
    );
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vm_stopped_by_hand_is_started_again_and_only_that_one() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    world.create_proxy("web", PC).await;
    world.create_proxy("api", PC).await;
    let web = world
        .until_running("web")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();
    world.until_running("api").await;

    world.pve.stop_vm(vmid(&web)).unwrap();
    let status = until_recovered(&world, "web", 1).await;
    assert_eq!(status.provider_id, Some(web));
    assert_eq!(
        world.proxy("api").await.unwrap().status.unwrap().restarts,
        0,
        "the other Proxy was left alone"
    );
    replica.stop().await;
}

/// The operator's resync is an hour here: only the ProviderConfig's `resyncSeconds` can notice
/// the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_configs_resync_seconds_bounds_how_soon_a_stop_is_noticed() {
    let world = World::start().await;
    world
        .provider_configs()
        .patch(
            PC,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resyncSeconds": 1}})),
        )
        .await
        .unwrap();
    let replica = Replica::leader_with(&world, "a", no_resync()).await;
    world.create_proxy("web", PC).await;
    let web = world
        .until_running("web")
        .await
        .status
        .unwrap()
        .provider_id
        .unwrap();
    world.pve.stop_vm(vmid(&web)).unwrap();
    until_recovered(&world, "web", 1).await;
    replica.stop().await;
}

/// Kubernetes mode by image: the pull credentials from a Secret of type
/// `kubernetes.io/dockerconfigjson` in the cluster, the registry's CA and the signing key from
/// ConfigMaps; a ProviderConfig pinned by digest serves a Proxy, and one naming a tag alone is
/// refused by the server (a cluster requires the digest; the CRD's rule says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_config_by_image_serves_and_a_tag_alone_is_refused_in_a_cluster() {
    let world = World::start().await;
    let registry = oci_support::Registry::start();
    let keys = tempfile::tempdir().unwrap();
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let key_file = keys.path().join("release.key");
    std::fs::write(&key_file, pair.serialize_pem()).unwrap();
    let reference = registry.reference("providers/proxmox:1.0");
    let file = proxmox_support::component();
    let output = oci_support::run_against(
        &registry,
        &[
            "provider",
            "push",
            oci_support::path_str(&file),
            &reference,
            "--sign",
            oci_support::path_str(&key_file),
        ],
    );
    assert!(output.status.success(), "{}", oci_support::stderr(&output));
    let pinned = oci_support::stdout(&output).trim().to_owned();

    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "regcred", "namespace": OPERATOR_NAMESPACE},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": std::fs::read_to_string(&registry.auth_file).unwrap()},
    });
    world
        .secrets()
        .create(
            &PostParams::default(),
            &serde_json::from_value(secret).unwrap(),
        )
        .await
        .unwrap();
    let maps = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "registry", "namespace": OPERATOR_NAMESPACE},
        "data": {
            "ca.crt": std::fs::read_to_string(&registry.ca_file).unwrap(),
            "release.pub": pair.public_key_pem(),
        },
    });
    world
        .configmaps()
        .create(
            &PostParams::default(),
            &serde_json::from_value(maps).unwrap(),
        )
        .await
        .unwrap();
    let by_image = |name: &str, image: &str| {
        let mut pc = world.provider_config_spec("Off", 9001);
        pc["component"] = json!({
            "image": image,
            "registry": {
                "pullSecret": "regcred",
                "caConfigMapRef": {"name": "registry", "key": "ca.crt"},
            },
            "signedBy": [{"configMapRef": {"name": "registry", "key": "release.pub"}}],
        });
        serde_json::from_value::<ProviderConfig>(json!({
            "apiVersion": "egress-operator.io/v1alpha1", "kind": "ProviderConfig",
            "metadata": {"name": name},
            "spec": pc,
        }))
        .unwrap()
    };
    let replica = Replica::leader(&world, "a").await;
    world
        .provider_configs()
        .create(&PostParams::default(), &by_image("by-image", &pinned))
        .await
        .unwrap();
    // The CRD's rule refuses a tag alone before the operator ever sees it.
    match world
        .provider_configs()
        .create(&PostParams::default(), &by_image("by-tag", &reference))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains("pinned by digest"), "{status:?}");
        }
        other => panic!("a tag alone was admitted: {other:?}"),
    }
    world.create_proxy("web", "by-image").await;
    world.until_running("web").await;
    let status = world.provider_config("by-image").await.status.unwrap();
    assert_eq!(
        status.loaded.unwrap().image.as_deref(),
        Some(pinned.as_str())
    );
    replica.stop().await;
}

// ---- The operator binary, as a Pod runs it ----

/// `egress-operator run` in Kubernetes mode, a process of its own, authenticated as the operator's
/// ServiceAccount through a kubeconfig, as the Deployment runs it (without `--installation`: the
/// cluster names it). Its stderr is kept; dropping it kills it.
struct OperatorProcess {
    child: std::sync::Mutex<std::process::Child>,
    log: PathBuf,
    name: String,
    _components: tempfile::TempDir,
}

impl OperatorProcess {
    /// Start replica `name` with a `lease_seconds` Lease.
    async fn start(world: &World, name: &str, lease_seconds: u64) -> OperatorProcess {
        let components = tempfile::tempdir().unwrap();
        std::fs::copy(
            proxmox_support::component(),
            components.path().join("proxmox.wasm"),
        )
        .unwrap();
        let kubeconfig = world.files.path().join(format!("{name}.kubeconfig"));
        let token = world.cluster.operator_token().await;
        world
            .cluster
            .plane
            .write_kubeconfig(&kubeconfig, &token)
            .unwrap();
        let log = world.files.path().join(format!("{name}.log"));
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_egress-operator"))
            .args(["run", "--namespace", OPERATOR_NAMESPACE, "--pod-name", name])
            .arg("--components")
            .arg(components.path())
            .arg("--cache-dir")
            .arg(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube-mode-cache"))
            .args(["--resync-seconds", "1", "--lease-seconds"])
            .arg(lease_seconds.to_string())
            .env("KUBECONFIG", &kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("OPERATOR_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the operator starts");
        OperatorProcess {
            child: std::sync::Mutex::new(child),
            log,
            name: name.to_owned(),
            _components: components,
        }
    }

    /// Its log, and how it ended if it did.
    fn log(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        match self.child.lock().unwrap().try_wait().unwrap() {
            Some(status) => format!("{log}\n[{} exited: {status}]", self.name),
            None => log,
        }
    }

    /// Whether it still runs.
    fn alive(&self) -> bool {
        self.child.lock().unwrap().try_wait().unwrap().is_none()
    }

    /// SIGKILL, as a lost node or an OOM kill ends it: nothing is released.
    fn kill(&self) {
        let mut child = self.child.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGTERM, as the kubelet stops it; its exit status.
    async fn terminate(self) -> std::process::ExitStatus {
        let pid = self.child.lock().unwrap().id();
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe {
            libc::kill(pid as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.lock().unwrap().try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not stop", self.name);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// This cluster's installation, as the operator names it: `cluster-` and kube-system's UID.
async fn cluster_installation(world: &World) -> String {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(world.client.clone());
    let uid = namespaces.get("kube-system").await.unwrap().uid().unwrap();
    format!("cluster-{uid}")
}

/// Issue 31: the operator's whole life as the ServiceAccount `deploy/rbac.yaml` binds, with
/// exactly that role, through the binary as a Pod runs it: it names the installation after the
/// cluster, takes the lease, creates a VM with the status written and Events recorded, restarts a
/// VM stopped by hand, sweeps an orphan, deletes a Proxy through its finalizer, and on SIGTERM
/// releases the lease and exits 0; never a Forbidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn as_its_service_account_the_operator_lives_its_whole_life() {
    let world = World::start().await;
    let installation = cluster_installation(&world).await;
    let operator = OperatorProcess::start(&world, "a", 3).await;
    eventually("a leads", || async {
        lease_holder(&world).await.as_deref() == Some("a")
    })
    .await;

    let created = world.create_proxy("web", PC).await;
    let proxy = world.until_running("web").await;
    assert_eq!(proxy.finalizers(), [FINALIZER]);
    let status = proxy.status.unwrap();
    assert_eq!(status.installation.as_deref(), Some(installation.as_str()));
    let vmid = vmid(status.provider_id.as_deref().unwrap());
    let description = world.pve.state().guest(vmid).unwrap().config["description"].clone();
    assert!(
        description.contains(&format!("tag: {INSTALLATION_TAG}={installation}")),
        "{description}"
    );
    eventually("VMCreated and Ready recorded", || async {
        let reasons = world.event_reasons("web").await;
        reasons.contains(&"VMCreated".to_owned()) && reasons.contains(&"Ready".to_owned())
    })
    .await;

    world.pve.stop_vm(vmid).unwrap();
    until_recovered(&world, "web", 1).await;

    let orphan = {
        let provider = world.out_of_band().await;
        let uid = "0b7c3f0e-2222-4222-8333-944455556666";
        let request = CreateRequest {
            name: vm_name(uid),
            uid: uid.into(),
            tags: vec![
                Tag {
                    key: PROVIDER_CONFIG_TAG.into(),
                    value: PC.into(),
                },
                Tag {
                    key: INSTALLATION_TAG.into(),
                    value: installation.clone(),
                },
            ],
            user_data: "#cloud-config\n".into(),
            config: world.config_text(),
            placement: None,
        };
        match provider
            .call(Request::Create { request }, &CallContext::default())
            .await
        {
            Ok(Response::Create(vm)) => vm.provider_id,
            other => panic!("the orphan is made: {other:?}"),
        }
    };
    eventually("the orphan is swept", || async {
        world.pve.state().guest(self::vmid(&orphan)).is_none()
    })
    .await;

    world
        .proxies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Proxy is gone with its VM", || async {
        world.proxy("web").await.is_none()
            && world
                .vms_named(&vm_name(&created.uid().unwrap()))
                .is_empty()
    })
    .await;

    let log = operator.log();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    let status = operator.terminate().await;
    assert!(status.success(), "{status}");
    assert_eq!(
        lease_holder(&world).await,
        None,
        "the lease is released at once"
    );
}

/// Issue 31: each rule of `deploy/rbac.yaml` is needed. With any one removed, the operator's
/// life stops where that rule is used, the API's Forbidden is a log line naming what was refused
/// (retried, so it shows again), and the process keeps running: never a crash loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rule_of_the_role_is_needed_and_without_it_the_operator_says_why_and_keeps_running() {
    let rbac = std::fs::read_to_string(cluster_support::deploy().join("rbac.yaml")).unwrap();
    let documents: Vec<Value> = serde_norway::Deserializer::from_str(&rbac)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect();
    // (kind, rule index, what its absence is refused as)
    let rules: &[(&str, usize, &str)] = &[
        ("ClusterRole", 0, r#"cannot list resource "proxies""#),
        (
            "ClusterRole",
            1,
            r#"cannot patch resource "providerconfigs/status""#,
        ),
        ("ClusterRole", 2, r#"cannot list resource "secrets""#),
        ("ClusterRole", 3, r#"cannot create resource "events""#),
        ("ClusterRole", 4, r#"cannot get resource "namespaces""#),
        ("ClusterRole", 5, r#"cannot create resource "proxies""#),
        ("ClusterRole", 6, r#"cannot get resource "services""#),
        (
            "ClusterRole",
            7,
            r#"cannot patch resource "endpointslices""#,
        ),
        ("ClusterRole", 8, "cannot set blockOwnerDeletion"),
        ("Role", 0, r#"cannot get resource "leases""#),
    ];
    let role_rules = |kind: &str| {
        documents
            .iter()
            .find(|document| document["kind"] == kind)
            .unwrap()["rules"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(
        role_rules("ClusterRole") + role_rules("Role"),
        rules.len(),
        "every rule of deploy/rbac.yaml is tried"
    );
    for (kind, index, refused) in rules {
        let without: Vec<Value> = documents
            .iter()
            .cloned()
            .map(|mut document| {
                if document["kind"] == *kind {
                    document["rules"].as_array_mut().unwrap().remove(*index);
                }
                document
            })
            .collect();
        let text: String = without
            .iter()
            .map(|document| format!("---\n{}", serde_norway::to_string(document).unwrap()))
            .collect();
        let world = World::start_with_rbac("Delete", &text).await;
        let operator = OperatorProcess::start(&world, "a", 3).await;
        world.create_proxy("web", PC).await;
        let pool = crate::kube_pools::pool(1, "v1", Some(3128));
        let pools: Api<ProxyPool> = Api::namespaced(world.client.clone(), NAMESPACE);
        let pool = serde_json::from_value(pool).unwrap();
        pools.create(&PostParams::default(), &pool).await.unwrap();
        let deadline = Instant::now() + LIMIT;
        // Seen twice: refused, retried, refused again.
        while operator.log().matches(refused).count() < 2 {
            assert!(
                Instant::now() < deadline,
                "without {kind} rule {index}, no {refused:?} in the log:\n{}",
                operator.log()
            );
            assert!(operator.alive(), "it exited:\n{}", operator.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(operator.alive(), "it exited:\n{}", operator.log());
    }
}

/// Every Proxy `names` has exactly one VM and one seed on pvesim, and pvesim holds no other
/// VM or seed: nothing duplicated, nothing half-made left behind.
async fn one_vm_and_seed_each(world: &World, names: &[String]) {
    let mut expected_vms = Vec::new();
    for name in names {
        let uid = world.proxy(name).await.unwrap().uid().unwrap();
        let vms = world.vms_named(&vm_name(&uid));
        assert_eq!(vms.len(), 1, "{name}: {vms:?}");
        expected_vms.push(vms[0].vmid);
    }
    let state = world.pve.state();
    let mut all: Vec<u32> = state
        .vmids()
        .into_iter()
        .filter(|vmid| {
            state
                .guest(*vmid)
                .is_some_and(|guest| !guest.config.contains_key("template"))
        })
        .collect();
    all.sort();
    expected_vms.sort();
    assert_eq!(all, expected_vms, "no other VM");
    assert_eq!(
        state.volumes("proxy-seeds").len(),
        names.len(),
        "one seed each"
    );
}

/// Issue 31: two replicas of the binary on one server. Only the leader reconciles; the leader
/// killed (SIGKILL) in the middle of creating Proxies is replaced by the other within the lease's
/// bound, and no Proxy gets a second VM; a graceful stop releases the lease at once, so the next
/// replica leads without waiting out the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_leader_is_replaced_within_the_lease_and_no_proxy_gets_a_second_vm() {
    const LEASE: u64 = 4;
    let world = World::start().await;
    let a = OperatorProcess::start(&world, "a", LEASE).await;
    eventually("a leads", || async {
        lease_holder(&world).await.as_deref() == Some("a")
    })
    .await;
    let b = OperatorProcess::start(&world, "b", LEASE).await;
    eventually("b stands by", || async {
        b.log().contains("standing by for the lease")
    })
    .await;

    let names: Vec<String> = (0..6).map(|index| format!("p{index}")).collect();
    for name in &names {
        world.create_proxy(name, PC).await;
    }
    // In the middle of it: one VM made, not every Proxy running yet.
    eventually("a first VM", || async {
        world
            .proxy("p0")
            .await
            .and_then(|proxy| proxy.status?.provider_id)
            .is_some()
    })
    .await;
    a.kill();
    // Read once a is dead, the Lease holds a's last renewal.
    let last_renewal = lease(&world)
        .await
        .renew_time
        .expect("a renewed the lease")
        .0;
    eventually("b takes the lease", || async {
        lease_holder(&world).await.as_deref() == Some("b")
    })
    .await;
    // The bound is taken from the times the replicas wrote, not from this test's polling: a's
    // lease runs out LEASE seconds after its last renewal and b takes it within a second or so;
    // a follower that waited out a second lease would be past 2 × LEASE.
    let acquired = lease(&world)
        .await
        .acquire_time
        .expect("b acquired the lease")
        .0;
    let takeover = acquired.duration_since(last_renewal);
    assert!(
        takeover < k8s_openapi::jiff::SignedDuration::from_secs(2 * LEASE as i64),
        "b took over {takeover:?} after a's last renewal"
    );
    eventually("b reconciles", || async {
        b.log().contains("leading: reconciling")
    })
    .await;
    for name in &names {
        world.until_running(name).await;
    }
    one_vm_and_seed_each(&world, &names).await;
    assert_eq!(clones(&world), names.len(), "one clone per Proxy");

    // SIGTERM: the lease is released before b exits, not left to run out, so the next replica
    // finds it free.
    assert!(b.terminate().await.success());
    let released = lease(&world).await;
    assert_eq!(
        (released.holder_identity, released.renew_time),
        (None, None),
        "b exited still holding the lease"
    );
    let c = OperatorProcess::start(&world, "c", LEASE).await;
    eventually("c leads", || async {
        lease_holder(&world).await.as_deref() == Some("c")
    })
    .await;
    world.create_proxy("after", PC).await;
    world.until_running("after").await;
    let mut all = names.clone();
    all.push("after".into());
    one_vm_and_seed_each(&world, &all).await;
    drop(c);
}

/// Issue 31: the API server misbehaving under a running operator (the binary): kube-apiserver
/// killed in the middle of creating Proxies and started again; etcd killed and started again; its
/// history compacted under a restarted API server, so the operator's watches resume from a
/// version the server no longer has (410 Gone) and list again; another writer changing a
/// Proxy's status. Each time the operator keeps running, reconnects and converges, and pvesim
/// holds exactly one VM and one seed per Proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_survives_the_api_server_and_etcd_going_away_and_expired_watches() {
    let mut world = World::start().await;
    let operator = OperatorProcess::start(&world, "a", 5).await;
    eventually("a leads", || async {
        lease_holder(&world).await.as_deref() == Some("a")
    })
    .await;
    let mut names: Vec<String> = Vec::new();

    // kube-apiserver dies while the Proxies are being made.
    create_more(&world, &mut names, 4).await;
    eventually("a first VM", || async {
        world
            .proxy("p0")
            .await
            .and_then(|proxy| proxy.status?.provider_id)
            .is_some()
    })
    .await;
    world.cluster.plane.kill_apiserver();
    let deadline = Instant::now() + LIMIT;
    while !operator.log().contains("watch failed; retrying") {
        assert!(Instant::now() < deadline, "{}", operator.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(operator.alive(), "{}", operator.log());
    world.cluster.plane.start_apiserver().await.unwrap();
    for name in &names {
        world.until_running(name).await;
    }
    one_vm_and_seed_each(&world, &names).await;

    // etcd dies under the API server.
    create_more(&world, &mut names, 2).await;
    world.cluster.plane.kill_etcd();
    world.cluster.plane.start_etcd().await.unwrap();
    for name in &names {
        world.until_running(name).await;
    }
    one_vm_and_seed_each(&world, &names).await;

    // A watch that expired: history compacted, the API server's watch cache restarted from now.
    create_more(&world, &mut names, 1).await;
    world.until_running(names.last().unwrap()).await;
    let expired = || operator.log().matches("too old resource version").count();
    let before = expired();
    world.cluster.plane.kill_apiserver();
    world.cluster.plane.compact().await.unwrap();
    world.cluster.plane.start_apiserver().await.unwrap();
    let deadline = Instant::now() + LIMIT;
    while expired() <= before {
        assert!(
            Instant::now() < deadline,
            "no expired watch:\n{}",
            operator.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    create_more(&world, &mut names, 1).await;
    let last = names.last().unwrap().clone();
    let deadline = Instant::now() + LIMIT;
    while !world
        .proxy(&last)
        .await
        .and_then(|proxy| proxy.status)
        .is_some_and(|status| status.phase == Some(Phase::Running))
    {
        assert!(
            Instant::now() < deadline,
            "{last} was never made after the watch expired:\n{}",
            operator.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in &names {
        world.until_running(name).await;
    }

    // Another writer takes a Proxy's status: the operator's next write takes it back.
    let patch = json!({"status": {"phase": "Failed"}});
    let someone_else = PatchParams {
        field_manager: Some("someone-else".into()),
        ..PatchParams::default()
    };
    world
        .proxies()
        .patch_status("p0", &someone_else, &Patch::Merge(&patch))
        .await
        .unwrap();
    world.until_running("p0").await;
    one_vm_and_seed_each(&world, &names).await;
    assert!(operator.alive(), "{}", operator.log());
}

/// Creates `count` more Proxies named after their position in `names`.
async fn create_more(world: &World, names: &mut Vec<String>, count: usize) {
    for _ in 0..count {
        let name = format!("p{}", names.len());
        world.create_proxy(&name, PC).await;
        names.push(name);
    }
}

/// Issue 32: a local-mode folder beside a cluster, each with a ProviderConfig of the same name on
/// one pvesim, both sweeping in `Delete` mode every second. Through a minute of sweeps (60 of
/// each) every VM of both stays: each installation sees the other's VMs as foreign.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_folder_beside_a_cluster_with_the_same_provider_config_name_keeps_every_vm() {
    let world = World::start().await;
    let replica = Replica::leader(&world, "a").await;
    let mut local = local_support::Folder::new(&[local_support::component()]);
    local.write(
        "providerconfig.yaml",
        &local_support::provider_config_named(&world.pve, PC, "Delete"),
    );
    local.write(
        "credentials.yaml",
        &local_support::credentials(&world.pve, world.pve.token()),
    );
    for name in ["l1", "l2"] {
        local.write(
            &format!("proxy-{name}.yaml"),
            &local_support::proxy("default", name).replace("proxmox-lab", PC),
        );
    }
    local.start_listening();
    for name in ["k1", "k2"] {
        world.create_proxy(name, PC).await;
    }
    for name in ["k1", "k2"] {
        world.until_running(name).await;
    }
    local.wait_until("both local Proxies running", LIMIT, |proxies| {
        proxies.len() == 2 && proxies.iter().all(local_support::running)
    });
    let vms = world.pve.state().vmids();

    // Each sweep with suspects lists twice: by ProviderConfig, then by installation.
    let listings = format!(
        r#"egress_provider_calls_total{{provider="{PC}",operation="list-by-tag",outcome="ok"}}"#
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        assert_eq!(
            world.pve.state().vmids(),
            vms,
            "a VM went:\n{}",
            local.log()
        );
        let local_sweeps = counter(&local.metrics().await.unwrap_or_default(), &listings) / 2;
        let cluster_sweeps = counter(&replica.operator.metrics.encode(), &listings) / 2;
        if local_sweeps >= 60 && cluster_sweeps >= 60 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "too few sweeps: local {local_sweeps}, cluster {cluster_sweeps}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for name in ["k1", "k2"] {
        world.until_running(name).await;
    }
    assert!(local.proxies().iter().all(local_support::running));
    let orphans = world
        .provider_config(PC)
        .await
        .status
        .unwrap()
        .orphans
        .unwrap();
    assert_eq!((orphans.foreign, orphans.deleted), (2, 0), "{orphans:?}");
    eventually("ForeignVMs recorded once", || async {
        world
            .event_reasons(PC)
            .await
            .iter()
            .filter(|reason| *reason == "ForeignVMs")
            .count()
            == 1
    })
    .await;
    // Reported once each: the cluster's two VMs may appear in one sweep or in two (the local
    // folder sweeps from its start, while the cluster is still making them), never twice.
    let log = local.log();
    let mut reported: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("reason=ForeignVMs"))
        .flat_map(|line| {
            let named = line
                .split("never deleted here: ")
                .nth(1)
                .unwrap_or_default();
            named
                .split(" object=")
                .next()
                .unwrap_or_default()
                .split(", ")
        })
        .collect();
    reported.sort();
    let mut cluster_vms = Vec::new();
    for name in ["k1", "k2"] {
        let status = world.until_running(name).await.status.unwrap_or_default();
        cluster_vms.push(status.provider_id.unwrap_or_default());
    }
    cluster_vms.sort();
    assert_eq!(reported, cluster_vms, "{log}");
    replica.stop().await;
}
