//! Local mode end to end: each reconcile path, with the real binary over a folder of manifests,
//! the Proxmox component sandboxed in it, and the `pvesim` simulator behind the egress broker.

use crate::local_support;

use std::ffi::{OsStr, OsString};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::local_support::{Local, credentials, provider_config, proxy, reason, running};
use crate::metrics_support::counter;
use egress_operator::conditions;
use egress_operator::local::store::Store;
use egress_operator::marks::vm_name;
use pvesim::{FaultAction, FaultRule, RunState, SimConfig, Trigger};

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn proxies_come_up_running_and_a_restart_adopts_their_vms() {
    let mut local = Local::new().await;
    for name in ["web", "batch", "ci"] {
        local.write(&format!("proxy-{name}.yaml"), &proxy("team-a", name));
    }
    local.start();
    local.wait_until("three Proxies running", LIMIT, |proxies| {
        proxies.len() == 3 && proxies.iter().all(running)
    });
    let before: Vec<_> = local
        .proxies()
        .into_iter()
        .map(|record| (record.proxy.uid, record.proxy.status.provider_id))
        .collect();
    for record in local.proxies() {
        assert_eq!(
            record.status.vm_name.as_deref(),
            Some(vm_name(&record.uid).as_str())
        );
        assert_eq!(reason(&record, conditions::PROVISIONED), "Running");
        assert!(
            record
                .status
                .provider
                .as_ref()
                .is_some_and(|handled| handled.provider_config == "proxmox-lab")
        );
    }
    assert_eq!(local.vms().len(), 3);

    // A restart keeps every UID and adopts every VM: nothing new is made.
    local.kill();
    local.start();
    local.wait_until("still three Proxies running", LIMIT, |proxies| {
        proxies.len() == 3 && proxies.iter().all(running)
    });
    let after: Vec<_> = local
        .proxies()
        .into_iter()
        .map(|record| (record.proxy.uid, record.proxy.status.provider_id))
        .collect();
    assert_eq!(before, after);
    assert_eq!(local.vms().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_deleted_behind_the_operators_back_is_made_again() {
    let mut local = Local::new().await;
    local.write("proxy.yaml", &proxy("default", "drift"));
    local.start();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let first = local
        .proxy("default/drift")
        .unwrap()
        .proxy
        .status
        .provider_id
        .unwrap();
    let vmid: u32 = first.rsplit('/').next().unwrap().parse().unwrap();

    // Someone destroys the VM through the API.
    local.sim.state().set_run_state(vmid, RunState::Stopped);
    let client = pve_client(&local);
    let answer = client
        .delete(format!(
            "{}/api2/json/nodes/pv1-1/qemu/{vmid}?purge=1",
            local.sim.url()
        ))
        .header("Authorization", local.sim.token_header())
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{answer:?}");

    // The provider derives the VMID from the name, so the new VM may take the old one's VMID:
    // what shows it is new is the operator's record of two creations.
    local.wait_until("a new VM running", LIMIT, |proxies| {
        proxies.iter().any(running) && local.log().matches("reason=VMCreated").count() == 2
    });
    assert!(local.log().contains("VMGone"), "{}", local.log());
    assert_eq!(local.vms().len(), 1);
    assert_eq!(
        local
            .proxy("default/drift")
            .unwrap()
            .proxy
            .status
            .provider_id
            .unwrap(),
        first
    );
    assert!(
        local
            .sim
            .state()
            .guest(vmid)
            .is_some_and(|guest| guest.run_state == RunState::Running)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transient_failure_is_retried_with_backoff_until_it_passes() {
    let mut local = Local::new().await;
    // The first two clones answer 500: transient. A rule counts only the requests that reach it
    // (the first rule that fires answers), so each rule fires on its own first one.
    for _ in 0..2 {
        local.sim.faults().add(FaultRule::new(
            "POST",
            "/nodes/*/qemu/*/clone",
            Trigger::Nth(1),
            FaultAction::Status {
                status: 500,
                message: "unable to create VM: out of luck".into(),
            },
        ));
    }
    local.write("proxy.yaml", &proxy("default", "retry"));
    let started = Instant::now();
    local.start();
    let saw_transient = std::cell::Cell::new(false);
    local.wait_until("the Proxy running after retries", LIMIT, |proxies| {
        if proxies
            .iter()
            .any(|record| reason(record, conditions::SYNCED) == "TransientError")
        {
            saw_transient.set(true);
        }
        proxies.iter().any(running)
    });
    assert!(
        saw_transient.get(),
        "the transient error was never reported"
    );
    let clones = local
        .sim
        .state()
        .request_log()
        .iter()
        .filter(|record| record.method == "POST" && record.path.ends_with("/clone"))
        .count();
    assert!(clones >= 3, "{clones} clone requests");
    // Two failures back off at least half of 1 s, then half of 2 s: not a hot loop.
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_permanent_failure_waits_for_a_spec_change_then_recovers() {
    let mut local = Local::new().await;
    // No orphan sweep: its list-by-tag reads the same listing a create attempt does.
    let broken =
        provider_config(&local.sim, "Off").replace("templateVmid: 9001", "templateVmid: 9999");
    local.write("providerconfig.yaml", &broken);
    local.write("proxy.yaml", &proxy("default", "stuck"));
    local.start_listening();
    local.wait_until("the Proxy failed permanently", LIMIT, |proxies| {
        proxies
            .iter()
            .any(|record| reason(record, conditions::READY) == "PermanentError")
    });
    let record = local.proxy("default/stuck").unwrap();
    assert!(
        egress_operator::conditions::condition(&record.status.conditions, conditions::READY)
            .unwrap()
            .message
            .contains("template 9999 does not exist")
    );
    // Nothing is retried while nothing changes: over three resyncs, create is not called again.
    // Create calls are counted by the operator's own metrics, which see each call. Resyncs are
    // counted by the simulator: only the resync's `check` reads /nodes here. (Counting creates
    // from the simulator's log was racy: a check and a create attempt both read the listing.)
    let resyncs = |local: &Local| {
        let log = local.sim.state().request_log();
        log.iter().filter(|r| r.path.ends_with("/nodes")).count()
    };
    let creates = |metrics: &str| {
        counter(
            metrics,
            r#"egress_provider_calls_total{provider="proxmox-lab",operation="create","#,
        )
    };
    let resyncs_before = resyncs(&local);
    let metrics = local.metrics().await.expect("the metrics port answers");
    assert_eq!(creates(&metrics), 1, "one create attempt:\n{metrics}");
    let started = Instant::now();
    loop {
        // Resyncs read before the metrics, so the last look covers the last resync.
        let resynced = resyncs(&local) >= resyncs_before + 3;
        let metrics = local.metrics().await.expect("the metrics port answers");
        assert_eq!(
            creates(&metrics),
            1,
            "the permanent failure was retried:\n{metrics}\n{}",
            local.log()
        );
        if resynced {
            break;
        }
        assert!(
            started.elapsed() < LIMIT,
            "no resyncs ran:\n{}",
            local.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A restart reconciles every Proxy; nothing changed, so the new process does not call create
    // (the stored status says the failure was permanent for this generation and component).
    local.kill();
    local.start_listening();
    let started = Instant::now();
    let metrics = loop {
        let reconciled = local.metrics().await.filter(|metrics| {
            counter(
                metrics,
                r#"controller_runtime_reconcile_total{controller="proxy","#,
            ) > 0
        });
        if let Some(metrics) = reconciled {
            break metrics;
        }
        assert!(
            started.elapsed() < LIMIT,
            "the restarted operator did not reconcile the Proxy:\n{}",
            local.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(creates(&metrics), 0, "retried after a restart:\n{metrics}");

    // Fixing the ProviderConfig is a change: the Proxy is tried again and recovers.
    local.write(
        "providerconfig.yaml",
        &provider_config(&local.sim, "Delete"),
    );
    local.wait_until("the Proxy running after the fix", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_vm_is_replaced_by_a_new_one() {
    let mut local = Local::new().await;
    local.write("proxy.yaml", &proxy("default", "phoenix"));
    local.start();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let first = local
        .proxy("default/phoenix")
        .unwrap()
        .proxy
        .status
        .provider_id
        .unwrap();
    let vmid: u32 = first.rsplit('/').next().unwrap().parse().unwrap();
    // Its guest agent is removed: the provider reports it failed (correction 9).
    assert!(local.sim.state().set_config(vmid, "agent", None));
    // The replacement may take the failed VM's VMID (derived from the name): it is new when it
    // was created a second time and has its guest agent again, as clones of the template do.
    local.wait_until("a replacement running", LIMIT, |proxies| {
        proxies.iter().any(running) && local.log().matches("reason=VMCreated").count() == 2
    });
    assert!(local.log().contains("reason=VMReplaced"), "{}", local.log());
    let vms = local.vms();
    assert_eq!(vms.len(), 1, "the failed VM was deleted: {vms:?}");
    let replacement = local.sim.state().guest(vms[0].0).unwrap();
    assert!(replacement.config.contains_key("agent"), "{replacement:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_manifest_deletes_the_vm_and_its_seed_then_the_record() {
    let mut local = Local::new().await;
    local.write("proxy-keep.yaml", &proxy("default", "keep"));
    local.write("proxy-gone.yaml", &proxy("default", "gone"));
    local.start();
    local.wait_until("two Proxies running", LIMIT, |proxies| {
        proxies.len() == 2 && proxies.iter().all(running)
    });
    assert_eq!(local.seeds().len(), 2);
    local.remove("proxy-gone.yaml");
    local.wait_until("the record gone", LIMIT, |proxies| proxies.len() == 1);
    assert_eq!(local.vms().len(), 1);
    let seeds = local.seeds();
    assert_eq!(seeds.len(), 1, "{seeds:?}");
    assert!(
        local
            .proxy("default/keep")
            .is_some_and(|record| running(&record))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_is_only_reported_in_report_mode_and_deleted_after_two_sweeps() {
    let mut local = Local::new().await;
    local.write(
        "providerconfig.yaml",
        &provider_config(&local.sim, "Report"),
    );
    local.write("proxy.yaml", &proxy("default", "lost"));
    local.start();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let orphan = local.proxy("default/lost").unwrap();
    // The operator loses its record of the Proxy (its state was reset): its VM is now an orphan,
    // and the Proxy gets a new UID and a new VM.
    local.kill();
    let store = Store::open(&local.path(".egress-operator/state.db")).unwrap();
    store.remove_proxy("default", "lost", &orphan.uid).unwrap();
    drop(store);
    local.start();
    local.wait_until("the Proxy running again", LIMIT, |proxies| {
        proxies
            .iter()
            .any(|record| running(record) && record.uid != orphan.uid)
    });
    let deadline = Instant::now() + LIMIT;
    while !local.log().contains("OrphanFound") {
        assert!(
            Instant::now() < deadline,
            "no orphan reported:\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(local.vms().len(), 2, "report mode deletes nothing");

    local.write(
        "providerconfig.yaml",
        &provider_config(&local.sim, "Delete"),
    );
    let gone = orphan.proxy.status.provider_id.unwrap();
    let vmid: u32 = gone.rsplit('/').next().unwrap().parse().unwrap();
    while local.vms().iter().any(|(id, _)| *id == vmid) {
        assert!(
            Instant::now() < deadline,
            "the orphan was not deleted:\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(local.vms().len(), 1);
    assert!(
        local.proxies().iter().all(running),
        "the live Proxy's VM was left alone"
    );
}

/// Issue 32: two installations (two local folders) use a ProviderConfig of the same name on one
/// hypervisor, both sweeping in `Delete` mode every second. Through a minute of sweeps (60 of
/// each) every VM of both stays and every Proxy stays Ready: each sees the other's VMs as foreign,
/// reports them once, and deletes none.
#[tokio::test(flavor = "multi_thread")]
async fn two_installations_sharing_a_provider_config_name_keep_each_others_vms() {
    let mut first = Local::new().await;
    let mut second = local_support::Folder::new(&[local_support::component()]);
    second.write(
        "providerconfig.yaml",
        &provider_config(&first.sim, "Delete"),
    );
    second.write(
        "credentials.yaml",
        &credentials(&first.sim, first.sim.token()),
    );
    for (folder, names) in [(&*first, ["a1", "a2"]), (&second, ["b1", "b2"])] {
        for name in names {
            folder.write(&format!("proxy-{name}.yaml"), &proxy("default", name));
        }
    }
    let first_addr = first.start_listening();
    let second_addr = second.start_listening();
    for folder in [&*first, &second] {
        folder.wait_until("both Proxies running", LIMIT, |proxies| {
            proxies.len() == 2 && proxies.iter().all(running)
        });
    }
    let vms = first.vms();
    assert_eq!(vms.len(), 4, "{vms:?}");

    // Each sweep with suspects lists twice: by ProviderConfig, then by installation.
    let sweeps = |metrics: &str| {
        counter(
            metrics,
            r#"egress_provider_calls_total{provider="proxmox-lab",operation="list-by-tag",outcome="ok"}"#,
        ) / 2
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let metrics = [&first_addr, &second_addr].map(|addr| async move {
            reqwest::get(format!("http://{addr}/metrics"))
                .await
                .expect("the metrics port answers")
                .text()
                .await
                .unwrap()
        });
        let [a, b] = metrics;
        let (a, b) = (a.await, b.await);
        assert_eq!(
            first.vms(),
            vms,
            "a VM went:
first:\n{}\nsecond:\n{}",
            first.log(),
            second.log()
        );
        if sweeps(&a) >= 60 && sweeps(&b) >= 60 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "too few sweeps:
{a}
{b}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for folder in [&*first, &second] {
        assert!(folder.proxies().iter().all(running), "{}", folder.log());
        assert_eq!(
            folder.log().matches("ForeignVMs").count(),
            1,
            "reported once:
{}",
            folder.log()
        );
        let orphans = Store::open_read_only(&folder.path(".egress-operator/state.db"))
            .unwrap()
            .config("proxmox-lab")
            .unwrap()
            .unwrap()
            .status
            .orphans
            .unwrap();
        assert_eq!((orphans.foreign, orphans.deleted), (2, 0), "{orphans:?}");
    }
}

/// Issue 32: VMs made before marks named an installation. One whose Proxy is here is adopted on
/// first sight, once: its mark gains the installation (and Proxmox `onboot`) and the Proxy its
/// `status.installation`. One whose Proxy is gone is never deleted, only reported as foreign.
#[tokio::test(flavor = "multi_thread")]
async fn vms_marked_before_installations_are_adopted_once_or_left_alone() {
    let mut local = Local::new().await;
    local.write("proxy-old.yaml", &proxy("default", "old"));
    local.write("proxy-lost.yaml", &proxy("default", "lost"));
    local.start();
    local.wait_until("both Proxies running", LIMIT, |proxies| {
        proxies.len() == 2 && proxies.iter().all(running)
    });
    local.kill();
    let state = local.path(".egress-operator/state.db");
    let store = Store::open(&state).unwrap();
    let installation = store.installation().unwrap().to_string();
    let vmid = |record: &egress_operator::local::store::ProxyRecord| -> u32 {
        let id = record.status.provider_id.clone().unwrap();
        id.rsplit('/').next().unwrap().parse().unwrap()
    };
    let tag = format!("tag: egress-operator.io/installation={installation}\n");
    for record in local.proxies() {
        // As an operator before this change left it: no installation in the mark, no onboot.
        let vm = vmid(&record);
        let description = local.sim.state().guest(vm).unwrap().config["description"].clone();
        assert!(description.contains(&tag), "{description}");
        let state = local.sim.state();
        state.set_config(vm, "description", Some(&description.replace(&tag, "")));
        state.set_config(vm, "onboot", None);
        let mut status = record.status.clone();
        status.installation = None;
        store
            .write_status(&record.namespace, &record.name, &record.uid, &status)
            .unwrap();
    }
    let lost = local.proxy("default/lost").unwrap();
    local.remove("proxy-lost.yaml");
    store.remove_proxy("default", "lost", &lost.uid).unwrap();
    drop(store);

    local.start_listening();
    local.wait_until("the old Proxy adopted", LIMIT, |proxies| {
        proxies.iter().any(|record| {
            record.name == "old" && record.status.installation.as_deref() == Some(&installation)
        })
    });
    let old = vmid(&local.proxy("default/old").unwrap());
    let guest = local.sim.state().guest(old).unwrap();
    assert!(
        guest.config["description"].contains(&tag),
        "{:?}",
        guest.config
    );
    assert_eq!(
        guest.config.get("onboot").map(String::as_str),
        Some("1"),
        "adoption sets onboot"
    );
    assert_eq!(
        local.log().matches("VMAdopted").count(),
        1,
        "{}",
        local.log()
    );

    let lost_vm = vmid(&lost);
    let deadline = Instant::now() + LIMIT;
    loop {
        let metrics = local.metrics().await.unwrap_or_default();
        let sweeps = counter(
            &metrics,
            r#"egress_provider_calls_total{provider="proxmox-lab",operation="list-by-tag",outcome="ok"}"#,
        ) / 2;
        assert!(
            local.sim.state().guest(lost_vm).is_some(),
            "an unmarked VM was deleted:
{}",
            local.log()
        );
        if sweeps >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "too few sweeps:
{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(local.log().contains("ForeignVMs"), "{}", local.log());
    assert_eq!(local.log().matches("VMAdopted").count(), 1, "adopted once");
}

/// Issue 22: local mode writes what a sweep finds into the ProviderConfig's `status.orphans`, as
/// Kubernetes mode does; the sweeps come on their own interval (one second here), not only at the
/// resync (an hour here); and the ProviderConfig's own calls (`validate-config`, `check`, the
/// sweep's `list-by-tag`) are in the call metrics.
#[tokio::test(flavor = "multi_thread")]
async fn a_sweep_writes_the_orphans_it_finds_into_the_provider_config_status() {
    let mut local = Local::new().await;
    local.write(
        "providerconfig.yaml",
        &provider_config(&local.sim, "Report"),
    );
    local.write("proxy.yaml", &proxy("default", "lost"));
    local.start();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let orphan = local.proxy("default/lost").unwrap();
    let orphan_id = orphan.status.provider_id.clone().unwrap();
    // The operator loses its record of the Proxy: its VM is an orphan, and the Proxy gets a new
    // UID and a new VM.
    local.kill();
    let state = local.path(".egress-operator/state.db");
    let store = Store::open(&state).unwrap();
    store.remove_proxy("default", "lost", &orphan.uid).unwrap();
    drop(store);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = std::fs::File::create(local.path("operator.log")).unwrap();
    let _operator = KillOnDrop(
        with_resync(&local.command(&["--listen", &addr]), 3600)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the operator starts"),
    );
    let orphans = || {
        Store::open_read_only(&state)
            .and_then(|store| store.config("proxmox-lab"))
            .ok()
            .flatten()
            .and_then(|record| record.status.orphans)
    };
    let deadline = Instant::now() + LIMIT;
    let report = loop {
        if let Some(report) = orphans().filter(|report| report.found.contains(&orphan_id)) {
            break report;
        }
        assert!(
            Instant::now() < deadline,
            "status.orphans never named {orphan_id}: {:?}\n{}",
            orphans(),
            local.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(report.deleted, 0, "report mode deletes nothing");
    assert!(report.last_sweep.is_some());
    assert!(
        local
            .vms()
            .iter()
            .any(|(vmid, _)| orphan_id.ends_with(&format!("/{vmid}"))),
        "the orphan is left alone"
    );

    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("the metrics port answers")
        .text()
        .await
        .unwrap();
    for operation in ["validate-config", "check", "list-by-tag"] {
        let series = format!(
            r#"egress_provider_calls_total{{provider="proxmox-lab",operation="{operation}",outcome="ok"}}"#
        );
        assert!(
            counter(&metrics, &series) >= 1,
            "{series} missing from:\n{metrics}"
        );
    }
}

/// `command` (the tests' operator command) with the resync at `seconds` in place of theirs.
fn with_resync(command: &Command, seconds: u64) -> Command {
    let mut args: Vec<OsString> = command.get_args().map(OsStr::to_owned).collect();
    let at = args
        .iter()
        .position(|arg| arg == "--resync-seconds")
        .expect("the tests' command sets the resync");
    args[at + 1] = seconds.to_string().into();
    let mut changed = Command::new(command.get_program());
    changed.args(args);
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            changed.env(key, value);
        }
    }
    changed
}

/// A child process killed when the test ends, passed or not.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_manifest_is_one_error_and_the_others_keep_reconciling() {
    let mut local = Local::new().await;
    local.write(
        "broken.yaml",
        "apiVersion: egress-operator.io/v1alpha1\nkind: Proxy\nmetadata: {name: broken}\nspec: {providerConfig: proxmox-lab}\n",
    );
    local.write("proxy.yaml", &proxy("default", "fine"));
    local.start();
    local.wait_until("the good Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    assert_eq!(
        local.proxies().len(),
        1,
        "the broken one was never declared"
    );
    let log = local.log();
    let errors: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("broken.yaml"))
        .collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(
        errors[0].contains("document 1: Proxy broken: spec.providerConfigRef: missing field"),
        "{}",
        errors[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_that_fails_to_load_leaves_the_last_good_one_serving() {
    let mut local = Local::new().await;
    local.write("proxy-a.yaml", &proxy("default", "a"));
    local.start();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let served = local
        .proxy("default/a")
        .unwrap()
        .proxy
        .status
        .provider
        .unwrap();

    // A broken replacement (half the file) lands.
    let bytes = std::fs::read(local.path("components/proxmox.wasm")).unwrap();
    let partial = local.path("components/.proxmox.wasm.partial");
    std::fs::write(&partial, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::rename(&partial, local.path("components/proxmox.wasm")).unwrap();
    let deadline = Instant::now() + LIMIT;
    loop {
        let store = Store::open_read_only(&local.path(".egress-operator/state.db")).unwrap();
        let degraded = store.configs().unwrap().into_iter().any(|config| {
            egress_operator::conditions::condition(&config.status.conditions, conditions::DEGRADED)
                .is_some_and(|c| c.status == "True" && c.reason == "ComponentRejected")
        });
        if degraded {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Degraded condition:\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The old component keeps serving: a new Proxy comes up on it.
    local.write("proxy-b.yaml", &proxy("default", "b"));
    local.wait_until(
        "the new Proxy running on the old component",
        LIMIT,
        |proxies| proxies.len() == 2 && proxies.iter().all(running),
    );
    let handled = local
        .proxy("default/b")
        .unwrap()
        .proxy
        .status
        .provider
        .unwrap();
    assert_eq!(handled.digest, served.digest);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_secret_is_used_from_the_next_request() {
    let mut local = Local::new().await;
    local.write("proxy-a.yaml", &proxy("default", "a"));
    local.start();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let config_ready = |local: &Local, reason: &str| {
        Store::open_read_only(&local.path(".egress-operator/state.db"))
            .unwrap()
            .configs()
            .unwrap()
            .iter()
            .any(|config| {
                egress_operator::conditions::condition(&config.status.conditions, conditions::READY)
                    .is_some_and(|c| c.reason == reason)
            })
    };
    // Rotated to a token the node refuses: the next requests carry it and are refused.
    local.write(
        "credentials.yaml",
        &credentials(
            &local.sim,
            "egress@pve!operator=00000000-dead-beef-0000-000000000000",
        ),
    );
    let deadline = Instant::now() + LIMIT;
    while !config_ready(&local, "Unauthorized") {
        assert!(
            Instant::now() < deadline,
            "the new token was not used:\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Rotated back: used from the next request, and new work succeeds.
    local.write(
        "credentials.yaml",
        &credentials(&local.sim, local.sim.token()),
    );
    while !config_ready(&local, "CheckPassed") {
        assert!(
            Instant::now() < deadline,
            "the rotated token was not used:\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    local.write("proxy-b.yaml", &proxy("default", "b"));
    local.wait_until("both Proxies running", LIMIT, |proxies| {
        proxies.len() == 2 && proxies.iter().all(running)
    });
}

/// Killed at each request of a first run (the ProviderConfig's check and the Proxy's create),
/// then restarted on the same folder: exactly one VM for the Proxy, Ready.
#[tokio::test(flavor = "multi_thread")]
async fn killed_at_each_request_of_a_create_then_restarted_ends_with_one_vm() {
    // How many requests a clean run makes until the Proxy runs.
    let total = {
        let mut local = Local::new().await;
        local.write("proxy.yaml", &proxy("default", "kp"));
        local.start();
        local.wait_until("a clean run", LIMIT, |proxies| proxies.iter().any(running));
        local.kill();
        local.sim.state().request_log().len()
    };
    assert!(total > 10, "{total}");
    for cut in 0..total {
        let mut local = Local::with_sim(SimConfig {
            task_latency: Duration::from_millis(5),
            agent_delay: Duration::from_millis(50),
            ..SimConfig::default()
        })
        .await;
        local.write("proxy.yaml", &proxy("default", "kp"));
        local.sim.faults().abort_after(cut as u64);
        local.start();
        // The kill comes once the simulator has reset a request: the operator is mid-call.
        let deadline = Instant::now() + LIMIT;
        while !local
            .sim
            .state()
            .request_log()
            .iter()
            .any(|record| record.status.is_none())
        {
            assert!(
                Instant::now() < deadline,
                "cut {cut}: the abort never fired"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        local.kill();
        local.sim.faults().clear_abort();
        local.start();
        local.wait_until(
            &format!("cut {cut}: the Proxy running after a restart"),
            LIMIT,
            |proxies| proxies.iter().any(running),
        );
        let record = local.proxy("default/kp").unwrap();
        let vms = local.vms();
        assert_eq!(vms.len(), 1, "cut {cut}: {vms:?}");
        assert_eq!(vms[0].1, vm_name(&record.uid), "cut {cut}");
        assert_eq!(local.seeds().len(), 1, "cut {cut}: {:?}", local.seeds());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn listen_serves_readiness_and_the_operators_metrics() {
    let mut local = Local::new().await;
    local.write("proxy.yaml", &proxy("default", "watched"));
    let addr = local.start_listening();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let get = |path: &str| {
        let url = format!("http://{addr}{path}");
        async move {
            let response = reqwest::get(&url).await.expect("the health port answers");
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    assert_eq!(get("/readyz").await, (200, "ok\n".to_string()));
    assert_eq!(get("/healthz").await.0, 200);
    let (status, metrics) = get("/metrics").await;
    assert_eq!(status, 200);
    for series in [
        r#"egress_provider_calls_total{provider="proxmox-lab",operation="create",outcome="ok"}"#,
        "controller_runtime_reconcile_total",
    ] {
        assert!(
            metrics.contains(series),
            "{series} missing from:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listen_address_in_use_is_an_error_at_start() {
    let local = Local::new().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut child = local
        .command(&["--listen", &addr])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the operator starts");
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the operator kept running with its --listen address taken");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("listening on {addr}")),
        "the error does not name the address: {stderr}"
    );
}

fn pve_client(local: &Local) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(local.sim.ca_pem().as_bytes()).unwrap(),
        )
        .http1_only()
        .build()
        .unwrap()
}

/// SIGTERM (a supervisor, `kill`) and SIGINT (Ctrl-C) stop local mode the same way: calls in
/// flight finish and it exits 0, also while the turns of its loop keep it busy (a resync every
/// second).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_and_sigint_stop_local_mode_cleanly_while_it_is_busy() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut local = Local::new().await;
        local.write("proxy-web.yaml", &proxy("team-a", "web"));
        local.start();
        local.wait_until("the Proxy running", LIMIT, |proxies| {
            proxies.len() == 1 && proxies.iter().all(running)
        });
        let status = local.stop_with(signal);
        assert!(
            status.is_some_and(|status| status.success()),
            "signal {signal}: {status:?}\n{}",
            local.log()
        );
    }
}

/// Issue 32: without `RUST_LOG` the operator shows each reconcile's and each provider call's
/// outcome (info), not only warnings; a ProviderConfig's `logLevel: Debug` adds one line per
/// hypervisor request of its provider's calls (the broker's), which the default hides.
#[tokio::test(flavor = "multi_thread")]
async fn by_default_outcomes_are_logged_and_a_provider_config_can_turn_its_provider_up() {
    for level in [None, Some("Debug")] {
        let local = Local::new().await;
        let mut config = provider_config(&local.sim, "Off");
        if let Some(level) = level {
            config.push_str(&format!("  logLevel: {level}\n"));
        }
        local.write("providerconfig.yaml", &config);
        local.write("proxy.yaml", &proxy("default", "web"));
        let log = std::fs::File::create(local.path("operator.log")).unwrap();
        let _operator = KillOnDrop(
            local
                .command(&[])
                .env_remove("RUST_LOG")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("the operator starts"),
        );
        local.wait_until("the Proxy running", LIMIT, |proxies| {
            proxies.iter().any(running)
        });
        let text = local.log();
        assert!(text.contains("VMCreated"), "{text}");
        assert!(text.contains("proxmox operation finished"), "{text}");
        let requests = text.matches("outgoing HTTP").count();
        match level {
            None => assert_eq!(requests, 0, "{text}"),
            Some(_) => assert!(requests > 3, "{text}"),
        }
    }
}

/// The exit status of `command`, waited for at most [`LIMIT`] (then killed: a failure).
fn exit_within_limit(command: &mut Command) -> std::process::ExitStatus {
    let mut child = command.spawn().expect("the operator starts");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("--exit-when-settled did not exit within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_when_settled_ends_when_a_proxy_waits_on_a_refused_grant_and_says_why() {
    let local = Local::new().await;
    let refused = provider_config(&local.sim, "Delete").replace(
        &format!("origins: [\"{}\"]", local.sim.url()),
        "origins: [\"ftp://pve.example\"]",
    );
    assert_ne!(refused, provider_config(&local.sim, "Delete"));
    local.write("providerconfig.yaml", &refused);
    local.write("proxy.yaml", &proxy("default", "web"));
    let log = local.dir.path().join("settle.log");
    let status = exit_within_limit(
        local
            .command(&["--exit-when-settled"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("Proxy default/web: InvalidGrant"), "{said}");
    assert!(local.vms().is_empty());

    // `get providerconfigs` shows why, in a table and as objects.
    let get = |output: &str| {
        let printed = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
            .args(["get", "providerconfigs", "--local"])
            .arg(local.dir.path())
            .args(["-o", output])
            .output()
            .unwrap();
        assert!(printed.status.success(), "{printed:?}");
        String::from_utf8(printed.stdout).unwrap()
    };
    let table = get("table");
    let row = table
        .lines()
        .find(|line| line.starts_with("proxmox-lab"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("False") && row.contains("InvalidGrant"),
        "{table}"
    );
    let list: serde_json::Value = serde_json::from_str(&get("json")).unwrap();
    let config = &list["items"][0];
    assert_eq!(config["kind"], "ProviderConfig");
    assert_eq!(config["metadata"]["name"], "proxmox-lab");
    let ready = config["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|condition| condition["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["reason"], "InvalidGrant");
    assert!(get("yaml").contains("kind: ProviderConfig"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_refused_with_401_is_retried_after_its_secret_was_fixed_while_stopped() {
    let mut local = Local::new().await;
    let wrong = local
        .sim
        .token()
        .replace(|c: char| c.is_ascii_hexdigit() && c != '0', "0");
    assert_ne!(wrong, local.sim.token());
    local.write("credentials.yaml", &credentials(&local.sim, &wrong));
    local.write("proxy.yaml", &proxy("default", "web"));
    local.start();
    local.wait_until("the Proxy refused with a 401", LIMIT, |proxies| {
        proxies
            .iter()
            .any(|proxy| reason(proxy, "Ready") == "PermanentError")
    });
    local.stop_with(libc::SIGTERM);
    // Fixed while no operator watched.
    local.write(
        "credentials.yaml",
        &credentials(&local.sim, local.sim.token()),
    );
    local.start();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
}

/// Issue 35: a ProviderConfig's `record` keeps its provider's calls, one file per call, rotated
/// to `keep`: each a recording of the call with its exchanges, none holding the token.
#[tokio::test(flavor = "multi_thread")]
async fn a_provider_config_that_records_keeps_its_last_calls_rotated_and_without_the_token() {
    let local = Local::new().await;
    let mut config = provider_config(&local.sim, "Off");
    config.push_str("  record:\n    keep: 3\n");
    local.write("providerconfig.yaml", &config);
    local.write("a.yaml", &proxy("default", "a"));
    local.write("b.yaml", &proxy("default", "b"));
    let recordings = tempfile::tempdir().unwrap();
    let dir = recordings.path().join("proxmox-lab");
    let _operator = KillOnDrop(
        local
            .command(&["--recordings-dir", recordings.path().to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the operator starts"),
    );
    local.wait_until("both Proxies running", LIMIT, |proxies| {
        proxies.iter().filter(|proxy| running(proxy)).count() == 2
    });
    // Every later look at a VM is a call: the folder turns over while it never holds more than 3.
    let mut seen = std::collections::BTreeSet::new();
    let started = Instant::now();
    while seen.len() < 6 {
        let files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(files.len() <= 3, "{files:?}");
        for file in files {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            if !seen.insert(file.clone()) {
                continue;
            }
            let recording: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(recording["format"], "egress-recording");
            assert_eq!(recording["provider"]["identity"], "proxmox-lab");
            assert!(
                !recording["exchanges"].as_array().unwrap().is_empty(),
                "{text}"
            );
            assert!(
                !text.contains(crate::proxmox_support::secret_of(local.sim.token())),
                "{text}"
            );
        }
        assert!(
            started.elapsed() < LIMIT,
            "only {} recordings: {seen:?}",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let operations: std::collections::BTreeSet<String> = seen
        .iter()
        .filter_map(|file| Some(file.file_stem()?.to_str()?.rsplit('-').next()?.to_owned()))
        .collect();
    assert!(
        operations.contains("create") || operations.contains("get"),
        "{operations:?}"
    );
}
