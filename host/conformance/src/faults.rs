//! Rules that need the backend to fail on purpose: a 5xx, a reset, a body cut off, a busy VM, an
//! endpoint that never answers. The faults are injected at the broker ([`egress_tap::Faults`] on
//! the rule's calls, `Session::with_tap`), so they run against any backend a provider reaches
//! over HTTP; a provider without an HTTP grant (libvirt) has nothing to fault there and skips.

use std::sync::Arc;
use std::time::Duration;

use egress_runtime::egress::{Egress, EgressFuture};
use egress_runtime::types::{CheckReason, Vm};
use egress_runtime::{CallError, ErrorClass, Operation, Outgoing, Tap, VmState};
use egress_tap::{Fault, Faults, Which};

use super::{Outcome, RuleResult, Session, outcome};

/// Why a fault rule skips a provider without an HTTP grant.
const NO_HTTP_GRANT: &str = "needs a provider that reaches its backend over HTTP: faults are injected at the HTTP broker, and the provider has no http grant";

/// How long a body that stops midway stalls before it fails. Short: the rule judges the
/// classification, not the wait, and every call of the rule sees it.
const BODY_STALL: Duration = Duration::from_secs(1);

/// The failures every request of a call gets in turn, in `faults.server-error-transient`: each
/// leaves the provider without an answer it can use, which is `transient`. A body cut off comes
/// after the backend acted: a create under it may make a VM, which the run's clean-up deletes.
const FAILING_BACKEND: [(Fault, &str); 4] = [
    (Fault::Status(500), "a 500 on every request"),
    (Fault::Status(503), "a 503 on every request"),
    (Fault::Reset, "a connection reset on every request"),
    (
        Fault::SlowBody,
        "every response's body stopping midway and failing",
    ),
];

/// `faults.server-error-transient`
pub(crate) async fn server_error_transient(session: &Session) -> Outcome {
    if session.http_grant().is_none() {
        return Outcome::Skip(NO_HTTP_GRANT.to_owned());
    }
    let (name, uid, tag) = (
        session.name("fault5xx"),
        session.uid(),
        session.tag("fault5xx"),
    );
    let created = match session.create(&name, &uid, &tag).await {
        Ok(created) => created,
        Err(reason) => return Outcome::Fail(reason),
    };
    let id = created.provider_id.as_str();
    let mut result = Ok(());
    for (fault, what) in FAILING_BACKEND {
        let faults = Faults::new(fault, Which::All, BODY_STALL);
        let _tap = session.with_tap(faults.clone());
        let other = session.name("fault5xx-b");
        let under = Under {
            faults: &faults,
            what,
        };
        result = async {
            under
                .transient(session, Operation::Get, async {
                    session.get(id).await.map(drop)
                })
                .await?;
            under
                .transient(session, Operation::Create, async {
                    session.try_create(&other, &uid, &tag).await.map(drop)
                })
                .await?;
            under
                .transient(session, Operation::ListByTag, async {
                    session.list(&tag).await.map(drop)
                })
                .await?;
            under
                .transient(session, Operation::Delete, session.try_delete(id))
                .await
        }
        .await;
        if result.is_err() {
            break;
        }
    }
    finish(session, id, result).await
}

/// The status a busy VM's requests answer in `faults.lock-transient`: the backend is there and
/// answers, but not for this VM now.
const BUSY: u16 = 503;

/// `faults.lock-transient`: the backend-neutral form of a VM locked by a task. Every request
/// whose path names the VM answers 503; the rest (listings, lookups by name) reach the backend.
/// A provider that reads the VM as gone because its own requests failed would have the operator
/// make a second VM.
pub(crate) async fn lock_transient(session: &Session) -> Outcome {
    if session.http_grant().is_none() {
        return Outcome::Skip(NO_HTTP_GRANT.to_owned());
    }
    let (name, uid, tag) = (session.name("locked"), session.uid(), session.tag("locked"));
    let created = match session.create(&name, &uid, &tag).await {
        Ok(created) => created,
        Err(reason) => return Outcome::Fail(reason),
    };
    let id = created.provider_id.as_str();
    let faults = Faults::new(Fault::Status(BUSY), Which::All, BODY_STALL);
    let busy = AboutVm::new(id, &name, faults.clone());
    let names = busy.names();
    let tap = session.with_tap(Arc::new(busy));
    let got = session.get(id).await;
    if faults.injected() == 0 {
        drop(tap);
        // A failure here is left to the run's clean-up, which deletes every VM it made.
        let _ = session.delete(id).await;
        return Outcome::Skip(format!(
            "get {id} sent no request whose path names the VM ({names}): the suite cannot tell the VM's own requests from the others"
        ));
    }
    let deleted = session.try_delete(id).await;
    drop(tap);
    let text = |error: &CallError| session.error_text(error);
    let result = busy_get(id, got, &text).and(busy_delete(id, deleted, &text));
    finish(session, id, result).await
}

/// `faults.check-hung-endpoint`: no request is answered. It fails when the broker would give up
/// on a response that never comes, the grant's first-byte timeout (or the provider's own
/// shorter one): check must answer `unreachable` before its deadline.
pub(crate) async fn check_hung_endpoint(session: &Session) -> Outcome {
    let Some(grant) = session.http_grant() else {
        return Outcome::Skip(NO_HTTP_GRANT.to_owned());
    };
    let deadline = session.provider().limits().deadline_for(Operation::Check);
    let first_byte = grant.timeouts.first_byte();
    let faults = Faults::new(Fault::NoResponse, Which::All, first_byte);
    let _tap = session.with_tap(faults.clone());
    let result = match session.check(&session.config_text()).await {
        Ok(result) if result.reason == CheckReason::Unreachable => Ok(()),
        Ok(result) if faults.injected() == 0 => Err(format!(
            "check answered {} without sending a request; it must try the backend",
            result.reason.as_str()
        )),
        Ok(result) => Err(format!(
            "check against an endpoint that does not answer answered {}: {}; expected unreachable",
            result.reason.as_str(),
            session.scrub(&result.message)
        )),
        Err(error) => Err(format!(
            "check against an endpoint that does not answer ended with an error ({}); it must answer unreachable before its deadline of {deadline:?}, and the broker gives up on a response after the grant's first-byte timeout of {first_byte:?}: leave it room (the grant's timeouts.firstByteMs, the provider's own request timeouts)",
            session.error_text(&error)
        )),
    };
    outcome(result)
}

/// One fault on every request of the rule's calls, and what it is in words.
struct Under<'a> {
    faults: &'a Faults,
    what: &'a str,
}

impl Under<'_> {
    /// The call's outcome must be a `transient` error.
    async fn transient(
        &self,
        session: &Session,
        operation: Operation,
        call: impl Future<Output = Result<(), CallError>>,
    ) -> RuleResult {
        let before = self.faults.injected();
        let outcome = call.await;
        let faulted = self.faults.injected() > before;
        let text = |error: &CallError| session.error_text(error);
        transient(operation, self.what, outcome, faulted, &text)
    }
}

/// How a rule shows a provider's error: `class: message`, credentials scrubbed.
type ErrorText<'a> = &'a dyn Fn(&CallError) -> String;

/// Under `what`, `operation` must answer a `transient` error; `faulted`: whether any of its
/// requests met the fault.
fn transient(
    operation: Operation,
    what: &str,
    outcome: Result<(), CallError>,
    faulted: bool,
    text: ErrorText,
) -> RuleResult {
    match outcome {
        Err(error) if error.class() == ErrorClass::Transient => Ok(()),
        Ok(()) if !faulted => Err(format!(
            "{operation} succeeded without sending a request, so {what} could not reach it; it must ask the backend"
        )),
        Ok(()) => Err(format!("{operation} succeeded under {what}")),
        Err(error) => Err(format!(
            "{operation} under {what} answered {}; expected transient",
            text(&error)
        )),
    }
}

/// get of a busy VM: `provisioning` or `transient`, never `not-found` (nor any other answer).
fn busy_get(id: &str, outcome: Result<Vm, CallError>, text: ErrorText) -> RuleResult {
    match outcome {
        Ok(instance) if instance.state == VmState::Provisioning => Ok(()),
        Err(error) if error.class() == ErrorClass::Transient => Ok(()),
        Ok(instance) => Err(format!(
            "get {id} of a busy VM (its own requests answered {BUSY}) answered {:?}; expected provisioning or transient",
            instance.state
        )),
        Err(error) => Err(format!(
            "get {id} of a busy VM (its own requests answered {BUSY}) answered {}; a VM in the middle of a task is never not-found, and busy is transient",
            text(&error)
        )),
    }
}

/// delete of a busy VM: `transient`.
fn busy_delete(id: &str, outcome: Result<(), CallError>, text: ErrorText) -> RuleResult {
    match outcome {
        Err(error) if error.class() == ErrorClass::Transient => Ok(()),
        Ok(()) => Err(format!(
            "delete {id} succeeded while every request naming the VM answered {BUSY}"
        )),
        Err(error) => Err(format!(
            "delete {id} of a busy VM (its own requests answered {BUSY}) answered {}; expected transient",
            text(&error)
        )),
    }
}

/// Gives its fault to the requests whose path names one VM (a path segment equal to its name or
/// to the last segment of its provider ID: `/vms/7` for `inv/7`, `…/qemu/104/…` for
/// `pv1-1/104`) and sends the others on.
#[derive(Debug)]
struct AboutVm {
    segments: Vec<String>,
    faults: Arc<Faults>,
}

impl AboutVm {
    fn new(provider_id: &str, name: &str, faults: Arc<Faults>) -> AboutVm {
        let id = provider_id.rsplit(['/', ':']).next().unwrap_or(provider_id);
        let mut segments = vec![id.to_owned(), name.to_owned()];
        segments.retain(|segment| !segment.is_empty());
        segments.dedup();
        AboutVm { segments, faults }
    }

    /// The segments, for a message.
    fn names(&self) -> String {
        self.segments.join(" or ")
    }
}

impl Tap for AboutVm {
    fn send(&self, outgoing: Outgoing<'_>, next: &Arc<dyn Egress>) -> EgressFuture {
        let names_the_vm = outgoing
            .request
            .uri()
            .path()
            .split('/')
            .any(|segment| self.segments.iter().any(|ours| ours == segment));
        if names_the_vm {
            self.faults.send(outgoing, next)
        } else {
            outgoing.send_to(next)
        }
    }
}

/// Deletes the rule's VM once the faults are gone; the rule's result comes first.
async fn finish(session: &Session, id: &str, result: RuleResult) -> Outcome {
    let deleted = session.delete(id).await;
    outcome(result.and(deleted))
}

#[cfg(test)]
mod tests {
    use egress_runtime::types::ProviderError;

    use super::*;

    fn text(error: &CallError) -> String {
        format!("{}: {error}", error.class().as_str())
    }

    fn failed(class: fn(String) -> ProviderError) -> Result<(), CallError> {
        Err(CallError::Provider(class("injected".into())))
    }

    fn vm(state: VmState) -> Result<Vm, CallError> {
        Ok(Vm {
            provider_id: "inv/7".into(),
            name: "conformance-x-locked".into(),
            uid: "u".into(),
            state,
            addresses: Vec::new(),
            created_at: None,
            host: None,
        })
    }

    #[test]
    fn under_a_failing_backend_only_transient_passes() {
        let judge = |outcome, faulted| {
            transient(
                Operation::Get,
                "a 500 on every request",
                outcome,
                faulted,
                &text,
            )
        };
        assert_eq!(judge(failed(ProviderError::Transient), true), Ok(()));
        for class in [
            ProviderError::Permanent,
            ProviderError::NotFound,
            ProviderError::QuotaExceeded,
        ] {
            let reason = judge(failed(class), true).unwrap_err();
            assert!(reason.contains("expected transient"), "{reason}");
        }
        let trap = Err(CallError::Trap {
            message: "unreachable".into(),
        });
        assert!(judge(trap, true).is_err());
        let succeeded = judge(Ok(()), true).unwrap_err();
        assert_eq!(succeeded, "get succeeded under a 500 on every request");
        let never_asked = judge(Ok(()), false).unwrap_err();
        assert!(
            never_asked.contains("without sending a request"),
            "{never_asked}"
        );
    }

    #[test]
    fn a_busy_vm_is_never_not_found() {
        assert_eq!(busy_get("inv/7", vm(VmState::Provisioning), &text), Ok(()));
        let transient = failed(ProviderError::Transient).map(|()| unreachable!());
        assert_eq!(busy_get("inv/7", transient, &text), Ok(()));
        let gone = failed(ProviderError::NotFound).map(|()| unreachable!());
        let reason = busy_get("inv/7", gone, &text).unwrap_err();
        assert!(reason.contains("never not-found"), "{reason}");
        assert!(busy_get("inv/7", vm(VmState::Running), &text).is_err());
        assert!(busy_get("inv/7", vm(VmState::Stopped), &text).is_err());

        assert_eq!(
            busy_delete("inv/7", failed(ProviderError::Transient), &text),
            Ok(())
        );
        assert!(busy_delete("inv/7", Ok(()), &text).is_err());
        assert!(busy_delete("inv/7", failed(ProviderError::Permanent), &text).is_err());
        assert!(busy_delete("inv/7", failed(ProviderError::NotFound), &text).is_err());
    }

    #[test]
    fn a_busy_vm_is_named_by_its_id_segment_or_its_name() {
        let faults = Faults::new(Fault::Status(BUSY), Which::All, BODY_STALL);
        let proxmox = AboutVm::new("pv1-1/104", "conformance-x-locked", faults.clone());
        assert_eq!(proxmox.segments, ["104", "conformance-x-locked"]);
        let inventory = AboutVm::new("inv/7", "conformance-x-locked", faults);
        assert_eq!(inventory.names(), "7 or conformance-x-locked");
    }
}
