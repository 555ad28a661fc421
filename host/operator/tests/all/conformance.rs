//! `egress-operator conformance` against real components and backends: the Rust and the Python
//! Proxmox providers against `pvesim` pass every rule; a deliberately broken provider fails
//! exactly the rules it breaks; `--only` runs one rule; `--junit` writes XML a CI system reads.
//!
//! The reference provider runs in its endpoint mode against a small inventory service
//! (`conformance_support`) that has no test-backend hook; the example provider against the
//! guide's inventory (`testdata/inventory/inventory.py`), which has it: every rule runs there, the
//! fault rules injecting at the broker.
//!
//! Needs `target/components/{proxmox,python-proxmox,reference,conformance-broken,example-inventory}.wasm`
//! (`just build-components`) and `python3`.

use std::path::PathBuf;
use std::process::Command;

use crate::conformance_support::{Inventory, PythonInventory};
use crate::proxmox_support::*;
use egress_conformance::{self as conformance, Options, Outcome, RULES, Report};
use egress_runtime::RuntimeConfig;
use pvesim::Simulator;
use serde_json::{Value, json};

/// The Python provider, configured as in tests/python_proxmox.rs.
const PYTHON_PROXMOX: Subject = Subject {
    identity: "python-proxmox",
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
    let sim = Simulator::start(quick_sim_config())
        .await
        .expect("simulator starts");
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
        taping: None,
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
    assert!(
        error.contains("create.idempotent"),
        "the rules are listed: {error}"
    );
}

/// The broken provider (components/testing/conformance-broken): no backend, no grant.
const BROKEN: Subject = Subject {
    identity: "conformance-broken",
    config: |_| json!({}),
};

/// What the broken provider breaks, each with a word its reason must carry.
const BROKEN_RULES: [(&str, &str); 4] = [
    ("lifecycle.create-get-list-delete", "list-by-tag"),
    ("create.idempotent", "duplicate"),
    ("create.foreign-uid-permanent", "another UID"),
    ("get.unknown-not-found", "deleted VM"),
];

fn broken_options(only: Option<&str>) -> Options {
    Options {
        file: component_path(&BROKEN),
        config: "{}".to_owned(),
        grants: "grants: {}".to_owned(),
        identity: None,
        only: only.map(str::to_owned),
        runtime: RuntimeConfig::default().cache_dir(None),
        taping: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broken_provider_fails_exactly_the_rules_it_breaks() {
    let report = conformance::run(&broken_options(None))
        .await
        .expect("the suite runs");
    println!("{}", report.text());
    let failed = failures(&report);
    let ids: Vec<&str> = failed.iter().map(|(id, _)| *id).collect();
    let expected: Vec<&str> = BROKEN_RULES.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, expected, "{}", report.text());
    for ((_, reason), (id, word)) in failed.iter().zip(BROKEN_RULES) {
        assert!(reason.contains(word), "{id}: {reason}");
    }
    // No grant: nothing to fault at the HTTP broker, no hook to stop a VM with; the schema
    // requires nothing. Each says why.
    let skipped: Vec<&str> = report
        .rules
        .iter()
        .filter(|rule| matches!(rule.outcome, Outcome::Skip(_)))
        .map(|rule| rule.id)
        .collect();
    assert_eq!(
        skipped,
        [
            "validate.refuses-missing-required",
            "create.starts-stopped",
            "faults.server-error-transient",
            "faults.lock-transient",
            "faults.check-hung-endpoint"
        ]
    );
    let text = report.text();
    assert!(
        text.contains("skip  create.starts-stopped: needs the test-backend hook POST /_egress-test/stop (docs/contract.md)"),
        "{text}"
    );
    for fault in [
        "server-error-transient",
        "lock-transient",
        "check-hung-endpoint",
    ] {
        assert!(
            text.contains(&format!(
                "skip  faults.{fault}: needs a provider that reaches its backend over HTTP"
            )),
            "{text}"
        );
    }
}

/// Runs the binary as a user does; its exit status, stdout and the JUnit file.
async fn run_binary(args: Vec<String>) -> (Option<i32>, String) {
    let cache = tempfile::tempdir().unwrap();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_egress-operator"))
            .args(&args)
            .env("XDG_CACHE_HOME", cache.path())
            .output()
            .expect("the binary runs")
    })
    .await
    .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// (tests, failures, skipped) of the JUnit document, checked against its test cases.
fn junit_counts(xml: &str) -> (usize, usize, usize) {
    let document = roxmltree::Document::parse(xml).expect("the JUnit file parses as XML");
    let suite = document
        .descendants()
        .find(|node| node.has_tag_name("testsuite"))
        .expect("a testsuite");
    let cases: Vec<_> = suite
        .children()
        .filter(|node| node.has_tag_name("testcase"))
        .collect();
    let with = |tag: &str| {
        cases
            .iter()
            .filter(|case| case.children().any(|child| child.has_tag_name(tag)))
            .count()
    };
    let attribute = |name: &str| -> usize { suite.attribute(name).unwrap().parse().unwrap() };
    assert_eq!(attribute("tests"), cases.len());
    assert_eq!(attribute("failures"), with("failure"));
    assert_eq!(attribute("skipped"), with("skipped"));
    (cases.len(), with("failure"), with("skipped"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_passes_the_proxmox_provider_against_pvesim_and_writes_junit() {
    let backend = pvesim_for(&PROXMOX).await;
    let dir = backend.files.path();
    let config = write_file(dir, "config.json", &backend.config.to_string());
    let grants = write_file(dir, "grants.yaml", &backend.grants);
    let junit = dir.join("junit.xml");
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let (status, stdout) = run_binary(vec![
        "conformance".into(),
        path(&component_path(&PROXMOX)),
        "--config".into(),
        path(&config),
        "--grants".into(),
        path(&grants),
        "--junit".into(),
        path(&junit),
    ])
    .await;
    assert_eq!(status, Some(0), "{stdout}");
    assert_eq!(stdout.lines().count(), RULES.len() + 1, "{stdout}");
    for rule in RULES {
        assert!(
            stdout
                .lines()
                .any(|line| line == format!("pass  {}", rule.id)),
            "{}: {stdout}",
            rule.id
        );
    }
    assert!(
        stdout.ends_with(&format!(
            "{0} rules: {0} passed, 0 failed, 0 skipped\n",
            RULES.len()
        )),
        "{stdout}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(junit_counts(&xml), (RULES.len(), 0, 0));
    assert_clean(&backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_1_for_the_broken_provider_and_its_junit_counts_the_failures() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "config.json", "{}");
    let grants = write_file(dir.path(), "grants.yaml", "grants: {}\n");
    let junit = dir.path().join("junit.xml");
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let (status, stdout) = run_binary(vec![
        "conformance".into(),
        path(&component_path(&BROKEN)),
        "--config".into(),
        path(&config),
        "--grants".into(),
        path(&grants),
        "--junit".into(),
        path(&junit),
    ])
    .await;
    assert_eq!(status, Some(1), "{stdout}");
    for (id, _) in BROKEN_RULES {
        assert!(
            stdout
                .lines()
                .any(|line| line.starts_with(&format!("fail  {id}: "))),
            "{id}: {stdout}"
        );
    }
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(junit_counts(&xml), (RULES.len(), BROKEN_RULES.len(), 5));
    // `--only` with the binary: one rule, one line and the summary.
    let (status, stdout) = run_binary(vec![
        "conformance".into(),
        path(&component_path(&BROKEN)),
        "--config".into(),
        path(&config),
        "--grants".into(),
        path(&grants),
        "--only".into(),
        "describe.valid".into(),
    ])
    .await;
    assert_eq!(status, Some(0), "{stdout}");
    assert_eq!(
        stdout,
        "pass  describe.valid\n1 rules: 1 passed, 0 failed, 0 skipped\n"
    );
}

/// The reference provider (components/reference) in its endpoint mode.
const REFERENCE: Subject = Subject {
    identity: "reference",
    config: |_| json!({}),
};

/// The reference provider against an inventory service that keeps the contract on its side: it
/// passes every rule that can run there, the fault rules included (injected at the broker); the
/// rule that needs the test-backend hook (the service has none) and the missing-fields rule (its
/// schema requires nothing) are skipped, each saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_provider_passes_every_rule_against_its_endpoint() {
    let inventory = Inventory::start().await;
    let grants = json!({"grants": {"reference": {"http": {"origins": [inventory.origin()]}}}});
    let options = Options {
        file: component_path(&REFERENCE),
        config: json!({"endpoint": inventory.origin()}).to_string(),
        grants: grants.to_string(),
        identity: None,
        only: None,
        runtime: RuntimeConfig::default().cache_dir(None),
        taping: None,
    };
    let report = conformance::run(&options).await.expect("the suite runs");
    println!("{}", report.text());
    assert!(failures(&report).is_empty(), "{}", report.text());
    let skipped: Vec<(&str, &str)> = report
        .rules
        .iter()
        .filter_map(|rule| match &rule.outcome {
            Outcome::Skip(why) => Some((rule.id, why.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        skipped,
        [
            (
                "validate.refuses-missing-required",
                "the config schema requires no field"
            ),
            (
                "create.starts-stopped",
                "needs the test-backend hook POST /_egress-test/stop (docs/contract.md): no origin of the grant has it"
            ),
        ],
        "{}",
        report.text()
    );
    assert_eq!(inventory.len(), 0, "the run deleted what it made");
}

/// The bar: every rule runs against a provider for a backend that is not pvesim. The
/// example provider against the guide's inventory, over HTTPS with the token the broker injects,
/// through the binary: all 17 run, none skipped (the inventory has the stop hook, the faults are
/// injected at the broker), and every rule passes, `create.starts-stopped` included (create starts
/// a stopped VM of its own with `POST /vms/<id>/start`: the operator's restart of a stopped Proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_runs_for_the_example_provider_against_the_guides_inventory() {
    let inventory = PythonInventory::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "config.json", &inventory.config().to_string());
    let grants = write_file(
        dir.path(),
        "grants.json",
        &inventory.grants("example-inventory").to_string(),
    );
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let (status, stdout) = run_binary(vec![
        "conformance".into(),
        path(&testkit::component("example-inventory")),
        "--config".into(),
        path(&config),
        "--grants".into(),
        path(&grants),
    ])
    .await;
    println!("{stdout}");
    assert_eq!(status, Some(0), "{stdout}");
    for rule in RULES {
        let line = stdout
            .lines()
            .find(|line| line.split([' ', ':']).nth(2) == Some(rule.id))
            .unwrap_or_else(|| panic!("{} did not run: {stdout}", rule.id));
        assert_eq!(line, format!("pass  {}", rule.id), "{stdout}");
    }
    assert!(
        stdout.ends_with(&format!(
            "{0} rules: {0} passed, 0 failed, 0 skipped\n",
            RULES.len()
        )),
        "{stdout}"
    );
    let left: Vec<String> = inventory
        .vm_names()
        .await
        .into_iter()
        .filter(|name| name.starts_with("conformance-"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "the run deleted what it made");
}

/// Runs one rule against `file` with `config` and no grant; its outcome.
async fn only(file: &str, config: Value, grants: Value, rule: &str) -> Outcome {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/components")
        .join(file);
    let options = Options {
        file: path,
        config: config.to_string(),
        grants: grants.to_string(),
        identity: None,
        only: Some(rule.to_owned()),
        runtime: RuntimeConfig::default().cache_dir(None),
        taping: None,
    };
    let report = conformance::run(&options).await.expect("the suite runs");
    report.rules[0].outcome.clone()
}

fn failed_with(outcome: &Outcome, words: &str) -> bool {
    matches!(outcome, Outcome::Fail(reason) if reason.contains(words))
}

/// The rules that judge every call fail, alone, a provider that traps, outgrows its memory, sets
/// `Authorization` or reaches outside its grant (misbehave and the reference's TEST ONLY switch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_wide_rules_fail_traps_memory_credentials_and_denials() {
    let no_grants = json!({"grants": {}});
    let trap = only(
        "misbehave.wasm",
        json!({"mode": "trap"}),
        no_grants.clone(),
        "errors.classified-no-secret",
    )
    .await;
    assert!(
        failed_with(&trap, "classified error of its own"),
        "{trap:?}"
    );
    let grow = only(
        "misbehave.wasm",
        json!({"mode": "grow"}),
        no_grants.clone(),
        "limits.deadline-memory",
    )
    .await;
    assert!(failed_with(&grow, "hit a limit"), "{grow:?}");

    let inventory = Inventory::start().await;
    let granted = json!({"grants": {"reference": {"http": {"origins": [inventory.origin()]}}}});
    let authorization = only(
        "reference.wasm",
        json!({"endpoint": inventory.origin(), "debugSendAuthorization": "Bearer guest"}),
        granted.clone(),
        "egress.no-denials",
    )
    .await;
    assert!(
        failed_with(&authorization, "credential header"),
        "{authorization:?}"
    );
    let elsewhere = only(
        "reference.wasm",
        json!({"endpoint": format!("http://127.0.0.1:{}", closed_port())}),
        granted.clone(),
        "egress.no-denials",
    )
    .await;
    assert!(failed_with(&elsewhere, "denied"), "{elsewhere:?}");
    let kept = only(
        "reference.wasm",
        json!({"endpoint": inventory.origin()}),
        granted,
        "egress.no-denials",
    )
    .await;
    assert_eq!(kept, Outcome::Pass);
}
