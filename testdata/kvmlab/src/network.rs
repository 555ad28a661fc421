//! A libvirt network of the lab's own, whose dnsmasq leases addresses to the domains on it: the
//! source of the addresses a guest without an agent has.
//!
//! `<forward mode='open'/>` adds no firewall rules, so it works where there is no iptables (this
//! machine); dnsmasq's `no-ping` saves the 3 s it would wait before offering an address.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::daemon::{SYSTEM_URI, libvirtd};

/// A transient network with DHCP on a subnet of its own; destroyed when dropped.
pub struct Network {
    /// The network's name.
    pub name: String,
    /// Its bridge.
    pub bridge: String,
    /// Its gateway address (`10.x.y.1`); leases are `.100` to `.200`.
    pub gateway: String,
}

impl Network {
    /// Starts a network, trying subnets of `10.240.0.0/12` until one is free.
    pub fn start() -> Network {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        libvirtd();
        let mut connect = virt::connect::Connect::open(Some(SYSTEM_URI)).expect("libvirtd answers");
        let mut last = String::new();
        for _ in 0..64 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let slot = (std::process::id().wrapping_mul(31).wrapping_add(n * 7)) % 4000;
            let (second, third) = (240 + slot / 250, 2 + slot % 250);
            let name = format!("egress-lab-{}-{n}", std::process::id());
            let bridge = format!("egl{:x}", (std::process::id() << 8 | n) & 0xff_ffff);
            let gateway = format!("10.{second}.{third}.1");
            let xml = format!(
                "<network xmlns:dnsmasq='http://libvirt.org/schemas/network/dnsmasq/1.0'>
  <name>{name}</name>
  <forward mode='open'/>
  <bridge name='{bridge}' stp='off'/>
  <ip address='{gateway}' prefix='24'>
    <dhcp><range start='10.{second}.{third}.100' end='10.{second}.{third}.200'/></dhcp>
  </ip>
  <dnsmasq:options><dnsmasq:option value='no-ping'/></dnsmasq:options>
</network>"
            );
            match virt::network::Network::create_xml(&connect, &xml) {
                Ok(_) => {
                    let _ = connect.close();
                    return Network {
                        name,
                        bridge,
                        gateway,
                    };
                }
                Err(error) => last = error.to_string(),
            }
        }
        let _ = connect.close();
        panic!("no free subnet for a lab network: {last}");
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if let Ok(mut connect) = virt::connect::Connect::open(Some(SYSTEM_URI)) {
            if let Ok(network) = virt::network::Network::lookup_by_name(&connect, &self.name) {
                let _ = network.destroy();
            }
            let _ = connect.close();
        }
    }
}
