//! The `pvesim` binary: prints `key: value` lines, writes the CA and token into the state dir,
//! answers like a 9.2 host, and applies `--fault` and `--node` flags.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

/// Kills the child when the test ends, pass or fail.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn binary_prints_url_ca_and_token_and_serves_version() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_pvesim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--task-latency-ms",
            "10",
            "--agent-delay-ms",
            "0",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .args([
            "--fault",
            "GET /cluster/nextid always status=503:maintenance",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    let mut lines = BufReader::new(running.0.stdout.take().unwrap()).lines();
    let mut printed = std::collections::BTreeMap::new();
    for _ in 0..3 {
        let line = lines.next().unwrap().unwrap();
        let (key, value) = line.split_once(": ").unwrap();
        printed.insert(key.to_string(), value.to_string());
    }
    let url = &printed["url"];
    let ca = std::fs::read(&printed["ca-file"]).unwrap();
    assert_eq!(
        printed["ca-file"],
        dir.path().join("ca.pem").to_string_lossy()
    );
    let token = std::fs::read_to_string(dir.path().join("token")).unwrap();
    assert_eq!(token, printed["token"]);
    assert!(token.starts_with("egress@pve!operator="));

    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .http1_only()
        .build()
        .unwrap();
    let authorized = client
        .get(format!("{url}/api2/json/version"))
        .header("Authorization", format!("PVEAPIToken={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(authorized.status(), 200);
    let body: serde_json::Value =
        serde_json::from_slice(&authorized.bytes().await.unwrap()).unwrap();
    assert_eq!(body["data"]["version"], "9.2.20");

    let anonymous = client
        .get(format!("{url}/api2/json/version"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(anonymous.bytes().await.unwrap().is_empty());

    let faulted = client
        .get(format!("{url}/api2/json/cluster/nextid"))
        .header("Authorization", format!("PVEAPIToken={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(faulted.status(), 503, "the --fault flag is applied");
}

/// Starts the binary with `nodes` flags and reads its four `key: value` lines.
fn start_with_nodes(
    dir: &std::path::Path,
    nodes: &[&str],
) -> (Running, std::collections::BTreeMap<String, String>) {
    let child = Command::new(env!("CARGO_BIN_EXE_pvesim"))
        .args(["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir)
        .args(nodes)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    let mut lines = BufReader::new(running.0.stdout.take().unwrap()).lines();
    let mut printed = std::collections::BTreeMap::new();
    for _ in 0..4 {
        let line = lines.next().unwrap().unwrap();
        let (key, value) = line.split_once(": ").unwrap();
        printed.insert(key.to_string(), value.to_string());
    }
    (running, printed)
}

#[tokio::test]
async fn binary_takes_several_nodes_repeated_or_comma_separated() {
    for flags in [
        &["--node", "pv1-1", "--node", "pv1-2"][..],
        &["--nodes", "pv1-1,pv1-2"][..],
        &["--node", "pv1-1"][..],
        &[][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (_running, printed) = start_with_nodes(dir.path(), flags);
        let expected = if flags.len() > 2 || flags.contains(&"--nodes") {
            "pv1-1,pv1-2"
        } else {
            "pv1-1"
        };
        assert_eq!(printed["nodes"], expected, "{flags:?}");
        let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .http1_only()
            .build()
            .unwrap();
        let answer = client
            .get(format!("{}/api2/json/nodes", printed["url"]))
            .header("Authorization", format!("PVEAPIToken={}", printed["token"]))
            .send()
            .await
            .unwrap();
        let nodes: serde_json::Value =
            serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
        let names: Vec<&str> = nodes["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|node| node["node"].as_str().unwrap())
            .collect();
        assert_eq!(names.join(","), expected, "{flags:?}");
    }
}
