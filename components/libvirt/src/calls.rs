//! Every capability call goes through here, and so does every operation's outcome: each is
//! logged through the host's `egress:log`, which adds the provider, its version, the operation
//! and the Proxy to every line.
//!
//! * One `debug` line per capability call that reaches libvirt: what it was for (`call`), the VM,
//!   the connection, how it ended (`outcome`: `ok`, or the error and libvirt's message) and how
//!   long it took (`ms`). kvm2 logged every call (K35); a create that is slow or fails on one
//!   hypervisor shows which call, where, and how long it waited.
//! * One `info` line per operation: the VM, how it ended (`outcome`) and how long it took.
//!
//! No line holds a secret: the provider never holds a URI, a key or an image's bytes, the host's
//! errors name none, and a seed's user-data is never part of a message.

use std::cell::RefCell;

use crate::egress::libvirt::libvirt::Error as LibvirtError;
use crate::egress::log::log::{Field, Level, emit};
use crate::egress::provider::types::{CheckResult, Error};

/// The operation this instance runs: each call of the provider runs in a fresh instance.
struct Operation {
    /// The VM it is about (empty for `list-by-tag` and `check`).
    vm: String,
    /// When it started, on the monotonic clock.
    started_ms: u64,
}

thread_local! {
    static OPERATION: RefCell<Operation> = const {
        RefCell::new(Operation {
            vm: String::new(),
            started_ms: 0,
        })
    };
}

/// Starts an operation on `vm` (empty when it is about no one VM).
pub fn begin(vm: &str) {
    let started_ms = egress_guest::time::monotonic_ms();
    OPERATION.with_borrow_mut(|operation| {
        operation.vm = vm.to_owned();
        operation.started_ms = started_ms;
    });
}

/// Runs one capability call on `connection` for `what`, and logs it.
pub fn call<T>(
    connection: &str,
    what: &str,
    run: impl FnOnce() -> Result<T, LibvirtError>,
) -> Result<T, LibvirtError> {
    let started_ms = egress_guest::time::monotonic_ms();
    let result = run();
    let ms = egress_guest::time::monotonic_ms().saturating_sub(started_ms);
    let outcome = match &result {
        Ok(_) => "ok".to_owned(),
        Err(error) => failure(error),
    };
    log(
        Level::Debug,
        "libvirt call",
        &[
            ("call", what),
            ("connection", connection),
            ("outcome", &outcome),
            ("ms", &ms.to_string()),
        ],
    );
    result
}

/// [`call`], its failure classified for `what` ([`crate::errors::classify`]).
pub fn at<T>(
    connection: &str,
    what: &str,
    run: impl FnOnce() -> Result<T, LibvirtError>,
) -> Result<T, Error> {
    call(connection, what, run).map_err(|error| crate::errors::classify(what, error))
}

/// [`call`] on one of several connections that must all answer, its failure classified so
/// ([`crate::errors::classify_on`]).
pub fn on<T>(
    connection: &str,
    what: &str,
    run: impl FnOnce() -> Result<T, LibvirtError>,
) -> Result<T, Error> {
    call(connection, what, run).map_err(|error| crate::errors::classify_on(connection, what, error))
}

/// Logs how the operation ended, at `info`; `done` says what a success made of.
pub fn finished<T>(result: Result<T, Error>, done: impl FnOnce(&T) -> String) -> Result<T, Error> {
    let outcome = match &result {
        Ok(value) => done(value),
        Err(error) => outcome(error),
    };
    end(&outcome);
    result
}

/// [`finished`] for `check`, whose outcome is a reason.
pub fn checked(result: CheckResult) -> CheckResult {
    end(&format!("{}: {}", result.reason.as_str(), result.message));
    result
}

/// Logs, at `warn`, a failure the operation goes on after.
pub fn warn(what: &str, error: &Error) {
    log(Level::Warn, what, &[("outcome", &outcome(error))]);
}

fn end(outcome: &str) {
    let started_ms = OPERATION.with_borrow(|operation| operation.started_ms);
    let ms = egress_guest::time::monotonic_ms().saturating_sub(started_ms);
    log(
        Level::Info,
        "libvirt operation finished",
        &[("outcome", outcome), ("ms", &ms.to_string())],
    );
}

/// Emits a line with `fields` and the operation's VM.
fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    let vm = OPERATION.with_borrow(|operation| operation.vm.clone());
    emit(level, message, &line_fields(&vm, fields));
}

/// The fields of a line: the VM first, when the operation is about one.
fn line_fields(vm: &str, fields: &[(&str, &str)]) -> Vec<Field> {
    let vm = (!vm.is_empty()).then_some(("vm", vm));
    vm.into_iter()
        .chain(fields.iter().copied())
        .map(|(key, value)| Field {
            key: key.to_owned(),
            value: value.to_owned(),
        })
        .collect()
}

/// A failed capability call as a line shows it.
pub fn failure(error: &LibvirtError) -> String {
    match error {
        LibvirtError::Denied(message) => format!("denied: {message}"),
        LibvirtError::Invalid(message) => format!("invalid: {message}"),
        LibvirtError::Timeout => "timeout".to_owned(),
        LibvirtError::CredentialsUnavailable(message) => {
            format!("credentials unavailable: {message}")
        }
        LibvirtError::SshAuth(message) => format!("ssh auth: {message}"),
        LibvirtError::HostKey(message) => format!("host key: {message}"),
        LibvirtError::ChecksumMismatch(message) => format!("checksum mismatch: {message}"),
        LibvirtError::Download(download) => format!(
            "download{}: {}",
            download
                .status
                .map(|status| format!(" (HTTP {status})"))
                .unwrap_or_default(),
            download.message
        ),
        LibvirtError::Libvirt(libvirt) => {
            format!("libvirt error {}: {}", libvirt.code, libvirt.message)
        }
    }
}

/// A failed operation as its line shows it: the class and the message.
pub fn outcome(error: &Error) -> String {
    match error {
        Error::Transient(message) => format!("transient: {message}"),
        Error::Permanent(message) => format!("permanent: {message}"),
        Error::NotFound(message) => format!("not-found: {message}"),
        Error::QuotaExceeded(message) => format!("quota-exceeded: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::libvirt::libvirt::{DownloadError, LibvirtError as Lv};
    use crate::egress::provider::types::{CheckReason, VmState};

    #[test]
    fn lines_name_the_vm_first_and_only_when_there_is_one() {
        let keys = |vm: &str| -> Vec<String> {
            line_fields(vm, &[("call", "look up the domain"), ("ms", "3")])
                .into_iter()
                .map(|field| format!("{}={}", field.key, field.value))
                .collect()
        };
        assert_eq!(
            keys("proxy-a"),
            ["vm=proxy-a", "call=look up the domain", "ms=3"]
        );
        assert_eq!(keys(""), ["call=look up the domain", "ms=3"]);
    }

    #[test]
    fn failures_and_outcomes_read_as_their_kind_and_message() {
        let rows = [
            (LibvirtError::Timeout, "timeout"),
            (LibvirtError::Denied("pool x".into()), "denied: pool x"),
            (
                LibvirtError::Libvirt(Lv {
                    code: 42,
                    domain: 10,
                    message: "Domain not found".into(),
                }),
                "libvirt error 42: Domain not found",
            ),
            (
                LibvirtError::Download(DownloadError {
                    status: Some(503),
                    retryable: true,
                    message: "busy".into(),
                }),
                "download (HTTP 503): busy",
            ),
        ];
        for (error, want) in rows {
            assert_eq!(failure(&error), want);
        }
        assert_eq!(
            outcome(&Error::QuotaExceeded("pool full".into())),
            "quota-exceeded: pool full"
        );
        assert_eq!(VmState::Provisioning.as_str(), "provisioning");
        assert_eq!(
            CheckReason::CertificateInvalid.as_str(),
            "certificate-invalid"
        );
    }
}
