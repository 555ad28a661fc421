//! `labelSelector` and `fieldSelector` query parameters.

use serde_json::Value;

use crate::status::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed `labelSelector`: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0_i32, 0);
    for (i, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn bad_label(text: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {text:?}"))
}

fn parse_set(key: &str, rest: &str, whole: &str) -> Result<(String, Vec<String>), ApiError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad_label(whole))?;
    let values = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    Ok((key.to_string(), values))
}

fn parse_requirement(text: &str) -> Result<Requirement, ApiError> {
    if let Some(key) = text.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key.trim().to_string()));
    }
    if let Some((key, value)) = text.split_once("!=") {
        return Ok(Requirement::NotEquals(
            key.trim().to_string(),
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = text.split_once("==").or_else(|| text.split_once('=')) {
        return Ok(Requirement::Equals(
            key.trim().to_string(),
            value.trim().to_string(),
        ));
    }
    let mut words = text.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    if rest.is_empty() {
        return if key.is_empty() || key.contains('(') {
            Err(bad_label(text))
        } else {
            Ok(Requirement::Exists(key.to_string()))
        };
    }
    if let Some(set) = rest.strip_prefix("notin") {
        let (key, values) = parse_set(key, set, text)?;
        Ok(Requirement::NotIn(key, values))
    } else if let Some(set) = rest.strip_prefix("in") {
        let (key, values) = parse_set(key, set, text)?;
        Ok(Requirement::In(key, values))
    } else {
        Err(bad_label(text))
    }
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub(crate) fn parse(text: &str) -> Result<Self, ApiError> {
        split_top_level(text)
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<_, _>>()
            .map(LabelSelector)
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let label = |key: &str| {
            object
                .pointer("/metadata/labels")
                .and_then(|labels| labels.get(key))
                .and_then(Value::as_str)
        };
        self.0.iter().all(|req| match req {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `field=value`, `field==value` or `field!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

/// Fields every kind can be selected on.
const COMMON_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

/// Extra fields the real server indexes for a few kinds, by (group, plural).
fn extra_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "events") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "reason",
            "reportingController",
            "type",
        ],
        ("", "secrets") => &["type"],
        ("", "pods") => &["spec.nodeName", "status.phase"],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses the selector, rejecting fields the kind cannot be selected on (400, as the real
    /// server: `field label not supported`).
    pub(crate) fn parse(text: &str, group: &str, plural: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in split_top_level(text) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !COMMON_FIELDS.contains(&field) && !extra_fields(group, plural).contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the selector has no terms (selects everything).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the object's fields satisfy every term; a missing field reads as `""`.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            // A core Event's `source` field is its `source.component`, as the server indexes it.
            let path = if field == "source" {
                "source.component"
            } else {
                field
            };
            let pointer = format!("/{}", path.replace('.', "/"));
            let actual = object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .unwrap_or_default();
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labelled(labels: Value) -> Value {
        json!({ "metadata": { "name": "a", "namespace": "ns", "labels": labels } })
    }

    #[test]
    fn label_selector_covers_equality_and_sets() {
        let obj = labelled(json!({ "app": "web", "tier": "front" }));
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web, db)",
            "tier notin (back)",
            "app",
            "!missing",
            "app=web,tier in (front)",
            "",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&obj), "{s}");
        }
        let no = ["app=db", "app notin (web)", "missing", "!app", "x in (y)"];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&obj), "{s}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selector_knows_its_fields() {
        let obj = labelled(json!({}));
        let sel = FieldSelector::parse("metadata.name=a,metadata.namespace!=x", "", "pods");
        assert!(sel.unwrap().matches(&obj));
        let err = FieldSelector::parse("spec.color=red", "", "configmaps").unwrap_err();
        assert_eq!(err.code, 400);
    }
}
