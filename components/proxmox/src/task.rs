//! Tasks and waits: UPID parsing (notes A2), polling a task to its end, waiting out a VM lock and
//! waiting for a started VM to run. Every wait blocks on the monotonic clock between polls (no
//! busy loop) and gives up as `transient` when its budget is spent.

use crate::api::{Io, Pve, TaskStatus, VmConfig, VmStatus};
use crate::egress::provider::types::Error;
use crate::errors::{classify, is_permission_failure};

/// A parsed UPID: `UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:` (notes A2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upid {
    pub node: String,
    pub kind: String,
    pub id: String,
    pub user: String,
}

fn hex_field(text: &str, lengths: std::ops::RangeInclusive<usize>) -> bool {
    lengths.contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parse a UPID. The node may hold `-`; `pstart` may have 9 hex digits; `id` may be empty
/// (`imgcopy`); `user` may be a token (`u@r!tok`).
pub fn parse_upid(text: &str) -> Result<Upid, String> {
    let bad = || format!("not a task id (UPID): {text:?}");
    let body = text
        .strip_prefix("UPID:")
        .and_then(|rest| rest.strip_suffix(':'))
        .ok_or_else(bad)?;
    let fields: Vec<&str> = body.splitn(7, ':').collect();
    let [node, pid, pstart, starttime, kind, id, user] = fields[..] else {
        return Err(bad());
    };
    let node_ok = !node.is_empty()
        && node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !node.starts_with('-')
        && !node.ends_with('-');
    let no_space = |s: &str| !s.contains(|c: char| c.is_whitespace() || c == ':');
    if !node_ok
        || !hex_field(pid, 8..=8)
        || !hex_field(pstart, 8..=9)
        || !hex_field(starttime, 8..=8)
        || kind.is_empty()
        || !no_space(kind)
        || !no_space(id)
        || user.is_empty()
        || !no_space(user)
    {
        return Err(bad());
    }
    Ok(Upid {
        node: node.into(),
        kind: kind.into(),
        id: id.into(),
        user: user.into(),
    })
}

/// Where a task is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskOutcome {
    Running,
    Succeeded,
    Failed(String),
}

/// Judge a task status (F16). `OK` and `WARNINGS: <n>` are success: Proxmox's own
/// `upid_status_is_error` says so, and a start that logged a warning must not make Create retry
/// forever (Phase 5 judgment).
pub fn task_outcome(status: &TaskStatus) -> TaskOutcome {
    if status.status == "running" {
        return TaskOutcome::Running;
    }
    match status.exitstatus.as_deref() {
        Some("OK") => TaskOutcome::Succeeded,
        Some(text)
            if text
                .strip_prefix("WARNINGS: ")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            TaskOutcome::Succeeded
        }
        Some(text) => TaskOutcome::Failed(text.to_string()),
        None if status.status == "stopped" => {
            TaskOutcome::Failed("task stopped without an exit status".into())
        }
        None => TaskOutcome::Running,
    }
}

/// What a config read says about a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockState {
    /// No lock: the config is settled.
    Unlocked,
    /// `lock: suspended`: a hibernated VM is not a task, so nobody waits on it (Phase 6 judgment).
    Suspended,
    /// Any other lock: a task holds the VM; wait (F7, correction 1).
    Held(String),
}

/// The lock a VM config (or status) carries.
pub fn lock_state(lock: Option<&str>) -> LockState {
    match lock {
        None | Some("") => LockState::Unlocked,
        Some("suspended") => LockState::Suspended,
        Some(other) => LockState::Held(other.to_string()),
    }
}

/// Where a VM is after a start (Phase 6): only `running`/`running` finishes the wait; `stopped`
/// after the start task ended is transient at once; anything else (prelaunch, …) keeps waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunProgress {
    Running,
    Waiting,
    Stopped,
}

/// Judge a status read during the wait for running.
pub fn run_progress(status: &VmStatus) -> RunProgress {
    match (status.status.as_str(), status.qmpstatus.as_deref()) {
        ("running", Some("running") | None) => RunProgress::Running,
        ("stopped", _) => RunProgress::Stopped,
        _ => RunProgress::Waiting,
    }
}

/// Call `step` until it answers `Some`, sleeping `pollMs` between calls; `transient` once
/// `budget_seconds` have passed.
pub fn poll_until<I: Io, T>(
    pve: &mut Pve<'_, I>,
    budget_seconds: u64,
    what: &str,
    mut step: impl FnMut(&mut Pve<'_, I>) -> Result<Option<T>, Error>,
) -> Result<T, Error> {
    let poll_ms = pve.config.poll_ms;
    let deadline = pve
        .io
        .monotonic_ms()
        .saturating_add(budget_seconds.saturating_mul(1_000));
    loop {
        if let Some(done) = step(pve)? {
            return Ok(done);
        }
        if pve.io.monotonic_ms().saturating_add(poll_ms) > deadline {
            return Err(Error::Transient(format!(
                "{what}: still not done after {budget_seconds} s"
            )));
        }
        pve.io.sleep_ms(poll_ms);
    }
}

/// Wait for the task `upid` to end, within the task budget (`budgets.cloneSeconds`). A failed
/// task is `transient` with its exit status, and logged; one that failed a permission check is
/// `permanent`, as the same check answered with a 403 is (F17): no retry grants the privilege.
pub fn wait_task<I: Io>(pve: &mut Pve<'_, I>, what: &str, upid: &str) -> Result<(), Error> {
    let parsed = parse_upid(upid).map_err(|why| Error::Transient(format!("{what}: {why}")))?;
    let budget = pve.config.clone_seconds;
    let outcome = poll_until(pve, budget, what, |pve| {
        let status = pve
            .task_status(&parsed.node, upid)
            .map_err(|error| classify(what, &error))?;
        Ok(match task_outcome(&status) {
            TaskOutcome::Running => None,
            done => Some(done),
        })
    })?;
    match outcome {
        TaskOutcome::Failed(exitstatus) => {
            pve.io.log(
                crate::api::LogLevel::Info,
                "proxmox task failed",
                &[("upid", upid), ("exitstatus", &exitstatus)],
            );
            let message = format!("{what}: task failed: {exitstatus}");
            if is_permission_failure(&exitstatus) {
                return Err(Error::Permanent(format!(
                    "{message} (the API token lacks a privilege: see docs/providers/proxmox.md)"
                )));
            }
            Err(Error::Transient(message))
        }
        _ => Ok(()),
    }
}

/// Wait for a task's answer when a call may run as a task (`Some(upid)`) or synchronously.
pub fn wait_optional_task<I: Io>(
    pve: &mut Pve<'_, I>,
    what: &str,
    upid: Option<String>,
) -> Result<(), Error> {
    match upid {
        Some(upid) => wait_task(pve, what, &upid),
        None => Ok(()),
    }
}

/// Read a VM's config until no task holds a lock on it, within the clone budget. Returns at once
/// on `suspended` (Phase 6 judgment). A VM that vanishes while we wait (a failed clone) answers
/// the F2 error so the caller decides (Phase 5).
pub fn wait_unlocked<I: Io>(
    pve: &mut Pve<'_, I>,
    node: &str,
    vmid: u32,
) -> Result<VmConfig, Error> {
    let what = format!("wait for VM {vmid} to be unlocked");
    let budget = pve.config.clone_seconds;
    poll_until(pve, budget, &what, |pve| {
        let config = pve
            .vm_config(node, vmid)
            .map_err(|error| classify(&format!("read config of VM {vmid}"), &error))?;
        Ok(match lock_state(config.get("lock").map(String::as_str)) {
            LockState::Held(_) => None,
            LockState::Unlocked | LockState::Suspended => Some(config),
        })
    })
}

/// Wait for a started VM to run, within `budgets.runningSeconds` (Phase 6).
pub fn wait_running<I: Io>(pve: &mut Pve<'_, I>, node: &str, vmid: u32) -> Result<(), Error> {
    let what = format!("wait for VM {vmid} to run");
    let budget = pve.config.running_seconds;
    poll_until(pve, budget, &what, |pve| {
        let status = pve
            .vm_status(node, vmid)
            .map_err(|error| classify(&format!("read status of VM {vmid}"), &error))?;
        match run_progress(&status) {
            RunProgress::Running => Ok(Some(())),
            RunProgress::Waiting => Ok(None),
            RunProgress::Stopped => Err(Error::Transient(format!(
                "VM {vmid} stopped right after it was started"
            ))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_a2_upid_parse_table() {
        let good = [
            (
                "UPID:pv1-1:0017C594:0ADB2769:63EC5455:imgcopy::root@pam!egress:",
                ("pv1-1", "imgcopy", "", "root@pam!egress"),
            ),
            (
                "UPID:pve:00303F51:109D93CFE:61CCA568:qmclone:9001:root@pam:",
                ("pve", "qmclone", "9001", "root@pam"),
            ),
            (
                "UPID:n:00000001:00000002:00000003:imgdel:199999@proxy-seeds:u@pve!t:",
                ("n", "imgdel", "199999@proxy-seeds", "u@pve!t"),
            ),
        ];
        for (text, (node, kind, id, user)) in good {
            let upid = parse_upid(text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                (
                    upid.node.as_str(),
                    upid.kind.as_str(),
                    upid.id.as_str(),
                    upid.user.as_str()
                ),
                (node, kind, id, user)
            );
        }
        let bad = [
            "",
            "UPID:pve:0017C594:0ADB2769:63EC5455:imgcopy::root@pam",
            "UPID:pve:17C594:0ADB2769:63EC5455:imgcopy::root@pam:",
            "UPID:pve:0017C594:0ADB2769:63EC5455::id:root@pam:",
            "UPID:pve:0017C594:0ADB2769:63EC5455:imgcopy:id::",
            "UPID:-pve:0017C594:0ADB2769:63EC5455:qmstart:1:root@pam:",
            "UPID:pve:0017C594:0ADB2769:63EC5455:qmstart:1:root@pam:extra:",
            "UPID:pv e:0017C594:0ADB2769:63EC5455:qmstart:1:root@pam:",
            "null",
        ];
        for text in bad {
            assert!(parse_upid(text).is_err(), "{text:?}");
        }
    }

    fn status(status: &str, exit: Option<&str>) -> TaskStatus {
        TaskStatus {
            status: status.into(),
            exitstatus: exit.map(String::from),
        }
    }

    #[test]
    fn f16_phase5_task_outcomes_warnings_are_success() {
        assert_eq!(task_outcome(&status("running", None)), TaskOutcome::Running);
        assert_eq!(
            task_outcome(&status("stopped", Some("OK"))),
            TaskOutcome::Succeeded
        );
        assert_eq!(
            task_outcome(&status("stopped", Some("WARNINGS: 2"))),
            TaskOutcome::Succeeded
        );
        assert_eq!(
            task_outcome(&status("stopped", Some("WARNINGS: many"))),
            TaskOutcome::Failed("WARNINGS: many".into())
        );
        assert_eq!(
            task_outcome(&status("stopped", Some("shrinking disks is not supported"))),
            TaskOutcome::Failed("shrinking disks is not supported".into())
        );
        assert!(matches!(
            task_outcome(&status("stopped", None)),
            TaskOutcome::Failed(_)
        ));
    }

    #[test]
    fn f7_phase6_wait_unlocked_table_never_waits_on_suspended() {
        assert_eq!(lock_state(None), LockState::Unlocked);
        assert_eq!(lock_state(Some("")), LockState::Unlocked);
        assert_eq!(lock_state(Some("suspended")), LockState::Suspended);
        assert_eq!(lock_state(Some("clone")), LockState::Held("clone".into()));
        assert_eq!(
            lock_state(Some("destroyed")),
            LockState::Held("destroyed".into())
        );
    }

    #[test]
    fn phase6_run_progress_only_running_running_finishes() {
        let s = |status: &str, qmp: Option<&str>| VmStatus {
            status: status.into(),
            qmpstatus: qmp.map(String::from),
            ..VmStatus::default()
        };
        assert_eq!(
            run_progress(&s("running", Some("running"))),
            RunProgress::Running
        );
        assert_eq!(run_progress(&s("running", None)), RunProgress::Running);
        assert_eq!(
            run_progress(&s("running", Some("prelaunch"))),
            RunProgress::Waiting
        );
        assert_eq!(
            run_progress(&s("running", Some("paused"))),
            RunProgress::Waiting
        );
        assert_eq!(
            run_progress(&s("stopped", Some("stopped"))),
            RunProgress::Stopped
        );
        assert_eq!(run_progress(&s("unknown", None)), RunProgress::Waiting);
    }
}
