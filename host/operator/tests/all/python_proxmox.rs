//! The Python Proxmox provider (`components/python-proxmox`, built with componentize-py) through
//! the same real path as the Rust one: the component in the runtime under the default limits, its
//! HTTP through the egress broker (token injected from a file, TLS verified against the run's CA,
//! HTTP/1.1 only), to the `pvesim` simulator over HTTPS. It proves a provider in another language
//! is sandboxed and served by the same host. Facts (F1–F23) and corrections (1–10) are from the Go
//! predecessor's execution log; each test names what it pins. Every call's answer is scanned for
//! the token's secret (`Harness::call`).
//!
//! Needs `target/components/python-proxmox.wasm` (`components/python-proxmox/build.sh`).

use crate::proxmox_support::*;
use egress_runtime::types::{CheckReason, Request, Response};
use egress_runtime::{CallContext, CallError, ErrorClass, VmState};
use pvesim::{RunState, SimConfig, Simulator};
use serde_json::{Value, json};

const NAME: &str = "proxy-pythonaaaaaaaaaaa";
const UID: &str = "6c1f0a2e-2222-4a53-9c7b-3f1b8f0a0002";
/// The preloaded templates (F19).
const TEMPLATES: [u32; 2] = [9000, 9001];

/// The Python provider: `python-proxmox.wasm` serves (and is granted) as `python-proxmox`.
const PYTHON_PROXMOX: Subject = Subject {
    identity: "python-proxmox",
    config: python_config,
};

/// Its configuration for the simulator (no seed storage: it builds no seed; budgets small).
fn python_config(sim: &Simulator) -> Value {
    json!({
        "apiUrl": sim.url(), "nodes": ["pv1-1"], "templateVmid": 9001,
        "targetStorage": "local-lvm",
        "budgets": {"pollMs": 10, "cloneSeconds": 5, "runningSeconds": 5},
    })
}

async fn harness() -> Harness {
    Harness::start_subject(&PYTHON_PROXMOX, quick_sim_config()).await
}

fn class(outcome: &Result<impl std::fmt::Debug, CallError>) -> Option<ErrorClass> {
    outcome.as_ref().err().map(CallError::class)
}

/// Requests the simulator logged whose path ends with `suffix` (`/clone`, …).
fn requests_ending(harness: &Harness, suffix: &str) -> usize {
    harness
        .sim
        .state()
        .request_log()
        .iter()
        .filter(|record| record.path.ends_with(suffix))
        .count()
}

fn non_template_vmids(harness: &Harness) -> Vec<u32> {
    harness
        .sim
        .state()
        .vmids()
        .into_iter()
        .filter(|vmid| !TEMPLATES.contains(vmid))
        .collect()
}

/// The mark the provider writes (F10, F11), for seeding VMs it must adopt or refuse.
fn mark(uid: &str) -> String {
    format!("egress-operator: managed\nuid: {uid}\ncreated-at: 2026-09-18T15:02:00Z\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_and_validate_config_follow_the_contract_without_io() {
    let harness = harness().await;
    let description = harness.provider.description();
    assert_eq!(description.name, "python-proxmox");
    assert_eq!(description.contract_version, "0.1.0");
    assert_eq!(
        description.capabilities,
        [egress_runtime::types::DeclaredCapability::Http]
    );
    let schema: Value = serde_json::from_str(&description.config_schema).expect("schema is JSON");
    assert_eq!(
        schema["required"],
        json!(["apiUrl", "nodes", "templateVmid"])
    );
    assert_eq!(schema["additionalProperties"], json!(false));

    let before = harness.requests();
    let validate = |config: String| harness.call(Request::ValidateConfig { config });
    assert!(matches!(
        validate(harness.config_text()).await,
        Ok(Response::ValidateConfig)
    ));
    let mut missing = harness.config.clone();
    missing.as_object_mut().unwrap().remove("nodes");
    let mut unknown = harness.config.clone();
    unknown["tokenFile"] = json!("/etc/token");
    for garbage in [
        "not json".to_string(),
        "[]".to_string(),
        missing.to_string(),
        unknown.to_string(),
    ] {
        let outcome = validate(garbage.clone()).await;
        assert_eq!(
            class(&outcome),
            Some(ErrorClass::Permanent),
            "{garbage}: {outcome:?}"
        );
    }
    assert_eq!(
        harness.requests(),
        before,
        "validate-config makes no request"
    );
}

/// The lifecycle: create (F10/F11 mark, F16 task, F3 start) → get until running with the agent's
/// address (F5 then F21) → list-by-tag (F9: the pair lives in the mark) → delete (stop, destroy
/// with purge) → get not-found (F2) → delete again succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_then_get_until_running_then_list_then_delete_then_not_found_then_delete_again() {
    let harness = harness().await;
    let created = harness
        .create_tagged(NAME, UID, &[("egress.example/proxy", "team-a.p1")])
        .await
        .expect("create");
    // Create returns once the VM is starting; the address is get's job.
    assert_eq!(created.state, VmState::Provisioning);
    assert_eq!((created.name.as_str(), created.uid.as_str()), (NAME, UID));
    assert!(
        created.created_at.is_some(),
        "F11: created-at is written in the mark"
    );
    assert!(
        created.provider_id.starts_with("pv1-1/"),
        "{}",
        created.provider_id
    );
    let vmid = vmid_of(&created.provider_id);
    let vm = harness.sim.state().guest(vmid).expect("the clone exists");
    let description = vm.config.get("description").cloned().unwrap_or_default();
    assert!(
        description.starts_with("egress-operator: managed\n")
            && description.contains(&format!("uid: {UID}\n"))
            && description.contains("tag: egress.example/proxy=team-a.p1\n"),
        "F10: the mark is the description: {description:?}"
    );
    assert_eq!(vm.config.get("agent").map(String::as_str), Some("1"));
    assert_eq!(
        vm.config.get("onboot").map(String::as_str),
        Some("1"),
        "starts with its host"
    );
    assert_eq!(
        vm.config.get("tags").map(String::as_str),
        Some("proxy_operator"),
        "correction 7"
    );
    assert_eq!(non_template_vmids(&harness), [vmid], "one VM made");

    let running = wait_running(&harness, &created.provider_id).await;
    assert_eq!(running.addresses, [pvesim::guest_ip(vmid)]);
    assert_eq!((running.uid.as_str(), running.name.as_str()), (UID, NAME));
    assert_eq!(running.created_at, created.created_at);

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

    harness.delete(&created.provider_id).await.expect("delete");
    assert_eq!(
        harness.sim.state().vmids(),
        TEMPLATES,
        "only the templates remain"
    );
    assert_eq!(
        class(&harness.get(&created.provider_id).await),
        Some(ErrorClass::NotFound),
        "F2"
    );
    harness
        .delete(&created.provider_id)
        .await
        .expect("a repeat delete succeeds");
}

/// Create is idempotent by name: a retry adopts the VM with our name and UID (running: at once),
/// and a VM that carries our mark but was never started is adopted and started, never cloned again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_adopts_a_vm_with_our_name_and_uid_and_never_clones_twice() {
    let harness = harness().await;
    let created = harness.create(NAME, UID).await.expect("create");
    let again = harness.create(NAME, UID).await.expect("repeat create");
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(again.created_at, created.created_at, "the same VM's mark");
    assert_eq!(requests_ending(&harness, "/clone"), 1, "no second clone");

    // A VM made by an earlier attempt that crashed before it was started.
    let other = "proxy-adoptaaaaaaaaaaaa";
    let description = mark(UID);
    harness.sim.state().add_qemu_vm(
        123_456,
        &[
            ("name", other),
            ("description", &description),
            ("agent", "1"),
        ],
    );
    let adopted = harness.create(other, UID).await.expect("adopt");
    assert_eq!(adopted.provider_id, "pv1-1/123456");
    assert_eq!(adopted.uid, UID);
    assert_eq!(
        adopted.created_at.as_deref(),
        Some("2026-09-18T15:02:00Z"),
        "F11: the mark's time, not a new one"
    );
    assert_eq!(
        requests_ending(&harness, "/clone"),
        1,
        "adoption clones nothing"
    );
    let vm = harness.sim.state().guest(123_456).unwrap();
    assert_eq!(vm.run_state, RunState::Running, "the adopted VM is started");
}

/// Correction 2's ownership check: a VM with our name but another Proxy's UID, or with no mark at
/// all, is `permanent` and left exactly as it was; nothing is cloned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_with_our_name_but_a_foreign_mark_or_none_is_permanent_and_untouched() {
    let harness = harness().await;
    let foreign = mark("another-proxy-uid");
    for (vmid, config) in [
        (
            123_001_u32,
            vec![
                ("name", "proxy-foreignaaaaaaaaaa"),
                ("description", foreign.as_str()),
            ],
        ),
        (123_002_u32, vec![("name", "proxy-unmarkedaaaaaaaaa")]),
    ] {
        harness.sim.state().add_qemu_vm(vmid, &config);
        let before = harness.sim.state().guest(vmid).unwrap();
        let name = config[0].1;
        let outcome = harness.create(name, UID).await;
        assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
        assert!(format!("{outcome:?}").contains("not ours"), "{outcome:?}");
        assert_eq!(
            harness.sim.state().guest(vmid).unwrap(),
            before,
            "the VM is untouched"
        );
    }
    assert_eq!(requests_ending(&harness, "/clone"), 0, "nothing cloned");

    // Delete never destroys a VM without our mark, and get does not report it as ours.
    let outcome = harness.delete("pv1-1/123002").await;
    assert_eq!(class(&outcome), Some(ErrorClass::Permanent), "{outcome:?}");
    assert!(
        harness.sim.state().guest(123_002).is_some(),
        "not destroyed"
    );
    assert_eq!(
        class(&harness.get("pv1-1/123002").await),
        Some(ErrorClass::NotFound)
    );
}

/// F14, correction 6: a paused VM is `running` in the resources listing and in `status`, with
/// `qmpstatus: paused`; it will not run by itself, so it is `stopped`. Stopped is `stopped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_vm_is_stopped_not_running() {
    let harness = harness().await;
    let created = harness.create(NAME, UID).await.expect("create");
    wait_running(&harness, &created.provider_id).await;
    let vmid = vmid_of(&created.provider_id);

    assert!(harness.sim.state().set_run_state(vmid, RunState::Paused));
    let paused = harness.get(&created.provider_id).await.expect("get");
    assert_eq!(paused.state, VmState::Stopped);
    assert!(paused.addresses.is_empty(), "{paused:?}");

    assert!(harness.sim.state().set_run_state(vmid, RunState::Stopped));
    let stopped = harness.get(&created.provider_id).await.expect("get");
    assert_eq!(stopped.state, VmState::Stopped);
}

/// F8 and the predecessor's note on cross-node clones: a retry during a clone onto another node
/// adopts it on its target (`proxmox.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_during_a_crashed_cross_node_clone_adopts_it_on_its_target() {
    crate::proxmox::a_retry_during_a_cross_node_clone_adopts_it_on_its_target(&PYTHON_PROXMOX)
        .await;
}

/// Corrections 1 and 2, F8: after a crash mid-clone the VM has no name and `lock: clone`. Get of
/// it is never `not-found`, and the retry of create waits for it and adopts it instead of taking
/// the missing name as "absent" and cloning a second VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_mid_clone_is_never_not_found_and_the_retry_adopts_it() {
    let harness = Harness::start_subject(
        &PYTHON_PROXMOX,
        SimConfig {
            task_latency: std::time::Duration::from_millis(1500),
            ..quick_sim_config()
        },
    )
    .await;
    // resources, template config, clone: then the crash, before the clone task's first poll.
    harness.sim.faults().abort_after(3);
    let first = harness.create(NAME, UID).await;
    assert_eq!(class(&first), Some(ErrorClass::Transient), "{first:?}");
    harness.sim.faults().clear_abort();
    let mid_clone: Vec<pvesim::GuestView> = non_template_vmids(&harness)
        .into_iter()
        .filter_map(|vmid| harness.sim.state().guest(vmid))
        .filter(|guest| guest.mid_clone)
        .collect();
    assert_eq!(mid_clone.len(), 1, "the clone still runs: {mid_clone:#?}");
    let vmid = mid_clone[0].vmid;
    assert!(!mid_clone[0].config.contains_key("name"), "F8: no name yet");

    let busy = harness.get(&format!("pv1-1/{vmid}")).await;
    assert_eq!(
        class(&busy),
        Some(ErrorClass::Transient),
        "correction 1: {busy:?}"
    );

    let adopted = harness
        .create(NAME, UID)
        .await
        .expect("the retry adopts the clone");
    assert_eq!(adopted.provider_id, format!("pv1-1/{vmid}"));
    assert_eq!(non_template_vmids(&harness), [vmid], "one VM");
    assert_eq!(requests_ending(&harness, "/clone"), 1, "no second clone");
}

/// Check reasons: ok, F22 (401 → unauthorized), the broker's `credentials-unavailable`, a CA that
/// did not sign the node's certificate, a closed port, a node or template that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_each_reason() {
    let harness = harness().await;
    let ok = harness.check().await;
    assert_eq!(ok.reason, CheckReason::Ok, "{}", ok.message);

    let dir = harness.files.path();
    let secrets = [harness.secret()];
    let ca = harness.sim.ca_file();
    let spec = |secret_file: std::path::PathBuf, ca_file: &std::path::Path| GrantSpec {
        origin: harness.sim.url(),
        secret_file,
        ca_file: ca_file.to_path_buf(),
    };
    let wrong_secret = format!(
        "{}!{}=0badc0de-0000-4000-8000-000000000000",
        pvesim::TOKEN_USER,
        pvesim::TOKEN_ID
    );
    let main_token = write_file(dir, "main", harness.sim.token());
    let other_sim = Simulator::start(quick_sim_config()).await.unwrap();
    let cases = [
        (
            spec(write_file(dir, "wrong", &wrong_secret), ca),
            CheckReason::Unauthorized,
        ),
        (
            spec(dir.join("absent-token"), ca),
            CheckReason::CredentialsUnavailable,
        ),
        (
            spec(main_token.clone(), other_sim.ca_file()),
            CheckReason::CertificateInvalid,
        ),
    ];
    for (grant, expected) in cases {
        let provider = load_subject(&PYTHON_PROXMOX, &grant).await;
        let answer = check(&provider, &harness.config, &[&wrong_secret, secrets[0]]).await;
        assert_eq!(answer.reason, expected, "{}", answer.message);
    }

    let closed = format!("https://127.0.0.1:{}", closed_port());
    let unreachable = load_subject(
        &PYTHON_PROXMOX,
        &GrantSpec {
            origin: closed.clone(),
            secret_file: main_token,
            ca_file: ca.to_path_buf(),
        },
    )
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

    for (key, value) in [("nodes", json!(["pv1-9"])), ("templateVmid", json!(9999))] {
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

/// The broker injects the token; the provider never sees it, so no answer can carry it. Every
/// call above is scanned; this test drives the error paths that quote the server: a refused token
/// (F22: permanent, the message says 401) on get, delete and check, a 5xx and F2's not-found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_never_appears_in_provider_errors_or_responses() {
    let harness = harness().await;
    let created = harness.create(NAME, UID).await.expect("create");
    let wrong_secret = format!(
        "{}!{}=5ec7e7ab-0000-4000-8000-00000000beef",
        pvesim::TOKEN_USER,
        pvesim::TOKEN_ID
    );
    let wrong = load_subject(
        &PYTHON_PROXMOX,
        &GrantSpec {
            origin: harness.sim.url(),
            secret_file: write_file(harness.files.path(), "wrong", &wrong_secret),
            ca_file: harness.sim.ca_file().to_path_buf(),
        },
    )
    .await;
    let secrets = [wrong_secret.as_str(), harness.secret()];
    let requests = [
        Request::Get {
            config: harness.config_text(),
            provider_id: created.provider_id.clone(),
        },
        Request::Delete {
            config: harness.config_text(),
            provider_id: created.provider_id.clone(),
        },
        Request::Check {
            config: harness.config_text(),
        },
    ];
    for request in requests {
        let outcome = wrong.call(request, &CallContext::default()).await;
        assert_no_secret(&outcome, &secrets);
        match &outcome {
            Err(error) => {
                assert_eq!(error.class(), ErrorClass::Permanent, "{error}");
                assert!(error.to_string().contains("401"), "{error}");
            }
            Ok(Response::Check(result)) => {
                assert_eq!(
                    result.reason,
                    CheckReason::Unauthorized,
                    "{}",
                    result.message
                )
            }
            Ok(other) => panic!("a refused token answered {other:?}"),
        }
    }
    harness.sim.faults().add(pvesim::FaultRule::new(
        "GET",
        "/cluster/resources",
        pvesim::Trigger::Nth(1),
        pvesim::FaultAction::Status {
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

#[tokio::test]
async fn a_malformed_provider_id_is_not_found_for_get_and_permanent_for_delete() {
    // docs/contract.md: no VM of ours can have it, so get answers not-found; delete refuses an ID
    // it never made rather than answer success.
    let harness = harness().await;
    for malformed in ["garbage", "pv1-1/../9001", "pv1-1/99"] {
        let get = harness
            .call(Request::Get {
                config: harness.config_text(),
                provider_id: malformed.into(),
            })
            .await;
        assert_eq!(
            class(&get),
            Some(ErrorClass::NotFound),
            "get {malformed}: {get:?}"
        );
        let delete = harness
            .call(Request::Delete {
                config: harness.config_text(),
                provider_id: malformed.into(),
            })
            .await;
        assert_eq!(
            class(&delete),
            Some(ErrorClass::Permanent),
            "delete {malformed}: {delete:?}"
        );
    }
    assert_eq!(
        requests_ending(&harness, "/config"),
        0,
        "nothing was read for them"
    );
}
