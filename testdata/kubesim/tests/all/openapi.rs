//! The OpenAPI documents kubectl reads before it writes: v3 by group version (with
//! `fieldValidation` on writes, so kubectl leaves validation to the server) and v2 as JSON and
//! as protobuf (what client-go asks for).

use serde_json::Value;

use crate::common::{get_as, gizmo_crd, start};

/// The operation `verb` of the path that has one for this group, version and kind.
fn operation<'a>(document: &'a Value, verb: &str, gvk: (&str, &str, &str)) -> &'a Value {
    document["paths"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|item| item.get(verb))
        .find(|op| {
            let g = &op["x-kubernetes-group-version-kind"];
            (
                g["group"].as_str(),
                g["version"].as_str(),
                g["kind"].as_str(),
            ) == (Some(gvk.0), Some(gvk.1), Some(gvk.2))
        })
        .unwrap_or_else(|| panic!("no {verb} for {gvk:?}"))
}

fn parameter_names(op: &Value) -> Vec<&str> {
    op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn openapi_v3_indexes_a_document_per_group_version_from_the_crd_schemas() {
    let (sim, client) = start().await;
    let (_, index) = get_as(&client, "/openapi/v3", "application/json").await;
    assert!(index["paths"]["api/v1"]["serverRelativeURL"].is_string());
    assert!(index["paths"].get("apis/kubesim.test/v1alpha1").is_none());
    let (code, _) = get_as(
        &client,
        "/openapi/v3/apis/kubesim.test/v1alpha1",
        "application/json",
    )
    .await;
    assert_eq!(code, 404, "no document before the CRD");

    sim.put(gizmo_crd()).unwrap();
    let (_, index) = get_as(&client, "/openapi/v3", "application/json").await;
    let url = index["paths"]["apis/kubesim.test/v1alpha1"]["serverRelativeURL"]
        .as_str()
        .unwrap();
    assert!(
        url.starts_with("/openapi/v3/apis/kubesim.test/v1alpha1?hash="),
        "{url}"
    );
    let (code, document) = get_as(&client, url, "application/json").await;
    assert_eq!(code, 200);
    assert_eq!(document["openapi"], "3.0.0");
    let gvk = ("kubesim.test", "v1alpha1", "Gizmo");
    for verb in ["post", "put", "patch"] {
        assert!(
            parameter_names(operation(&document, verb, gvk)).contains(&"fieldValidation"),
            "{verb}"
        );
    }
    let item =
        &document["paths"]["/apis/kubesim.test/v1alpha1/namespaces/{namespace}/gizmos/{name}"];
    assert_eq!(item["get"]["x-kubernetes-action"], "get");
    assert_eq!(item["delete"]["x-kubernetes-action"], "delete");
    let schema = &document["components"]["schemas"]["test.kubesim.v1alpha1.Gizmo"];
    assert_eq!(
        schema["properties"]["spec"]["properties"]["size"]["type"],
        "integer"
    );
    assert_eq!(schema["properties"]["spec"]["required"][0], "size");
    assert_eq!(
        schema["properties"]["metadata"]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert_eq!(
        schema["x-kubernetes-group-version-kind"][0]["kind"],
        "Gizmo"
    );
    assert!(
        document["paths"]
            .get("/apis/kubesim.test/v1alpha1/namespaces/{namespace}/gizmos/{name}/status")
            .is_some()
    );

    // Core kinds kubectl applies have their fields; the hash changes with the document.
    let (_, core) = get_as(&client, "/openapi/v3/api/v1", "application/json").await;
    let secret = &core["components"]["schemas"]["io.k8s.api.core.v1.Secret"];
    assert_eq!(secret["properties"]["stringData"]["type"], "object");
    assert!(
        parameter_names(operation(&core, "patch", ("", "v1", "ConfigMap")))
            .contains(&"fieldValidation")
    );
    let mut changed = gizmo_crd();
    changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "other".into();
    sim.put(changed).unwrap();
    let (_, again) = get_as(&client, "/openapi/v3", "application/json").await;
    assert_ne!(
        again["paths"]["apis/kubesim.test/v1alpha1"]["serverRelativeURL"],
        url
    );
}

#[tokio::test]
async fn openapi_v2_is_served_as_json_and_as_protobuf() {
    let (sim, client) = start().await;
    sim.put(gizmo_crd()).unwrap();
    let (code, document) = get_as(&client, "/openapi/v2", "application/json").await;
    assert_eq!(code, 200);
    assert_eq!(document["swagger"], "2.0");
    let gizmo = &document["definitions"]["test.kubesim.v1alpha1.Gizmo"];
    assert_eq!(
        gizmo["x-kubernetes-group-version-kind"][0]["group"],
        "kubesim.test"
    );
    assert_eq!(
        gizmo["properties"]["spec"]["properties"]["size"]["type"],
        "integer"
    );
    // Swagger 2 has no `nullable`: a nullable field is left untyped, as the real server does.
    assert_eq!(
        gizmo["properties"]["spec"]["properties"]["owner"],
        serde_json::json!({})
    );
    assert_eq!(
        gizmo["properties"]["metadata"]["$ref"],
        "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert!(document["definitions"]["io.k8s.api.core.v1.ConfigMap"].is_object());
    let patch = &document["paths"]["/apis/kubesim.test/v1alpha1/namespaces/{namespace}/gizmos/{name}"]
        ["patch"];
    assert!(parameter_names(patch).contains(&"fieldValidation"));
    assert!(
        patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["in"] == "body")
    );

    // What client-go sends: protobuf only. The gnostic `Document` starts with `swagger`.
    let request = http::Request::get("/openapi/v2")
        .header(
            "accept",
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        )
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    let response = client.send(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/octet-stream"
    );
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(body[..5], [0x0a, 3, b'2', b'.', b'0']);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("test.kubesim.v1alpha1.Gizmo"));
    assert!(text.contains("x-kubernetes-group-version-kind"));

    let (code, status) = get_as(&client, "/openapi/v2", "application/xml").await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (406, Some("NotAcceptable"))
    );
}
