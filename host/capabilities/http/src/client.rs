//! Connections for one grant: pooled reqwest clients that trust the grant's CA and nothing else,
//! and the mapping of connection failures to `wasi:http` error codes.
//!
//! The CA file is loaded on the first request, not at start-up (Proxmox entry 14): a missing
//! file is a host that is not ready yet, so the request fails and the next one tries again; a
//! file that holds no certificate is a wrong file, which retrying cannot fix. Once a CA loads it
//! is cached, and a client (one pool) per origin is built from it and kept, until the file
//! changes ([`FileWatch`]): then the next request loads it again and builds new clients. A
//! changed file that holds no certificate (a write caught half-way) keeps the last good CA until
//! the file changes again. The file is read on a blocking thread, never on the async executor.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_runtime::egress::EgressError;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::policy::{Origin, Scheme};
use crate::watch::{FileWatch, Freshness};
use egress_runtime::lock;

/// Idle pooled connections kept per origin.
const MAX_IDLE_PER_ORIGIN: usize = 16;

/// Why no client could be had for a request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The CA file does not exist (yet). Transient: the next request tries again.
    #[error("CA file {path} is not there yet: {source}")]
    CaMissing {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The CA file exists but holds no usable certificate. Permanent until the file changes.
    #[error("CA file {path}: {reason}")]
    CaUnusable {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// reqwest refused the configuration.
    #[error("building the HTTP client: {0}")]
    Build(reqwest::Error),
}

/// What every client of a grant shares.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// Trusted roots for `https` origins, from a file.
    pub ca_file: Option<PathBuf>,
    /// Trusted roots given in memory (a PEM bundle), in place of `ca_file`.
    pub ca_pem: Option<Arc<str>>,
    /// Name to verify certificates for (and to send as SNI), instead of the origin's host.
    pub server_name: Option<String>,
    /// Never negotiate HTTP/2.
    pub http1_only: bool,
    /// TCP connect plus TLS handshake.
    pub connect_timeout: Duration,
}

/// The clients of one grant: the CA once it loads, and a pooled client per origin.
#[derive(Debug)]
pub struct GrantClients {
    shared: Arc<Shared>,
}

/// What the requests of a grant share, and a CA load holds while it runs on a task of its own.
#[derive(Debug)]
struct Shared {
    settings: ClientSettings,
    /// Watches `ca_file` (when the CA comes from a file).
    ca_watch: Option<Arc<FileWatch>>,
    /// The CA and the clients built from it, shared by every request of the grant.
    state: Mutex<ClientState>,
    /// Serialises loads of the CA file, so the last one stored is the last one read.
    loading: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct ClientState {
    /// `None` until the CA loads.
    roots: Option<Arc<Vec<reqwest::Certificate>>>,
    /// The CA file changed since `roots` was read.
    stale: bool,
    /// One pool per origin, built from `roots`.
    clients: HashMap<Origin, reqwest::Client>,
}

impl GrantClients {
    /// Clients for a grant with these settings. Reads no file.
    pub fn new(settings: ClientSettings) -> Self {
        let ca_watch = match (&settings.ca_pem, &settings.ca_file) {
            (None, Some(file)) => Some(Arc::new(FileWatch::new(file))),
            _ => None,
        };
        Self {
            shared: Arc::new(Shared {
                settings,
                ca_watch,
                state: Mutex::new(ClientState::default()),
                loading: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The URL to send for `origin`: the origin's own, or with the host replaced by the grant's
    /// `serverName` (the client then connects to the origin's host, see [`OriginResolver`]).
    pub fn url_for(&self, origin: &Origin, path_and_query: &str) -> String {
        match (&self.shared.settings.server_name, origin.scheme()) {
            (Some(name), Scheme::Https) => origin.url_with_host(name, path_and_query),
            _ => origin.url_with_host(origin.host(), path_and_query),
        }
    }

    /// The pooled client for `origin`, building it (and loading the CA) on first use and after
    /// the CA file changed.
    pub async fn client_for(&self, origin: &Origin) -> Result<reqwest::Client, ClientError> {
        if origin.scheme() == Scheme::Https {
            self.refresh_roots().await?;
        }
        let roots = {
            let state = lock(&self.shared.state);
            if let Some(client) = state.clients.get(origin) {
                return Ok(client.clone());
            }
            state.roots.clone()
        };
        let client = self
            .shared
            .build(origin, roots.as_ref().map(|roots| roots.as_slice()))?;
        Ok(lock(&self.shared.state)
            .clients
            .entry(origin.clone())
            .or_insert(client)
            .clone())
    }

    /// Loads the CA if it has not loaded yet or its file changed. Without blocking when neither.
    async fn refresh_roots(&self) -> Result<(), ClientError> {
        // Unwatched (no watch could be had, or a load is arming it): keep what loaded.
        let changed = self
            .shared
            .ca_watch
            .as_ref()
            .is_some_and(|watch| watch.check() == Freshness::Changed);
        {
            let mut state = lock(&self.shared.state);
            state.stale |= changed && state.roots.is_some();
            if state.roots.is_some() && !state.stale {
                return Ok(());
            }
        }
        // The load runs on a task of its own, not in this request's future: it holds `loading`,
        // and a guest may never poll this request again (it waits on another of its requests),
        // which would leave every other request of the grant waiting for the lock until the
        // call's deadline.
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move { shared.load_roots().await })
            .await
            .map_err(|join_error| ClientError::CaUnusable {
                path: self.shared.settings.ca_file.clone().unwrap_or_default(),
                reason: join_error.to_string(),
            })?
    }
}

impl Shared {
    /// Loads the CA, one load at a time, unless a load that finished meanwhile made it fresh.
    async fn load_roots(&self) -> Result<(), ClientError> {
        let _loading = self.loading.lock().await;
        {
            let mut state = lock(&self.state);
            if state.roots.is_some() && !state.stale {
                return Ok(());
            }
            state.stale = false;
        }
        let loaded = match (
            &self.settings.ca_pem,
            &self.settings.ca_file,
            &self.ca_watch,
        ) {
            (Some(pem), _, _) => parse_ca(pem.as_bytes(), Path::new("(in memory)")),
            (None, Some(path), Some(watch)) => {
                let (path, watch) = (path.clone(), watch.clone());
                let loading = path.clone();
                // Armed before the read: a change made while it is read is seen next time.
                tokio::task::spawn_blocking(move || {
                    watch.arm_blocking();
                    load_ca(&loading)
                })
                .await
                .map_err(|join_error| ClientError::CaUnusable {
                    path,
                    reason: join_error.to_string(),
                })?
            }
            _ => Err(ClientError::CaUnusable {
                path: PathBuf::new(),
                reason: "no CA for an https origin".into(),
            }),
        };
        let mut state = lock(&self.state);
        match loaded {
            Ok(roots) => {
                state.roots = Some(Arc::new(roots));
                // Pools trusting the previous CA go; requests in flight keep theirs.
                state.clients.clear();
                Ok(())
            }
            Err(error) if state.roots.is_some() => {
                tracing::warn!(%error, "the CA file changed but cannot be used: keeping the last good CA until it changes again");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    fn build(
        &self,
        origin: &Origin,
        roots: Option<&[reqwest::Certificate]>,
    ) -> Result<reqwest::Client, ClientError> {
        let mut builder = locked_down_client()
            // Idle connections kept per origin: a guest's burst of requests cannot leave more
            // sockets open than its in-flight budget, and they are reused, not multiplied.
            .pool_max_idle_per_host(MAX_IDLE_PER_ORIGIN)
            .connect_timeout(self.settings.connect_timeout)
            .dns_resolver(Arc::new(OriginResolver {
                origin: origin.clone(),
            }));
        if self.settings.http1_only {
            builder = builder.http1_only();
        }
        if origin.scheme() == Scheme::Https {
            builder = builder.https_only(true);
        }
        for root in roots.unwrap_or_default() {
            builder = builder.add_root_certificate(root.clone());
        }
        builder.build().map_err(ClientError::Build)
    }
}

/// A client builder for a host's outgoing HTTP on behalf of a provider, where the grant is the
/// whole policy and nothing of the environment or of the server widens it: rustls with no
/// built-in roots (the caller adds the CA the grant names, and only it), no proxy from the
/// environment, no redirect to somewhere the allowlist never saw (a 3xx goes back to the caller
/// as is), no `Referer`. One builder, so two TLS policies of the host cannot drift apart.
pub fn locked_down_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .referer(false)
}

/// Every certificate of a PEM bundle held in memory; `path` names it in errors.
fn parse_ca(pem: &[u8], path: &Path) -> Result<Vec<reqwest::Certificate>, ClientError> {
    let unusable = |reason: String| ClientError::CaUnusable {
        path: path.to_owned(),
        reason,
    };
    let mut roots = Vec::new();
    for certificate in CertificateDer::pem_slice_iter(pem) {
        let certificate = certificate.map_err(|error| unusable(error.to_string()))?;
        let root = reqwest::Certificate::from_der(&certificate)
            .map_err(|error| unusable(error.to_string()))?;
        roots.push(root);
    }
    if roots.is_empty() {
        return Err(unusable("no certificate in the bundle".into()));
    }
    Ok(roots)
}

/// Loads every certificate of a PEM file.
fn load_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, ClientError> {
    let unusable = |reason: String| ClientError::CaUnusable {
        path: path.to_owned(),
        reason,
    };
    let iter = CertificateDer::pem_file_iter(path).map_err(|error| match error {
        rustls_pki_types::pem::Error::Io(source) if source.kind() == io::ErrorKind::NotFound => {
            ClientError::CaMissing {
                path: path.to_owned(),
                source,
            }
        }
        other => unusable(other.to_string()),
    })?;
    let mut roots = Vec::new();
    for certificate in iter {
        let certificate = certificate.map_err(|error| unusable(error.to_string()))?;
        let root = reqwest::Certificate::from_der(&certificate)
            .map_err(|error| unusable(error.to_string()))?;
        roots.push(root);
    }
    if roots.is_empty() {
        return Err(unusable("no certificate in the file".into()));
    }
    Ok(roots)
}

/// Resolves whatever name the client asks for to the origin's host: the client may be verifying
/// the grant's `serverName`, but it connects only where the allowlist said.
#[derive(Debug)]
struct OriginResolver {
    origin: Origin,
}

/// Name resolution of the origin's host failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve {host}: {source}")]
pub struct Unresolved {
    host: String,
    source: io::Error,
}

impl Resolve for OriginResolver {
    fn resolve(&self, _name: Name) -> Resolving {
        let host = self.origin.host_for_lookup().to_owned();
        let port = self.origin.port();
        Box::pin(async move {
            let looked_up = tokio::net::lookup_host((host.clone(), port)).await;
            match looked_up {
                Ok(addresses) => {
                    let addresses: Vec<SocketAddr> = addresses.collect();
                    Ok(Box::new(addresses.into_iter()) as Addrs)
                }
                Err(source) => {
                    Err(Box::new(Unresolved { host, source }) as Box<dyn StdError + Send + Sync>)
                }
            }
        })
    }
}

/// The `wasi:http` error code for a failed exchange, and a stable name for the host's log.
pub fn classify(error: &reqwest::Error) -> (EgressError, &'static str) {
    if let Some(found) = find_typed_cause(error) {
        return found;
    }
    if error.is_timeout() {
        return if error.is_connect() {
            (EgressError::ConnectionTimeout, "connect_timeout")
        } else {
            (EgressError::HttpResponseTimeout, "response_timeout")
        };
    }
    if let Some(found) = find_io_cause(error) {
        return found;
    }
    if error.is_connect() {
        return (EgressError::DestinationUnavailable, "connect");
    }
    if causes(error).any(|cause| cause.downcast_ref::<hyper::Error>().is_some()) {
        return (EgressError::HttpProtocolError, "protocol");
    }
    (EgressError::InternalError(None), "other")
}

/// What went wrong with an exchange, in words for the host's log: a refused certificate named by
/// its fault (`unknown CA`, `name mismatch`, `expired`, …, with rustls's detail), else every
/// cause in the chain (reqwest's own words stop at `error sending request`).
pub fn describe(error: &reqwest::Error) -> String {
    let refused = causes(error).find_map(|cause| match cause.downcast_ref::<rustls::Error>() {
        Some(rustls::Error::InvalidCertificate(certificate)) => Some(certificate),
        _ => None,
    });
    if let Some(certificate) = refused {
        return format!(
            "TLS: the server's certificate is refused ({}): {certificate}",
            certificate_fault(certificate)
        );
    }
    let mut words: Vec<String> = Vec::new();
    for cause in causes(error) {
        let text = cause.to_string();
        // An io::Error shows the error it wraps: say it once.
        if !words.iter().any(|said| said.contains(&text)) {
            words.push(text);
        }
    }
    words.join(": ")
}

/// A certificate's fault in two or three words.
fn certificate_fault(error: &rustls::CertificateError) -> &'static str {
    use rustls::CertificateError as Fault;
    match error {
        Fault::UnknownIssuer => "unknown CA",
        Fault::NotValidForName | Fault::NotValidForNameContext { .. } => "name mismatch",
        Fault::Expired | Fault::ExpiredContext { .. } => "expired",
        Fault::NotValidYet | Fault::NotValidYetContext { .. } => "not yet valid",
        Fault::Revoked => "revoked",
        Fault::BadSignature => "bad signature",
        _ => "invalid",
    }
}

/// Every error in the chain, looking inside `io::Error`s too (whose `source()` skips the error
/// they wrap, where rustls puts its own).
fn causes<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    let mut stack = vec![error];
    std::iter::from_fn(move || {
        let current = stack.pop()?;
        if let Some(source) = current.source() {
            stack.push(source);
        }
        if let Some(inner) = current
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
        {
            stack.push(inner);
        }
        Some(current)
    })
}

fn find_typed_cause(error: &reqwest::Error) -> Option<(EgressError, &'static str)> {
    causes(error).find_map(|cause| {
        if cause.downcast_ref::<Unresolved>().is_some() {
            return Some((
                EgressError::DnsError {
                    rcode: None,
                    info_code: None,
                },
                "dns",
            ));
        }
        let tls = cause.downcast_ref::<rustls::Error>()?;
        Some(match tls {
            rustls::Error::InvalidCertificate(_) => {
                (EgressError::TlsCertificateError, "tls_certificate")
            }
            rustls::Error::AlertReceived(alert) => (
                EgressError::TlsAlertReceived {
                    alert_id: Some(u8::from(*alert)),
                    alert_message: Some(format!("{alert:?}")),
                },
                "tls_alert",
            ),
            _ => (EgressError::TlsProtocolError, "tls_protocol"),
        })
    })
}

fn find_io_cause(error: &reqwest::Error) -> Option<(EgressError, &'static str)> {
    causes(error).find_map(|cause| {
        let io = cause.downcast_ref::<io::Error>()?;
        match io.kind() {
            io::ErrorKind::ConnectionRefused => {
                Some((EgressError::ConnectionRefused, "connection_refused"))
            }
            io::ErrorKind::TimedOut => Some((EgressError::ConnectionTimeout, "connect_timeout")),
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => {
                Some((EgressError::ConnectionTerminated, "connection_terminated"))
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ca_file_is_missing_and_empty_or_garbage_is_unusable() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            load_ca(&dir.path().join("nope.pem")),
            Err(ClientError::CaMissing { .. })
        ));

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(matches!(
            load_ca(&empty),
            Err(ClientError::CaUnusable { .. })
        ));

        let key_only = dir.path().join("key.pem");
        std::fs::write(
            &key_only,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        assert!(matches!(
            load_ca(&key_only),
            Err(ClientError::CaUnusable { .. })
        ));
    }

    #[test]
    fn server_name_replaces_the_host_only_for_https() {
        let clients = GrantClients::new(ClientSettings {
            ca_file: None,
            ca_pem: None,
            server_name: Some("pv1-1.home.lab".into()),
            http1_only: true,
            connect_timeout: Duration::from_secs(1),
        });
        let https = Origin::parse_grant("https://192.168.2.8:8006").unwrap();
        assert_eq!(
            clients.url_for(&https, "/api2/json/version"),
            "https://pv1-1.home.lab:8006/api2/json/version"
        );
        let http = Origin::parse_grant("http://192.168.2.8:8006").unwrap();
        assert_eq!(clients.url_for(&http, ""), "http://192.168.2.8:8006/");
    }
}
