//! Issue 35: the flight recorder and replay, as a provider author uses them: `provider call
//! --record` against pvesim, then `--replay` with pvesim stopped; a provider changed to send one
//! request differently, and recordings that are not usable, each refused naming what differs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pvesim::Simulator;
use serde_json::Value;

use crate::proxmox_support::{self, GrantSpec};

/// Runs `egress-operator provider call` with `args` after the component and operation.
fn call(component: &Path, operation: &str, args: &[&str]) -> Output {
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("recordings-cache");
    Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["provider", "call"])
        .arg(component)
        .arg(operation)
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The Proxmox component with every `/status/current` it asks for spelled `/status/CURRENT`:
/// a provider changed to send one request differently, without another build.
pub(crate) fn mutant(dir: &Path) -> PathBuf {
    let mut bytes = std::fs::read(proxmox_support::component()).unwrap();
    let (from, to) = (b"/status/current", b"/status/CURRENT");
    let mut patched = 0;
    for start in 0..bytes.len() - from.len() {
        if &bytes[start..start + from.len()] == from {
            bytes[start..start + to.len()].copy_from_slice(to);
            patched += 1;
        }
    }
    assert!(patched > 0, "the component asks for /status/current");
    let path = dir.join("proxmox.wasm");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A recorded session: create, get and delete of one VM against pvesim, each recorded.
struct Session {
    dir: tempfile::TempDir,
    config: PathBuf,
    provider_id: String,
    outputs: Vec<(String, Output)>,
    token: String,
}

impl Session {
    async fn record() -> Session {
        let sim = Simulator::start(proxmox_support::quick_sim_config())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, sim.token()).unwrap();
        let spec = GrantSpec {
            origin: sim.url(),
            secret_file: token,
            ca_file: sim.ca_file().to_path_buf(),
        };
        let grants = dir.path().join("grants.yaml");
        std::fs::write(&grants, proxmox_support::grant_json_for("proxmox", &spec)).unwrap();
        let config = dir.path().join("config.json");
        let provider_config = proxmox_support::provider_config(&sim).to_string();
        std::fs::write(&config, provider_config).unwrap();
        let component = proxmox_support::component();
        let mut outputs = Vec::new();
        let mut provider_id = String::new();
        for operation in ["create", "get", "delete"] {
            let input = match operation {
                "create" => r#"{"name":"egress-recorded","uid":"u-rec-1"}"#.to_owned(),
                _ => serde_json::json!({ "providerId": provider_id }).to_string(),
            };
            let recording = dir.path().join(format!("{operation}.json"));
            let output = tokio::task::spawn_blocking({
                let (component, config, grants) =
                    (component.clone(), config.clone(), grants.clone());
                move || {
                    call(
                        &component,
                        operation,
                        &[
                            "--config",
                            config.to_str().unwrap(),
                            "--grants",
                            grants.to_str().unwrap(),
                            "--input",
                            &input,
                            "--record",
                            recording.to_str().unwrap(),
                        ],
                    )
                }
            })
            .await
            .unwrap();
            assert!(
                output.status.success(),
                "{operation}: {}",
                text(&output.stderr)
            );
            if operation == "create" {
                let vm: Value = serde_json::from_slice(&output.stdout).unwrap();
                provider_id = vm["result"]["providerId"]
                    .as_str()
                    .expect("an id")
                    .to_owned();
            }
            outputs.push((operation.to_owned(), output));
        }
        let token = proxmox_support::secret_of(sim.token()).to_owned();
        // pvesim stops here: every replay below runs with no backend.
        drop(sim);
        Session {
            dir,
            config,
            provider_id,
            outputs,
            token,
        }
    }

    fn recording(&self, operation: &str) -> PathBuf {
        self.dir.path().join(format!("{operation}.json"))
    }

    fn input(&self, operation: &str) -> String {
        match operation {
            "create" => r#"{"name":"egress-recorded","uid":"u-rec-1"}"#.to_owned(),
            _ => serde_json::json!({ "providerId": self.provider_id }).to_string(),
        }
    }

    /// `operation` replayed from `recording` by `component`, with no grants.
    fn replay(&self, component: &Path, operation: &str, recording: &Path) -> Output {
        call(
            component,
            operation,
            &[
                "--config",
                self.config.to_str().unwrap(),
                "--input",
                &self.input(operation),
                "--replay",
                recording.to_str().unwrap(),
            ],
        )
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_get_delete_recorded_against_pvesim_replays_the_same_with_pvesim_stopped() {
    let session = Session::record().await;
    for (operation, recorded) in &session.outputs {
        let file = session.recording(operation);
        let recording = std::fs::read_to_string(&file).unwrap();
        let parsed: Value = serde_json::from_str(&recording).unwrap();
        let exchanges = parsed["exchanges"].as_array().unwrap();
        assert!(!exchanges.is_empty(), "{operation} made requests");
        assert_eq!(
            (parsed["format"].as_str(), parsed["version"].as_u64()),
            (Some("egress-recording"), Some(1))
        );
        assert!(
            !recording.contains(&session.token),
            "{operation}'s recording holds the token"
        );
        let component = proxmox_support::component();
        let replayed = session.replay(&component, operation, &file);
        assert_eq!(
            replayed.status.code(),
            Some(0),
            "{operation}: {}",
            text(&replayed.stderr)
        );
        assert_eq!(
            text(&replayed.stdout),
            text(&recorded.stdout),
            "{operation}: the same output"
        );
        assert!(
            text(&replayed.stderr)
                .contains(&format!("replay: {} exchanges matched", exchanges.len())),
            "{}",
            text(&replayed.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_provider_fails_replay_naming_the_first_request_that_differs() {
    let session = Session::record().await;
    let changed = mutant(session.dir.path());
    let file = session.recording("get");
    let recording: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let first = recording["exchanges"]
        .as_array()
        .unwrap()
        .iter()
        .position(|exchange| {
            exchange["request"]["uri"]
                .as_str()
                .unwrap()
                .ends_with("/status/current")
        })
        .expect("get reads the VM's current status")
        + 1;
    let replayed = session.replay(&changed, "get", &file);
    let stderr = text(&replayed.stderr);
    assert_eq!(replayed.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "diverged at request {first}: the provider sent GET "
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("/status/CURRENT; the recording has GET "),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recording_that_cannot_be_replayed_is_refused_naming_the_file_and_the_request() {
    let session = Session::record().await;
    let component = proxmox_support::component();
    let file = session.recording("create");
    let whole = std::fs::read_to_string(&file).unwrap();
    let edited = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut recording: Value = serde_json::from_str(&whole).unwrap();
        edit(&mut recording);
        let path = session.dir.path().join(name);
        std::fs::write(&path, recording.to_string()).unwrap();
        path
    };
    let truncated = session.dir.path().join("truncated.json");
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    let cases: Vec<(PathBuf, String)> = vec![
        (
            truncated.clone(),
            format!("recording {} is not a recording", truncated.display()),
        ),
        (
            edited("v2.json", &|r| r["version"] = 2.into()),
            "is egress-recording version 2; this build reads egress-recording version 1".into(),
        ),
        (
            edited("other.json", &|r| r["provider"]["name"] = "libvirt".into()),
            "was made by libvirt".into(),
        ),
        (
            edited("status.json", &|r| {
                r["exchanges"][0]["response"]["status"] = 7.into()
            }),
            "exchange 1 (GET ".into(),
        ),
        (
            edited("short.json", &|r| {
                r["exchanges"].as_array_mut().unwrap().pop();
            }),
            "past the end of the recording".into(),
        ),
        (
            edited("body.json", &|r| {
                for exchange in r["exchanges"].as_array_mut().unwrap() {
                    let body = &mut exchange["request"]["body"]["text"];
                    if let Some(text) = body.as_str().filter(|text| text.contains("full=1")) {
                        *body = text.replace("full=1", "full=0").into();
                    }
                }
            }),
            "the body differs; sent \"".into(),
        ),
        (
            edited("long.json", &|r| {
                let exchanges = r["exchanges"].as_array_mut().unwrap();
                exchanges.push(exchanges[0].clone());
            }),
            "the call ended without sending it".into(),
        ),
    ];
    for (path, expected) in cases {
        let replayed = session.replay(&component, "create", &path);
        let stderr = text(&replayed.stderr);
        assert_ne!(
            replayed.status.code(),
            Some(0),
            "{}: {stderr}",
            path.display()
        );
        assert!(
            stderr.contains(&expected),
            "{}: {stderr}\nexpected: {expected}",
            path.display()
        );
        assert!(
            stderr.contains(path.file_name().unwrap().to_str().unwrap()),
            "{stderr}"
        );
    }
}

/// The replay gives the guest the recorded wall clock, not the host's: a recording whose clock
/// reads and the `created-at` the provider wrote from them are both moved an hour back still
/// replays; the host's clock would make the clone request's body differ.
#[tokio::test(flavor = "multi_thread")]
async fn the_replay_gives_the_guest_the_recorded_clock() {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let session = Session::record().await;
    let file = session.recording("create");
    let mut recording: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    const HOUR_NS: u64 = 3_600_000_000_000;
    for read in recording["clock"].as_array_mut().unwrap() {
        *read = (read.as_u64().unwrap() - HOUR_NS).into();
    }
    let marker = "created-at%3A%20";
    let mut moved = 0;
    for exchange in recording["exchanges"].as_array_mut().unwrap() {
        let body = &mut exchange["request"]["body"]["text"];
        let Some(text) = body.as_str().map(str::to_owned) else {
            continue;
        };
        let Some(start) = text.find(marker).map(|at| at + marker.len()) else {
            continue;
        };
        let written = &text[start..start + "2026-12-05T11%3A31%3A05Z".len()];
        let time: Timestamp = written.replace("%3A", ":").parse().unwrap();
        let earlier = (time - SignedDuration::from_hours(1)).strftime("%Y-%m-%dT%H:%M:%SZ");
        *body = text
            .replace(written, &earlier.to_string().replace(':', "%3A"))
            .into();
        moved += 1;
    }
    assert_eq!(moved, 1, "the clone request carries created-at");
    let earlier = session.dir.path().join("earlier.json");
    std::fs::write(&earlier, recording.to_string()).unwrap();
    let replayed = session.replay(&proxmox_support::component(), "create", &earlier);
    assert_eq!(
        replayed.status.code(),
        Some(0),
        "{}",
        text(&replayed.stderr)
    );
}
