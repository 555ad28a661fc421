//! `check`: can the provider reach and use Proxmox with the host's grant? Always a reason, never
//! an error.
//!
//! 1. `GET /version`: no answer → `unreachable`, `certificate-invalid` (TLS), `credentials-unavailable`
//!    (the broker could not read the token), `misconfigured` (the grant does not cover `apiUrl`);
//!    401 → `unauthorized` (F22); 403 → `forbidden`.
//! 2. The configured nodes, the template (and its shape) and `isoStorage` exist → else
//!    `misconfigured`.
//! 3. The token's privileges on `/storage/<isoStorage>`: without `Datastore.Allocate` seeds cannot
//!    be deleted (F13, F17); without `Datastore.AllocateTemplate` they cannot be uploaded (F12)
//!    → `forbidden`. Skipped when the permissions endpoint does not answer.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{ApiError, Io, Pve, TransportKind};
use crate::create::check_template;
use crate::egress::provider::types::{CheckReason, CheckResult};
use crate::errors::api_missing_vm;

/// Privileges the token needs on the seed storage.
pub const SEED_STORAGE_PRIVILEGES: [&str; 2] = ["Datastore.Allocate", "Datastore.AllocateTemplate"];

/// The check reason for a failed call.
pub fn reason_for(error: &ApiError) -> CheckReason {
    match error {
        ApiError::Transport(transport) => match transport.kind {
            TransportKind::Unreachable => CheckReason::Unreachable,
            TransportKind::Tls => CheckReason::CertificateInvalid,
            TransportKind::CredentialsUnavailable => CheckReason::CredentialsUnavailable,
            TransportKind::Denied => CheckReason::Misconfigured,
            TransportKind::Other => CheckReason::Other,
        },
        ApiError::Http { status: 401, .. } => CheckReason::Unauthorized,
        ApiError::Http { status: 403, .. } => CheckReason::Forbidden,
        ApiError::Http { .. } | ApiError::Decode(_) => CheckReason::Other,
    }
}

/// The privileges from `SEED_STORAGE_PRIVILEGES` missing at `path` in a permissions answer.
pub fn missing_privileges(
    permissions: &BTreeMap<String, BTreeMap<String, Value>>,
    path: &str,
) -> Vec<&'static str> {
    let held = permissions.get(path);
    SEED_STORAGE_PRIVILEGES
        .into_iter()
        .filter(|privilege| {
            !held
                .and_then(|privileges| privileges.get(*privilege))
                .is_some_and(|value| value.as_u64() == Some(1) || value == &Value::Bool(true))
        })
        .collect()
}

fn result(reason: CheckReason, message: impl Into<String>) -> CheckResult {
    CheckResult {
        reason,
        message: message.into(),
    }
}

fn failed(what: &str, error: &ApiError) -> CheckResult {
    result(reason_for(error), format!("{what}: {error}"))
}

/// `check` under the client's configuration.
pub fn check<I: Io>(pve: &mut Pve<'_, I>) -> CheckResult {
    let config = pve.config;
    if let Err(error) = pve.version() {
        return failed("GET /version", &error);
    }
    let nodes = match pve.nodes() {
        Ok(nodes) => nodes,
        Err(error) => return failed("list nodes", &error),
    };
    if let Some(missing) = config.nodes.iter().find(|node| !nodes.contains(node)) {
        return result(
            CheckReason::Misconfigured,
            format!(
                "node {missing:?} is not in the cluster (nodes: {})",
                nodes.join(", ")
            ),
        );
    }

    let entries = match pve.resources() {
        Ok(entries) => entries,
        Err(error) => return failed("list VMs", &error),
    };
    let template_vmid = config.template_vmid;
    let Some(template) = entries
        .iter()
        .find(|e| e.vmid == template_vmid && e.is_qemu())
    else {
        return result(
            CheckReason::Misconfigured,
            format!("template {template_vmid} does not exist (or the token cannot see it)"),
        );
    };
    let template_node = template.node.clone();
    match pve.vm_config(&template_node, template_vmid) {
        Err(error) if api_missing_vm(&error) => {
            return result(
                CheckReason::Misconfigured,
                format!("template {template_vmid} does not exist"),
            );
        }
        Err(error) => return failed(&format!("read template {template_vmid}"), &error),
        Ok(template) => {
            if let Err(why) = check_template(&template, config) {
                return result(CheckReason::Misconfigured, why);
            }
        }
    }

    let storage = &config.iso_storage;
    match pve.storage_status(config.placement_node(), storage) {
        Err(
            error @ ApiError::Http {
                status: 401 | 403, ..
            },
        ) => return failed(&format!("read storage {storage}"), &error),
        Err(ApiError::Http { message, .. }) => {
            return result(
                CheckReason::Misconfigured,
                format!(
                    "isoStorage {storage:?} is not usable on {}: {message}",
                    config.placement_node()
                ),
            );
        }
        Err(error) => return failed(&format!("read storage {storage}"), &error),
        Ok(status) => {
            let content = status.get("content").and_then(Value::as_str);
            if content.is_some_and(|content| !content.split(',').any(|kind| kind == "iso")) {
                return result(
                    CheckReason::Misconfigured,
                    format!(
                        "isoStorage {storage:?} does not hold ISO images (content {content:?})"
                    ),
                );
            }
        }
    }

    let path = format!("/storage/{storage}");
    if let Ok(permissions) = pve.permissions(&path) {
        let missing = missing_privileges(&permissions, &path);
        if !missing.is_empty() {
            return result(
                CheckReason::Forbidden,
                format!(
                    "the token lacks {} on {path} (F13: seeds could not be uploaded or deleted)",
                    missing.join(" and ")
                ),
            );
        }
    }
    result(
        CheckReason::Ok,
        format!(
            "Proxmox VE reachable; nodes, template {template_vmid} and storage {storage} usable"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TransportError;

    #[test]
    fn f22_check_reason_table() {
        let transport = |kind| {
            ApiError::Transport(TransportError {
                kind,
                detail: "x".into(),
            })
        };
        let rows = [
            (
                transport(TransportKind::Unreachable),
                CheckReason::Unreachable,
            ),
            (
                transport(TransportKind::Tls),
                CheckReason::CertificateInvalid,
            ),
            (
                transport(TransportKind::CredentialsUnavailable),
                CheckReason::CredentialsUnavailable,
            ),
            (transport(TransportKind::Denied), CheckReason::Misconfigured),
            (transport(TransportKind::Other), CheckReason::Other),
            (
                ApiError::Http {
                    status: 401,
                    message: "HTTP status 401".into(),
                },
                CheckReason::Unauthorized,
            ),
            (
                ApiError::Http {
                    status: 403,
                    message: "Permission check failed".into(),
                },
                CheckReason::Forbidden,
            ),
            (
                ApiError::Http {
                    status: 500,
                    message: "boom".into(),
                },
                CheckReason::Other,
            ),
        ];
        for (error, expected) in rows {
            assert_eq!(reason_for(&error), expected, "{error:?}");
        }
    }

    #[test]
    fn f13_f17_missing_seed_storage_privileges() {
        let answer = |json: &str| {
            serde_json::from_str::<BTreeMap<String, BTreeMap<String, Value>>>(json).unwrap()
        };
        let full = answer(
            r#"{"/storage/proxy-seeds":{"Datastore.Allocate":1,"Datastore.AllocateTemplate":1,"Datastore.Audit":1}}"#,
        );
        assert!(missing_privileges(&full, "/storage/proxy-seeds").is_empty());
        let phase0 = answer(
            r#"{"/storage/proxy-seeds":{"Datastore.AllocateTemplate":1,"Datastore.AllocateSpace":1}}"#,
        );
        assert_eq!(
            missing_privileges(&phase0, "/storage/proxy-seeds"),
            ["Datastore.Allocate"]
        );
        let zero = answer(
            r#"{"/storage/proxy-seeds":{"Datastore.Allocate":0,"Datastore.AllocateTemplate":1}}"#,
        );
        assert_eq!(
            missing_privileges(&zero, "/storage/proxy-seeds"),
            ["Datastore.Allocate"]
        );
        assert_eq!(
            missing_privileges(&answer("{}"), "/storage/proxy-seeds").len(),
            2
        );
    }
}
