//! What a domain's (state, reason) and its reported addresses mean for the contract: pure,
//! table-tested.

use std::net::Ipv4Addr;

use crate::egress::libvirt::libvirt::{AddressType, DomainState, DomainStatus, InterfaceAddresses};
use crate::egress::provider::types::VmState;

/// `VIR_DOMAIN_PAUSED_MIGRATION`, `_SAVE`, `_DUMP`, `_SNAPSHOT`, `_STARTING_UP`, `_POSTCOPY`:
/// paused by libvirt for a job it resumes the domain after.
const PAUSED_FOR_A_JOB: &[i32] = &[2, 3, 4, 9, 11, 12];
/// `VIR_DOMAIN_PAUSED_WATCHDOG`, `_CRASHED`, `_POSTCOPY_FAILED`, `_API_ERROR`: paused by a
/// failure a resume does not mend.
const PAUSED_BY_FAILURE: &[i32] = &[6, 10, 13, 14];
/// `VIR_DOMAIN_SHUTOFF_CRASHED`, `_FAILED` (failed to start).
const SHUTOFF_BY_FAILURE: &[i32] = &[3, 6];

/// The contract's VM state for a domain `status` with `has_address` (whether an address is known).
pub fn vm_state(status: DomainStatus, has_address: bool) -> VmState {
    match status.state {
        DomainState::Running | DomainState::Blocked if has_address => VmState::Running,
        DomainState::Running | DomainState::Blocked | DomainState::NoState => VmState::Provisioning,
        DomainState::Paused if PAUSED_FOR_A_JOB.contains(&status.reason) => VmState::Provisioning,
        DomainState::Paused if PAUSED_BY_FAILURE.contains(&status.reason) => VmState::Failed,
        // By a person (`virsh suspend`, reason user; after a snapshot revert; unknown), or on a
        // storage error (I/O error): it runs again when resumed, once its cause is dealt with,
        // and the operator leaves it to a person.
        DomainState::Paused => VmState::Paused,
        DomainState::Shutoff if SHUTOFF_BY_FAILURE.contains(&status.reason) => VmState::Failed,
        // A guest that suspended itself cannot be woken through the capability (no pm-wakeup):
        // the operator replaces it, as a broken proxy.
        DomainState::Crashed | DomainState::PmSuspended => VmState::Failed,
        DomainState::Shutdown | DomainState::Shutoff => VmState::Stopped,
    }
}

/// The proxy's address: the first IPv4 address reported (the capability asks the guest agent
/// first and falls back to DHCP leases), skipping loopback and link-local addresses and any
/// address whose type tag and literal disagree (an agent's garbled report is not an address).
pub fn first_ipv4(reported: &InterfaceAddresses) -> Option<String> {
    reported
        .interfaces
        .iter()
        .flat_map(|interface| interface.addresses.iter())
        .filter(|address| address.type_ == AddressType::Ipv4)
        .filter_map(|address| address.address.parse::<Ipv4Addr>().ok())
        .find(|address| {
            !address.is_loopback() && !address.is_link_local() && !address.is_unspecified()
        })
        .map(|address| address.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::libvirt::libvirt::{AddressSource, GuestInterface, IpAddress};

    fn status(state: DomainState, reason: i32) -> DomainStatus {
        DomainStatus { state, reason }
    }

    #[test]
    fn state_and_reason_table() {
        use DomainState as D;
        use VmState as I;
        let rows = [
            (D::Running, 1, true, I::Running),
            (D::Running, 1, false, I::Provisioning),
            (D::Blocked, 0, true, I::Running),
            (D::Blocked, 0, false, I::Provisioning),
            (D::NoState, 0, true, I::Provisioning),
            (D::Paused, 0, true, I::Paused),
            (D::Paused, 1, true, I::Paused),
            (D::Paused, 7, true, I::Paused),
            (D::Paused, 2, true, I::Provisioning),
            (D::Paused, 3, true, I::Provisioning),
            (D::Paused, 11, false, I::Provisioning),
            (D::Paused, 12, true, I::Provisioning),
            (D::Paused, 5, true, I::Paused),
            (D::Paused, 6, true, I::Failed),
            (D::Paused, 10, true, I::Failed),
            (D::Paused, 13, true, I::Failed),
            (D::Paused, 14, true, I::Failed),
            (D::PmSuspended, 0, true, I::Failed),
            (D::Shutdown, 1, true, I::Stopped),
            (D::Shutoff, 1, false, I::Stopped),
            (D::Shutoff, 2, false, I::Stopped),
            (D::Shutoff, 3, false, I::Failed),
            (D::Shutoff, 6, false, I::Failed),
            (D::Crashed, 0, false, I::Failed),
            (D::Crashed, 1, true, I::Failed),
        ];
        for (state, reason, has_address, want) in rows {
            assert_eq!(
                vm_state(status(state, reason), has_address),
                want,
                "{state:?}/{reason} with address {has_address}"
            );
        }
    }

    /// `(interface, type tag, literal)` as the capability reports one address.
    type Reported<'a> = (&'a str, AddressType, &'a str);

    fn reported(addresses: &[Reported]) -> InterfaceAddresses {
        InterfaceAddresses {
            source: AddressSource::Agent,
            interfaces: addresses
                .iter()
                .map(|(name, type_, address)| GuestInterface {
                    name: name.to_string(),
                    hwaddr: None,
                    addresses: vec![IpAddress {
                        type_: *type_,
                        address: address.to_string(),
                        prefix: 24,
                    }],
                })
                .collect(),
        }
    }

    #[test]
    fn the_first_real_ipv4_is_chosen() {
        use AddressType::{Ipv4, Ipv6};
        let rows: [(&[Reported], Option<&str>); 7] = [
            (&[], None),
            (&[("eth0", Ipv4, "192.168.122.23")], Some("192.168.122.23")),
            (
                &[("lo", Ipv4, "127.0.0.1"), ("eth0", Ipv4, "10.1.2.3")],
                Some("10.1.2.3"),
            ),
            (
                &[("eth0", Ipv6, "fe80::1"), ("eth0", Ipv4, "10.1.2.3")],
                Some("10.1.2.3"),
            ),
            // Type and literal disagree: dropped both ways.
            (
                &[("eth0", Ipv4, "fd00::5"), ("eth1", Ipv6, "10.9.9.9")],
                None,
            ),
            (
                &[
                    ("eth0", Ipv4, "169.254.0.7"),
                    ("eth1", Ipv4, "not an address"),
                ],
                None,
            ),
            (
                &[("eth0", Ipv4, "10.0.0.1"), ("eth1", Ipv4, "10.0.0.2")],
                Some("10.0.0.1"),
            ),
        ];
        for (addresses, want) in rows {
            assert_eq!(
                first_ipv4(&reported(addresses)).as_deref(),
                want,
                "{addresses:?}"
            );
        }
    }
}
