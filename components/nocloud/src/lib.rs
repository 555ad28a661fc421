//! NoCloud seed ISOs for cloud-init, built in memory.
//!
//! A provider boots each egress-proxy VM with a small CD image that cloud-init's NoCloud datasource
//! finds by its volume label, [`SEED_LABEL`] (`cidata`), and reads three files from:
//!
//! | file          | content                                                             |
//! |---------------|---------------------------------------------------------------------|
//! | `user-data`   | [`Seed::user_data`], byte for byte                                  |
//! | `meta-data`   | [`meta_data`]: the proxy name as both instance id and hostname      |
//! | `vendor-data` | [`vendor_data`], only when [`Seed::install_guest_agent`] is set     |
//!
//! ```
//! let seed = nocloud::Seed {
//!     name: "proxy-a".to_owned(),
//!     user_data: "#cloud-config\npackages: [squid]\n".to_owned(),
//!     install_guest_agent: false,
//! };
//! let iso = nocloud::build_seed_iso(&seed)?;
//! assert_eq!(iso.len() % 2048, 0);
//! # Ok::<(), nocloud::SeedError>(())
//! ```
//!
//! The image carries the same three name spaces as `genisoimage -volid cidata -joliet -rock`: a plain
//! ISO 9660 tree (where the names become `USER_DAT.;1`, because level 1 forbids `-` and lower case),
//! a Joliet tree and Rock Ridge entries. cloud-init mounts the image and opens `user-data`,
//! `meta-data` and the optional `vendor-data` by those exact names; Linux shows the Rock Ridge
//! names (or, without Rock Ridge, the Joliet ones), so both extensions are written.
//!
//! The bytes depend on the [`Seed`] alone: every date is fixed at 1980-01-01 and nothing is random,
//! so the same seed always gives the same image (and the same upload checksum).
//!
//! Only in-memory work is done here (no file system, no clock), so the crate runs inside
//! `wasm32-wasip2` provider components.
//!
//! Uploading the image, and attaching it to the VM, is the provider's business.

use std::fmt;

use hadris_fs::{Content, DateTime, NoClock, Node, Tree};
use hadris_iso::{IsoId, IsoOptions};
use hadris_storage::{BlockSize, MemDevice};

/// The volume label cloud-init's NoCloud datasource looks for (Phase 0 seed: label `cidata`).
pub const SEED_LABEL: &str = "cidata";

/// The longest name accepted: a DNS name's limit, since the name also becomes the hostname.
pub const MAX_NAME_LEN: usize = 253;

/// ISO 9660 logical sector size; the image length is always a multiple of it.
const SECTOR_SIZE: u32 = 2048;

/// Recorded in the primary volume descriptor so an operator can tell who made a stray ISO.
const APPLICATION_ID: &str = "EGRESS-OPERATOR NOCLOUD";

/// The date on the volume and every entry. A constant keeps the image reproducible; cloud-init
/// never looks at it.
const IMAGE_TIME: DateTime = NoClock::TIME;

/// The vendor-data that installs and starts the QEMU guest agent, through which a provider reads
/// the proxy's address from the hypervisor.
///
/// Installing the package needs a reachable package mirror on the proxy network (correction 10).
/// Templates that already carry `qemu-guest-agent` should set `installGuestAgent: false` so that
/// address discovery does not depend on a mirror.
const GUEST_AGENT_VENDOR_DATA: &str = "\
#cloud-config
# egress-operator: the operator reads this proxy's address from the hypervisor
# through the QEMU guest agent.
packages:
  - qemu-guest-agent
runcmd:
  - systemctl enable --now qemu-guest-agent
";

/// What goes on one proxy's seed.
///
/// `Debug` shows the size of the user-data but never its text, which may hold credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Seed {
    /// The proxy name: written as cloud-init's `instance-id` and `local-hostname`. A new name
    /// makes cloud-init treat the VM as a new instance and run again.
    pub name: String,
    /// The user-data file, stored byte for byte (any UTF-8 text, any size).
    pub user_data: String,
    /// Whether to add [`vendor_data`] so the guest installs the QEMU guest agent at first boot.
    /// Without it no `vendor-data` file is written, which NoCloud treats as "no vendor-data".
    pub install_guest_agent: bool,
}

impl fmt::Debug for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Seed")
            .field("name", &self.name)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .field("install_guest_agent", &self.install_guest_agent)
            .finish()
    }
}

/// Why a seed image could not be built. No variant carries the user-data.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SeedError {
    /// The seed has no name. Bad input that retrying cannot fix: providers report it as permanent.
    EmptyName,
    /// The name cannot serve as instance id and hostname (length or characters). Permanent, like
    /// [`SeedError::EmptyName`].
    InvalidName {
        /// The rejected name.
        name: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// The ISO writer refused the image. Not expected for a valid name; the same seed would fail
    /// the same way again.
    Image(String),
}

impl fmt::Display for SeedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyName => f.write_str("seed name is empty"),
            Self::InvalidName { name, reason } => {
                write!(f, "seed name {name:?} is invalid: {reason}")
            }
            Self::Image(detail) => write!(f, "building the seed ISO failed: {detail}"),
        }
    }
}

impl std::error::Error for SeedError {}

/// The meta-data file for a proxy `name`: cloud-init's instance id and hostname, both the name.
pub fn meta_data(name: &str) -> String {
    format!("instance-id: {name}\nlocal-hostname: {name}\n")
}

/// The vendor-data written when [`Seed::install_guest_agent`] is set: a cloud-config that
/// installs `qemu-guest-agent` and runs `systemctl enable --now qemu-guest-agent`.
pub fn vendor_data() -> &'static str {
    GUEST_AGENT_VENDOR_DATA
}

/// Builds the seed ISO for `seed`: volume label [`SEED_LABEL`], Joliet and Rock Ridge names,
/// files `user-data`, `meta-data` and (with [`Seed::install_guest_agent`]) `vendor-data`.
///
/// The same seed always yields the same bytes.
///
/// # Errors
///
/// [`SeedError::EmptyName`] or [`SeedError::InvalidName`] for a name that cannot be an instance
/// id and hostname; [`SeedError::Image`] if the writer fails.
pub fn build_seed_iso(seed: &Seed) -> Result<Vec<u8>, SeedError> {
    validate_name(&seed.name)?;

    let mut files = vec![
        ("meta-data", meta_data(&seed.name).into_bytes()),
        ("user-data", seed.user_data.clone().into_bytes()),
    ];
    if seed.install_guest_agent {
        files.push(("vendor-data", vendor_data().as_bytes().to_vec()));
    }
    let mut tree = Tree::new();
    for (path, bytes) in files {
        tree.insert(path, Node::file(Content::bytes(bytes)))
            .map_err(|error| SeedError::Image(error.to_string()))?;
    }

    let options = IsoOptions::new()
        .with_id(IsoId::Volume, SEED_LABEL)
        .with_id(IsoId::Application, APPLICATION_ID)
        .with_joliet()
        .with_rock_ridge()
        .with_time(IMAGE_TIME);

    // The writer fills a device of fixed size, so plan first to learn the image size.
    let size = hadris_iso::plan(&tree, &options)
        .map_err(|error| SeedError::Image(error.to_string()))?
        .size();
    let size = usize::try_from(size)
        .map_err(|_| SeedError::Image(format!("image of {size} bytes does not fit in memory")))?;
    let block_size = BlockSize::new(SECTOR_SIZE).expect("2048 is a valid block size");
    let mut device = MemDevice::new(vec![0u8; size], block_size);
    hadris_iso::sync::write(&mut device, &tree, &options)
        .map_err(|error| SeedError::Image(error.to_string()))?;
    Ok(device.into_inner())
}

/// Accepts names that are safe as a YAML plain scalar in meta-data and usable as a hostname:
/// ASCII letters, digits, `-` and `.`, at most [`MAX_NAME_LEN`] bytes. Kubernetes object names
/// (DNS-1123 subdomains) all pass.
fn validate_name(name: &str) -> Result<(), SeedError> {
    let invalid = |reason| SeedError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(SeedError::EmptyName);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("longer than 253 bytes"));
    }
    if !name
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'.')
    {
        return Err(invalid(
            "only ASCII letters, digits, '-' and '.' are allowed",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str, install_guest_agent: bool) -> Seed {
        Seed {
            name: name.to_owned(),
            user_data: "#cloud-config\npassword: hunter2\n".to_owned(),
            install_guest_agent,
        }
    }

    #[test]
    fn empty_name_is_rejected_before_any_image_work() {
        assert_eq!(build_seed_iso(&seed("", true)), Err(SeedError::EmptyName));
        assert_eq!(SeedError::EmptyName.to_string(), "seed name is empty");
    }

    #[test]
    fn names_that_would_break_meta_data_are_rejected() {
        for name in ["a\nuser: root", "a b", "a:b", "pröxy", "a#b", "\"a\""] {
            let error = build_seed_iso(&seed(name, false)).unwrap_err();
            assert!(
                matches!(&error, SeedError::InvalidName { name: rejected, .. } if rejected == name),
                "{name:?} gave {error:?}"
            );
        }
        let too_long = "a".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            build_seed_iso(&seed(&too_long, false)),
            Err(SeedError::InvalidName { .. })
        ));
    }

    #[test]
    fn kubernetes_style_names_are_accepted() {
        for name in [
            "proxy-reconaaaaaaaaaaa",
            "p",
            "a.b-c.d",
            &"a".repeat(MAX_NAME_LEN),
            "Proxy-1",
        ] {
            assert!(build_seed_iso(&seed(name, false)).is_ok(), "{name:?}");
        }
    }

    #[test]
    fn meta_data_uses_the_name_as_instance_id_and_hostname() {
        assert_eq!(
            meta_data("proxy-a"),
            "instance-id: proxy-a\nlocal-hostname: proxy-a\n"
        );
    }

    #[test]
    fn vendor_data_installs_and_starts_the_guest_agent() {
        let text = vendor_data();
        assert!(
            text.starts_with("#cloud-config\n"),
            "cloud-init needs the header on line 1"
        );
        assert!(text.contains("packages:\n  - qemu-guest-agent\n"));
        assert!(text.contains("runcmd:\n  - systemctl enable --now qemu-guest-agent\n"));
    }

    #[test]
    fn same_seed_gives_identical_bytes() {
        let first = build_seed_iso(&seed("proxy-a", true)).unwrap();
        let second = build_seed_iso(&seed("proxy-a", true)).unwrap();
        assert_eq!(first, second);
        assert_ne!(first, build_seed_iso(&seed("proxy-b", true)).unwrap());
    }

    #[test]
    fn image_is_whole_sectors() {
        let iso = build_seed_iso(&seed("proxy-a", true)).unwrap();
        assert!(!iso.is_empty());
        assert_eq!(iso.len() % SECTOR_SIZE as usize, 0);
    }

    #[test]
    fn debug_and_errors_never_show_user_data() {
        let seed = seed("proxy-a", false);
        let debug = format!("{seed:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(
            debug.contains("proxy-a") && debug.contains("<32 bytes>"),
            "{debug}"
        );
    }
}
