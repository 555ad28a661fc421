//! The NoCloud seed: built in memory by `nocloud`, uploaded to `isoStorage` as
//! `<name>-seed.iso`, attached as ide2.
//!
//! The upload overwrites an existing file of that name (F12), so there is no delete first
//! (correction 5): a retry after a crash simply uploads again.

use crate::api::{Io, Pve};
use crate::egress::provider::types::Error;
use crate::errors::classify;
use crate::task::wait_task;

/// The seed's file name for proxy `name`.
pub fn seed_file_name(name: &str) -> String {
    format!("{name}-seed.iso")
}

/// The seed's volume ID on `storage`.
pub fn seed_volid(storage: &str, name: &str) -> String {
    format!("{storage}:iso/{}", seed_file_name(name))
}

/// Build the seed image. Every `nocloud` error is `permanent`: the same name and user-data would
/// fail the same way again (nothing here touches storage, unlike the predecessor's staging file).
pub fn build_seed(
    name: &str,
    user_data: &str,
    template_has_guest_agent: bool,
) -> Result<Vec<u8>, Error> {
    nocloud::build_seed_iso(&nocloud::Seed {
        name: name.to_string(),
        user_data: user_data.to_string(),
        // Correction 10: without the agent baked into the template, vendor-data installs it.
        install_guest_agent: !template_has_guest_agent,
    })
    .map_err(|error| Error::Permanent(format!("cannot build the seed for {name:?}: {error}")))
}

/// Upload the seed over any existing file and wait for the `imgcopy` task (F12, correction 5).
pub fn upload_seed<I: Io>(
    pve: &mut Pve<'_, I>,
    node: &str,
    name: &str,
    image: &[u8],
) -> Result<(), Error> {
    let storage = pve.config.iso_storage.clone();
    let file_name = seed_file_name(name);
    let what = format!("upload seed {file_name} to {storage}");
    let upid = pve
        .upload_iso(node, &storage, &file_name, image)
        .map_err(|error| classify(&what, &error))?;
    wait_task(pve, &what, &upid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f12_seed_names_table() {
        assert_eq!(
            seed_file_name("proxy-reconaaaaaaaaaaa"),
            "proxy-reconaaaaaaaaaaa-seed.iso"
        );
        assert_eq!(
            seed_volid("proxy-seeds", "proxy-a"),
            "proxy-seeds:iso/proxy-a-seed.iso"
        );
    }

    #[test]
    fn correction10_seed_carries_vendor_data_unless_the_template_has_the_agent() {
        let with_install = build_seed("proxy-a", "#cloud-config\n", false).unwrap();
        let without = build_seed("proxy-a", "#cloud-config\n", true).unwrap();
        let mentions_agent = |image: &[u8]| image.windows(16).any(|w| w == b"qemu-guest-agent");
        assert!(mentions_agent(&with_install));
        assert!(!mentions_agent(&without));
    }

    #[test]
    fn bad_seed_names_are_permanent() {
        assert!(matches!(
            build_seed("", "x", false),
            Err(Error::Permanent(_))
        ));
    }
}
