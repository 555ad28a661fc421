//! What every call shares: the per-call context, running libvirt off the executor within the
//! timeout and the deadline, and the bounds on guest input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bindings::egress::libvirt::libvirt::Error;
use crate::conn::Conn;
pub use crate::leaves::MAX_NAME_BYTES;
pub(crate) use crate::leaves::{is_simple_name, off_executor};
use crate::{ActiveGrant, Shared};

/// Largest domain XML the guest may pass to `define-domain`.
pub const MAX_DOMAIN_XML_BYTES: usize = 256 * 1024;
/// Largest volume XML the guest may pass to `create-volume` or `clone-volume`.
pub const MAX_VOLUME_XML_BYTES: usize = 16 * 1024;
/// Largest metadata element the guest may pass to `set-metadata`.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;
/// Largest chunk the guest may pass to `volume-upload.write`.
pub const MAX_CHUNK_BYTES: usize = 1024 * 1024;
/// Longest image URL the guest may pass to `import-image`.
pub const MAX_URL_BYTES: usize = 2048;
/// Most connections one `connection.probe` checks.
pub const MAX_PROBES: usize = 64;

/// The libvirt state of one provider call, built by [`LibvirtCapability::prepare`]: owned by that
/// call's store, shared with nothing else.
///
/// [`LibvirtCapability::prepare`]: crate::LibvirtCapability::prepare
pub struct LibvirtCallCtx {
    /// The provider's grant; `None` for a provider without one (every open is denied).
    pub(crate) grant: Option<Arc<ActiveGrant>>,
    /// The connection pool and the image clients, shared by every call of every provider.
    pub(crate) shared: Arc<Shared>,
    /// When the calling operation must be over; every libvirt call stops there too.
    pub(crate) deadline: Instant,
}

impl std::fmt::Debug for LibvirtCallCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibvirtCallCtx")
            .field(
                "provider",
                &self.grant.as_ref().map(|grant| grant.identity.as_str()),
            )
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl LibvirtCallCtx {
    /// The grant, or `denied` for a provider that has none.
    pub(crate) fn grant(&self) -> Result<&Arc<ActiveGrant>, Error> {
        self.grant
            .as_ref()
            .ok_or_else(|| crate::error::denied("this provider has no libvirt grant".into()))
    }

    /// The per-call timeout of the grant.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.grant
            .as_ref()
            .map_or(Duration::ZERO, |grant| grant.timeouts.call())
    }

    /// When a call started now with `timeout` must stop: the earlier of the timeout and the
    /// operation's deadline; `None` when that is already past.
    pub(crate) fn stop_at(&self, timeout: Duration) -> Option<Instant> {
        let now = Instant::now();
        let stop = now
            .checked_add(timeout)
            .map_or(self.deadline, |end| end.min(self.deadline));
        (stop > now).then_some(stop)
    }

    /// Runs `work` on a blocking thread within the per-call timeout and the deadline. On a
    /// timeout the guest gets `timeout` at once, `on` (when pooled) leaves the pool, and `work`
    /// runs on to completion in the background, because a libvirt call cannot be cancelled.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        on: Option<&Arc<Conn>>,
        work: impl FnOnce() -> Result<T, Error> + Send + 'static,
    ) -> wasmtime::Result<Result<T, Error>> {
        self.shared.count_call()?;
        let Some(stop) = self.stop_at(self.call_timeout()) else {
            return Ok(Err(Error::Timeout));
        };
        let task = tokio::task::spawn_blocking(work);
        match tokio::time::timeout_at(tokio::time::Instant::from_std(stop), task).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(join)) => Err(wasmtime::format_err!("a libvirt call failed: {join}")),
            Err(_elapsed) => {
                tracing::warn!(
                    provider = self
                        .grant
                        .as_ref()
                        .map_or("", |grant| grant.identity.as_str()),
                    "libvirt call timed out"
                );
                if let Some(conn) = on {
                    self.shared.pool.evict(conn);
                }
                Ok(Err(Error::Timeout))
            }
        }
    }
}

/// Checks a guest string: at most `max` bytes and no NUL (libvirt takes C strings).
pub(crate) fn bounded(what: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.len() > max {
        return Err(Error::Invalid(format!(
            "{what} is {} bytes, more than {max}",
            value.len()
        )));
    }
    if value.contains('\0') {
        return Err(Error::Invalid(format!("{what} contains a NUL character")));
    }
    Ok(())
}

/// Checks a name from the guest with [`is_simple_name`].
pub(crate) fn name(what: &str, value: &str) -> Result<(), Error> {
    if is_simple_name(value) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{what} must be 1 to {MAX_NAME_BYTES} bytes without '/' or NUL"
        )))
    }
}

/// Checks a UUID from the guest: the canonical `8-4-4-4-12` hex form.
pub(crate) fn uuid(value: &str) -> Result<(), Error> {
    let canonical = value.len() == 36
        && value.char_indices().all(|(index, c)| match index {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    if canonical {
        Ok(())
    } else {
        Err(Error::Invalid(
            "uuid must be 8-4-4-4-12 hexadecimal digits".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_uuids_and_bounds_are_checked() {
        assert!(is_simple_name("proxy-a.qcow2"));
        for bad in ["", ".", "..", "a/b", "a\0b", &"x".repeat(256)] {
            assert!(!is_simple_name(bad), "{bad:?}");
        }
        assert!(uuid("0b7c2f3e-1a2b-4c3d-8e9f-001122334455").is_ok());
        assert!(uuid("0b7c2f3e1a2b4c3d8e9f001122334455").is_err());
        assert!(uuid("0b7c2f3e-1a2b-4c3d-8e9f-00112233445g").is_err());
        assert!(bounded("xml", "abc", 3).is_ok());
        assert!(matches!(bounded("xml", "abcd", 3), Err(Error::Invalid(_))));
        assert!(matches!(bounded("xml", "a\0", 3), Err(Error::Invalid(_))));
    }
}
