//! Rules that need the backend to fail on purpose: a 5xx, a locked VM, an endpoint that never
//! answers. They run when the backend is `pvesim`, whose faults the suite sets through its admin
//! API, and are skipped otherwise.

use std::time::Duration;

use egress_runtime::types::CheckReason;
use egress_runtime::{CallError, ErrorClass, Operation, VmState};

use super::backend::Pvesim;
use super::{Outcome, RuleResult, Session, outcome};

const NOT_PVESIM: &str =
    "needs a backend fault; the backend is not pvesim (no /_sim/info on the grant's origins)";

/// `faults.server-error-transient`
pub(crate) async fn server_error_transient(session: &Session) -> Outcome {
    let Some(backend) = session.backend() else {
        return Outcome::Skip(NOT_PVESIM.to_owned());
    };
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
    let result = with_faults(
        backend,
        &["* /** always status=500:conformance: injected server error"],
        async {
            let other = session.name("fault5xx-b");
            transient(session, Operation::Get, session.get(id).await.map(drop))?;
            transient(
                session,
                Operation::Create,
                session.try_create(&other, &uid, &tag).await.map(drop),
            )?;
            transient(
                session,
                Operation::ListByTag,
                session.list(&tag).await.map(drop),
            )?;
            transient(session, Operation::Delete, session.try_delete(id).await)
        },
    )
    .await;
    finish(session, id, result).await
}

/// `faults.lock-transient`
pub(crate) async fn lock_transient(session: &Session) -> Outcome {
    let Some(backend) = session.backend() else {
        return Outcome::Skip(NOT_PVESIM.to_owned());
    };
    let (name, uid, tag) = (session.name("locked"), session.uid(), session.tag("locked"));
    let created = match session.create(&name, &uid, &tag).await {
        Ok(created) => created,
        Err(reason) => return Outcome::Fail(reason),
    };
    let id = created.provider_id.as_str();
    // Every request about a VM answers Proxmox's lock timeout (a 500 naming the lock file).
    let result = with_faults(backend, &["* /nodes/*/qemu/** always lock"], async {
        match session.get(id).await {
            Ok(instance) if instance.state == VmState::Provisioning => {}
            Err(error) if error.class() == ErrorClass::Transient => {}
            Ok(instance) => {
                return Err(format!(
                    "get {id} of a locked VM answered {:?}; expected provisioning or transient",
                    instance.state
                ));
            }
            Err(error) => {
                return Err(format!(
                    "get {id} of a locked VM answered {}; a VM in the middle of a task is never not-found, and a lock is transient",
                    session.error_text(&error)
                ));
            }
        }
        transient(session, Operation::Delete, session.try_delete(id).await)
    })
    .await;
    finish(session, id, result).await
}

/// `faults.check-hung-endpoint`
pub(crate) async fn check_hung_endpoint(session: &Session) -> Outcome {
    let Some(backend) = session.backend() else {
        return Outcome::Skip(NOT_PVESIM.to_owned());
    };
    let deadline = session.provider().limits().deadline_for(Operation::Check);
    // Answers arrive only after the deadline: the provider must give up on its own before.
    let delay = deadline + Duration::from_secs(2);
    let rule = format!("* /** always delay={}", delay.as_millis());
    let result = with_faults(backend, &[rule.as_str()], async {
        match session.check(&session.config_text()).await {
            Ok(result) if result.reason == CheckReason::Unreachable => Ok(()),
            Ok(result) => Err(format!(
                "check against an endpoint that does not answer answered {}: {}; expected unreachable",
                result.reason.as_str(),
                session.scrub(&result.message)
            )),
            Err(error) => Err(format!(
                "check against an endpoint that does not answer ended with an error ({}); it must answer unreachable before its deadline of {deadline:?}: leave it room (the grant's timeouts.firstByteMs, the provider's own request timeouts)",
                session.error_text(&error)
            )),
        }
    })
    .await;
    outcome(result)
}

/// Runs `body` with `rules` set, and clears them whatever happens.
async fn with_faults(
    backend: &Pvesim,
    rules: &[&str],
    body: impl Future<Output = RuleResult>,
) -> RuleResult {
    backend.add_faults(rules).await?;
    let result = body.await;
    backend.clear_faults().await?;
    result
}

/// The outcome must be a `transient` error.
fn transient(
    session: &Session,
    operation: Operation,
    outcome: Result<(), CallError>,
) -> RuleResult {
    match outcome {
        Err(error) if error.class() == ErrorClass::Transient => Ok(()),
        Ok(()) => Err(format!(
            "{operation} succeeded while every backend request failed"
        )),
        Err(error) => Err(format!(
            "{operation} under a backend fault answered {}; expected transient",
            session.error_text(&error)
        )),
    }
}

/// Deletes the rule's VM once the faults are gone; the rule's result comes first.
async fn finish(session: &Session, id: &str, result: RuleResult) -> Outcome {
    let deleted = session.delete(id).await;
    outcome(result.and(deleted))
}
