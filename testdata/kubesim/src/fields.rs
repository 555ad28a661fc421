//! `metadata.managedFields`: which field manager last set which fields, and server-side apply's
//! conflict check on top of it.
//!
//! Simplified from the real server: an object's fields are its leaves (a scalar, a list or an
//! empty map); lists are atomic (no merge keys), so two managers owning different entries of one
//! list conflict. Of `metadata` only labels, annotations, finalizers and ownerReferences are
//! tracked. Otherwise the rules are the real ones: an update takes the fields it changes from
//! every other manager; an apply conflicts (409) on a field another manager owns with a
//! different value unless `force` is set, in which case it takes the field; an apply that stops
//! naming a field it owned removes it unless someone else owns it too.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

/// A path from the object's root to one field, as map keys.
pub(crate) type FieldPath = Vec<String>;

/// Which part of an object a write covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The whole object, `.status` excepted when the kind has the status subresource.
    Main {
        /// Whether `.status` belongs to the status subresource and so is left out.
        status_apart: bool,
    },
    /// Only `.status`.
    Status,
}

impl Scope {
    fn subresource(self) -> Option<&'static str> {
        match self {
            Scope::Main { .. } => None,
            Scope::Status => Some("status"),
        }
    }
}

/// How a manager wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Server-side apply.
    Apply,
    /// Create, replace or patch.
    Update,
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Managed {
    manager: String,
    operation: Operation,
    api_version: String,
    subresource: Option<&'static str>,
    time: String,
    fields: BTreeSet<FieldPath>,
}

impl Managed {
    fn is(&self, manager: &str, operation: Operation, scope: Scope) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == scope.subresource()
    }

    /// The entry without its timestamp, to tell real changes from no-op writes.
    fn ownership(&self) -> (&str, Operation, Option<&str>, &BTreeSet<FieldPath>) {
        (
            &self.manager,
            self.operation,
            self.subresource,
            &self.fields,
        )
    }
}

/// All managers of one object.
#[derive(Debug, Clone, Default)]
pub(crate) struct ManagedFields(Vec<Managed>);

/// Who writes and how, for one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer<'a> {
    /// The field manager's name.
    pub(crate) manager: &'a str,
    /// The `apiVersion` the request used.
    pub(crate) api_version: &'a str,
    /// The part of the object written.
    pub(crate) scope: Scope,
    /// The current time, RFC 3339.
    pub(crate) now: &'a str,
}

/// Metadata fields that belong to users and so to managers.
const TRACKED_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// The leaf fields of `object` within `scope`.
pub(crate) fn leaves(object: &Value, scope: Scope) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    let Some(map) = object.as_object() else {
        return out;
    };
    for (key, value) in map {
        let wanted = match (scope, key.as_str()) {
            (_, "apiVersion" | "kind") => false,
            (Scope::Status, k) => k == "status",
            (Scope::Main { status_apart }, "status") => !status_apart,
            (Scope::Main { .. }, _) => true,
        };
        if !wanted {
            continue;
        }
        if key == "metadata" {
            for meta_key in TRACKED_METADATA {
                if let Some(v) = value.get(meta_key) {
                    let path = vec![key.clone(), meta_key.to_string()];
                    if matches!(meta_key, "labels" | "annotations") {
                        collect(v, path, &mut out);
                    } else {
                        out.insert(path);
                    }
                }
            }
        } else {
            collect(value, vec![key.clone()], &mut out);
        }
    }
    out
}

fn collect(value: &Value, path: FieldPath, out: &mut BTreeSet<FieldPath>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                let mut next = path.clone();
                next.push(key.clone());
                collect(child, next, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

/// The value at `path`, if there is one.
fn value_at<'a>(object: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(object, |v, key| v.get(key))
}

/// Removes the field at `path`, if present.
fn remove_at(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let parent = parents
        .iter()
        .try_fold(object, |v, key| v.get_mut(key.as_str()));
    if let Some(Value::Object(map)) = parent {
        map.remove(last);
    }
}

/// Whether one path is the other or lies under it.
fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// `.spec.holderIdentity`, as the real server names fields in conflicts.
fn dotted(path: &[String]) -> String {
    path.iter().map(|k| format!(".{k}")).collect()
}

impl ManagedFields {
    /// Fields of a newly created object: everything belongs to the creator.
    pub(crate) fn created(writer: Writer<'_>, operation: Operation, object: &Value) -> Self {
        let mut fields = ManagedFields::default();
        fields.entry(writer, operation).fields = leaves(object, writer.scope);
        fields.prune(object);
        fields
    }

    fn entry(&mut self, writer: Writer<'_>, operation: Operation) -> &mut Managed {
        let index = match self
            .0
            .iter()
            .position(|m| m.is(writer.manager, operation, writer.scope))
        {
            Some(i) => i,
            None => {
                self.0.push(Managed {
                    manager: writer.manager.to_string(),
                    operation,
                    api_version: writer.api_version.to_string(),
                    subresource: writer.scope.subresource(),
                    time: String::new(),
                    fields: BTreeSet::new(),
                });
                self.0.len() - 1
            }
        };
        let entry = &mut self.0[index];
        entry.time = writer.now.to_string();
        entry.api_version = writer.api_version.to_string();
        entry
    }

    /// Records an update from `old` to `new`: the writer takes every field it changed.
    pub(crate) fn record_update(&mut self, writer: Writer<'_>, old: &Value, new: &Value) {
        let changed: Vec<FieldPath> = leaves(old, writer.scope)
            .union(&leaves(new, writer.scope))
            .filter(|p| value_at(old, p) != value_at(new, p))
            .cloned()
            .collect();
        if !changed.is_empty() {
            for m in &mut self.0 {
                if !m.is(writer.manager, Operation::Update, writer.scope) {
                    m.fields.retain(|p| !changed.iter().any(|c| overlaps(p, c)));
                }
            }
            let own = self.entry(writer, Operation::Update);
            own.fields
                .retain(|p| !changed.iter().any(|c| overlaps(p, c)));
            own.fields
                .extend(changed.into_iter().filter(|p| value_at(new, p).is_some()));
        }
        self.prune(new);
    }

    /// Server-side apply of `applied` onto `current`: returns the merged object, or the
    /// conflicting (manager, field) pairs when `force` is off.
    pub(crate) fn apply(
        &mut self,
        writer: Writer<'_>,
        current: &Value,
        applied: &Value,
        force: bool,
    ) -> Result<Value, Vec<(String, String)>> {
        let wanted = leaves(applied, writer.scope);
        let mut conflicts = Vec::new();
        for m in self.0.iter().filter(|m| m.manager != writer.manager) {
            for path in m.fields.iter().filter(|p| wanted.contains(*p)) {
                if value_at(current, path) != value_at(applied, path) {
                    conflicts.push((m.manager.clone(), dotted(path)));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            return Err(conflicts);
        }
        for m in self.0.iter_mut().filter(|m| m.manager != writer.manager) {
            m.fields
                .retain(|p| !(wanted.contains(p) && value_at(current, p) != value_at(applied, p)));
        }
        let mut merged = current.clone();
        json_patch::merge(&mut merged, &only_scope(applied, writer.scope));
        let previously: BTreeSet<FieldPath> = self
            .0
            .iter()
            .find(|m| m.is(writer.manager, Operation::Apply, writer.scope))
            .map(|m| m.fields.clone())
            .unwrap_or_default();
        for dropped in previously.difference(&wanted) {
            let owned_elsewhere = self.0.iter().any(|m| {
                !m.is(writer.manager, Operation::Apply, writer.scope)
                    && m.fields.iter().any(|p| overlaps(p, dropped))
            });
            if !owned_elsewhere {
                remove_at(&mut merged, dropped);
            }
        }
        self.entry(writer, Operation::Apply).fields = wanted;
        self.prune(&merged);
        Ok(merged)
    }

    /// Forgets fields the object no longer has, then managers left with none.
    pub(crate) fn prune(&mut self, object: &Value) {
        for m in &mut self.0 {
            m.fields.retain(|p| value_at(object, p).is_some());
        }
        self.0.retain(|m| !m.fields.is_empty());
    }

    /// Whether two records name the same owners of the same fields (timestamps aside).
    pub(crate) fn same_ownership(&self, other: &ManagedFields) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.ownership() == b.ownership())
    }

    /// The `metadata.managedFields` list.
    pub(crate) fn render(&self) -> Value {
        Value::Array(
            self.0
                .iter()
                .map(|m| {
                    let mut fields = Map::new();
                    for path in &m.fields {
                        insert_path(&mut fields, path);
                    }
                    let mut entry = json!({
                        "manager": m.manager,
                        "operation": match m.operation {
                            Operation::Apply => "Apply",
                            Operation::Update => "Update",
                        },
                        "apiVersion": m.api_version,
                        "time": m.time,
                        "fieldsType": "FieldsV1",
                        "fieldsV1": fields,
                    });
                    if let Some(sub) = m.subresource {
                        entry["subresource"] = json!(sub);
                    }
                    entry
                })
                .collect(),
        )
    }
}

/// Adds `path` to a `fieldsV1` tree (`{"f:spec": {"f:replicas": {}}}`).
fn insert_path(tree: &mut Map<String, Value>, path: &[String]) {
    if let Some((first, rest)) = path.split_first() {
        let child = tree
            .entry(format!("f:{first}"))
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(child) = child {
            insert_path(child, rest);
        }
    }
}

/// Only the part of an applied object its scope covers (plus nothing for `Status` but status).
fn only_scope(applied: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    if let Some(map) = applied.as_object() {
        for (key, value) in map {
            let keep = match scope {
                Scope::Status => key == "status",
                Scope::Main { status_apart } => !(status_apart && key == "status"),
            };
            if keep {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(out)
}
