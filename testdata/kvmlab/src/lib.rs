//! `kvmlab`: a real KVM host for tests and the demo, where no cloud image can be downloaded and no
//! hypervisor is at hand: the machine's own `libvirtd` (started when none answers), storage pools
//! and a DHCP network of the lab's own, and a guest image that boots under qemu and asks for an
//! address, served over HTTPS under a CA of the lab's own.
//!
//! [`Lab`] is the whole of it; the pieces serve the libvirt capability's own tests. The binary
//! `kvmlab --state-dir DIR` runs a lab until it is stopped (the demo's KVM host).

mod daemon;
mod image;
mod lab;
mod network;
mod origin;
mod pool;

use std::time::{Duration, Instant};

pub use daemon::{SYSTEM_URI, TEST_BRIDGE, libvirtd, qemu_host};
pub use image::{GuestImage, guest_image, repository};
pub use lab::{CONNECTION, IMAGE_PATH, Lab};
pub use network::Network;
pub use origin::{Ca, ImageServer};
pub use pool::DirPool;

/// Waits until `condition` holds, checking every 50 ms for at most `bound`.
pub fn wait_for(bound: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let end = Instant::now() + bound;
    while !condition() {
        assert!(Instant::now() < end, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
