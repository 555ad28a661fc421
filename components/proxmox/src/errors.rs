//! What Proxmox's answers mean: whole-message matchers for the texts the provider branches on, and
//! the classification of every other failure into a contract error.
//!
//! | failure                                              | class            |
//! |------------------------------------------------------|------------------|
//! | 500 `Configuration file '…/<id>.conf' does not exist` (F2) | `not-found`  |
//! | 500 `VM is locked (…)` (F7), `can't lock file … got timeout`, other 5xx, 595/596 | `transient` |
//! | 500 `… No space left on device` / `not enough free space` | `quota-exceeded` |
//! | 400 (parameter errors, F9, F15), 401 (F22), 403 (F13), 501, other 4xx | `permanent` |
//! | no response: unreachable, timeouts                   | `transient`      |
//! | no response: TLS verification failed (Phase 1, entries 13/16) | `permanent` |
//! | no response: the broker refused the request          | `permanent`      |
//! | no response: the host could not read the credentials | `transient` (the secret may land) |
//! | a 2xx body that does not decode                      | `transient`      |

use crate::api::{ApiError, TransportKind};
use crate::egress::provider::types::Error;

/// Whether `text` is `<prefix><digits><suffix>` exactly.
fn digits_between(text: &str, prefix: &str, suffix: &str) -> bool {
    text.strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(suffix))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// F5: `VM <vmid> is not running`, matched as a whole message, because `is not running` alone also
/// ends `QEMU guest agent is not running` (Phase 1 note, Phase 2 mutation).
pub fn is_vm_not_running(message: &str) -> bool {
    digits_between(message, "VM ", " is not running")
}

/// F5: the agent is enabled but not (yet) answering.
pub fn is_agent_not_running(message: &str) -> bool {
    message == "QEMU guest agent is not running"
}

/// F5: `agent` is not enabled in the VM's config.
pub fn is_agent_not_configured(message: &str) -> bool {
    message == "No QEMU guest agent configured"
}

/// F2: the VM's config file does not exist (identical for config, status/current and DELETE).
pub fn is_missing_vm(message: &str) -> bool {
    message
        .strip_prefix("Configuration file 'nodes/")
        .and_then(|rest| rest.strip_suffix(".conf' does not exist"))
        .and_then(|rest| rest.split_once("/qemu-server/"))
        .is_some_and(|(node, vmid)| {
            !node.is_empty()
                && !node.contains('/')
                && !vmid.is_empty()
                && vmid.bytes().all(|b| b.is_ascii_digit())
        })
}

/// F4: a clone onto a VMID that is already taken.
pub fn is_vmid_taken(message: &str) -> bool {
    digits_between(
        message,
        "unable to create VM ",
        ": config file already exists",
    )
}

/// F7 and lock contention (notes A6): a lock held by a task.
pub fn is_locked(message: &str) -> bool {
    (message.starts_with("VM is locked (") && message.ends_with(')'))
        || (message.starts_with("can't lock file '") && message.ends_with("- got timeout"))
}

/// F13, F17: a privilege the token lacks, as a 403 answers it or as the exit status of a task
/// whose worker checks it (qemu-server checks a drive's `VM.Config.CDROM` and the replaced NIC's
/// `SDN.Use` in the config task, the disk storage's `Datastore.AllocateSpace` in the resize task).
/// PVE's `raise_perm_exc` writes `Permission check failed`, then ` (<path>, <privilege>)` when it
/// knows which.
pub fn is_permission_failure(message: &str) -> bool {
    message == "Permission check failed"
        || (message.starts_with("Permission check failed (") && message.ends_with(')'))
}

/// Whether `error` is F2's missing VM.
pub fn api_missing_vm(error: &ApiError) -> bool {
    matches!(error, ApiError::Http { status: 500, message } if is_missing_vm(message))
}

/// The message of a 5xx answer, for the matchers above.
pub fn server_message(error: &ApiError) -> Option<&str> {
    match error {
        ApiError::Http { status, message } if *status >= 500 => Some(message),
        _ => None,
    }
}

fn is_out_of_space(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("no space left on device") || lower.contains("not enough free space")
}

/// The contract error for a failed call; `what` says what was being done ("clone VM 100123").
pub fn classify(what: &str, error: &ApiError) -> Error {
    let message = format!("{what}: {error}");
    match error {
        ApiError::Http {
            status: 500,
            message: text,
        } if is_missing_vm(text) => Error::NotFound(message),
        ApiError::Http {
            status,
            message: text,
        } if *status >= 500 && is_out_of_space(text) => Error::QuotaExceeded(message),
        // 501: the API has no such method; retrying cannot help.
        ApiError::Http { status: 501, .. } => Error::Permanent(message),
        ApiError::Http { status, .. } if *status >= 500 || *status == 429 || *status == 408 => {
            Error::Transient(message)
        }
        ApiError::Http { status: 401, .. } => Error::Permanent(format!(
            "{message} (the API token was refused: fix the host's credentials)"
        )),
        ApiError::Http { status: 403, .. } => Error::Permanent(format!(
            "{message} (the API token lacks a privilege: see docs/providers/proxmox.md)"
        )),
        ApiError::Http { .. } => Error::Permanent(message),
        ApiError::Transport(transport) => match transport.kind {
            TransportKind::Tls => {
                Error::Permanent(format!("{message} (the node's certificate did not verify)"))
            }
            TransportKind::Denied => Error::Permanent(format!(
                "{message} (the host's egress grant does not allow it)"
            )),
            TransportKind::Unreachable
            | TransportKind::CredentialsUnavailable
            | TransportKind::Other => Error::Transient(message),
        },
        ApiError::Decode(_) => Error::Transient(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TransportError;

    fn http(status: u16, message: &str) -> ApiError {
        ApiError::Http {
            status,
            message: message.into(),
        }
    }

    fn class(error: &Error) -> &'static str {
        match error {
            Error::Transient(_) => "transient",
            Error::Permanent(_) => "permanent",
            Error::NotFound(_) => "not-found",
            Error::QuotaExceeded(_) => "quota-exceeded",
        }
    }

    #[test]
    fn f5_phase1_whole_message_matchers_tell_the_three_agent_texts_apart() {
        let texts = [
            ("VM 199999 is not running", (true, false, false)),
            ("QEMU guest agent is not running", (false, true, false)),
            ("No QEMU guest agent configured", (false, false, true)),
            ("VM  is not running", (false, false, false)),
            ("VM 12a is not running", (false, false, false)),
            ("xVM 1 is not running", (false, false, false)),
        ];
        for (text, expected) in texts {
            assert_eq!(
                (
                    is_vm_not_running(text),
                    is_agent_not_running(text),
                    is_agent_not_configured(text)
                ),
                expected,
                "{text}"
            );
        }
    }

    #[test]
    fn f13_f17_permission_failures_with_and_without_a_path() {
        assert!(is_permission_failure(
            "Permission check failed (/storage/local, Datastore.Allocate)"
        ));
        assert!(is_permission_failure(
            "Permission check failed (/sdn/zones/localnetwork/vmbr0/4, SDN.Use)"
        ));
        // An `or` of several checks (clone's VM.Allocate on the new VMID or the pool) names none.
        assert!(is_permission_failure("Permission check failed"));
        assert!(!is_permission_failure("Permission check failed, retrying"));
        assert!(!is_permission_failure("shrinking disks is not supported"));
    }

    #[test]
    fn f2_missing_vm_f4_taken_vmid_f7_locks() {
        assert!(is_missing_vm(
            "Configuration file 'nodes/pv1-1/qemu-server/999999.conf' does not exist"
        ));
        assert!(!is_missing_vm(
            "Configuration file 'nodes/pv1-1/lxc/999999.conf' does not exist"
        ));
        assert!(!is_missing_vm("storage 'proxy-seeds' does not exist"));
        assert!(is_vmid_taken(
            "unable to create VM 199999: config file already exists"
        ));
        assert!(!is_vmid_taken("unable to create VM 199999: clone failed"));
        assert!(is_locked("VM is locked (clone)"));
        assert!(is_locked(
            "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout"
        ));
        assert!(!is_locked("VM 100 is not running"));
    }

    #[test]
    fn classification_table() {
        let tls = ApiError::Transport(TransportError {
            kind: TransportKind::Tls,
            detail: "TLS-certificate-error".into(),
        });
        let unreachable = ApiError::Transport(TransportError {
            kind: TransportKind::Unreachable,
            detail: "connection-refused".into(),
        });
        let denied = ApiError::Transport(TransportError {
            kind: TransportKind::Denied,
            detail: "HTTP-request-denied".into(),
        });
        let credentials = ApiError::Transport(TransportError {
            kind: TransportKind::CredentialsUnavailable,
            detail: "credentials".into(),
        });
        let rows = [
            (
                http(
                    500,
                    "Configuration file 'nodes/pv1-1/qemu-server/999999.conf' does not exist",
                ),
                "not-found",
            ),
            (http(500, "VM is locked (clone)"), "transient"),
            (
                http(
                    500,
                    "unable to create VM 199999: config file already exists",
                ),
                "transient",
            ),
            (http(500, "QEMU guest agent is not running"), "transient"),
            (http(595, "Connection refused"), "transient"),
            (
                http(
                    596,
                    "tls_process_server_certificate: certificate verify failed",
                ),
                "transient",
            ),
            (http(502, "HTTP status 502"), "transient"),
            (
                http(500, "write failed: No space left on device"),
                "quota-exceeded",
            ),
            (http(400, "Parameter verification failed."), "permanent"),
            (http(401, "HTTP status 401"), "permanent"),
            (
                http(
                    403,
                    "Permission check failed (/storage/local, Datastore.Allocate)",
                ),
                "permanent",
            ),
            (http(501, "Method 'GET /x' not implemented"), "permanent"),
            (tls, "permanent"),
            (denied, "permanent"),
            (unreachable, "transient"),
            (credentials, "transient"),
            (ApiError::Decode("expected a string".into()), "transient"),
        ];
        for (error, expected) in rows {
            assert_eq!(class(&classify("op", &error)), expected, "{error:?}");
        }
    }

    #[test]
    fn classified_messages_say_what_was_being_done() {
        match classify("clone VM 100123", &http(500, "VM is locked (clone)")) {
            Error::Transient(message) => {
                assert_eq!(message, "clone VM 100123: HTTP 500: VM is locked (clone)")
            }
            other => panic!("{other:?}"),
        }
    }
}
