//! The guest image: a tiny disk that boots under qemu (TCG; this machine's KVM cannot run it)
//! and asks its network for an address over DHCP, built from Debian packages by
//! `testdata/guest-image/build.sh` into `target/guest-image` once (see that script).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The built image.
#[derive(Clone, Debug)]
pub struct GuestImage {
    /// The qcow2 file.
    pub path: PathBuf,
    /// Its sha256, lower-case hex.
    pub sha256: String,
}

/// The repository's root.
pub fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The image, built on first use (a cheap no-op once built).
pub fn guest_image() -> GuestImage {
    static BUILT: OnceLock<GuestImage> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = repository().join("target/guest-image");
            let status = std::process::Command::new("bash")
                .arg(repository().join("testdata/guest-image/build.sh"))
                .arg(&out)
                .status()
                .expect("bash runs testdata/guest-image/build.sh");
            assert!(status.success(), "building the guest image failed");
            let sha256 = std::fs::read_to_string(out.join("egress-test-guest.qcow2.sha256"))
                .expect("the image's checksum")
                .trim()
                .to_owned();
            GuestImage {
                path: out.join("egress-test-guest.qcow2"),
                sha256,
            }
        })
        .clone()
}
