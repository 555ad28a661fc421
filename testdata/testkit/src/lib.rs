//! # testkit: what the host crates' tests and benchmarks share
//!
//! Only what crosses crates lives here: where the built components are and the digest the tests
//! compare with. What one crate's tests share stays in that crate's own support module (the
//! operator's CLI runner and Proxmox harness, a fast `Timing`), so that this crate depends on no
//! crate of the host and every host crate can use it.

#![warn(missing_docs)]

use std::path::{Path, PathBuf};

/// The repository's root: this crate is `testdata/testkit`.
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The built component `name` (`proxmox`, `misbehave`, …): `target/components/<name>.wasm`, where
/// `just build-components` puts every component. Fails, saying how to build it, when it is missing.
pub fn component(name: &str) -> PathBuf {
    let path = repository_root()
        .join("target/components")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run `just build-components` first",
        path.display()
    );
    path
}

/// The bytes of the built component `name`.
pub fn component_bytes(name: &str) -> Vec<u8> {
    let path = component(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// sha256 of `bytes`, lowercase hex: a component's digest as the runtime and the registry give it,
/// without the `sha256:` prefix.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_the_known_sha256_of_the_empty_input() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    #[should_panic(expected = "run `just build-components` first")]
    fn a_missing_component_says_how_to_build_it() {
        component("no-such-component");
    }
}
