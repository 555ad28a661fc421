//! How a failure of the host's libvirt capability maps onto the contract's four classes.
//!
//! | capability error / libvirt code                                  | class            |
//! |------------------------------------------------------------------|------------------|
//! | `denied` (outside the grant), `invalid`                          | `permanent`      |
//! | `timeout`                                                        | `transient`      |
//! | `credentials-unavailable` (SSH key or known_hosts unreadable)    | `transient`      |
//! | `ssh-auth`, `host-key`                                           | `permanent`      |
//! | `checksum-mismatch` (the configured sha256 is wrong)             | `permanent`      |
//! | `download` retryable (refused, timeout, 5xx, cut body) / not     | `transient` / `permanent` |
//! | 42 `NO_DOMAIN`, 50 `NO_STORAGE_VOL`                              | `not-found`      |
//! | 3 `NO_SUPPORT`, 8 `INVALID_ARG`, 27 `XML_ERROR`, 29 `OPERATION_DENIED`, 35 `XML_DETAIL`, 43 `NO_NETWORK`, 45 `AUTH_FAILED`, 49 `NO_STORAGE_POOL`, 67 `CONFIG_UNSUPPORTED`, 74 `ARGUMENT_UNSUPPORTED`, 79 `AUTH_CANCELLED`, 84 `OPERATION_UNSUPPORTED`, 94 `AUTH_UNAVAILABLE` | `permanent` |
//! | any code whose message says `No space left on device`, `not enough space` or `not enough free space` (any case) | `quota-exceeded` |
//! | 1 `INTERNAL_ERROR`, 2 `NO_MEMORY`, 5 `NO_CONNECT`, 6 `INVALID_CONN`, 9 `OPERATION_FAILED`, 38 `SYSTEM_ERROR`, 39 `RPC`, 55 `OPERATION_INVALID`, 68 `OPERATION_TIMEOUT`, 78 `OPERATION_ABORTED`, 86 `AGENT_UNRESPONSIVE`, 87 `RESOURCE_BUSY`, 90 `STORAGE_VOL_EXIST`, and every other code | `transient` |
//!
//! Unknown is transient: a retry costs little, and a person sees the message on the Proxy. SSH
//! authentication and host-key failures are permanent (the kvm2 spec's correction of v1, which
//! retried them forever); an unreadable key file is transient, since a rotation may be under way.

use crate::egress::libvirt::libvirt::Error as LibvirtError;
use crate::egress::provider::types::Error;

/// `virErrorNumber` values the provider branches on.
pub mod code {
    /// `VIR_ERR_NO_DOMAIN`.
    pub const NO_DOMAIN: i32 = 42;
    /// `VIR_ERR_NO_STORAGE_VOL`.
    pub const NO_STORAGE_VOL: i32 = 50;
    /// `VIR_ERR_OPERATION_INVALID` (for example: start of a running domain, destroy of a
    /// stopped one on qemu).
    pub const OPERATION_INVALID: i32 = 55;
    /// `VIR_ERR_INTERNAL_ERROR` (the test driver's "already running").
    pub const INTERNAL_ERROR: i32 = 1;
}

/// Codes retrying cannot fix: a configuration or a grant a person must change.
const PERMANENT_CODES: &[i32] = &[3, 8, 27, 29, 35, 43, 45, 49, 67, 74, 79, 84, 94];

/// Whether a libvirt message reports a full disk or pool: the kernel's `ENOSPC` text, and
/// libvirt's own ("Not enough space left in storage pool", the test driver's "Not enough free
/// space in pool"), in any case.
fn out_of_space(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "no space left on device",
        "not enough space",
        "not enough free space",
    ]
    .iter()
    .any(|marker| message.contains(marker))
}

/// The contract error for a failed capability call during `what` (the operation step, for the
/// message).
pub fn classify(what: &str, error: LibvirtError) -> Error {
    match error {
        LibvirtError::Denied(message) => Error::Permanent(format!("{what}: denied: {message}")),
        LibvirtError::Invalid(message) => Error::Permanent(format!("{what}: invalid: {message}")),
        LibvirtError::Timeout => Error::Transient(format!("{what}: timed out")),
        LibvirtError::CredentialsUnavailable(message) => {
            Error::Transient(format!("{what}: credentials unavailable: {message}"))
        }
        LibvirtError::SshAuth(message) => {
            Error::Permanent(format!("{what}: SSH authentication refused: {message}"))
        }
        LibvirtError::HostKey(message) => {
            Error::Permanent(format!("{what}: SSH host key not trusted: {message}"))
        }
        LibvirtError::ChecksumMismatch(message) => {
            Error::Permanent(format!("{what}: image checksum differs: {message}"))
        }
        LibvirtError::Download(download) => {
            let status = download
                .status
                .map(|status| format!(" (HTTP {status})"))
                .unwrap_or_default();
            let message = format!(
                "{what}: image download failed{status}: {}",
                download.message
            );
            if download.retryable {
                Error::Transient(message)
            } else {
                Error::Permanent(message)
            }
        }
        LibvirtError::Libvirt(libvirt) => {
            let message = format!(
                "{what}: libvirt error {} (domain {}): {}",
                libvirt.code, libvirt.domain, libvirt.message
            );
            match libvirt.code {
                code::NO_DOMAIN | code::NO_STORAGE_VOL => Error::NotFound(message),
                _ if out_of_space(&libvirt.message) => Error::QuotaExceeded(message),
                code if PERMANENT_CODES.contains(&code) => Error::Permanent(message),
                _ => Error::Transient(message),
            }
        }
    }
}

/// The contract error for a failed call on `connection`, one of the connections that create and
/// list-by-tag must all hear from before they answer: the message names it, and the class is
/// `transient` unless retrying cannot help (`permanent` stays, so an SSH key refused stays
/// permanent as kvm2 has it). Never `not-found` or `quota-exceeded`: one host's answer must not
/// speak for the whole operation.
pub fn classify_on(connection: &str, what: &str, error: LibvirtError) -> Error {
    match classify(&format!("connection {connection}: {what}"), error) {
        Error::Permanent(message) => Error::Permanent(message),
        Error::Transient(message) | Error::NotFound(message) | Error::QuotaExceeded(message) => {
            Error::Transient(message)
        }
    }
}

/// Whether `error` is libvirt's `code`.
pub fn is_code(error: &LibvirtError, code: i32) -> bool {
    matches!(error, LibvirtError::Libvirt(libvirt) if libvirt.code == code)
}

/// Whether starting a domain failed only because it already runs: `OPERATION_INVALID` on qemu,
/// `INTERNAL_ERROR` "… is already running" on the test driver (notes B2).
pub fn already_running(error: &LibvirtError) -> bool {
    match error {
        LibvirtError::Libvirt(libvirt) => {
            (libvirt.code == code::OPERATION_INVALID || libvirt.code == code::INTERNAL_ERROR)
                && libvirt.message.contains("already running")
        }
        _ => false,
    }
}

/// Whether destroying a domain failed only because it is not running.
pub fn not_running(error: &LibvirtError) -> bool {
    matches!(error, LibvirtError::Libvirt(libvirt)
        if libvirt.code == code::OPERATION_INVALID && libvirt.message.contains("not running"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::libvirt::libvirt::{DownloadError, LibvirtError as Lv};

    fn lv(code: i32, message: &str) -> LibvirtError {
        LibvirtError::Libvirt(Lv {
            code,
            domain: 10,
            message: message.into(),
        })
    }

    #[derive(Debug, PartialEq)]
    enum Class {
        Transient,
        Permanent,
        NotFound,
        Quota,
    }

    fn class(error: Error) -> Class {
        match error {
            Error::Transient(_) => Class::Transient,
            Error::Permanent(_) => Class::Permanent,
            Error::NotFound(_) => Class::NotFound,
            Error::QuotaExceeded(_) => Class::Quota,
        }
    }

    /// The module table, row by row.
    #[test]
    fn every_row_of_the_table() {
        use Class::*;
        let download = |retryable| {
            LibvirtError::Download(DownloadError {
                status: Some(503),
                retryable,
                message: "x".into(),
            })
        };
        let mut rows = vec![
            (LibvirtError::Denied("pool".into()), Permanent),
            (LibvirtError::Invalid("name".into()), Permanent),
            (LibvirtError::Timeout, Transient),
            (
                LibvirtError::CredentialsUnavailable("key".into()),
                Transient,
            ),
            (LibvirtError::SshAuth("publickey".into()), Permanent),
            (LibvirtError::HostKey("mismatch".into()), Permanent),
            (LibvirtError::ChecksumMismatch("sha".into()), Permanent),
            (download(true), Transient),
            (download(false), Permanent),
            (lv(42, "Domain not found"), NotFound),
            (lv(50, "Storage volume not found"), NotFound),
            (lv(38, "cannot write: No space left on device"), Quota),
            (lv(1, "not enough space for volume"), Quota),
            (lv(1, "Not enough space left in storage pool"), Quota),
            (lv(1, "Not enough free space in pool for volume 'a'"), Quota),
        ];
        for code in [3, 8, 27, 29, 35, 43, 45, 49, 67, 74, 79, 84, 94] {
            rows.push((lv(code, "m"), Permanent));
        }
        for code in [1, 2, 5, 6, 9, 38, 39, 55, 68, 78, 86, 87, 90, 0, 999, -1] {
            rows.push((lv(code, "m"), Transient));
        }
        for (error, want) in rows {
            let shown = format!("{error:?}");
            let got = classify("step", error);
            assert!(format!("{got:?}").contains("step: "), "{got:?}");
            assert_eq!(class(got), want, "{shown}");
        }
    }

    #[test]
    fn a_failure_on_one_of_several_connections_is_named_and_never_speaks_for_all() {
        use Class::*;
        let rows = [
            (LibvirtError::Timeout, Transient),
            (lv(38, "unable to connect"), Transient),
            (lv(42, "Domain not found"), Transient),
            (lv(38, "No space left on device"), Transient),
            (LibvirtError::SshAuth("publickey".into()), Permanent),
            (LibvirtError::Denied("hv9".into()), Permanent),
        ];
        for (error, want) in rows {
            let shown = format!("{error:?}");
            let got = classify_on("hv2", "look up the domain", error);
            assert!(
                format!("{got:?}").contains("connection hv2: look up the domain: "),
                "{got:?}"
            );
            assert_eq!(class(got), want, "{shown}");
        }
    }

    #[test]
    fn already_running_and_not_running_match_code_and_message() {
        assert!(already_running(&lv(
            55,
            "Requested operation is not valid: domain is already running"
        )));
        assert!(already_running(&lv(
            1,
            "internal error: Domain 'a' is already running"
        )));
        assert!(!already_running(&lv(9, "already running")));
        assert!(!already_running(&lv(55, "domain is not running")));
        assert!(not_running(&lv(
            55,
            "Requested operation is not valid: domain is not running"
        )));
        assert!(!not_running(&lv(1, "domain is not running")));
        assert!(is_code(&lv(42, ""), code::NO_DOMAIN));
        assert!(!is_code(&LibvirtError::Timeout, code::NO_DOMAIN));
    }
}
