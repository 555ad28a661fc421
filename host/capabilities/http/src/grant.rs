//! Grant configuration: which origins each provider may reach, which credential the host injects
//! there, and how the connection is made.
//!
//! The format (YAML or JSON, camelCase keys, unknown keys refused):
//!
//! ```yaml
//! grants:
//!   proxmox:                                   # provider identity: its file's name (proxmox.wasm)
//!     digest: "sha256:9f86d0…"                 # optional: only this component gets the grant
//!     origins: ["https://127.0.0.1:8006"]      # scheme, host, port; anything else is denied
//!     credential:
//!       header: Authorization
//!       format: "PVEAPIToken={secret}"
//!       secretFile: /etc/egress/proxmox-token  # read on every request
//!     tls:
//!       caFile: /etc/egress/proxmox-ca.pem     # loaded on first use, cached once it loads
//!       serverName: pv1-1.home.lab             # verify the certificate for this name
//!       http1Only: true
//!     timeouts: { connectMs: 5000, firstByteMs: 20000, totalMs: 120000 }
//!     maxResponseBytes: 16777216
//!   kvm2:                                      # libvirt only: no origins, no HTTP grant
//!     libvirt: { connections: [{ name: hv1, uri: "qemu:///system" }] }
//! ```
//!
//! Each identity may also carry its **libvirt grant** under `libvirt`, which the broker does not
//! read: `egress-capability-libvirt` parses it (`Grants::from_grants_file_yaml` there), and the
//! identity's `digest` pins it too. An identity with only a `libvirt` key has no HTTP grant.
//!
//! [`Grants`] is only the parsed document; `Broker::new` validates it (origins, header names,
//! the `{secret}` placeholder, the server name) and refuses a grant that cannot be served safely.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

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

/// Every provider's grant, keyed by provider identity. A provider without a grant reaches
/// nothing.
///
/// The identity is the host's name for a provider (the file it was loaded from, or the
/// ProviderConfig that names it), never the name a component gives itself in `describe`: a
/// component that describes itself as `proxmox` gets nothing of the `proxmox` grant unless the
/// host loaded it as `proxmox`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grants {
    /// Grants by provider identity.
    pub grants: BTreeMap<String, Grant>,
}

impl Grants {
    /// Parses grants from YAML.
    pub fn from_yaml(text: &str) -> Result<Self, GrantError> {
        serde_norway::from_str(text).map_err(|error| GrantError::Parse(error.to_string()))
    }

    /// Parses grants from JSON.
    pub fn from_json(text: &str) -> Result<Self, GrantError> {
        serde_json::from_str(text).map_err(|error| GrantError::Parse(error.to_string()))
    }
}

/// What one provider may reach and how.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Grant {
    /// Pins the grant to one component: `sha256:<hex>` of its bytes (or the bare hex). A
    /// provider with this identity but other bytes is denied everything.
    #[serde(default)]
    pub digest: Option<String>,
    /// Allowed origins, each `scheme://host[:port]` with no path. Default deny. Required (not
    /// empty) unless the entry is a libvirt grant only.
    #[serde(default)]
    pub origins: Vec<String>,
    /// The credential the host injects into every request of this grant, if any.
    #[serde(default)]
    pub credential: Option<Credential>,
    /// TLS settings; required (for `caFile`) as soon as one origin is `https`.
    #[serde(default)]
    pub tls: Tls,
    /// Connect, first-byte and total timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Largest response body passed to the provider; more fails with `HTTP-response-body-size`.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// The identity's libvirt grant, which `egress-capability-libvirt` parses and the broker
    /// ignores (it is only allowed here, so that one file holds every grant).
    #[serde(default)]
    pub libvirt: Option<serde::de::IgnoredAny>,
}

impl Grant {
    /// Whether the entry grants HTTP at all: anything but a bare libvirt grant does (and an
    /// entry with neither origins nor a libvirt grant is refused for its empty origins).
    pub fn has_http(&self) -> bool {
        self.libvirt.is_none() || !self.origins.is_empty() || self.credential.is_some()
    }
}

/// A secret the host injects as one header; the provider never holds it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Credential {
    /// The header to set, for example `Authorization`. The guest may not set it itself.
    pub header: String,
    /// The header value, with `{secret}` where the secret goes, for example `PVEAPIToken={secret}`.
    pub format: String,
    /// File holding the secret, read and trimmed on every request so rotation needs no restart.
    /// Required unless the host supplies the secret another way (`GrantSources::credential`,
    /// for example from a Kubernetes Secret).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
}

/// How the broker verifies the server.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tls {
    /// PEM file with the CA certificates trusted for this grant, and only them: the broker uses
    /// no system roots. Loaded on the first request and cached once it holds a certificate.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Verify the server's certificate for this DNS name instead of the URL's host, while still
    /// connecting to the URL's host (Phase 0: the node's address is not in its certificate).
    #[serde(default)]
    pub server_name: Option<String>,
    /// Speak HTTP/1.1 only and never negotiate HTTP/2 (F18: Proxmox's API is HTTP/1.1).
    #[serde(default)]
    pub http1_only: bool,
}

/// Timeouts in milliseconds. A guest's `request-options` can shorten the first-byte timeout,
/// never lengthen any.
#[derive(Clone, Copy, Debug, Deserialize)]
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

/// A grant document that cannot be used. Messages name the provider and the field, never a secret
/// (the broker never reads the secret file while validating).
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// The document is not valid YAML/JSON of the grant format.
    #[error("grants: {0}")]
    Parse(String),
    /// A grant that lists no origin can never be used.
    #[error("grant {provider}: origins is empty")]
    NoOrigins {
        /// The provider.
        provider: String,
    },
    /// An origin that is not `http(s)://host[:port]`.
    #[error("grant {provider}: origin {origin:?}: {reason}")]
    InvalidOrigin {
        /// The provider.
        provider: String,
        /// The origin as written.
        origin: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Any other field that is wrong.
    #[error("grant {provider}: {field}: {reason}")]
    Invalid {
        /// The provider.
        provider: String,
        /// The field, as spelled in the document.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_with_every_field_parses() {
        let grants = Grants::from_yaml(
            r#"
grants:
  proxmox:
    digest: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
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
        let grant = &grants.grants["proxmox"];
        assert_eq!(grant.origins, ["https://127.0.0.1:8006"]);
        let credential = grant.credential.as_ref().unwrap();
        assert_eq!(credential.format, "PVEAPIToken={secret}");
        assert_eq!(grant.tls.server_name.as_deref(), Some("pv1-1.home.lab"));
        assert!(grant.tls.http1_only);
        assert_eq!(grant.timeouts.total(), Duration::from_millis(3000));
        assert_eq!(grant.max_response_bytes, 1024);
    }

    #[test]
    fn json_uses_defaults_for_omitted_fields() {
        let grants = Grants::from_json(r#"{"grants":{"p":{"origins":["http://h"]}}}"#).unwrap();
        let grant = &grants.grants["p"];
        assert!(grant.credential.is_none());
        assert!(!grant.tls.http1_only);
        assert_eq!(grant.timeouts.connect_ms, DEFAULT_CONNECT_MS);
        assert_eq!(grant.max_response_bytes, DEFAULT_MAX_RESPONSE_BYTES);
    }

    #[test]
    fn an_identity_may_carry_a_libvirt_grant_the_broker_ignores() {
        let grants = Grants::from_yaml(
            "grants:\n  kvm2:\n    libvirt: { connections: [{ name: hv1, uri: \"qemu:///system\" }] }\n  both:\n    origins: [\"https://i.lab\"]\n    libvirt: {}\n",
        )
        .unwrap();
        assert!(!grants.grants["kvm2"].has_http());
        assert!(grants.grants["both"].has_http());
        let none = Grants::from_yaml("grants:\n  p: {}\n").unwrap();
        assert!(
            none.grants["p"].has_http(),
            "refused later for its empty origins"
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let error =
            Grants::from_yaml("grants:\n  p:\n    origins: []\n    insecure: true\n").unwrap_err();
        assert!(error.to_string().contains("insecure"), "{error}");
        let error = Grants::from_json(r#"{"grants":{"p":{"origins":[],"tls":{"verify":false}}}}"#)
            .unwrap_err();
        assert!(error.to_string().contains("verify"), "{error}");
    }
}
