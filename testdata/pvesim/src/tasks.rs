//! Task workers: each waits the configured latency, then applies its effect (or, under a
//! `TaskFails` fault, rolls back) and records the exitstatus: `OK`, `WARNINGS: n` or the error.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::api::{Server, TaskOverride, wait_for_flock};
use crate::model;
use crate::state::{Guest, GuestKind, Inner, RunState, Volume, unix_now};

/// What a task does when its latency has passed.
pub(crate) enum Work {
    Clone {
        newid: u32,
        config: BTreeMap<String, String>,
        /// Where the clone lives once done: the node that ran it, or its `target`.
        node: String,
    },
    Start {
        vmid: u32,
    },
    /// What a node runs at boot: start every guest of its own with `onboot=1` that is not
    /// running yet.
    StartAll,
    Stop {
        vmid: u32,
    },
    Pause {
        vmid: u32,
    },
    /// `suspend` with `todisk=1`: hibernate.
    Hibernate {
        vmid: u32,
    },
    Resume {
        vmid: u32,
    },
    Config {
        vmid: u32,
        previous: BTreeMap<String, String>,
    },
    Resize {
        vmid: u32,
        disk: String,
        size: String,
    },
    Destroy {
        vmid: u32,
    },
    Upload {
        volid: String,
        filename: String,
        bytes: Bytes,
    },
    DeleteVolume {
        volid: String,
    },
}

/// Runs one task to its end.
pub(crate) async fn run(
    server: Arc<Server>,
    upid: String,
    task_override: Option<TaskOverride>,
    work: Work,
) {
    let mut log = Vec::new();
    // F3: start (and stop) queue behind a clone's lock instead of failing; the worker takes the
    // config flock first and only then does its work.
    let flock = match &work {
        Work::Start { vmid } | Work::Stop { vmid } => {
            let waited = wait_for_flock(&server, *vmid).await;
            if matches!(waited, Ok(true)) {
                log.push("trying to acquire lock...".to_string());
                log.push(" OK".to_string());
            }
            waited.map(|_| ())
        }
        _ => Ok(()),
    };
    tokio::time::sleep(server.task_latency).await;
    let mut inner = server.state.lock();
    let node = inner
        .tasks
        .get(&upid)
        .map_or_else(|| inner.first_node().to_string(), |task| task.node.clone());
    let result = match (flock, &task_override) {
        (Err(timeout), _) => Err(timeout),
        (Ok(()), Some(TaskOverride::Fail(text))) => {
            roll_back(&mut inner, &work);
            Err(text.clone())
        }
        (Ok(()), _) => apply(&mut inner, &node, work, &mut log),
    };
    let exitstatus = match (result, task_override) {
        (Ok(()), Some(TaskOverride::Warnings(n))) => {
            log.extend((0..n).map(|i| format!("WARN: simulated warning {}", i + 1)));
            format!("WARNINGS: {n}")
        }
        (Ok(()), _) => "OK".to_string(),
        (Err(text), _) => {
            log.push(format!("TASK ERROR: {text}"));
            text
        }
    };
    if let Some(task) = inner.tasks.get_mut(&upid) {
        task.log.extend(log);
        task.exitstatus = Some(exitstatus);
    }
}

/// F2's text, from the node running the task.
fn missing(node: &str, vmid: u32) -> String {
    format!("Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist")
}

/// QEMU VM `vmid` as the task's node loads its conf once it holds the lock: gone, or moved to
/// another node (a clone with `target` that ended meanwhile), it fails with F2's text.
fn qemu_here<'a>(inner: &'a mut Inner, node: &str, vmid: u32) -> Result<&'a mut Guest, String> {
    inner
        .guests
        .get_mut(&vmid)
        .filter(|g| g.kind == GuestKind::Qemu && g.node == node)
        .ok_or_else(|| missing(node, vmid))
}

/// The effect of a task that ended well, run by `node`.
fn apply(inner: &mut Inner, node: &str, work: Work, log: &mut Vec<String>) -> Result<(), String> {
    match work {
        Work::Clone {
            newid,
            config,
            node: home,
        } => {
            let err = missing(node, newid);
            let guest = inner.guests.get_mut(&newid).ok_or(err)?;
            for (key, drive) in config.iter().filter(|(k, _)| model::is_drive_key(k)) {
                log.push(format!(
                    "create full clone of drive {key} ({})",
                    drive.split(',').next().unwrap_or_default()
                ));
            }
            guest.config = config;
            guest.placeholder = false;
            guest.busy = None;
            // A clone with `target` renames its conf into the target's directory last.
            guest.node = home;
            Ok(())
        }
        Work::Start { vmid } => {
            let guest = qemu_here(inner, node, vmid)?;
            start_guest(vmid, guest)
        }
        Work::StartAll => {
            // pve-manager's startall: guests marked onboot, skipping templates and those already
            // running (someone may have started them since the boot); a failure is logged and
            // the next guest is tried.
            for (vmid, guest) in inner.guests.iter_mut().filter(|(_, guest)| {
                guest.node == node
                    && guest.starts_on_boot()
                    && !guest.is_template()
                    && guest.run == RunState::Stopped
            }) {
                let kind = match guest.kind {
                    GuestKind::Qemu => "VM",
                    GuestKind::Lxc => "CT",
                };
                log.push(format!("Starting {kind} {vmid}"));
                if let Err(error) = start_guest(*vmid, guest) {
                    log.push(format!("Starting {kind} {vmid} failed: {error}"));
                }
            }
            Ok(())
        }
        Work::Stop { vmid } => {
            let guest = qemu_here(inner, node, vmid)?;
            if let Some(lock) = guest.lock() {
                return Err(format!("VM is locked ({lock})"));
            }
            // Stopping a stopped VM is fine: the task ends OK.
            guest.power_off();
            Ok(())
        }
        Work::Pause { vmid } | Work::Resume { vmid } => {
            let pausing = matches!(work, Work::Pause { .. });
            let guest = qemu_here(inner, node, vmid)?;
            if !pausing && guest.lock() == Some("suspended") {
                // Resuming a hibernated VM starts it from its saved state.
                guest.config.remove("lock");
                return start_guest(vmid, guest);
            }
            if guest.run == RunState::Stopped {
                return Err(format!("VM {vmid} not running"));
            }
            guest.run = if pausing {
                RunState::Paused
            } else {
                RunState::Running
            };
            Ok(())
        }
        Work::Hibernate { vmid } => {
            let guest = qemu_here(inner, node, vmid)?;
            guest.power_off();
            guest.config.insert("lock".into(), "suspended".into());
            Ok(())
        }
        Work::Config { .. } => Ok(()),
        Work::Resize { vmid, disk, size } => {
            let guest = qemu_here(inner, node, vmid)?;
            let drive = guest
                .config
                .get(&disk)
                .ok_or(format!("disk '{disk}' does not exist"))?;
            if model::drive_option(drive, "media") == Some("cdrom") {
                return Err("you can't resize a cdrom".to_string());
            }
            let current = model::drive_option(drive, "size")
                .and_then(model::parse_size)
                .unwrap_or(0);
            let requested = match size.strip_prefix('+') {
                Some(delta) => current + model::parse_size(delta).unwrap_or(0),
                None => model::parse_size(&size).unwrap_or(0),
            };
            // F20: the same size is an OK no-op, shrinking fails inside the task.
            if requested < current {
                return Err("shrinking disks is not supported".to_string());
            }
            let resized = model::set_drive_option(drive, "size", &model::format_size(requested));
            guest.config.insert(disk, resized);
            Ok(())
        }
        Work::Destroy { vmid } => {
            qemu_here(inner, node, vmid)?;
            let guest = inner
                .guests
                .remove(&vmid)
                .ok_or_else(|| missing(node, vmid))?;
            for drive in guest
                .config
                .iter()
                .filter(|(k, _)| model::is_drive_key(k))
                .map(|(_, d)| d)
            {
                if model::drive_option(drive, "media") != Some("cdrom") {
                    log.push(format!(
                        "Removing image: {}",
                        drive.split(',').next().unwrap_or_default()
                    ));
                }
            }
            Ok(())
        }
        Work::Upload {
            volid,
            filename,
            bytes,
        } => {
            // F23: staged under /var/tmp, then copied into the storage's iso directory.
            let staged = format!("/var/tmp/pveupload-{}", uuid::Uuid::new_v4().simple());
            log.push(format!("starting file import from: {staged}"));
            log.push(format!("target node: {node}"));
            log.push(format!("target file: {volid} ({filename})"));
            log.push(format!("file size is: {}", bytes.len()));
            log.push(format!("command: cp -- {staged} {volid}"));
            log.push("finished file import successfully".to_string());
            // F12: an existing name is silently overwritten.
            inner.volumes.insert(
                (node.to_string(), volid),
                Volume {
                    bytes,
                    ctime: unix_now(),
                },
            );
            Ok(())
        }
        Work::DeleteVolume { volid } => {
            // F13: a missing volume is logged, and the task still ends OK.
            if inner
                .volumes
                .remove(&(node.to_string(), volid.clone()))
                .is_none()
            {
                log.push(format!("disk image '{volid}' does not exist"));
            }
            log.push(format!("Removed volume '{volid}'"));
            Ok(())
        }
    }
}

/// Starts one stopped guest, as every start does: the guest agent answers only after the
/// simulator's agent delay from now (F5).
fn start_guest(vmid: u32, guest: &mut Guest) -> Result<(), String> {
    if guest.lock() == Some("suspended") {
        // A hibernated VM starts from its saved state, as `qm start` resumes it.
        guest.config.remove("lock");
    } else if let Some(lock) = guest.lock() {
        return Err(format!("VM is locked ({lock})"));
    }
    if guest.run != RunState::Stopped {
        return Err(format!("VM {vmid} already running"));
    }
    guest.run = RunState::Running;
    guest.started = Some((std::time::Instant::now(), unix_now()));
    Ok(())
}

/// The state a task leaves behind when it fails: nothing done, locks released.
fn roll_back(inner: &mut Inner, work: &Work) {
    match work {
        Work::Clone { newid, .. } => {
            inner.guests.remove(newid);
        }
        Work::Destroy { vmid } => {
            if let Some(guest) = inner.guests.get_mut(vmid) {
                guest.config.remove("lock");
                guest.busy = None;
            }
        }
        Work::Config { vmid, previous } => {
            if let Some(guest) = inner.guests.get_mut(vmid) {
                guest.config = previous.clone();
            }
        }
        _ => {}
    }
}
