//! Provider identities: the host's name for a provider, which grants, permits, metrics and logs
//! follow.

use std::path::Path;

use crate::error::LoadError;

/// The identity a file serves as: its name without `.wasm`.
pub(crate) fn identity_of(path: &Path) -> Result<String, LoadError> {
    let stem = path
        .file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or_default();
    match name_problem(stem) {
        None => Ok(stem.to_owned()),
        Some(problem) => Err(LoadError::InvalidIdentity {
            path: path.to_owned(),
            problem: format!("the file name gives the provider its identity: {problem}"),
        }),
    }
}

/// Why `name` cannot name a provider (an identity, or a described name), if it cannot.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the provider name is empty".to_owned());
    }
    if name.len() > 63
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some(format!(
            "the provider name {:?} is not 1-63 characters of lowercase letters, digits and '-'",
            crate::log::escape(crate::log::prefix(name, 80))
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_are_dns_label_like() {
        assert_eq!(name_problem("proxmox"), None);
        assert_eq!(name_problem("reference-2"), None);
        assert!(name_problem("").is_some());
        assert!(name_problem("Prox mox").is_some());
        assert!(name_problem(&"a".repeat(64)).is_some());
    }
}
