//! Failures as the API server reports them: a `metav1.Status` body with the matching HTTP code.

use serde_json::{Value, json};

/// One failed request: what becomes a `kind: Status` body. Built only through the constructors,
/// which use the texts and reasons of the real server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    details: Option<Value>,
}

/// What a Status names: the resource (`configmaps`, `leases.coordination.k8s.io`) and object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Subject<'a> {
    /// The API group, empty for the core group.
    pub(crate) group: &'a str,
    /// The plural resource name.
    pub(crate) plural: &'a str,
    /// The object's name, empty for a collection.
    pub(crate) name: &'a str,
}

impl Subject<'_> {
    fn resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn details(&self) -> Value {
        json!({ "name": self.name, "group": self.group, "kind": self.plural })
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 404 `configmaps "x" not found`.
    pub(crate) fn not_found(subject: Subject<'_>) -> Self {
        let message = format!("{} \"{}\" not found", subject.resource(), subject.name);
        ApiError {
            details: Some(subject.details()),
            ..Self::new(404, "NotFound", message)
        }
    }

    /// 404 for a path that names no resource the server knows.
    pub(crate) fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 `configmaps "x" already exists`.
    pub(crate) fn already_exists(subject: Subject<'_>) -> Self {
        let message = format!("{} \"{}\" already exists", subject.resource(), subject.name);
        ApiError {
            details: Some(subject.details()),
            ..Self::new(409, "AlreadyExists", message)
        }
    }

    /// 409 `Operation cannot be fulfilled on configmaps "x": <why>`.
    pub(crate) fn conflict(subject: Subject<'_>, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{}\": {why}",
            subject.resource(),
            subject.name
        );
        ApiError {
            details: Some(subject.details()),
            ..Self::new(409, "Conflict", message)
        }
    }

    /// 409 for a server-side apply whose fields another manager owns.
    pub(crate) fn apply_conflicts(subject: Subject<'_>, conflicts: &[(String, String)]) -> Self {
        let listed: Vec<String> = conflicts
            .iter()
            .map(|(manager, field)| format!("conflict with \"{manager}\": {field}"))
            .collect();
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(manager, field)| {
                json!({
                    "type": "FieldManagerConflict",
                    "message": format!("conflict with \"{manager}\""),
                    "field": field,
                })
            })
            .collect();
        let message = format!(
            "Apply failed with {} conflict{}: {}",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            listed.join(", ")
        );
        let mut details = subject.details();
        details["causes"] = Value::Array(causes);
        ApiError {
            details: Some(details),
            ..Self::new(409, "Conflict", message)
        }
    }

    /// 422 `Kind "x" is invalid: <why>`.
    pub(crate) fn invalid(kind: &str, name: &str, why: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {why}"),
        )
    }

    /// 422 for a patch that cannot be applied (a failed `test`, a missing path).
    pub(crate) fn invalid_patch(why: impl Into<String>) -> Self {
        Self::new(422, "Invalid", why)
    }

    /// 400 with the given text.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 403 with the given text.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 405 for a verb the path does not take.
    pub(crate) fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 410 `too old resource version: <asked> (<oldest kept>)`, reason `Expired` as the real
    /// server sends it to a watch that starts before the compacted history.
    pub(crate) fn expired(asked: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {asked} ({oldest})"),
        )
    }

    /// 406 for an `Accept` the server cannot serve (such as protobuf).
    pub(crate) fn not_acceptable(accept: &str) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json; got {accept:?}"
            ),
        )
    }

    /// 413 for a body over the limit.
    pub(crate) fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body exceeds {limit} bytes"),
        )
    }

    /// 415 for a PATCH whose content type is no patch type.
    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"
            ),
        )
    }

    /// 500, for injected faults.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `metav1.Status` body.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// The `status: Success` body a DELETE answers with once the object is gone.
pub(crate) fn success(subject: Subject<'_>, uid: &Value) -> Value {
    let mut details = subject.details();
    details["uid"] = uid.clone();
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}
