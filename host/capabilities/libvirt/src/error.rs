//! From libvirt's errors to the guest's `error` variant.
//!
//! libvirt errors pass through as `libvirt(record { code, domain, message })`, with one
//! exception: a failure to dial an SSH transport is recognised by its message and becomes
//! `host-key` or `ssh-auth` (both permanent: retrying with the same key and known_hosts cannot
//! succeed). libvirt reports those failures under several codes depending on the transport (the
//! `ssh` binary's text relayed as a system error; libssh and libssh2 as `VIR_ERR_SSH`,
//! `VIR_ERR_LIBSSH` or `VIR_ERR_AUTH_FAILED`), so the message is the one reliable signal.

use crate::bindings::egress::libvirt::libvirt::{Error, LibvirtError};
use crate::conn::DialError;

/// Message fragments (lowercase) of a host key that is unknown or changed: OpenSSH's, libssh's
/// and libssh2's as libvirt 9.0 relays them.
const HOST_KEY_MARKERS: &[&str] = &[
    "host key verification failed",
    "can't verify the session host key",
    "no suitable callback for host key verification",
    "failed to validate ssh host key",
    "was not accepted",
    "remote host identification has changed",
];

/// Message fragments (lowercase) of a key the server refused.
const AUTH_MARKERS: &[&str] = &[
    "permission denied (",
    "authentication methods",
    "failed to authenticate",
    "authentication failed",
    "too many authentication failures",
];

/// The guest's view of a libvirt error.
pub(crate) fn libvirt(error: &virt::error::Error) -> Error {
    Error::Libvirt(LibvirtError {
        code: error.code().to_raw() as i32,
        domain: error.domain().to_raw() as i32,
        message: error.message().to_owned(),
    })
}

/// The guest's view of a failed dial: `host-key` or `ssh-auth` when an SSH transport says so.
impl From<DialError> for Error {
    fn from(failure: DialError) -> Error {
        match failure {
            DialError::CredentialsUnavailable(message) => Error::CredentialsUnavailable(message),
            DialError::Libvirt { error, ssh } => dial(&error, ssh),
        }
    }
}

fn dial(error: &virt::error::Error, ssh: bool) -> Error {
    if ssh && let Some(classified) = classify_ssh(error.message()) {
        return classified;
    }
    libvirt(error)
}

/// `host-key` or `ssh-auth` for a message that says so.
fn classify_ssh(message: &str) -> Option<Error> {
    let lower = message.to_lowercase();
    if HOST_KEY_MARKERS.iter().any(|marker| lower.contains(marker)) {
        return Some(Error::HostKey(message.to_owned()));
    }
    if AUTH_MARKERS.iter().any(|marker| lower.contains(marker)) {
        return Some(Error::SshAuth(message.to_owned()));
    }
    None
}

/// Whether libvirt said the object asked for does not exist (a lookup answers `none`).
pub(crate) fn is_missing(error: &virt::error::Error) -> bool {
    let code = error.code().to_raw();
    code == virt::sys::VIR_ERR_NO_DOMAIN
        || code == virt::sys::VIR_ERR_NO_STORAGE_VOL
        || code == virt::sys::VIR_ERR_NO_DOMAIN_METADATA
}

/// `denied`, with the same message in the host's log.
pub(crate) fn denied(message: String) -> Error {
    tracing::warn!(reason = %message, "libvirt call denied");
    Error::Denied(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_messages_of_each_transport_are_classified() {
        let host_key = [
            "Cannot recv data: Host key verification failed.: Connection reset by peer",
            "SSH transport error: No user interaction callback provided: Can't verify the session host key",
            "!!! SSH HOST KEY VERIFICATION FAILED !!!: Identity of host 'hv1:22' differs from stored identity.",
            "SSH host key for 'hv1' (ssh-ed25519) was not accepted",
        ];
        for message in host_key {
            assert!(
                matches!(classify_ssh(message), Some(Error::HostKey(_))),
                "{message}"
            );
        }
        let auth = [
            "Cannot recv data: egress@hv1: Permission denied (publickey).: Connection reset by peer",
            "authentication failed: All provided authentication methods with credentials were rejected by the server",
            "SSH transport error: failed to authenticate using agent: x",
        ];
        for message in auth {
            assert!(
                matches!(classify_ssh(message), Some(Error::SshAuth(_))),
                "{message}"
            );
        }
        assert!(classify_ssh("Cannot recv data: Connection refused").is_none());
    }
}
