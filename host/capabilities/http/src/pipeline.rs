//! One request through the broker, in the order of Spin's `RequestSender`: **authorize** (the
//! policy, touching no file and no socket), **inject** (the credential), **connect** (the
//! grant's client for the origin), **exchange** (the request, within the timeouts), **admit**
//! (the response, checked and redacted before the guest sees any of it).
//!
//! Every step fails the same way: the guest gets an error code without host detail (and, when
//! it can read one, a [`Refusal`]); the host counts the failure for the origin and logs why.

use std::sync::Arc;

use arc_swap::ArcSwap;
use egress_runtime::egress::{
    CallSite, EgressBody, EgressError, Refusal, RefusalReporter, RequestOptions,
};
use http::{HeaderName, HeaderValue};
use hyper::body::Body as _;
use tokio::time::Instant;

use crate::body::{RequestBody, ResponseBody};
use crate::client::{ClientError, classify, describe};
use crate::grant::{ActiveGrant, Grants, Route};
use crate::metrics::{Metrics, Outcome};
use crate::policy::{Denied, Origin, refused_method, screen_headers};
use crate::redact::{Redactor, redact_headers};

/// The detail of `internal-error` when the secret could not be read: transient, and a provider's
/// `check` reports it as `credentials-unavailable`. A contract 0.2.0 guest need not parse it: it
/// reads [`Refusal::CredentialsUnavailable`] from `egress:http-broker/broker.last-refusal`.
pub const CREDENTIALS_UNAVAILABLE: &str = "credentials-unavailable";

/// The detail of `internal-error` when the grant's CA file is not there yet: transient, the next
/// request loads it. A 0.2.0 guest reads [`Refusal::CaUnavailable`] instead.
pub const CA_UNAVAILABLE: &str = "ca-unavailable";

/// Sends `request` of the provider at `site` through the pipeline, under the grant its identity
/// has now (it keeps that grant whatever changes meanwhile).
pub(crate) async fn send(
    grants: &ArcSwap<Grants>,
    metrics: &Metrics,
    site: &CallSite,
    request: http::Request<EgressBody>,
    options: Option<RequestOptions>,
) -> Result<http::Response<EgressBody>, EgressError> {
    let started = Instant::now();
    let (mut parts, body) = request.into_parts();
    // Why a refusal happened, for the guest to read as a value; nothing else of the
    // extensions leaves the host.
    let reporter = RefusalReporter::take(&mut parts.extensions);
    let Authorized {
        grant,
        origin,
        route,
    } = match authorize(grants, site, &mut parts) {
        Ok(authorized) => authorized,
        Err(denied) => {
            return Err(deny(
                denied,
                site,
                metrics,
                started,
                reporter.as_ref(),
                &parts.uri,
            ));
        }
    };
    let sender = RequestSender {
        site,
        metrics,
        started,
        reporter,
        grant,
        origin,
        route,
        method: parts.method.clone(),
        // The path only: a query could carry anything.
        path: parts.uri.path().to_owned(),
    };
    let credential = sender.inject().await?;
    let client = sender.connect().await?;
    let (header, redactor) = credential
        .map(|(name, value, redactor)| ((name, value), redactor))
        .unzip();
    let response = sender
        .exchange(&client, parts, body, header, options)
        .await?;
    sender.admit(response, redactor)
}

/// A request the grant allows, ready to send.
struct Authorized {
    grant: Arc<ActiveGrant>,
    origin: Origin,
    /// Its origin's place in the grant's allowlist and routes.
    route: usize,
}

/// Step 1, authorize: which grant, whether this component may use it, whether the method,
/// origin and headers pass. First, because it is policy only: a denied request touches no
/// secret, no file and no socket.
fn authorize(
    grants: &ArcSwap<Grants>,
    site: &CallSite,
    parts: &mut http::request::Parts,
) -> Result<Authorized, Denied> {
    let grant = grants
        .load()
        .get(&*site.provider)
        .cloned()
        .ok_or(Denied::NoGrant)?;
    if !grant.digests.is_empty() && !grant.digests.iter().any(|pinned| **pinned == *site.digest) {
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

/// Ends a request authorize denied: the guest learns it was denied (and whether for want of a
/// grant), the host why. Counted under origin `-`: the URL is the guest's, and would make the
/// label set unbounded.
fn deny(
    denied: Denied,
    site: &CallSite,
    metrics: &Metrics,
    started: Instant,
    reporter: Option<&RefusalReporter>,
    uri: &http::Uri,
) -> EgressError {
    if let Some(reporter) = reporter {
        reporter.report(match denied {
            Denied::NoGrant | Denied::DigestMismatch => Refusal::NotGranted,
            _ => Refusal::Denied,
        });
    }
    let provider = &*site.provider;
    // The URL's authority only: its path or query could carry anything.
    let target = uri.authority().map_or("", |authority| authority.as_str());
    tracing::warn!(provider, operation = site.operation, %target, reason = %denied, "outgoing HTTP denied");
    metrics.record(provider, "-", "denied", started.elapsed());
    EgressError::HttpRequestDenied
}

/// One authorized request on its way out: what every later step reads, and how each fails.
struct RequestSender<'a> {
    site: &'a CallSite,
    metrics: &'a Metrics,
    started: Instant,
    reporter: Option<RefusalReporter>,
    grant: Arc<ActiveGrant>,
    origin: Origin,
    /// The origin's place in the grant's routes.
    route: usize,
    method: http::Method,
    path: String,
}

impl RequestSender<'_> {
    fn route(&self) -> &Route {
        &self.grant.routes[self.route]
    }

    /// When the whole exchange, body included, must be done.
    fn deadline(&self) -> Instant {
        self.started + self.grant.timeouts.total()
    }

    /// Tells the guest why the request was refused, if it can read that.
    fn refuse(&self, refusal: Refusal) {
        if let Some(reporter) = &self.reporter {
            reporter.report(refusal);
        }
    }

    /// A step failed with `error` (what the guest gets): counted as an error of the origin and
    /// logged under `kind`, a stable name.
    fn fail(&self, error: EgressError, kind: &str) -> EgressError {
        let route = self.route();
        let provider = &*self.site.provider;
        let elapsed = self.started.elapsed();
        route.series.record(
            self.metrics,
            provider,
            &route.label,
            Outcome::Error,
            elapsed,
        );
        tracing::debug!(provider, method = %self.method, origin = %route.label, path = self.path.as_str(),
            error.type = kind, elapsed_ms = self.started.elapsed().as_millis() as u64, "outgoing HTTP failed");
        error
    }

    /// Step 2, inject: the credential header and the redactor of its secret, if the grant has a
    /// credential. After authorize, so only an allowed request to an allowed origin reads the
    /// secret; before connect, so a request that cannot carry its credential opens nothing.
    async fn inject(&self) -> Result<Option<(HeaderName, HeaderValue, Redactor)>, EgressError> {
        let Some(injection) = &self.grant.injection else {
            return Ok(None);
        };
        let unavailable = || {
            self.refuse(Refusal::CredentialsUnavailable);
            self.fail(
                EgressError::InternalError(Some(CREDENTIALS_UNAVAILABLE.into())),
                "credentials",
            )
        };
        let secret = injection.source.read().await.map_err(|error| {
            tracing::warn!(provider = &*self.site.provider, origin = %self.route().label, %error, "credentials unavailable");
            unavailable()
        })?;
        let (value, redactor) = injection
            .for_secret(secret.expose())
            .ok_or_else(unavailable)?;
        Ok(Some((injection.header.clone(), value, redactor)))
    }

    /// Step 3, connect: the grant's pooled client for the origin, which loads the grant's CA on
    /// first use. After inject, so a request without its credential loads no CA; the client
    /// verifies against that CA only and connects only to the origin's host.
    async fn connect(&self) -> Result<reqwest::Client, EgressError> {
        let client = self.grant.clients.client_for(&self.origin).await;
        client.map_err(|error| {
            tracing::warn!(provider = &*self.site.provider, origin = %self.route().label, %error, "no HTTP client for the grant");
            match error {
                ClientError::CaMissing { .. } => {
                    self.refuse(Refusal::CaUnavailable);
                    self.fail(
                        EgressError::InternalError(Some(CA_UNAVAILABLE.into())),
                        "ca_missing",
                    )
                }
                ClientError::CaUnusable { .. } => {
                    self.refuse(Refusal::CaInvalid);
                    self.fail(EgressError::TlsCertificateError, "ca_unusable")
                }
                ClientError::Build(_) => self.fail(EgressError::InternalError(None), "client_build"),
            }
        })
    }

    /// Step 4, exchange: sends the request and waits for the response's headers, within the
    /// first-byte timeout (the grant's, or the guest's when shorter) and the total deadline. The
    /// one step that talks to the server, so every check before it costs the server nothing.
    async fn exchange(
        &self,
        client: &reqwest::Client,
        parts: http::request::Parts,
        body: EgressBody,
        credential: Option<(HeaderName, HeaderValue)>,
        options: Option<RequestOptions>,
    ) -> Result<reqwest::Response, EgressError> {
        let outgoing = self.outgoing(parts, body, credential)?;
        let granted = self.grant.timeouts.first_byte();
        let first_byte = options
            .and_then(|options| options.first_byte_timeout)
            .map_or(granted, |guest| guest.min(granted));
        let waiting = (self.started + first_byte).min(self.deadline());
        match tokio::time::timeout_at(waiting, client.execute(outgoing)).await {
            Err(_elapsed) => Err(self.fail(EgressError::HttpResponseTimeout, "first_byte_timeout")),
            Ok(Err(error)) => {
                let (code, kind) = classify(&error);
                let error = error.without_url();
                tracing::warn!(provider = &*self.site.provider, origin = %self.route().label, error.type = kind, cause = %describe(&error), "outgoing HTTP failed");
                Err(self.fail(code, kind))
            }
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// The request as the client sends it: to the grant's URL for the origin, with the guest's
    /// screened headers, the credential, and the guest's body streamed unchanged.
    fn outgoing(
        &self,
        mut parts: http::request::Parts,
        body: EgressBody,
        credential: Option<(HeaderName, HeaderValue)>,
    ) -> Result<reqwest::Request, EgressError> {
        let path_and_query = parts.uri.path_and_query().map_or("/", |path| path.as_str());
        let url = reqwest::Url::parse(&self.grant.clients.url_for(&self.origin, path_and_query))
            .map_err(|_| self.fail(EgressError::HttpRequestUriInvalid, "url"))?;
        let mut outgoing = reqwest::Request::new(self.method.clone(), url);
        *outgoing.headers_mut() = std::mem::take(&mut parts.headers);
        if let Some((name, value)) = credential {
            outgoing.headers_mut().insert(name, value);
        }
        if !body.is_end_stream() {
            *outgoing.body_mut() = Some(reqwest::Body::wrap(RequestBody::new(body)));
        }
        Ok(outgoing)
    }

    /// Step 5, admit: the response's head is checked before the guest sees any of it (a body
    /// announced over the cap; on a credentialed request, a coding or a part redaction could not
    /// see through) and its headers redacted; then it is counted and logged, and handed back
    /// with its body capped, bounded by the deadline and redacted as it streams.
    fn admit(
        &self,
        response: reqwest::Response,
        redactor: Option<Redactor>,
    ) -> Result<http::Response<EgressBody>, EgressError> {
        let status = response.status();
        let mut response: http::Response<reqwest::Body> = response.into();
        let max_bytes = self.grant.max_response_bytes;
        let announced = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
        if announced.is_some_and(|length| length > max_bytes) {
            let error = EgressError::HttpResponseBodySize(announced);
            return Err(self.fail(error, "response_too_large"));
        }
        if let Some(redactor) = &redactor {
            if let Err((error, kind)) = only_identity_and_whole(&response) {
                tracing::warn!(provider = &*self.site.provider, origin = %self.route().label, error.type = kind, "credentialed response refused: redaction could not see it");
                self.refuse(Refusal::ResponseUnredactable);
                return Err(self.fail(error, kind));
            }
            redact_headers(redactor, response.headers_mut());
            // Redaction can change the body's length.
            response.headers_mut().remove(http::header::CONTENT_LENGTH);
        }
        let (route, provider, elapsed) =
            (self.route(), &*self.site.provider, self.started.elapsed());
        let outcome = Outcome::Status(status);
        route
            .series
            .record(self.metrics, provider, &route.label, outcome, elapsed);
        tracing::debug!(provider, method = %self.method, origin = %route.label, path = self.path.as_str(),
            status = status.as_u16(), elapsed_ms = elapsed.as_millis() as u64, "outgoing HTTP");
        let (head, body) = response.into_parts();
        let body = ResponseBody::guard(body, max_bytes, self.deadline(), redactor);
        Ok(http::Response::from_parts(head, body))
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
