//! Pulled components kept by digest: [`ComponentStore`], what serves an image when the registry is
//! down or the operator restarts.
//!
//! An entry is `<dir>/sha256/<hex>/`: `manifest.json` (it hashes to the digest), `component.wasm`
//! (it hashes to the manifest's layer digest) and `signatures.json`. Each part is checked against
//! its digest when read: an entry altered on disk is a miss, pulled again, never served. The
//! manifest is written last, so a half-written entry is a miss too.

use std::path::{Path, PathBuf};

use egress_digest::Digest;

use crate::oci::{OciError, RegistryClient};
use crate::signing::Signature;

/// Pulled components by digest, in a folder.
#[derive(Clone, Debug)]
pub struct ComponentStore {
    dir: PathBuf,
}

/// Where a component's bytes came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The store.
    Cache,
    /// The registry (and now the store).
    Registry,
}

impl Source {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Registry => "registry",
        }
    }
}

/// A component with the signatures stored beside it.
#[derive(Debug)]
pub struct Stored {
    /// The component's bytes, their digest verified.
    pub bytes: Vec<u8>,
    /// Its signatures as last fetched (empty when none were asked for).
    pub signatures: Vec<Signature>,
    /// Where the bytes came from.
    pub source: Source,
}

/// Why the store cannot serve a digest.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The digest is not `sha256:<64 hex digits>`.
    #[error("{0} is not sha256:<64 hex digits>")]
    InvalidDigest(String),
    /// The entry's folder cannot be created.
    #[error("cannot create {path}: {error}")]
    Unavailable {
        /// The folder.
        path: PathBuf,
        /// What the file system said.
        error: std::io::Error,
    },
    /// The registry refused or failed.
    #[error(transparent)]
    Registry(#[from] OciError),
}

impl StoreError {
    /// The reason a condition gives for it: its registry's, else its own.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreError::Registry(error) => error.reason(),
            StoreError::InvalidDigest(_) => "InvalidImage",
            StoreError::Unavailable { .. } => "ImageCacheUnavailable",
        }
    }
}

/// What an entry holds besides the component.
#[derive(serde::Serialize, serde::Deserialize)]
struct CachedSignatures {
    signatures: Vec<Signature>,
}

impl ComponentStore {
    /// A store in `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> ComponentStore {
        ComponentStore { dir: dir.into() }
    }

    /// The folder of `digest`'s entry, created; its `component.wasm` is where a compile cache
    /// can key the component.
    pub fn entry(&self, digest: &str) -> Result<PathBuf, StoreError> {
        let parsed = Digest::parse(digest)
            .ok()
            .filter(|_| digest.starts_with("sha256:"))
            .ok_or_else(|| StoreError::InvalidDigest(digest.to_owned()))?;
        let entry = self.dir.join("sha256").join(parsed.hex());
        std::fs::create_dir_all(&entry).map_err(|error| StoreError::Unavailable {
            path: entry.clone(),
            error,
        })?;
        Ok(entry)
    }

    /// The component `pinned` (`…@digest`) names: from the store when its entry is whole, else
    /// pulled through `client` (with its signatures when `signed`) and stored.
    pub async fn component<E: From<StoreError>>(
        &self,
        pinned: &str,
        digest: &str,
        signed: bool,
        client: impl FnOnce() -> Result<RegistryClient, E>,
    ) -> Result<Stored, E> {
        let entry = self.entry(digest)?;
        if let Some((bytes, signatures)) = read_entry(&entry, digest) {
            return Ok(Stored {
                bytes,
                signatures,
                source: Source::Cache,
            });
        }
        let client = client()?;
        let pulled = client.pull(pinned).await.map_err(StoreError::from)?;
        let signatures = if signed {
            let found = client.signatures(pinned, digest).await;
            found.map_err(StoreError::from)?
        } else {
            Vec::new()
        };
        write_entry(&entry, &pulled.manifest, &pulled.bytes, &signatures);
        Ok(Stored {
            bytes: pulled.bytes,
            signatures,
            source: Source::Registry,
        })
    }

    /// `digest`'s signatures fetched again (stored ones may predate a rotated key), and stored.
    pub async fn refresh_signatures(
        &self,
        client: &RegistryClient,
        pinned: &str,
        digest: &str,
    ) -> Result<Vec<Signature>, StoreError> {
        let fresh = client.signatures(pinned, digest).await?;
        write_signatures(&self.entry(digest)?, &fresh);
        Ok(fresh)
    }
}

/// The bytes and signatures stored for `digest`, if the entry is whole: the manifest hashes to
/// `digest` and the component to the manifest's layer digest. Anything else is a miss.
fn read_entry(entry: &Path, digest: &str) -> Option<(Vec<u8>, Vec<Signature>)> {
    let manifest = std::fs::read(entry.join("manifest.json")).ok()?;
    if Digest::of(&manifest).to_string() != digest {
        return None;
    }
    let manifest: crate::OciImageManifest = serde_json::from_slice(&manifest).ok()?;
    let layer = manifest.layers.first()?;
    let bytes = std::fs::read(entry.join("component.wasm")).ok()?;
    if Digest::of(&bytes).to_string() != layer.digest {
        return None;
    }
    let signatures = std::fs::read(entry.join("signatures.json"))
        .ok()
        .and_then(|json| serde_json::from_slice::<CachedSignatures>(&json).ok())
        .map(|cached| cached.signatures)
        .unwrap_or_default();
    Some((bytes, signatures))
}

/// Stores a pulled artifact; a failure only costs a pull next time, so it is logged.
fn write_entry(entry: &Path, manifest: &[u8], component: &[u8], signatures: &[Signature]) {
    let written = write_atomically(&entry.join("component.wasm"), component)
        // The manifest last: an entry is read only when it is there.
        .and_then(|()| write_atomically(&entry.join("manifest.json"), manifest));
    if let Err(error) = written {
        tracing::warn!(entry = %entry.display(), error = %error, "cannot cache the pulled image");
    }
    write_signatures(entry, signatures);
}

fn write_signatures(entry: &Path, signatures: &[Signature]) {
    let json = serde_json::to_vec(&CachedSignatures {
        signatures: signatures.to_vec(),
    })
    .unwrap_or_default();
    if let Err(error) = write_atomically(&entry.join("signatures.json"), &json) {
        tracing::warn!(entry = %entry.display(), error = %error, "cannot cache the image's signatures");
    }
}

/// Writes `bytes` beside `path` and renames them into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // Per process: two operators sharing a store never write one partial file.
    let partial = path.with_extension(format!("partial.{}", std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256(bytes: &[u8]) -> String {
        Digest::of(bytes).to_string()
    }

    fn manifest_for(component: &[u8]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": crate::oci::WASM_CONFIG_MEDIA_TYPE, "digest": sha256(b"{}"), "size": 2},
            "layers": [{"mediaType": crate::oci::WASM_LAYER_MEDIA_TYPE, "digest": sha256(component), "size": component.len()}],
        }))
        .unwrap()
    }

    #[test]
    fn an_entry_is_read_only_when_every_part_matches_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let component = b"\0asm component bytes".to_vec();
        let manifest = manifest_for(&component);
        let digest = sha256(&manifest);
        let signature = Signature {
            payload: b"{}".to_vec(),
            signature: vec![1, 2, 3],
        };
        write_entry(
            dir.path(),
            &manifest,
            &component,
            std::slice::from_ref(&signature),
        );
        assert_eq!(
            read_entry(dir.path(), &digest),
            Some((component.clone(), vec![signature]))
        );
        // Another digest asked of the same entry: a miss.
        assert_eq!(read_entry(dir.path(), &sha256(b"other")), None);
        // The component altered on disk: a miss, never the altered bytes.
        let mut altered = component.clone();
        altered[0] ^= 0xff;
        std::fs::write(dir.path().join("component.wasm"), &altered).unwrap();
        assert_eq!(read_entry(dir.path(), &digest), None);
        // The manifest altered: a miss.
        std::fs::write(dir.path().join("component.wasm"), &component).unwrap();
        std::fs::write(dir.path().join("manifest.json"), manifest_for(&altered)).unwrap();
        assert_eq!(read_entry(dir.path(), &digest), None);
    }

    #[test]
    fn an_entry_is_named_by_the_hex_of_a_prefixed_digest_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = ComponentStore::new(dir.path());
        let digest = sha256(b"x");
        let entry = store.entry(&digest).unwrap();
        assert_eq!(
            entry,
            dir.path().join("sha256").join(Digest::of(b"x").hex())
        );
        assert!(entry.is_dir());
        for bad in [
            Digest::of(b"x").hex(),
            "sha256:12".into(),
            "../../etc".into(),
        ] {
            assert!(matches!(
                store.entry(&bad),
                Err(StoreError::InvalidDigest(_))
            ));
        }
    }
}
