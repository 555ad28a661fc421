//! One run's state: the loaded provider, the broker it runs behind, the grant's origins (and
//! pvesim when the backend is the simulator), the tap the rule has set on its calls, fresh names,
//! UIDs and tags, and the record of every call the rules made.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_capability_http::{Broker, HttpGrant};
use egress_runtime::Capability as _;
use egress_runtime::grant::{FilesOnly, GrantContext, GrantHost, SecretKeyRef};
use egress_runtime::types::{CheckResult, CreateRequest, Request, Response, Tag, Vm};
use egress_runtime::{CallContext, CallError, ErrorClass, Operation, Provider, Tap, VmState};
use serde_json::Value;

use super::backend::{Origin, Pvesim};
use super::tape::Tape;
use super::watch::Watch;
use crate::lock;

/// The tag key every VM the suite creates carries; the value is unique per run and rule.
pub(crate) const TAG_KEY: &str = "egress-conformance";
/// Attempts at a create or delete that answers `transient`, as the operator would retry.
const ATTEMPTS: usize = 5;
/// The pause between attempts and between polls.
const PAUSE: Duration = Duration::from_millis(200);
/// How long `get` may report a new VM as not yet running.
pub(crate) const RUNNING_BOUND: Duration = Duration::from_secs(120);
/// The credential the bad-credential check injects instead of the grant's.
const WRONG_CREDENTIAL: &str = "egress-conformance-wrong-credential";

/// Resolves every Secret to the wrong credential, for `check_with_wrong_credential`.
struct WrongCredential;

impl GrantHost for WrongCredential {
    fn secret(&self, _: &SecretKeyRef) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        Ok(zeroize::Zeroizing::new(
            WRONG_CREDENTIAL.as_bytes().to_vec(),
        ))
    }

    fn config_map(&self, reference: &SecretKeyRef) -> Result<String, String> {
        FilesOnly.config_map(reference)
    }

    fn file(&self, path: &std::path::Path) -> Result<(), String> {
        FilesOnly.file(path)
    }
}

/// How a call ended, as the aggregate rules judge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// It answered (a result, or the provider's own classified error).
    Answered,
    /// The host stopped it at its deadline.
    Deadline,
    /// It hit the memory cap, another budget, or could not be instantiated.
    Limit,
    /// It trapped or answered a value the host refuses.
    Broken,
    /// The host was busy (permits, pool): not the provider's doing.
    HostBusy,
}

impl Ending {
    fn of(outcome: &Result<Response, CallError>) -> Ending {
        match outcome {
            Ok(_) | Err(CallError::Provider(_)) => Ending::Answered,
            Err(CallError::Deadline { .. }) => Ending::Deadline,
            Err(
                CallError::MemoryCap { .. }
                | CallError::Budget { .. }
                | CallError::Instantiate { .. },
            ) => Ending::Limit,
            Err(CallError::Busy { .. } | CallError::PoolFull { .. }) => Ending::HostBusy,
            Err(_) => Ending::Broken,
        }
    }
}

/// One provider call of the run.
#[derive(Clone, Debug)]
pub(crate) struct CallRecord {
    pub operation: Operation,
    pub ending: Ending,
    /// The error's class and message (credentials scrubbed), if it failed.
    pub error: Option<(ErrorClass, String)>,
    /// Whether the answer held a credential.
    pub leaked: bool,
}

/// The run.
pub struct Session {
    provider: Arc<Provider>,
    broker: Arc<Broker>,
    watch: Arc<Watch>,
    grant: Option<HttpGrant>,
    config: Value,
    run: String,
    /// The injected secrets (the grant's and the wrong one), only to search answers for them.
    secrets: Vec<String>,
    /// The grant's origins, for the test-backend hooks.
    origins: Vec<Origin>,
    pvesim: Option<Pvesim>,
    /// What every call goes through while a rule faults its requests (`with_tap`).
    tap: Mutex<Option<Arc<dyn Tap>>>,
    /// Where the run is recorded to or replayed from (`--record`, `--replay`).
    tape: Option<Arc<Tape>>,
    /// The rule running (its place in `RULES`) and the UIDs it took: what makes a UID.
    rule: Mutex<(usize, u64)>,
    denied_before: u64,
    calls: Mutex<Vec<CallRecord>>,
    /// Provider IDs of VMs the run made, and tags it used, for the clean-up.
    made: Mutex<Vec<String>>,
    tags: Mutex<Vec<String>>,
}

impl Session {
    pub(crate) async fn start(
        provider: Arc<Provider>,
        broker: Arc<Broker>,
        watch: Arc<Watch>,
        grant: Option<HttpGrant>,
        config: Value,
        tape: Option<Arc<Tape>>,
    ) -> anyhow::Result<Session> {
        let secrets = secrets_of(grant.as_ref()).await;
        let origins = grant
            .as_ref()
            .map(|grant| grant.origins.clone())
            .unwrap_or_default();
        let origins = Origin::all(
            &broker,
            provider.identity(),
            provider.component_digest(),
            &origins,
            tape.clone(),
        );
        let pvesim = Pvesim::detect(&origins).await;
        let denied_before = denied(&broker, provider.identity());
        let run = match &tape {
            Some(tape) => tape.run().to_owned(),
            None => super::tape::fresh_run(),
        };
        Ok(Session {
            provider,
            broker,
            watch,
            grant,
            config,
            run,
            secrets,
            origins,
            pvesim,
            tap: Mutex::new(None),
            tape,
            rule: Mutex::new((0, 0)),
            denied_before,
            calls: Mutex::new(Vec::new()),
            made: Mutex::new(Vec::new()),
            tags: Mutex::new(Vec::new()),
        })
    }

    /// The loaded provider.
    pub(crate) fn provider(&self) -> &Provider {
        &self.provider
    }

    /// The run's config.
    pub(crate) fn config(&self) -> &Value {
        &self.config
    }

    /// The backend, when it is pvesim.
    pub(crate) fn pvesim(&self) -> Option<&Pvesim> {
        self.pvesim.as_ref()
    }

    /// The grant's origins.
    pub(crate) fn origins(&self) -> &[Origin] {
        &self.origins
    }

    /// The provider's HTTP grant, if it has one.
    pub(crate) fn http_grant(&self) -> Option<&HttpGrant> {
        self.grant.as_ref()
    }

    /// Every call goes through `tap` until the guard drops: how a rule injects faults at the
    /// broker, whatever the backend.
    pub(crate) fn with_tap(&self, tap: Arc<dyn Tap>) -> TapGuard<'_> {
        *lock(&self.tap) = Some(tap);
        TapGuard { session: self }
    }

    /// Requests the provider sent so far (replaying, the broker's share is the recording's).
    pub(crate) fn sent(&self) -> u64 {
        self.watch.sent() + self.replayed().0
    }

    /// Requests of the provider the broker denied during the run.
    pub(crate) fn denied(&self) -> u64 {
        denied(&self.broker, self.provider.identity()) - self.denied_before + self.replayed().1
    }

    fn replayed(&self) -> (u64, u64) {
        self.tape.as_ref().map_or((0, 0), |tape| tape.replayed())
    }

    /// Whether the run replays a recording (no backend is reached).
    pub(crate) fn replaying(&self) -> bool {
        self.tape.as_ref().is_some_and(|tape| tape.replaying())
    }

    /// Rule `id`, at `index` in `RULES`, runs from now on. Replaying, `false` when the recording
    /// holds no steps of it.
    pub(crate) fn enter_rule(&self, index: usize, id: &str) -> anyhow::Result<bool> {
        *lock(&self.rule) = (index, 0);
        self.tape.as_ref().map_or(Ok(true), |tape| tape.enter(id))
    }

    /// The rule is done: where it left the recording, if it did.
    pub(crate) fn leave_rule(&self) -> Option<String> {
        self.tape.as_ref().and_then(|tape| tape.leave())
    }

    /// Attempts to set a credential header during the run.
    pub(crate) fn credential_headers(&self) -> u64 {
        self.watch.credential_headers()
    }

    /// Every call so far.
    pub(crate) fn calls(&self) -> Vec<CallRecord> {
        lock(&self.calls).clone()
    }

    /// A VM name for `label`, fresh per run (a DNS label, as hypervisors take them).
    pub(crate) fn name(&self, label: &str) -> String {
        format!("conformance-{}-{label}", self.run)
    }

    /// A Proxy UID fresh per run, rule and call: made from them (in the form of a version-4
    /// UUID), so a replay of the run gives the rule the UIDs it was recorded with.
    pub(crate) fn uid(&self) -> String {
        let mut rule = lock(&self.rule);
        rule.1 += 1;
        format!("{}-{:04x}-4000-8000-{:012x}", self.run, rule.0, rule.1)
    }

    /// The tag for `label`, fresh per run.
    pub(crate) fn tag(&self, label: &str) -> Tag {
        let tag = Tag {
            key: TAG_KEY.to_owned(),
            value: format!("{}-{label}", self.run),
        };
        lock(&self.tags).push(tag.value.clone());
        tag
    }

    /// `text` with every credential replaced, for a failure reason.
    pub(crate) fn scrub(&self, text: &str) -> String {
        self.secrets.iter().fold(text.to_owned(), |text, secret| {
            text.replace(secret.as_str(), "[credential]")
        })
    }

    /// An error as a failure reason: `class: message`.
    pub(crate) fn error_text(&self, error: &CallError) -> String {
        format!(
            "{}: {}",
            error.class().as_str(),
            self.scrub(&error.to_string())
        )
    }

    /// One call, recorded (and taped with `--record` or `--replay`). A replayed call that left
    /// the recording is not made, nor counted for the aggregate rules: its rule fails with it.
    pub(crate) async fn call(&self, request: Request) -> Result<Response, CallError> {
        let operation = request.operation();
        let step = match &self.tape {
            Some(tape) => {
                let input = serde_json::to_value(&request).unwrap_or_default();
                // Permanent: no retry or wait of the rule goes on past the recording.
                let left = |why| CallError::InvalidResult {
                    operation,
                    problem: format!("replay: {why}"),
                };
                tape.begin(operation.as_str(), input).map_err(left)?
            }
            None => None,
        };
        let front = lock(&self.tap).clone();
        let context = CallContext {
            tap: match &step {
                Some(step) => Some(step.tap(front)),
                None => front,
            },
            ..CallContext::default()
        };
        let outcome = self.provider.call(request, &context).await;
        if let Some(step) = step {
            step.end(egress_tap::output_of(&outcome));
        }
        let text = match &outcome {
            Ok(response) => serde_json::to_string(response).unwrap_or_default(),
            Err(error) => format!("{error} {error:?}"),
        };
        let leaked = self
            .secrets
            .iter()
            .any(|secret| text.contains(secret.as_str()));
        let record = CallRecord {
            operation,
            ending: Ending::of(&outcome),
            error: outcome
                .as_ref()
                .err()
                .map(|error| (error.class(), self.scrub(&error.to_string()))),
            leaked,
        };
        lock(&self.calls).push(record);
        outcome
    }

    /// The run's config as the operations take it.
    pub(crate) fn config_text(&self) -> String {
        self.config.to_string()
    }

    /// One create, no retry.
    pub(crate) async fn try_create(
        &self,
        name: &str,
        uid: &str,
        tag: &Tag,
    ) -> Result<Vm, CallError> {
        let request = CreateRequest {
            name: name.to_owned(),
            uid: uid.to_owned(),
            tags: vec![tag.clone()],
            user_data: "#cloud-config\n".to_owned(),
            config: self.config_text(),
            placement: None,
        };
        let instance = match self.call(Request::Create { request }).await? {
            Response::Create(instance) => instance,
            other => return Err(wrong_answer(Operation::Create, &other)),
        };
        lock(&self.made).push(instance.provider_id.clone());
        Ok(instance)
    }

    /// Create, retrying `transient` answers as the operator does.
    pub(crate) async fn create(&self, name: &str, uid: &str, tag: &Tag) -> Result<Vm, String> {
        let mut attempt = 1;
        loop {
            match self.try_create(name, uid, tag).await {
                Err(error) if error.class() == ErrorClass::Transient && attempt < ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(PAUSE).await;
                }
                outcome => {
                    return outcome.map_err(|error| format!("create: {}", self.error_text(&error)));
                }
            }
        }
    }

    /// One get.
    pub(crate) async fn get(&self, provider_id: &str) -> Result<Vm, CallError> {
        let request = Request::Get {
            config: self.config_text(),
            provider_id: provider_id.to_owned(),
        };
        match self.call(request).await? {
            Response::Get(instance) => Ok(instance),
            other => Err(wrong_answer(Operation::Get, &other)),
        }
    }

    /// One delete, no retry.
    pub(crate) async fn try_delete(&self, provider_id: &str) -> Result<(), CallError> {
        let request = Request::Delete {
            config: self.config_text(),
            provider_id: provider_id.to_owned(),
        };
        self.call(request).await.map(drop)
    }

    /// Delete, retrying `transient` answers.
    pub(crate) async fn delete(&self, provider_id: &str) -> Result<(), String> {
        let mut attempt = 1;
        loop {
            match self.try_delete(provider_id).await {
                Err(error) if error.class() == ErrorClass::Transient && attempt < ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(PAUSE).await;
                }
                outcome => {
                    return outcome.map_err(|error| {
                        format!("delete {provider_id}: {}", self.error_text(&error))
                    });
                }
            }
        }
    }

    /// One list-by-tag.
    pub(crate) async fn list(&self, tag: &Tag) -> Result<Vec<Vm>, CallError> {
        let request = Request::ListByTag {
            config: self.config_text(),
            key: tag.key.clone(),
            value: tag.value.clone(),
        };
        match self.call(request).await? {
            Response::ListByTag(listing) => Ok(listing.vms),
            other => Err(wrong_answer(Operation::ListByTag, &other)),
        }
    }

    /// One check with `config`.
    pub(crate) async fn check(&self, config: &str) -> Result<CheckResult, CallError> {
        let request = Request::Check {
            config: config.to_owned(),
        };
        match self.call(request).await? {
            Response::Check(result) => Ok(result),
            other => Err(wrong_answer(Operation::Check, &other)),
        }
    }

    /// One check while the broker injects a wrong credential in place of the grant's; `None`
    /// when the grant injects none.
    pub(crate) async fn check_with_wrong_credential(
        &self,
    ) -> Option<Result<CheckResult, CallError>> {
        let grant = self
            .grant
            .as_ref()
            .filter(|grant| grant.credential.is_some())?;
        let identity = self.provider.identity();
        let mut wrong = grant.clone();
        if let Some(credential) = wrong.credential.as_mut() {
            credential.secret_file = None;
            credential.secret_ref = Some(SecretKeyRef {
                name: "conformance-wrong-credential".into(),
                key: "secret".into(),
                namespace: None,
            });
        }
        let context = |host| GrantContext { digests: &[], host };
        if let Err(error) = self
            .broker
            .set_grant(identity, &wrong, &context(&WrongCredential))
        {
            return Some(Err(CallError::Instantiate {
                message: format!("cannot swap the credential: {error}"),
            }));
        }
        let outcome = self.check(&self.config_text()).await;
        // Back to the grant as the file gives it; it was valid a moment ago.
        let _ = self.broker.set_grant(identity, grant, &context(&FilesOnly));
        Some(outcome)
    }

    /// Polls get until the VM runs; the running instance, or why not.
    pub(crate) async fn wait_running(&self, provider_id: &str) -> Result<Vm, String> {
        let started = tokio::time::Instant::now();
        let mut last = String::from("no answer yet");
        while started.elapsed() < RUNNING_BOUND {
            match self.get(provider_id).await {
                Ok(instance) if instance.state == VmState::Running => return Ok(instance),
                Ok(instance) if instance.state == VmState::Provisioning => {
                    last = "provisioning".to_owned();
                }
                Ok(instance) => {
                    return Err(format!(
                        "get {provider_id} answered {:?} while waiting for running",
                        instance.state
                    ));
                }
                Err(error) if error.class() == ErrorClass::Transient => {
                    last = self.error_text(&error);
                }
                Err(error) => {
                    return Err(format!(
                        "get {provider_id} while waiting for running: {}",
                        self.error_text(&error)
                    ));
                }
            }
            tokio::time::sleep(PAUSE).await;
        }
        Err(format!(
            "get {provider_id} did not report running within {RUNNING_BOUND:?} (last: {last})"
        ))
    }

    /// Deletes what the run made (listed by every tag it used, and every ID create answered).
    /// Best effort: a leftover is reported on stderr.
    pub(crate) async fn clean_up(&self) {
        let mut ids = lock(&self.made).clone();
        let tags = lock(&self.tags).clone();
        for value in tags {
            let tag = Tag {
                key: TAG_KEY.to_owned(),
                value,
            };
            if let Ok(listed) = self.list(&tag).await {
                ids.extend(listed.into_iter().map(|instance| instance.provider_id));
            }
        }
        ids.sort();
        ids.dedup();
        for id in ids {
            if let Err(error) = self.delete(&id).await {
                eprintln!("warning: the run's VM {id} may be left over: {error}");
            }
        }
    }
}

/// Takes the tap off the session's calls when dropped, however the rule ends.
pub(crate) struct TapGuard<'a> {
    session: &'a Session,
}

impl Drop for TapGuard<'_> {
    fn drop(&mut self) {
        *lock(&self.session.tap) = None;
    }
}

/// The secrets a leak would show: the wrong credential, and the grant's (read only to search
/// the provider's answers for it; it goes nowhere else).
async fn secrets_of(grant: Option<&HttpGrant>) -> Vec<String> {
    let mut secrets = vec![WRONG_CREDENTIAL.to_owned()];
    let file = grant
        .and_then(|grant| grant.credential.as_ref())
        .and_then(|credential| credential.secret_file.as_ref());
    if let Some(file) = file {
        let secret = tokio::fs::read_to_string(file).await.unwrap_or_default();
        let secret = secret.trim();
        // A `user=secret` token: the part after `=` is the secret a leak would show.
        for part in [Some(secret), secret.split_once('=').map(|(_, s)| s)]
            .into_iter()
            .flatten()
        {
            if part.len() >= 8 {
                secrets.push(part.to_owned());
            }
        }
    }
    secrets
}

fn denied(broker: &Broker, identity: &str) -> u64 {
    broker.metrics().count(identity, "-", "denied")
}

/// The runtime answers each operation with its own response variant; should it not, the rule
/// fails rather than the run.
fn wrong_answer(operation: Operation, response: &Response) -> CallError {
    CallError::InvalidResult {
        operation,
        problem: format!("the answer of {}", response.operation()),
    }
}
