//! Issue 35: `conformance --record DIR` and `--replay DIR`. A whole run of the Proxmox provider
//! against pvesim is recorded, then replayed with pvesim stopped and gives the same report; the
//! provider changed to send one request differently fails the replay, exit 3, naming the step
//! and the request; tapes that cannot be replayed are refused naming the file.

use std::path::{Path, PathBuf};
use std::process::Command;

use egress_conformance::{self as conformance, Options, Outcome, REPLAY_DIVERGED, RULES, Taping};
use egress_runtime::RuntimeConfig;
use pvesim::Simulator;
use serde_json::Value;

use crate::proxmox_support::*;

/// A run of `only` (every rule when `None`) recorded against pvesim, which is stopped once the
/// recording is made: the grants and config files stay, with a copy of pvesim's CA.
struct Taped {
    files: tempfile::TempDir,
    tape: PathBuf,
    grants: String,
    config: Value,
    token: String,
    outcomes: Vec<(&'static str, Outcome)>,
}

impl Taped {
    async fn record(only: Option<&str>) -> Taped {
        let sim = Simulator::start(quick_sim_config()).await.unwrap();
        let files = tempfile::tempdir().unwrap();
        let ca_file = files.path().join("ca.pem");
        std::fs::copy(sim.ca_file(), &ca_file).unwrap();
        let spec = GrantSpec {
            origin: sim.url(),
            secret_file: write_file(files.path(), "token", sim.token()),
            ca_file,
        };
        let mut taped = Taped {
            tape: files.path().join("tape"),
            grants: grant_json_for("proxmox", &spec),
            config: provider_config(&sim),
            token: secret_of(sim.token()).to_owned(),
            outcomes: Vec::new(),
            files,
        };
        let options = taped.options(&component(), only, Taping::Record(taped.tape.clone()));
        let report = conformance::run(&options)
            .await
            .expect("the run is recorded");
        println!("recorded:\n{}", report.text());
        assert_eq!(report.failed(), 0, "{}", report.text());
        taped.outcomes = outcomes(&report);
        // pvesim stops here: every replay below has no backend.
        drop(sim);
        taped
    }

    fn options(&self, file: &Path, only: Option<&str>, taping: Taping) -> Options {
        Options {
            file: file.to_owned(),
            config: self.config.to_string(),
            grants: self.grants.clone(),
            identity: None,
            only: only.map(str::to_owned),
            runtime: RuntimeConfig::default().cache_dir(Some(
                PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("proxmox-compile-cache"),
            )),
            taping: Some(taping),
        }
    }

    /// Runs the binary's `conformance` replaying the tape for `component`; exit status, stdout.
    fn replay_binary(&self, component: &Path, only: &str) -> (Option<i32>, String) {
        let config = write_file(self.files.path(), "config.json", &self.config.to_string());
        let grants = write_file(self.files.path(), "grants.json", &self.grants);
        let output = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
            .arg("conformance")
            .arg(component)
            .arg("--config")
            .arg(config)
            .arg("--grants")
            .arg(grants)
            .arg("--replay")
            .arg(&self.tape)
            .args(["--only", only, "--cache-dir"])
            .arg(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("proxmox-compile-cache"))
            .output()
            .expect("the binary runs");
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        (output.status.code(), stdout)
    }
}

fn outcomes(report: &conformance::Report) -> Vec<(&'static str, Outcome)> {
    (report.rules.iter())
        .map(|rule| (rule.id, rule.outcome.clone()))
        .collect()
}

/// Every file below `dir`, and its text.
fn files_below(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_below(&path));
        } else {
            let text = std::fs::read_to_string(&path).unwrap();
            found.push((path, text));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_run_replays_with_pvesim_stopped_and_a_changed_provider_fails_naming_the_step() {
    let taped = Taped::record(None).await;
    assert_eq!(taped.outcomes.len(), RULES.len());
    let files = files_below(&taped.tape);
    let steps = |folder: &str| {
        (files.iter())
            .filter(|(path, _)| path.parent().unwrap().ends_with(folder))
            .count()
    };
    assert!(steps("lifecycle.create-get-list-delete") >= 5, "{files:?}");
    // The suite's own requests are steps too: pvesim's admin API found at the start, the stop hook.
    assert!(steps("start") >= 1, "{files:?}");
    assert!(
        (files.iter()).any(|(path, text)| path
            .parent()
            .unwrap()
            .ends_with("create.starts-stopped")
            && text.contains("/_egress-test/stop")),
        "the stop hook's requests are recorded"
    );
    for (path, text) in &files {
        assert!(
            !text.contains(&taped.token),
            "{} holds the token",
            path.display()
        );
    }

    let options = taped.options(&component(), None, Taping::Replay(taped.tape.clone()));
    let report = conformance::run(&options).await.expect("the replay runs");
    println!("replayed:\n{}", report.text());
    assert_eq!(outcomes(&report), taped.outcomes, "{}", report.text());

    // The provider changed to send one request differently: its rule leaves the recording at
    // the first request that differs, named with the step's file; exit 3.
    let changed = tempfile::tempdir().unwrap();
    let mutant = crate::recordings::mutant(changed.path());
    let rule = "lifecycle.create-get-list-delete";
    let (status, stdout) = tokio::task::block_in_place(|| taped.replay_binary(&mutant, rule));
    println!("{stdout}");
    assert_eq!(status, Some(3), "{stdout}");
    let line = (stdout.lines())
        .find(|line| line.starts_with(&format!("fail  {rule}: {REPLAY_DIVERGED}")))
        .unwrap_or_else(|| panic!("{rule} fails as diverged: {stdout}"));
    assert!(
        line.contains(&format!("{rule}/0")),
        "names the step's file: {line}"
    );
    assert!(
        line.contains("/status/CURRENT; the recording has GET ")
            && line.contains("/status/current"),
        "names both requests: {line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tapes_that_cannot_be_replayed_are_refused_naming_the_file() {
    let only = Some("create.idempotent");
    let taped = Taped::record(only).await;
    let replay = |tape: &Path| taped.options(&component(), only, Taping::Replay(tape.to_owned()));
    let refused = |options: Options| async move {
        match conformance::run(&options).await {
            Ok(report) => panic!("replayed:\n{}", report.text()),
            Err(error) => format!("{error:#}"),
        }
    };
    let run_file = taped.tape.join("run.json");
    let whole: Value = serde_json::from_str(&std::fs::read_to_string(&run_file).unwrap()).unwrap();
    let copy = |name: &str, edit: &dyn Fn(&mut Value)| {
        let tape = taped.files.path().join(name);
        copy_dir(&taped.tape, &tape);
        let mut run = whole.clone();
        edit(&mut run);
        std::fs::write(tape.join("run.json"), run.to_string()).unwrap();
        tape
    };

    // Recording into a folder that holds something is refused: a tape is one run.
    let error =
        refused(taped.options(&component(), only, Taping::Record(taped.tape.clone()))).await;
    assert!(error.contains("is not empty"), "{error}");

    let missing = taped.files.path().join("nothing-here");
    let error = refused(replay(&missing)).await;
    assert!(
        error.contains("nothing-here/run.json: not a recorded conformance run"),
        "{error}"
    );

    let tape = copy("other-version", &|run| run["version"] = 2.into());
    let error = refused(replay(&tape)).await;
    assert!(
        error.contains("other-version/run.json") && error.contains("version 2"),
        "{error}"
    );

    let tape = copy("other-provider", &|run| {
        run["provider"]["name"] = "libvirt".into()
    });
    let error = refused(replay(&tape)).await;
    assert!(
        error.contains("other-provider/run.json: recorded for libvirt"),
        "{error}"
    );

    let tape = copy("other-config", &|run| {
        run["config"]["nodes"] = serde_json::json!(["x"])
    });
    let error = refused(replay(&tape)).await;
    assert!(
        error.contains("other-config/run.json: recorded with the config"),
        "{error}"
    );

    // Another run id gives the rule's calls other names and tags: the first step names both.
    let tape = copy("other-run", &|run| run["run"] = "0badc0de".into());
    let report = conformance::run(&replay(&tape))
        .await
        .expect("the replay runs");
    let reason = match &report.rules[0].outcome {
        Outcome::Fail(reason) => reason.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        reason.starts_with(REPLAY_DIVERGED)
            && reason.contains("step 1: the suite called list-by-tag")
            && reason.contains("0badc0de-again")
            && reason.contains("create.idempotent/001-list-by-tag.json has list-by-tag"),
        "{reason}"
    );

    // A step the rule no longer takes: the replay names the first one left over.
    let tape = copy("step-left", &|_| {});
    let folder = tape.join("create.idempotent");
    let steps = std::fs::read_dir(&folder).unwrap().count();
    let extra = folder.join(format!("{:03}-get.json", steps + 1));
    std::fs::copy(folder.join("002-create.json"), &extra).unwrap();
    let report = conformance::run(&replay(&tape))
        .await
        .expect("the replay runs");
    let left = format!(
        "the rule ended before step {} ({})",
        steps + 1,
        extra.display()
    );
    assert!(
        matches!(&report.rules[0].outcome, Outcome::Fail(reason) if reason.contains(&left)),
        "{}",
        report.text()
    );

    // A step cut short fails its rule naming the file; the rules the tape does not hold skip.
    let tape = copy("cut-step", &|_| {});
    let step = tape.join("create.idempotent/002-create.json");
    let text = std::fs::read_to_string(&step).unwrap();
    std::fs::write(&step, &text[..text.len() / 2]).unwrap();
    let report = conformance::run(&taped.options(&component(), None, Taping::Replay(tape)))
        .await
        .expect("the replay runs");
    let outcome = outcomes(&report);
    let idempotent = (outcome.iter())
        .find(|(id, _)| *id == "create.idempotent")
        .unwrap();
    assert!(
        matches!(&idempotent.1, Outcome::Fail(reason)
            if reason.starts_with(REPLAY_DIVERGED) && reason.contains("create.idempotent/002-create.json")),
        "{idempotent:?}"
    );
    let skipped = (outcome.iter()).filter(|(_, outcome)| matches!(outcome, Outcome::Skip(_)));
    assert_eq!(skipped.count(), RULES.len() - 1, "{}", report.text());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// The rules that judge the whole run count, in a replay, the requests the recording answered
/// and the broker's denials it holds: a provider that reaches outside its grant fails the same
/// rules replayed as recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_judges_the_broker_s_denials_as_the_recorded_run_did() {
    let inventory = crate::conformance_support::Inventory::start().await;
    let files = tempfile::tempdir().unwrap();
    let tape = files.path().join("tape");
    let config = serde_json::json!({"endpoint": format!("http://127.0.0.1:{}", closed_port())});
    let origins = serde_json::json!([inventory.origin()]);
    let grants = serde_json::json!({"grants": {"reference": {"http": {"origins": origins}}}});
    let options = |taping| Options {
        file: testkit::component("reference"),
        config: config.to_string(),
        grants: grants.to_string(),
        identity: None,
        only: None,
        runtime: RuntimeConfig::default().cache_dir(None),
        taping: Some(taping),
    };
    let recorded = conformance::run(&options(Taping::Record(tape.clone())))
        .await
        .expect("the run is recorded");
    println!("recorded:\n{}", recorded.text());
    let denials = (recorded.rules.iter()).find(|rule| rule.id == "egress.no-denials");
    assert!(
        matches!(&denials.unwrap().outcome, Outcome::Fail(reason) if reason.contains("denied")),
        "{}",
        recorded.text()
    );
    drop(inventory);
    let replayed = conformance::run(&options(Taping::Replay(tape)))
        .await
        .expect("the replay runs");
    println!("replayed:\n{}", replayed.text());
    assert_eq!(outcomes(&replayed), outcomes(&recorded));
}
