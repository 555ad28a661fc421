//! `fieldValidation` for custom resources: a write whose body has fields the CRD version's
//! `openAPIV3Schema` does not declare (where it neither keeps unknown fields nor allows
//! `additionalProperties`) is refused with `Strict` (400, the real server's `strict decoding
//! error`), as kubectl 1.27+ asks for when it leaves validation to the server. `Warn` (the
//! default) and `Ignore` accept it as sent; kubesim sends no `Warning` headers and prunes
//! nothing. Values, types and formats are not checked.

use serde_json::Value;

use crate::status::ApiError;

/// The `fieldValidation` directive of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Directive {
    Ignore,
    Warn,
    Strict,
}

impl Directive {
    /// Parses the query parameter; absent means `Warn`, as on the real server.
    pub(crate) fn parse(param: Option<&str>) -> Result<Self, ApiError> {
        match param {
            None | Some("" | "Warn") => Ok(Directive::Warn),
            Some("Ignore") => Ok(Directive::Ignore),
            Some("Strict") => Ok(Directive::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

/// The fields of `metadata` (ObjectMeta) a client may send.
const OBJECT_META: [&str; 16] = [
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
    "clusterName",
];

/// The unknown fields of a custom resource's body, as the real server names them
/// (`spec.tags[0].bogus`), in document order.
pub(crate) fn unknown_fields(schema: &Value, object: &Value) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(map) = object.as_object() {
        for (key, value) in map {
            match key.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    for field in value.as_object().into_iter().flat_map(|m| m.keys()) {
                        if !OBJECT_META.contains(&field.as_str()) {
                            found.push(format!("metadata.{field}"));
                        }
                    }
                }
                _ => match schema.pointer(&format!("/properties/{}", escape(key))) {
                    Some(inner) => walk(inner, value, key, &mut found),
                    None if open(schema) => {}
                    None => found.push(key.clone()),
                },
            }
        }
    }
    found
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Whether a schema takes fields it does not name.
fn open(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || schema
            .get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(false))
        || schema.get("properties").is_none()
}

fn walk(schema: &Value, value: &Value, path: &str, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let embedded = schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
            for (key, inner) in map {
                let at = format!("{path}.{key}");
                if let Some(property) = schema.pointer(&format!("/properties/{}", escape(key))) {
                    walk(property, inner, &at, found);
                } else if let Some(additional) =
                    schema.get("additionalProperties").filter(|a| a.is_object())
                {
                    walk(additional, inner, &at, found);
                } else if !(open(schema)
                    || embedded && matches!(key.as_str(), "apiVersion" | "kind" | "metadata"))
                {
                    found.push(at);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items").filter(|i| i.is_object()) {
                for (i, inner) in items.iter().enumerate() {
                    walk(item, inner, &format!("{path}[{i}]"), found);
                }
            }
        }
        _ => {}
    }
}

/// 400 for a `Strict` write with unknown fields, worded as the real server's.
pub(crate) fn strict_error(kind: &str, version: &str, unknown: &[String]) -> ApiError {
    let fields: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "size": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "object", "properties": {
                        "key": {"type": "string"},
                    }}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "properties": {"spec": {"type": "object"}}},
                }},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            },
        })
    }

    #[test]
    fn fields_the_schema_does_not_declare_are_named_by_path() {
        let object = json!({
            "apiVersion": "kubesim.test/v1", "kind": "Gizmo",
            "metadata": {"name": "g", "labels": {"a": "b"}, "colour": "red"},
            "spec": {
                "size": 1, "bogus": true,
                "tags": [{"key": "a"}, {"key": "b", "value": "c"}],
                "labels": {"anything": "goes"},
                "config": {"anything": {"goes": 1}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"x": 1}},
            },
            "status": {"whatever": 1},
            "extra": 1,
        });
        let mut found = unknown_fields(&schema(), &object);
        found.sort();
        assert_eq!(
            found,
            [
                "extra",
                "metadata.colour",
                "spec.bogus",
                "spec.tags[1].value"
            ]
        );
        let clean = json!({"apiVersion": "a/v1", "kind": "Gizmo", "metadata": {"name": "g"},
                           "spec": {"size": 2}});
        assert!(unknown_fields(&schema(), &clean).is_empty());
    }

    #[test]
    fn the_directive_defaults_to_warn_and_refuses_other_values() {
        assert_eq!(Directive::parse(None).unwrap(), Directive::Warn);
        assert_eq!(Directive::parse(Some("Strict")).unwrap(), Directive::Strict);
        assert_eq!(Directive::parse(Some("Ignore")).unwrap(), Directive::Ignore);
        assert_eq!(Directive::parse(Some("strict")).unwrap_err().code, 400);
        let error = strict_error("Gizmo", "v1", &["spec.a".into(), "spec.b".into()]);
        assert_eq!(
            error.message,
            "Gizmo in version \"v1\" cannot be handled as a Gizmo: strict decoding error: unknown field \"spec.a\", unknown field \"spec.b\""
        );
    }
}
