//! The operations on real VMs: the lifecycle, create's idempotence and ownership, get's
//! not-found. Each rule makes its own VMs under fresh names, UIDs and tags, and deletes them.

use egress_runtime::types::Vm;
use egress_runtime::{ErrorClass, VmState};

use super::backend::{NO_STOP_HOOK, Origin, Stop};
use super::{Outcome, RuleResult, Session, outcome};

/// `lifecycle.create-get-list-delete`
pub(crate) async fn create_get_list_delete(session: &Session) -> Outcome {
    outcome(lifecycle(session).await)
}

async fn lifecycle(session: &Session) -> RuleResult {
    let (name, uid, tag) = (session.name("life"), session.uid(), session.tag("life"));
    let created = session.create(&name, &uid, &tag).await?;
    same_vm(&created, &name, &uid, "create")?;
    let id = created.provider_id.as_str();
    let running = session.wait_running(id).await?;
    same_vm(&running, &name, &uid, "get")?;
    if running.provider_id != id {
        return Err(format!(
            "get {id} answered provider ID {}",
            running.provider_id
        ));
    }
    if running.addresses.is_empty() {
        return Err(format!(
            "get {id} answered running with no address; running means reachable at its addresses"
        ));
    }
    let listed = session
        .list(&tag)
        .await
        .map_err(|error| format!("list-by-tag: {}", session.error_text(&error)))?;
    if !listed.iter().any(|instance| instance.provider_id == id) {
        return Err(format!(
            "list-by-tag {}={} answered [{}], without {id} which create was given that tag",
            tag.key,
            tag.value,
            ids(&listed)
        ));
    }
    session.delete(id).await?;
    match session.get(id).await {
        Err(error) if error.class() == ErrorClass::NotFound => {}
        Ok(instance) => {
            return Err(format!(
                "get {id} after delete still finds it ({:?}); a VM that is gone is not-found",
                instance.state
            ));
        }
        Err(error) => {
            return Err(format!(
                "get {id} after delete answered {}; a VM that is gone is not-found",
                session.error_text(&error)
            ));
        }
    }
    session
        .delete(id)
        .await
        .map_err(|error| format!("a repeat delete must succeed: {error}"))
}

/// `create.idempotent`
pub(crate) async fn create_idempotent(session: &Session) -> Outcome {
    outcome(idempotent(session).await)
}

async fn idempotent(session: &Session) -> RuleResult {
    let (name, uid, tag) = (session.name("again"), session.uid(), session.tag("again"));
    let before = count(session, &tag).await?;
    let first = session.create(&name, &uid, &tag).await?;
    let second = session.create(&name, &uid, &tag).await?;
    if first.provider_id != second.provider_id {
        return Err(format!(
            "a second create of {name} with the same UID answered {}, the first {}: a duplicate VM",
            second.provider_id, first.provider_id
        ));
    }
    let after = count(session, &tag).await?;
    if after != before + 1 {
        return Err(format!(
            "list-by-tag counts {after} VMs after two creates of one name (before: {before}); expected {}",
            before + 1
        ));
    }
    if let Some(pvesim) = session.pvesim() {
        let named = pvesim.vms_named(&name).await?;
        if named != 1 {
            return Err(format!(
                "pvesim holds {named} VMs named {name} after two creates"
            ));
        }
    }
    session.delete(&first.provider_id).await
}

/// `create.starts-stopped`: the operator restarts a VM that stopped by calling `create` again,
/// so create of a stopped VM of its own must start it, not just find it. The VM is stopped through
/// the backend's test-backend hook (`backend.rs`), outside the provider's API.
pub(crate) async fn create_starts_stopped(session: &Session) -> Outcome {
    let hook = match stop_hook(session).await {
        Ok(Some(origin)) => origin,
        Ok(None) => return Outcome::Skip(no_hook_reason(session)),
        Err(reason) => return Outcome::Fail(reason),
    };
    outcome(starts_stopped(session, hook).await)
}

/// The first origin whose stop hook answers, asked to stop a VM no backend has (the run's name
/// for none): the hook answers "no such VM", anything else has no hook.
async fn stop_hook(session: &Session) -> Result<Option<&Origin>, String> {
    let nobody = session.name("no-such-vm");
    for origin in session.origins() {
        match origin.stop(&nobody).await? {
            Stop::NoSuchVm(_) => return Ok(Some(origin)),
            Stop::NoHook(_) => {}
            Stop::Stopped => {
                return Err(format!(
                    "the stop hook answered 200 for {nobody}, a VM nobody made; it must answer 404"
                ));
            }
        }
    }
    Ok(None)
}

fn no_hook_reason(session: &Session) -> String {
    if session.origins().is_empty() {
        format!("{NO_STOP_HOOK}: the provider has no http grant to reach one")
    } else {
        format!("{NO_STOP_HOOK}: no origin of the grant has it")
    }
}

async fn starts_stopped(session: &Session, hook: &Origin) -> RuleResult {
    let (name, uid, tag) = (
        session.name("restart"),
        session.uid(),
        session.tag("restart"),
    );
    let created = session.create(&name, &uid, &tag).await?;
    let id = created.provider_id.clone();
    session.wait_running(&id).await?;
    match hook.stop(&name).await? {
        Stop::Stopped => {}
        Stop::NoSuchVm(said) | Stop::NoHook(said) => {
            return Err(format!(
                "the stop hook did not stop {name}, which create answered as {id}: {said}"
            ));
        }
    }
    let stopped = session
        .get(&id)
        .await
        .map_err(|error| format!("get {id} of the stopped VM: {}", session.error_text(&error)))?;
    if stopped.state != VmState::Stopped {
        return Err(format!(
            "get {id} answered {:?} for a VM stopped on its host; expected stopped",
            stopped.state
        ));
    }
    let again = session.create(&name, &uid, &tag).await?;
    if again.provider_id != id {
        return Err(format!(
            "create of the stopped VM {id} answered {}: it must adopt and start it, not make another",
            again.provider_id
        ));
    }
    session
        .wait_running(&id)
        .await
        .map_err(|error| format!("create of the stopped VM {id} did not start it: {error}"))?;
    session.delete(&id).await
}

/// `create.foreign-uid-permanent`
pub(crate) async fn create_foreign_uid_permanent(session: &Session) -> Outcome {
    outcome(foreign_uid(session).await)
}

async fn foreign_uid(session: &Session) -> RuleResult {
    let (name, ours, tag) = (session.name("taken"), session.uid(), session.tag("taken"));
    let first = session.create(&name, &ours, &tag).await?;
    let theirs = session.uid();
    match session.try_create(&name, &theirs, &tag).await {
        Err(error) if error.class() == ErrorClass::Permanent => {}
        Ok(instance) => {
            return Err(format!(
                "create of {name} with another UID answered {} (uid {:?}); a VM with our name but another UID is permanent",
                instance.provider_id, instance.uid
            ));
        }
        Err(error) => {
            return Err(format!(
                "create of {name} with another UID answered {}; expected permanent",
                session.error_text(&error)
            ));
        }
    }
    let kept = session.get(&first.provider_id).await.map_err(|error| {
        format!(
            "get {} after the refused create: {}",
            first.provider_id,
            session.error_text(&error)
        )
    })?;
    if kept.uid != ours {
        return Err(format!(
            "after the refused create, {} carries UID {:?}, not the first create's",
            first.provider_id, kept.uid
        ));
    }
    let listed = count(session, &tag).await?;
    if listed != 1 {
        return Err(format!(
            "list-by-tag counts {listed} VMs after the refused create; expected 1"
        ));
    }
    session.delete(&first.provider_id).await
}

/// `get.unknown-not-found`
pub(crate) async fn get_unknown_not_found(session: &Session) -> Outcome {
    outcome(unknown(session).await)
}

async fn unknown(session: &Session) -> RuleResult {
    let (name, uid, tag) = (session.name("gone"), session.uid(), session.tag("gone"));
    let created = session.create(&name, &uid, &tag).await?;
    let id = created.provider_id;
    session.delete(&id).await?;
    match session.get(&id).await {
        Err(error) if error.class() == ErrorClass::NotFound => Ok(()),
        Ok(instance) => Err(format!(
            "get {id} of a deleted VM answered {:?}",
            instance.state
        )),
        Err(error) => Err(format!(
            "get {id} of a deleted VM answered {}; expected not-found (the operator creates again on not-found only)",
            session.error_text(&error)
        )),
    }
}

/// The instance is the VM asked for: its name and the UID of its mark.
fn same_vm(instance: &Vm, name: &str, uid: &str, operation: &str) -> RuleResult {
    if instance.provider_id.is_empty() {
        return Err(format!("{operation} answered an empty provider ID"));
    }
    if instance.name != name {
        return Err(format!(
            "{operation} answered name {:?} for {name:?}",
            instance.name
        ));
    }
    if instance.uid != uid {
        return Err(format!(
            "{operation} answered UID {:?}; the mark carries {uid:?}",
            instance.uid
        ));
    }
    if operation == "create" && instance.state == VmState::Failed {
        return Err("create answered a failed VM".to_owned());
    }
    Ok(())
}

async fn count(session: &Session, tag: &egress_runtime::types::Tag) -> Result<usize, String> {
    session
        .list(tag)
        .await
        .map(|listed| listed.len())
        .map_err(|error| format!("list-by-tag: {}", session.error_text(&error)))
}

fn ids(instances: &[Vm]) -> String {
    instances
        .iter()
        .map(|instance| instance.provider_id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
