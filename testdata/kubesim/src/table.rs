//! Server-side printing: `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (what
//! `kubectl get` sends) answers a `meta.k8s.io/v1` `Table` whose columns are a CRD version's
//! `additionalPrinterColumns`, after `Name`, as the apiextensions server renders them
//! (`tableconvertor.go`): JSONPath per object, first result only, `string` columns printed as
//! text, `date` columns as an age (`5m3s`), a missing value as `null` (kubectl: `<none>`). A
//! version without printer columns gets one `Age` column; a kind without a CRD (built in, or
//! [`KubeSim::register`](crate::KubeSim::register)ed) gets `Name` and `Age` too.

use serde_json::{Value, json};

use crate::api::partial;
use crate::status::ApiError;

/// One column: name, type, optional format, priority and the JSONPath of its cells.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Column {
    name: String,
    kind: String,
    format: String,
    description: String,
    priority: i64,
    path: Vec<Step>,
}

/// Which version of `Table` the client asked for, if any.
pub(crate) fn requested(accept: Option<&str>) -> Option<&'static str> {
    let accept = accept?;
    let mut offered = accept.split(',').filter_map(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        let has = |p: &str| params.contains(&p);
        (has("as=Table") && has("g=meta.k8s.io")).then(|| {
            if has("v=v1beta1") {
                "meta.k8s.io/v1beta1"
            } else {
                "meta.k8s.io/v1"
            }
        })
    });
    offered.next()
}

/// What each row carries beside its cells (`includeObject`, default `Metadata`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Include {
    None,
    Metadata,
    Object,
}

impl Include {
    pub(crate) fn parse(param: Option<&str>) -> Result<Self, ApiError> {
        match param {
            None | Some("" | "Metadata") => Ok(Include::Metadata),
            Some("None") => Ok(Include::None),
            Some("Object") => Ok(Include::Object),
            Some(other) => Err(ApiError::bad_request(format!(
                "includeObject: unsupported value {other:?}: must be None, Metadata or Object"
            ))),
        }
    }
}

fn age_column() -> Value {
    json!({
        "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
        "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
    })
}

/// The columns for the printer columns a CRD version declares (`None`: the kind has no CRD);
/// `Name` first, `Age` alone when none are declared, as the real server.
pub(crate) fn columns(declared: Option<&[Value]>) -> Result<Vec<Column>, ApiError> {
    let defaults = [age_column()];
    let declared = match declared {
        Some(list) if !list.is_empty() => list,
        _ => &defaults,
    };
    let mut out = vec![Column {
        name: "Name".into(),
        kind: "string".into(),
        format: "name".into(),
        description: "Name must be unique within a namespace.".into(),
        priority: 0,
        path: parse_path(".metadata.name")?,
    }];
    for column in declared {
        let text = |f: &str| column.get(f).and_then(Value::as_str).unwrap_or_default();
        let json_path = text("jsonPath");
        out.push(Column {
            name: text("name").to_string(),
            kind: text("type").to_string(),
            format: text("format").to_string(),
            description: match text("description") {
                "" => {
                    format!("Custom resource definition column (in JSONPath format): {json_path}")
                }
                given => given.to_string(),
            },
            priority: column.get("priority").and_then(Value::as_i64).unwrap_or(0),
            path: parse_path(json_path)?,
        });
    }
    Ok(out)
}

/// The `Table` of `objects` (full objects as the request's version shows them).
pub(crate) fn render(
    api_version: &str,
    columns: &[Column],
    objects: &[Value],
    resource_version: Option<String>,
    include: Include,
    now: u64,
) -> Value {
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "type": c.kind, "format": c.format,
                "description": c.description, "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let cells: Vec<Value> = columns.iter().map(|c| cell(c, object, now)).collect();
            let mut row = json!({ "cells": cells });
            match include {
                Include::None => {}
                Include::Metadata => row["object"] = partial(object),
                Include::Object => row["object"] = object.clone(),
            }
            row
        })
        .collect();
    let mut metadata = json!({});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({
        "apiVersion": api_version,
        "kind": "Table",
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

/// One cell: the column's first JSONPath result, typed as the column says (`cellForJSONValue`).
fn cell(column: &Column, object: &Value, now: u64) -> Value {
    let Some(value) = evaluate(&column.path, object).into_iter().next() else {
        return Value::Null;
    };
    match column.kind.as_str() {
        "string" => json!(go_text(value)),
        "integer" => value
            .as_i64()
            .or_else(|| value.as_f64().map(|f| f as i64))
            .map_or(Value::Null, |i| json!(i)),
        "number" => value.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => value.as_bool().map_or(Value::Null, |b| json!(b)),
        "date" => match value.as_str() {
            Some(text) => json!(crate::time::parse(text).map_or_else(
                || "<invalid>".to_string(),
                |at| human_duration(i64::try_from(now).unwrap_or(i64::MAX) - at)
            )),
            None => Value::Null,
        },
        _ => Value::Null,
    }
}

/// A value as Go's `fmt.Print` shows what `jsonpath` found: strings bare, lists `[a b]`, maps
/// `map[k:v]` with sorted keys.
fn go_text(value: &Value) -> String {
    match value {
        Value::Null => "<nil>".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            format!(
                "[{}]",
                items.iter().map(go_text).collect::<Vec<_>>().join(" ")
            )
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let inner: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{k}:{}", go_text(v)))
                .collect();
            format!("map[{}]", inner.join(" "))
        }
        other => other.to_string(),
    }
}

/// `duration.HumanDuration`: a succinct age with two or three significant figures.
pub(crate) fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// One step of the JSONPath subset printer columns use.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// `.name` or `['name']`.
    Field(String),
    /// `[2]`; negative counts from the end.
    Index(i64),
    /// `[*]` or `.*`.
    All,
    /// `[?(@.a.b=="x")]` (or `!=`): the list items whose field equals (or not) the literal.
    Filter(Vec<String>, bool, Value),
}

fn bad_path(path: &str) -> ApiError {
    ApiError::invalid(
        "CustomResourceDefinition",
        "",
        &format!("additionalPrinterColumns: Invalid value: {path:?}: unsupported JSONPath"),
    )
}

/// Parses `.a.b[0].c`, `.a[*]`, `.a[?(@.type=="Ready")].status`, `{.a.b}`.
fn parse_path(path: &str) -> Result<Vec<Step>, ApiError> {
    let text = path.trim();
    let text = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or(text);
    let text = text.strip_prefix('$').unwrap_or(text);
    let mut steps = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            match name {
                "" => return Err(bad_path(path)),
                "*" => steps.push(Step::All),
                _ => steps.push(Step::Field(name.to_string())),
            }
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = closing_bracket(after).ok_or_else(|| bad_path(path))?;
            let inner = after[..end].trim();
            rest = &after[end + 1..];
            steps.push(bracket(inner).ok_or_else(|| bad_path(path))?);
        } else {
            return Err(bad_path(path));
        }
    }
    Ok(steps)
}

/// The index of the `]` closing a bracket, skipping quoted text.
fn closing_bracket(text: &str) -> Option<usize> {
    let mut quote = None;
    for (i, ch) in text.char_indices() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(ch),
            (None, ']') => return Some(i),
            _ => {}
        }
    }
    None
}

fn unquote(text: &str) -> Option<&str> {
    let text = text.trim();
    text.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .or_else(|| text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')))
}

fn bracket(inner: &str) -> Option<Step> {
    if inner == "*" {
        return Some(Step::All);
    }
    if let Some(name) = unquote(inner) {
        return Some(Step::Field(name.to_string()));
    }
    if let Ok(index) = inner.parse::<i64>() {
        return Some(Step::Index(index));
    }
    let expr = inner.strip_prefix("?(")?.strip_suffix(')')?.trim();
    let (left, equal, right) = if let Some((l, r)) = expr.split_once("!=") {
        (l, false, r)
    } else {
        let (l, r) = expr.split_once("==")?;
        (l, true, r)
    };
    let field = left.trim().strip_prefix("@.")?;
    let literal = match unquote(right) {
        Some(s) => json!(s),
        None => serde_json::from_str(right.trim()).ok()?,
    };
    Some(Step::Filter(
        field.split('.').map(str::to_string).collect(),
        equal,
        literal,
    ))
}

/// Every value the path reaches, in order.
fn evaluate<'a>(path: &[Step], object: &'a Value) -> Vec<&'a Value> {
    let mut current = vec![object];
    for step in path {
        let mut next = Vec::new();
        for value in current {
            match step {
                Step::Field(name) => next.extend(value.get(name)),
                Step::Index(i) => {
                    if let Some(items) = value.as_array() {
                        let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
                        let at = if *i < 0 { len + i } else { *i };
                        next.extend(usize::try_from(at).ok().and_then(|at| items.get(at)));
                    }
                }
                Step::All => match value {
                    Value::Array(items) => next.extend(items),
                    Value::Object(map) => next.extend(map.values()),
                    _ => {}
                },
                Step::Filter(field, equal, literal) => {
                    for item in value.as_array().into_iter().flatten() {
                        let found = field.iter().try_fold(item, |v, k| v.get(k));
                        if found.is_some_and(|f| f == literal) == *equal {
                            next.push(item);
                        }
                    }
                }
            }
        }
        current = next;
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> Value {
        json!({
            "apiVersion": "egress-operator.io/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "web", "namespace": "default", "uid": "u1",
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"providerConfigRef": "pve", "tags": {"team": "a"}},
            "status": {
                "addresses": ["10.0.0.5", "10.0.0.6"],
                "conditions": [
                    {"type": "Progressing", "status": "False"},
                    {"type": "Ready", "status": "True", "reason": "Running"},
                ],
                "restarts": 2,
            },
        })
    }

    fn at(path: &str) -> Vec<Value> {
        let object = proxy();
        evaluate(&parse_path(path).unwrap(), &object)
            .into_iter()
            .cloned()
            .collect()
    }

    #[test]
    fn jsonpath_covers_what_printer_columns_use() {
        assert_eq!(at(".metadata.name"), [json!("web")]);
        assert_eq!(at(".status.addresses[0]"), [json!("10.0.0.5")]);
        assert_eq!(at(".status.addresses[-1]"), [json!("10.0.0.6")]);
        assert_eq!(at("{.status.addresses[*]}").len(), 2);
        assert_eq!(
            at(r#".status.conditions[?(@.type=="Ready")].status"#),
            [json!("True")]
        );
        assert_eq!(
            at(r#".status.conditions[?(@.type!="Ready")].status"#),
            [json!("False")]
        );
        assert_eq!(at(".spec['providerConfigRef']"), [json!("pve")]);
        assert!(at(".status.missing[0]").is_empty());
        assert!(parse_path(".status.[").is_err());
    }

    #[test]
    fn a_table_has_name_then_the_declared_columns_typed_as_declared() {
        let declared = [
            json!({"name": "Ready", "type": "string",
                   "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}),
            json!({"name": "Address", "type": "string", "jsonPath": ".status.addresses[0]"}),
            json!({"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"}),
            json!({"name": "Tags", "type": "string", "jsonPath": ".spec.tags", "priority": 1}),
            json!({"name": "Missing", "type": "string", "jsonPath": ".status.nothing"}),
            json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}),
        ];
        let columns = columns(Some(&declared)).unwrap();
        let now = 1_735_689_600 + 3 * 60 + 7; // 2025-01-01T00:03:07Z
        let table = render(
            "meta.k8s.io/v1",
            &columns,
            &[proxy()],
            Some("7".into()),
            Include::Metadata,
            now,
        );
        assert_eq!(table["kind"], "Table");
        assert_eq!(table["metadata"]["resourceVersion"], "7");
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Name", "Ready", "Address", "Restarts", "Tags", "Missing", "Age"
            ]
        );
        assert_eq!(table["columnDefinitions"][0]["format"], "name");
        assert_eq!(table["columnDefinitions"][4]["priority"], 1);
        let row = &table["rows"][0];
        assert_eq!(
            row["cells"],
            json!(["web", "True", "10.0.0.5", 2, "map[team:a]", null, "3m7s"])
        );
        assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(row["object"]["metadata"]["uid"], "u1");
    }

    #[test]
    fn without_declared_columns_a_table_shows_name_and_age() {
        let columns = columns(None).unwrap();
        let table = render(
            "meta.k8s.io/v1",
            &columns,
            &[proxy()],
            None,
            Include::None,
            0,
        );
        let names: Vec<&Value> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["name"])
            .collect();
        assert_eq!(names, [&json!("Name"), &json!("Age")]);
        assert!(table["rows"][0].get("object").is_none());
        assert_eq!(columns, super::columns(Some(&[])).unwrap());
    }

    #[test]
    fn the_accept_header_decides_whether_a_table_is_wanted() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(requested(Some(kubectl)), Some("meta.k8s.io/v1"));
        assert_eq!(
            requested(Some("application/json;as=Table;v=v1beta1;g=meta.k8s.io")),
            Some("meta.k8s.io/v1beta1")
        );
        assert_eq!(requested(Some("application/json")), None);
        assert_eq!(requested(None), None);
    }

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        for (seconds, text) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (187, "3m7s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 3600, "3d1h"),
            (100 * 86400, "100d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
        ] {
            assert_eq!(human_duration(seconds), text, "{seconds}");
        }
    }
}
