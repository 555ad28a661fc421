//! Proxies that heal themselves, in local mode: the real binary over a folder of manifests, the
//! Proxmox component sandboxed in it, `pvesim` behind the egress broker. The simulator stops VMs
//! as a host does outside the API (a node reboot, `qm stop`); the operator notices within its
//! resync (one second here) and restarts, replaces or leaves them as the Proxy's `recovery` says.
//! Kubernetes mode runs the same reconciler; `kube_mode.rs` has its recovery tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::local_support::{Local, provider_config, proxy, reason, running};
use crate::metrics_support::counter;
use egress_operator::conditions::{self};
use egress_operator::crd::{Phase, RecoveryPolicy};
use pvesim::{RunState, Simulator};

const LIMIT: Duration = Duration::from_secs(60);
const NODE: &str = "pv1-1";

/// The test ProviderConfig with `extra` lines appended to its spec.
fn provider_config_with(local: &Local, extra: &str) -> String {
    format!("{}{extra}", provider_config(&local.sim, "Delete"))
}

/// A Local with three Proxies running under a ProviderConfig whose spec ends with `extra`.
fn three_running(local: &mut Local, extra: &str) -> Vec<(String, String)> {
    local.write("providerconfig.yaml", &provider_config_with(local, extra));
    for name in ["web", "api", "mail"] {
        local.write(&format!("proxy-{name}.yaml"), &proxy("default", name));
    }
    local.start();
    local.wait_until("three Proxies running", LIMIT, |proxies| {
        proxies.len() == 3 && proxies.iter().all(running)
    });
    let mut ids: Vec<_> = local
        .proxies()
        .into_iter()
        .map(|record| (record.key(), record.proxy.status.provider_id.unwrap()))
        .collect();
    ids.sort();
    ids
}

/// The tasks of `kind` (`qmclone`, `qmstart`, …) the simulator ran.
fn tasks(sim: &Simulator, kind: &str) -> usize {
    sim.state()
        .tasks()
        .iter()
        .filter(|task| task.task_type == kind)
        .count()
}

fn vmid(provider_id: &str) -> u32 {
    provider_id.rsplit('/').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_reboot_that_starts_nothing_is_healed_by_restarting_the_same_vms() {
    let mut local = Local::new().await;
    let before = three_running(&mut local, "");
    let clones = tasks(&local.sim, "qmclone");

    let reboot = local.sim.reboot_node(NODE, false).unwrap();
    assert_eq!(reboot.stopped.len(), 3, "{reboot:?}");
    local.wait_until("all three restarted and running", LIMIT, |proxies| {
        proxies.len() == 3
            && proxies
                .iter()
                .all(|record| running(record) && record.status.restarts == 1)
    });
    let mut after: Vec<_> = local
        .proxies()
        .into_iter()
        .map(|record| {
            let last = record.status.last_recovery.clone().unwrap();
            assert_eq!(last.action, RecoveryPolicy::Restart);
            assert_eq!(last.reason, "stopped");
            (record.key(), record.proxy.status.provider_id.unwrap())
        })
        .collect();
    after.sort();
    assert_eq!(after, before, "the same VMs");
    assert_eq!(tasks(&local.sim, "qmclone"), clones, "nothing cloned again");
    assert_eq!(
        local.vms().len(),
        3,
        "nothing duplicated: {:?}",
        local.vms()
    );
    assert_eq!(local.log().matches("reason=VMRestarted").count(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_replace_a_node_reboot_gives_each_proxy_a_new_vm_and_leaves_no_old_one() {
    let mut local = Local::new().await;
    three_running(&mut local, "  recovery: {policy: Replace}\n");
    let clones = tasks(&local.sim, "qmclone");

    local.sim.reboot_node(NODE, false).unwrap();
    local.wait_until("all three replaced and running", LIMIT, |proxies| {
        proxies.len() == 3
            && proxies
                .iter()
                .all(|record| running(record) && record.status.restarts == 1)
    });
    for record in local.proxies() {
        let last = record.status.last_recovery.clone().unwrap();
        assert_eq!(last.action, RecoveryPolicy::Replace, "{record:?}");
    }
    assert_eq!(tasks(&local.sim, "qmclone"), clones + 3, "three new VMs");
    assert_eq!(
        tasks(&local.sim, "qmdestroy"),
        3,
        "the stopped ones deleted"
    );
    assert_eq!(
        local.vms().len(),
        3,
        "nothing left behind: {:?}",
        local.vms()
    );
    assert_eq!(local.log().matches("reason=VMReplaced").count(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_stopped_by_hand_is_started_again_and_the_others_are_left_alone() {
    let mut local = Local::new().await;
    let before = three_running(&mut local, "");
    let (stopped_key, stopped_id) = before[0].clone();

    local.sim.stop_vm(vmid(&stopped_id)).unwrap();
    local.wait_until("the stopped one restarted", LIMIT, |proxies| {
        proxies.iter().any(|record| {
            record.key() == stopped_key && running(record) && record.status.restarts == 1
        })
    });
    for record in local.proxies() {
        let expected = u32::from(record.key() == stopped_key);
        assert_eq!(record.status.restarts, expected, "{record:?}");
    }
    assert_eq!(
        local.proxy(&stopped_key).unwrap().status.provider_id,
        Some(stopped_id)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_policy_none_a_stopped_vm_is_reported_and_left_stopped() {
    let mut local = Local::new().await;
    let before = three_running(&mut local, "  recovery: {policy: None}\n");
    let (key, id) = before[0].clone();

    local.sim.stop_vm(vmid(&id)).unwrap();
    local.wait_until("the Proxy reports its VM stopped", LIMIT, |proxies| {
        proxies
            .iter()
            .any(|record| record.key() == key && reason(record, conditions::READY) == "VMStopped")
    });
    let record = local.proxy(&key).unwrap();
    assert_eq!(record.status.phase, Some(Phase::Stopped));
    assert_eq!(record.status.restarts, 0);
    assert_eq!(
        local.sim.state().guest(vmid(&id)).unwrap().run_state,
        RunState::Stopped
    );
}

/// A VM that stops again right after every start: after `maxRestarts` recoveries the Proxy is
/// `Degraded`, and the operator keeps looking (gets) but starts it no more (no creates).
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_that_stops_after_every_start_ends_degraded_and_is_not_restarted_again() {
    let mut local = Local::new().await;
    local.write(
        "providerconfig.yaml",
        &provider_config(&local.sim, "Delete"),
    );
    local.write(
        "proxy-flaky.yaml",
        &format!(
            "{}  recovery: {{maxRestarts: 2, backoffSeconds: 1}}\n",
            proxy("default", "flaky")
        ),
    );
    local.start_listening();
    local.wait_until("the Proxy running", LIMIT, |proxies| {
        proxies.iter().any(running)
    });
    let id = local
        .proxy("default/flaky")
        .unwrap()
        .proxy
        .status
        .provider_id
        .unwrap();

    // A host that kills the VM whenever it runs.
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let stop = Arc::clone(&stop);
        let state = local.sim.state().clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if state
                    .guest(vmid(&id))
                    .is_some_and(|vm| vm.run_state == RunState::Running)
                {
                    state.set_run_state(vmid(&id), RunState::Stopped);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    local.wait_until("the Proxy degraded", LIMIT, |proxies| {
        proxies
            .iter()
            .any(|record| record.status.phase == Some(Phase::Degraded))
    });
    let record = local.proxy("default/flaky").unwrap();
    assert_eq!(record.status.restarts, 2, "{record:?}");
    assert_eq!(reason(&record, conditions::READY), "Degraded");
    assert!(local.log().contains("reason=Degraded"), "{}", local.log());

    // It is still looked at, but no longer started: three more gets, no create.
    let calls = |operation: &str, text: &str| {
        counter(
            text,
            &format!(
                "egress_provider_calls_total{{provider=\"proxmox-lab\",operation=\"{operation}\""
            ),
        )
    };
    let at_degraded = local.metrics().await.unwrap_or_default();
    let (gets, creates) = (calls("get", &at_degraded), calls("create", &at_degraded));
    let started = std::time::Instant::now();
    loop {
        let now = local.metrics().await.unwrap_or_default();
        if calls("get", &now) >= gets + 3 {
            assert_eq!(calls("create", &now), creates, "restarted after Degraded");
            break;
        }
        assert!(started.elapsed() < LIMIT, "no more gets:\n{now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let record = local.proxy("default/flaky").unwrap();
    assert_eq!(record.status.phase, Some(Phase::Degraded));
    assert_eq!(record.status.restarts, 2);
    stop.store(true, Ordering::Relaxed);
    killer.join().unwrap();
}

/// Issue 32, the state table: a VM a person paused (`qm suspend`), hibernated
/// (`qm suspend --todisk`) or that QEMU paused on a storage error is the person's to resume: its
/// Proxy says `Paused`, no restart is spent on it and no start issued, and once resumed by hand it
/// is Running again, with no change to any object.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_paused_or_hibernated_waits_for_a_person_and_runs_again_once_resumed() {
    let mut local = Local::new().await;
    let before = three_running(&mut local, "");
    let starts = tasks(&local.sim, "qmstart");
    let state = local.sim.state();
    let paused = vmid(&before[0].1);
    let hibernated = vmid(&before[1].1);
    let io_error = vmid(&before[2].1);
    state.set_run_state(paused, RunState::Paused);
    state.set_run_state(hibernated, RunState::Stopped);
    state.set_lock(hibernated, Some("suspended"));
    state.set_run_state(io_error, RunState::IoError);
    local.wait_until("all three Paused", LIMIT, |proxies| {
        proxies.len() == 3
            && proxies.iter().all(|record| {
                record.status.phase == Some(Phase::Paused)
                    && reason(record, conditions::READY) == "VMPaused"
            })
    });
    // Looked at again over several resyncs (one second each here): never restarted.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        assert!(
            local
                .proxies()
                .iter()
                .all(|record| record.status.restarts == 0
                    && record.status.phase == Some(Phase::Paused)),
            "{:#?}",
            local.proxies()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        tasks(&local.sim, "qmstart"),
        starts,
        "no start on a paused VM"
    );

    // A person resumes them (the hibernated one by starting it).
    state.set_run_state(paused, RunState::Running);
    state.set_lock(hibernated, None);
    state.set_run_state(hibernated, RunState::Running);
    state.set_run_state(io_error, RunState::Running);
    local.wait_until("all three Running again", LIMIT, |proxies| {
        proxies.len() == 3
            && proxies
                .iter()
                .all(|record| running(record) && record.status.restarts == 0)
    });
    let after: Vec<_> = local
        .proxies()
        .into_iter()
        .map(|record| record.proxy.status.provider_id.unwrap())
        .collect();
    let mut expected: Vec<_> = before.into_iter().map(|(_, id)| id).collect();
    let mut after = after;
    after.sort();
    expected.sort();
    assert_eq!(after, expected, "the same VMs");
}

/// Issue 32, the state table: a VM whose guest suspended itself (ACPI S3) is woken by the
/// restart (`create` resumes it), counted as one recovery.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_whose_guest_suspended_itself_is_woken_by_its_restart() {
    let mut local = Local::new().await;
    let before = three_running(&mut local, "");
    let (key, id) = before[0].clone();
    local
        .sim
        .state()
        .set_run_state(vmid(&id), RunState::Suspended);
    local.wait_until("woken and running", LIMIT, |proxies| {
        proxies
            .iter()
            .any(|record| record.key() == key && running(record) && record.status.restarts == 1)
    });
    assert_eq!(tasks(&local.sim, "qmresume"), 1, "woken by a resume");
    let record = local.proxy(&key).unwrap();
    assert_eq!(record.status.provider_id, Some(id), "the same VM");
    assert_eq!(
        record.proxy.status.last_recovery.unwrap().action,
        RecoveryPolicy::Restart
    );
}

/// Issue 32, the state table: a VM whose guest panicked, or that QEMU stopped on an internal error
/// or its watchdog, runs no more however it is started: it is replaced (a new VM, the old one
/// deleted), counted as a recovery of a failed VM.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_that_panicked_or_hung_is_replaced() {
    let mut local = Local::new().await;
    let before = three_running(&mut local, "");
    let clones = tasks(&local.sim, "qmclone");
    let destroys = tasks(&local.sim, "qmdestroy");
    let state = local.sim.state();
    for ((_, id), run) in before.iter().zip([
        RunState::GuestPanicked,
        RunState::InternalError,
        RunState::Watchdog,
    ]) {
        state.set_run_state(vmid(id), run);
    }
    local.wait_until("all three replaced and running", LIMIT, |proxies| {
        proxies.len() == 3
            && proxies
                .iter()
                .all(|record| running(record) && record.status.restarts == 1)
    });
    // Three new VMs (a new one may reuse its VMID), the three old ones destroyed.
    assert_eq!(tasks(&local.sim, "qmclone"), clones + 3);
    assert_eq!(tasks(&local.sim, "qmdestroy"), destroys + 3);
    for record in local.proxies() {
        let last = record.proxy.status.last_recovery.unwrap();
        assert_eq!(
            (last.action, last.reason.as_str()),
            (RecoveryPolicy::Replace, "failed")
        );
        let vm = local
            .sim
            .state()
            .guest(vmid(&record.proxy.status.provider_id.unwrap()))
            .unwrap();
        assert_eq!(vm.run_state, RunState::Running);
    }
}

/// Issue 32: a permanent answer about a VM no longer latches its Proxy until an object changes.
/// The restart of a stopped VM is refused (the start answers 403); the Proxy is
/// `PermanentError`; a person then starts the VM by hand, and at the next resync the operator
/// reads the VM again and the Proxy is Running, no object changed.
#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_refused_about_its_vm_is_running_again_once_a_person_fixes_the_vm() {
    let mut local = Local::new().await;
    let before = three_running(&mut local, "");
    let (key, id) = before[0].clone();
    let refusal = local.sim.faults().add(pvesim::FaultRule::new(
        "POST",
        &format!("/nodes/*/qemu/{}/status/start", vmid(&id)),
        pvesim::Trigger::Always,
        pvesim::FaultAction::Status {
            status: 403,
            message: "Permission check failed (/vms/…, VM.PowerMgmt)".into(),
        },
    ));
    local.sim.stop_vm(vmid(&id)).unwrap();
    local.wait_until("the restart refused", LIMIT, |proxies| {
        proxies.iter().any(|record| {
            record.key() == key && reason(record, conditions::READY) == "PermanentError"
        })
    });
    local.sim.faults().remove(refusal);
    local
        .sim
        .state()
        .set_run_state(vmid(&id), RunState::Running);
    local.wait_until("running again without any change", LIMIT, |proxies| {
        proxies
            .iter()
            .any(|record| record.key() == key && running(record))
    });
    assert_eq!(local.proxy(&key).unwrap().generation, 1, "no spec change");
}
