//! The object store: every object as JSON, one global resourceVersion counter, the change
//! history watches replay, and the server's rules for writes (metadata, generation, optimistic
//! concurrency, the status subresource, finalizers, garbage collection, namespaces, CRDs).

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Map, Value, json};

use crate::events;
use crate::fields::{ManagedFields, Operation, Scope, Writer};
use crate::patch::{self, PatchKind};
use crate::resource::{Registry, ResourceType};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{self, ApiError, Subject};
use crate::time;

/// Namespaces every cluster starts with.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Where an object lives: (group, plural, namespace or `""`, name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    group: String,
    plural: String,
    namespace: String,
    name: String,
}

impl Key {
    /// Where an object of `rt` is stored (a view's objects under the kind it shows).
    fn new(rt: &ResourceType, namespace: Option<&str>, name: &str) -> Self {
        let (group, plural) = events::storage_of(rt);
        Key {
            group: group.to_string(),
            plural: plural.to_string(),
            namespace: if rt.namespaced {
                namespace.unwrap_or_default().to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    fn namespace_object(namespace: &str) -> Self {
        Key {
            group: String::new(),
            plural: "namespaces".to_string(),
            namespace: String::new(),
            name: namespace.to_string(),
        }
    }

    fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }

    fn subject(&self) -> Subject<'_> {
        Subject {
            group: &self.group,
            plural: &self.plural,
            name: &self.name,
        }
    }
}

/// One stored object.
#[derive(Debug, Clone)]
struct Stored {
    object: Value,
    managed: ManagedFields,
    /// Deleted with `propagationPolicy: Orphan`: its dependents stay when it goes.
    orphan: bool,
}

/// What a change did, as watch event types name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One entry of the history, at one resourceVersion.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: ChangeKind,
    group: String,
    plural: String,
    namespace: String,
    object: Value,
    /// The object before a modification, to tell when it enters or leaves a selector.
    previous: Option<Value>,
}

/// What a watch or list selects.
#[derive(Debug, Clone)]
pub(crate) struct Selection {
    pub(crate) rt: ResourceType,
    pub(crate) version: String,
    /// `None` across all namespaces (or for cluster-scoped kinds).
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Selection {
    /// Whether objects stored under (group, plural) in `namespace` are this selection's kind.
    fn covers(&self, group: &str, plural: &str, namespace: &str) -> bool {
        (group, plural) == events::storage_of(&self.rt)
            && self.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }

    /// Whether a stored object matches; fields are selected as the selection's kind shows them.
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches(object)
            && (self.fields.is_empty() || self.fields.matches(&events::to_view(&self.rt, object)))
    }

    /// The object as the request's version shows it.
    pub(crate) fn present(&self, object: &Value) -> Value {
        present(&self.rt, &self.version, object)
    }
}

/// The object as `rt` shows it, with `apiVersion` set to the version it is read through.
fn present(rt: &ResourceType, version: &str, object: &Value) -> Value {
    let mut out = events::to_view(rt, object);
    out["apiVersion"] = json!(rt.api_version(version));
    out
}

/// Which object a write addresses, and as whom.
#[derive(Debug, Clone)]
pub(crate) struct Target<'a> {
    pub(crate) rt: &'a ResourceType,
    pub(crate) version: &'a str,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) name: &'a str,
    /// Whether the request went to the `status` subresource.
    pub(crate) status: bool,
    pub(crate) manager: &'a str,
}

impl Target<'_> {
    fn key(&self) -> Key {
        Key::new(self.rt, self.namespace, self.name)
    }

    fn scope(&self) -> Scope {
        if self.status {
            Scope::Status
        } else {
            Scope::Main {
                status_apart: self.rt.status_subresource,
            }
        }
    }
}

/// A write of an existing object (or, for apply, maybe a new one).
#[derive(Debug)]
pub(crate) enum Write<'a> {
    /// PUT with this body.
    Replace(Value),
    /// PATCH of this kind with this body (not apply).
    Patch(PatchKind, &'a [u8]),
    /// Server-side apply of this object.
    Apply { applied: Value, force: bool },
}

/// How a DELETE ended.
#[derive(Debug)]
pub(crate) enum Deletion {
    /// Finalizers (or a namespace's contents) hold it: it now has a `deletionTimestamp`.
    Pending(Value),
    /// It is gone; this was its last state.
    Gone(Value),
}

/// The whole state of the simulated cluster.
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) registry: Registry,
    objects: BTreeMap<Key, Stored>,
    rv: u64,
    history: VecDeque<Change>,
    /// The highest resourceVersion no longer in `history`: a watch must start at or after it.
    compacted: u64,
    history_limit: usize,
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

fn finalizers(object: &Value) -> Vec<&str> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn is_deleting(object: &Value) -> bool {
    object.pointer("/metadata/deletionTimestamp").is_some()
}

/// The `metadata` map of an object, created if missing; `None` if the object is no map.
fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = object.as_object_mut()?;
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    meta.as_object_mut()
}

/// Five characters from the alphabet the real server uses for `generateName`.
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// The object without what does not count for `generation`: `metadata`, and `status` when the
/// kind has the status subresource.
fn generation_part(rt: &ResourceType, object: &Value) -> Value {
    let mut out = object.clone();
    if let Some(map) = out.as_object_mut() {
        map.remove("metadata");
        if rt.status_subresource {
            map.remove("status");
        }
    }
    out
}

/// The object without the fields every write changes, to detect no-op writes.
fn content(object: &Value) -> Value {
    let mut out = object.clone();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    out
}

/// Copies `field` of `from` to `to`, or removes it from `to` when `from` lacks it.
fn carry(to: &mut Map<String, Value>, from: Option<&Map<String, Value>>, field: &str) {
    match from.and_then(|f| f.get(field)) {
        Some(v) => {
            to.insert(field.to_string(), v.clone());
        }
        None => {
            to.remove(field);
        }
    }
}

impl Store {
    /// A store with the built-in kinds and the four initial namespaces.
    pub(crate) fn new(history_limit: usize) -> Self {
        let mut store = Store {
            registry: Registry::builtin(),
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            compacted: 0,
            history_limit: history_limit.max(1),
        };
        for ns in INITIAL_NAMESPACES {
            let object =
                json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } });
            if let Some(rt) = store.registry.get("", "namespaces").cloned() {
                let target = Target {
                    rt: &rt,
                    version: "v1",
                    namespace: None,
                    name: ns,
                    status: false,
                    manager: "kube-apiserver",
                };
                // The initial namespaces cannot clash with anything: the store is empty.
                let _created = store.create(&target, object, Operation::Update);
            }
        }
        store
    }

    /// The current resourceVersion.
    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, kind: ChangeKind, key: &Key, object: &Value, previous: Option<Value>) {
        let rv = meta_str(object, "resourceVersion")
            .and_then(|s| s.parse().ok())
            .unwrap_or(self.rv);
        self.history.push_back(Change {
            rv,
            kind,
            group: key.group.clone(),
            plural: key.plural.clone(),
            namespace: key.namespace.clone(),
            object: object.clone(),
            previous,
        });
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.rv;
            }
        }
    }

    /// Drops all history: watches from any earlier resourceVersion get 410 Gone.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// GET of one object.
    pub(crate) fn get(
        &self,
        rt: &ResourceType,
        version: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let key = Key::new(rt, namespace, name);
        self.objects
            .get(&key)
            .map(|s| present(rt, version, &s.object))
            .ok_or_else(|| ApiError::not_found(key.subject()))
    }

    /// The CustomResourceDefinition that declares `rt`, if one does.
    pub(crate) fn crd(&self, rt: &ResourceType) -> Option<&Value> {
        let key = Key {
            group: "apiextensions.k8s.io".into(),
            plural: "customresourcedefinitions".into(),
            namespace: String::new(),
            name: format!("{}.{}", rt.plural, rt.group),
        };
        self.objects.get(&key).map(|s| &s.object)
    }

    /// The entry of `version` in the `spec.versions` of the CRD that declares `rt`.
    pub(crate) fn crd_version(&self, rt: &ResourceType, version: &str) -> Option<&Value> {
        self.crd(rt)?
            .pointer("/spec/versions")?
            .as_array()?
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(version))
    }

    /// The objects a selection covers, in key order, as its version shows them.
    pub(crate) fn select(&self, selection: &Selection) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, s)| {
                selection.covers(&k.group, &k.plural, &k.namespace) && selection.selects(&s.object)
            })
            .map(|(_, s)| selection.present(&s.object))
            .collect()
    }

    /// The watch events after `since` that a selection sees, with the resourceVersion reached;
    /// 410 when `since` is older than the kept history.
    pub(crate) fn changes_since(
        &self,
        selection: &Selection,
        since: u64,
    ) -> Result<(Vec<(ChangeKind, Value)>, u64), ApiError> {
        if since < self.compacted {
            return Err(ApiError::expired(since, self.compacted + 1));
        }
        let start = self.history.partition_point(|c| c.rv <= since);
        let mut events = Vec::new();
        for change in self.history.range(start..) {
            if !selection.covers(&change.group, &change.plural, &change.namespace) {
                continue;
            }
            let now = selection.selects(&change.object);
            let before = change
                .previous
                .as_ref()
                .is_some_and(|p| selection.selects(p));
            let kind = match (change.kind, before, now) {
                (ChangeKind::Modified, true, true) => ChangeKind::Modified,
                (ChangeKind::Modified, false, true) => ChangeKind::Added,
                (ChangeKind::Modified, true, false) => ChangeKind::Deleted,
                (ChangeKind::Modified, false, false) | (_, _, false) => continue,
                (kind, _, true) => kind,
            };
            events.push((kind, selection.present(&change.object)));
        }
        Ok((events, self.rv.max(since)))
    }

    fn check_namespace(&self, rt: &ResourceType, namespace: Option<&str>) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        let ns = namespace.unwrap_or_default();
        let key = Key::namespace_object(ns);
        match self.objects.get(&key) {
            None => Err(ApiError::not_found(key.subject())),
            Some(s) if is_deleting(&s.object) => Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                rt.plural,
                meta_str(&s.object, "name").unwrap_or_default()
            ))),
            Some(_) => Ok(()),
        }
    }

    /// POST: creates an object (also the first server-side apply of a missing one).
    /// `target.name` may be empty: the body's name or `generateName` decide.
    pub(crate) fn create(
        &mut self,
        target: &Target<'_>,
        mut object: Value,
        operation: Operation,
    ) -> Result<Value, ApiError> {
        let rt = target.rt;
        let meta = metadata_mut(&mut object)
            .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => format!("{prefix}{}", name_suffix()),
                _ if !target.name.is_empty() => target.name.to_string(),
                _ => {
                    return Err(ApiError::invalid(
                        &rt.kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        if !target.name.is_empty() && name != target.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({})",
                target.name
            )));
        }
        match (
            meta.get("namespace").and_then(Value::as_str),
            target.namespace,
        ) {
            (Some(body), Some(url)) if rt.namespaced && !body.is_empty() && body != url => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        let now = time::now();
        meta.insert("name".into(), json!(name));
        match target.namespace {
            Some(ns) if rt.namespaced => meta.insert("namespace".into(), json!(ns)),
            _ => meta.remove("namespace"),
        };
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now));
        meta.insert("generation".into(), json!(1));
        for server_owned in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "resourceVersion",
            "selfLink",
        ] {
            meta.remove(server_owned);
        }
        self.check_namespace(rt, target.namespace)?;
        let key = Key::new(rt, target.namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(key.subject()));
        }
        object["apiVersion"] = json!(rt.api_version(target.version));
        object["kind"] = json!(rt.kind);
        if rt.status_subresource
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
        }
        self.on_create(&key, &mut object, &now)?;
        let mut object = events::to_storage(rt, &object);
        let writer = Writer {
            manager: target.manager,
            api_version: &rt.api_version(target.version),
            scope: Scope::Main {
                status_apart: rt.status_subresource,
            },
            now: &now,
        };
        let managed = ManagedFields::created(writer, operation, &object);
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        object["metadata"]["managedFields"] = managed.render();
        self.objects.insert(
            key.clone(),
            Stored {
                object: object.clone(),
                managed,
                orphan: false,
            },
        );
        self.record(ChangeKind::Added, &key, &object, None);
        Ok(present(rt, target.version, &object))
    }

    /// What the server adds to new objects of a few kinds.
    fn on_create(&mut self, key: &Key, object: &mut Value, now: &str) -> Result<(), ApiError> {
        if key.is_namespace() {
            object["status"] = json!({ "phase": "Active" });
        } else if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            let rt = crd_type(&key.name, object)?;
            object["status"] = json!({
                "conditions": [
                    {
                        "type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                        "message": "no conflicts found", "lastTransitionTime": now,
                    },
                    {
                        "type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                        "message": "the initial names have been accepted", "lastTransitionTime": now,
                    },
                ],
                "acceptedNames": object.pointer("/spec/names").cloned().unwrap_or(Value::Null),
                "storedVersions": [rt.versions.first()],
            });
            self.registry.register(rt);
        }
        Ok(())
    }

    /// PUT, PATCH and server-side apply of an existing object; apply creates a missing one.
    /// Returns the object and whether it was created.
    pub(crate) fn write(
        &mut self,
        target: &Target<'_>,
        write: Write<'_>,
    ) -> Result<(Value, bool), ApiError> {
        let rt = target.rt;
        let key = target.key();
        let Some(current) = self.objects.get(&key).cloned() else {
            return match write {
                Write::Apply { applied, .. } if !target.status => {
                    let created = self.create(target, applied, Operation::Apply)?;
                    Ok((created, true))
                }
                _ => Err(ApiError::not_found(key.subject())),
            };
        };
        let now = time::now();
        let api_version = rt.api_version(target.version);
        let writer = Writer {
            manager: target.manager,
            api_version: &api_version,
            scope: target.scope(),
            now: &now,
        };
        let mut managed = current.managed.clone();
        let (raw, operation) = match write {
            Write::Replace(body) => {
                let body = events::to_storage(rt, &body);
                if meta_str(&body, "name").is_some_and(|n| n != target.name) {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({})",
                        meta_str(&body, "name").unwrap_or_default(),
                        target.name
                    )));
                }
                (body, Operation::Update)
            }
            Write::Patch(kind, body) => {
                // Patched as the client sees the object, stored in the stored shape.
                let mut doc = present(rt, target.version, &current.object);
                match kind {
                    PatchKind::Json => patch::apply_json_patch(&mut doc, body)?,
                    _ => patch::apply_merge_patch(&mut doc, &patch::parse_json(body)?)?,
                }
                (events::to_storage(rt, &doc), Operation::Update)
            }
            Write::Apply { applied, force } => {
                let applied = events::to_storage(rt, &applied);
                if meta_str(&applied, "name").is_some_and(|n| n != target.name) {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({})",
                        meta_str(&applied, "name").unwrap_or_default(),
                        target.name
                    )));
                }
                let merged = managed
                    .apply(writer, &current.object, &applied, force)
                    .map_err(|conflicts| ApiError::apply_conflicts(key.subject(), &conflicts))?;
                (merged, Operation::Apply)
            }
        };
        let current_rv = meta_str(&current.object, "resourceVersion").unwrap_or_default();
        if let Some(asked) = meta_str(&raw, "resourceVersion")
            && !asked.is_empty()
            && asked != current_rv
        {
            return Err(ApiError::conflict(
                key.subject(),
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut new = merge_server_fields(rt, &current.object, raw, target.status)?;
        match operation {
            Operation::Update => managed.record_update(writer, &current.object, &new),
            Operation::Apply => managed.prune(&new),
        }
        if is_deleting(&current.object) {
            let old = finalizers(&current.object);
            let added: Vec<&str> = finalizers(&new)
                .into_iter()
                .filter(|f| !old.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    &rt.kind,
                    target.name,
                    &format!(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        if content(&new) == content(&current.object) && managed.same_ownership(&current.managed) {
            return Ok((present(rt, target.version, &current.object), false));
        }
        if generation_part(rt, &new) != generation_part(rt, &current.object) {
            let generation = current
                .object
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            let rt = crd_type(&key.name, &new)?;
            self.registry.register(rt);
        }
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        new["metadata"]["managedFields"] = managed.render();
        if is_deleting(&new) && self.may_go(&key, &new) {
            self.remove(&key, &new, false);
        } else {
            self.objects.insert(
                key.clone(),
                Stored {
                    object: new.clone(),
                    managed,
                    orphan: current.orphan,
                },
            );
            self.record(ChangeKind::Modified, &key, &new, Some(current.object));
        }
        Ok((present(rt, target.version, &new), false))
    }

    /// DELETE of one object. `options` is the DeleteOptions body (or `null`).
    pub(crate) fn delete(
        &mut self,
        rt: &ResourceType,
        version: &str,
        namespace: Option<&str>,
        name: &str,
        options: &Value,
    ) -> Result<Value, ApiError> {
        let key = Key::new(rt, namespace, name);
        let Some(current) = self.objects.get(&key) else {
            return Err(ApiError::not_found(key.subject()));
        };
        for (field, what) in [("resourceVersion", "ResourceVersion"), ("uid", "UID")] {
            if let Some(wanted) = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str)
            {
                let actual = meta_str(&current.object, field).unwrap_or_default();
                if wanted != actual {
                    return Err(ApiError::conflict(
                        key.subject(),
                        &format!(
                            "Precondition failed: {what}: {wanted}, {what} in record: {actual}"
                        ),
                    ));
                }
            }
        }
        let orphan = options.get("propagationPolicy").and_then(Value::as_str) == Some("Orphan")
            || options.get("orphanDependents").and_then(Value::as_bool) == Some(true);
        let uid = current.object.pointer("/metadata/uid").cloned();
        Ok(match self.delete_key(&key, orphan) {
            Deletion::Pending(object) => present(rt, version, &object),
            Deletion::Gone(_) => status::success(key.subject(), &uid.unwrap_or(Value::Null)),
        })
    }

    /// DELETE of a collection: deletes every selected object, answering with the list of
    /// what it deleted or started deleting.
    pub(crate) fn delete_collection(&mut self, selection: &Selection) -> Value {
        let keys: Vec<Key> = self
            .objects
            .iter()
            .filter(|(k, s)| {
                selection.covers(&k.group, &k.plural, &k.namespace) && selection.selects(&s.object)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let items: Vec<Value> = keys
            .iter()
            .map(|k| match self.delete_key(k, false) {
                Deletion::Pending(o) | Deletion::Gone(o) => selection.present(&o),
            })
            .collect();
        self.list_body(selection, items)
    }

    /// The `{Kind}List` body for a selection.
    pub(crate) fn list_body(&self, selection: &Selection, items: Vec<Value>) -> Value {
        json!({
            "apiVersion": selection.rt.api_version(&selection.version),
            "kind": format!("{}List", selection.rt.kind),
            "metadata": { "resourceVersion": self.rv.to_string() },
            "items": items,
        })
    }

    /// Whether a deleting object may be removed now: no finalizers, and for a namespace, no
    /// contents left.
    fn may_go(&self, key: &Key, object: &Value) -> bool {
        finalizers(object).is_empty()
            && !(key.is_namespace() && self.objects.keys().any(|k| k.namespace == key.name))
    }

    /// Deletes one stored object: marks it if something holds it, removes it otherwise.
    fn delete_key(&mut self, key: &Key, orphan: bool) -> Deletion {
        let Some(stored) = self.objects.get(key).cloned() else {
            return Deletion::Gone(Value::Null);
        };
        if is_deleting(&stored.object) {
            return Deletion::Pending(stored.object);
        }
        let mut object = stored.object.clone();
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if self.may_go(key, &object) {
            self.remove(key, &object, orphan);
            return Deletion::Gone(object);
        }
        object["metadata"]["deletionTimestamp"] = json!(time::now());
        object["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        if key.is_namespace() {
            object["status"]["phase"] = json!("Terminating");
        }
        self.objects.insert(
            key.clone(),
            Stored {
                object: object.clone(),
                managed: stored.managed,
                orphan,
            },
        );
        self.record(ChangeKind::Modified, key, &object, Some(stored.object));
        if key.is_namespace() {
            let contents: Vec<Key> = self
                .objects
                .keys()
                .filter(|k| k.namespace == key.name)
                .cloned()
                .collect();
            for k in contents {
                self.delete_key(&k, false);
            }
            // Removing the last of its contents removes a terminating namespace.
            match self.objects.get(key) {
                None => return Deletion::Gone(object),
                Some(now) => return Deletion::Pending(now.object.clone()),
            }
        }
        Deletion::Pending(object)
    }

    /// Removes an object for good (its last state, with its final resourceVersion, in hand),
    /// then what follows: a CRD's objects, orphaned dependents, an emptied terminating
    /// namespace.
    fn remove(&mut self, key: &Key, last: &Value, orphan: bool) {
        let Some(stored) = self.objects.remove(key) else {
            return;
        };
        self.record(ChangeKind::Deleted, key, last, None);
        if key.group == "apiextensions.k8s.io"
            && key.plural == "customresourcedefinitions"
            && let Some(rt) = ResourceType::from_crd(last)
        {
            self.registry.unregister(&rt.group, &rt.plural);
            let instances: Vec<Key> = self
                .objects
                .keys()
                .filter(|k| k.group == rt.group && k.plural == rt.plural)
                .cloned()
                .collect();
            for k in instances {
                if let Some(s) = self.objects.get(&k) {
                    let mut object = s.object.clone();
                    let rv = self.next_rv();
                    object["metadata"]["resourceVersion"] = json!(rv.to_string());
                    self.remove(&k, &object, false);
                }
            }
        }
        if !(orphan || stored.orphan)
            && let Some(uid) = meta_str(last, "uid")
        {
            self.collect_dependents(uid);
        }
        if !key.namespace.is_empty() {
            let ns = Key::namespace_object(&key.namespace);
            if let Some(s) = self.objects.get(&ns)
                && is_deleting(&s.object)
                && self.may_go(&ns, &s.object)
            {
                let mut object = s.object.clone();
                let rv = self.next_rv();
                object["metadata"]["resourceVersion"] = json!(rv.to_string());
                self.remove(&ns, &object, false);
            }
        }
    }

    /// Background garbage collection: deletes objects whose owners are all gone.
    fn collect_dependents(&mut self, owner_uid: &str) {
        let uids: Vec<String> = self
            .objects
            .values()
            .filter_map(|s| meta_str(&s.object, "uid").map(str::to_string))
            .collect();
        let orphans: Vec<Key> = self
            .objects
            .iter()
            .filter(|(_, s)| {
                let owners: Vec<&str> = s
                    .object
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .map(|refs| {
                        refs.iter()
                            .filter_map(|r| r.get("uid").and_then(Value::as_str))
                            .collect()
                    })
                    .unwrap_or_default();
                owners.contains(&owner_uid) && owners.iter().all(|u| !uids.iter().any(|x| x == u))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in orphans {
            self.delete_key(&k, false);
        }
    }
}

/// The type a CRD declares, checking its name is `<plural>.<group>` as the real server does.
fn crd_type(name: &str, crd: &Value) -> Result<ResourceType, ApiError> {
    let rt = ResourceType::from_crd(crd).ok_or_else(|| {
        ApiError::invalid(
            "CustomResourceDefinition",
            name,
            "spec: Required value: group, names.kind, names.plural and a served version are required",
        )
    })?;
    let expected = format!("{}.{}", rt.plural, rt.group);
    if name != expected {
        return Err(ApiError::invalid(
            "CustomResourceDefinition",
            name,
            &format!(
                "metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
            ),
        ));
    }
    Ok(rt)
}

/// The new state of an object from a write's raw result: server-owned metadata comes from the
/// current object, and so does `.status` (main resource of a kind with the status
/// subresource) or everything but `.status` (the status subresource).
fn merge_server_fields(
    rt: &ResourceType,
    current: &Value,
    raw: Value,
    status: bool,
) -> Result<Value, ApiError> {
    let mut new = if status {
        let mut n = current.clone();
        match (n.as_object_mut(), raw.get("status")) {
            (Some(map), Some(s)) => {
                map.insert("status".into(), s.clone());
            }
            (Some(map), None) => {
                map.remove("status");
            }
            (None, _) => {}
        }
        n
    } else {
        raw
    };
    if !new.is_object() {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    }
    let preferred = rt.versions.first().map_or("v1", String::as_str);
    new["apiVersion"] = current
        .get("apiVersion")
        .cloned()
        .unwrap_or_else(|| json!(rt.api_version(preferred)));
    new["kind"] = json!(rt.kind);
    let old_meta = current.get("metadata").and_then(Value::as_object);
    let meta = metadata_mut(&mut new)
        .ok_or_else(|| ApiError::bad_request("metadata must be a JSON object"))?;
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generateName",
    ] {
        carry(meta, old_meta, field);
    }
    meta.remove("managedFields");
    meta.remove("resourceVersion");
    if rt.status_subresource && !status {
        let old_status = current.get("status").cloned();
        if let Some(map) = new.as_object_mut() {
            match old_status {
                Some(s) => map.insert("status".into(), s),
                None => map.remove("status"),
            };
        }
    }
    Ok(new)
}
