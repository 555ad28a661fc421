//! The PATCH body types: JSON patch (RFC 6902), JSON merge patch (RFC 7386), strategic merge
//! patch (applied as a merge patch) and server-side apply (YAML or JSON).

use json_patch::PatchOperation;
use serde_json::Value;

use crate::status::ApiError;

/// A PATCH request's content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`, applied with merge semantics: lists are
    /// replaced, not merged by key, and `$patch` directives are not understood.
    Strategic,
    /// `application/apply-patch+yaml`: server-side apply.
    Apply,
}

impl PatchKind {
    /// The kind for a `Content-Type` header, parameters ignored.
    pub(crate) fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchKind::Apply),
            _ => Err(ApiError::unsupported_media_type(content_type)),
        }
    }
}

/// Parses a JSON body, or answers 400.
pub(crate) fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// Parses an apply body: JSON, or YAML (of which JSON is a subset).
pub(crate) fn parse_apply(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).or_else(|_| {
        serde_norway::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    })
}

/// Applies an RFC 6902 patch. A `test` of a path that does not exist compares as `null`, as the
/// real server does (kube's finalizer helper tests `/metadata/finalizers` against `null`).
pub(crate) fn apply_json_patch(doc: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    let ops: Vec<PatchOperation> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    for op in &ops {
        if let PatchOperation::Test(test) = op {
            let actual = doc.pointer(test.path.as_str()).unwrap_or(&Value::Null);
            if *actual != test.value {
                return Err(ApiError::invalid_patch(format!(
                    "the test operation at {} failed: have {actual}, want {}",
                    test.path, test.value
                )));
            }
        } else {
            json_patch::patch(doc, std::slice::from_ref(op))
                .map_err(|e| ApiError::invalid_patch(e.to_string()))?;
        }
    }
    Ok(())
}

/// Applies a merge patch (RFC 7386): objects merge, `null` removes, everything else replaces.
pub(crate) fn apply_merge_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request("a merge patch must be a JSON object"));
    }
    json_patch::merge(doc, patch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn test_of_a_missing_path_compares_as_null() {
        let mut doc = json!({ "metadata": { "name": "a" } });
        let body = br#"[{"op":"test","path":"/metadata/finalizers","value":null},
                        {"op":"add","path":"/metadata/finalizers","value":["f"]}]"#;
        apply_json_patch(&mut doc, body).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["f"]));
        let err = apply_json_patch(&mut doc, body).unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn apply_bodies_may_be_yaml() {
        let v = parse_apply(b"apiVersion: v1\nkind: ConfigMap\ndata:\n  a: \"1\"\n").unwrap();
        assert_eq!(v["data"]["a"], "1");
    }
}
