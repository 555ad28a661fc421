//! Pure state rules: what a resources entry, a status read and an agent answer mean for the
//! contract's VM state. `get` applies them in entry 9's order.

use crate::api::{AgentInterface, ApiError, Resource, VmStatus};
use crate::egress::provider::types::{Error, VmState};
use crate::errors::{is_agent_not_configured, is_agent_not_running, is_vm_not_running};
use crate::task::{LockState, lock_state};

/// Correction 1, F8: an entry locked by a task (not `suspended`) or with `status: unknown` is a
/// VM in the middle of something (mid-clone it has no name yet). Never absent.
pub fn entry_in_progress(entry: &Resource) -> bool {
    matches!(lock_state(entry.lock.as_deref()), LockState::Held(_))
        || entry.status.as_deref() == Some("unknown")
}

/// What `status/current` says, before the agent is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Power {
    /// Answer this state without asking the agent.
    Settled(VmState),
    /// Running: the agent decides between running and provisioning.
    AskAgent,
    /// Unknown for now: retry.
    Unsettled(String),
}

/// F14, correction 6: `status/current` tells paused from running, and the QMP state says what a
/// recovery can do about a VM that does not run (issue 32: each used to be `stopped`, which
/// the operator restarted in vain, since a start of a "running" VM does nothing):
///
/// | QMP state | state | why |
/// |---|---|---|
/// | `paused` (`qm suspend`), `io-error` (QEMU paused it on a storage error) | `paused` | it runs again when resumed, once its cause is dealt with; a person's to do |
/// | `suspended` (the guest slept, ACPI S3) | `stopped` | `create` wakes it (`status/resume`) |
/// | `guest-panicked`, `internal-error`, `watchdog`, `shutdown` | `failed` | neither a start nor a resume brings it back: replaced |
/// | `prelaunch`, migration and save states | `provisioning` | on its way |
pub fn power(status: &VmStatus) -> Power {
    match status.status.as_str() {
        "stopped" => Power::Settled(VmState::Stopped),
        "running" => match status.qmpstatus.as_deref() {
            None | Some("running") => Power::AskAgent,
            Some("paused" | "io-error") => Power::Settled(VmState::Paused),
            Some("suspended") => Power::Settled(VmState::Stopped),
            Some("guest-panicked" | "internal-error" | "watchdog" | "shutdown") => {
                Power::Settled(VmState::Failed)
            }
            Some(
                "prelaunch" | "inmigrate" | "postmigrate" | "finish-migrate" | "restore-vm"
                | "save-vm" | "colo" | "debug",
            ) => Power::Settled(VmState::Provisioning),
            Some(other) => Power::Unsettled(format!("VM has QMP status {other:?}")),
        },
        other => Power::Unsettled(format!("VM has status {other:?}")),
    }
}

/// IPv4 addresses the agent reports, most preferred first: none of the loopback interface
/// `lo` (F21: a guest reports it beside its network interface), not link-local, no duplicates,
/// in the agent's order. (Early in boot only `lo` or link-local may be present.) The interface
/// is told by its name, not by its addresses: a loopback address on a network interface is the
/// test simulator's per-VM service, reachable from the operator on its machine.
pub fn usable_ipv4(interfaces: &[AgentInterface]) -> Vec<String> {
    let mut addresses: Vec<String> = Vec::new();
    for address in interfaces
        .iter()
        .filter(|interface| interface.name != "lo")
        .flat_map(|interface| &interface.ip_addresses)
    {
        if address.ip_address_type != "ipv4" {
            continue;
        }
        let Ok(ip) = address.ip_address.parse::<std::net::Ipv4Addr>() else {
            continue;
        };
        if ip.is_link_local()
            || ip.is_unspecified()
            || ip.is_broadcast()
            || ip.is_multicast()
        {
            continue;
        }
        let text = ip.to_string();
        if !addresses.contains(&text) {
            addresses.push(text);
        }
    }
    addresses
}

/// The state of a running VM from its agent's answer (F5, correction 9, entry 7).
///
/// * addresses → `running` with them; none usable yet → `provisioning`;
/// * `QEMU guest agent is not running` → `provisioning` (booting, or the install is running);
/// * `VM <vmid> is not running` → `transient` (it stopped between the status read and this call);
/// * `No QEMU guest agent configured` → `failed`. The predecessor answered Stopped "so the
///   reconciler replaces a VM that can never report an address"; this contract has `failed`
///   for exactly that ("its guest agent was removed: replace it"), while `stopped` would only be
///   reported. Our create writes `agent=1`, so its absence means someone removed it.
/// * anything else → `transient`, even a 403 or a missing VM (Phase 5 judgment: the next get
///   re-reads the VM from the top).
pub fn agent_state(
    answer: &Result<Vec<AgentInterface>, ApiError>,
) -> Result<(VmState, Vec<String>), Error> {
    let message = match answer {
        Ok(interfaces) => {
            let addresses = usable_ipv4(interfaces);
            let state = if addresses.is_empty() {
                VmState::Provisioning
            } else {
                VmState::Running
            };
            return Ok((state, addresses));
        }
        Err(ApiError::Http { message, .. }) => message.as_str(),
        Err(other) => return Err(Error::Transient(format!("read guest agent: {other}"))),
    };
    if is_agent_not_running(message) {
        Ok((VmState::Provisioning, Vec::new()))
    } else if is_agent_not_configured(message) {
        Ok((VmState::Failed, Vec::new()))
    } else if is_vm_not_running(message) {
        Err(Error::Transient(format!(
            "read guest agent: {message} (it stopped while being read)"
        )))
    } else {
        Err(Error::Transient(format!("read guest agent: {message}")))
    }
}

/// The cheap state `list-by-tag` reports from a resources entry alone (no addresses).
pub fn entry_state(entry: &Resource) -> VmState {
    if lock_state(entry.lock.as_deref()) == LockState::Suspended {
        // Hibernated: a person's to resume.
        return VmState::Paused;
    }
    if entry_in_progress(entry) {
        return VmState::Provisioning;
    }
    match entry.status.as_deref() {
        Some("running") => VmState::Running,
        Some("stopped") => VmState::Stopped,
        _ => VmState::Provisioning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AgentAddress;

    fn entry(status: Option<&str>, lock: Option<&str>, name: Option<&str>) -> Resource {
        Resource {
            vmid: 100_123,
            kind: "qemu".into(),
            node: "pv1-1".into(),
            name: name.map(String::from),
            status: status.map(String::from),
            lock: lock.map(String::from),
            tags: None,
            template: false,
        }
    }

    #[test]
    fn correction1_f8_locked_or_unknown_entries_are_in_progress() {
        assert!(entry_in_progress(&entry(
            Some("unknown"),
            Some("clone"),
            None
        )));
        assert!(entry_in_progress(&entry(Some("unknown"), None, None)));
        assert!(entry_in_progress(&entry(
            Some("stopped"),
            Some("backup"),
            Some("p")
        )));
        assert!(
            !entry_in_progress(&entry(Some("stopped"), Some("suspended"), Some("p"))),
            "phase 6: suspended is no task"
        );
        assert!(!entry_in_progress(&entry(Some("running"), None, Some("p"))));
    }

    fn status(status: &str, qmp: Option<&str>) -> VmStatus {
        VmStatus {
            status: status.into(),
            qmpstatus: qmp.map(String::from),
            ..VmStatus::default()
        }
    }

    #[test]
    fn f14_correction6_issue32_power_table() {
        use VmState::*;
        let rows = [
            (status("stopped", Some("stopped")), Power::Settled(Stopped)),
            (status("running", Some("paused")), Power::Settled(Paused)),
            (status("running", Some("io-error")), Power::Settled(Paused)),
            (
                status("running", Some("suspended")),
                Power::Settled(Stopped),
            ),
            (
                status("running", Some("guest-panicked")),
                Power::Settled(Failed),
            ),
            (
                status("running", Some("internal-error")),
                Power::Settled(Failed),
            ),
            (status("running", Some("watchdog")), Power::Settled(Failed)),
            (status("running", Some("shutdown")), Power::Settled(Failed)),
            (
                status("running", Some("prelaunch")),
                Power::Settled(Provisioning),
            ),
            (status("running", Some("running")), Power::AskAgent),
            (status("running", None), Power::AskAgent),
        ];
        for (status, expected) in rows {
            assert_eq!(power(&status), expected, "{status:?}");
        }
        assert!(matches!(
            power(&status("unknown", None)),
            Power::Unsettled(_)
        ));
        assert!(matches!(
            power(&status("running", Some("strange"))),
            Power::Unsettled(_)
        ));
    }

    fn interface(name: &str, addresses: &[(&str, &str)]) -> AgentInterface {
        AgentInterface {
            name: name.into(),
            ip_addresses: addresses
                .iter()
                .map(|(ip, kind)| AgentAddress {
                    ip_address: ip.to_string(),
                    ip_address_type: kind.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn f21_usable_addresses_skip_the_lo_interface_link_local_and_ipv6() {
        let interfaces = [
            interface("lo", &[("127.0.0.1", "ipv4"), ("::1", "ipv6")]),
            interface(
                "ens18",
                &[
                    ("169.254.3.4", "ipv4"),
                    ("192.168.4.147", "ipv4"),
                    ("fe80::1", "ipv6"),
                ],
            ),
            interface(
                "ens19",
                &[
                    ("10.0.0.5", "ipv4"),
                    ("192.168.4.147", "ipv4"),
                    ("junk", "ipv4"),
                    ("0.0.0.0", "ipv4"),
                    ("224.0.0.1", "ipv4"),
                ],
            ),
            // The simulator's per-VM service: a loopback address on a network interface.
            interface("ens20", &[("127.77.0.5", "ipv4")]),
        ];
        assert_eq!(
            usable_ipv4(&interfaces),
            ["192.168.4.147", "10.0.0.5", "127.77.0.5"]
        );
    }

    fn http(message: &str) -> Result<Vec<AgentInterface>, ApiError> {
        Err(ApiError::Http {
            status: 500,
            message: message.into(),
        })
    }

    fn class(result: &Result<(VmState, Vec<String>), Error>) -> String {
        match result {
            Ok((state, addresses)) => {
                let state = match state {
                    VmState::Provisioning => "Provisioning",
                    VmState::Running => "Running",
                    VmState::Stopped => "Stopped",
                    VmState::Failed => "Failed",
                    VmState::Paused => "Paused",
                };
                format!("{state} {addresses:?}")
            }
            Err(Error::Transient(_)) => "transient".into(),
            Err(other) => format!("{other:?}"),
        }
    }

    #[test]
    fn f5_correction9_phase5_agent_table() {
        let running = Ok(vec![interface("ens18", &[("192.168.0.150", "ipv4")])]);
        let only_lo = Ok(vec![interface("lo", &[("127.0.0.1", "ipv4")])]);
        let rows = [
            (running, "Running [\"192.168.0.150\"]"),
            (only_lo, "Provisioning []"),
            (http("QEMU guest agent is not running"), "Provisioning []"),
            (http("No QEMU guest agent configured"), "Failed []"),
            (http("VM 100123 is not running"), "transient"),
            // Outside the table: transient, never not-found or permanent (Phase 5).
            (
                http("Configuration file 'nodes/pv1-1/qemu-server/100123.conf' does not exist"),
                "transient",
            ),
            (
                Err(ApiError::Http {
                    status: 403,
                    message: "Permission check failed".into(),
                }),
                "transient",
            ),
        ];
        for (answer, expected) in rows {
            assert_eq!(class(&agent_state(&answer)), expected, "{answer:?}");
        }
    }

    #[test]
    fn list_entry_state_is_cheap_and_never_running_while_locked() {
        use VmState::*;
        assert_eq!(
            entry_state(&entry(Some("running"), None, Some("p"))),
            Running
        );
        assert_eq!(
            entry_state(&entry(Some("stopped"), None, Some("p"))),
            Stopped
        );
        assert_eq!(
            entry_state(&entry(Some("running"), Some("suspended"), Some("p"))),
            Paused,
            "hibernated"
        );
        assert_eq!(
            entry_state(&entry(Some("running"), Some("clone"), Some("p"))),
            Provisioning
        );
        assert_eq!(
            entry_state(&entry(Some("unknown"), None, None)),
            Provisioning
        );
    }
}
