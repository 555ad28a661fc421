//! Helpers with no dependency inside the crate, so that the modules the generated bindings map
//! resources onto (`resources`, `conn`) can use them without reaching back to `call`.

/// Longest name the guest may pass (connection, domain, pool, volume).
pub const MAX_NAME_BYTES: usize = 255;

/// Runs `work` on a blocking thread when inside a tokio runtime (a drop on the executor), in
/// place otherwise.
pub(crate) fn off_executor(work: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn_blocking(work);
        }
        Err(_) => work(),
    }
}

/// A name libvirt can take as one path component: 1 to 255 bytes, no `/`, no NUL, not `.`/`..`.
pub(crate) fn is_simple_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && !name.contains(['/', '\0'])
        && name != "."
        && name != ".."
}
