//! Server-side printing: `kubectl get`'s `Accept` answered with a `meta.k8s.io/v1` Table of the
//! CRD's printer columns.

use kube::Client;
use serde_json::{Value, json};

use crate::common::{KUBECTL_TABLE, get_as, gizmo_crd, start};

async fn seed(sim: &kubesim::KubeSim) {
    sim.put(gizmo_crd()).unwrap();
    for (name, size, ready) in [("big", 9, "True"), ("small", 1, "False")] {
        sim.put(json!({
            "apiVersion": "kubesim.test/v1alpha1", "kind": "Gizmo",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"size": size, "owner": "ops"},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap();
    }
}

fn column_names(table: &Value) -> Vec<&str> {
    table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

async fn table(client: &Client, path: &str) -> Value {
    let (code, body) = get_as(client, path, KUBECTL_TABLE).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["kind"], "Table", "{body}");
    assert_eq!(body["apiVersion"], "meta.k8s.io/v1");
    body
}

#[tokio::test]
async fn a_list_as_table_has_name_then_the_crd_printer_columns() {
    let (sim, client) = start().await;
    seed(&sim).await;
    let list = table(
        &client,
        "/apis/kubesim.test/v1alpha1/namespaces/default/gizmos",
    )
    .await;
    assert_eq!(
        column_names(&list),
        ["Name", "Ready", "Size", "Owner", "Age"]
    );
    assert_eq!(list["columnDefinitions"][3]["priority"], 1);
    assert_eq!(list["columnDefinitions"][4]["type"], "date");
    let rows = list["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0]["cells"].as_array().unwrap()[..4],
        [json!("big"), json!("True"), json!(9), json!("ops")]
    );
    assert_eq!(
        rows[1]["cells"].as_array().unwrap()[..4],
        [json!("small"), json!("False"), json!(1), json!("ops")]
    );
    let age = rows[0]["cells"][4].as_str().unwrap();
    assert!(
        age.ends_with('s') && age[..age.len() - 1].parse::<u32>().is_ok(),
        "{age}"
    );
    // Each row carries the object's metadata (kubectl reads namespaces and names from it).
    assert_eq!(rows[0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(rows[0]["object"]["metadata"]["name"], "big");
    assert!(list["metadata"]["resourceVersion"].is_string());
}

#[tokio::test]
async fn a_single_object_and_every_namespace_are_tables_too() {
    let (sim, client) = start().await;
    seed(&sim).await;
    let one = table(
        &client,
        "/apis/kubesim.test/v1alpha1/namespaces/default/gizmos/small",
    )
    .await;
    assert_eq!(one["rows"].as_array().unwrap().len(), 1);
    assert_eq!(one["rows"][0]["cells"][1], "False");
    let all = table(
        &client,
        "/apis/kubesim.test/v1alpha1/gizmos?includeObject=Object",
    )
    .await;
    assert_eq!(all["rows"][0]["object"]["spec"]["size"], 9);
    let none = table(
        &client,
        "/apis/kubesim.test/v1alpha1/gizmos?includeObject=None",
    )
    .await;
    assert!(none["rows"][0].get("object").is_none());
    let (code, _) = get_as(
        &client,
        "/apis/kubesim.test/v1alpha1/gizmos?includeObject=Everything",
        KUBECTL_TABLE,
    )
    .await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn a_missing_value_is_a_null_cell_and_plain_json_stays_a_list() {
    let (sim, client) = start().await;
    seed(&sim).await;
    sim.put(json!({
        "apiVersion": "kubesim.test/v1alpha1", "kind": "Gizmo",
        "metadata": {"name": "new", "namespace": "default"}, "spec": {"size": 2},
    }))
    .unwrap();
    let one = table(
        &client,
        "/apis/kubesim.test/v1alpha1/namespaces/default/gizmos/new",
    )
    .await;
    assert_eq!(one["rows"][0]["cells"][1], Value::Null);
    assert_eq!(one["rows"][0]["cells"][3], Value::Null);
    let (_, list) = get_as(
        &client,
        "/apis/kubesim.test/v1alpha1/namespaces/default/gizmos",
        "application/json",
    )
    .await;
    assert_eq!(list["kind"], "GizmoList");
}

#[tokio::test]
async fn kinds_without_printer_columns_show_name_and_age() {
    let (sim, client) = start().await;
    seed(&sim).await;
    let namespaces = table(&client, "/api/v1/namespaces").await;
    assert_eq!(column_names(&namespaces), ["Name", "Age"]);
    let mut crd = gizmo_crd();
    crd["spec"]["versions"][0]
        .as_object_mut()
        .unwrap()
        .remove("additionalPrinterColumns");
    sim.put(crd).unwrap();
    let gizmos = table(&client, "/apis/kubesim.test/v1alpha1/gizmos").await;
    assert_eq!(column_names(&gizmos), ["Name", "Age"]);
}
