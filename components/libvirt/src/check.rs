//! `check`: can the provider reach each of its hypervisors and use its pool there, on fresh
//! connections (not the host's pool, so a dead hypervisor is not hidden by a pooled connection)?
//! Every connection is probed at once (kvm2 checked its hosts concurrently, K33), each within
//! [`PROBE_TIMEOUT_MS`]: below the contract's 30 s deadline for `check`, so a hypervisor that
//! accepts and never answers is reported `unreachable` in time rather than running the call out.
//! The first connection that fails, in list order, is the answer, named in the message: create
//! needs every one of them to answer.

use crate::config::Config;
use crate::egress::libvirt::libvirt::{Connection, Error as LibvirtError, Health};
use crate::egress::provider::types::{CheckReason, CheckResult};

/// How long one connection's probe may take: below `check`'s 30 s deadline with room to answer,
/// as the HTTP grant's 20 s first-byte timeout is (docs/contract.md, "Deadlines").
pub const PROBE_TIMEOUT_MS: u32 = 20_000;

/// `VIR_ERR_NO_STORAGE_POOL`.
const NO_STORAGE_POOL: i32 = 49;

/// The reason a capability failure gives a check.
pub fn reason(error: &LibvirtError) -> CheckReason {
    match error {
        LibvirtError::Denied(_) => CheckReason::Forbidden,
        LibvirtError::SshAuth(_) => CheckReason::Unauthorized,
        LibvirtError::HostKey(_) => CheckReason::CertificateInvalid,
        LibvirtError::CredentialsUnavailable(_) => CheckReason::CredentialsUnavailable,
        LibvirtError::Invalid(_) => CheckReason::Misconfigured,
        LibvirtError::Libvirt(libvirt) if libvirt.code == NO_STORAGE_POOL => {
            CheckReason::Misconfigured
        }
        LibvirtError::Timeout | LibvirtError::Libvirt(_) => CheckReason::Unreachable,
        LibvirtError::ChecksumMismatch(_) | LibvirtError::Download(_) => CheckReason::Other,
    }
}

fn failed(connection: &str, error: LibvirtError) -> CheckResult {
    let reason = reason(&error);
    let message = match error {
        LibvirtError::Timeout => {
            format!("did not answer within {} s", PROBE_TIMEOUT_MS / 1000)
        }
        error => format!("{error:?}"),
    };
    CheckResult {
        reason,
        message: format!("connection {connection}: {message}"),
    }
}

/// The operation.
pub fn check(config: &str) -> CheckResult {
    let config = match Config::parse(config) {
        Ok(config) => config,
        Err(message) => {
            return CheckResult {
                reason: CheckReason::Misconfigured,
                message,
            };
        }
    };
    let all = config.connections.join(",");
    let probed = crate::calls::call(&all, "probe every connection", || {
        Connection::probe(&config.connections, &config.pool, PROBE_TIMEOUT_MS)
    });
    let answers = match probed {
        Ok(answers) => answers,
        Err(error) => return failed(&config.connections.join(", "), error),
    };
    let mut healthy = Vec::with_capacity(answers.len());
    for (name, answer) in config.connections.iter().zip(answers) {
        match answer {
            Ok(health) => healthy.push(summary(name, &config.pool, &health)),
            Err(error) => return failed(name, error),
        }
    }
    CheckResult {
        reason: CheckReason::Ok,
        message: healthy.join("; "),
    }
}

/// One healthy connection, as the message shows it.
fn summary(name: &str, pool: &str, health: &Health) -> String {
    format!(
        "{name}: libvirt {}; pool {pool} has {} of {} bytes available",
        health.version, health.pool.available, health.pool.capacity
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::libvirt::libvirt::LibvirtError as Lv;

    #[test]
    fn each_failure_gives_its_reason() {
        let lv = |code| {
            LibvirtError::Libvirt(Lv {
                code,
                domain: 0,
                message: String::new(),
            })
        };
        let rows = [
            (LibvirtError::Denied("c".into()), CheckReason::Forbidden),
            (LibvirtError::SshAuth("k".into()), CheckReason::Unauthorized),
            (
                LibvirtError::HostKey("h".into()),
                CheckReason::CertificateInvalid,
            ),
            (
                LibvirtError::CredentialsUnavailable("f".into()),
                CheckReason::CredentialsUnavailable,
            ),
            (
                LibvirtError::Invalid("n".into()),
                CheckReason::Misconfigured,
            ),
            (lv(49), CheckReason::Misconfigured),
            (lv(38), CheckReason::Unreachable),
            (LibvirtError::Timeout, CheckReason::Unreachable),
        ];
        for (error, want) in rows {
            assert_eq!(reason(&error), want, "{error:?}");
        }
        assert_eq!(check("{}").reason, CheckReason::Misconfigured);
    }

    #[test]
    fn a_silent_connection_is_named_with_the_time_it_had() {
        let result = failed("hv2", LibvirtError::Timeout);
        assert_eq!(result.reason, CheckReason::Unreachable);
        assert_eq!(result.message, "connection hv2: did not answer within 20 s");
        const { assert!(PROBE_TIMEOUT_MS < 30_000, "below check's deadline") };
    }
}
