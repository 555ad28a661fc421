//! The host objects behind the guest's resource handles. Their fields are the host's: a guest
//! only ever holds a handle into the call's `ResourceTable`.

use std::sync::{Arc, Mutex};

use egress_runtime::lock;
use virt::stream::Stream;

use crate::conn::{ActiveConnection, Conn};

/// Behind a `connection` handle: a pooled (or unpooled) libvirt connection and its grant.
pub struct Connection {
    pub(crate) conn: Arc<Conn>,
    pub(crate) access: Arc<ActiveConnection>,
}

/// Behind a `domain` handle.
pub struct Domain {
    pub(crate) conn: Arc<Conn>,
    pub(crate) access: Arc<ActiveConnection>,
    pub(crate) domain: Arc<virt::domain::Domain>,
    pub(crate) name: String,
    pub(crate) uuid: String,
}

/// Behind a `storage-pool` handle: a pool the grant names.
pub struct StoragePool {
    pub(crate) conn: Arc<Conn>,
    /// The grant of the connection it was opened on (the pools a backing store may name).
    pub(crate) access: Arc<ActiveConnection>,
    /// The connection's URI as granted: which hypervisor this is.
    pub(crate) hypervisor: String,
    pub(crate) pool: Arc<virt::storage_pool::StoragePool>,
    pub(crate) name: String,
}

/// Behind a `volume` handle: a volume of a granted pool.
pub struct Volume {
    pub(crate) conn: Arc<Conn>,
    pub(crate) volume: Arc<virt::storage_vol::StorageVol>,
    pub(crate) name: String,
}

/// Behind a `volume-upload` handle.
pub struct VolumeUpload {
    pub(crate) conn: Arc<Conn>,
    pub(crate) stream: Arc<OpenStream>,
    /// Bytes sent so far.
    pub(crate) written: u64,
    /// The grant's `maxUploadBytes`.
    pub(crate) max: u64,
    /// Set when a write failed or timed out: the stream was (or will be) aborted.
    pub(crate) broken: bool,
}

/// A libvirt stream that is aborted unless finished: libvirt requires an abort before an
/// unfinished stream is freed.
pub(crate) struct OpenStream {
    stream: Mutex<Option<Stream>>,
}

impl OpenStream {
    pub(crate) fn new(stream: Stream) -> Self {
        Self {
            stream: Mutex::new(Some(stream)),
        }
    }

    /// Sends all of `bytes`. Blocks.
    pub(crate) fn send_all(&self, mut bytes: &[u8]) -> Result<(), virt::error::Error> {
        let guard = lock(&self.stream);
        let Some(stream) = guard.as_ref() else {
            return Ok(());
        };
        while !bytes.is_empty() {
            let sent = stream.send(bytes)?;
            if sent == 0 {
                // A blocking stream never sends nothing; fail rather than spin if one does.
                return Err(virt::error::Error::last_error());
            }
            bytes = bytes.get(sent..).unwrap_or_default();
        }
        Ok(())
    }

    /// Finishes the stream; `Ok(false)` when it was already taken. Blocks.
    pub(crate) fn finish(&self) -> Result<bool, virt::error::Error> {
        let taken = lock(&self.stream).take();
        match taken {
            Some(stream) => stream.finish().map(|()| true),
            None => Ok(false),
        }
    }

    /// Aborts the stream if it is still open. Blocks.
    pub(crate) fn abort(&self) {
        if let Some(stream) = lock(&self.stream).take()
            && let Err(error) = stream.abort()
        {
            tracing::debug!(%error, "aborting a libvirt stream failed");
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let open = self
            .stream
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(stream) = open {
            crate::leaves::off_executor(move || {
                if let Err(error) = stream.abort() {
                    tracing::debug!(%error, "aborting a libvirt stream failed");
                }
            });
        }
    }
}
