//! ProxyPools in local mode, end to end: the real binary over a folder holding a pool, the
//! Proxmox component in the runtime, `pvesim` behind the broker. Each rule is watched on the
//! stored state, polled with a bound, never slept on.

use std::time::{Duration, Instant};

use egress_operator::conditions::condition;
use egress_operator::local::store::ProxyRecord;
use egress_operator::pool::{PLACEMENT_SHORTAGE, reasons};

use crate::local_support::{Local, running};

const LIMIT: Duration = Duration::from_secs(90);

/// A pool of `replicas` on the tests' ProviderConfig, its Proxies' user-data saying `version`.
fn pool(replicas: u32, version: &str, spread: &str) -> String {
    format!(
        "apiVersion: egress-operator.io/v1alpha1\nkind: ProxyPool\nmetadata: {{name: web, namespace: team-a}}\n\
         spec:\n  replicas: {replicas}\n{spread}  template:\n    spec:\n      providerConfigRef: proxmox-lab\n      \
         userData: {{inline: \"#cloud-config\\n# {version}\\n\"}}\n"
    )
}

/// The stored Proxies of pool `web`.
fn members(proxies: &[ProxyRecord]) -> Vec<&ProxyRecord> {
    proxies
        .iter()
        .filter(|proxy| proxy.membership.as_ref().is_some_and(|m| m.pool == "web"))
        .collect()
}

fn hash(proxy: &ProxyRecord) -> &str {
    proxy
        .membership
        .as_ref()
        .map_or("", |m| m.template_hash.as_str())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_keeps_its_replicas_rolls_a_change_one_at_a_time_scales_in_and_takes_its_vms_with_it()
 {
    let mut local = Local::new().await;
    local.write("pool.yaml", &pool(3, "v1", ""));
    local.start();
    local.wait_until("three Proxies of the pool running", LIMIT, |proxies| {
        let members = members(proxies);
        members.len() == 3 && members.iter().all(|proxy| running(proxy))
    });
    assert_eq!(local.vms().len(), 3);
    let first = local.pools()[0].status.template_hash.clone().unwrap();
    assert!(
        members(&local.proxies())
            .iter()
            .all(|proxy| hash(proxy) == first)
    );

    // A template change rolls through: surge 1, unavailable 0 (the defaults). At every look,
    // three Proxies are Ready and at most four hold a VM.
    local.write("pool.yaml", &pool(3, "v2", ""));
    let started = Instant::now();
    let mut most = 0;
    loop {
        let proxies = local.proxies();
        let members = members(&proxies);
        let second = local.pools()[0]
            .status
            .template_hash
            .clone()
            .unwrap_or_default();
        let ready = members
            .iter()
            .filter(|proxy| !proxy.deleting && running(proxy))
            .count();
        assert!(ready >= 3, "{ready} Ready during the rollout: {members:#?}");
        let vms = local.vms().len();
        most = most.max(vms);
        assert!(vms <= 4, "{vms} VMs during the rollout (surge 1)");
        let done = second != first
            && members.len() == 3
            && members
                .iter()
                .all(|proxy| hash(proxy) == second && running(proxy));
        if done && vms == 3 {
            break;
        }
        assert!(
            started.elapsed() < LIMIT,
            "the rollout did not finish: {members:#?}\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(most, 4, "the rollout surged by one");
    // The pool's status catches up at its next pass.
    let counted = Instant::now();
    loop {
        let status = local.pools()[0].status.clone();
        if (
            status.replicas,
            status.ready_replicas,
            status.updated_replicas,
        ) == (3, 3, 3)
        {
            break;
        }
        assert!(
            counted.elapsed() < LIMIT,
            "the pool's counts stay {status:#?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }

    // Scale in to one, then remove the pool: its Proxies and VMs go with it.
    local.write("pool.yaml", &pool(1, "v2", ""));
    local.wait_until("one Proxy of the pool", LIMIT, |proxies| {
        members(proxies).len() == 1
    });
    assert_eq!(local.vms().len(), 1);
    local.remove("pool.yaml");
    local.wait_until("no Proxy of the pool", LIMIT, |proxies| {
        members(proxies).is_empty()
    });
    assert!(local.vms().is_empty());
    let gone = Instant::now();
    while !local.pools().is_empty() {
        assert!(gone.elapsed() < LIMIT, "the pool record stays");
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_required_spread_over_one_node_places_one_vm_and_leaves_the_other_pending_with_the_reason()
 {
    let mut local = Local::new().await;
    let spread = "  spread: {across: Host, policy: Required}\n";
    local.write("pool.yaml", &pool(2, "v1", spread));
    local.start();
    // The simulator has one node: the second Proxy is asked to avoid it and cannot be placed.
    local.wait_until("one Proxy running, one pending", LIMIT, |proxies| {
        let members = members(proxies);
        members.len() == 2
            && members.iter().filter(|proxy| running(proxy)).count() == 1
            && members.iter().any(|proxy| {
                condition(&proxy.status.conditions, "Ready").is_some_and(|ready| {
                    ready.reason == "QuotaExceeded" && ready.message.contains("pv1-1")
                })
            })
    });
    assert_eq!(local.vms().len(), 1, "no VM on the node already used");
    let placed = members(&local.proxies())
        .into_iter()
        .find(|proxy| running(proxy))
        .and_then(|proxy| proxy.status.host.clone());
    assert_eq!(
        placed.as_deref(),
        Some("pv1-1"),
        "the provider says where the VM runs"
    );
    let started = Instant::now();
    loop {
        let pools = local.pools();
        let shortage = pools
            .first()
            .and_then(|pool| condition(&pool.status.conditions, PLACEMENT_SHORTAGE).cloned());
        if shortage
            .as_ref()
            .is_some_and(|c| c.status == "True" && c.reason == reasons::TOO_FEW_HOSTS)
        {
            break;
        }
        assert!(
            started.elapsed() < LIMIT,
            "no shortage condition: {pools:#?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}
