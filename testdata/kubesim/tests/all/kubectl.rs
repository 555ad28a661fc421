//! kubesim as a kubectl user sees it: `kubectl apply` validates without `--validate=false`
//! (through the OpenAPI v3 documents and `fieldValidation=Strict`, or on the client from
//! `/openapi/v2` as protobuf, as kubectl older than 1.27 always does and newer ones for a
//! `kind: List`), `kubectl get` prints the CRD's printer columns, `kubectl describe` shows Events
//! recorded through `events.k8s.io/v1`. Needs `kubectl` on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::PostParams;
use kubesim::KubeSim;
use serde_json::json;

use crate::common::{gizmo_crd, start};

/// Runs kubectl against `sim` (its own cache directory), off the async threads; stdout, or a
/// panic with stderr when it fails.
async fn kubectl(dir: &Path, args: &[&str]) -> String {
    let (success, stdout, stderr) = kubectl_run(dir, args).await;
    assert!(
        success,
        "kubectl {} failed: {stderr}{stdout}",
        args.join(" ")
    );
    stdout
}

/// Runs kubectl against `sim`: whether it succeeded, its stdout and stderr.
async fn kubectl_run(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let kubeconfig = dir.join("kubeconfig");
    let cache = dir.join("cache");
    let args: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("kubectl")
            .args(&args)
            .arg("--cache-dir")
            .arg(&cache)
            .env("KUBECONFIG", &kubeconfig)
            .output()
    })
    .await
    .unwrap()
    .unwrap_or_else(|error| {
        panic!(
            "kubectl is needed on PATH (`just setup` installs Debian's kubernetes-client): {error}"
        )
    });
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, document: &serde_json::Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, document.to_string()).unwrap();
    path
}

/// The row of `name` in kubectl's table output, split on runs of spaces.
fn row<'a>(output: &'a str, name: &str) -> Vec<&'a str> {
    output
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{output}"))
        .split_whitespace()
        .collect()
}

fn header(output: &str) -> Vec<&str> {
    output
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect()
}

async fn setup(sim: &KubeSim) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    sim.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    let crd = write(dir.path(), "crd.json", &gizmo_crd());
    kubectl(dir.path(), &["apply", "-f", crd.to_str().unwrap()]).await;
    // Two documents in one file, as manifests are written.
    let objects = dir.path().join("objects.yaml");
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "token", "namespace": "default"},
        "type": "Opaque", "stringData": {"token": "t"}});
    let gizmo = json!({"apiVersion": "kubesim.test/v1alpha1", "kind": "Gizmo",
        "metadata": {"name": "g1", "namespace": "default"},
        "spec": {"size": 3, "owner": "ops"}});
    let yaml = |v: &serde_json::Value| serde_norway::to_string(v).unwrap();
    std::fs::write(&objects, format!("{}---\n{}", yaml(&secret), yaml(&gizmo))).unwrap();
    kubectl(dir.path(), &["apply", "-f", objects.to_str().unwrap()]).await;
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_with_validation_and_gets_the_printer_columns() {
    let (sim, _client) = start().await;
    let dir = setup(&sim).await;
    let paths: Vec<String> = sim.requests().into_iter().map(|r| r.path).collect();
    assert!(
        paths.iter().any(|p| p.starts_with("/openapi/v3/")),
        "{paths:?}"
    );

    let mut gizmo = sim
        .get("/apis/kubesim.test/v1alpha1/namespaces/default/gizmos/g1")
        .unwrap();
    gizmo["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    sim.put(gizmo).unwrap();

    let table = kubectl(dir.path(), &["get", "gizmos"]).await;
    assert_eq!(header(&table), ["NAME", "READY", "SIZE", "AGE"], "{table}");
    assert_eq!(row(&table, "g1")[..3], ["g1", "True", "3"], "{table}");
    let wide = kubectl(dir.path(), &["get", "gz", "-o", "wide"]).await;
    assert_eq!(
        header(&wide),
        ["NAME", "READY", "SIZE", "OWNER", "AGE"],
        "{wide}"
    );
    assert_eq!(row(&wide, "g1")[3], "ops", "{wide}");
    let category = kubectl(dir.path(), &["get", "kubesim", "-A"]).await;
    assert_eq!(
        row(&category, "default")[..3],
        ["default", "g1", "True"],
        "{category}"
    );
    let secrets = kubectl(dir.path(), &["get", "secrets"]).await;
    assert_eq!(row(&secrets, "token")[0], "token", "{secrets}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_describe_shows_events_recorded_through_events_k8s_io() {
    let (sim, client) = start().await;
    let dir = setup(&sim).await;
    let gizmo = sim
        .get("/apis/kubesim.test/v1alpha1/namespaces/default/gizmos/g1")
        .unwrap();
    let event: K8sEvent = serde_json::from_value(json!({
        "metadata": {"name": "g1.1", "namespace": "default"},
        "eventTime": "2025-01-01T00:00:00.000000Z",
        "reportingController": "gizmo-controller", "reportingInstance": "pod-0",
        "action": "Check", "reason": "Stopped", "type": "Warning", "note": "the gizmo stopped",
        "regarding": {"apiVersion": "kubesim.test/v1alpha1", "kind": "Gizmo", "name": "g1",
                      "namespace": "default", "uid": gizmo["metadata"]["uid"]},
    }))
    .unwrap();
    Api::<K8sEvent>::namespaced(client, "default")
        .create(&PostParams::default(), &event)
        .await
        .unwrap();

    let described = kubectl(dir.path(), &["describe", "gizmo", "g1"]).await;
    let events = described
        .split_once("Events:")
        .unwrap_or_else(|| panic!("no Events in:\n{described}"))
        .1;
    let line = events
        .lines()
        .find(|l| l.contains("Stopped"))
        .unwrap_or_else(|| panic!("no event in:\n{described}"));
    for part in ["Warning", "gizmo-controller", "the gizmo stopped"] {
        assert!(line.contains(part), "{part} in {line}");
    }
    kubectl(dir.path(), &["delete", "gizmo", "g1"]).await;
    assert!(
        sim.get("/apis/kubesim.test/v1alpha1/namespaces/default/gizmos/g1")
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_refuses_unknown_fields_on_the_server_and_in_a_list_on_the_client() {
    let (sim, _client) = start().await;
    let dir = setup(&sim).await;
    let gizmo = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "kubesim.test/v1alpha1", "kind": "Gizmo",
               "metadata": {"name": name, "namespace": "default"}, "spec": spec})
    };
    // One object: kubectl 1.27+ sends fieldValidation=Strict and kubesim refuses.
    let one = write(
        dir.path(),
        "one.json",
        &gizmo("typo", json!({"size": 1, "colour": "red"})),
    );
    let (applied, _, stderr) =
        kubectl_run(dir.path(), &["apply", "-f", one.to_str().unwrap()]).await;
    assert!(!applied, "a field the schema lacks is refused");
    assert!(stderr.contains("unknown field \"spec.colour\""), "{stderr}");
    // A List: validated on the client from /openapi/v2 (protobuf), the CRD's schema in it.
    let list =
        |items: Vec<serde_json::Value>| json!({"apiVersion": "v1", "kind": "List", "items": items});
    let bad = write(
        dir.path(),
        "bad.json",
        &list(vec![gizmo("typo", json!({"size": 1, "colour": "red"}))]),
    );
    let (applied, _, stderr) =
        kubectl_run(dir.path(), &["apply", "-f", bad.to_str().unwrap()]).await;
    assert!(!applied, "{stderr}");
    assert!(stderr.contains("unknown field \"colour\""), "{stderr}");
    let requests = sim.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.path == "/openapi/v2" && r.status == 200)
    );
    let good = write(
        dir.path(),
        "good.json",
        &list(vec![gizmo("g2", json!({"size": 2}))]),
    );
    kubectl(dir.path(), &["apply", "-f", good.to_str().unwrap()]).await;
    assert!(
        sim.get("/apis/kubesim.test/v1alpha1/namespaces/default/gizmos/g2")
            .is_ok()
    );
    assert!(
        sim.get("/apis/kubesim.test/v1alpha1/namespaces/default/gizmos/typo")
            .is_err()
    );
}
