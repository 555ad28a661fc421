//! The OpenAPI documents `kubectl` reads before it writes: `/openapi/v3` (an index of one
//! document per group version), `/openapi/v3/api/v1` and `/openapi/v3/apis/{group}/{version}`
//! (OpenAPI 3.0), and `/openapi/v2` (Swagger 2.0, as JSON or, in [`protobuf`], as the protobuf
//! message client-go asks for). They are built on each request
//! from what is served now: custom resources with the `openAPIV3Schema` of their CRD (converted
//! for v2 as the real server does: no `nullable`, `oneOf`/`anyOf`/`allOf`/`not`; untyped where
//! nullable, preserving unknown fields or int-or-string), built-in kinds with a schema of their
//! common fields (Namespace, ConfigMap, Secret, both Event APIs) or an open one (the others).
//!
//! Every write operation lists the `fieldValidation` query parameter, so `kubectl` 1.27+ leaves
//! validation to the server (kubesim does not validate) and reads `/openapi/v2` only to validate
//! a `kind: List`; older kubectl validates every object from it.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::resource::ResourceType;
use crate::store::Store;

mod protobuf;

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";

/// The groups of the built-in kinds (definitions named `io.k8s.api.…`).
const BUILTIN_GROUPS: [&str; 6] = [
    "",
    "apps",
    "batch",
    "coordination.k8s.io",
    "events.k8s.io",
    "apiextensions.k8s.io",
];

/// A reference to a schema of the same OpenAPI 3 document (`v2_schema` rewrites it).
fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// One kind in one served version.
struct Kind<'a> {
    rt: &'a ResourceType,
    version: &'a str,
    /// Its schema (OpenAPI v3 shape, references as `#/components/schemas/`).
    schema: Value,
}

impl Kind<'_> {
    /// The definition name the real server uses: `io.k8s.api.core.v1.Secret`,
    /// `io.egress-operator.v1alpha1.Proxy` (a CRD's group reversed).
    fn definition(&self) -> String {
        definition_name(
            &self.rt.group,
            self.version,
            &self.rt.kind,
            self.is_builtin(),
        )
    }

    fn is_builtin(&self) -> bool {
        BUILTIN_GROUPS.contains(&self.rt.group.as_str())
    }

    fn gvk(&self) -> Value {
        json!({ "group": self.rt.group, "kind": self.rt.kind, "version": self.version })
    }
}

fn definition_name(group: &str, version: &str, kind: &str, builtin: bool) -> String {
    if group == "apiextensions.k8s.io" {
        return format!("io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.{version}.{kind}");
    }
    if builtin {
        let short = match group {
            "" => "core",
            g => g.strip_suffix(".k8s.io").unwrap_or(g),
        };
        return format!("io.k8s.api.{short}.{version}.{kind}");
    }
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// The `openAPIV3Schema` of a CRD's version, if the CRD exists and has one.
fn crd_schema(store: &Store, rt: &ResourceType, version: &str) -> Option<Value> {
    store
        .crd_version(rt, version)?
        .pointer("/schema/openAPIV3Schema")
        .cloned()
}

fn string(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

fn string_map(format: Option<&str>) -> Value {
    let mut value = json!({ "type": "string" });
    if let Some(f) = format {
        value["format"] = json!(f);
    }
    json!({ "type": "object", "additionalProperties": value })
}

fn object_reference() -> Value {
    let mut properties = Map::new();
    for field in [
        "apiVersion",
        "fieldPath",
        "kind",
        "name",
        "namespace",
        "resourceVersion",
        "uid",
    ] {
        properties.insert(field.into(), json!({ "type": "string" }));
    }
    json!({ "type": "object", "properties": properties })
}

/// The fields of a built-in kind beside `apiVersion`, `kind` and `metadata`; `None`: open.
fn builtin_fields(group: &str, kind: &str) -> Option<Value> {
    let series = json!({ "type": "object", "properties": {
        "count": { "type": "integer", "format": "int32" },
        "lastObservedTime": { "type": "string", "format": "date-time" },
    }});
    let source = json!({ "type": "object", "properties": {
        "component": { "type": "string" }, "host": { "type": "string" },
    }});
    let timestamp = json!({ "type": "string", "format": "date-time" });
    let count = json!({ "type": "integer", "format": "int32" });
    Some(match (group, kind) {
        ("", "Namespace") => json!({
            "spec": { "type": "object", "properties": {
                "finalizers": { "type": "array", "items": { "type": "string" } },
            }},
            "status": { "type": "object", "properties": {
                "phase": { "type": "string" },
                "conditions": { "type": "array", "items": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                }},
            }},
        }),
        ("", "ConfigMap") => json!({
            "data": string_map(None),
            "binaryData": string_map(Some("byte")),
            "immutable": { "type": "boolean" },
        }),
        ("", "Secret") => json!({
            "data": string_map(Some("byte")),
            "stringData": string_map(None),
            "type": string("Used to facilitate programmatic handling of secret data."),
            "immutable": { "type": "boolean" },
        }),
        ("", "Event") => json!({
            "involvedObject": object_reference(), "related": object_reference(),
            "message": { "type": "string" }, "reason": { "type": "string" },
            "type": { "type": "string" }, "action": { "type": "string" },
            "source": source, "count": count,
            "firstTimestamp": timestamp.clone(), "lastTimestamp": timestamp,
            "eventTime": { "type": "string", "format": "date-time" }, "series": series,
            "reportingComponent": { "type": "string" }, "reportingInstance": { "type": "string" },
        }),
        ("events.k8s.io", "Event") => json!({
            "regarding": object_reference(), "related": object_reference(),
            "note": { "type": "string" }, "reason": { "type": "string" },
            "type": { "type": "string" }, "action": { "type": "string" },
            "deprecatedSource": source, "deprecatedCount": count,
            "deprecatedFirstTimestamp": timestamp.clone(), "deprecatedLastTimestamp": timestamp,
            "eventTime": { "type": "string", "format": "date-time" }, "series": series,
            "reportingController": { "type": "string" }, "reportingInstance": { "type": "string" },
        }),
        _ => return None,
    })
}

/// A kind's schema: the CRD's, or the built-in one, with `apiVersion`, `kind` and `metadata`
/// added and the group-version-kind extension set, as the real server publishes it.
fn kind_schema(store: &Store, rt: &ResourceType, version: &str) -> Value {
    let mut schema = match crd_schema(store, rt, version) {
        Some(schema) => schema,
        None => match builtin_fields(&rt.group, &rt.kind) {
            Some(fields) => json!({ "type": "object", "properties": fields }),
            None => json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
        },
    };
    if !schema.is_object() {
        schema = json!({ "type": "object" });
    }
    if schema.get("description").is_none() {
        schema["description"] = json!(format!("{} is a kind kubesim serves.", rt.kind));
    }
    let properties = schema
        .as_object_mut()
        .and_then(|s| {
            s.entry("properties")
                .or_insert_with(|| json!({}))
                .as_object_mut()
        })
        .map(std::mem::take)
        .unwrap_or_default();
    let mut all = Map::new();
    all.insert(
        "apiVersion".into(),
        string("APIVersion defines the versioned schema of this representation of an object."),
    );
    all.insert(
        "kind".into(),
        string("Kind is a string value representing the REST resource this object represents."),
    );
    let mut metadata = reference(OBJECT_META);
    metadata["description"] = json!("Standard object's metadata.");
    all.insert("metadata".into(), metadata);
    all.extend(properties.into_iter().filter(|(k, _)| k != "metadata"));
    schema["properties"] = Value::Object(all);
    schema["x-kubernetes-group-version-kind"] =
        json!([{ "group": rt.group, "kind": rt.kind, "version": version }]);
    schema
}

/// Every kind served now, in each served version.
fn kinds(store: &Store) -> Vec<Kind<'_>> {
    let mut out = Vec::new();
    for rt in store.registry.all() {
        for version in &rt.versions {
            out.push(Kind {
                rt,
                version,
                schema: kind_schema(store, rt, version),
            });
        }
    }
    out
}

/// `api/v1` or `apis/{group}/{version}`.
fn group_version_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The definitions every document carries: metadata, Status, Patch, DeleteOptions.
fn common_definitions() -> BTreeMap<String, Value> {
    let owner_reference = json!({
        "type": "object",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": { "type": "string" }, "kind": { "type": "string" },
            "name": { "type": "string" }, "uid": { "type": "string" },
            "controller": { "type": "boolean" }, "blockOwnerDeletion": { "type": "boolean" },
        },
    });
    let meta = json!({
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "type": "object",
        "properties": {
            "name": { "type": "string" }, "generateName": { "type": "string" },
            "namespace": { "type": "string" }, "uid": { "type": "string" },
            "resourceVersion": { "type": "string" },
            "generation": { "type": "integer", "format": "int64" },
            "creationTimestamp": { "type": "string", "format": "date-time" },
            "deletionTimestamp": { "type": "string", "format": "date-time" },
            "deletionGracePeriodSeconds": { "type": "integer", "format": "int64" },
            "labels": string_map(None), "annotations": string_map(None),
            "finalizers": { "type": "array", "items": { "type": "string" } },
            "ownerReferences": { "type": "array", "items": owner_reference },
            "managedFields": { "type": "array", "items": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": true,
            }},
            "selfLink": { "type": "string" },
        },
    });
    let list_meta = json!({
        "type": "object",
        "properties": {
            "resourceVersion": { "type": "string" }, "continue": { "type": "string" },
            "remainingItemCount": { "type": "integer", "format": "int64" },
        },
    });
    let open = |description: &str| {
        json!({ "description": description, "type": "object",
                "x-kubernetes-preserve-unknown-fields": true })
    };
    BTreeMap::from([
        (OBJECT_META.to_string(), meta),
        (LIST_META.to_string(), list_meta),
        (
            STATUS.to_string(),
            open("Status is a return value for calls that don't return other objects."),
        ),
        (
            PATCH.to_string(),
            open(
                "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.",
            ),
        ),
        (
            DELETE_OPTIONS.to_string(),
            open("DeleteOptions may be provided when deleting an API object."),
        ),
    ])
}

fn query(name: &str, kind: &str, description: &str) -> Value {
    json!({ "name": name, "in": "query", "description": description,
            "schema": { "type": kind, "uniqueItems": true } })
}

fn path_parameter(name: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true,
            "description": format!("{name} of the object"),
            "schema": { "type": "string", "uniqueItems": true } })
}

fn write_parameters(patch: bool) -> Vec<Value> {
    let mut params = vec![
        query(
            "fieldManager",
            "string",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        query(
            "fieldValidation",
            "string",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields: Ignore, Warn or Strict.",
        ),
    ];
    if patch {
        params.push(query(
            "force",
            "boolean",
            "Force is going to \"force\" Apply requests.",
        ));
    }
    params
}

fn list_parameters() -> Vec<Value> {
    [
        ("allowWatchBookmarks", "boolean"),
        ("continue", "string"),
        ("fieldSelector", "string"),
        ("labelSelector", "string"),
        ("limit", "integer"),
        ("resourceVersion", "string"),
        ("resourceVersionMatch", "string"),
        ("sendInitialEvents", "boolean"),
        ("timeoutSeconds", "integer"),
        ("watch", "boolean"),
    ]
    .iter()
    .map(|(name, kind)| query(name, kind, name))
    .collect()
}

/// One operation of one path, in OpenAPI v3 form.
fn operation(
    kind: &Kind<'_>,
    action: &str,
    verb_id: &str,
    parameters: Vec<Value>,
    body: Option<(&[&str], Value)>,
    answer: &str,
) -> Value {
    let mut op = json!({
        "operationId": format!("{verb_id}{}", kind.rt.kind),
        "description": format!("{action} {}", kind.rt.kind),
        "tags": [group_version_path(&kind.rt.group, kind.version).replace('/', "_")],
        "parameters": parameters,
        "responses": {
            "200": { "description": "OK", "content": {
                "application/json": { "schema": reference(answer) },
            }},
            "401": { "description": "Unauthorized" },
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": kind.gvk(),
    });
    if let Some((types, schema)) = body {
        let content: Map<String, Value> = types
            .iter()
            .map(|t| ((*t).to_string(), json!({ "schema": schema.clone() })))
            .collect();
        op["requestBody"] = json!({ "required": true, "content": content });
    }
    op
}

/// The paths of one kind: collection, object, status, and for namespaced kinds the
/// cross-namespace list.
fn kind_paths(kind: &Kind<'_>, paths: &mut Map<String, Value>) {
    let rt = kind.rt;
    let prefix = format!("/{}", group_version_path(&rt.group, kind.version));
    let definition = kind.definition();
    let list = format!("{definition}List");
    let this = reference(&definition);
    let scope = if rt.namespaced { "Namespaced" } else { "" };
    let base = if rt.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}", rt.plural)
    } else {
        format!("{prefix}/{}", rt.plural)
    };
    let mut patch_types = vec![
        "application/apply-patch+yaml",
        "application/json-patch+json",
        "application/merge-patch+json",
    ];
    if kind.is_builtin() {
        patch_types.push("application/strategic-merge-patch+json");
    }
    let mut collection_params = vec![];
    let mut item_params = vec![path_parameter("name")];
    if rt.namespaced {
        collection_params.push(path_parameter("namespace"));
        item_params.push(path_parameter("namespace"));
    }
    paths.insert(
        base.clone(),
        json!({
            "parameters": collection_params,
            "get": operation(kind, "list", &format!("list{scope}"), list_parameters(), None, &list),
            "post": operation(kind, "post", &format!("create{scope}"), write_parameters(false),
                Some((&["application/json", "application/yaml"], this.clone())), &definition),
            "delete": operation(kind, "deletecollection", &format!("deleteCollection{scope}"),
                list_parameters(), Some((&["application/json"], reference(DELETE_OPTIONS))), STATUS),
        }),
    );
    let item = |suffix: &str, id: &str| {
        json!({
            "parameters": item_params,
            "get": operation(kind, "get", &format!("read{scope}{id}"), vec![], None, &definition),
            "put": operation(kind, "put", &format!("replace{scope}{id}"), write_parameters(false),
                Some((&["application/json", "application/yaml"], this.clone())), &definition),
            "patch": operation(kind, "patch", &format!("patch{scope}{id}"), write_parameters(true),
                Some((&patch_types, reference(PATCH))), &definition),
            "delete": (suffix.is_empty()).then(|| operation(kind, "delete", &format!("delete{scope}"),
                vec![], Some((&["application/json"], reference(DELETE_OPTIONS))), STATUS)),
        })
    };
    let mut object = item("", "");
    if let Some(map) = object.as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    paths.insert(format!("{base}/{{name}}"), object);
    if rt.status_subresource {
        let mut status = item("/status", "Status");
        if let Some(map) = status.as_object_mut() {
            map.retain(|_, v| !v.is_null());
        }
        paths.insert(format!("{base}/{{name}}/status"), status);
    }
    if rt.namespaced {
        paths.insert(
            format!("{prefix}/{}", rt.plural),
            json!({
                "get": operation(kind, "list", "listForAllNamespaces", list_parameters(), None, &list),
            }),
        );
    }
}

fn list_schema(kind: &Kind<'_>) -> Value {
    json!({
        "description": format!("{}List is a list of {}.", kind.rt.kind, kind.rt.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": reference(LIST_META),
            "items": { "type": "array", "items": reference(&kind.definition()) },
        },
        "x-kubernetes-group-version-kind": [{
            "group": kind.rt.group, "kind": format!("{}List", kind.rt.kind), "version": kind.version,
        }],
    })
}

/// Paths and schemas of the kinds `keep` selects.
fn build(
    store: &Store,
    keep: impl Fn(&Kind<'_>) -> bool,
) -> (Map<String, Value>, BTreeMap<String, Value>) {
    let mut paths = Map::new();
    let mut schemas = common_definitions();
    for kind in kinds(store).iter().filter(|k| keep(k)) {
        kind_paths(kind, &mut paths);
        schemas.insert(format!("{}List", kind.definition()), list_schema(kind));
        schemas.insert(kind.definition(), kind.schema.clone());
    }
    (paths, schemas)
}

fn info(version: &str) -> Value {
    json!({ "title": "Kubernetes", "version": version })
}

/// A short stable digest of a document, for the index's `hash` parameters.
fn digest(document: &Value) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    document.to_string().hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

/// `/openapi/v3/{path}`: the OpenAPI 3 document of one group version (`api/v1`,
/// `apis/{group}/{version}`), or `None` when nothing is served there.
pub(crate) fn v3_group_version(store: &Store, path: &str, version: &str) -> Option<Value> {
    let (paths, schemas) = build(store, |k| {
        group_version_path(&k.rt.group, k.version) == path
    });
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": info(version),
        "paths": paths,
        "components": { "schemas": schemas },
    }))
}

/// `/openapi/v3`: where each group version's document is.
pub(crate) fn v3_index(store: &Store, version: &str) -> Value {
    let mut index = Map::new();
    let mut seen: Vec<String> = Vec::new();
    for kind in kinds(store) {
        let path = group_version_path(&kind.rt.group, kind.version);
        if seen.contains(&path) {
            continue;
        }
        if let Some(document) = v3_group_version(store, &path, version) {
            index.insert(
                path.clone(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{path}?hash={}", digest(&document)) }),
            );
        }
        seen.push(path);
    }
    json!({ "paths": index })
}

/// `/openapi/v2`: every served kind in one Swagger 2.0 document.
pub(crate) fn v2(store: &Store, version: &str) -> Value {
    let (paths, schemas) = build(store, |_| true);
    let paths: Map<String, Value> = paths
        .into_iter()
        .map(|(path, item)| (path, v2_path_item(item)))
        .collect();
    let definitions: Map<String, Value> = schemas
        .into_iter()
        .map(|(name, schema)| (name, v2_schema(schema)))
        .collect();
    json!({
        "swagger": "2.0",
        "info": info(version),
        "paths": paths,
        "definitions": definitions,
    })
}

/// A v3 path item in Swagger 2.0 form: body parameters instead of request bodies, schemas
/// directly in responses.
fn v2_path_item(item: Value) -> Value {
    let Value::Object(map) = item else {
        return item;
    };
    let converted = map
        .into_iter()
        .map(|(key, value)| {
            let value = if key == "parameters" {
                v2_parameters(value)
            } else {
                v2_operation(value)
            };
            (key, value)
        })
        .collect();
    Value::Object(converted)
}

fn v2_parameters(params: Value) -> Value {
    let Value::Array(list) = params else {
        return params;
    };
    Value::Array(
        list.into_iter()
            .map(|mut p| {
                if let Some(map) = p.as_object_mut()
                    && let Some(Value::Object(schema)) = map.remove("schema")
                {
                    map.extend(schema);
                }
                p
            })
            .collect(),
    )
}

fn v2_operation(mut op: Value) -> Value {
    let Some(map) = op.as_object_mut() else {
        return op;
    };
    let mut parameters = map
        .remove("parameters")
        .map(v2_parameters)
        .and_then(|p| p.as_array().cloned())
        .unwrap_or_default();
    if let Some(body) = map.remove("requestBody") {
        let content = body["content"].as_object().cloned().unwrap_or_default();
        map.insert("consumes".into(), json!(content.keys().collect::<Vec<_>>()));
        if let Some(schema) = content.values().next().map(|c| c["schema"].clone()) {
            parameters.push(json!({
                "name": "body", "in": "body", "required": true, "schema": v2_schema(schema),
            }));
        }
    }
    map.insert("parameters".into(), Value::Array(parameters));
    map.insert("produces".into(), json!(["application/json"]));
    map.insert("schemes".into(), json!(["https"]));
    if let Some(Value::Object(responses)) = map.get_mut("responses") {
        for response in responses.values_mut() {
            if let Some(schema) = response
                .pointer("/content/application~1json/schema")
                .cloned()
            {
                response["schema"] = v2_schema(schema);
            }
            if let Some(r) = response.as_object_mut() {
                r.remove("content");
            }
        }
    }
    op
}

/// [`v2`] as protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`).
pub(crate) fn v2_protobuf(store: &Store, version: &str) -> Vec<u8> {
    protobuf::encode(&v2(store, version))
}

/// A schema as the real server publishes it in v2 (`ToStructuralOpenAPIV2`).
pub(crate) fn v2_schema(schema: Value) -> Value {
    match schema {
        Value::Object(mut map) => {
            for dropped in ["oneOf", "anyOf", "allOf", "not"] {
                map.remove(dropped);
            }
            if let Some(Value::String(r)) = map.get("$ref") {
                let name = r.trim_start_matches("#/components/schemas/").to_string();
                map.insert("$ref".into(), json!(format!("#/definitions/{name}")));
            }
            let nullable = map.remove("nullable") == Some(Value::Bool(true));
            let preserve = map.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
            let int_or_string = map.get("x-kubernetes-int-or-string") == Some(&json!(true));
            if nullable || preserve {
                map.remove("items");
                map.remove("properties");
            }
            if nullable || int_or_string {
                map.remove("type");
            }
            let converted = map
                .into_iter()
                .map(|(key, value)| {
                    let value = match key.as_str() {
                        "properties" | "patternProperties" | "definitions" => match value {
                            Value::Object(props) => Value::Object(
                                props.into_iter().map(|(k, v)| (k, v2_schema(v))).collect(),
                            ),
                            other => other,
                        },
                        "items" | "additionalProperties" => v2_schema(value),
                        _ => value,
                    };
                    (key, value)
                })
                .collect();
            Value::Object(converted)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_names_follow_the_real_server() {
        assert_eq!(
            definition_name("", "v1", "Secret", true),
            "io.k8s.api.core.v1.Secret"
        );
        assert_eq!(
            definition_name("events.k8s.io", "v1", "Event", true),
            "io.k8s.api.events.v1.Event"
        );
        assert_eq!(
            definition_name(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                true
            ),
            "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"
        );
        assert_eq!(
            definition_name("egress-operator.io", "v1alpha1", "Proxy", false),
            "io.egress-operator.v1alpha1.Proxy"
        );
    }

    #[test]
    fn v2_schemas_lose_what_swagger_2_cannot_say() {
        let v3 = json!({
            "type": "object",
            "properties": {
                "a": { "type": "string", "nullable": true },
                "b": { "type": "object", "x-kubernetes-preserve-unknown-fields": true,
                       "properties": { "c": { "type": "string" } } },
                "d": { "x-kubernetes-int-or-string": true, "type": "string",
                       "anyOf": [{ "type": "integer" }, { "type": "string" }] },
                "e": { "type": "array", "items": { "type": "object", "nullable": true,
                       "properties": { "f": { "type": "string" } } } },
                "m": { "$ref": "#/components/schemas/x.Y" },
            },
        });
        let v2 = v2_schema(v3);
        assert_eq!(v2["properties"]["a"], json!({}));
        assert_eq!(
            v2["properties"]["b"],
            json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
        );
        assert_eq!(
            v2["properties"]["d"],
            json!({ "x-kubernetes-int-or-string": true })
        );
        assert_eq!(
            v2["properties"]["e"],
            json!({ "type": "array", "items": {} })
        );
        assert_eq!(v2["properties"]["m"]["$ref"], "#/definitions/x.Y");
    }
}
