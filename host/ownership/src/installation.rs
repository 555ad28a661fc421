//! Which installation of the operator made a VM.
//!
//! Several installations can share one hypervisor: two clusters, or a local-mode folder beside a
//! cluster, each with a ProviderConfig of the same name. A VM's Proxy UID says which Proxy it is
//! for, but a Proxy that is gone cannot say whose VM was made for it. So every VM carries the
//! installation that made it, as the tag [`INSTALLATION_TAG`](crate::marks::INSTALLATION_TAG) written into its mark, and the
//! orphan sweep deletes only VMs that carry this installation's: a VM of another installation is
//! foreign, left alone and reported once.
//!
//! The identity survives restarts: in a cluster it is the UID of the `kube-system` namespace
//! (`cluster-<uid>`), which lives as long as the cluster; in local mode it is made once and kept
//! in the folder's state (`local-<uuid>`). `--installation NAME` chooses one by hand (two
//! operators in one cluster, or a state folder moved to a new machine).

use std::fmt;

/// An installation's identity: 1 to 63 characters of lower-case letters, digits, `-` and `.`,
/// starting and ending with a letter or digit (a Kubernetes label value, lower case).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Installation(String);

impl Installation {
    /// `id`, checked.
    pub fn new(id: &str) -> Result<Installation, String> {
        let valid_char =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
        let alphanumeric =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if id.is_empty() || id.len() > 63 {
            return Err(format!("installation {id:?}: 1 to 63 characters"));
        }
        if !id.chars().all(valid_char)
            || !alphanumeric(id.chars().next())
            || !alphanumeric(id.chars().last())
        {
            return Err(format!(
                "installation {id:?}: lower-case letters, digits, '-' and '.', starting and ending \
                 with a letter or digit"
            ));
        }
        Ok(Installation(id.to_owned()))
    }

    /// A cluster's: the UID of its `kube-system` namespace.
    pub fn of_cluster(kube_system_uid: &str) -> Result<Installation, String> {
        Installation::new(&format!("cluster-{}", kube_system_uid.to_ascii_lowercase()))
    }

    /// A new local-mode installation, made once per state folder.
    pub fn new_local() -> Installation {
        Installation(format!("local-{}", uuid::Uuid::new_v4()))
    }

    /// The identity.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Installation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_label_values() {
        for good in [
            "a",
            "prod-eu",
            "cluster-6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a90",
            "a.b-1",
        ] {
            assert_eq!(Installation::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "-a", "a-", "Prod", "a b", "a/b", "a=b", &"x".repeat(64)] {
            assert!(Installation::new(bad).is_err(), "{bad:?}");
        }
        assert!(Installation::new_local().as_str().starts_with("local-"));
        assert!(Installation::new(Installation::new_local().as_str()).is_ok());
        assert_eq!(
            Installation::of_cluster("6C1F0A2E-5D7B-4B8E-9A51-0D3C2F1E7A90")
                .unwrap()
                .as_str(),
            "cluster-6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a90"
        );
    }
}
