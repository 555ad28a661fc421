//! `check`: can the provider reach its hypervisor and use its pool, on a fresh connection (not
//! the host's pool, so a dead hypervisor is not hidden by a pooled connection)?

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

fn failed(what: &str, error: LibvirtError) -> CheckResult {
    CheckResult {
        reason: reason(&error),
        message: format!("{what}: {error:?}"),
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
    let connection = match Connection::open_unpooled(&config.connection) {
        Ok(connection) => connection,
        Err(error) => return failed("open the connection", error),
    };
    let version = match connection.version() {
        Ok(version) => version,
        Err(error) => return failed("ask the hypervisor its version", error),
    };
    let info = match connection
        .storage_pool(&config.pool)
        .and_then(|pool| pool.info())
    {
        Ok(info) => info,
        Err(error) => return failed(&format!("pool {}", config.pool), error),
    };
    CheckResult {
        reason: CheckReason::Ok,
        message: format!(
            "libvirt {version}; pool {} has {} of {} bytes available",
            config.pool, info.available, info.capacity
        ),
    }
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
