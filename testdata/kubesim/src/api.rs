//! Routing: from method, path and query to a store operation, a discovery document or a watch.

use std::time::Duration;

use serde_json::{Value, json};

use crate::Shared;
use crate::fields::Operation;
use crate::openapi;
use crate::patch::{self, PatchKind};
use crate::resource::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Selection, Store, Target, Write};
use crate::table::{self, Include};
use crate::validation::{self, Directive};

/// The largest body accepted, as the real server's 3 MiB limit.
pub(crate) const MAX_BODY: usize = 3 * 1024 * 1024;

/// One request, as the router sees it.
#[derive(Debug)]
pub(crate) struct ApiRequest<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) query: &'a str,
    pub(crate) content_type: Option<&'a str>,
    pub(crate) accept: Option<&'a str>,
    pub(crate) user_agent: Option<&'a str>,
    pub(crate) body: &'a [u8],
}

impl ApiRequest<'_> {
    fn param(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }

    fn flag(&self, key: &str) -> bool {
        self.param(key)
            .is_some_and(|v| v == "true" || v == "1" || v == "True")
    }

    /// Whether the client asked for `PartialObjectMetadata` rather than full objects.
    fn metadata_only(&self) -> bool {
        self.accept
            .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
    }

    /// `fieldManager`, else the user agent's product name, as the real server defaults it.
    fn manager(&self) -> String {
        self.param("fieldManager").unwrap_or_else(|| {
            self.user_agent
                .and_then(|ua| ua.split('/').next())
                .filter(|m| !m.is_empty())
                .unwrap_or("unknown")
                .to_string()
        })
    }
}

/// What to answer.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A JSON body with this status.
    Json(u16, Value),
    /// A plain-text body (health endpoints).
    Text(&'static str),
    /// A binary body of this content type (OpenAPI v2 as protobuf).
    Bytes(&'static str, Vec<u8>),
    /// A watch stream.
    Watch(Box<WatchRequest>),
}

impl From<ApiError> for Reply {
    fn from(e: ApiError) -> Self {
        Reply::Json(e.code, e.to_status())
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// At the current state; `initial` sends it first as `ADDED` events.
    Now { initial: bool },
    /// After this resourceVersion, replayed from history.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub(crate) struct WatchRequest {
    pub(crate) selection: Selection,
    pub(crate) start: WatchStart,
    /// Streaming list: end the initial events with a `k8s.io/initial-events-end` bookmark.
    pub(crate) initial_events_end: bool,
    pub(crate) bookmarks: bool,
    pub(crate) timeout: Option<Duration>,
    pub(crate) metadata_only: bool,
}

/// Turns an object into its `PartialObjectMetadata`.
pub(crate) fn partial(object: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// Serves one request.
pub(crate) fn handle(shared: &Shared, req: &ApiRequest<'_>) -> Reply {
    route(shared, req).unwrap_or_else(Reply::from)
}

fn route(shared: &Shared, req: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    let get = req.method == "GET";
    match segments.as_slice() {
        ["version"] if get => Ok(Reply::Json(200, shared.version_info())),
        ["healthz" | "readyz" | "livez"] if get => Ok(Reply::Text("ok")),
        ["api"] if get => Ok(Reply::Json(
            200,
            json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    { "clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string() }
                ],
            }),
        )),
        ["apis"] if get => Ok(Reply::Json(200, group_list(shared))),
        ["openapi", "v2"] if get => openapi_v2(shared, req),
        ["openapi", "v3"] if get => Ok(Reply::Json(
            200,
            openapi::v3_index(&shared.store(), &shared.kubernetes_version),
        )),
        ["openapi", "v3", rest @ ..] if get => {
            openapi::v3_group_version(&shared.store(), &rest.join("/"), &shared.kubernetes_version)
                .map(|document| Reply::Json(200, document))
                .ok_or_else(ApiError::no_such_resource)
        }
        ["api", version] if get => resource_list(shared, "", version),
        ["apis", group, version] if get => resource_list(shared, group, version),
        ["api", version, rest @ ..] if !rest.is_empty() => resource(shared, req, "", version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            resource(shared, req, group, version, rest)
        }
        _ => Err(ApiError::no_such_resource()),
    }
}

/// The content type the real server answers `/openapi/v2` as protobuf with (the media type
/// clients ask for has an `@`, which is no valid content type).
const OPENAPI_V2_PROTOBUF: &str = "application/octet-stream";

/// `/openapi/v2`: protobuf when the client names it first (client-go asks for nothing else),
/// JSON when it takes JSON, 406 otherwise.
fn openapi_v2(shared: &Shared, req: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let accept = req.accept.unwrap_or("application/json");
    let json_at = ["json", "*/*"].iter().filter_map(|m| accept.find(m)).min();
    match (accept.find("proto-openapi.spec.v2"), json_at) {
        (Some(pb), json) if json.is_none_or(|j| pb < j) => {
            return Ok(Reply::Bytes(
                OPENAPI_V2_PROTOBUF,
                openapi::v2_protobuf(&shared.store(), &shared.kubernetes_version),
            ));
        }
        (_, None) => return Err(ApiError::not_acceptable(accept)),
        _ => {}
    }
    Ok(Reply::Json(
        200,
        openapi::v2(&shared.store(), &shared.kubernetes_version),
    ))
}

fn group_list(shared: &Shared) -> Value {
    let store = shared.store();
    let groups: Vec<Value> = store
        .registry
        .groups()
        .into_iter()
        .map(|(group, versions)| {
            let listed: Vec<Value> = versions
                .iter()
                .map(|v| json!({ "groupVersion": format!("{group}/{v}"), "version": v }))
                .collect();
            json!({
                "name": group,
                "versions": listed,
                "preferredVersion": listed.first(),
            })
        })
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

fn resource_list(shared: &Shared, group: &str, version: &str) -> Result<Reply, ApiError> {
    let store = shared.store();
    let mut resources = Vec::new();
    for rt in store.registry.in_group_version(group, version) {
        let (short_names, categories) = aliases(&store, rt);
        let mut listed = json!({
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        });
        if !short_names.is_empty() {
            listed["shortNames"] = json!(short_names);
        }
        if !categories.is_empty() {
            listed["categories"] = json!(categories);
        }
        resources.push(listed);
        if rt.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", rt.plural),
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return Err(ApiError::no_such_resource());
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(Reply::Json(
        200,
        json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }),
    ))
}

/// The short names and categories discovery lists for a kind (`kubectl get pc`, `kubectl get
/// all`): a CRD's `spec.names`, or the built-in kinds' own.
fn aliases(store: &Store, rt: &ResourceType) -> (Vec<Value>, Vec<Value>) {
    if let Some(names) = store.crd(rt).and_then(|crd| crd.pointer("/spec/names")) {
        let list = |field: &str| {
            names
                .get(field)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        return (list("shortNames"), list("categories"));
    }
    let short: &[&str] = match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "namespaces") => &["ns"],
        ("", "nodes") => &["no"],
        ("", "configmaps") => &["cm"],
        ("" | "events.k8s.io", "events") => &["ev"],
        ("", "serviceaccounts") => &["sa"],
        ("", "services") => &["svc"],
        ("", "pods") => &["po"],
        ("", "persistentvolumeclaims") => &["pvc"],
        ("apps", "deployments") => &["deploy"],
        ("apps", "statefulsets") => &["sts"],
        ("apps", "daemonsets") => &["ds"],
        ("apiextensions.k8s.io", "customresourcedefinitions") => &["crd", "crds"],
        _ => &[],
    };
    let all = matches!(
        (rt.group.as_str(), rt.plural.as_str()),
        ("", "pods" | "services")
            | ("apps", "deployments" | "statefulsets" | "daemonsets")
            | ("batch", "jobs")
    );
    (
        short.iter().map(|s| json!(s)).collect(),
        if all { vec![json!("all")] } else { vec![] },
    )
}

/// A resource path, resolved against the registry.
struct Resolved<'a> {
    rt: ResourceType,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    status: bool,
}

fn resolve<'a>(
    shared: &Shared,
    group: &str,
    version: &str,
    rest: &[&'a str],
) -> Result<Resolved<'a>, ApiError> {
    let store = shared.store();
    let registry = &store.registry;
    let (rt, namespace, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if registry.get(group, plural).is_some_and(|t| t.namespaced) =>
        {
            (registry.get(group, plural), Some(*ns), tail)
        }
        [plural, tail @ ..] => (registry.get(group, plural), None, tail),
        [] => (None, None, rest),
    };
    let rt = rt
        .filter(|t| t.versions.iter().any(|v| v == version))
        .cloned()
        .ok_or_else(ApiError::no_such_resource)?;
    let (name, status) = match tail {
        [] => (None, false),
        [name] => (Some(*name), false),
        [name, "status"] if rt.status_subresource => (Some(*name), true),
        _ => return Err(ApiError::no_such_resource()),
    };
    if rt.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::no_such_resource());
    }
    Ok(Resolved {
        rt,
        namespace,
        name,
        status,
    })
}

fn resource(
    shared: &Shared,
    req: &ApiRequest<'_>,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Reply, ApiError> {
    let r = resolve(shared, group, version, rest)?;
    if req.param("dryRun").is_some() {
        return Err(ApiError::bad_request("kubesim does not support dryRun"));
    }
    let manager = req.manager();
    match (req.method, r.name) {
        ("GET", None) if req.flag("watch") => {
            watch(req, &r, version).map(|w| Reply::Watch(Box::new(w)))
        }
        ("GET", None) => list(shared, req, &r, version),
        ("GET", Some(name)) => {
            let store = shared.store();
            let object = store.get(&r.rt, version, r.namespace, name)?;
            if let Some(table) = as_table(
                &store,
                req,
                &r.rt,
                version,
                std::slice::from_ref(&object),
                None,
            )? {
                return Ok(Reply::Json(200, table));
            }
            Ok(ok(req, object))
        }
        ("POST", None) if !r.rt.namespaced || r.namespace.is_some() => {
            let body = typed_body(req, &r.rt, version, false)?;
            check_fields(shared, req, &r.rt, version, &body)?;
            let target = target(&r, version, "", &manager);
            let created = shared.mutate(|s| s.create(&target, body, Operation::Update))?;
            Ok(Reply::Json(201, created))
        }
        ("PUT", Some(name)) => {
            let body = typed_body(req, &r.rt, version, false)?;
            check_fields(shared, req, &r.rt, version, &body)?;
            let target = target(&r, version, name, &manager);
            let (object, _) = shared.mutate(|s| s.write(&target, Write::Replace(body)))?;
            Ok(ok(req, object))
        }
        ("PATCH", Some(name)) => patch(shared, req, &r, version, name),
        ("DELETE", Some(name)) => {
            let options = if req.body.is_empty() {
                Value::Null
            } else {
                patch::parse_json(req.body)?
            };
            let answer =
                shared.mutate(|s| s.delete(&r.rt, version, r.namespace, name, &options))?;
            Ok(Reply::Json(200, answer))
        }
        ("DELETE", None) => {
            let selection = selection(req, &r, version)?;
            Ok(Reply::Json(
                200,
                shared.mutate(|s| Ok(s.delete_collection(&selection)))?,
            ))
        }
        (method, _) => Err(ApiError::method_not_allowed(method)),
    }
}

fn target<'a>(
    r: &'a Resolved<'_>,
    version: &'a str,
    name: &'a str,
    manager: &'a str,
) -> Target<'a> {
    Target {
        rt: &r.rt,
        version,
        namespace: r.namespace,
        name,
        status: r.status,
        manager,
    }
}

/// 200 with the object, or its metadata when that is what the client accepts.
fn ok(req: &ApiRequest<'_>, object: Value) -> Reply {
    if req.metadata_only() {
        Reply::Json(200, partial(&object))
    } else {
        Reply::Json(200, object)
    }
}

/// A POST or PUT body (or an apply body when `apply`): a JSON object whose `apiVersion` and
/// `kind`, when given (required for apply), match the URL's.
fn typed_body(
    req: &ApiRequest<'_>,
    rt: &ResourceType,
    version: &str,
    apply: bool,
) -> Result<Value, ApiError> {
    let body = if apply {
        patch::parse_apply(req.body)?
    } else {
        patch::parse_json(req.body)?
    };
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body must be an object"));
    }
    let expected = rt.api_version(version);
    for (field, want) in [
        ("apiVersion", expected.as_str()),
        ("kind", rt.kind.as_str()),
    ] {
        match body.get(field).and_then(Value::as_str) {
            Some(have) if have != want => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({have}) does not match the expected {field} ({want})"
                )));
            }
            None if apply => {
                return Err(ApiError::bad_request(format!(
                    "error decoding YAML: Object '{}' is missing",
                    if field == "kind" {
                        "Kind"
                    } else {
                        "apiVersion"
                    }
                )));
            }
            _ => {}
        }
    }
    Ok(body)
}

fn patch(
    shared: &Shared,
    req: &ApiRequest<'_>,
    r: &Resolved<'_>,
    version: &str,
    name: &str,
) -> Result<Reply, ApiError> {
    let kind = PatchKind::from_content_type(req.content_type.unwrap_or_default())?;
    let manager = req.manager();
    let target = target(r, version, name, &manager);
    let write = if kind == PatchKind::Apply {
        if req.param("fieldManager").is_none_or(|m| m.is_empty()) {
            return Err(ApiError::invalid(
                "PatchOptions.meta.k8s.io",
                "",
                "fieldManager: Required value: is required for apply patch",
            ));
        }
        let applied = typed_body(req, &r.rt, version, true)?;
        check_fields(shared, req, &r.rt, version, &applied)?;
        Write::Apply {
            applied,
            force: req.flag("force"),
        }
    } else {
        if req.param("force").is_some() {
            return Err(ApiError::invalid(
                "PatchOptions.meta.k8s.io",
                "",
                "force: Forbidden: may not be specified for non-apply patch",
            ));
        }
        if kind != PatchKind::Json {
            check_fields(shared, req, &r.rt, version, &patch::parse_json(req.body)?)?;
        }
        Write::Patch(kind, req.body)
    };
    let (object, created) = shared.mutate(|s| s.write(&target, write))?;
    if created {
        Ok(Reply::Json(201, object))
    } else {
        Ok(ok(req, object))
    }
}

/// `fieldValidation=Strict` on a custom resource: 400 for fields its CRD version's schema does
/// not declare (a body, or a merge patch, which has the object's shape; JSON patches are not
/// checked). Other kinds, and the other directives, take any field.
fn check_fields(
    shared: &Shared,
    req: &ApiRequest<'_>,
    rt: &ResourceType,
    version: &str,
    body: &Value,
) -> Result<(), ApiError> {
    if Directive::parse(req.param("fieldValidation").as_deref())? != Directive::Strict {
        return Ok(());
    }
    let schema = shared
        .store()
        .crd_version(rt, version)
        .and_then(|v| v.pointer("/schema/openAPIV3Schema").cloned());
    let Some(schema) = schema else {
        return Ok(());
    };
    let unknown = validation::unknown_fields(&schema, body);
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(validation::strict_error(&rt.kind, version, &unknown))
    }
}

fn selection(req: &ApiRequest<'_>, r: &Resolved<'_>, version: &str) -> Result<Selection, ApiError> {
    let labels = LabelSelector::parse(&req.param("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(
        &req.param("fieldSelector").unwrap_or_default(),
        &r.rt.group,
        &r.rt.plural,
    )?;
    Ok(Selection {
        rt: r.rt.clone(),
        version: version.to_string(),
        namespace: r.namespace.map(str::to_string),
        labels,
        fields,
    })
}

/// LIST. `limit` and `continue` are accepted and ignored: every list is one complete page.
fn list(
    shared: &Shared,
    req: &ApiRequest<'_>,
    r: &Resolved<'_>,
    version: &str,
) -> Result<Reply, ApiError> {
    let selection = selection(req, r, version)?;
    let store = shared.store();
    let items = store.select(&selection);
    let rv = Some(store.resource_version().to_string());
    if let Some(table) = as_table(&store, req, &r.rt, version, &items, rv)? {
        return Ok(Reply::Json(200, table));
    }
    let mut body = store.list_body(&selection, items);
    if req.metadata_only() {
        let items: Vec<Value> = body["items"]
            .as_array()
            .map(|items| items.iter().map(partial).collect())
            .unwrap_or_default();
        body = json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList",
            "metadata": body["metadata"].clone(),
            "items": items,
        });
    }
    Ok(Reply::Json(200, body))
}

/// The `Table` of `objects` when the client asked for one (`kubectl get`): the printer
/// columns of the kind's CRD version, or `Name` and `Age` for a kind without a CRD.
fn as_table(
    store: &Store,
    req: &ApiRequest<'_>,
    rt: &ResourceType,
    version: &str,
    objects: &[Value],
    resource_version: Option<String>,
) -> Result<Option<Value>, ApiError> {
    let Some(api_version) = table::requested(req.accept) else {
        return Ok(None);
    };
    let include = Include::parse(req.param("includeObject").as_deref())?;
    let declared = store
        .crd_version(rt, version)
        .and_then(|v| v.get("additionalPrinterColumns")?.as_array().cloned());
    let columns = table::columns(declared.as_deref())?;
    Ok(Some(table::render(
        api_version,
        &columns,
        objects,
        resource_version,
        include,
        crate::time::now_unix(),
    )))
}

fn watch(req: &ApiRequest<'_>, r: &Resolved<'_>, version: &str) -> Result<WatchRequest, ApiError> {
    let selection = selection(req, r, version)?;
    let bookmarks = req.flag("allowWatchBookmarks");
    let send_initial = req.param("sendInitialEvents");
    let streaming = send_initial.as_deref() == Some("true");
    if streaming
        && (req.param("resourceVersionMatch").as_deref() != Some("NotOlderThan") || !bookmarks)
    {
        return Err(ApiError::invalid(
            "ListOptions.meta.k8s.io",
            "",
            "sendInitialEvents: Forbidden: sendInitialEvents requires setting resourceVersionMatch=NotOlderThan and allowWatchBookmarks=true",
        ));
    }
    let start = match req.param("resourceVersion").as_deref() {
        None | Some("" | "0") => WatchStart::Now {
            initial: send_initial.as_deref() != Some("false"),
        },
        Some(rv) if streaming => {
            rv.parse::<u64>().map_err(|_| bad_rv(rv))?;
            WatchStart::Now { initial: true }
        }
        Some(rv) => WatchStart::After(rv.parse().map_err(|_| bad_rv(rv))?),
    };
    let timeout = match req.param("timeoutSeconds") {
        Some(t) => Some(Duration::from_secs(t.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds: {t:?}"))
        })?)),
        None => None,
    };
    Ok(WatchRequest {
        selection,
        start,
        initial_events_end: streaming,
        bookmarks,
        timeout,
        metadata_only: req.metadata_only(),
    })
}

fn bad_rv(rv: &str) -> ApiError {
    ApiError::bad_request(format!("invalid resource version: {rv:?}"))
}
