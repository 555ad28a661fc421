//! [`Lab`]: everything a libvirt provider needs to make proxies that run with addresses on the
//! real daemon: a dir pool, a DHCP network, and the guest image on an HTTPS origin with a CA of
//! its own.

use std::collections::HashMap;
use std::path::Path;

use crate::daemon::{SYSTEM_URI, qemu_host};
use crate::image::{GuestImage, guest_image};
use crate::network::Network;
use crate::origin::{Ca, ImageServer};
use crate::pool::DirPool;

/// The image's path on the lab's origin.
pub const IMAGE_PATH: &str = "/egress-test-guest.qcow2";

/// The name the lab's connection has in the grants it writes.
pub const CONNECTION: &str = "lab";

/// A pool, a network and an image origin; the domains on its network are destroyed and
/// undefined when it is dropped, then the pool and the network go.
pub struct Lab {
    /// Where disks, seeds and the base image land.
    pub pool: DirPool,
    /// Where the domains' NICs get their addresses.
    pub network: Network,
    /// The CA of the origin.
    pub ca: Ca,
    /// The origin serving the image.
    pub origin: ImageServer,
    /// The image it serves.
    pub image: GuestImage,
}

impl Lab {
    /// A lab whose pool is a temporary folder, or `pool_dir`.
    pub async fn start(pool_dir: Option<&Path>) -> Lab {
        qemu_host();
        let image = guest_image();
        let pool = match pool_dir {
            Some(dir) => DirPool::in_dir(dir),
            None => DirPool::new(),
        };
        let network = Network::start();
        let ca = Ca::new("kvmlab image origin CA");
        let bytes = std::fs::read(&image.path).expect("reading the guest image");
        let origin = ImageServer::start(&ca, HashMap::from([(IMAGE_PATH.to_owned(), bytes)])).await;
        Lab {
            pool,
            network,
            ca,
            origin,
            image,
        }
    }

    /// The image's URL.
    pub fn image_url(&self) -> String {
        format!("{}{IMAGE_PATH}", self.origin.origin())
    }

    /// The libvirt provider's configuration for this lab: TCG guests (this machine's KVM cannot
    /// run them), small.
    pub fn provider_config(&self) -> serde_json::Value {
        serde_json::json!({
            "connections": [CONNECTION],
            "pool": self.pool.name,
            "network": self.network.name,
            "image": { "url": self.image_url(), "sha256": self.image.sha256 },
            "domainType": "qemu",
            "memoryMiB": 256,
            "installGuestAgent": false,
        })
    }

    /// The libvirt grant of this lab (the real daemon as connection `lab`, its pool and network,
    /// its origin) with the CA as `ca` says: for example `{"caFile": PATH}` or
    /// `{"caConfigMapRef": {…}}`.
    pub fn grant(&self, ca: serde_json::Value) -> serde_json::Value {
        let mut images = serde_json::json!({ "origins": [self.origin.origin()] });
        if let (Some(images), Some(ca)) = (images.as_object_mut(), ca.as_object()) {
            images.extend(ca.clone());
        }
        serde_json::json!({
            "connections": [{
                "name": CONNECTION,
                "uri": SYSTEM_URI,
                "pools": [self.pool.name],
                "networks": [self.network.name],
            }],
            "images": images,
        })
    }

    /// The domains whose NIC is on the lab's network: `(name, running)`.
    pub fn domains(&self) -> Vec<(String, bool)> {
        let Ok(mut connect) = virt::connect::Connect::open(Some(SYSTEM_URI)) else {
            return Vec::new();
        };
        let needle = format!("<source network='{}'", self.network.name);
        let found = connect
            .list_all_domains(0)
            .unwrap_or_default()
            .into_iter()
            .filter(|domain| {
                domain
                    .get_xml_desc(virt::sys::VIR_DOMAIN_XML_INACTIVE)
                    .is_ok_and(|xml| xml.contains(&needle))
            })
            .filter_map(|domain| Some((domain.get_name().ok()?, domain.is_active().ok()?)))
            .collect();
        let _ = connect.close();
        found
    }

    /// Pauses (`virsh suspend`) or resumes (`virsh resume`) domain `name`, as a person would.
    pub fn set_paused(&self, name: &str, paused: bool) {
        let mut connect = virt::connect::Connect::open(Some(SYSTEM_URI)).expect("libvirtd answers");
        let domain = virt::domain::Domain::lookup_by_name(&connect, name).expect("the domain");
        let done = if paused {
            domain.suspend()
        } else {
            domain.resume()
        };
        done.unwrap_or_else(|error| panic!("pause {name} ({paused}): {error}"));
        let _ = connect.close();
    }

    /// Takes domain `name`'s network link down or up (`virsh domif-setlink`), as a pulled cable
    /// would: the domain keeps running and keeps its lease, and nothing reaches its address.
    pub fn set_link(&self, name: &str, up: bool) {
        let mut connect = virt::connect::Connect::open(Some(SYSTEM_URI)).expect("libvirtd answers");
        let domain = virt::domain::Domain::lookup_by_name(&connect, name).expect("the domain");
        let xml = domain.get_xml_desc(0).expect("the domain's XML");
        let start = xml.find("<interface ").expect("a NIC");
        let end = start + xml[start..].find("</interface>").expect("the NIC's end");
        let state = if up { "up" } else { "down" };
        let mut interface = xml[start..end]
            .lines()
            .filter(|line| !line.trim_start().starts_with("<link "))
            .collect::<Vec<_>>()
            .join("\n");
        interface.push_str(&format!("\n<link state='{state}'/>\n</interface>"));
        domain
            .update_device_flags(&interface, virt::sys::VIR_DOMAIN_AFFECT_LIVE)
            .unwrap_or_else(|error| panic!("link of {name} {state}: {error}"));
        let _ = connect.close();
    }

    /// Destroys and undefines every domain on the lab's network.
    pub fn remove_domains(&self) {
        let Ok(mut connect) = virt::connect::Connect::open(Some(SYSTEM_URI)) else {
            return;
        };
        for (name, running) in self.domains() {
            if let Ok(domain) = virt::domain::Domain::lookup_by_name(&connect, &name) {
                if running {
                    let _ = domain.destroy();
                }
                let _ = domain.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE);
            }
        }
        let _ = connect.close();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.remove_domains();
    }
}
