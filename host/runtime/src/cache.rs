//! On-disk cache of compiled components.
//!
//! Compiling a provider with Cranelift takes a second or more; loading its serialized form takes
//! milliseconds. An entry is keyed by the sha256 of the component's bytes and a digest of the
//! engine's [`precompile_compatibility_hash`](wasmtime::Engine::precompile_compatibility_hash),
//! so a different wasmtime version or engine configuration never reads another's entries.
//!
//! Each entry is `<key>.cwasm` (the [`Component::serialize`] output) beside `<key>.sha256` (the
//! digest of that file). A missing, unreadable or corrupt entry is recompiled and rewritten, never
//! an error: the cache only saves time.
//!
//! Loading an entry runs native code from it, in the process that holds every provider's
//! credentials. So the cache trusts only what it can vouch for: the directory (created `0700`)
//! and each entry must belong to the user running the host and be writable by nobody else, or
//! the cache is not used; an entry is read once, into memory, and the bytes deserialized are the
//! bytes whose digest was checked (no second read by path that another process could swap).

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use egress_digest::Digest;
use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The default cache directory: `$XDG_CACHE_HOME/egress-operator`, else
/// `~/.cache/egress-operator`; `None` when neither variable is set.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|home| !home.is_empty())
                .map(|home| PathBuf::from(home).join(".cache"))
        })?;
    Some(base.join("egress-operator"))
}

/// Feeds a [`Hash`] value into sha256, so the engine's compatibility hash becomes a stable digest
/// (std's `DefaultHasher` may change between Rust releases).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        // Only `write` is used: the digest is read with `finalize`.
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Where compiled components are kept for one engine.
#[derive(Clone, Debug)]
pub(crate) struct CompileCache {
    dir: PathBuf,
    engine_digest: String,
}

impl CompileCache {
    /// A cache in `dir` for components compiled by `engine`. Reads nothing: the directory is
    /// checked on every use and created (mode `0700`) on the first write.
    pub(crate) fn new(dir: PathBuf, engine: &Engine) -> CompileCache {
        let mut hasher = Sha256Hasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_digest = hex::encode(hasher.0.finalize());
        CompileCache { dir, engine_digest }
    }

    /// The entry's file for a component whose bytes hash to `component_digest`.
    pub(crate) fn entry_path(&self, component_digest: &Digest) -> PathBuf {
        self.dir.join(format!(
            "{}-{}.cwasm",
            component_digest.hex(),
            &self.engine_digest[..16]
        ))
    }

    fn checksum_path(entry: &Path) -> PathBuf {
        entry.with_extension("sha256")
    }

    /// Load the compiled component for `component_digest`, if a sound entry exists in a
    /// directory only this user can write. Blocking: call it off the async executor.
    pub(crate) fn load(&self, engine: &Engine, component_digest: &Digest) -> Option<Component> {
        if !self.dir.exists() {
            // Nothing cached yet: the first store creates the directory.
            return None;
        }
        if let Err(problem) = owned_by_us_alone(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), %problem, "compile cache not used");
            return None;
        }
        let entry = self.entry_path(component_digest);
        let expected = read_owned_file(&Self::checksum_path(&entry)).ok()?;
        let compiled = match read_owned_file(&entry) {
            Ok(compiled) => compiled,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(entry = %entry.display(), %error, "compile cache entry not used");
                return None;
            }
        };
        // The checksum file holds bare hex, as `try_store` writes it.
        if Digest::of(&compiled).hex().as_bytes() != expected.trim_ascii() {
            tracing::warn!(entry = %entry.display(), "compile cache entry is corrupt; recompiling");
            return None;
        }
        // SAFETY: `deserialize` trusts the bytes to be `Component::serialize` output from a
        // compatible engine; arbitrary bytes could run arbitrary native code. That holds here:
        // these exact bytes (read once, into memory) are the ones whose checksum matched the one
        // this cache wrote after them; both files and their directory belong to this user and
        // nobody else can write them; the name carries this engine's compatibility digest, and
        // wasmtime itself checks the header's engine and version.
        match unsafe { Component::deserialize(engine, &compiled) } {
            Ok(component) => Some(component),
            Err(error) => {
                tracing::warn!(entry = %entry.display(), error = %format!("{error:#}"), "compile cache entry unusable; recompiling");
                None
            }
        }
    }

    /// Store `component`'s compiled form. Failures are logged and otherwise ignored.
    pub(crate) fn store(&self, component: &Component, component_digest: &Digest) {
        if let Err(error) = self.try_store(component, component_digest) {
            tracing::warn!(dir = %self.dir.display(), error = %error, "could not write compile cache entry");
        }
    }

    fn try_store(&self, component: &Component, component_digest: &Digest) -> std::io::Result<()> {
        let compiled = component.serialize().map_err(std::io::Error::other)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        owned_by_us_alone(&self.dir).map_err(std::io::Error::other)?;
        let entry = self.entry_path(component_digest);
        // Write to a unique temporary name and rename: readers never see half a file, and
        // concurrent writers of the same entry each rename a complete copy.
        write_atomically(&entry, &compiled)?;
        write_atomically(
            &Self::checksum_path(&entry),
            Digest::of(&compiled).hex().as_bytes(),
        )
    }
}

/// Why `path` (followed if a link) cannot be trusted: not ours, or writable by others.
fn owned_by_us_alone(path: &Path) -> Result<(), String> {
    let metadata = std::fs::metadata(path).map_err(|error| error.to_string())?;
    check_owner_and_mode(&metadata)
}

fn check_owner_and_mode(metadata: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let us = unsafe { libc::geteuid() };
    if metadata.uid() != us {
        return Err(format!(
            "owned by uid {}, not by this process's uid {us}",
            metadata.uid()
        ));
    }
    if metadata.mode() & 0o022 != 0 {
        return Err(format!(
            "writable by group or others (mode {:o})",
            metadata.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Read a whole file after checking, on the open handle, that only this user can change it.
fn read_owned_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    check_owner_and_mode(&file.metadata()?).map_err(std::io::Error::other)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unique = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temporary = path.with_extension(format!("tmp.{}.{unique}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_name_carries_component_and_engine_digests() {
        let engine = Engine::default();
        let cache = CompileCache::new(PathBuf::from("/cache"), &engine);
        let component = Digest::of(b"abcd");
        let entry = cache.entry_path(&component);
        let name = entry.file_name().unwrap().to_str().unwrap();
        let hex = component.hex();
        assert!(
            name.starts_with(&format!("{hex}-")) && name.ends_with(".cwasm"),
            "{name}"
        );
        assert_eq!(name.len(), hex.len() + "-".len() + 16 + ".cwasm".len());
        // A differently configured engine gets different entries.
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let other = CompileCache::new(PathBuf::from("/cache"), &Engine::new(&config).unwrap());
        assert_ne!(other.entry_path(&component), entry);
    }
}
