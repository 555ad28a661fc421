//! `check`: can the provider reach each of its hypervisors and use its pool there, on fresh
//! connections (not the host's pool, so a dead hypervisor is not hidden by a pooled connection)?
//! The first connection that fails, in list order, is the answer, named in the message: create
//! needs every one of them to answer.

use crate::config::Config;
use crate::egress::libvirt::libvirt::{Connection, Error as LibvirtError};
use crate::egress::provider::types::{CheckReason, CheckResult};

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

fn failed(connection: &str, what: &str, error: LibvirtError) -> CheckResult {
    CheckResult {
        reason: reason(&error),
        message: format!("connection {connection}: {what}: {error:?}"),
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
    let mut answers = Vec::with_capacity(config.connections.len());
    for name in &config.connections {
        match check_one(&config.pool, name) {
            Ok(answer) => answers.push(answer),
            Err(failed) => return failed,
        }
    }
    CheckResult {
        reason: CheckReason::Ok,
        message: answers.join("; "),
    }
}

/// One connection: its daemon's version and the pool's space, or the first failure.
fn check_one(pool: &str, name: &str) -> Result<String, CheckResult> {
    let connection = Connection::open_unpooled(name)
        .map_err(|error| failed(name, "open the connection", error))?;
    let version = connection
        .version()
        .map_err(|error| failed(name, "ask the hypervisor its version", error))?;
    let info = connection
        .storage_pool(pool)
        .and_then(|pool| pool.info())
        .map_err(|error| failed(name, &format!("pool {pool}"), error))?;
    Ok(format!(
        "{name}: libvirt {version}; pool {pool} has {} of {} bytes available",
        info.available, info.capacity
    ))
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
}
