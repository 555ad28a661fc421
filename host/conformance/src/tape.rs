//! A run on tape: `--record DIR` and `--replay DIR`.
//!
//! Recording, every provider call a rule makes and every request the suite sends the backend
//! itself (the test-backend hook, pvesim's admin API) is one *step*, written as an
//! `egress-recording` file (`docs/recordings.md`) in the rule's folder:
//! `DIR/<rule id>/<n>-<operation>.json`. `DIR/run.json` keeps the run id that the VM names, UIDs
//! and tags are made from, the provider and the config. Replaying, each step is answered from
//! its file by an [`egress_tap::Replay`], with no backend: the n-th step of a rule must be the
//! same operation on the same input, and its requests must match the recorded ones (the rule in
//! `egress_tap::replay`). The first step that differs ends the rule with that step named.
//!
//! The faults a rule injects stand in front of the tape ([`Chain`]): they are not recorded, and
//! a replay injects them again, so a rule counts its faults the same way in both.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, bail};
use egress_runtime::{Chain, Description, Provider, Refusal, Tap, lock};
use egress_tap::{Bounds, RecordedProvider, Recorder, Recording, Replay};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The file that names a taped run.
pub(crate) const RUN_FILE: &str = "run.json";
/// The folder of the steps before the first rule (looking for pvesim).
pub(crate) const START: &str = "start";
/// The operation a step of the suite's own request to the backend is recorded under.
pub(crate) const BACKEND: &str = "backend";
const FORMAT: &str = "egress-conformance-run";
const VERSION: u32 = 1;

/// `DIR/run.json`.
#[derive(Debug, Serialize, Deserialize)]
struct RunFile {
    format: String,
    version: u32,
    /// The run id the VM names, UIDs and tags are made from.
    run: String,
    provider: RecordedProvider,
    config: Value,
}

/// Recording to or replaying from a folder.
#[derive(Debug)]
pub(crate) struct Tape {
    dir: PathBuf,
    /// `Some` when replaying: the provider the steps are replayed for.
    replaying: Option<Description>,
    provider: RecordedProvider,
    run: String,
    state: std::sync::Mutex<Folder>,
    /// Requests answered from recordings, and how many of them the broker had denied: what the
    /// broker's own counters would have seen.
    replayed_sent: AtomicU64,
    replayed_denied: AtomicU64,
}

/// The rule being taped.
#[derive(Debug, Default)]
struct Folder {
    name: String,
    steps: usize,
    /// The first step of the rule that left the recording.
    diverged: Option<String>,
    /// Why recording stopped (a write failed); the run goes on untaped.
    broken: bool,
}

/// A run id, fresh: what a run's VM names, UIDs and tags are made from.
pub(crate) fn fresh_run() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// One step in progress: `operation` on `input`, recorded or replayed.
pub(crate) struct Step {
    tape: Arc<Tape>,
    operation: String,
    input: Value,
    taped: Taped,
}

enum Taped {
    Recording(Arc<Recorder>, PathBuf),
    Replaying(Arc<Replay>),
}

impl Step {
    /// The step's tap behind `front` (a rule's faults), if a rule set one.
    pub(crate) fn tap(&self, front: Option<Arc<dyn Tap>>) -> Arc<dyn Tap> {
        let tap: Arc<dyn Tap> = match &self.taped {
            Taped::Recording(recorder, _) => Arc::clone(recorder) as Arc<dyn Tap>,
            Taped::Replaying(replay) => Arc::clone(replay) as Arc<dyn Tap>,
        };
        match front {
            Some(front) => Arc::new(Chain { front, behind: tap }),
            None => tap,
        }
    }

    /// The step returned `output`: recording, its file is written (a failed write stops the
    /// recording, not the run); replaying, its verdict is taken.
    pub(crate) fn end(self, output: Value) {
        let Step {
            tape,
            operation,
            input,
            taped,
        } = self;
        match taped {
            Taped::Recording(recorder, path) => {
                let recording = recorder.finish(tape.provider.clone(), &operation, input, output);
                if let Err(error) = recording.write(&path) {
                    eprintln!("warning: the recording stopped, the run goes on: {error}");
                    lock(&tape.state).broken = true;
                }
            }
            Taped::Replaying(replay) => match replay.verdict() {
                Ok(()) => tape.count(&replay.recording().exchanges),
                Err(divergence) => {
                    let mut state = lock(&tape.state);
                    state.diverged.get_or_insert(divergence.to_string());
                }
            },
        }
    }
}

impl Tape {
    /// Record a run of `provider` with `config` into `dir`, which must be missing or empty.
    pub(crate) fn record(dir: &Path, provider: &Provider, config: &Value) -> anyhow::Result<Tape> {
        let empty = match std::fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => true,
            Err(error) => bail!("{}: {error}", dir.display()),
        };
        if !empty {
            bail!(
                "{} is not empty: a run is recorded into a new folder",
                dir.display()
            );
        }
        let run = RunFile {
            format: FORMAT.into(),
            version: VERSION,
            run: fresh_run(),
            provider: RecordedProvider::of(provider),
            config: config.clone(),
        };
        let start = dir.join(START);
        std::fs::create_dir_all(&start).with_context(|| format!("creating {}", start.display()))?;
        let text = serde_json::to_string_pretty(&run)?;
        let path = dir.join(RUN_FILE);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(Tape::new(dir, None, run))
    }

    /// Replay the run recorded in `dir` for `provider` with `config`: refused, naming the file,
    /// when it is not a taped run, another version, another provider or contract, or another
    /// config.
    pub(crate) fn replay(dir: &Path, provider: &Provider, config: &Value) -> anyhow::Result<Tape> {
        let path = dir.join(RUN_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("{}: not a recorded conformance run", path.display()))?;
        let run: RunFile = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a recorded conformance run", path.display()))?;
        if run.format != FORMAT || run.version != VERSION {
            bail!(
                "{}: {} version {}; this suite replays {FORMAT} version {VERSION}",
                path.display(),
                run.format,
                run.version
            );
        }
        let description = provider.description();
        let recorded = &run.provider;
        if recorded.name != description.name || recorded.contract != description.contract_version {
            bail!(
                "{}: recorded for {} (contract {}), not {} (contract {})",
                path.display(),
                recorded.name,
                recorded.contract,
                description.name,
                description.contract_version
            );
        }
        if run.config != *config {
            bail!(
                "{}: recorded with the config {}, not {config}: replay with the recorded one",
                path.display(),
                run.config
            );
        }
        let run_id = run.run.len() == 8 && run.run.bytes().all(|b| b.is_ascii_hexdigit());
        if !run_id {
            bail!(
                "{}: the run id {:?} is not 8 hex digits",
                path.display(),
                run.run
            );
        }
        Ok(Tape::new(dir, Some(description.clone()), run))
    }

    fn new(dir: &Path, replaying: Option<Description>, run: RunFile) -> Tape {
        Tape {
            dir: dir.to_owned(),
            replaying,
            provider: run.provider,
            run: run.run,
            state: std::sync::Mutex::new(Folder {
                name: START.into(),
                ..Folder::default()
            }),
            replayed_sent: AtomicU64::new(0),
            replayed_denied: AtomicU64::new(0),
        }
    }

    /// The run id.
    pub(crate) fn run(&self) -> &str {
        &self.run
    }

    /// Whether this tape answers (no backend is reached).
    pub(crate) fn replaying(&self) -> bool {
        self.replaying.is_some()
    }

    /// Requests answered from the recording so far, and how many of them were denied.
    pub(crate) fn replayed(&self) -> (u64, u64) {
        (
            self.replayed_sent.load(Ordering::Relaxed),
            self.replayed_denied.load(Ordering::Relaxed),
        )
    }

    /// Steps from now on belong to rule `id`. Replaying, `false` when the recording has no
    /// folder for it (it was recorded with `--only` another rule).
    pub(crate) fn enter(&self, id: &str) -> anyhow::Result<bool> {
        let folder = self.dir.join(id);
        if self.replaying() {
            if !folder.is_dir() {
                return Ok(false);
            }
        } else if !lock(&self.state).broken {
            std::fs::create_dir_all(&folder)
                .with_context(|| format!("creating {}", folder.display()))?;
        }
        let mut state = lock(&self.state);
        let broken = state.broken;
        *state = Folder {
            name: id.to_owned(),
            broken,
            ..Folder::default()
        };
        Ok(true)
    }

    /// The rule's steps are done: the first divergence, or (replaying) the first recorded step
    /// the rule did not take.
    pub(crate) fn leave(&self) -> Option<String> {
        let state = lock(&self.state);
        if state.diverged.is_some() || !self.replaying() {
            return state.diverged.clone();
        }
        let next = self
            .step_file(&state.name, state.steps + 1)
            .ok()
            .flatten()?;
        Some(format!(
            "the rule ended before step {} ({})",
            state.steps + 1,
            next.display()
        ))
    }

    /// The next step: `operation` on `input`. Replaying, the recorded step must be the same;
    /// `Err` (the rule diverged) when it is not, when the recording has no more steps, or when
    /// an earlier step of the rule diverged (its later steps cannot match).
    pub(crate) fn begin(
        self: &Arc<Self>,
        operation: &str,
        input: Value,
    ) -> Result<Option<Step>, String> {
        let mut state = lock(&self.state);
        if state.broken {
            return Ok(None);
        }
        if let Some(diverged) = &state.diverged {
            return Err(format!("an earlier step left the recording: {diverged}"));
        }
        state.steps += 1;
        let number = state.steps;
        let Some(description) = &self.replaying else {
            let path = self
                .dir
                .join(&state.name)
                .join(format!("{number:03}-{operation}.json"));
            let taped = Taped::Recording(Recorder::new(Bounds::default()), path);
            return Ok(Some(self.step(operation, input, taped)));
        };
        let replay = self
            .replay_of(&state.name, number, operation, &input, description)
            .inspect_err(|why| {
                state.diverged.get_or_insert_with(|| why.clone());
            })?;
        Ok(Some(self.step(operation, input, Taped::Replaying(replay))))
    }

    fn step(self: &Arc<Self>, operation: &str, input: Value, taped: Taped) -> Step {
        Step {
            tape: Arc::clone(self),
            operation: operation.to_owned(),
            input,
            taped,
        }
    }

    /// Step `number` of rule `folder`, checked against what the suite does now.
    fn replay_of(
        &self,
        folder: &str,
        number: usize,
        operation: &str,
        input: &Value,
        description: &Description,
    ) -> Result<Arc<Replay>, String> {
        let path = match self.step_file(folder, number) {
            Ok(Some(path)) => path,
            Ok(None) => {
                return Err(format!(
                    "step {number} ({operation}) is past the end of {}",
                    self.dir.join(folder).display()
                ));
            }
            Err(error) => return Err(error),
        };
        let source = path.display().to_string();
        let recording = Recording::read(&path).map_err(|error| error.to_string())?;
        if recording.operation != operation || recording.input != *input {
            return Err(format!(
                "step {number}: the suite called {operation} {input}; {source} has {} {}",
                recording.operation, recording.input
            ));
        }
        Replay::new(recording, &source, description).map_err(|error| error.to_string())
    }

    /// The file of step `number` of rule `folder`, if the recording has one.
    fn step_file(&self, folder: &str, number: usize) -> Result<Option<PathBuf>, String> {
        let folder = self.dir.join(folder);
        let prefix = format!("{number:03}-");
        let entries =
            std::fs::read_dir(&folder).map_err(|error| format!("{}: {error}", folder.display()))?;
        Ok(entries
            .filter_map(|entry| Some(entry.ok()?.path()))
            .find(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with(&prefix) && name.ends_with(".json"))
            }))
    }

    /// A replayed step kept to its recording: count its requests, and the broker's denials.
    fn count(&self, exchanges: &[egress_tap::Exchange]) {
        let refusals = exchanges
            .iter()
            .filter_map(|exchange| exchange.error.as_ref()?.refusal.as_deref());
        let denied = refusals
            .filter(|refusal| {
                matches!(
                    Refusal::named(refusal),
                    Some(Refusal::Denied | Refusal::NotGranted)
                )
            })
            .count();
        self.replayed_sent
            .fetch_add(exchanges.len() as u64, Ordering::Relaxed);
        self.replayed_denied
            .fetch_add(denied as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use egress_runtime::egress::{CallSite, Egress, EgressBody};
    use egress_runtime::{DenyAll, Outgoing};
    use http_body_util::{BodyExt, Empty};
    use serde_json::json;

    use super::*;

    fn exchange(uri: &str, refusal: Option<&str>) -> Value {
        let answer = match refusal {
            Some(refusal) => json!({"error": {"code": "HTTP-request-denied", "refusal": refusal}}),
            None => json!({"response": {"status": 200, "headers": [], "body": {"text": "{}"}}}),
        };
        let mut exchange = json!({
            "request": {"method": "GET", "uri": uri, "headers": [], "body": {}},
            "timing": {"sentMs": 0},
        });
        exchange
            .as_object_mut()
            .unwrap()
            .extend(answer.as_object().unwrap().clone());
        exchange
    }

    /// What the broker's counters would have seen is what the replayed steps held: every request
    /// answered, and the denied ones apart.
    #[tokio::test]
    async fn a_replayed_step_counts_its_requests_and_the_broker_s_denials() {
        let dir = tempfile::tempdir().unwrap();
        let provider = RecordedProvider {
            identity: "p".into(),
            name: "p".into(),
            contract: "0.2.0".into(),
            digest: String::new(),
        };
        let recording = json!({
            "format": egress_tap::FORMAT, "version": egress_tap::VERSION, "provider": provider,
            "operation": "get", "input": {"providerId": "7"}, "output": null, "clock": [],
            "exchanges": [
                exchange("https://b.test/ok", None),
                exchange("https://elsewhere.test/", Some("denied")),
                exchange("https://b.test/pinned", Some("not-granted")),
            ],
        });
        std::fs::create_dir_all(dir.path().join("rule")).unwrap();
        std::fs::write(dir.path().join("rule/001-get.json"), recording.to_string()).unwrap();
        let description = Description {
            name: "p".into(),
            version: "1.0.0".into(),
            contract_version: "0.2.0".into(),
            config_schema: "{}".into(),
            capabilities: Vec::new(),
        };
        let run = RunFile {
            format: FORMAT.into(),
            version: VERSION,
            run: "0000abcd".into(),
            provider,
            config: Value::Null,
        };
        let tape = Arc::new(Tape::new(dir.path(), Some(description), run));
        assert!(tape.enter("rule").unwrap());
        let input = json!({"providerId": "7"});
        let step = tape.begin("get", input).unwrap().expect("a step");
        let site = CallSite {
            provider: "p".into(),
            digest: "".into(),
            operation: "get",
        };
        let next: Arc<dyn Egress> = Arc::new(DenyAll);
        for uri in [
            "https://b.test/ok",
            "https://elsewhere.test/",
            "https://b.test/pinned",
        ] {
            let body: EgressBody = Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed_unsync();
            let request = http::Request::get(uri).body(body).unwrap();
            let outgoing = Outgoing {
                site: &site,
                request,
                options: None,
            };
            let _ = step.tap(None).send(outgoing, &next).await;
        }
        step.end(Value::Null);
        assert_eq!(tape.leave(), None);
        assert_eq!(tape.replayed(), (3, 2));
    }
}
