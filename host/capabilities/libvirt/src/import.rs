//! `storage-pool.import-image`: the host downloads a base image from a granted HTTPS origin and
//! streams it straight into a volume, hashing as it goes. The guest never holds the bytes.
//!
//! **The volume's name appears only once its bytes are verified.** An import is a job of the
//! host's, one per volume being imported ([`Imports`]):
//!
//! 1. it deletes a temporary volume `<name>.importing` left by an import that died, and stops at
//!    once if `<name>` exists;
//! 2. it streams the image into `<name>.importing`: one blocking task (the sink) owns that volume
//!    from its creation to its end, writes what the download hands it through a small bounded
//!    channel (memory stays at a few chunks whatever the image's size), and either finishes the
//!    upload when told the checksum matched, or aborts it and deletes the volume;
//! 3. it publishes the verified volume as `<name>`, a copy libvirt makes itself
//!    (`virStorageVolCreateXMLFrom`: libvirt has no rename, and refuses to clone a volume it is
//!    still copying), then deletes the temporary one.
//!
//! Both volumes are in the format the image's first bytes say (qcow2 by its magic, raw
//! otherwise), so qcow2 stays qcow2; a qcow2 image naming a backing file is refused, and so is one
//! libvirt reads as another format than its bytes begin with.
//!
//! So a create running beside an import, or one after a crash in the middle of it, never finds
//! a partial base under the final name. **A job outlives the call that started it**: the call
//! waits until its own deadline and answers `timeout`, the job goes on up to the grant's import
//! timeout, and a later `import-image` of the same volume and checksum waits for the same job
//! instead of starting the download again. A large image on a slow link converges over
//! retries. What a provider can make the host hold is bounded: at most
//! [`MAX_IMPORTS_PER_PROVIDER`] jobs at once, each within `maxBytes` and the import timeout.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use egress_runtime::grant::{GrantContext, GrantError};
use egress_runtime::lock;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;

use crate::bindings::egress::libvirt::libvirt::{DownloadError, Error};
use crate::call::{self, LibvirtCallCtx, MAX_URL_BYTES};
use crate::conn::Conn;
use crate::grant::ImageGrant;
use crate::resources::OpenStream;
use crate::retention::IMPORTING_SUFFIX;

/// Chunks in flight between the download and the volume.
const CHANNEL_CHUNKS: usize = 4;

/// Import jobs one provider identity may have running at once.
pub const MAX_IMPORTS_PER_PROVIDER: usize = 2;

/// The CA trusted for image origins: held in memory from a Secret or ConfigMap, or a file read
/// at each import.
#[derive(Clone, Debug)]
enum ImageCa {
    Pem(String),
    File(std::path::PathBuf),
}

/// A provider's image grant, validated: shared by every call of the provider.
#[derive(Debug)]
pub(crate) struct ImageAccess {
    origins: Vec<url::Origin>,
    ca: ImageCa,
    max_bytes: u64,
    /// How long an image nothing uses stays (see `retention`).
    pub(crate) unused_retention: std::time::Duration,
}

impl ImageAccess {
    /// Validates `identity`'s image grant and resolves its CA reference. Reads no file.
    pub(crate) fn new(
        identity: &str,
        grant: &ImageGrant,
        context: &GrantContext<'_>,
    ) -> Result<Self, GrantError> {
        let about = GrantError::about("libvirt", identity);
        let invalid = |reason: String| about("images.origins", reason);
        if grant.max_bytes == 0 {
            return Err(about("images.maxBytes", "must be above zero".into()));
        }
        let ca = match (
            &grant.ca_secret_ref,
            &grant.ca_config_map_ref,
            &grant.ca_file,
        ) {
            (Some(reference), None, None) => {
                let bytes = context
                    .host
                    .secret(reference)
                    .map_err(|reason| about("images.caSecretRef", reason))?;
                ImageCa::Pem(
                    String::from_utf8(bytes.to_vec()).map_err(|_| {
                        about("images.caSecretRef", "the CA is not UTF-8 PEM".into())
                    })?,
                )
            }
            (None, Some(reference), None) => ImageCa::Pem(
                context
                    .host
                    .config_map(reference)
                    .map_err(|reason| about("images.caConfigMapRef", reason))?,
            ),
            (None, None, Some(file)) => {
                context
                    .host
                    .file(file)
                    .map_err(|reason| about("images.caFile", reason))?;
                ImageCa::File(file.clone())
            }
            _ => {
                return Err(about(
                    "images.caFile",
                    "name exactly one of caSecretRef, caConfigMapRef and caFile: the only roots trusted for image origins".into(),
                ));
            }
        };
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
            ca,
            max_bytes: grant.max_bytes,
            unused_retention: std::time::Duration::from_millis(grant.unused_retention_ms),
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

/// The import jobs running, shared by every call of every provider.
#[derive(Default)]
pub(crate) struct Imports {
    jobs: Mutex<HashMap<JobKey, Arc<Job>>>,
}

/// Where an import lands: a pool of a hypervisor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Place {
    /// The hypervisor's granted URI.
    pub(crate) hypervisor: String,
    /// The pool's name.
    pub(crate) pool: String,
}

/// One volume being imported: whichever connection, identity or call asks for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct JobKey {
    place: Place,
    name: String,
}

/// A running import, which callers wait on.
struct Job {
    identity: String,
    expected: [u8; 32],
    /// `Some` once the job has ended.
    done: watch::Receiver<Option<Result<(), Error>>>,
    task: tokio::task::AbortHandle,
}

impl Imports {
    /// The job importing `key`, started now if there is none; `Err` when a job of the volume
    /// imports other bytes, or the provider has its quota of jobs running.
    fn join(
        self: &Arc<Self>,
        key: JobKey,
        identity: &str,
        expected: [u8; 32],
        start: impl FnOnce() -> (
            tokio::task::JoinHandle<()>,
            watch::Receiver<Option<Result<(), Error>>>,
        ),
    ) -> Result<Arc<Job>, Error> {
        let mut jobs = lock(&self.jobs);
        if let Some(job) = jobs.get(&key) {
            // The same bytes from another URL are the same volume: wait for them. Other bytes
            // under the name wait until the job ends, as a retry.
            if job.expected != expected {
                return Err(Error::Download(DownloadError {
                    status: None,
                    retryable: true,
                    message: format!(
                        "volume {} is being imported with another checksum",
                        key.name
                    ),
                }));
            }
            return Ok(Arc::clone(job));
        }
        let running = jobs.values().filter(|job| job.identity == identity).count();
        if running >= MAX_IMPORTS_PER_PROVIDER {
            return Err(Error::Download(DownloadError {
                status: None,
                retryable: true,
                message: format!(
                    "{running} imports of this provider are running, the most at once"
                ),
            }));
        }
        let (task, done) = start();
        let job = Arc::new(Job {
            identity: identity.to_owned(),
            expected,
            done,
            task: task.abort_handle(),
        });
        jobs.insert(key, Arc::clone(&job));
        Ok(job)
    }

    /// Forgets `job`, which has ended.
    fn finished(&self, key: &JobKey, job_done: &watch::Sender<Option<Result<(), Error>>>) {
        let mut jobs = lock(&self.jobs);
        if jobs
            .get(key)
            .is_some_and(|job| job.done.same_channel(&job_done.subscribe()))
        {
            jobs.remove(key);
        }
    }

    /// Whether a job is importing volume `name` at `place`.
    pub(crate) fn is_running(&self, place: &Place, name: &str) -> bool {
        lock(&self.jobs).contains_key(&JobKey {
            place: place.clone(),
            name: name.to_owned(),
        })
    }

    /// Stops the jobs `identity` started: its grant is gone.
    pub(crate) fn abort_of(&self, identity: &str) {
        lock(&self.jobs).retain(|_, job| {
            let theirs = job.identity == identity;
            if theirs {
                job.task.abort();
            }
            !theirs
        });
    }

    /// TEST ONLY: stops every job at once, as a host that died would.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn abort_all(&self) {
        for job in lock(&self.jobs).drain().map(|(_, job)| job) {
            job.task.abort();
        }
    }
}

/// Imports `url` into a volume `name` of `pool` (at `place`), checking `sha256`: starts or
/// joins the volume's job and waits for it until the call's deadline.
pub(crate) async fn import(
    ctx: &LibvirtCallCtx,
    conn: Arc<Conn>,
    pool: Arc<StoragePool>,
    place: Place,
    name: String,
    url: String,
    sha256: String,
) -> wasmtime::Result<Result<StorageVol, Error>> {
    let grant = match ctx.grant() {
        Ok(grant) => grant.clone(),
        Err(denied) => return Ok(Err(denied)),
    };
    let checked = call::name("volume name", &name)
        .and_then(|()| call::name("volume name", &format!("{name}{IMPORTING_SUFFIX}")))
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
    let imported = crate::retention::VolumeKey {
        hypervisor: place.hypervisor.clone(),
        pool: place.pool.clone(),
        volume: name.clone(),
    };
    let key = JobKey {
        place,
        name: name.clone(),
    };
    let imports = Arc::clone(&ctx.shared.imports);
    let job = imports.join(key.clone(), &grant.identity, expected, || {
        let url = url.clone();
        let (sender, done) = watch::channel(None);
        let transfer = Transfer {
            ca: images.ca.clone(),
            max_bytes: images.max_bytes,
            conn: conn.clone(),
            pool: pool.clone(),
            name: name.clone(),
            expected,
            connect_timeout: grant.timeouts.call(),
        };
        let (identity, timeout, imports) = (grant.identity.clone(), grant.timeouts.import(), Arc::clone(&imports));
        let task = tokio::spawn(async move {
            let outcome = match tokio::time::timeout(timeout, transfer.run(url)).await {
                Ok(outcome) => outcome,
                Err(_elapsed) => {
                    tracing::warn!(provider = %identity, volume = %transfer_name(&key), "image import timed out");
                    Err(Error::Timeout)
                }
            };
            let _ = sender.send(Some(outcome));
            imports.finished(&key, &sender);
        });
        (task, done)
    });
    let job = match job {
        Ok(job) => job,
        Err(refused) => return Ok(Err(refused)),
    };
    let mut done = job.done.clone();
    drop(job);
    let deadline = tokio::time::Instant::from_std(ctx.deadline);
    let outcome = match tokio::time::timeout_at(deadline, done.wait_for(Option::is_some)).await {
        // The job goes on; the next import of the volume waits for it.
        Err(_elapsed) => return Ok(Err(Error::Timeout)),
        // The job was stopped (its provider's grant went): a retry starts another.
        Ok(Err(_closed)) => Err(Error::Timeout),
        Ok(Ok(outcome)) => outcome.clone().unwrap_or(Err(Error::Timeout)),
    };
    if let Err(error) = outcome {
        return Ok(Err(error));
    }
    // Imported, or found there: in use now, for the image retention.
    ctx.shared.retention.used(imported);
    ctx.blocking(Some(&conn), move || {
        StorageVol::lookup_by_name(&pool, &name).map_err(|error| crate::error::libvirt(&error))
    })
    .await
}

/// The volume name of a job's key, for logs.
fn transfer_name(key: &JobKey) -> String {
    format!("{}/{}", key.place.pool, key.name)
}

/// The 32 bytes of a 64-hex-digit sha256.
fn digest(text: &str) -> Result<[u8; 32], Error> {
    let mut digest = [0; 32];
    hex::decode_to_slice(text, &mut digest)
        .map_err(|_| Error::Invalid("sha256 must be 64 hexadecimal digits".into()))?;
    Ok(digest)
}

/// What an import job holds: everything it needs after the call that started it is gone.
struct Transfer {
    ca: ImageCa,
    max_bytes: u64,
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

impl Transfer {
    /// Steps 1 to 3 of the module's list.
    async fn run(&self, url: url::Url) -> Result<(), Error> {
        let temporary = format!("{}{IMPORTING_SUFFIX}", self.name);
        let (pool, name, stale) = (self.pool.clone(), self.name.clone(), temporary.clone());
        let published = blocking(move || {
            if let Ok(left) = StorageVol::lookup_by_name(&pool, &stale) {
                tracing::info!(volume = %stale, "deleting what an import that died left");
                left.delete(0)
                    .map_err(|error| crate::error::libvirt(&error))?;
            }
            Ok(StorageVol::lookup_by_name(&pool, &name).is_ok())
        })
        .await?;
        if published {
            return Ok(());
        }
        let format = self.download(url, &temporary).await?;
        let (pool, name) = (self.pool.clone(), self.name.clone());
        blocking(move || publish(&pool, &temporary, &name, format)).await
    }

    /// Streams `url` into a new volume `temporary`, checking the sha256; the volume is deleted
    /// unless it holds the expected bytes. Answers the image's format.
    async fn download(&self, url: url::Url, temporary: &str) -> Result<&'static str, Error> {
        let client = client(&self.ca, self.connect_timeout)?;
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
        let max = self.max_bytes;
        if response.content_length().is_some_and(|length| length > max) {
            return Err(too_large(max));
        }

        // The first bytes say the image's format: the temporary volume is made in it, so libvirt
        // never reads a qcow2 image as raw bytes.
        let mut head = Vec::new();
        let mut ended = false;
        while head.len() < FORMAT_BYTES && !ended {
            match response.chunk().await {
                Ok(Some(chunk)) => head.extend_from_slice(&chunk),
                Ok(None) => ended = true,
                Err(error) => return Err(download_error(&error)),
            }
        }
        let format = image_format(&head)?;
        let (sender, receiver) = mpsc::channel(CHANNEL_CHUNKS);
        let (conn, pool, name) = (self.conn.clone(), self.pool.clone(), temporary.to_owned());
        let sink = tokio::task::spawn_blocking(move || sink(&conn, &pool, &name, format, receiver));

        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let mut failure = None;
        let mut next = Some(Bytes::from(head));
        loop {
            let chunk = match next.take() {
                Some(chunk) => chunk,
                None if ended => break,
                None => match response.chunk().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break,
                    Err(error) => {
                        failure = Some(download_error(&error));
                        break;
                    }
                },
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
            None => stored.map(|_| format),
        }
    }
}

/// How many first bytes of an image say its format (the qcow2 header up to its backing file).
const FORMAT_BYTES: usize = 16;

/// The format of an image from its first bytes: qcow2 by its magic, raw otherwise. A qcow2 image
/// that names a backing file is refused: qemu would read that file from the hypervisor's disk.
fn image_format(head: &[u8]) -> Result<&'static str, Error> {
    if !head.starts_with(b"QFI\xfb") {
        return Ok("raw");
    }
    let backing = head
        .get(8..16)
        .and_then(|offset| <[u8; 8]>::try_from(offset).ok())
        .map(u64::from_be_bytes);
    if backing != Some(0) {
        return Err(Error::Invalid(
            "the image is qcow2 with a backing file: refused (qemu would read it from the hypervisor)".into(),
        ));
    }
    Ok("qcow2")
}

/// Runs libvirt work of a job on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|join| Error::Invalid(format!("the import failed: {join}")))?
}

/// Copies the verified volume `temporary`, whose bytes are in `format`, to `name` in that format,
/// then deletes `temporary` (also when the copy fails). libvirt reads a dir pool's formats from
/// the files: a volume it reads as another format than its bytes begin with is refused. Blocks.
fn publish(pool: &StoragePool, temporary: &str, name: &str, format: &str) -> Result<(), Error> {
    let lv = |error: virt::error::Error| crate::error::libvirt(&error);
    let source = StorageVol::lookup_by_name(pool, temporary).map_err(lv)?;
    let copied = (|| {
        let described = source.get_xml_desc(0).map_err(lv)?;
        let read_as = roxmltree::Document::parse(&described)
            .ok()
            .and_then(|document| {
                document
                    .descendants()
                    .find(|node| {
                        node.has_tag_name("format")
                            && node
                                .parent()
                                .is_some_and(|parent| parent.has_tag_name("target"))
                    })
                    .and_then(|node| node.attribute("type").map(str::to_owned))
            })
            .unwrap_or_else(|| "raw".to_owned());
        if read_as != format {
            return Err(Error::Invalid(format!(
                "libvirt reads the image as {read_as}, its bytes begin as {format}: refused"
            )));
        }
        let xml = format!(
            "<volume><name>{}</name><capacity unit='bytes'>0</capacity><target><format type='{}'/></target></volume>",
            escape(name),
            escape(format)
        );
        StorageVol::create_xml_from(pool, &xml, &source, 0).map_err(lv)
    })();
    if let Err(error) = source.delete(0) {
        tracing::warn!(volume = temporary, %error, "deleting an import's temporary volume failed");
    }
    copied.map(drop)
}

/// Creates the volume, writes what arrives, and finishes on `Commit`; on anything else aborts
/// and deletes the volume. Blocks.
fn sink(
    conn: &Conn,
    pool: &StoragePool,
    name: &str,
    format: &str,
    mut receiver: mpsc::Receiver<Chunk>,
) -> Result<StorageVol, Error> {
    let lv = |error: virt::error::Error| crate::error::libvirt(&error);
    let xml = format!(
        "<volume><name>{}</name><capacity unit='bytes'>0</capacity><target><format type='{format}'/></target></volume>",
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
pub(crate) fn escape(text: &str) -> String {
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

/// A client that trusts the grant's CA only: no system roots, no proxy, no redirects. Reads a
/// CA file on every import (imports are rare; a rotated CA is used at once).
fn client(ca: &ImageCa, connect_timeout: std::time::Duration) -> Result<reqwest::Client, Error> {
    let unusable = |message: String, retryable: bool| {
        tracing::warn!(?ca, %message, "image CA unusable");
        Error::Download(DownloadError {
            status: None,
            retryable,
            message,
        })
    };
    let certificates: Vec<_> = match ca {
        ImageCa::File(file) => CertificateDer::pem_file_iter(file)
            .map_err(|error| match error {
                rustls_pki_types::pem::Error::Io(io) if io.kind() == io::ErrorKind::NotFound => {
                    unusable(format!("the image CA file is not there yet: {io}"), true)
                }
                other => unusable(format!("the image CA file: {other}"), false),
            })?
            .collect(),
        ImageCa::Pem(pem) => CertificateDer::pem_slice_iter(pem.as_bytes()).collect(),
    };
    let mut builder = egress_capability_http::locked_down_client()
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
                ca_secret_ref: None,
                ca_config_map_ref: None,
                ca_file: Some("/ca.pem".into()),
                max_bytes: 10,
                unused_retention_ms: 1,
            },
            &GrantContext {
                digests: &[],
                host: &egress_runtime::grant::FilesOnly,
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
    fn the_format_is_read_from_the_first_bytes_and_a_backing_file_is_refused() {
        let mut qcow2 = b"QFI\xfb\0\0\0\x03".to_vec();
        qcow2.extend_from_slice(&0u64.to_be_bytes());
        assert_eq!(image_format(&qcow2).unwrap(), "qcow2");
        assert_eq!(image_format(b"\0\0\0\0 an ext4 disk").unwrap(), "raw");
        assert_eq!(image_format(b"").unwrap(), "raw");
        let mut backed = b"QFI\xfb\0\0\0\x03".to_vec();
        backed.extend_from_slice(&0x200u64.to_be_bytes());
        assert!(
            matches!(image_format(&backed), Err(Error::Invalid(reason)) if reason.contains("backing file"))
        );
        assert!(
            matches!(image_format(b"QFI\xfb\0\0"), Err(Error::Invalid(_))),
            "a header cut short"
        );
    }

    #[test]
    fn checksums_are_64_hex_digits_and_names_are_escaped() {
        assert!(digest(&"ab".repeat(32)).is_ok());
        assert!(digest(&"ab".repeat(31)).is_err());
        assert!(digest(&"zz".repeat(32)).is_err());
        assert_eq!(escape("a<&'\">"), "a&lt;&amp;&apos;&quot;&gt;");
    }
}
