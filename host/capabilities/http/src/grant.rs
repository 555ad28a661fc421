//! The HTTP grant: which origins a provider identity may reach, which credential the host injects
//! there, and how the connection is made. One typed document ([`HttpGrant`]): a ProviderConfig's
//! `spec.grant.http`, an identity's `http` in the CLI's grants file, and what
//! [`Broker`](crate::Broker)'s `set_grant` takes (YAML or JSON, camelCase keys, unknown keys
//! refused):
//!
//! ```yaml
//! origins: ["https://127.0.0.1:8006"]      # scheme, host, port; anything else is denied
//! credential:
//!   header: Authorization
//!   format: "PVEAPIToken={secret}"
//!   secretRef: {name: proxmox-token, key: token}   # a ProviderConfig: a Secret the host holds
//!   # secretFile: /etc/egress/proxmox-token        # the CLI: a file read on every request
//! tls:
//!   caSecretRef: {name: proxmox-ca, key: ca.pem}   # or caConfigMapRef, or (the CLI) caFile
//!   serverName: pv1-1.home.lab             # verify the certificate for this name
//!   http1Only: true
//! timeouts: { connectMs: 5000, firstByteMs: 20000, totalMs: 120000 }
//! maxResponseBytes: 16777216
//! ```
//!
//! The document holds no secret: the host resolves `secretRef` and the CA references when the
//! grant is set (`GrantContext`), and a file only where its host allows files. The broker
//! validates a grant when it is set (origins, header names, the `{secret}` placeholder, the
//! server name) and refuses one that cannot be served safely: [`activate`] turns the document
//! into the [`ActiveGrant`] every request of the identity reads, so a request never finds out
//! that its grant was wrong.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_runtime::default_forbidden_header;
use egress_runtime::grant::{
    GrantContext, GrantDocument, GrantError, MoreThanOneSource, ObjectRef, Resolved, SecretKeyRef,
    ValueFrom, ValueSource,
};
use http::{HeaderName, HeaderValue};
use rustls_pki_types::ServerName;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::client::{ClientSettings, GrantClients};
use crate::credentials::{CredentialSource, FileSource, MemorySource};
use crate::metrics::OriginSeries;
use crate::policy::{Allowlist, CREDENTIAL_HEADERS, Origin, Scheme};
use crate::redact::Redactor;
use egress_runtime::lock;

/// Connect timeout when a grant sets none.
pub const DEFAULT_CONNECT_MS: u64 = 5_000;
/// Time to the response's status line and headers when a grant sets none. Well below the 30 s
/// deadline of `get` and `check` (connect 5 s + first byte 20 s leaves 5 s), so a `check` against a
/// hung endpoint still answers the reason `unreachable` instead of running out its deadline.
pub const DEFAULT_FIRST_BYTE_MS: u64 = 20_000;
/// Time for the whole exchange, body included, when a grant sets none.
pub const DEFAULT_TOTAL_MS: u64 = 120_000;
/// Response body cap when a grant sets none (16 MiB).
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;

/// The placeholder in [`Credential::format`] that the secret replaces.
pub const SECRET_PLACEHOLDER: &str = "{secret}";

/// What one provider identity may reach over HTTP, and how. Grants follow the host's name for a
/// provider (the ProviderConfig, or the file it was loaded from), never the name a component
/// gives itself in `describe`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpGrant {
    /// Allowed origins, each `scheme://host[:port]` with no path; everything else is denied.
    pub origins: Vec<String>,
    /// The credential the host adds to every request of this grant; the provider never sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<Credential>,
    /// How the server is verified; a CA is required as soon as one origin is `https`.
    #[serde(default)]
    pub tls: Tls,
    /// Connect, first-byte and total timeouts in milliseconds.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Largest response body passed to the provider; more fails with `HTTP-response-body-size`.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
}

impl GrantDocument for HttpGrant {
    fn references(&self) -> Vec<ObjectRef<'_>> {
        let credential = self
            .credential
            .iter()
            .filter_map(|credential| credential.secret_ref.as_ref())
            .map(ObjectRef::Secret);
        credential
            .chain(self.tls.ca_secret_ref.iter().map(ObjectRef::Secret))
            .chain(self.tls.ca_config_map_ref.iter().map(ObjectRef::ConfigMap))
            .collect()
    }
}

/// A secret the host injects as one header: `format` with `{secret}` replaced by the secret,
/// which comes from exactly one of `secretRef` and `secretFile`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Credential {
    /// The header, for example `Authorization`. The guest may not set it itself.
    pub header: String,
    /// The value, with `{secret}` where the secret goes, for example `PVEAPIToken={secret}`.
    pub format: String,
    /// A Secret's key holding the secret: held in memory, replaced when the Secret changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
    /// A file holding the secret (the CLI only), read again once it changed, so rotation needs no
    /// restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
}

/// How the broker verifies the server: the CA it trusts, and only it (no system roots), from at
/// most one of the three sources, and an optional name.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tls {
    /// A PEM bundle in a Secret's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// A PEM bundle in a ConfigMap's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map_ref: Option<SecretKeyRef>,
    /// A PEM file (the CLI only), loaded on the first request and cached once it holds a
    /// certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Verify the server's certificate for this DNS name instead of the URL's host, while still
    /// connecting to the URL's host (Phase 0: the node's address is not in its certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Speak HTTP/1.1 only and never negotiate HTTP/2 (F18: Proxmox's API is HTTP/1.1).
    #[serde(default)]
    pub http1_only: bool,
}

/// Timeouts in milliseconds. A guest's `request-options` can shorten the first-byte timeout,
/// never lengthen any.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Timeouts {
    /// TCP connect and TLS handshake.
    #[serde(default = "default_connect_ms")]
    pub connect_ms: u64,
    /// Until the response's headers arrive.
    #[serde(default = "default_first_byte_ms")]
    pub first_byte_ms: u64,
    /// The whole exchange, including reading the body.
    #[serde(default = "default_total_ms")]
    pub total_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect_ms: DEFAULT_CONNECT_MS,
            first_byte_ms: DEFAULT_FIRST_BYTE_MS,
            total_ms: DEFAULT_TOTAL_MS,
        }
    }
}

impl Timeouts {
    /// The connect timeout.
    pub fn connect(&self) -> Duration {
        Duration::from_millis(self.connect_ms)
    }

    /// The first-byte timeout.
    pub fn first_byte(&self) -> Duration {
        Duration::from_millis(self.first_byte_ms)
    }

    /// The total timeout.
    pub fn total(&self) -> Duration {
        Duration::from_millis(self.total_ms)
    }
}

fn default_connect_ms() -> u64 {
    DEFAULT_CONNECT_MS
}

fn default_first_byte_ms() -> u64 {
    DEFAULT_FIRST_BYTE_MS
}

fn default_total_ms() -> u64 {
    DEFAULT_TOTAL_MS
}

fn default_max_response_bytes() -> u64 {
    DEFAULT_MAX_RESPONSE_BYTES
}

/// The grants by provider identity.
pub(crate) type Grants = HashMap<String, Arc<ActiveGrant>>;

/// One identity's grant as the broker serves it: validated, with what it names resolved. Shared
/// by every request of the identity; a request in flight keeps the one it started with.
pub(crate) struct ActiveGrant {
    /// The component digests (lowercase hex) the grant is pinned to; empty: any.
    pub(crate) digests: Vec<String>,
    pub(crate) allowlist: Allowlist,
    /// One per allowed origin, in the allowlist's order.
    pub(crate) routes: Vec<Route>,
    pub(crate) injection: Option<Injection>,
    pub(crate) clients: GrantClients,
    pub(crate) timeouts: Timeouts,
    pub(crate) max_response_bytes: u64,
}

/// What the broker keeps for one granted origin, so a request to it allocates no label.
pub(crate) struct Route {
    /// The origin as metrics and logs name it.
    pub(crate) label: String,
    pub(crate) series: OriginSeries,
}

/// How a grant's secret becomes a header: `prefix` + secret + `suffix`.
pub(crate) struct Injection {
    pub(crate) header: HeaderName,
    prefix: String,
    suffix: String,
    pub(crate) source: Arc<dyn CredentialSource>,
    /// What the last secret read became. Building a redactor (a matcher of every form of the
    /// secret) costs more than the request, so it and the header value are made once per secret.
    injected: Mutex<Option<Injected>>,
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
    pub(crate) fn for_secret(&self, secret: &str) -> Option<(HeaderValue, Redactor)> {
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

/// Validates `identity`'s grant and resolves what it names; `credential`, when given, is where
/// the secret comes from instead. The checks run in the document's order, so the first field a
/// person has to fix is the one named.
pub(crate) fn activate(
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
    let origins = parse_origins(&grant.origins, &invalid)?;
    let any_http = origins.iter().any(|origin| origin.scheme() == Scheme::Http);
    let any_https = origins
        .iter()
        .any(|origin| origin.scheme() == Scheme::Https);
    let tls = &grant.tls;
    let ca_pem = trusted_ca(tls, any_https, context, &invalid)?;
    check_server_name(tls, &invalid)?;
    let injection = match &grant.credential {
        None => None,
        Some(document) => Some(injection(
            document, any_http, credential, context, &invalid,
        )?),
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

/// The grant's origins, each parsed as the allowlist compares them.
fn parse_origins(
    texts: &[String],
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<Vec<Origin>, GrantError> {
    texts
        .iter()
        .map(|text| {
            Origin::parse_grant(text)
                .map_err(|reason| invalid("origins", format!("{text:?}: {reason}")))
        })
        .collect()
}

/// The CA `tls` names, as PEM when the host holds it; `None` for a file, which the client loads
/// on the first request (a file not there yet is a host not ready yet), or for no CA, which only
/// a grant without `https` origins may have: the broker trusts no system roots.
fn trusted_ca(
    tls: &Tls,
    any_https: bool,
    context: &GrantContext<'_>,
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<Option<Arc<str>>, GrantError> {
    let from = ValueFrom::one_of([
        (
            "tls.caSecretRef",
            tls.ca_secret_ref.as_ref().map(ValueSource::Secret),
        ),
        (
            "tls.caConfigMapRef",
            tls.ca_config_map_ref.as_ref().map(ValueSource::ConfigMap),
        ),
        ("tls.caFile", tls.ca_file.as_deref().map(ValueSource::File)),
    ])
    .map_err(|MoreThanOneSource| {
        invalid(
            "tls",
            "name at most one of caSecretRef, caConfigMapRef and caFile".into(),
        )
    })?;
    let ca_pem = match from {
        None => None,
        Some(from) => match context.resolve(from, invalid)? {
            Resolved::Value(pem) => Some(Arc::from(
                String::from_utf8(pem.to_vec())
                    .map_err(|_| invalid(from.field, "the CA is not UTF-8 PEM".into()))?,
            )),
            Resolved::File(_) => None,
        },
    };
    if any_https && ca_pem.is_none() && tls.ca_file.is_none() {
        return Err(invalid(
            "tls.caFile",
            "a CA (caSecretRef, caConfigMapRef or caFile) is required for https origins: the broker trusts no system roots".into(),
        ));
    }
    Ok(ca_pem)
}

/// `serverName` must be a DNS name: an IP would make the client connect there instead of to
/// the origin's host.
fn check_server_name(
    tls: &Tls,
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<(), GrantError> {
    let Some(name) = &tls.server_name else {
        return Ok(());
    };
    match ServerName::try_from(name.as_str()) {
        Ok(ServerName::DnsName(_)) => Ok(()),
        _ => Err(invalid(
            "tls.serverName",
            format!("{name:?} is not a DNS name"),
        )),
    }
}

/// How `document`'s secret becomes a header, checked now so a request never finds out the
/// header or format cannot be sent; the secret comes from `source` when the host gives one.
fn injection(
    document: &Credential,
    any_http: bool,
    source: Option<Arc<dyn CredentialSource>>,
    context: &GrantContext<'_>,
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<Injection, GrantError> {
    if any_http {
        return Err(invalid(
            "credential",
            "never injected over plain http; use https origins".into(),
        ));
    }
    let header = HeaderName::try_from(document.header.as_str()).map_err(|_| {
        invalid(
            "credential.header",
            format!("{:?} is not a header name", document.header),
        )
    })?;
    if default_forbidden_header(&header) && !CREDENTIAL_HEADERS.contains(&header) {
        return Err(invalid(
            "credential.header",
            format!("{header} is managed by the connection"),
        ));
    }
    let (prefix, suffix) = split_format(&document.format, invalid)?;
    let source = match source {
        Some(source) => source,
        None => credential_source(document, context, invalid)?,
    };
    Ok(Injection {
        header,
        prefix: prefix.to_owned(),
        suffix: suffix.to_owned(),
        source,
        injected: Mutex::new(None),
    })
}

/// What goes before and after the secret in `format`, which holds `{secret}` exactly once and
/// nothing a header value cannot carry.
fn split_format<'f>(
    format: &'f str,
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<(&'f str, &'f str), GrantError> {
    let (prefix, suffix) = format
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
    Ok((prefix, suffix))
}

/// Where the secret is read from: a Secret's value, held in memory until the grant is set
/// again, or a file, read again once it changed.
fn credential_source(
    document: &Credential,
    context: &GrantContext<'_>,
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<Arc<dyn CredentialSource>, GrantError> {
    let from = ValueFrom::one_of([
        (
            "credential.secretRef",
            document.secret_ref.as_ref().map(ValueSource::Secret),
        ),
        (
            "credential.secretFile",
            document.secret_file.as_deref().map(ValueSource::File),
        ),
    ])
    .ok()
    .flatten()
    .ok_or_else(|| {
        invalid(
            "credential",
            "name exactly one of secretRef and secretFile: where the host reads the secret".into(),
        )
    })?;
    Ok(match context.resolve(from, invalid)? {
        Resolved::Value(bytes) => {
            let origin = from.source.to_string();
            let value = std::str::from_utf8(&bytes)
                .map_err(|_| invalid(from.field, format!("the secret in {origin} is not UTF-8")))?;
            let source = MemorySource::new(origin);
            source.set(Some(value));
            Arc::new(source)
        }
        Resolved::File(file) => Arc::new(FileSource::new(file)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<HttpGrant, String> {
        serde_norway::from_str(yaml).map_err(|error| error.to_string())
    }

    #[test]
    fn yaml_with_every_field_parses() {
        let grant = parse(
            r#"
origins: ["https://127.0.0.1:8006"]
credential:
  header: Authorization
  format: "PVEAPIToken={secret}"
  secretFile: /tmp/token
tls:
  caFile: /tmp/ca.pem
  serverName: pv1-1.home.lab
  http1Only: true
timeouts: { connectMs: 1000, firstByteMs: 2000, totalMs: 3000 }
maxResponseBytes: 1024
"#,
        )
        .unwrap();
        assert_eq!(grant.origins, ["https://127.0.0.1:8006"]);
        let credential = grant.credential.as_ref().unwrap();
        assert_eq!(credential.format, "PVEAPIToken={secret}");
        assert_eq!(grant.tls.server_name.as_deref(), Some("pv1-1.home.lab"));
        assert!(grant.tls.http1_only);
        assert_eq!(grant.timeouts.total(), Duration::from_millis(3000));
        assert_eq!(grant.max_response_bytes, 1024);
    }

    #[test]
    fn omitted_fields_take_the_defaults() {
        let grant: HttpGrant = serde_json::from_str(r#"{"origins":["http://h"]}"#).unwrap();
        assert!(grant.credential.is_none());
        assert!(!grant.tls.http1_only);
        assert_eq!(grant.timeouts.connect_ms, DEFAULT_CONNECT_MS);
        assert_eq!(grant.timeouts.first_byte_ms, DEFAULT_FIRST_BYTE_MS);
        assert_eq!(grant.max_response_bytes, DEFAULT_MAX_RESPONSE_BYTES);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let error = parse("origins: []\ninsecure: true\n").unwrap_err();
        assert!(error.contains("insecure"), "{error}");
        let error = serde_json::from_str::<HttpGrant>(r#"{"origins":[],"tls":{"verify":false}}"#)
            .unwrap_err();
        assert!(error.to_string().contains("verify"), "{error}");
    }

    #[test]
    fn the_secrets_and_config_maps_a_grant_names_are_its_references() {
        let grant = parse(
            "origins: [\"https://h\"]\ncredential: {header: Authorization, format: \"{secret}\", secretRef: {name: token, key: t}}\ntls: {caConfigMapRef: {name: ca, key: ca.pem}}\n",
        )
        .unwrap();
        let names: Vec<String> = grant
            .references()
            .iter()
            .map(|reference| match reference {
                ObjectRef::Secret(r) => format!("secret/{}", r.name),
                ObjectRef::ConfigMap(r) => format!("configmap/{}", r.name),
            })
            .collect();
        assert_eq!(names, ["secret/token", "configmap/ca"]);
    }
}
