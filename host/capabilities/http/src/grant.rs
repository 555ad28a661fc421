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
//! server name) and refuses one that cannot be served safely.

use std::path::PathBuf;
use std::time::Duration;

use egress_runtime::grant::{GrantDocument, ObjectRef, SecretKeyRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
