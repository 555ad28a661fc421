//! `virDomainInterfaceAddresses`, read defensively.
//!
//! virt 0.4's `Domain::interface_addresses` reads each interface's `name` and `hwaddr` with
//! `CStr::from_ptr` without a null check, and the guest agent may report an interface with no
//! hardware address (a null `hwaddr`): that would crash the host. This wrapper checks every
//! pointer and frees the result with `virDomainInterfaceFree`, as libvirt documents.

use std::ffi::CStr;
use std::os::raw::c_char;

use virt::domain::Domain;
use virt::sys;

use crate::bindings::egress::libvirt::libvirt::{AddressType, GuestInterface, IpAddress};

/// The interfaces libvirt reports for `domain` from `source`
/// (`VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_*`).
pub(crate) fn interface_addresses(
    domain: &Domain,
    source: u32,
) -> Result<Vec<GuestInterface>, virt::error::Error> {
    let mut interfaces: *mut sys::virDomainInterfacePtr = std::ptr::null_mut();
    // SAFETY: `domain` holds a reference to a live virDomainPtr; libvirt writes an array it
    // allocated into `interfaces` and returns its length, or -1.
    let count =
        unsafe { sys::virDomainInterfaceAddresses(domain.as_ptr(), &mut interfaces, source, 0) };
    if count < 0 {
        return Err(virt::error::Error::last_error());
    }
    let mut found = Vec::new();
    if interfaces.is_null() {
        return Ok(found);
    }
    for index in 0..count as usize {
        // SAFETY: `index < count`, the array's length.
        let interface = unsafe { *interfaces.add(index) };
        if interface.is_null() {
            continue;
        }
        // SAFETY: a non-null element of libvirt's array is a valid virDomainInterface until it
        // is freed below.
        found.push(unsafe { read_interface(&*interface) });
        // SAFETY: each element is freed once, after its last read.
        unsafe { sys::virDomainInterfaceFree(interface) };
    }
    // SAFETY: the array itself was allocated by libvirt with malloc; its elements are freed.
    unsafe { libc::free(interfaces.cast()) };
    Ok(found)
}

/// # Safety
///
/// `interface` must be a valid virDomainInterface: its pointers null or valid C strings, `addrs`
/// null or an array of `naddrs` entries.
unsafe fn read_interface(interface: &sys::virDomainInterface) -> GuestInterface {
    let mut addresses = Vec::new();
    if !interface.addrs.is_null() {
        for index in 0..interface.naddrs as usize {
            // SAFETY: `index < naddrs`, per the caller's contract.
            let address = unsafe { &*interface.addrs.add(index) };
            // SAFETY: per the caller's contract.
            let Some(text) = (unsafe { string(address.addr) }) else {
                continue;
            };
            let kind = match u32::try_from(address.type_) {
                Ok(sys::VIR_IP_ADDR_TYPE_IPV4) => AddressType::Ipv4,
                Ok(sys::VIR_IP_ADDR_TYPE_IPV6) => AddressType::Ipv6,
                _ => continue,
            };
            addresses.push(IpAddress {
                type_: kind,
                address: text,
                prefix: u8::try_from(address.prefix).unwrap_or(u8::MAX),
            });
        }
    }
    GuestInterface {
        // SAFETY: per the caller's contract.
        name: unsafe { string(interface.name) }.unwrap_or_default(),
        // SAFETY: per the caller's contract.
        hwaddr: unsafe { string(interface.hwaddr) },
        addresses,
    }
}

/// # Safety
///
/// `pointer` must be null or a valid C string.
unsafe fn string(pointer: *const c_char) -> Option<String> {
    if pointer.is_null() {
        return None;
    }
    // SAFETY: non-null and valid per the caller's contract.
    Some(
        unsafe { CStr::from_ptr(pointer) }
            .to_string_lossy()
            .into_owned(),
    )
}
