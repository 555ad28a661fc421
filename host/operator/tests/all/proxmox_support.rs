//! The real path for a Proxmox provider: a built component (`target/components/proxmox.wasm`, or
//! another [`Subject`]) in the runtime, its HTTP through the egress broker (token injected from a
//! secret file, TLS verified against the simulator's CA, HTTP/1.1 only), to a `pvesim` simulator
//! over HTTPS.

// Each test binary that includes this module uses a part of it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use egress_capability_set::{Capabilities, GrantsFile};
use egress_runtime::types::{CheckResult, CreateRequest, Request, Response, Tag, Vm};
use egress_runtime::{CallContext, CallError, ErrorClass, Provider, Runtime, RuntimeConfig};
use pvesim::{SimConfig, Simulator};
use serde_json::{Value, json};

/// A provider component the harness drives: which file, the identity it serves (and is granted)
/// as, and its configuration for a simulator.
#[derive(Clone, Copy, Debug)]
pub struct Subject {
    /// The identity the grant names: the stem of its file under `target/components/`, as
    /// `load_file` assigns it.
    pub identity: &'static str,
    /// The provider's configuration for a simulator.
    pub config: fn(&Simulator) -> Value,
}

/// The Rust Proxmox provider.
pub const PROXMOX: Subject = Subject {
    identity: "proxmox",
    config: provider_config,
};

/// The built component.
pub fn component() -> PathBuf {
    component_path(&PROXMOX)
}

/// The built component of `subject`.
pub fn component_path(subject: &Subject) -> PathBuf {
    testkit::component(subject.identity)
}

/// A simulator with tasks and an agent fast enough for tests, but slow enough that waits poll.
pub fn quick_sim_config() -> SimConfig {
    SimConfig {
        task_latency: Duration::from_millis(5),
        agent_delay: Duration::from_millis(100),
        ..SimConfig::default()
    }
}

/// Where the broker connects and what it injects and trusts.
pub struct GrantSpec {
    pub origin: String,
    pub secret_file: PathBuf,
    pub ca_file: PathBuf,
}

/// The grant document for the provider `identity`.
pub fn grant_json_for(identity: &str, spec: &GrantSpec) -> String {
    json!({"grants": {identity: {"http": {
        "origins": [spec.origin],
        "credential": {
            "header": "Authorization",
            "format": "PVEAPIToken={secret}",
            "secretFile": spec.secret_file,
        },
        "tls": {"caFile": spec.ca_file, "http1Only": true},
        "timeouts": {"connectMs": 2000, "firstByteMs": 5000, "totalMs": 10000},
    }}}})
    .to_string()
}

/// A runtime whose egress is a broker with `spec`, and the component loaded in it. Compiled
/// components are cached under the target directory, so only the first load compiles.
pub async fn load_provider(spec: &GrantSpec) -> Arc<Provider> {
    load_subject(&PROXMOX, spec).await
}

/// [`load_provider`] for `subject`, loaded from its file as the host loads it (the file's stem is
/// its identity).
pub async fn load_subject(subject: &Subject, spec: &GrantSpec) -> Arc<Provider> {
    let capabilities = Capabilities::new();
    GrantsFile::parse(&grant_json_for(subject.identity, spec))
        .expect("grant parses")
        .grant(&capabilities)
        .expect("grant is valid");
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("proxmox-compile-cache");
    let runtime = Runtime::new(capabilities.serve(RuntimeConfig::default().cache_dir(Some(cache))))
        .expect("runtime");
    let provider = runtime
        .load_file(&component_path(subject))
        .await
        .unwrap_or_else(|error| panic!("the {} component loads: {error}", subject.identity));
    assert_eq!(
        provider.identity(),
        subject.identity,
        "the grant names the identity"
    );
    provider
}

/// The provider's configuration for the simulator, on all its nodes (budgets small: tests stay
/// quick).
pub fn provider_config(sim: &Simulator) -> Value {
    json!({
        "apiUrl": sim.url(), "nodes": sim.nodes(), "templateVmid": 9001,
        "targetStorage": "local-lvm", "isoStorage": "proxy-seeds",
        "budgets": {"pollMs": 10, "cloneSeconds": 5, "runningSeconds": 5},
    })
}

/// A simulator, a secret file with its main token, and the component behind a broker granted
/// that token. Every call checks that the secret appears nowhere in what the provider returned.
pub struct Harness {
    pub sim: Simulator,
    pub provider: Arc<Provider>,
    pub config: Value,
    pub files: tempfile::TempDir,
}

impl Harness {
    pub async fn start() -> Harness {
        Self::start_with(quick_sim_config()).await
    }

    pub async fn start_with(sim_config: SimConfig) -> Harness {
        Self::start_subject(&PROXMOX, sim_config).await
    }

    /// A harness driving `subject` against a simulator started with `sim_config`.
    pub async fn start_subject(subject: &Subject, sim_config: SimConfig) -> Harness {
        let sim = Simulator::start(sim_config)
            .await
            .expect("simulator starts");
        let files = tempfile::tempdir().unwrap();
        let secret_file = files.path().join("token");
        std::fs::write(&secret_file, sim.token()).unwrap();
        let provider = load_subject(
            subject,
            &GrantSpec {
                origin: sim.url(),
                secret_file,
                ca_file: sim.ca_file().to_path_buf(),
            },
        )
        .await;
        let config = (subject.config)(&sim);
        Harness {
            sim,
            provider,
            config,
            files,
        }
    }

    /// The token secret (the part after `=`), which must never reach the provider's output.
    pub fn secret(&self) -> &str {
        secret_of(self.sim.token())
    }

    pub fn config_text(&self) -> String {
        self.config.to_string()
    }

    /// Runs one call; fails the test if the secret shows in the response or error.
    pub async fn call(&self, request: Request) -> Result<Response, CallError> {
        let outcome = self.provider.call(request, &CallContext::default()).await;
        assert_no_secret(&outcome, &[self.secret(), self.sim.limited_token()]);
        outcome
    }

    pub async fn create(&self, name: &str, uid: &str) -> Result<Vm, CallError> {
        self.create_tagged(name, uid, &[]).await
    }

    pub async fn create_tagged(
        &self,
        name: &str,
        uid: &str,
        tags: &[(&str, &str)],
    ) -> Result<Vm, CallError> {
        let request = CreateRequest {
            name: name.into(),
            uid: uid.into(),
            tags: tags
                .iter()
                .map(|(key, value)| Tag {
                    key: (*key).into(),
                    value: (*value).into(),
                })
                .collect(),
            user_data: "#cloud-config\n".into(),
            config: self.config_text(),
            placement: None,
        };
        match self.call(Request::Create { request }).await? {
            Response::Create(instance) => Ok(instance),
            other => panic!("create answered {other:?}"),
        }
    }

    pub async fn get(&self, provider_id: &str) -> Result<Vm, CallError> {
        let request = Request::Get {
            config: self.config_text(),
            provider_id: provider_id.into(),
        };
        match self.call(request).await? {
            Response::Get(instance) => Ok(instance),
            other => panic!("get answered {other:?}"),
        }
    }

    pub async fn delete(&self, provider_id: &str) -> Result<(), CallError> {
        let request = Request::Delete {
            config: self.config_text(),
            provider_id: provider_id.into(),
        };
        match self.call(request).await? {
            Response::Delete => Ok(()),
            other => panic!("delete answered {other:?}"),
        }
    }

    pub async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Vm>, CallError> {
        let request = Request::ListByTag {
            config: self.config_text(),
            key: key.into(),
            value: value.into(),
        };
        match self.call(request).await? {
            Response::ListByTag(listing) => Ok(listing.vms),
            other => panic!("list-by-tag answered {other:?}"),
        }
    }

    pub async fn check(&self) -> CheckResult {
        check(&self.provider, &self.config, &[self.secret()]).await
    }

    /// Creates, retrying transient failures up to `attempts` times; the last outcome.
    pub async fn create_until_ok(
        &self,
        name: &str,
        uid: &str,
        attempts: usize,
    ) -> Result<Vm, CallError> {
        let mut outcome = self.create(name, uid).await;
        for _ in 1..attempts {
            match &outcome {
                Err(error) if error.class() == ErrorClass::Transient => {
                    outcome = self.create(name, uid).await
                }
                _ => break,
            }
        }
        outcome
    }

    /// Deletes, retrying transient failures up to `attempts` times; the last outcome.
    pub async fn delete_until_ok(
        &self,
        provider_id: &str,
        attempts: usize,
    ) -> Result<(), CallError> {
        let mut outcome = self.delete(provider_id).await;
        for _ in 1..attempts {
            match &outcome {
                Err(error) if error.class() == ErrorClass::Transient => {
                    outcome = self.delete(provider_id).await
                }
                _ => break,
            }
        }
        outcome
    }

    /// The QEMU VMs named `name` (VMID and config).
    pub fn vms_named(&self, name: &str) -> Vec<pvesim::GuestView> {
        let state = self.sim.state();
        state
            .vmids()
            .into_iter()
            .filter_map(|vmid| state.guest(vmid))
            .filter(|guest| guest.config.get("name").map(String::as_str) == Some(name))
            .collect()
    }

    /// The volids on the seed storage.
    pub fn seeds(&self) -> Vec<String> {
        self.sim.state().volumes("proxy-seeds")
    }

    /// Number of API requests the simulator has logged.
    pub fn requests(&self) -> usize {
        self.sim.state().request_log().len()
    }
}

/// `check` with `config` through `provider`, asserting none of `secrets` shows in the answer.
pub async fn check(provider: &Provider, config: &Value, secrets: &[&str]) -> CheckResult {
    let outcome = provider
        .call(
            Request::Check {
                config: config.to_string(),
            },
            &CallContext::default(),
        )
        .await;
    assert_no_secret(&outcome, secrets);
    match outcome.expect("check never fails") {
        Response::Check(result) => result,
        other => panic!("check answered {other:?}"),
    }
}

/// The secret part of a `user@realm!id=secret` token.
pub fn secret_of(token: &str) -> &str {
    token.split_once('=').map_or(token, |(_, secret)| secret)
}

/// The secret must not show in any response or error text the provider produced.
pub fn assert_no_secret(outcome: &Result<Response, CallError>, secrets: &[&str]) {
    let text = match outcome {
        Ok(response) => serde_json::to_string(response).unwrap(),
        Err(error) => format!("{error} {error:?}"),
    };
    for secret in secrets {
        let secret = secret_of(secret);
        assert!(
            !text.contains(secret),
            "the token secret leaked into the provider's output: {text}"
        );
    }
}

/// Polls `get` until it reports running (the agent answers after the simulator's delay, F5/F21).
pub async fn wait_running(harness: &Harness, provider_id: &str) -> Vm {
    for _ in 0..200 {
        match harness.get(provider_id).await {
            Ok(instance) if instance.state == egress_runtime::VmState::Running => {
                return instance;
            }
            Ok(_) => {}
            Err(error) => assert_eq!(error.class(), ErrorClass::Transient, "get failed: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{provider_id} never reported running");
}

/// A port on 127.0.0.1 with nothing listening.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The VMID of a provider ID `<node>/<vmid>`.
pub fn vmid_of(provider_id: &str) -> u32 {
    provider_id
        .rsplit('/')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("provider id is <node>/<vmid>")
}

/// Writes `contents` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}
