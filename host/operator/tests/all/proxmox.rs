//! The Proxmox provider through the real path: the built component in the runtime, its HTTP
//! through the egress broker (token injected from a file, TLS verified against the run's CA,
//! HTTP/1.1 only), to the `pvesim` simulator over HTTPS. Facts (F1–F23) and corrections (1–10)
//! are from the Go predecessor's execution log; each test names what it pins.
//!
//! Needs `target/components/proxmox.wasm` (`just build-components`).

use std::collections::BTreeSet;

use crate::proxmox_support::*;
use egress_runtime::types::CheckReason;
use egress_runtime::{CallError, ErrorClass, VmState};
use pvesim::{FaultAction, FaultRule, SimConfig, Simulator, Trigger};
use serde_json::json;

const NAME: &str = "proxy-e2eaaaaaaaaaaaaaa";
const UID: &str = "6c1f0a2e-1111-4a53-9c7b-3f1b8f0a0001";
const SEED: &str = "proxy-seeds:iso/proxy-e2eaaaaaaaaaaaaaa-seed.iso";
/// The preloaded templates (F19).
const TEMPLATES: [u32; 2] = [9000, 9001];

fn class(outcome: &Result<impl std::fmt::Debug, CallError>) -> Option<ErrorClass> {
    outcome.as_ref().err().map(CallError::class)
}

/// The end state every convergence test wants: one VM with our name and mark, fully provisioned
/// (seed on ide2, agent on, started with its node, our tag), one seed ISO, nothing else made.
/// Returns the VM's VMID.
fn assert_exactly_one_provisioned_vm(harness: &Harness, provider_id: &str) -> u32 {
    let vms = harness.vms_named(NAME);
    assert_eq!(vms.len(), 1, "exactly one VM named {NAME}: {vms:#?}");
    let vm = &vms[0];
    assert_eq!(
        vm.vmid,
        vmid_of(provider_id),
        "the provider id names the VM that exists"
    );
    let description = vm
        .config
        .get("description")
        .map(String::as_str)
        .unwrap_or_default();
    assert!(
        description.contains(&format!("uid: {UID}")),
        "the mark is ours: {description:?}"
    );
    assert_eq!(
        vm.config.get("ide2").map(String::as_str),
        Some(format!("{SEED},media=cdrom").as_str())
    );
    assert_eq!(vm.config.get("agent").map(String::as_str), Some("1"));
    assert_eq!(
        vm.config.get("onboot").map(String::as_str),
        Some("1"),
        "the node starts the proxy when it boots"
    );
    assert_eq!(
        vm.config.get("tags").map(String::as_str),
        Some("proxy_operator"),
        "correction 7"
    );
    assert_eq!(harness.seeds(), [SEED], "exactly one seed ISO");
    let mut expected: BTreeSet<u32> = TEMPLATES.into();
    expected.insert(vm.vmid);
    assert_eq!(
        harness
            .sim
            .state()
            .vmids()
            .into_iter()
            .collect::<BTreeSet<_>>(),
        expected,
        "no other VM made"
    );
    vm.vmid
}

fn assert_nothing_left(harness: &Harness, when: &str) {
    assert!(harness.vms_named(NAME).is_empty(), "{when}: the VM is gone");
    assert!(
        harness.seeds().is_empty(),
        "{when}: no seed left on proxy-seeds: {:?}",
        harness.seeds()
    );
    assert_eq!(
        harness.sim.state().vmids(),
        TEMPLATES,
        "{when}: only the templates remain"
    );
}

/// Whether the simulator reset a request since `from` (the abort fired).
fn abort_fired(harness: &Harness, from: usize) -> bool {
    harness.sim.state().request_log()[from..]
        .iter()
        .any(|record| record.status.is_none())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_then_get_reports_running_with_an_address_then_delete_removes_vm_and_seed() {
    let harness = Harness::start().await;
    let created = harness.create(NAME, UID).await.expect("create");
    // Create returns once the VM runs; the address is get's job (entry 10).
    assert_eq!(created.state, VmState::Provisioning);
    assert_eq!((created.name.as_str(), created.uid.as_str()), (NAME, UID));
    assert!(
        created.created_at.is_some(),
        "F11: written-at-create is in the mark"
    );
    assert!(
        created.provider_id.starts_with("pv1-1/"),
        "{}",
        created.provider_id
    );
    assert_exactly_one_provisioned_vm(&harness, &created.provider_id);

    // F5 then F21: the agent is "not running" for the simulator's delay, then reports ens18.
    let running = wait_running(&harness, &created.provider_id).await;
    assert_eq!(
        running.addresses,
        [pvesim::guest_ip(vmid_of(&created.provider_id))]
    );
    assert_eq!(
        (running.uid.as_str(), running.provider_id.as_str()),
        (UID, created.provider_id.as_str())
    );

    harness.delete(&created.provider_id).await.expect("delete");
    assert_nothing_left(&harness, "after delete");
    // F2: get of a VM that is gone is not-found; a repeat delete succeeds.
    assert_eq!(
        class(&harness.get(&created.provider_id).await),
        Some(ErrorClass::NotFound)
    );
    harness
        .delete(&created.provider_id)
        .await
        .expect("a repeat delete succeeds");

    // Every request is framed exactly: a Content-Length (the upload, the JSON writes) or no body
    // at all (every GET), never a body streamed chunked.
    let log = harness.sim.state().request_log();
    let chunked: Vec<_> = log.iter().filter(|record| record.chunked).collect();
    assert!(chunked.is_empty(), "sent chunked: {chunked:?}");
    assert!(log.iter().any(|record| record.method == "POST"), "{log:?}");
}

/// Requests a clean create makes on a fresh simulator (measured, not assumed).
async fn clean_create_requests() -> usize {
    let harness = Harness::start().await;
    harness.create(NAME, UID).await.expect("clean create");
    harness.requests()
}

/// Corrections 1 and 2 (a nameless mid-clone VM at our deterministic VMID is waited on and
/// adopted, never cloned again), F4, F8, F12/correction 5 (the seed upload overwrites), F3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_crashed_at_every_request_converges_on_one_adopted_vm() {
    let total = clean_create_requests().await;
    eprintln!("a clean create made {total} requests");
    assert!(
        total >= 12,
        "a clean create makes at least 12 requests, made {total}"
    );
    let mut crashes = 0;
    for n in 1..=total {
        let harness = Harness::start().await;
        harness.sim.faults().abort_after(n as u64 - 1);
        let first = harness.create(NAME, UID).await;
        if abort_fired(&harness, 0) {
            crashes += 1;
            assert_eq!(
                class(&first),
                Some(ErrorClass::Transient),
                "crash at request {n}: {first:?}"
            );
        } else {
            // Polls vary with timing: this run finished in fewer than n requests.
            assert!(
                first.is_ok(),
                "no crash at request {n}, yet create failed: {first:?}"
            );
        }
        harness.sim.faults().clear_abort();
        // What the crashed attempt left (a clone, perhaps nameless mid-clone) must be adopted.
        let left: Vec<u32> = harness
            .sim
            .state()
            .vmids()
            .into_iter()
            .filter(|vmid| !TEMPLATES.contains(vmid))
            .collect();
        let instance = harness
            .create_until_ok(NAME, UID, 10)
            .await
            .unwrap_or_else(|error| {
                panic!("crash at request {n}: retries did not converge: {error}");
            });
        let vmid = assert_exactly_one_provisioned_vm(&harness, &instance.provider_id);
        if let [leftover] = left.as_slice() {
            assert_eq!(
                vmid, *leftover,
                "crash at request {n}: the crashed attempt's VM is adopted"
            );
        }
        assert!(
            left.len() <= 1,
            "crash at request {n} left several VMs: {left:?}"
        );
        // A later retry answers the same VM.
        let again = harness.create(NAME, UID).await.expect("repeat create");
        assert_eq!(
            again.provider_id, instance.provider_id,
            "crash at request {n}"
        );
    }
    assert!(
        crashes + 2 >= total,
        "the abort fired for only {crashes} of {total} requests"
    );
}

/// The same retry when the clone crosses nodes (F8, and the predecessor's note on cross-node
/// clones): the clone's config stays on the node running the clone, listed there nameless, until
/// its task ends and moves it to the target. The retry waits on it at the node it was listed on,
/// then finds it on its target: it adopts it there, instead of reading "does not exist" as gone
/// and cloning a second VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_during_a_crashed_cross_node_clone_finds_it_on_its_target_and_adopts_it() {
    a_retry_during_a_cross_node_clone_adopts_it_on_its_target(&PROXMOX).await;
}

/// The test above for `subject` (the Python provider runs it too).
pub(crate) async fn a_retry_during_a_cross_node_clone_adopts_it_on_its_target(subject: &Subject) {
    let sim_config = SimConfig {
        nodes: vec!["pv1-1".into(), "pv1-2".into()],
        task_latency: std::time::Duration::from_millis(400),
        ..quick_sim_config()
    };
    let mut harness = Harness::start_subject(subject, sim_config).await;
    harness.config["nodes"] = json!(["pv1-2"]);
    harness.config["targetStorage"] = json!(pvesim::SHARED_STORAGE);
    // resources, template config, clone: then the crash, before the clone task's first poll.
    harness.sim.faults().abort_after(3);
    let first = harness.create(NAME, UID).await;
    assert_eq!(class(&first), Some(ErrorClass::Transient), "{first:?}");
    harness.sim.faults().clear_abort();
    let state = harness.sim.state();
    let mid_clone: Vec<pvesim::GuestView> = (state.vmids().into_iter())
        .filter_map(|vmid| state.guest(vmid))
        .filter(|guest| guest.mid_clone)
        .collect();
    assert_eq!(mid_clone.len(), 1, "the clone still runs: {mid_clone:#?}");
    assert_eq!(mid_clone[0].node, "pv1-1", "listed on the node running it");

    let instance = harness
        .create(NAME, UID)
        .await
        .expect("the retry adopts the clone");
    let vms = harness.vms_named(NAME);
    assert_eq!(vms.len(), 1, "exactly one VM named {NAME}: {vms:#?}");
    let vmid = vmid_of(&instance.provider_id);
    assert_eq!(
        vmid, mid_clone[0].vmid,
        "the crashed attempt's VM is adopted"
    );
    assert_eq!(vms[0].node, "pv1-2", "on its target");
    let clones = (state.request_log().iter())
        .filter(|r| r.path.ends_with("/clone"))
        .count();
    assert_eq!(clones, 1, "no second clone");
}

/// Corrections 1 and 2, F8: a retry that arrives while the crashed attempt's clone still runs sees
/// a nameless entry locked `clone` at its deterministic VMID. It waits for it and adopts it,
/// instead of taking the missing name as "absent" and cloning a second VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_during_the_crashed_clone_waits_for_it_and_adopts_it() {
    let harness = Harness::start_with(SimConfig {
        task_latency: std::time::Duration::from_millis(400),
        ..quick_sim_config()
    })
    .await;
    // resources, template config, clone: then the crash, before the clone task's first poll.
    harness.sim.faults().abort_after(3);
    let first = harness.create(NAME, UID).await;
    assert_eq!(class(&first), Some(ErrorClass::Transient), "{first:?}");
    harness.sim.faults().clear_abort();
    let mid_clone: Vec<pvesim::GuestView> = harness
        .sim
        .state()
        .vmids()
        .into_iter()
        .filter_map(|vmid| harness.sim.state().guest(vmid))
        .filter(|guest| guest.mid_clone)
        .collect();
    assert_eq!(
        mid_clone.len(),
        1,
        "the crashed attempt's clone is still running: {mid_clone:#?}"
    );
    assert_eq!(mid_clone[0].lock.as_deref(), Some("clone"));

    let instance = harness
        .create(NAME, UID)
        .await
        .expect("the retry adopts the clone");
    let vmid = assert_exactly_one_provisioned_vm(&harness, &instance.provider_id);
    assert_eq!(
        vmid, mid_clone[0].vmid,
        "the crashed attempt's VM is the one adopted"
    );
    let clones = harness
        .sim
        .state()
        .request_log()
        .iter()
        .filter(|r| r.path.ends_with("/clone"))
        .count();
    assert_eq!(clones, 1, "no second clone");
}

/// Requests a clean delete of a running VM makes on a fresh simulator.
async fn clean_delete_requests() -> usize {
    let harness = Harness::start().await;
    let created = harness.create(NAME, UID).await.expect("create");
    let before = harness.requests();
    harness
        .delete(&created.provider_id)
        .await
        .expect("clean delete");
    harness.requests() - before
}

/// F13/correction 5 (a repeat seed delete succeeds, so delete is retryable), F2 (a gone VM is
/// success), correction 1 (a VM busy with its destroy task is transient, not absent). The seed is
/// deleted before the VM is destroyed, so no crash point orphans it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_crashed_at_every_request_leaves_nothing_behind() {
    let total = clean_delete_requests().await;
    eprintln!("a clean delete made {total} requests");
    assert!(
        total >= 7,
        "a clean delete makes at least 7 requests, made {total}"
    );
    let mut crashes = 0;
    for n in 1..=total {
        let harness = Harness::start().await;
        let created = harness.create(NAME, UID).await.expect("create");
        let from = harness.requests();
        harness.sim.faults().abort_after(n as u64 - 1);
        let first = harness.delete(&created.provider_id).await;
        if abort_fired(&harness, from) {
            crashes += 1;
            assert_eq!(
                class(&first),
                Some(ErrorClass::Transient),
                "crash at request {n}: {first:?}"
            );
        } else {
            assert!(
                first.is_ok(),
                "no crash at request {n}, yet delete failed: {first:?}"
            );
        }
        harness.sim.faults().clear_abort();
        // The crashed attempt's tasks (stop, seed delete, destroy) finish on their own; a retry
        // meanwhile may see the destroy lock and answer transient.
        harness
            .delete_until_ok(&created.provider_id, 50)
            .await
            .unwrap_or_else(|error| {
                panic!("crash at request {n}: delete retries did not converge: {error}");
            });
        assert_nothing_left(&harness, &format!("crash at request {n}"));
    }
    assert!(
        crashes + 2 >= total,
        "the abort fired for only {crashes} of {total} requests"
    );
}

/// 5xx is transient (errors table); every step is idempotent, so retries converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_under_random_500s_converges_on_one_running_vm() {
    let harness = Harness::start_with(SimConfig {
        fault_seed: 7,
        ..quick_sim_config()
    })
    .await;
    let rule = harness.sim.faults().add(FaultRule::new(
        "*",
        "/**",
        Trigger::Rate(0.2),
        FaultAction::Status {
            status: 500,
            message: "simulated failure".into(),
        },
    ));
    let mut outcome = harness.create(NAME, UID).await;
    let mut attempts = 1;
    while attempts < 100 {
        match &outcome {
            Err(error) => assert_eq!(
                error.class(),
                ErrorClass::Transient,
                "attempt {attempts}: {error}"
            ),
            Ok(_) => break,
        }
        outcome = harness.create(NAME, UID).await;
        attempts += 1;
    }
    let instance =
        outcome.unwrap_or_else(|error| panic!("no convergence in {attempts} attempts: {error}"));
    eprintln!("under 20% 500s, create converged after {attempts} attempts");
    let failures = harness
        .sim
        .state()
        .request_log()
        .iter()
        .filter(|r| r.status == Some(500))
        .count();
    assert!(failures > 0, "the fault rule fired");
    harness.sim.faults().remove(rule);
    assert_exactly_one_provisioned_vm(&harness, &instance.provider_id);
    let running = wait_running(&harness, &instance.provider_id).await;
    assert_eq!(
        running.addresses,
        [pvesim::guest_ip(vmid_of(&instance.provider_id))]
    );
}

/// Check reasons: F22 (401), F13/F17 (Datastore.Allocate missing on the seed storage), TLS,
/// the broker's credentials-unavailable, unreachable, and a wrong node or storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_each_reason() {
    let harness = Harness::start().await;
    let ok = harness.check().await;
    assert_eq!(ok.reason, CheckReason::Ok, "{}", ok.message);

    let dir = harness.files.path();
    let secrets = [harness.secret(), secret_of(harness.sim.limited_token())];
    let spec = |secret_file: std::path::PathBuf, ca_file: &std::path::Path| GrantSpec {
        origin: harness.sim.url(),
        secret_file,
        ca_file: ca_file.to_path_buf(),
    };
    let ca = harness.sim.ca_file();

    let limited = load_provider(&spec(
        write_file(dir, "limited", harness.sim.limited_token()),
        ca,
    ))
    .await;
    let answer = check(&limited, &harness.config, &secrets).await;
    assert_eq!(answer.reason, CheckReason::Forbidden, "{}", answer.message);
    assert!(
        answer.message.contains("Datastore.Allocate"),
        "{}",
        answer.message
    );

    let wrong_secret = format!(
        "{}!{}=0badc0de-0000-4000-8000-000000000000",
        pvesim::TOKEN_USER,
        pvesim::TOKEN_ID
    );
    let wrong = load_provider(&spec(write_file(dir, "wrong", &wrong_secret), ca)).await;
    let answer = check(&wrong, &harness.config, &[&wrong_secret, harness.secret()]).await;
    assert_eq!(
        answer.reason,
        CheckReason::Unauthorized,
        "{}",
        answer.message
    );

    let other_sim = Simulator::start(quick_sim_config()).await.unwrap();
    let main_token = write_file(dir, "main", harness.sim.token());
    let wrong_ca = load_provider(&spec(main_token.clone(), other_sim.ca_file())).await;
    let answer = check(&wrong_ca, &harness.config, &secrets).await;
    assert_eq!(
        answer.reason,
        CheckReason::CertificateInvalid,
        "{}",
        answer.message
    );

    let no_secret = load_provider(&spec(dir.join("absent-token"), ca)).await;
    let answer = check(&no_secret, &harness.config, &secrets).await;
    assert_eq!(
        answer.reason,
        CheckReason::CredentialsUnavailable,
        "{}",
        answer.message
    );

    let closed = format!("https://127.0.0.1:{}", closed_port());
    let unreachable = load_provider(&GrantSpec {
        origin: closed.clone(),
        secret_file: main_token,
        ca_file: ca.to_path_buf(),
    })
    .await;
    let mut config = harness.config.clone();
    config["apiUrl"] = json!(closed);
    let answer = check(&unreachable, &config, &secrets).await;
    assert_eq!(
        answer.reason,
        CheckReason::Unreachable,
        "{}",
        answer.message
    );

    for (key, value) in [
        ("nodes", json!(["pv1-9"])),
        ("isoStorage", json!("no-such-storage")),
    ] {
        let mut config = harness.config.clone();
        config[key] = value;
        let answer = check(&harness.provider, &config, &secrets).await;
        assert_eq!(
            answer.reason,
            CheckReason::Misconfigured,
            "{key}: {}",
            answer.message
        );
    }
}

/// A simulator whose main token holds the recorded rights without `SDN.Use` on `/`, plus `extra`.
async fn harness_without_sdn_use(extra: Vec<pvesim::Acl>) -> Harness {
    let mut token_acls = vec![
        pvesim::Acl::new("/", &pvesim::operator_role_without(&["SDN.Use"])),
        pvesim::Acl::new("/storage/proxy-seeds", pvesim::SEED_ROLE),
    ];
    token_acls.extend(extra);
    let mut harness = Harness::start_with(SimConfig {
        token_acls,
        ..quick_sim_config()
    })
    .await;
    // Phase 0's VLAN: net0 becomes bridge=vmbr0,tag=4.
    harness.config["vlanTag"] = json!(4);
    harness
}

/// F17 (audit gap 6): a token without `SDN.Use` passed `check`, and then every create failed with
/// a 403, one Proxy at a time. Now `check` names the privilege and its paths; the create still
/// fails (the clone copies the template's NIC on vmbr0), permanently, and makes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f17_without_sdn_use_check_is_forbidden_and_create_is_permanent() {
    let harness = harness_without_sdn_use(vec![]).await;
    let answer = harness.check().await;
    assert_eq!(answer.reason, CheckReason::Forbidden, "{}", answer.message);
    for named in [
        "SDN.Use on /sdn/zones/localnetwork/vmbr0 ",
        "SDN.Use on /sdn/zones/localnetwork/vmbr0/4 ",
    ] {
        assert!(
            answer.message.contains(named),
            "{named}: {}",
            answer.message
        );
    }
    assert!(!answer.message.contains("VM.Clone"), "{}", answer.message);

    let outcome = harness.create(NAME, UID).await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    let message = outcome.unwrap_err().to_string();
    assert!(
        message.contains("403: Permission check failed (/sdn/zones/localnetwork/vmbr0, SDN.Use)"),
        "{message}"
    );
    assert!(harness.vms_named(NAME).is_empty(), "no VM made");
    assert_eq!(harness.sim.state().vmids(), TEMPLATES);
}

/// F17, Phase 0: `SDN.Use` on vmbr0 that does not propagate covers the template's untagged NIC,
/// not VLAN 4. `check` names only the VLAN's path; the create clones, then its net0 rewrite to
/// `bridge=vmbr0,tag=4` gets the 403, which is permanent, and the VM is never started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f17_a_vlan_without_sdn_use_is_named_by_check_and_refused_at_the_net0_rewrite() {
    let harness = harness_without_sdn_use(vec![pvesim::Acl::here_only(
        "/sdn/zones/localnetwork/vmbr0",
        &["SDN.Use"],
    )])
    .await;
    let answer = harness.check().await;
    assert_eq!(answer.reason, CheckReason::Forbidden, "{}", answer.message);
    assert!(
        answer
            .message
            .contains("SDN.Use on /sdn/zones/localnetwork/vmbr0/4 "),
        "{}",
        answer.message
    );
    assert!(
        !answer
            .message
            .contains("SDN.Use on /sdn/zones/localnetwork/vmbr0 "),
        "{}",
        answer.message
    );

    let outcome = harness.create(NAME, UID).await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    let message = outcome.unwrap_err().to_string();
    assert!(
        message.contains("403: Permission check failed (/sdn/zones/localnetwork/vmbr0/4, SDN.Use)"),
        "{message}"
    );
    let vms = harness.vms_named(NAME);
    assert_eq!(vms.len(), 1, "the clone was made: {vms:#?}");
    let net0 = vms[0].config.get("net0").cloned().unwrap_or_default();
    assert!(!net0.contains("tag="), "net0 unchanged: {net0}");
    assert_eq!(vms[0].run_state, pvesim::RunState::Stopped, "never started");
}

/// F19: template 9000 carries a Proxmox cloud-init drive on ide2; refused before any clone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_of_the_wrong_shape_is_permanent_and_makes_no_vm() {
    let mut harness = Harness::start().await;
    harness.config["templateVmid"] = json!(9000);
    let outcome = harness.create(NAME, UID).await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    assert!(format!("{outcome:?}").contains("cloud-init"), "{outcome:?}");
    assert_eq!(harness.sim.state().vmids(), TEMPLATES);
    assert!(harness.seeds().is_empty());
    let clones = harness
        .sim
        .state()
        .request_log()
        .iter()
        .filter(|r| r.path.ends_with("/clone"))
        .count();
    assert_eq!(clones, 0, "no clone was attempted");
}

/// Correction 2's ownership check: our name with another Proxy's UID is never adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_with_our_name_but_another_uid_is_permanent() {
    let harness = Harness::start().await;
    let created = harness.create(NAME, UID).await.expect("create");
    let outcome = harness.create(NAME, "another-proxy-uid").await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    assert_exactly_one_provisioned_vm(&harness, &created.provider_id);
}

/// `onboot=1`: after a node reboot the VM comes back running by itself, through the node's
/// `startall`, with no call that starts it; `get` finds it running at the same ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_vm_comes_back_running_by_itself_after_its_node_reboots() {
    let harness = Harness::start().await;
    let created = harness.create(NAME, UID).await.expect("create");
    let vmid = assert_exactly_one_provisioned_vm(&harness, &created.provider_id);
    wait_running(&harness, &created.provider_id).await;

    let since = harness.requests();
    let reboot = harness
        .sim
        .reboot_node("pv1-1", true)
        .expect("the node reboots");
    assert_eq!(reboot.stopped, [vmid], "the reboot stopped the proxy");
    let back = wait_running(&harness, &created.provider_id).await;
    assert_eq!(back.addresses, [pvesim::guest_ip(vmid)]);
    let startall = reboot.startall.expect("the boot runs startall");
    let log = harness.sim.state().task(&startall).expect("startall").log;
    assert_eq!(log, [format!("Starting VM {vmid}")], "the node started it");
    let starts: Vec<_> = harness.sim.state().request_log()[since..]
        .iter()
        .filter(|record| record.path.ends_with("/status/start"))
        .cloned()
        .collect();
    assert!(
        starts.is_empty(),
        "nobody asked the API to start it: {starts:?}"
    );
}

/// F9: the tag pair lives in the mark (Proxmox tags cannot hold `=`); VMs carry proxy_operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_by_tag_finds_the_created_vm() {
    let harness = Harness::start().await;
    let created = harness
        .create_tagged(NAME, UID, &[("egress.example/proxy", "team-a.p1")])
        .await
        .expect("create");
    let found = harness
        .list_by_tag("egress.example/proxy", "team-a.p1")
        .await
        .expect("list");
    assert_eq!(
        found
            .iter()
            .map(|i| i.provider_id.as_str())
            .collect::<Vec<_>>(),
        [created.provider_id.as_str()]
    );
    assert_eq!(found[0].uid, UID);
    let none = harness
        .list_by_tag("egress.example/proxy", "team-b.p1")
        .await
        .expect("list");
    assert!(none.is_empty(), "{none:?}");
}

/// The broker injects the token; the provider never sees it, so no output can carry it. Every
/// call in this file is scanned; this test drives the error paths that quote the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_never_appears_in_provider_errors_or_responses() {
    let harness = Harness::start().await;
    let created = harness.create(NAME, UID).await.expect("create");
    let wrong_secret = format!(
        "{}!{}=5ec7e7ab-0000-4000-8000-00000000beef",
        pvesim::TOKEN_USER,
        pvesim::TOKEN_ID
    );
    let wrong = load_provider(&GrantSpec {
        origin: harness.sim.url(),
        secret_file: write_file(harness.files.path(), "wrong", &wrong_secret),
        ca_file: harness.sim.ca_file().to_path_buf(),
    })
    .await;
    let secrets = [wrong_secret.as_str(), harness.secret()];
    let requests = [
        egress_runtime::Request::Get {
            config: harness.config_text(),
            provider_id: created.provider_id.clone(),
        },
        egress_runtime::Request::Delete {
            config: harness.config_text(),
            provider_id: created.provider_id.clone(),
        },
        egress_runtime::Request::Check {
            config: harness.config_text(),
        },
    ];
    for request in requests {
        let outcome = wrong
            .call(request, &egress_runtime::CallContext::default())
            .await;
        assert_no_secret(&outcome, &secrets);
        if let Err(error) = &outcome {
            // F22: the token is refused: permanent, and the message says 401.
            assert_eq!(error.class(), ErrorClass::Permanent, "{error}");
            assert!(error.to_string().contains("401"), "{error}");
        }
    }
    // Errors quoting the server (F2's not-found, a 500 from a fault) carry no secret either.
    harness.sim.faults().add(FaultRule::new(
        "GET",
        "/nodes/*/qemu/*/config",
        Trigger::Nth(1),
        FaultAction::Status {
            status: 500,
            message: "simulated failure".into(),
        },
    ));
    assert_eq!(
        class(&harness.get(&created.provider_id).await),
        Some(ErrorClass::Transient)
    );
    assert_eq!(
        class(&harness.get("pv1-1/199998").await),
        Some(ErrorClass::NotFound)
    );
}

/// The paths (without `/api2/json`) the simulator logged since request `from`.
fn paths_since(harness: &Harness, from: usize) -> Vec<String> {
    harness.sim.state().request_log()[from..]
        .iter()
        .map(|record| record.path.trim_start_matches("/api2/json").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reads_only_the_vms_own_endpoints_however_large_the_cluster() {
    let harness = Harness::start().await;
    harness.sim.state().add_other_vms(1_000);
    let created = harness.create(NAME, UID).await.expect("create");
    wait_running(&harness, &created.provider_id).await;
    let from = harness.requests();
    let running = harness.get(&created.provider_id).await.expect("get");
    assert_eq!(running.state, VmState::Running);
    let vm = format!("/nodes/pv1-1/qemu/{}", vmid_of(&created.provider_id));
    assert_eq!(
        paths_since(&harness, from),
        [
            format!("{vm}/status/current"),
            format!("{vm}/config"),
            format!("{vm}/agent/network-get-interfaces"),
        ],
        "no cluster listing in the common case"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_no_longer_on_the_node_its_id_names_is_found_through_the_listing() {
    let harness = Harness::start().await;
    let created = harness.create(NAME, UID).await.expect("create");
    wait_running(&harness, &created.provider_id).await;
    let vmid = vmid_of(&created.provider_id);
    // As after a migration: the ID names a node that no longer holds the VM (here one the
    // simulator does not know, which answers 500 as an unreachable node does).
    let from = harness.requests();
    let found = harness
        .get(&format!("pv1-0/{vmid}"))
        .await
        .expect("found through the listing");
    assert_eq!(found.provider_id, created.provider_id, "where it is now");
    assert_eq!(found.state, VmState::Running);
    assert_eq!(
        paths_since(&harness, from)[..2],
        [
            format!("/nodes/pv1-0/qemu/{vmid}/status/current"),
            "/cluster/resources".to_string(),
        ]
    );

    // Gone from everywhere: not-found, after the listing.
    harness.delete(&created.provider_id).await.expect("delete");
    let gone = harness.get(&created.provider_id).await;
    assert_eq!(class(&gone), Some(ErrorClass::NotFound), "{gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correction1_f8_a_mid_clone_vm_is_transient_before_its_config_is_read() {
    let harness = Harness::start_with(SimConfig {
        // The clone outlives the test.
        task_latency: std::time::Duration::from_secs(120),
        ..quick_sim_config()
    })
    .await;
    // resources, template config, clone: then the crash, leaving the clone running.
    harness.sim.faults().abort_after(3);
    let first = harness.create(NAME, UID).await;
    assert_eq!(class(&first), Some(ErrorClass::Transient), "{first:?}");
    harness.sim.faults().clear_abort();
    let vmid = harness
        .sim
        .state()
        .vmids()
        .into_iter()
        .find(|vmid| {
            harness
                .sim
                .state()
                .guest(*vmid)
                .is_some_and(|g| g.mid_clone)
        })
        .expect("a VM mid-clone");

    // On its node: status/current carries the clone's lock.
    let from = harness.requests();
    let on_node = harness.get(&format!("pv1-1/{vmid}")).await;
    assert_eq!(class(&on_node), Some(ErrorClass::Transient), "{on_node:?}");
    assert_eq!(
        paths_since(&harness, from),
        [format!("/nodes/pv1-1/qemu/{vmid}/status/current")],
        "the config, and the name in it, is never read"
    );

    // Through the listing: F8's nameless entry with status unknown.
    let from = harness.requests();
    let listed = harness.get(&format!("pv1-0/{vmid}")).await;
    assert_eq!(class(&listed), Some(ErrorClass::Transient), "{listed:?}");
    assert_eq!(
        paths_since(&harness, from),
        [
            format!("/nodes/pv1-0/qemu/{vmid}/status/current"),
            "/cluster/resources".to_string(),
        ],
        "the entry alone decides"
    );
}
