//! # egress-conformance
//!
//! The provider contract (`docs/contract.md`) as rules run against one component and the backend
//! its configuration points at, through the real runtime (default limits) and the egress broker
//! (the grants file): what `egress-operator conformance` runs. The seam is [`run`]: [`Options`]
//! in, a [`Report`] out, printed as text or JUnit XML.
//!
//! Each rule has an id (`create.idempotent`, …) that `docs/contract.md` cites next to the rule of
//! the contract it checks, and ends `pass`, `fail` with the reason, or `skip` with why. A run:
//!
//! 1. loads the component under its identity, with the grants file's grants on the broker
//!    (wrapped in a `Watch`, `watch.rs`, that counts what the provider sends and which credential
//!    headers it tries to set) and on the libvirt capability;
//! 2. probes the grant's origins for `pvesim`'s admin API (`backend.rs`), which only
//!    `create.idempotent` uses (to count the simulator's VMs by name);
//! 3. runs the rules in order; every provider call goes through `Session::call` (`session.rs`),
//!    which records its duration and outcome, so the last rules (errors, egress, limits) judge
//!    every call of the run. The rules that need a backend fault (a 5xx, a reset, a busy VM, a
//!    hung endpoint, a TLS failure) set an `egress_tap::Faults` on their calls
//!    (`Session::with_tap`), which answers at the broker in place of the backend, so they run
//!    against any HTTP backend; `create.starts-stopped` stops a VM through the backend's
//!    test-backend hook `POST /_egress-test/stop` (`backend.rs`, `docs/contract.md`);
//! 4. deletes every VM it made (names, UIDs and tags are fresh per run).
//!
//! With [`Taping`], a run is recorded into a folder, or replayed from one with no backend at all
//! (`tape.rs`): each rule's provider calls and the suite's own requests to the backend, one
//! `egress-recording` file each.

mod backend;
mod check;
mod describe;
mod faults;
mod junit;
mod lifecycle;
mod run_checks;
mod session;
mod tape;
mod validate;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use egress_capability_set::{Capabilities, GrantsFile};
use egress_runtime::{Runtime, RuntimeConfig, lock};

pub use session::Session;

/// What a rule concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The provider keeps the rule.
    Pass,
    /// The provider breaks the rule; the reason says how.
    Fail(String),
    /// The rule could not run here; the reason says why.
    Skip(String),
}

/// A rule's result, failing with a reason.
pub type RuleResult = Result<(), String>;

/// One rule of the suite.
pub struct Rule {
    /// The id the contract cites (`family.what`).
    pub id: &'static str,
    /// What it checks, in one line.
    pub what: &'static str,
    run: RunFn,
}

type RunFn =
    for<'a> fn(&'a Session) -> std::pin::Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

macro_rules! rule {
    ($id:literal, $what:literal, $function:path) => {
        Rule {
            id: $id,
            what: $what,
            run: |session| Box::pin($function(session)),
        }
    };
}

/// Every rule, in the order a run takes them: the aggregate rules (errors, egress, limits) last,
/// so they judge every call before them.
pub const RULES: &[Rule] = &[
    rule!(
        "describe.valid",
        "name, semver version, contract version equal to the export's, a JSON Schema that compiles and accepts the config",
        describe::valid
    ),
    rule!(
        "describe.no-io",
        "describe sends no request",
        describe::no_io
    ),
    rule!(
        "validate.accepts-config",
        "validate-config accepts the run's config without sending a request",
        validate::accepts_config
    ),
    rule!(
        "validate.refuses-garbage",
        "validate-config answers permanent for text that is not a config object, without I/O",
        validate::refuses_garbage
    ),
    rule!(
        "validate.refuses-missing-required",
        "validate-config answers permanent for the config without each field the schema requires",
        validate::refuses_missing_required
    ),
    rule!(
        "lifecycle.create-get-list-delete",
        "create, get until running, list-by-tag finds it, delete, get is not-found, delete again succeeds",
        lifecycle::create_get_list_delete
    ),
    rule!(
        "create.idempotent",
        "a second create with the same name and UID answers the same provider ID and makes no VM",
        lifecycle::create_idempotent
    ),
    rule!(
        "create.starts-stopped",
        "create of a stopped VM of its own starts that VM again (needs the test-backend hook POST /_egress-test/stop)",
        lifecycle::create_starts_stopped
    ),
    rule!(
        "create.foreign-uid-permanent",
        "create with a taken name and another UID is permanent and leaves the VM alone",
        lifecycle::create_foreign_uid_permanent
    ),
    rule!(
        "get.unknown-not-found",
        "get of a provider ID whose VM is gone is not-found",
        lifecycle::get_unknown_not_found
    ),
    rule!(
        "check.reasons",
        "check answers ok for the config, unauthorized for a bad credential, certificate-invalid for a failed TLS handshake, never an error",
        check::reasons
    ),
    rule!(
        "faults.server-error-transient",
        "a 500, a 503, a reset or a body cut off on every request is transient for create, get, delete and list-by-tag",
        faults::server_error_transient
    ),
    rule!(
        "faults.lock-transient",
        "a busy VM (its own requests answered 503) is transient or provisioning for get, transient for delete, never not-found",
        faults::lock_transient
    ),
    rule!(
        "faults.check-hung-endpoint",
        "check against a backend that does not answer answers unreachable within its deadline",
        faults::check_hung_endpoint
    ),
    rule!(
        "errors.classified-no-secret",
        "every error of the run is the provider's own classified answer with a message, and no answer holds the credential",
        run_checks::classified_no_secret
    ),
    rule!(
        "egress.no-denials",
        "the broker denied nothing and the provider never tried to set a credential header",
        run_checks::no_denials
    ),
    rule!(
        "limits.deadline-memory",
        "no call of the run hit its deadline, the memory cap or a budget under the default limits",
        run_checks::deadline_memory
    ),
];

/// How the reason of a rule that left the recording it replays begins.
pub const REPLAY_DIVERGED: &str = "replay diverged: ";

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The component.
    pub file: PathBuf,
    /// The provider's configuration (JSON text).
    pub config: String,
    /// The grants document (YAML or JSON).
    pub grants: String,
    /// The identity the grants name; defaults to the file's stem.
    pub identity: Option<String>,
    /// Only this rule (and nothing else).
    pub only: Option<String>,
    /// The runtime's settings: default limits (the rules judge a provider under them), where
    /// compiled components are cached.
    pub runtime: RuntimeConfig,
    /// Record the run into a folder, or replay one recorded.
    pub taping: Option<Taping>,
}

/// Where a run is taped (`tape.rs`).
#[derive(Clone, Debug)]
pub enum Taping {
    /// Record every step into this folder, which must be missing or empty.
    Record(PathBuf),
    /// Answer every step from the run recorded in this folder; no request reaches a backend.
    Replay(PathBuf),
}

/// One rule's result in a report.
#[derive(Clone, Debug)]
pub struct RuleReport {
    /// The rule's id.
    pub id: &'static str,
    /// What it concluded.
    pub outcome: Outcome,
    /// How long it ran.
    pub elapsed: Duration,
}

/// The results of a run.
#[derive(Clone, Debug)]
pub struct Report {
    /// The identity the component ran as.
    pub identity: String,
    /// Each rule run, in order.
    pub rules: Vec<RuleReport>,
}

impl Report {
    /// Rules that failed.
    pub fn failed(&self) -> usize {
        self.count(|outcome| matches!(outcome, Outcome::Fail(_)))
    }

    /// Rules that failed because a replay left its recording.
    pub fn diverged(&self) -> usize {
        self.count(|outcome| {
            matches!(outcome, Outcome::Fail(reason) if reason.starts_with(REPLAY_DIVERGED))
        })
    }

    /// Rules that were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|outcome| matches!(outcome, Outcome::Skip(_)))
    }

    /// Rules that passed.
    pub fn passed(&self) -> usize {
        self.count(|outcome| *outcome == Outcome::Pass)
    }

    fn count(&self, which: impl Fn(&Outcome) -> bool) -> usize {
        self.rules
            .iter()
            .filter(|rule| which(&rule.outcome))
            .count()
    }

    /// One line per rule and a summary, as the CLI prints them.
    pub fn text(&self) -> String {
        let mut text = String::new();
        for rule in &self.rules {
            let line = match &rule.outcome {
                Outcome::Pass => format!("pass  {}\n", rule.id),
                Outcome::Fail(reason) => format!("fail  {}: {}\n", rule.id, one_line(reason)),
                Outcome::Skip(why) => format!("skip  {}: {}\n", rule.id, one_line(why)),
            };
            text.push_str(&line);
        }
        text.push_str(&format!(
            "{} rules: {} passed, {} failed, {} skipped\n",
            self.rules.len(),
            self.passed(),
            self.failed(),
            self.skipped()
        ));
        text
    }

    /// The report as JUnit XML, one test case per rule.
    pub fn junit(&self) -> String {
        junit::render(self)
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The rules a run takes: every one, or the one `only` names.
fn rules(only: Option<&str>) -> anyhow::Result<Vec<&'static Rule>> {
    let Some(id) = only else {
        return Ok(RULES.iter().collect());
    };
    match RULES.iter().find(|rule| rule.id == id) {
        Some(rule) => Ok(vec![rule]),
        None => bail!(
            "no rule `{id}`; the rules are: {}",
            RULES.iter().map(|r| r.id).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Loads the component, runs the rules (or the one `--only` names) and cleans up.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    let rules = rules(options.only.as_deref())?;
    let config: serde_json::Value =
        serde_json::from_str(&options.config).context("the config is not JSON")?;
    let grants = GrantsFile::parse(&options.grants).context("grants")?;
    let capabilities = Capabilities::new();
    grants.grant(&capabilities).context("grants")?;
    let broker = Arc::clone(&capabilities.http);
    let watch = Arc::new(watch::Watch::new(Arc::clone(&broker)));
    // The broker's grants, behind the watch; libvirt as the operator serves it.
    let runtime = Runtime::new(capabilities.serve_through(options.runtime.clone(), watch.clone()))?;
    let identity = match &options.identity {
        Some(identity) => identity.clone(),
        None => file_stem(&options.file)?,
    };
    let bytes = tokio::fs::read(&options.file)
        .await
        .with_context(|| format!("reading {}", options.file.display()))?;
    let provider = runtime.load_bytes(&identity, &bytes, &options.file).await?;
    let entry = grants.grants.get(&identity);
    let grant = entry.and_then(|entry| entry.grants.http.clone());
    let libvirt = entry.is_some_and(|entry| entry.grants.libvirt.is_some());
    let tape = match &options.taping {
        Some(_) if libvirt => bail!(
            "{identity} has a libvirt grant: a run is recorded and replayed at the HTTP broker only"
        ),
        Some(Taping::Record(dir)) => Some(tape::Tape::record(dir, &provider, &config)?),
        Some(Taping::Replay(dir)) => Some(tape::Tape::replay(dir, &provider, &config)?),
        None => None,
    };
    let session =
        Session::start(provider, broker, watch, grant, config, tape.map(Arc::new)).await?;
    let mut reports = Vec::new();
    for rule in rules {
        reports.push(run_rule(&session, rule).await?);
    }
    // A replay made no VM; a recording keeps the clean-up's steps apart from the rules'.
    if !session.replaying() {
        session.enter_rule(RULES.len(), "clean-up")?;
        session.clean_up().await;
    }
    Ok(Report {
        identity,
        rules: reports,
    })
}

/// One rule, on the run's tape if it has one.
async fn run_rule(session: &Session, rule: &'static Rule) -> anyhow::Result<RuleReport> {
    let started = Instant::now();
    let index = (RULES.iter().position(|r| r.id == rule.id)).unwrap_or_default();
    let outcome = if session.enter_rule(index, rule.id)? {
        let outcome = (rule.run)(session).await;
        match session.leave_rule() {
            Some(divergence) => Outcome::Fail(format!("{REPLAY_DIVERGED}{divergence}")),
            None => outcome,
        }
    } else {
        Outcome::Skip("the recording replayed holds no steps of this rule".into())
    };
    Ok(RuleReport {
        id: rule.id,
        outcome,
        elapsed: started.elapsed(),
    })
}

fn file_stem(file: &Path) -> anyhow::Result<String> {
    file.file_stem()
        .and_then(|stem| stem.to_str())
        .map(str::to_owned)
        .with_context(|| format!("{} has no file name to serve as identity", file.display()))
}

/// The outcome of a rule body: `Err` fails with its reason.
fn outcome(result: RuleResult) -> Outcome {
    match result {
        Ok(()) => Outcome::Pass,
        Err(reason) => Outcome::Fail(reason),
    }
}
