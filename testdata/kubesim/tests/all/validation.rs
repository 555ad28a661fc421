//! `fieldValidation=Strict` on custom resources: unknown fields are refused as the real server
//! refuses them; `Warn` (the default) and `Ignore` take them.

use serde_json::{Value, json};

use crate::common::{gizmo_crd, start};

async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Value,
) -> Result<Value, (u16, String)> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(body.to_string().into_bytes())
        .unwrap();
    client
        .request::<Value>(request)
        .await
        .map_err(|error| match error {
            kube::Error::Api(status) => (status.code, status.message),
            other => panic!("{other}"),
        })
}

fn gizmo(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "kubesim.test/v1alpha1", "kind": "Gizmo",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec,
    })
}

const GIZMOS: &str = "/apis/kubesim.test/v1alpha1/namespaces/default/gizmos";

#[tokio::test]
async fn strict_writes_with_unknown_fields_are_refused_with_their_paths() {
    let (sim, client) = start().await;
    sim.put(gizmo_crd()).unwrap();
    let json = "application/json";
    let bad = gizmo("bad", json!({"size": 1, "colour": "red"}));
    let (code, message) = send(
        &client,
        "POST",
        &format!("{GIZMOS}?fieldValidation=Strict"),
        json,
        bad.clone(),
    )
    .await
    .unwrap_err();
    assert_eq!(code, 400);
    assert_eq!(
        message,
        "Gizmo in version \"v1alpha1\" cannot be handled as a Gizmo: strict decoding error: unknown field \"spec.colour\""
    );
    // Warn (the default) and Ignore take it as sent.
    send(&client, "POST", GIZMOS, json, bad.clone())
        .await
        .unwrap();
    let ignored = gizmo("ignored", json!({"size": 1, "colour": "red"}));
    send(
        &client,
        "POST",
        &format!("{GIZMOS}?fieldValidation=Ignore"),
        json,
        ignored,
    )
    .await
    .unwrap();
    let (code, _) = send(
        &client,
        "POST",
        &format!("{GIZMOS}?fieldValidation=Loose"),
        json,
        bad,
    )
    .await
    .unwrap_err();
    assert_eq!(code, 400);

    // Known fields pass; PUT, merge patches and apply are checked too.
    let good = gizmo("good", json!({"size": 1, "owner": "ops"}));
    let strict = format!("{GIZMOS}?fieldValidation=Strict");
    let created = send(&client, "POST", &strict, json, good).await.unwrap();
    let mut replaced = created.clone();
    replaced["spec"]["shade"] = json!("dark");
    let item = format!("{GIZMOS}/good?fieldValidation=Strict");
    assert_eq!(
        send(&client, "PUT", &item, json, replaced)
            .await
            .unwrap_err()
            .0,
        400
    );
    let merge = json!({"spec": {"shade": "dark"}});
    assert_eq!(
        send(
            &client,
            "PATCH",
            &item,
            "application/merge-patch+json",
            merge
        )
        .await
        .unwrap_err()
        .0,
        400
    );
    let apply = format!("{GIZMOS}/good?fieldValidation=Strict&fieldManager=me");
    let applied = gizmo("good", json!({"size": 2, "shade": "dark"}));
    assert_eq!(
        send(
            &client,
            "PATCH",
            &apply,
            "application/apply-patch+yaml",
            applied
        )
        .await
        .unwrap_err()
        .0,
        400
    );
    let fine = json!({"spec": {"size": 3}});
    send(
        &client,
        "PATCH",
        &item,
        "application/merge-patch+json",
        fine,
    )
    .await
    .unwrap();
    // Built-in kinds are not checked.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "c"}, "colour": "red"});
    send(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
        json,
        cm,
    )
    .await
    .unwrap();
}
