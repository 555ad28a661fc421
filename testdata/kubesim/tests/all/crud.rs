//! Create, read, replace, patch and delete of ConfigMaps, with the server's conflicts.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::common::{api_code, configmap, start};

#[tokio::test]
async fn configmap_round_trip_sets_server_metadata() {
    let (sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let created = api
        .create(&PostParams::default(), &configmap("a", &[], &[("k", "1")]))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.uid.as_deref().map(str::len), Some(36), "a UUID");
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();
    assert_eq!(rv1, sim.resource_version());
    assert!(!meta.managed_fields.as_ref().unwrap().is_empty());

    let mut changed = api.get("a").await.unwrap();
    changed.data = Some([("k".to_string(), "2".to_string())].into());
    let replaced = api
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = replaced.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1, "every write takes a new resourceVersion");
    assert_eq!(
        replaced.metadata.generation,
        Some(2),
        "data is not metadata"
    );
    assert_eq!(replaced.uid(), created.uid());

    let labelled = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } })),
        )
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(2),
        "metadata changes keep generation"
    );
    assert_eq!(labelled.labels()["x"], "y");

    let deleted = api.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(
        deleted.is_right(),
        "no finalizers: gone at once, answered with a Status"
    );
    assert_eq!(api_code(api.get("a").await), (404, "NotFound".into()));
}

#[tokio::test]
async fn conflicts_are_409() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm = configmap("a", &[], &[("k", "1")]);
    let first = api.create(&PostParams::default(), &cm).await.unwrap();
    assert_eq!(
        api_code(api.create(&PostParams::default(), &cm).await),
        (409, "AlreadyExists".into())
    );
    let mut newer = first.clone();
    newer.data = Some([("k".to_string(), "2".to_string())].into());
    api.replace("a", &PostParams::default(), &newer)
        .await
        .unwrap();
    // `first` still carries the old resourceVersion.
    assert_eq!(
        api_code(api.replace("a", &PostParams::default(), &first).await),
        (409, "Conflict".into())
    );
    let stale = Patch::Merge(json!({
        "metadata": { "resourceVersion": first.resource_version() },
        "data": { "k": "3" },
    }));
    assert_eq!(
        api_code(api.patch("a", &PatchParams::default(), &stale).await),
        (409, "Conflict".into())
    );
    assert_eq!(api.get("a").await.unwrap().data.unwrap()["k"], "2");
    let stale_delete = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: first.resource_version(),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_code(api.delete("a", &stale_delete).await),
        (409, "Conflict".into())
    );
}

#[tokio::test]
async fn generate_name_and_namespaces_are_honoured() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = configmap("", &[], &[]);
    cm.metadata = ObjectMeta {
        generate_name: Some("gen-".into()),
        ..ObjectMeta::default()
    };
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    let name = created.name_any();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    let missing: Api<ConfigMap> = Api::namespaced(client, "nowhere");
    assert_eq!(
        api_code(
            missing
                .create(&PostParams::default(), &configmap("a", &[], &[]))
                .await
        ),
        (404, "NotFound".into())
    );
}

#[tokio::test]
async fn json_and_strategic_patches_apply() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &configmap("a", &[], &[("k", "1")]))
        .await
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/data/k", "value": "1" },
        { "op": "replace", "path": "/data/k", "value": "2" },
    ]))
    .unwrap();
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Json::<()>(ops.clone()),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["k"], "2");
    // The same test now fails: 422, nothing changes.
    assert_eq!(
        api_code(
            api.patch("a", &PatchParams::default(), &Patch::Json::<()>(ops))
                .await
        ),
        (422, "Invalid".into())
    );
    let strategic = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({ "data": { "other": "x" } })),
        )
        .await
        .unwrap();
    let data = strategic.data.unwrap();
    assert_eq!((data["k"].as_str(), data["other"].as_str()), ("2", "x"));
}

#[tokio::test]
async fn server_side_apply_creates_merges_and_detects_conflicts() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let apply = |data: serde_json::Value| {
        Patch::Apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "a" },
            "data": data,
        }))
    };
    let created = api
        .patch(
            "a",
            &PatchParams::apply("alice"),
            &apply(json!({ "x": "1" })),
        )
        .await
        .unwrap();
    assert_eq!(created.data.as_ref().unwrap()["x"], "1", "apply creates");
    api.patch("a", &PatchParams::apply("bob"), &apply(json!({ "y": "2" })))
        .await
        .unwrap();
    let both = api.get("a").await.unwrap();
    let managers: Vec<String> = both
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["alice", "bob"]);
    assert_eq!(both.data.unwrap().len(), 2, "applies merge");

    // alice stops applying a field she owned alone: it goes.
    api.patch(
        "a",
        &PatchParams::apply("alice"),
        &apply(json!({ "x": "1", "z": "3" })),
    )
    .await
    .unwrap();
    let dropped = api
        .patch(
            "a",
            &PatchParams::apply("alice"),
            &apply(json!({ "x": "1" })),
        )
        .await
        .unwrap();
    assert!(!dropped.data.unwrap().contains_key("z"));

    // bob taking alice's field with another value conflicts, unless forced.
    let take = apply(json!({ "x": "9", "y": "2" }));
    assert_eq!(
        api_code(api.patch("a", &PatchParams::apply("bob"), &take).await),
        (409, "Conflict".into())
    );
    let forced = api
        .patch("a", &PatchParams::apply("bob").force(), &take)
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["x"], "9");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["bob"], "alice lost her only field");

    // Apply without a field manager is invalid (sent raw: kube refuses to build it).
    let request = http::Request::patch("/api/v1/namespaces/default/configmaps/a")
        .header("content-type", "application/apply-patch+yaml")
        .body(br#"{"apiVersion":"v1","kind":"ConfigMap"}"#.to_vec())
        .unwrap();
    assert_eq!(
        api_code(client.request::<ConfigMap>(request).await),
        (422, "Invalid".into())
    );
}

#[tokio::test]
async fn wrong_verbs_and_unknown_paths_are_refused() {
    let (_sim, client) = start().await;
    let post_object = http::Request::post("/api/v1/namespaces/default/configmaps/a")
        .body(b"{}".to_vec())
        .unwrap();
    assert_eq!(
        api_code(client.request::<ConfigMap>(post_object).await),
        (405, "MethodNotAllowed".into())
    );
    let unknown = http::Request::get("/apis/nothing.example/v1/things")
        .body(vec![])
        .unwrap();
    assert_eq!(
        api_code(client.request::<serde_json::Value>(unknown).await),
        (404, "NotFound".into())
    );
    let garbage = http::Request::post("/api/v1/namespaces/default/configmaps")
        .body(b"not json".to_vec())
        .unwrap();
    assert_eq!(
        api_code(client.request::<ConfigMap>(garbage).await),
        (400, "BadRequest".into())
    );
}

#[tokio::test]
async fn direct_access_reads_and_seeds_what_clients_see() {
    let (sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    sim.put(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "seeded", "namespace": "default", "labels": { "a": "b" } },
        "data": { "k": "1" },
    }))
    .unwrap();
    assert_eq!(api.get("seeded").await.unwrap().data.unwrap()["k"], "1");
    let replaced = sim
        .put(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "seeded", "namespace": "default" },
            "data": { "k": "2" },
        }))
        .unwrap();
    assert_eq!(replaced["metadata"]["generation"], 2);
    let listed = sim
        .get("/api/v1/namespaces/default/configmaps?labelSelector=a%3Db")
        .unwrap();
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        0,
        "the replace dropped the label"
    );
    let missing = sim
        .get("/api/v1/namespaces/default/configmaps/none")
        .unwrap_err();
    assert!(matches!(missing, kubesim::Error::Api { code: 404, .. }));

    // A kind served without a CRD, seeded with status, read through kube's dynamic API.
    sim.register(
        kubesim::ResourceType::namespaced("example.test", "v1", "Thing", "things").with_status(),
    );
    sim.put(json!({
        "apiVersion": "example.test/v1", "kind": "Thing",
        "metadata": { "name": "t", "namespace": "default" },
        "spec": { "n": 1 },
        "status": { "phase": "Ready" },
    }))
    .unwrap();
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("example.test", "v1", "Thing"),
        "things",
    );
    let things: Api<kube::api::DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let thing = things.get("t").await.unwrap();
    assert_eq!(thing.data["status"]["phase"], "Ready");
    assert_eq!(thing.data["spec"]["n"], 1);
}

#[tokio::test]
async fn raw_requests_get_the_servers_answers() {
    let (_sim, client) = start().await;
    let path = "/api/v1/namespaces/default/configmaps";
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  k: v\n";
    let apply = http::Request::patch(format!("{path}/y?fieldManager=yaml-writer"))
        .header("content-type", "application/apply-patch+yaml")
        .body(yaml.as_bytes().to_vec())
        .unwrap();
    let created: ConfigMap = client.request(apply).await.expect("YAML apply creates");
    assert_eq!(created.data.unwrap()["k"], "v");

    let cases: [(http::Request<Vec<u8>>, u16); 5] = [
        (
            http::Request::patch(format!("{path}/y"))
                .header("content-type", "text/plain")
                .body(b"{}".to_vec())
                .unwrap(),
            415,
        ),
        (
            http::Request::post(path)
                .body(vec![b' '; 4 * 1024 * 1024])
                .unwrap(),
            413,
        ),
        (
            http::Request::post(format!("{path}?dryRun=All"))
                .body(br#"{"metadata":{"name":"d"}}"#.to_vec())
                .unwrap(),
            400,
        ),
        (
            http::Request::get(format!("{path}?watch=true&resourceVersion=abc"))
                .body(vec![])
                .unwrap(),
            400,
        ),
        (
            http::Request::patch(format!("{path}/y?force=true"))
                .header("content-type", "application/merge-patch+json")
                .body(b"{}".to_vec())
                .unwrap(),
            422,
        ),
    ];
    for (request, code) in cases {
        let what = format!("{} {}", request.method(), request.uri());
        let got = api_code(client.request::<serde_json::Value>(request).await).0;
        assert_eq!(got, code, "{what}");
    }
}
