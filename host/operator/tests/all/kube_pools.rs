//! ProxyPools in Kubernetes mode, end to end: the operator (`kube_mode::run_with`) as the
//! ServiceAccount `deploy/rbac.yaml` binds, against a real kube-apiserver and etcd, the Proxmox
//! component in the runtime, `pvesim` with a proxy service per VM (so health checks pass and
//! fail for real). Every wait polls a condition with a bound; nothing sleeps to synchronise.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_operator::conditions::condition;
use egress_operator::crd::{POOL_LABEL, Proxy, ProxyPool, TEMPLATE_HASH_LABEL};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use pvesim::{ServiceMode, SimConfig};
use serde_json::{Value, json};

use crate::cluster_support;
use crate::kube_mode::{LIMIT, NAMESPACE, PC, Replica, World, eventually};
use crate::proxmox_support;

const POOL: &str = "edge";

/// A world whose VMs each answer on a proxy port of their own; returns the port.
async fn world() -> (World, u16) {
    world_on(&["pv1-1"]).await
}

/// [`world`] on a Proxmox cluster of `nodes`.
async fn world_on(nodes: &[&str]) -> (World, u16) {
    let port = free_port();
    let sim = SimConfig {
        service_port: Some(port),
        nodes: nodes.iter().map(|node| node.to_string()).collect(),
        ..proxmox_support::quick_sim_config()
    };
    let rbac = std::fs::read_to_string(cluster_support::deploy().join("rbac.yaml")).unwrap();
    (World::start_with_sim("Delete", &rbac, sim).await, port)
}

/// A port no other test's simulator uses (each VM's service listens on it at its own address).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Pool [`POOL`] of `replicas`, its user-data saying `version`; with a TCP health check of
/// `port` (probed every 2 s, unhealthy at the first failure once started) if given.
pub(crate) fn pool(replicas: i32, version: &str, port: Option<u16>) -> Value {
    let mut spec = json!({
        "providerConfigRef": PC,
        "userData": {"inline": format!("#cloud-config\n# {version}\n")},
    });
    if let Some(port) = port {
        spec["healthCheck"] = json!({
            "tcp": {"port": port},
            "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 1, "startupSeconds": 60,
        });
    }
    json!({
        "apiVersion": "egress-operator.io/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": POOL, "namespace": NAMESPACE},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"team": "egress"}}, "spec": spec}},
    })
}

fn pools(world: &World) -> Api<ProxyPool> {
    Api::namespaced(world.client.clone(), NAMESPACE)
}

async fn apply_pool(world: &World, pool: Value) {
    let params = PatchParams::apply("test").force();
    pools(world)
        .patch(POOL, &params, &Patch::Apply(pool))
        .await
        .unwrap();
}

/// The pool's Proxies, by its label.
async fn members(world: &World) -> Vec<Proxy> {
    let selector = format!("{POOL_LABEL}={POOL}");
    Api::<Proxy>::namespaced(world.client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

fn is_ready(proxy: &Proxy) -> bool {
    let status = proxy.status.clone().unwrap_or_default();
    proxy.metadata.deletion_timestamp.is_none()
        && condition(&status.conditions, "Ready").is_some_and(|ready| ready.status == "True")
}

/// The VMs pvesim holds, templates left out.
fn vms(world: &World) -> usize {
    let state = world.pve.state();
    state
        .vmids()
        .into_iter()
        .filter_map(|vmid| state.guest(vmid))
        .filter(|guest| guest.config.get("template").is_none_or(|t| t != "1"))
        .count()
}

/// Waits until the pool has `replicas` members, all Ready, and pvesim that many VMs.
async fn settled(world: &World, replicas: usize) {
    eventually(&format!("{replicas} Ready members and VMs"), || async {
        let members = members(world).await;
        members.len() == replicas && members.iter().all(is_ready) && vms(world) == replicas
    })
    .await;
}

/// The pool's statuses, every one the watch delivers, from now on.
fn record_statuses(world: &World) -> (Arc<Mutex<Vec<Value>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let config = watcher::Config::default().fields(&format!("metadata.name={POOL}"));
    let stream = watcher::watcher(pools(world), config);
    let recorded = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(pool) | watcher::Event::InitApply(pool)) = event {
                let status = serde_json::to_value(&pool.status).unwrap();
                recorded.lock().unwrap().push(status);
            }
        }
    });
    (seen, task)
}

async fn event_reasons(world: &World, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(world.client.clone(), NAMESPACE);
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    listed
        .into_iter()
        .filter(|event| event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|event| event.reason)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_scales_3_to_5_by_kubectl_scale_then_to_2_and_its_deletion_leaves_no_vm() {
    let (world, _) = world().await;
    let operator = Replica::leader(&world, "a").await;
    apply_pool(&world, pool(3, "v1", None)).await;
    settled(&world, 3).await;
    let made = pools(&world).get(POOL).await.unwrap();
    let hash = made.status.clone().unwrap().template_hash.unwrap();
    for member in members(&world).await {
        let owner = &member.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ProxyPool", made.uid().unwrap().as_str())
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert!(member.name_any().starts_with(&format!("{POOL}-{hash}-")));
        assert_eq!(member.labels()[TEMPLATE_HASH_LABEL], hash);
        assert_eq!(member.labels()["team"], "egress");
    }
    assert_eq!(
        made.status.unwrap().selector.as_deref(),
        Some("egress-operator.io/pool=edge")
    );

    // The scale subresource, as kubectl writes it.
    let plane = &world.cluster.plane;
    let scaled = plane
        .kubectl_ok(&["scale", "-n", NAMESPACE, "proxypool/edge", "--replicas=5"])
        .await;
    assert!(scaled.contains("scaled"), "{scaled}");
    settled(&world, 5).await;
    eventually("the pool counts 5", || async {
        let status = pools(&world).get(POOL).await.unwrap().status.unwrap();
        (status.replicas, status.ready_replicas) == (5, 5)
    })
    .await;
    let replicas = plane
        .kubectl_ok(&[
            "get",
            "-n",
            NAMESPACE,
            "proxypool/edge",
            "-o",
            "jsonpath={.status.replicas}",
        ])
        .await;
    assert_eq!(replicas.trim(), "5");

    apply_pool(&world, pool(2, "v1", None)).await;
    settled(&world, 2).await;
    assert!(
        event_reasons(&world, POOL)
            .await
            .contains(&"ScaledIn".to_owned())
    );
    assert!(
        event_reasons(&world, POOL)
            .await
            .contains(&"Created".to_owned())
    );
    eventually("the gauges count 2", || async {
        let text = operator.operator.metrics.encode();
        text.contains(r#"egress_pool_replicas{namespace="default",pool="edge",state="ready"} 2"#)
    })
    .await;

    pools(&world)
        .delete(POOL, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the pool, its Proxies and their VMs gone", || async {
        pools(&world).get_opt(POOL).await.unwrap().is_none()
            && members(&world).await.is_empty()
            && vms(&world) == 0
    })
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_change_rolls_one_at_a_time_never_under_replicas_ready_nor_over_one_surge_vm() {
    let (world, port) = world().await;
    let operator = Replica::leader(&world, "a").await;
    apply_pool(&world, pool(3, "v1", Some(port))).await;
    settled(&world, 3).await;
    eventually("the pool counts 3 Ready", || async {
        let status = pools(&world).get(POOL).await.unwrap().status.unwrap();
        status.ready_replicas == 3
    })
    .await;
    let first = current_hash(&world).await;

    let (statuses, watch) = record_statuses(&world);
    apply_pool(&world, pool(3, "v2", Some(port))).await;
    let deadline = std::time::Instant::now() + 3 * LIMIT;
    let mut most = 0;
    loop {
        let count = vms(&world);
        most = most.max(count);
        assert!(count <= 4, "{count} VMs during the rollout (surge 1)");
        let members = members(&world).await;
        let second = current_hash(&world).await;
        let done = second != first
            && members.len() == 3
            && members
                .iter()
                .all(|m| is_ready(m) && m.labels()[TEMPLATE_HASH_LABEL] == second);
        if done && count == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rollout did not finish: {members:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(most, 4, "the rollout surged by one");
    eventually("the pool counts 3 updated and Ready", || async {
        let status = pools(&world).get(POOL).await.unwrap().status.unwrap();
        (status.ready_replicas, status.updated_replicas) == (3, 3)
    })
    .await;
    watch.abort();
    let statuses = statuses.lock().unwrap().clone();
    assert!(statuses.len() > 3, "a status per step: {statuses:#?}");
    for status in &statuses {
        assert!(
            status["readyReplicas"].as_i64() >= Some(3),
            "Ready fell: {status:#}"
        );
    }
    assert!(
        event_reasons(&world, POOL)
            .await
            .contains(&"RolledOut".to_owned())
    );
    operator.stop().await;
}

/// The pool's current template hash, as its status says.
async fn current_hash(world: &World) -> String {
    let pool = pools(world).get(POOL).await.unwrap();
    pool.status
        .and_then(|s| s.template_hash)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_whose_service_stops_answering_is_replaced_and_the_service_publishes_only_ready_ones()
 {
    let (world, port) = world().await;
    let operator = Replica::leader(&world, "a").await;
    apply_pool(&world, pool(2, "v1", Some(port))).await;
    settled(&world, 2).await;
    let services: Api<Service> = Api::namespaced(world.client.clone(), NAMESPACE);
    let slices: Api<EndpointSlice> = Api::namespaced(world.client.clone(), NAMESPACE);
    eventually("the Service and its EndpointSlice", || async {
        slices.get_opt(POOL).await.unwrap().is_some()
    })
    .await;
    let service = services.get(POOL).await.unwrap();
    let spec = service.spec.unwrap();
    assert!(spec.selector.is_none(), "selectorless");
    assert_eq!(spec.ports.unwrap()[0].port, i32::from(port));
    let slice = slices.get(POOL).await.unwrap();
    assert_eq!(slice.labels()["kubernetes.io/service-name"], POOL);
    assert_eq!(slice.ports.unwrap()[0].port, Some(i32::from(port)));
    // pvesim's services are on loopback, which the API server refuses in an EndpointSlice: the
    // operator leaves them out rather than fail.
    let endpoints = slice.endpoints.unwrap_or_default();
    assert!(endpoints.is_empty(), "{endpoints:?}");
    let loopback = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "loopback"}, "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.77.0.1"]}],
    });
    let refused = slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(loopback).unwrap(),
        )
        .await
        .expect_err("a loopback endpoint is refused");
    assert!(refused.to_string().contains("loopback"), "{refused}");

    let (statuses, watch) = record_statuses(&world);
    let broken = members(&world).await.remove(0);
    let provider_id = broken.status.clone().unwrap().provider_id.unwrap();
    world
        .pve
        .set_service(proxmox_support::vmid_of(&provider_id), ServiceMode::Refuse)
        .unwrap();
    eventually("the broken member replaced", || async {
        let members = members(&world).await;
        members.len() == 2
            && members
                .iter()
                .all(|m| m.name_any() != broken.name_any() && is_ready(m))
            && vms(&world) == 2
    })
    .await;
    watch.abort();
    assert!(
        event_reasons(&world, POOL)
            .await
            .contains(&"Remediated".to_owned())
    );
    let serving = |status: &Value, wanted: &str| {
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "Serving" && c["message"].as_str().is_some_and(|m| m.contains(wanted))
            })
    };
    let statuses = statuses.lock().unwrap().clone();
    assert!(
        statuses.iter().any(|status| serving(status, "of 1 Ready")),
        "the Service counted the broken member out: {statuses:#?}"
    );
    eventually("the Service counts the replacement in", || async {
        let status = pools(&world).get(POOL).await.unwrap().status;
        serving(&serde_json::to_value(status).unwrap(), "0 of 2 Ready")
    })
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_deleted_mid_rollout_leaves_no_proxy_vm_service_or_endpoint_slice() {
    let (world, port) = world().await;
    let operator = Replica::leader(&world, "a").await;
    apply_pool(&world, pool(3, "v1", Some(port))).await;
    settled(&world, 3).await;
    apply_pool(&world, pool(3, "v2", Some(port))).await;
    eventually("a surge member", || async {
        members(&world).await.len() == 4
    })
    .await;
    pools(&world)
        .delete(POOL, &DeleteParams::default())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(world.client.clone(), NAMESPACE);
    let slices: Api<EndpointSlice> = Api::namespaced(world.client.clone(), NAMESPACE);
    eventually("nothing of the pool left", || async {
        pools(&world).get_opt(POOL).await.unwrap().is_none()
            && members(&world).await.is_empty()
            && vms(&world) == 0
            && services.get_opt(POOL).await.unwrap().is_none()
            && slices.get_opt(POOL).await.unwrap().is_none()
    })
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_required_spread_reaches_the_provider_one_vm_a_node_and_a_third_member_waits() {
    let (world, _) = world_on(&["pv1-1", "pv1-2"]).await;
    // Clones to the other node go to the storage both nodes share.
    let mut config = proxmox_support::provider_config(&world.pve);
    config["targetStorage"] = json!(pvesim::SHARED_STORAGE);
    let patch = json!({"spec": {"config": config}});
    let pcs: Api<egress_operator::crd::ProviderConfig> = Api::all(world.client.clone());
    pcs.patch(PC, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let operator = Replica::leader(&world, "a").await;
    let mut spread = pool(2, "v1", None);
    spread["spec"]["spread"] = json!({"across": "Host", "policy": "Required"});
    apply_pool(&world, spread.clone()).await;
    settled(&world, 2).await;
    let placed = members(&world).await;
    let mut hosts: Vec<String> = placed
        .iter()
        .map(|m| m.status.clone().unwrap().host.unwrap())
        .collect();
    hosts.sort();
    assert_eq!(hosts, ["pv1-1", "pv1-2"], "one VM a node");
    for member in &placed {
        let request = &member.annotations()["egress-operator.io/placement"];
        let request: Value = serde_json::from_str(request).unwrap();
        assert_eq!(request["required"], true, "{request}");
    }

    // A third member has no node left: it waits, named as pending, and no VM is made.
    spread["spec"]["replicas"] = json!(3);
    apply_pool(&world, spread).await;
    eventually("the pool short of a host", || async {
        let status = pools(&world).get(POOL).await.unwrap().status.unwrap();
        condition(&status.conditions, "PlacementShortage")
            .is_some_and(|c| c.status == "True" && c.reason == "TooFewHosts")
    })
    .await;
    let all = members(&world).await;
    assert_eq!(all.len(), 3);
    let pending = all.iter().find(|m| !is_ready(m)).unwrap();
    let ready = condition(&pending.status.clone().unwrap().conditions, "Ready").cloned();
    assert_eq!(ready.unwrap().reason, "QuotaExceeded");
    assert_eq!(vms(&world), 2, "no VM on a node already used");
    operator.stop().await;
}
