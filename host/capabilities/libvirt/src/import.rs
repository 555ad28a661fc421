//! `storage-pool.import-image`: the host downloads a base image from a granted HTTPS origin and
//! streams it straight into a new volume, hashing as it goes. The guest never holds the bytes.
//!
//! One blocking task (the sink) owns the volume from its creation to its end: it creates the
//! volume, writes what the download hands it through a small bounded channel (memory stays at a
//! few chunks whatever the image's size), and either finishes the upload when told the checksum
//! matched, or aborts it and deletes the volume: on a mismatch, an error, a timeout, or when the
//! guest's call is abandoned (the channel closes without a commit).

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;

use crate::bindings::egress::libvirt::libvirt::{DownloadError, Error};
use crate::call::{self, LibvirtCallCtx, MAX_URL_BYTES};
use crate::conn::Conn;
use crate::grant::{GrantError, ImageGrant};
use crate::resources::OpenStream;

/// Chunks in flight between the download and the volume.
const CHANNEL_CHUNKS: usize = 4;

/// A provider's image grant, validated: shared by every call of the provider.
#[derive(Debug)]
pub(crate) struct ImageAccess {
    origins: Vec<url::Origin>,
    ca_file: std::path::PathBuf,
    max_bytes: u64,
}

impl ImageAccess {
    /// Validates `provider`'s image grant. Reads no file.
    pub(crate) fn new(provider: &str, grant: &ImageGrant) -> Result<Self, GrantError> {
        let invalid = |reason: String| GrantError::Invalid {
            provider: provider.to_owned(),
            field: "images.origins".into(),
            reason,
        };
        if grant.max_bytes == 0 {
            return Err(GrantError::Invalid {
                provider: provider.to_owned(),
                field: "images.maxBytes".into(),
                reason: "must be above zero".into(),
            });
        }
        let origins = grant
            .origins
            .iter()
            .map(|text| {
                let url =
                    url::Url::parse(text).map_err(|error| invalid(format!("{text:?}: {error}")))?;
                let bare = url.scheme() == "https"
                    && url.username().is_empty()
                    && url.password().is_none()
                    && url.path() == "/"
                    && url.query().is_none()
                    && url.fragment().is_none();
                if !bare {
                    return Err(invalid(format!(
                        "{text:?} is not https://host[:port] with no path"
                    )));
                }
                Ok(url.origin())
            })
            .collect::<Result<Vec<_>, _>>()?;
        if origins.is_empty() {
            return Err(invalid("is empty".into()));
        }
        Ok(Self {
            origins,
            ca_file: grant.ca_file.clone(),
            max_bytes: grant.max_bytes,
        })
    }

    /// The guest's URL, if it is on a granted origin.
    fn check(&self, text: &str) -> Result<url::Url, Error> {
        let url =
            url::Url::parse(text).map_err(|error| Error::Invalid(format!("image URL: {error}")))?;
        if url.scheme() != "https" || !url.username().is_empty() || url.password().is_some() {
            return Err(crate::error::denied(
                "image URLs are https, without user information".into(),
            ));
        }
        if !self.origins.contains(&url.origin()) {
            return Err(crate::error::denied(format!(
                "image origin {} is not granted",
                url.origin().ascii_serialization()
            )));
        }
        Ok(url)
    }
}

/// Imports `url` into a new volume `name` of `pool`, checking `sha256`.
pub(crate) async fn import(
    ctx: &LibvirtCallCtx,
    conn: Arc<Conn>,
    pool: Arc<StoragePool>,
    name: String,
    url: String,
    sha256: String,
) -> wasmtime::Result<Result<StorageVol, Error>> {
    let grant = match ctx.grant() {
        Ok(grant) => grant.clone(),
        Err(denied) => return Ok(Err(denied)),
    };
    let checked = call::name("volume name", &name)
        .and_then(|()| call::bounded("image URL", &url, MAX_URL_BYTES))
        .and_then(|()| digest(&sha256));
    let expected = match checked {
        Ok(expected) => expected,
        Err(invalid) => return Ok(Err(invalid)),
    };
    let Some(images) = &grant.images else {
        return Ok(Err(crate::error::denied(
            "this provider may not import images".into(),
        )));
    };
    let url = match images.check(&url) {
        Ok(url) => url,
        Err(refused) => return Ok(Err(refused)),
    };
    let Some(stop) = ctx.stop_at(grant.timeouts.import()) else {
        return Ok(Err(Error::Timeout));
    };
    let transfer = Transfer {
        images,
        conn,
        pool,
        name,
        expected,
        connect_timeout: grant.timeouts.call(),
    };
    match tokio::time::timeout_at(tokio::time::Instant::from_std(stop), transfer.run(url)).await {
        Ok(outcome) => Ok(outcome),
        Err(_elapsed) => {
            tracing::warn!(provider = %grant.identity, "image import timed out");
            Ok(Err(Error::Timeout))
        }
    }
}

/// The 32 bytes of a 64-hex-digit sha256.
fn digest(text: &str) -> Result<[u8; 32], Error> {
    let mut digest = [0; 32];
    hex::decode_to_slice(text, &mut digest)
        .map_err(|_| Error::Invalid("sha256 must be 64 hexadecimal digits".into()))?;
    Ok(digest)
}

struct Transfer<'a> {
    images: &'a ImageAccess,
    conn: Arc<Conn>,
    pool: Arc<StoragePool>,
    name: String,
    expected: [u8; 32],
    connect_timeout: std::time::Duration,
}

enum Chunk {
    Data(Bytes),
    /// The checksum matched: finish the upload.
    Commit,
}

impl Transfer<'_> {
    async fn run(self, url: url::Url) -> Result<StorageVol, Error> {
        let client = client(&self.images.ca_file, self.connect_timeout)?;
        let mut response = client
            .get(url.as_str())
            .send()
            .await
            .map_err(|error| download_error(&error))?;
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Err(Error::Download(DownloadError {
                status: Some(status.as_u16()),
                retryable: status.is_server_error()
                    || status == reqwest::StatusCode::REQUEST_TIMEOUT
                    || status == reqwest::StatusCode::TOO_MANY_REQUESTS,
                message: format!("the image origin answered {status}"),
            }));
        }
        let max = self.images.max_bytes;
        if response.content_length().is_some_and(|length| length > max) {
            return Err(too_large(max));
        }

        let (sender, receiver) = mpsc::channel(CHANNEL_CHUNKS);
        let (conn, pool, name) = (self.conn.clone(), self.pool.clone(), self.name.clone());
        let sink = tokio::task::spawn_blocking(move || sink(&conn, &pool, &name, receiver));

        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let mut failure = None;
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(error) => {
                    failure = Some(download_error(&error));
                    break;
                }
            };
            received += chunk.len() as u64;
            if received > max {
                failure = Some(too_large(max));
                break;
            }
            hasher.update(&chunk);
            if sender.send(Chunk::Data(chunk)).await.is_err() {
                // The sink stopped on a libvirt error; it says which below.
                break;
            }
        }
        let actual: [u8; 32] = hasher.finalize().into();
        if failure.is_none() && actual != self.expected {
            failure = Some(Error::ChecksumMismatch(format!(
                "expected sha256 {}, the image has {}",
                hex::encode(self.expected),
                hex::encode(actual)
            )));
        }
        if failure.is_none() {
            // Nothing to do if the sink is gone: its own error is what it returns.
            let _ = sender.send(Chunk::Commit).await;
        }
        drop(sender);
        let stored = sink
            .await
            .map_err(|join| Error::Invalid(format!("the import failed: {join}")))?;
        match failure {
            Some(failure) => Err(failure),
            None => stored,
        }
    }
}

/// Creates the volume, writes what arrives, and finishes on `Commit`; on anything else aborts
/// and deletes the volume. Blocks.
fn sink(
    conn: &Conn,
    pool: &StoragePool,
    name: &str,
    mut receiver: mpsc::Receiver<Chunk>,
) -> Result<StorageVol, Error> {
    let lv = |error: virt::error::Error| crate::error::libvirt(&error);
    let xml = format!(
        "<volume><name>{}</name><capacity unit='bytes'>0</capacity><target><format type='raw'/></target></volume>",
        escape(name)
    );
    let volume = StorageVol::create_xml(pool, &xml, 0).map_err(lv)?;
    let written = (|| {
        let stream = virt::stream::Stream::new(conn.connect(), 0).map_err(lv)?;
        volume.upload(&stream, 0, 0, 0).map_err(lv)?;
        let stream = OpenStream::new(stream);
        loop {
            match receiver.blocking_recv() {
                Some(Chunk::Data(bytes)) => stream.send_all(&bytes).map_err(lv)?,
                Some(Chunk::Commit) => return stream.finish().map(drop).map_err(lv),
                None => {
                    stream.abort();
                    return Err(Error::Invalid("the import was abandoned".into()));
                }
            }
        }
    })();
    match written {
        Ok(()) => Ok(volume),
        Err(error) => {
            if let Err(delete) = volume.delete(0) {
                tracing::warn!(volume = name, error = %delete, "deleting a failed import's volume failed");
            }
            Err(error)
        }
    }
}

fn too_large(max: u64) -> Error {
    Error::Download(DownloadError {
        status: None,
        retryable: false,
        message: format!("the image is larger than the grant's maxBytes ({max})"),
    })
}

/// Escapes text for XML content.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '\'' => escaped.push_str("&apos;"),
            '"' => escaped.push_str("&quot;"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// A client that trusts the grant's CA only: no system roots, no proxy, no redirects. Reads the
/// CA on every import (imports are rare; a rotated CA is used at once).
fn client(ca_file: &Path, connect_timeout: std::time::Duration) -> Result<reqwest::Client, Error> {
    let unusable = |message: String, retryable: bool| {
        tracing::warn!(ca_file = %ca_file.display(), %message, "image CA unusable");
        Error::Download(DownloadError {
            status: None,
            retryable,
            message,
        })
    };
    let certificates = CertificateDer::pem_file_iter(ca_file).map_err(|error| match error {
        rustls_pki_types::pem::Error::Io(io) if io.kind() == io::ErrorKind::NotFound => {
            unusable(format!("the image CA file is not there yet: {io}"), true)
        }
        other => unusable(format!("the image CA file: {other}"), false),
    })?;
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .referer(false)
        .https_only(true)
        .connect_timeout(connect_timeout);
    let mut any = false;
    for certificate in certificates {
        let certificate =
            certificate.map_err(|error| unusable(format!("the image CA file: {error}"), false))?;
        let root = reqwest::Certificate::from_der(&certificate)
            .map_err(|error| unusable(format!("the image CA file: {error}"), false))?;
        builder = builder.add_root_certificate(root);
        any = true;
    }
    if !any {
        return Err(unusable(
            "the image CA file holds no certificate".into(),
            false,
        ));
    }
    builder
        .build()
        .map_err(|error| unusable(format!("building the image client: {error}"), false))
}

/// A failed exchange as the guest sees it: TLS failures are permanent, the rest retryable.
fn download_error(error: &reqwest::Error) -> Error {
    let mut tls = false;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if current.downcast_ref::<rustls::Error>().is_some() {
            tls = true;
        }
        cause = current.source().or_else(|| {
            current
                .downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .map(|inner| inner as &(dyn std::error::Error + 'static))
        });
    }
    tracing::warn!(%error, tls, "image download failed");
    Error::Download(DownloadError {
        status: None,
        retryable: !tls,
        message: if tls {
            format!("TLS with the image origin failed: {error}")
        } else {
            format!("reading the image failed: {error}")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(origins: &[&str]) -> Result<ImageAccess, GrantError> {
        ImageAccess::new(
            "p",
            &ImageGrant {
                origins: origins.iter().map(|origin| origin.to_string()).collect(),
                ca_file: "/ca.pem".into(),
                max_bytes: 10,
            },
        )
    }

    #[test]
    fn origins_are_https_without_a_path() {
        access(&["https://images.lab", "https://10.0.0.1:8443/"]).unwrap();
        for bad in [
            "http://images.lab",
            "https://images.lab/path",
            "https://u@images.lab",
            "https://images.lab?q",
        ] {
            assert!(access(&[bad]).is_err(), "{bad}");
        }
        assert!(access(&[]).is_err());
    }

    #[test]
    fn urls_must_be_on_a_granted_origin() {
        let access = access(&["https://images.lab"]).unwrap();
        assert!(access.check("https://images.lab/a/b.qcow2").is_ok());
        assert!(access.check("https://images.lab:443/a").is_ok());
        for denied in [
            "https://images.lab:8443/a",
            "https://other.lab/a",
            "http://images.lab/a",
            "https://u:p@images.lab/a",
        ] {
            assert!(
                matches!(access.check(denied), Err(Error::Denied(_))),
                "{denied}"
            );
        }
        assert!(matches!(access.check("not a url"), Err(Error::Invalid(_))));
    }

    #[test]
    fn checksums_are_64_hex_digits_and_names_are_escaped() {
        assert!(digest(&"ab".repeat(32)).is_ok());
        assert!(digest(&"ab".repeat(31)).is_err());
        assert!(digest(&"zz".repeat(32)).is_err());
        assert_eq!(escape("a<&'\">"), "a&lt;&amp;&apos;&quot;&gt;");
    }
}
