//! The pveproxy response envelope (F1): `{"data":…}` on success; on error the message twice,
//! as the reason phrase (first line) and as the body's `message` ending in `\n`, with an
//! `errors` map on 400 and an empty body on 401.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use serde_json::{Value, json};

/// An error answer as pveproxy would send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: u16,
    /// The message without its trailing newline.
    pub message: String,
    /// Per-parameter messages (400 only).
    pub errors: Option<BTreeMap<String, String>>,
}

/// The message Proxmox gives every parameter error (F1, F9, F12, F15).
pub(crate) const PARAM_FAILED: &str = "Parameter verification failed.";
/// Schema text for a parameter the endpoint does not know.
pub(crate) const NOT_IN_SCHEMA: &str =
    "property is not defined in schema and the schema does not allow additional properties";
/// Schema text for a required parameter that is absent.
pub(crate) const MISSING: &str = "property is missing and it is not optional";

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            errors: None,
        }
    }

    /// A logic error: Proxmox answers every `die` with 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// A 403 as PVE's `raise_perm_exc` words it (F13): `Permission check failed`, then
    /// ` (<what>)` when the check knows which path and privilege failed.
    pub fn forbidden(what: &str) -> Self {
        if what.is_empty() {
            return Self::new(403, "Permission check failed");
        }
        Self::new(403, format!("Permission check failed ({what})"))
    }

    /// A 400 parameter error for one parameter.
    pub fn param(name: &str, message: impl Into<String>) -> Self {
        let mut errors = BTreeMap::new();
        errors.insert(name.to_string(), message.into());
        ApiError {
            status: 400,
            message: PARAM_FAILED.to_string(),
            errors: Some(errors),
        }
    }

    /// A schema format error; these values end in a newline on real hosts.
    pub fn format(name: &str, detail: &str) -> Self {
        Self::param(name, format!("invalid format - {detail}\n"))
    }
}

/// Renders a success envelope.
pub(crate) fn data(value: Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(&json!({ "data": value })).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    add_common_headers(&mut response);
    response
}

/// Renders an error: reason phrase = first line of the message; 401 keeps an empty body (F1, F22).
pub(crate) fn error(err: &ApiError) -> Response<Full<Bytes>> {
    let body = if err.status == 401 {
        Bytes::new()
    } else {
        let mut object = serde_json::Map::new();
        object.insert("data".into(), Value::Null);
        object.insert(
            "message".into(),
            Value::String(format!("{}\n", err.message)),
        );
        if let Some(errors) = &err.errors {
            object.insert("errors".into(), json!(errors));
        }
        Bytes::from(serde_json::to_vec(&Value::Object(object)).unwrap_or_default())
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() =
        StatusCode::from_u16(err.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let first_line = err.message.lines().next().unwrap_or_default();
    if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(first_line.as_bytes()) {
        response.extensions_mut().insert(reason);
    }
    add_common_headers(&mut response);
    if err.status == 401 {
        response.headers_mut().remove(header::CONTENT_TYPE);
    }
    // pveproxy disables keep-alive for codes >= 400.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn add_common_headers(response: &mut Response<Full<Bytes>>) {
    let headers = response.headers_mut();
    headers.insert(
        header::SERVER,
        HeaderValue::from_static("pve-api-daemon/3.0"),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json;charset=UTF-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=0"));
    headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_of(response: Response<Full<Bytes>>) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn error_carries_message_twice_with_newline() {
        let response = error(&ApiError::internal("VM is locked (clone)"));
        assert_eq!(response.status(), 500);
        let reason = response
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .unwrap();
        assert_eq!(reason.as_bytes(), b"VM is locked (clone)");
        let body: Value = serde_json::from_slice(&body_of(response).await).unwrap();
        assert_eq!(
            body,
            json!({"data": null, "message": "VM is locked (clone)\n"})
        );
    }

    #[tokio::test]
    async fn unauthorized_has_an_empty_body() {
        let response = error(&ApiError::new(401, "No ticket"));
        assert!(body_of(response).await.is_empty());
    }

    #[tokio::test]
    async fn param_error_has_errors_map() {
        let response = error(&ApiError::param("vmid", "VM 100 already exists"));
        let body: Value = serde_json::from_slice(&body_of(response).await).unwrap();
        assert_eq!(body["errors"], json!({"vmid": "VM 100 already exists"}));
        assert_eq!(body["message"], "Parameter verification failed.\n");
    }
}
