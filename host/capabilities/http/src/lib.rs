//! The egress broker: how providers reach their hypervisor without ever holding its credentials.
//!
//! A provider (a WebAssembly component) sends HTTP through `wasi:http/outgoing-handler`. The
//! runtime hands every such request to an [`Egress`]; [`Broker`] is the one that lets requests
//! out. For each request, in order:
//!
//! 1. find the grant of the provider's **host-assigned identity** (none: denied; a grant pinned
//!    to a component digest denies a component with other bytes). The identity is the file the
//!    host loaded, or the ProviderConfig naming it, never the name a component gives itself;
//! 2. refuse methods that reflect or tunnel the request (`TRACE`, `TRACK`, `CONNECT`);
//! 3. parse the URL's origin once — scheme, host, port with the scheme's default
//!    ([`policy::Origin`]) — and check it against the grant's origins (default deny);
//! 4. screen the guest's headers: a `Host` naming another authority, or a credential header
//!    (`Authorization`, `Proxy-Authorization`, `Cookie`, the grant's own header) is denied. Guests
//!    cannot even set those headers ([`Egress::is_forbidden_header`]); this is the second check.
//!    On a credentialed request, `Range`/`If-Range` are denied and `Accept-Encoding` becomes
//!    `identity`: a server that reflects the credential must reflect it where redaction sees it;
//! 5. take the secret ([`credentials::CredentialSource`]: held in memory from the Secret the
//!    grant names, replaced when the grant is set again, or read again off the executor once its
//!    file changed, so a rotated secret is used from the next request) and inject it;
//! 6. connect to the origin's host with the grant's client: the grant's CA only, optional
//!    `serverName` for verification, HTTP/1.1 only if asked, no proxy, no redirects
//!    ([`client`]), within the connect and first-byte timeouts;
//! 7. on a credentialed request, refuse a response in a content or transfer coding it did not ask
//!    for, or a partial one, then hand the response back with every reversible form of the
//!    secret replaced by `[redacted]` ([`redact`]), its body capped and bounded by the total
//!    timeout ([`body`]);
//! 8. count it ([`metrics`]) and log one `debug!` line: method, origin, path, status, duration.
//!
//! Failures reach the guest as `wasi:http/types.error-code`s, never with host detail; the host
//! logs the detail (without secrets). See `docs/egress.md` for the table.
//!
//! # Example
//!
//! The broker is the runtime's HTTP capability: give it to the runtime, keep a handle, and set
//! each identity's [`HttpGrant`] on it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use egress_capability_http::{Broker, HttpGrant};
//! use egress_runtime::grant::{FilesOnly, GrantContext};
//! use egress_runtime::{Capability, Runtime, RuntimeConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let grant: HttpGrant = serde_norway::from_str(r#"
//! origins: ["https://192.168.2.8:8006"]
//! credential:
//!   header: Authorization
//!   format: "PVEAPIToken={secret}"
//!   secretFile: /etc/egress/proxmox-token
//! tls:
//!   caFile: /etc/egress/proxmox-ca.pem
//!   serverName: pv1-1.home.lab
//!   http1Only: true
//! "#)?;
//! let broker = Arc::new(Broker::new());
//! broker.set_grant("proxmox", &grant, &GrantContext { digests: &[], host: &FilesOnly })?;
//! let mut registry = prometheus_client::registry::Registry::default();
//! broker.metrics().register(&mut registry);
//! // The runtime sends every provider request through it.
//! let runtime = Runtime::new(RuntimeConfig::default().capability(broker))?;
//! # let _ = runtime;
//! # Ok(())
//! # }
//! ```

pub mod body;
pub mod client;
pub mod credentials;
pub mod grant;
pub mod metrics;
pub mod policy;
pub mod redact;
mod sync;
pub mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use egress_runtime::egress::{
    CallSite, Egress, EgressBody, EgressError, EgressFuture, Refusal, RefusalReporter,
    RequestOptions, default_forbidden_header,
};
use http::{HeaderName, HeaderValue};
use hyper::body::Body as _;
use rustls_pki_types::ServerName;
use tokio::time::Instant;

use crate::body::{RequestBody, ResponseBody};
use crate::client::{ClientError, ClientSettings, GrantClients, classify};
use crate::credentials::{CredentialSource, FileSource, MemorySource};
pub use crate::grant::HttpGrant;
use crate::grant::{SECRET_PLACEHOLDER, Timeouts};
pub use crate::metrics::Metrics;
use crate::metrics::{OriginSeries, Outcome};
use crate::policy::{
    Allowlist, CREDENTIAL_HEADERS, Denied, Origin, Scheme, refused_method, screen_headers,
};
use crate::redact::{Redactor, redact_headers};
use crate::sync::lock;
use arc_swap::ArcSwap;
use egress_runtime::grant::{GrantContext, GrantError};
use egress_runtime::{Capability, HostState, PrepareContext};
use wasmtime::component::Linker;

/// The detail of `internal-error` when the secret could not be read: transient, and a provider's
/// `check` reports it as `credentials-unavailable`. A contract 0.2.0 guest need not parse it: it
/// reads [`Refusal::CredentialsUnavailable`] from `egress:http-broker/broker.last-refusal`.
pub const CREDENTIALS_UNAVAILABLE: &str = "credentials-unavailable";

/// The detail of `internal-error` when the grant's CA file is not there yet: transient, the next
/// request loads it. A 0.2.0 guest reads [`Refusal::CaUnavailable`] instead.
pub const CA_UNAVAILABLE: &str = "ca-unavailable";

/// The egress broker: an [`Egress`] that lets each provider reach its granted origins only, with
/// credentials the host injects and the provider never sees.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    /// By provider identity; shared by every call of every provider, replaced whole when a grant
    /// changes (a request in flight keeps the grant it started with).
    grants: ArcSwap<HashMap<String, Arc<ActiveGrant>>>,
    /// Headers injected by some grant: no guest may set them.
    injected_headers: ArcSwap<Vec<HeaderName>>,
    /// Serialises grant changes (readers never wait).
    changes: std::sync::Mutex<()>,
    metrics: Metrics,
}

struct ActiveGrant {
    /// The component digests (lowercase hex) the grant is pinned to; empty: any.
    digests: Vec<String>,
    allowlist: Allowlist,
    /// One per allowed origin, in the allowlist's order.
    routes: Vec<Route>,
    injection: Option<Injection>,
    clients: GrantClients,
    timeouts: Timeouts,
    max_response_bytes: u64,
}

/// What the broker keeps for one granted origin, so a request to it allocates no label.
struct Route {
    /// The origin as metrics and logs name it.
    label: String,
    series: OriginSeries,
}

/// How a grant's secret becomes a header: `prefix` + secret + `suffix`.
struct Injection {
    header: HeaderName,
    prefix: String,
    suffix: String,
    source: Arc<dyn CredentialSource>,
    /// What the last secret read became. Building a redactor (a matcher of every form of the
    /// secret) costs more than the request, so it and the header value are made once per secret.
    injected: std::sync::Mutex<Option<Injected>>,
}

/// The header value and the redactor made from one secret.
struct Injected {
    /// The secret they were made from.
    secret: zeroize::Zeroizing<String>,
    value: HeaderValue,
    redactor: Redactor,
}

impl Injection {
    /// The header value (marked sensitive) and the redactor for `secret`, made once per secret;
    /// `None` when the secret cannot be carried in a header value.
    fn for_secret(&self, secret: &str) -> Option<(HeaderValue, Redactor)> {
        let mut cached = lock(&self.injected);
        if let Some(injected) = cached.as_ref()
            && injected.secret.as_str() == secret
        {
            return Some((injected.value.clone(), injected.redactor.clone()));
        }
        let text = zeroize::Zeroizing::new(format!("{}{secret}{}", self.prefix, self.suffix));
        let mut value = HeaderValue::try_from(text.as_str()).ok()?;
        value.set_sensitive(true);
        let redactor = Redactor::new(secret, &text);
        *cached = Some(Injected {
            secret: zeroize::Zeroizing::new(secret.to_owned()),
            value: value.clone(),
            redactor: redactor.clone(),
        });
        Some((value, redactor))
    }
}

impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Broker")
            .field("providers", &self.identities())
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// A broker with no grants: every request is denied until
    /// [`set_grant`](Capability::set_grant) grants an identity.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                grants: ArcSwap::from_pointee(HashMap::new()),
                injected_headers: ArcSwap::from_pointee(Vec::new()),
                changes: std::sync::Mutex::new(()),
                metrics: Metrics::default(),
            }),
        }
    }

    /// [`set_grant`](Capability::set_grant), with the credential read from `source` instead of
    /// what the grant's `credential` names (its header and format still apply): for a host that
    /// keeps secrets somewhere of its own.
    pub fn set_grant_with_credential(
        &self,
        identity: &str,
        grant: &HttpGrant,
        context: &GrantContext<'_>,
        source: Arc<dyn CredentialSource>,
    ) -> Result<(), GrantError> {
        let active = Arc::new(activate(identity, grant, context, Some(source))?);
        self.change(|grants| {
            grants.insert(identity.to_owned(), active);
        });
        Ok(())
    }

    /// The identities that have a grant, sorted.
    pub fn identities(&self) -> Vec<String> {
        let mut identities: Vec<String> = self.inner.grants.load().keys().cloned().collect();
        identities.sort_unstable();
        identities
    }

    fn change(&self, edit: impl FnOnce(&mut HashMap<String, Arc<ActiveGrant>>)) {
        let _serialised = lock(&self.inner.changes);
        let mut grants = HashMap::clone(&self.inner.grants.load());
        edit(&mut grants);
        // Headers first: a guest may never set a header some grant injects.
        self.inner
            .injected_headers
            .store(Arc::new(injected_headers(&grants)));
        self.inner.grants.store(Arc::new(grants));
    }

    /// The broker's metrics, to register with the process's registry.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
}

impl Default for Broker {
    fn default() -> Self {
        Self::new()
    }
}

/// The broker is the HTTP capability: `wasi:http` and `egress:http-broker` over its own
/// [`Egress`], granted per identity with [`HttpGrant`]s.
impl Capability for Broker {
    type Grant = HttpGrant;

    fn name(&self) -> &'static str {
        "http"
    }

    fn provides(&self, import: &str) -> bool {
        egress_runtime::http::provides(import)
    }

    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        egress_runtime::http::link(linker)
    }

    fn set_grant(
        &self,
        identity: &str,
        grant: &HttpGrant,
        context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        let active = Arc::new(activate(identity, grant, context, None)?);
        self.change(|grants| {
            grants.insert(identity.to_owned(), active);
        });
        Ok(())
    }

    fn remove_grant(&self, identity: &str) {
        self.change(|grants| {
            grants.remove(identity);
        });
    }

    fn granted(&self, identity: &str) -> bool {
        Egress::granted(self, identity)
    }

    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn std::any::Any + Send> {
        egress_runtime::http::prepare(Arc::new(self.clone()), call)
    }
}

/// Every header some grant injects.
fn injected_headers(grants: &HashMap<String, Arc<ActiveGrant>>) -> Vec<HeaderName> {
    let mut headers: Vec<HeaderName> = grants
        .values()
        .filter_map(|grant| {
            grant
                .injection
                .as_ref()
                .map(|injection| injection.header.clone())
        })
        .collect();
    headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    headers.dedup();
    headers
}

/// Validates `identity`'s grant and resolves what it names; `credential`, when given, is where
/// the secret comes from instead.
fn activate(
    identity: &str,
    grant: &HttpGrant,
    context: &GrantContext<'_>,
    credential: Option<Arc<dyn CredentialSource>>,
) -> Result<ActiveGrant, GrantError> {
    let invalid = GrantError::about("http", identity);
    if grant.origins.is_empty() {
        return Err(invalid("origins", "is empty".into()));
    }
    let digests = context.pinned_digests(&invalid)?;
    let origins = grant
        .origins
        .iter()
        .map(|text| {
            Origin::parse_grant(text)
                .map_err(|reason| invalid("origins", format!("{text:?}: {reason}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let any_http = origins.iter().any(|origin| origin.scheme() == Scheme::Http);
    let any_https = origins
        .iter()
        .any(|origin| origin.scheme() == Scheme::Https);
    let tls = &grant.tls;
    let ca_pem = match (&tls.ca_secret_ref, &tls.ca_config_map_ref, &tls.ca_file) {
        (None, None, None) => None,
        (Some(secret), None, None) => {
            let bytes = context
                .host
                .secret(secret)
                .map_err(|reason| invalid("tls.caSecretRef", reason))?;
            let pem = String::from_utf8(bytes.to_vec())
                .map_err(|_| invalid("tls.caSecretRef", "the CA is not UTF-8 PEM".into()))?;
            Some(Arc::from(pem))
        }
        (None, Some(map), None) => Some(Arc::from(
            context
                .host
                .config_map(map)
                .map_err(|reason| invalid("tls.caConfigMapRef", reason))?,
        )),
        (None, None, Some(file)) => {
            context
                .host
                .file(file)
                .map_err(|reason| invalid("tls.caFile", reason))?;
            None
        }
        _ => {
            return Err(invalid(
                "tls",
                "name at most one of caSecretRef, caConfigMapRef and caFile".into(),
            ));
        }
    };
    if any_https && ca_pem.is_none() && tls.ca_file.is_none() {
        return Err(invalid(
            "tls.caFile",
            "a CA (caSecretRef, caConfigMapRef or caFile) is required for https origins: the broker trusts no system roots".into(),
        ));
    }
    if let Some(name) = &tls.server_name {
        // An IP would make the client connect there instead of to the origin's host.
        match ServerName::try_from(name.as_str()) {
            Ok(ServerName::DnsName(_)) => {}
            _ => {
                return Err(invalid(
                    "tls.serverName",
                    format!("{name:?} is not a DNS name"),
                ));
            }
        }
    }
    let source = credential;
    let injection = match &grant.credential {
        None => None,
        Some(credential) => {
            if any_http {
                return Err(invalid(
                    "credential",
                    "never injected over plain http; use https origins".into(),
                ));
            }
            let header = HeaderName::try_from(credential.header.as_str()).map_err(|_| {
                invalid(
                    "credential.header",
                    format!("{:?} is not a header name", credential.header),
                )
            })?;
            if default_forbidden_header(&header) && !CREDENTIAL_HEADERS.contains(&header) {
                return Err(invalid(
                    "credential.header",
                    format!("{header} is managed by the connection"),
                ));
            }
            let (prefix, suffix) = credential
                .format
                .split_once(SECRET_PLACEHOLDER)
                .filter(|(_, suffix)| !suffix.contains(SECRET_PLACEHOLDER))
                .ok_or_else(|| {
                    invalid(
                        "credential.format",
                        format!("must contain {SECRET_PLACEHOLDER} exactly once"),
                    )
                })?;
            if HeaderValue::from_str(&format!("{prefix}x{suffix}")).is_err() {
                return Err(invalid(
                    "credential.format",
                    "holds characters a header cannot carry".into(),
                ));
            }
            let source: Arc<dyn CredentialSource> = match (
                source.clone(),
                &credential.secret_ref,
                &credential.secret_file,
            ) {
                (Some(source), _, _) => source,
                (None, Some(reference), None) => {
                    let origin = format!("Secret {} key {}", reference.name, reference.key);
                    let bytes = context
                        .host
                        .secret(reference)
                        .map_err(|reason| invalid("credential.secretRef", reason))?;
                    let value = std::str::from_utf8(&bytes).map_err(|_| {
                        invalid(
                            "credential.secretRef",
                            format!("the secret in {origin} is not UTF-8"),
                        )
                    })?;
                    let source = MemorySource::new(origin);
                    source.set(Some(value));
                    Arc::new(source)
                }
                (None, None, Some(file)) => {
                    context
                        .host
                        .file(file)
                        .map_err(|reason| invalid("credential.secretFile", reason))?;
                    Arc::new(FileSource::new(file))
                }
                _ => {
                    return Err(invalid(
                            "credential",
                            "name exactly one of secretRef and secretFile: where the host reads the secret".into(),
                        ));
                }
            };
            Some(Injection {
                header,
                prefix: prefix.to_owned(),
                suffix: suffix.to_owned(),
                source,
                injected: std::sync::Mutex::new(None),
            })
        }
    };
    let timeouts = grant.timeouts;
    if timeouts.connect_ms == 0 || timeouts.first_byte_ms == 0 || timeouts.total_ms == 0 {
        return Err(invalid(
            "timeouts",
            "every timeout must be above zero".into(),
        ));
    }
    if grant.max_response_bytes == 0 {
        return Err(invalid("maxResponseBytes", "must be above zero".into()));
    }
    let routes = origins
        .iter()
        .map(|origin| Route {
            label: origin.to_string(),
            series: OriginSeries::default(),
        })
        .collect();
    Ok(ActiveGrant {
        digests,
        routes,
        allowlist: Allowlist::new(origins),
        injection,
        clients: GrantClients::new(ClientSettings {
            ca_file: tls.ca_file.clone(),
            ca_pem,
            server_name: tls.server_name.clone(),
            http1_only: tls.http1_only,
            connect_timeout: timeouts.connect(),
        }),
        timeouts,
        max_response_bytes: grant.max_response_bytes,
    })
}

impl Egress for Broker {
    fn granted(&self, identity: &str) -> bool {
        self.inner.grants.load().contains_key(identity)
    }

    fn is_forbidden_header(&self, name: &HeaderName) -> bool {
        default_forbidden_header(name)
            || CREDENTIAL_HEADERS.contains(name)
            || self.inner.injected_headers.load().contains(name)
    }

    fn send(
        &self,
        site: &CallSite,
        request: http::Request<EgressBody>,
        options: Option<RequestOptions>,
    ) -> EgressFuture {
        let inner = self.inner.clone();
        let site = site.clone();
        Box::pin(async move { inner.send(&site, request, options).await })
    }
}

/// A request the grant allows, ready to send.
struct Authorized {
    grant: Arc<ActiveGrant>,
    origin: Origin,
    /// Its origin's place in the grant's allowlist and routes.
    route: usize,
}

impl Inner {
    /// The policy half of the pipeline (steps 1–4): which grant, whether this component may use
    /// it, whether the method, origin and headers pass. Touches no file and no socket.
    fn authorize(
        &self,
        site: &CallSite,
        parts: &mut http::request::Parts,
    ) -> Result<Authorized, Denied> {
        let grant = self
            .grants
            .load()
            .get(&*site.provider)
            .cloned()
            .ok_or(Denied::NoGrant)?;
        if !grant.digests.is_empty() && !grant.digests.iter().any(|pinned| **pinned == *site.digest)
        {
            return Err(Denied::DigestMismatch);
        }
        if refused_method(&parts.method) {
            return Err(Denied::Method(parts.method.clone()));
        }
        // The one parse of the URL: it drives the check, the connection and the injection.
        let origin = Origin::of_uri(&parts.uri).map_err(Denied::MalformedUrl)?;
        let route = grant
            .allowlist
            .position(&origin)
            .ok_or(Denied::OriginNotAllowed)?;
        let host_only = grant
            .injection
            .as_ref()
            .map(|injection| injection.header.clone());
        screen_headers(
            &mut parts.headers,
            &origin,
            host_only.as_slice(),
            grant.injection.is_some(),
        )?;
        Ok(Authorized {
            grant,
            origin,
            route,
        })
    }

    async fn send(
        &self,
        site: &CallSite,
        request: http::Request<EgressBody>,
        options: Option<RequestOptions>,
    ) -> Result<http::Response<EgressBody>, EgressError> {
        let started = Instant::now();
        let (mut parts, body) = request.into_parts();
        // Why a refusal happened, for the guest to read as a value; nothing else of the
        // extensions leaves the host.
        let reporter = RefusalReporter::take(&mut parts.extensions);
        let refuse = |refusal: Refusal| {
            if let Some(reporter) = &reporter {
                reporter.report(refusal);
            }
        };
        let provider = &*site.provider;
        let Authorized {
            grant,
            origin,
            route,
        } = match self.authorize(site, &mut parts) {
            Ok(authorized) => authorized,
            Err(denied) => {
                refuse(match denied {
                    Denied::NoGrant | Denied::DigestMismatch => Refusal::NotGranted,
                    _ => Refusal::Denied,
                });
                // The URL's authority only: its path or query could carry anything.
                let target = parts
                    .uri
                    .authority()
                    .map_or("", |authority| authority.as_str());
                tracing::warn!(provider, operation = site.operation, %target, reason = %denied, "outgoing HTTP denied");
                self.metrics
                    .record(provider, "-", "denied", started.elapsed());
                return Err(EgressError::HttpRequestDenied);
            }
        };
        let route = &grant.routes[route];
        let origin_label = &route.label;
        let method = parts.method.clone();
        // The path only: a query could carry anything.
        let path = parts.uri.path().to_owned();
        let fail = |error: EgressError, kind: &str| {
            route.series.record(
                &self.metrics,
                provider,
                origin_label,
                Outcome::Error,
                started.elapsed(),
            );
            tracing::debug!(provider, %method, origin = %origin_label, path,
                error.type = kind, elapsed_ms = started.elapsed().as_millis() as u64, "outgoing HTTP failed");
            error
        };

        let mut injected = None;
        if let Some(injection) = &grant.injection {
            let secret = injection.source.read().await.map_err(|error| {
                tracing::warn!(provider, origin = %origin_label, %error, "credentials unavailable");
                refuse(Refusal::CredentialsUnavailable);
                fail(
                    EgressError::InternalError(Some(CREDENTIALS_UNAVAILABLE.into())),
                    "credentials",
                )
            })?;
            let (value, redactor) = injection.for_secret(secret.expose()).ok_or_else(|| {
                refuse(Refusal::CredentialsUnavailable);
                fail(
                    EgressError::InternalError(Some(CREDENTIALS_UNAVAILABLE.into())),
                    "credentials",
                )
            })?;
            injected = Some((injection.header.clone(), value, redactor));
        }

        let client = grant.clients.client_for(&origin).await.map_err(|error| {
            tracing::warn!(provider, origin = %origin_label, %error, "no HTTP client for the grant");
            match error {
                ClientError::CaMissing { .. } => {
                    refuse(Refusal::CaUnavailable);
                    fail(EgressError::InternalError(Some(CA_UNAVAILABLE.into())), "ca_missing")
                }
                ClientError::CaUnusable { .. } => {
                    refuse(Refusal::CaInvalid);
                    fail(EgressError::TlsCertificateError, "ca_unusable")
                }
                ClientError::Build(_) => fail(EgressError::InternalError(None), "client_build"),
            }
        })?;

        let path_and_query = parts.uri.path_and_query().map_or("/", |path| path.as_str());
        let url = reqwest::Url::parse(&grant.clients.url_for(&origin, path_and_query))
            .map_err(|_| fail(EgressError::HttpRequestUriInvalid, "url"))?;
        let mut outgoing = reqwest::Request::new(method.clone(), url);
        *outgoing.headers_mut() = std::mem::take(&mut parts.headers);
        let mut redactor = None;
        if let Some((name, value, patterns)) = injected {
            outgoing.headers_mut().insert(name, value);
            redactor = Some(patterns);
        }
        if !body.is_end_stream() {
            *outgoing.body_mut() = Some(reqwest::Body::wrap(RequestBody::new(body)));
        }

        let deadline = started + grant.timeouts.total();
        let first_byte = options
            .and_then(|options| options.first_byte_timeout)
            .map_or(grant.timeouts.first_byte(), |guest| {
                guest.min(grant.timeouts.first_byte())
            });
        let response = match tokio::time::timeout_at(
            (started + first_byte).min(deadline),
            client.execute(outgoing),
        )
        .await
        {
            Err(_elapsed) => {
                return Err(fail(EgressError::HttpResponseTimeout, "first_byte_timeout"));
            }
            Ok(Err(error)) => {
                let (code, kind) = classify(&error);
                let error = error.without_url();
                tracing::warn!(provider, origin = %origin_label, error.type = kind, %error, "outgoing HTTP failed");
                return Err(fail(code, kind));
            }
            Ok(Ok(response)) => response,
        };

        let status = response.status();
        let mut response: http::Response<reqwest::Body> = response.into();
        let announced = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
        if announced.is_some_and(|length| length > grant.max_response_bytes) {
            return Err(fail(
                EgressError::HttpResponseBodySize(announced),
                "response_too_large",
            ));
        }
        if let Some(redactor) = &redactor {
            if let Err((error, kind)) = only_identity_and_whole(&response) {
                tracing::warn!(provider, origin = %origin_label, error.type = kind, "credentialed response refused: redaction could not see it");
                refuse(Refusal::ResponseUnredactable);
                return Err(fail(error, kind));
            }
            redact_headers(redactor, response.headers_mut());
            // Redaction can change the body's length.
            response.headers_mut().remove(http::header::CONTENT_LENGTH);
        }
        let elapsed = started.elapsed();
        route.series.record(
            &self.metrics,
            provider,
            origin_label,
            Outcome::Status(status),
            elapsed,
        );
        tracing::debug!(provider, %method, origin = %origin_label, path,
            status = status.as_u16(), elapsed_ms = elapsed.as_millis() as u64, "outgoing HTTP");
        let (head, body) = response.into_parts();
        Ok(http::Response::from_parts(
            head,
            ResponseBody::guard(body, grant.max_response_bytes, deadline, redactor),
        ))
    }
}

/// A credentialed response must arrive as the broker asked: in the identity encoding (a
/// compressed echo of the credential would pass redaction and be decompressed by the guest),
/// chunked at most, and whole (a part could hold a piece of the credential too short to
/// recognise).
fn only_identity_and_whole<B>(
    response: &http::Response<B>,
) -> Result<(), (EgressError, &'static str)> {
    let headers = response.headers();
    for value in headers.get_all(http::header::CONTENT_ENCODING) {
        let coding = String::from_utf8_lossy(value.as_bytes())
            .trim()
            .to_ascii_lowercase();
        if !coding.is_empty() && coding != "identity" {
            return Err((
                EgressError::HttpResponseContentCoding(Some(coding)),
                "content_coding",
            ));
        }
    }
    for value in headers.get_all(http::header::TRANSFER_ENCODING) {
        let codings = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        if let Some(other) = codings
            .split(',')
            .map(str::trim)
            .find(|coding| !coding.is_empty() && *coding != "chunked")
        {
            return Err((
                EgressError::HttpResponseTransferCoding(Some(other.to_owned())),
                "transfer_coding",
            ));
        }
    }
    if response.status() == http::StatusCode::PARTIAL_CONTENT
        || headers.contains_key(http::header::CONTENT_RANGE)
    {
        return Err((EgressError::HttpProtocolError, "partial_content"));
    }
    Ok(())
}
