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

/// A free TCP port on the loopback, for the simulator's per-VM proxy services.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A simulator whose VMs each run a proxy service at `port` on an address of their own, and a
/// folder of the tests' ProviderConfig.
async fn with_services(port: u16) -> Local {
    let local = Local::with_sim(pvesim::SimConfig {
        task_latency: Duration::from_millis(5),
        agent_delay: Duration::from_millis(50),
        service_port: Some(port),
        ..pvesim::SimConfig::default()
    })
    .await;
    // A resync longer than the tests' bound: only the probes' verdicts reconcile a running VM.
    let config = crate::local_support::provider_config(&local.sim, "Delete")
        .replace("  orphanSweep:", "  resyncSeconds: 3600\n  orphanSweep:");
    local.write("providerconfig.yaml", &config);
    local
}

/// A health check of `probe` (`tcp: {port: P}` or `httpConnect: {…}`): every 2 s, one failure
/// is enough, no startup grace.
fn health_check(probe: &str) -> String {
    format!(
        "healthCheck: {{{probe}, periodSeconds: 2, timeoutSeconds: 1, failureThreshold: 1, \
         startupSeconds: 0}}"
    )
}

/// A pool of `replicas` whose Proxies are health-checked at `port`, remediating at most
/// `max_unhealthy` at once.
fn checked_pool(replicas: u32, port: u16, max_unhealthy: u32) -> String {
    format!(
        "apiVersion: egress-operator.io/v1alpha1\nkind: ProxyPool\nmetadata: {{name: web, namespace: team-a}}\n\
         spec:\n  replicas: {replicas}\n  remediation: {{maxUnhealthy: {max_unhealthy}}}\n  template:\n    spec:\n      \
         providerConfigRef: proxmox-lab\n      {}\n",
        health_check(&format!("tcp: {{port: {port}}}"))
    )
}

/// Ready, and its service passing the health check.
fn passing(proxy: &ProxyRecord) -> bool {
    running(proxy)
        && condition(&proxy.status.conditions, "HealthCheckSucceeded")
            .is_some_and(|check| check.status == "True")
}

/// The simulator's VM id of `proxy`'s VM.
fn vmid(local: &Local, proxy: &ProxyRecord) -> u32 {
    let name = egress_operator::marks::vm_name(&proxy.uid);
    local
        .vms()
        .into_iter()
        .find(|(_, vm)| *vm == name)
        .map(|(vmid, _)| vmid)
        .unwrap_or_else(|| panic!("no VM named {name}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_member_whose_service_stops_answering_is_replaced_and_a_storm_past_max_unhealthy_halts() {
    let port = free_port();
    let mut local = with_services(port).await;
    local.write("pool.yaml", &checked_pool(3, port, 1));
    local.start();
    local.wait_until("three members passing", LIMIT, |proxies| {
        let members = members(proxies);
        members.len() == 3 && members.iter().all(|proxy| passing(proxy))
    });
    let first = members(&local.proxies())[0].clone();
    let broken = vmid(&local, &first);
    local
        .sim
        .set_service(broken, pvesim::ServiceMode::Refuse)
        .unwrap();
    local.wait_until("the broken member replaced", LIMIT, |proxies| {
        let members = members(proxies);
        members.len() == 3
            && !members.iter().any(|proxy| proxy.uid == first.uid)
            && members.iter().all(|proxy| passing(proxy))
    });
    assert!(
        local.vms().iter().all(|(vmid, _)| *vmid != broken),
        "the unhealthy VM is gone"
    );
    assert_eq!(local.vms().len(), 3);

    // Two of three fail at once, more than maxUnhealthy (1): the pool halts and replaces none.
    // Their probes fall up to a period apart, so the first may be seen alone and its
    // remediation begin: a VM's destruction held for 10 s keeps it counted (a member being
    // deleted counts until gone) when the second is seen.
    local.sim.faults().add(pvesim::FaultRule::new(
        "DELETE",
        "/nodes/*/qemu/*",
        pvesim::Trigger::Always,
        pvesim::FaultAction::Delay(Duration::from_secs(10)),
    ));
    let proxies = local.proxies();
    let two: Vec<ProxyRecord> = members(&proxies).into_iter().take(2).cloned().collect();
    for proxy in &two {
        let vmid = vmid(&local, proxy);
        local
            .sim
            .set_service(vmid, pvesim::ServiceMode::Refuse)
            .unwrap();
    }
    let started = Instant::now();
    loop {
        let pools = local.pools();
        let halted = pools.first().and_then(|pool| {
            condition(
                &pool.status.conditions,
                egress_operator::pool::REMEDIATION_HALTED,
            )
            .cloned()
        });
        if halted.is_some_and(|c| c.status == "True" && c.reason == reasons::TOO_MANY_UNHEALTHY) {
            break;
        }
        assert!(started.elapsed() < LIMIT, "no halt: {pools:#?}");
        std::thread::sleep(Duration::from_millis(25));
    }
    // At most one of the two is being remediated: never both at once.
    let proxies = local.proxies();
    let remediated = two
        .iter()
        .filter(|proxy| !proxies.iter().any(|p| p.uid == proxy.uid && !p.deleting))
        .count();
    assert!(remediated <= 1, "both were remediated: {proxies:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_whose_service_stops_answering_is_replaced_by_its_recovery() {
    let port = free_port();
    let mut local = with_services(port).await;
    local.write(
        "proxy.yaml",
        &format!(
            "apiVersion: egress-operator.io/v1alpha1\nkind: Proxy\nmetadata: {{name: solo, namespace: default}}\n\
             spec:\n  providerConfigRef: proxmox-lab\n  {}\n",
            health_check(&format!(
                "httpConnect: {{port: {port}, target: \"example.com:443\"}}"
            ))
        ),
    );
    local.start();
    local.wait_until("the Proxy passing", LIMIT, |proxies| {
        proxies.iter().any(passing)
    });
    let solo = local.proxy("default/solo").unwrap();
    let broken = vmid(&local, &solo);
    local
        .sim
        .set_service(broken, pvesim::ServiceMode::Hang)
        .unwrap();
    // Replaced: the new VM's service passes (a VM of the same name may reuse the VM id).
    local.wait_until("a new VM passing", LIMIT, |proxies| {
        proxies.iter().any(|proxy| {
            passing(proxy)
                && proxy.status.restarts == 1
                && proxy
                    .status
                    .last_recovery
                    .as_ref()
                    .is_some_and(|last| last.reason == "unhealthy")
        })
    });
    assert!(local.log().contains("was unhealthy; replacing it"));
    assert_eq!(local.vms().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn scaled_three_to_five_to_two_a_pool_ends_with_exactly_that_many_vms() {
    let mut local = Local::new().await;
    for replicas in [3, 5, 2] {
        local.write("pool.yaml", &pool(replicas, "v1", ""));
        if replicas == 3 {
            local.start_listening();
        }
        let want = replicas as usize;
        local.wait_until(&format!("{want} members running"), LIMIT, |proxies| {
            let members = members(proxies);
            members.len() == want && members.iter().all(|proxy| running(proxy))
        });
        assert_eq!(local.vms().len(), want);
    }
    // The pool's counts are gauged per pool, as in a cluster.
    let gauge = r#"egress_pool_replicas{namespace="team-a",pool="web",state="ready"}"#;
    let started = Instant::now();
    loop {
        let metrics = local.metrics().await.unwrap_or_default();
        if crate::metrics_support::counter(&metrics, gauge) == 2 {
            break;
        }
        assert!(started.elapsed() < LIMIT, "no gauge of 2 Ready:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_killed_mid_rollout_and_restarted_ends_with_the_right_vms_and_none_twice() {
    let mut local = Local::new().await;
    local.write("pool.yaml", &pool(3, "v1", ""));
    local.start();
    local.wait_until("three members running", LIMIT, |proxies| {
        let members = members(proxies);
        members.len() == 3 && members.iter().all(|proxy| running(proxy))
    });
    let first = local.pools()[0].status.template_hash.clone().unwrap();
    local.write("pool.yaml", &pool(3, "v2", ""));
    // Killed once the rollout has made a member of the new template.
    local.wait_until("a member of the new template", LIMIT, |proxies| {
        members(proxies).iter().any(|proxy| hash(proxy) != first)
    });
    local.kill();
    local.start();
    local.wait_until(
        "three members of the new template running",
        LIMIT,
        |proxies| {
            let members = members(proxies);
            members.len() == 3
                && members
                    .iter()
                    .all(|proxy| hash(proxy) != first && running(proxy) && !proxy.deleting)
        },
    );
    let started = Instant::now();
    while local.vms().len() != 3 {
        assert!(
            started.elapsed() < LIMIT,
            "VMs left over: {:?}",
            local.vms()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    // One VM per member, none made twice.
    let mut names: Vec<String> = local.vms().into_iter().map(|(_, name)| name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3);
    let expected: Vec<String> = members(&local.proxies())
        .iter()
        .map(|proxy| egress_operator::marks::vm_name(&proxy.uid))
        .collect();
    assert!(expected.iter().all(|name| names.contains(name)));
}
