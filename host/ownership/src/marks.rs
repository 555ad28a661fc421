//! The mark every VM carries: its name and tags, which say which Proxy, ProviderConfig and
//! installation it was made for. The Proxy reconciler writes them; the orphan sweep and a
//! Proxy's cleanup find VMs by them; nothing deletes a VM whose mark is not this installation's.

use std::collections::BTreeMap;

use egress_runtime::types::Tag;
use sha2::{Digest, Sha256};

use crate::installation::Installation;

/// The tag with the UID of the Proxy a VM was made for (the ownership mark is the UID itself;
/// this tag finds the VM again without knowing its provider ID).
pub const PROXY_UID_TAG: &str = "egress-operator.io/proxy-uid";
/// The tag naming the ProviderConfig a VM was made through (the orphan sweep lists by it).
pub const PROVIDER_CONFIG_TAG: &str = "egress-operator.io/provider-config";
/// The tag naming the Proxy (`namespace/name`), for people.
pub const PROXY_TAG: &str = "egress-operator.io/proxy";
/// The tag naming the installation that made a VM.
pub const INSTALLATION_TAG: &str = "egress-operator.io/installation";

/// The VM's name for a Proxy: `proxy-` and 16 base32 characters of the UID's sha256, 22 in all
/// (a name Proxmox accepts, F10). Deterministic, so a retried create finds the VM it made, and
/// different for a Proxy deleted and made again (a new UID), whose old VM the sweep removes.
pub fn vm_name(uid: &str) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let digest = Sha256::digest(uid.as_bytes());
    let mut bits = 0u32;
    let mut bit_count = 0;
    let mut name = String::from("proxy-");
    for byte in digest {
        bits = (bits << 8) | u32::from(byte);
        bit_count += 8;
        while bit_count >= 5 && name.len() < 22 {
            bit_count -= 5;
            name.push(char::from(ALPHABET[((bits >> bit_count) & 31) as usize]));
        }
    }
    name
}

/// Who a VM is for: what its tags say.
pub struct Owner<'a> {
    /// The Proxy's UID.
    pub uid: &'a str,
    /// The Proxy's `namespace/name`.
    pub proxy: &'a str,
    /// The ProviderConfig it is made through.
    pub provider_config: &'a str,
    /// The installation making it.
    pub installation: &'a Installation,
}

/// The tags a Proxy's VM carries: the spec's `tags`, then the operator's (which win).
pub fn tags(spec_tags: &BTreeMap<String, String>, owner: &Owner<'_>) -> Vec<Tag> {
    let mut tags = spec_tags.clone();
    tags.insert(PROXY_UID_TAG.into(), owner.uid.into());
    tags.insert(PROVIDER_CONFIG_TAG.into(), owner.provider_config.into());
    tags.insert(INSTALLATION_TAG.into(), owner.installation.to_string());
    tags.insert(PROXY_TAG.into(), owner.proxy.into());
    tags.into_iter()
        .map(|(key, value)| Tag { key, value })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_names_are_22_characters_deterministic_and_per_uid_f10() {
        let name = vm_name("6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a90");
        assert_eq!(name.len(), 22);
        assert!(name.starts_with("proxy-"));
        assert!(
            name[6..]
                .bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
        );
        assert_eq!(name, vm_name("6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a90"));
        assert_ne!(name, vm_name("6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a91"));
    }

    #[test]
    fn the_operators_tags_win_over_the_specs() {
        let installation = Installation::new("cluster-a").unwrap();
        let spec = BTreeMap::from([
            (PROXY_UID_TAG.to_owned(), "forged".to_owned()),
            ("team".to_owned(), "net".to_owned()),
        ]);
        let owner = Owner {
            uid: "u-1",
            proxy: "default/p",
            provider_config: "lab",
            installation: &installation,
        };
        let tags: BTreeMap<_, _> = tags(&spec, &owner)
            .into_iter()
            .map(|tag| (tag.key, tag.value))
            .collect();
        assert_eq!(tags[PROXY_UID_TAG], "u-1");
        assert_eq!(tags[INSTALLATION_TAG], "cluster-a");
        assert_eq!(tags[PROVIDER_CONFIG_TAG], "lab");
        assert_eq!(tags[PROXY_TAG], "default/p");
        assert_eq!(tags["team"], "net");
    }
}
