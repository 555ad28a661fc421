//! Provider components as OCI artifacts, in the layout the wasm ecosystem shares (the CNCF wasm
//! OCI artifact layout, as Spin, wasmCloud, wkg and Kubewarden read it).
//!
//! An artifact is one image manifest (`application/vnd.oci.image.manifest.v1+json`) with:
//! - a config of media type [`WASM_CONFIG_MEDIA_TYPE`]: oci-wasm's `WasmConfig` (architecture
//!   `wasm`, os `wasip2`, the layer's digest, the component's imports and exports);
//! - exactly one layer of media type [`WASM_LAYER_MEDIA_TYPE`]: the component's bytes.
//!
//! Use:
//! 1. Say how to reach registries in [`RegistryOptions`]: credentials ([`DockerConfig`], the
//!    content of a `kubernetes.io/dockerconfigjson` Secret), an extra CA, the registries that
//!    speak plain HTTP, the layer size cap.
//! 2. [`RegistryClient::push`] uploads a component and returns the manifest's digest.
//! 3. [`RegistryClient::pull`] fetches one, refusing, each with its own [`OciError`]: a manifest
//!    that does not hash to a pinned digest, media types that are not the wasm layout, a layer
//!    declared over the cap (before downloading it), a registry that sends more or fewer bytes
//!    than the layer declares, and a layer whose bytes do not hash to its digest.
//!
//! ```no_run
//! # async fn example() -> Result<(), egress_distribution::oci::OciError> {
//! use egress_distribution::oci::{RegistryClient, RegistryOptions};
//!
//! let client = RegistryClient::new(RegistryOptions::default())?;
//! let pulled = client.pull("registry.example:5000/providers/proxmox:1.0").await?;
//! println!("{} bytes, manifest {}", pulled.bytes.len(), pulled.manifest_digest);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use egress_digest::Digest;
use futures::StreamExt as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_wasm::{ToConfig as _, WasmConfig};

use crate::signing::{self, SIGNATURE_ANNOTATION, SIGNATURE_MEDIA_TYPE, Signature, SigningKey};

/// The media type of a wasm artifact's config.
pub const WASM_CONFIG_MEDIA_TYPE: &str = oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE;
/// The media type of a wasm artifact's one layer: the component.
pub const WASM_LAYER_MEDIA_TYPE: &str = oci_wasm::WASM_LAYER_MEDIA_TYPE;
/// The largest component layer [`RegistryClient::pull`] downloads unless told otherwise: 64 MiB,
/// several times the largest provider we build (the Python one).
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 64 * 1024 * 1024;

/// Why a push or a pull failed. Messages name the reference and the cause, never a password
/// or an authorization header.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference does not parse.
    #[error(
        "{reference:?} is not an artifact reference (REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST): {message}"
    )]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// What the parser said.
        message: String,
    },
    /// A push was given a digest: the digest is what a push produces.
    #[error("push {reference}: push to a tag, not a digest (push prints the digest)")]
    PushToDigest {
        /// The reference as given.
        reference: String,
    },
    /// The registry credentials file is unreadable or not a docker config.
    #[error("registry credentials {path}: {message}")]
    AuthFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it, without its secrets.
        message: String,
    },
    /// The CA file is unreadable or holds no PEM certificate.
    #[error("CA file {path}: {message}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The registry refused the credentials (or their absence).
    #[error(
        "{reference}: registry {registry} refused the credentials ({credentials}); check the auth file's entry for {registry}"
    )]
    Unauthorized {
        /// The reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// Which credentials were sent: `user NAME` or `none`.
        credentials: String,
    },
    /// The HTTP client could not be built (a CA the TLS stack cannot load).
    #[error("building the registry client: {0}")]
    ClientSetup(String),
    /// Any other registry or transport failure.
    #[error("{reference}: {message}")]
    Registry {
        /// The reference.
        reference: String,
        /// The client's description (a status, a TLS failure, a connection refused).
        message: String,
    },
    /// The manifest is not the wasm artifact layout.
    #[error(
        "{reference} is not a wasm component artifact: {found} (a component has config {WASM_CONFIG_MEDIA_TYPE} and one layer {WASM_LAYER_MEDIA_TYPE})"
    )]
    NotWasmComponent {
        /// The reference.
        reference: String,
        /// The media types the manifest has.
        found: String,
    },
    /// Bytes that do not hash to the digest that names them.
    #[error("{reference}: the {what} does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The reference.
        reference: String,
        /// `manifest` or `component layer`.
        what: &'static str,
        /// The digest that names the bytes.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// The layer's descriptor declares more bytes than the cap.
    #[error(
        "{reference}: the component layer is {size} bytes, over the cap of {cap} bytes (refused before downloading)"
    )]
    LayerOverCap {
        /// The reference.
        reference: String,
        /// The size the descriptor declares.
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// The registry sent a different number of bytes than the layer's descriptor declares.
    #[error(
        "{reference}: the registry sent {received} bytes of the component layer, which declares {declared}"
    )]
    LayerSizeMismatch {
        /// The reference.
        reference: String,
        /// The size the descriptor declares.
        declared: u64,
        /// What arrived (`more than N` when the download was cut).
        received: String,
    },
    /// The file to push could not be described as a component.
    #[error("{file}: {message}")]
    NotAComponent {
        /// The file.
        file: PathBuf,
        /// Why oci-wasm could not read its world.
        message: String,
    },
}

impl OciError {
    /// The reason a condition gives for it (`RegistryUnauthorized`, `DigestMismatch`, …): what
    /// the person reading the ProviderConfig's status must do differs for each.
    pub fn reason(&self) -> &'static str {
        match self {
            OciError::InvalidReference { .. }
            | OciError::CaFile { .. }
            | OciError::AuthFile { .. } => "InvalidImage",
            OciError::Unauthorized { .. } => "RegistryUnauthorized",
            OciError::DigestMismatch { .. } | OciError::LayerSizeMismatch { .. } => {
                "DigestMismatch"
            }
            OciError::NotWasmComponent { .. } | OciError::NotAComponent { .. } => {
                "NotAWasmComponent"
            }
            OciError::LayerOverCap { .. } => "ComponentTooLarge",
            OciError::Registry { .. }
            | OciError::ClientSetup(_)
            | OciError::PushToDigest { .. } => "RegistryUnavailable",
        }
    }
}

/// One registry's credentials.
#[derive(Clone)]
struct Credential {
    username: String,
    password: String,
}

/// Registry credentials by host: the content of a `kubernetes.io/dockerconfigjson` Secret
/// (`{"auths": {"HOST[:PORT]": {"auth": base64("USER:PASS")}}}`, or `username` and `password`
/// in place of `auth`). `Debug` shows the hosts and user names only.
#[derive(Clone, Default)]
pub struct DockerConfig {
    /// By host (`registry.example:5000`), schemes and paths stripped from the file's keys.
    auths: BTreeMap<String, Credential>,
}

impl fmt::Debug for DockerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.auths
                    .iter()
                    .map(|(host, credential)| (host, &credential.username)),
            )
            .finish()
    }
}

#[derive(serde::Deserialize)]
struct DockerConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, DockerConfigEntry>,
}

#[derive(serde::Deserialize)]
struct DockerConfigEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl DockerConfig {
    /// Reads a docker config JSON file.
    pub fn read(path: &Path) -> Result<DockerConfig, OciError> {
        let error = |message: String| OciError::AuthFile {
            path: path.to_owned(),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| error(e.to_string()))?;
        DockerConfig::parse(&bytes).map_err(error)
    }

    /// Parses a docker config JSON; the error names the entry at fault, never its secret.
    pub fn parse(json: &[u8]) -> Result<DockerConfig, String> {
        // serde_json's message quotes no input, only positions.
        let file: DockerConfigFile =
            serde_json::from_slice(json).map_err(|e| format!("not a docker config JSON ({e})"))?;
        let mut auths = BTreeMap::new();
        for (key, entry) in file.auths {
            let credential = match (entry.auth, entry.username, entry.password) {
                (Some(auth), _, _) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .ok()
                        .and_then(|bytes| String::from_utf8(bytes).ok())
                        .ok_or_else(|| {
                            format!("auths.{key}.auth is not base64 of USER:PASSWORD")
                        })?;
                    let (username, password) = decoded.split_once(':').ok_or_else(|| {
                        format!("auths.{key}.auth is not base64 of USER:PASSWORD")
                    })?;
                    Credential {
                        username: username.to_owned(),
                        password: password.to_owned(),
                    }
                }
                (None, Some(username), Some(password)) => Credential { username, password },
                _ => {
                    return Err(format!(
                        "auths.{key} has neither auth nor username and password"
                    ));
                }
            };
            auths.insert(registry_host(&key).to_owned(), credential);
        }
        Ok(DockerConfig { auths })
    }

    /// The credentials for `registry`, anonymous when there are none.
    fn auth_for(&self, registry: &str) -> RegistryAuth {
        match self.auths.get(registry) {
            Some(credential) => {
                RegistryAuth::Basic(credential.username.clone(), credential.password.clone())
            }
            None => RegistryAuth::Anonymous,
        }
    }
}

/// `https://index.docker.io/v1/` → `index.docker.io`: docker config keys may carry a scheme
/// and a path; references name the host only.
fn registry_host(key: &str) -> &str {
    let without_scheme = key.split_once("://").map_or(key, |(_, rest)| rest);
    without_scheme.split('/').next().unwrap_or(without_scheme)
}

/// How to reach registries.
#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// Credentials by registry host; anonymous for the others.
    pub credentials: DockerConfig,
    /// Extra CA certificates (PEM) trusted beside the public web PKI roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Registries (`host:port`) spoken to over plain HTTP; every other one over HTTPS.
    pub plain_http: Vec<String>,
    /// The largest component layer a pull downloads. Defaults to [`DEFAULT_MAX_LAYER_BYTES`].
    pub max_layer_bytes: u64,
}

impl Default for RegistryOptions {
    fn default() -> RegistryOptions {
        RegistryOptions {
            credentials: DockerConfig::default(),
            ca_pem: None,
            plain_http: Vec::new(),
            max_layer_bytes: DEFAULT_MAX_LAYER_BYTES,
        }
    }
}

impl RegistryOptions {
    /// Trusts the PEM certificates of `path` beside the public web PKI roots.
    pub fn with_ca_file(mut self, path: &Path) -> Result<RegistryOptions, OciError> {
        let error = |message: String| OciError::CaFile {
            path: path.to_owned(),
            message,
        };
        let pem = std::fs::read(path).map_err(|e| error(e.to_string()))?;
        // oci-client falls back to a default client on a bad certificate: refuse it here.
        if !pem
            .windows(b"-----BEGIN CERTIFICATE-----".len())
            .any(|window| window == b"-----BEGIN CERTIFICATE-----")
        {
            return Err(error("holds no PEM certificate".into()));
        }
        self.ca_pem = Some(pem);
        Ok(self)
    }
}

/// A component pulled from a registry.
#[derive(Debug)]
pub struct PulledComponent {
    /// The component's bytes, their digest verified.
    pub bytes: Vec<u8>,
    /// The manifest's digest (`sha256:…`): the reference to pin.
    pub manifest_digest: String,
    /// The manifest as the registry sent it (it hashes to `manifest_digest`).
    pub manifest: Vec<u8>,
}

/// The largest signature payload downloaded: a simple signing payload is a few hundred bytes.
const MAX_SIGNATURE_PAYLOAD_BYTES: u64 = 64 * 1024;
/// The most signatures of one image examined.
const MAX_SIGNATURES: usize = 32;

/// Pushes and pulls provider components. Cheap to share: one HTTP client, one token cache.
pub struct RegistryClient {
    client: Client,
    options: RegistryOptions,
}

impl RegistryClient {
    /// A client with `options`; fails on a CA the TLS stack cannot load.
    pub fn new(options: RegistryOptions) -> Result<RegistryClient, OciError> {
        let protocol = if options.plain_http.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(options.plain_http.clone())
        };
        let config = ClientConfig {
            protocol,
            extra_root_certificates: options
                .ca_pem
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            // An index (multi-platform image) is never a component: no platform to choose.
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            ..ClientConfig::default()
        };
        let client =
            Client::try_from(config).map_err(|e| OciError::ClientSetup(error_chain(&e)))?;
        Ok(RegistryClient { client, options })
    }

    /// Pushes the component `bytes` (read from `file`, named in errors) to `reference`, a
    /// tag, as a wasm artifact; returns the manifest's digest (`sha256:…`).
    pub async fn push(
        &self,
        file: &Path,
        bytes: Vec<u8>,
        reference: &str,
    ) -> Result<String, OciError> {
        let parsed = parse_reference(reference)?;
        if parsed.digest().is_some() {
            return Err(OciError::PushToDigest {
                reference: reference.to_owned(),
            });
        }
        let not_a_component = |e: anyhow::Error| OciError::NotAComponent {
            file: file.to_owned(),
            message: format!("{e:#}"),
        };
        let (wasm_config, layer) =
            WasmConfig::from_raw_component(bytes, None).map_err(not_a_component)?;
        let config: Config = wasm_config.to_config().map_err(not_a_component)?;
        let mut manifest = OciImageManifest::build(std::slice::from_ref(&layer), &config, None);
        manifest.media_type = Some(OCI_IMAGE_MEDIA_TYPE.to_owned());
        // Serialised here, so the digest printed is the digest of the bytes sent.
        let manifest_bytes = serde_json::to_vec(&manifest).map_err(|e| OciError::Registry {
            reference: reference.to_owned(),
            message: format!("serialising the manifest: {e}"),
        })?;
        let registry_error = |e: OciDistributionError| self.registry_error(reference, &parsed, e);
        self.client
            .store_auth_if_needed(parsed.resolve_registry(), &self.auth(&parsed))
            .await;
        self.client
            .push_blob(&parsed, &layer.data, &manifest.layers[0].digest)
            .await
            .map_err(registry_error)?;
        self.client
            .push_blob(&parsed, &config.data, &manifest.config.digest)
            .await
            .map_err(registry_error)?;
        self.client
            .push_manifest_raw(
                &parsed,
                manifest_bytes.clone(),
                http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
            )
            .await
            .map_err(registry_error)?;
        Ok(Digest::of(&manifest_bytes).to_string())
    }

    /// Pulls the component at `reference` into memory, within the layer cap.
    ///
    /// Digests are verified by oci-client as the bytes arrive: the manifest against the pinned
    /// digest and the registry's `Docker-Content-Digest`, the layer against its descriptor at
    /// the end of its stream. A mismatch becomes [`OciError::DigestMismatch`]; no bytes that
    /// failed it are returned.
    pub async fn pull(&self, reference: &str) -> Result<PulledComponent, OciError> {
        let parsed = parse_reference(reference)?;
        let auth = self.auth(&parsed);
        let (manifest_bytes, manifest_digest) = self
            .client
            .pull_manifest_raw(&parsed, &auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await
            .map_err(|e| match digest_mismatch(reference, "manifest", &e) {
                Some(mismatch) => mismatch,
                None => self.registry_error(reference, &parsed, e),
            })?;
        let manifest: OciImageManifest =
            serde_json::from_slice(&manifest_bytes).map_err(|e| OciError::NotWasmComponent {
                reference: reference.to_owned(),
                found: format!("a manifest that is not an OCI image manifest ({e})"),
            })?;
        check_wasm_layout(reference, &manifest)?;
        let layer = &manifest.layers[0];
        // A negative size is as bad as a huge one.
        let declared = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if declared > self.options.max_layer_bytes {
            return Err(OciError::LayerOverCap {
                reference: reference.to_owned(),
                size: declared,
                cap: self.options.max_layer_bytes,
            });
        }
        let bytes = self
            .download_layer(reference, &parsed, layer, declared)
            .await?;
        Ok(PulledComponent {
            bytes,
            manifest_digest,
            manifest: manifest_bytes,
        })
    }

    /// The digest `reference` (a tag) points to now, asked with one `HEAD`.
    pub async fn resolve(&self, reference: &str) -> Result<String, OciError> {
        let parsed = parse_reference(reference)?;
        self.client
            .fetch_manifest_digest(&parsed, &self.auth(&parsed))
            .await
            .map_err(|e| self.registry_error(reference, &parsed, e))
    }

    /// The cosign signatures stored beside the manifest `manifest_digest` of `reference`'s
    /// repository (none when there is no signature manifest). At most [`MAX_SIGNATURES`] are
    /// read, each payload within [`MAX_SIGNATURE_PAYLOAD_BYTES`] and its digest verified.
    pub async fn signatures(
        &self,
        reference: &str,
        manifest_digest: &str,
    ) -> Result<Vec<Signature>, OciError> {
        let (tag_reference, manifest) = self.signature_manifest(reference, manifest_digest).await?;
        let Some(manifest) = manifest else {
            return Ok(Vec::new());
        };
        let mut signatures = Vec::new();
        for layer in manifest
            .layers
            .iter()
            .filter(|layer| layer.media_type == SIGNATURE_MEDIA_TYPE)
            .take(MAX_SIGNATURES)
        {
            let Some(signature) = layer
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(SIGNATURE_ANNOTATION))
                .and_then(|text| base64::engine::general_purpose::STANDARD.decode(text).ok())
            else {
                continue;
            };
            let declared = u64::try_from(layer.size).unwrap_or(u64::MAX);
            if declared > MAX_SIGNATURE_PAYLOAD_BYTES {
                continue;
            }
            let payload = self
                .download_layer(reference, &tag_reference, layer, declared)
                .await?;
            signatures.push(Signature { payload, signature });
        }
        Ok(signatures)
    }

    /// Signs the manifest `manifest_digest` of `reference`'s repository with `key` and stores
    /// the signature as cosign does, beside any already there.
    pub async fn sign(
        &self,
        reference: &str,
        manifest_digest: &str,
        key: &SigningKey,
    ) -> Result<(), OciError> {
        let parsed = parse_reference(reference)?;
        let docker_reference = format!("{}/{}", parsed.resolve_registry(), parsed.repository());
        let payload = signing::payload(&docker_reference, manifest_digest);
        let signature = base64::engine::general_purpose::STANDARD.encode(key.sign(&payload));
        let (tag_reference, existing) = self.signature_manifest(reference, manifest_digest).await?;
        let payload_digest = Digest::of(&payload).to_string();
        let layer = oci_client::manifest::OciDescriptor {
            media_type: SIGNATURE_MEDIA_TYPE.to_owned(),
            digest: payload_digest.clone(),
            size: payload.len() as i64,
            annotations: Some([(SIGNATURE_ANNOTATION.to_owned(), signature)].into()),
            ..Default::default()
        };
        let (manifest, config) = with_signature(existing, layer);
        let manifest_bytes = serde_json::to_vec(&manifest).unwrap_or_default();
        let registry_error = |e| self.registry_error(reference, &tag_reference, e);
        self.client
            .push_blob(&tag_reference, &payload, &payload_digest)
            .await
            .map_err(registry_error)?;
        self.client
            .push_blob(&tag_reference, &config, &manifest.config.digest)
            .await
            .map_err(registry_error)?;
        self.client
            .push_manifest_raw(
                &tag_reference,
                manifest_bytes,
                http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE),
            )
            .await
            .map_err(registry_error)?;
        Ok(())
    }

    /// The signature manifest of `manifest_digest` in `reference`'s repository (its reference,
    /// and the manifest when there is one).
    async fn signature_manifest(
        &self,
        reference: &str,
        manifest_digest: &str,
    ) -> Result<(Reference, Option<OciImageManifest>), OciError> {
        let parsed = parse_reference(reference)?;
        let tag_reference = Reference::with_tag(
            parsed.registry().to_owned(),
            parsed.repository().to_owned(),
            signing::signature_tag(manifest_digest),
        );
        let auth = self.auth(&parsed);
        let pulled = self
            .client
            .pull_manifest_raw(
                &tag_reference,
                &auth,
                &[
                    OCI_IMAGE_MEDIA_TYPE,
                    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
                ],
            )
            .await;
        let bytes = match pulled {
            Ok((bytes, _)) => bytes,
            Err(error) if is_not_found(&error) => return Ok((tag_reference, None)),
            Err(error) => return Err(self.registry_error(reference, &tag_reference, error)),
        };
        let manifest = serde_json::from_slice(&bytes).map_err(|e| OciError::Registry {
            reference: reference.to_owned(),
            message: format!(
                "the signature manifest {} is not an image manifest: {e}",
                signing::signature_tag(manifest_digest)
            ),
        })?;
        Ok((tag_reference, Some(manifest)))
    }

    /// The layer's bytes, never more than `declared` (already within the cap) in memory.
    async fn download_layer(
        &self,
        reference: &str,
        parsed: &Reference,
        layer: &oci_client::manifest::OciDescriptor,
        declared: u64,
    ) -> Result<Vec<u8>, OciError> {
        let mut stream = self
            .client
            .pull_blob_stream(parsed, layer)
            .await
            .map_err(|e| self.registry_error(reference, parsed, e))?;
        let mut bytes = Vec::with_capacity(usize::try_from(declared).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                e.get_ref()
                    .and_then(|inner| digest_mismatch(reference, "component layer", inner))
                    .unwrap_or_else(|| OciError::Registry {
                        reference: reference.to_owned(),
                        message: format!("downloading the component layer: {e}"),
                    })
            })?;
            if (bytes.len() + chunk.len()) as u64 > declared {
                return Err(OciError::LayerSizeMismatch {
                    reference: reference.to_owned(),
                    declared,
                    received: format!("more than {declared}"),
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if bytes.len() as u64 != declared {
            return Err(OciError::LayerSizeMismatch {
                reference: reference.to_owned(),
                declared,
                received: bytes.len().to_string(),
            });
        }
        Ok(bytes)
    }

    fn auth(&self, reference: &Reference) -> RegistryAuth {
        self.options
            .credentials
            .auth_for(reference.resolve_registry())
    }

    /// `error` as an [`OciError`]; a refusal of the credentials names the user, never the
    /// password.
    fn registry_error(
        &self,
        reference: &str,
        parsed: &Reference,
        error: OciDistributionError,
    ) -> OciError {
        let refused = match &error {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => true,
            // A push's upload session answers 401 as a plain server error.
            OciDistributionError::ServerError { code, .. } => *code == 401,
            OciDistributionError::RegistryError { envelope, .. } => envelope
                .errors
                .iter()
                .any(|e| matches!(e.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)),
            _ => false,
        };
        if refused {
            let credentials = match self.auth(parsed) {
                RegistryAuth::Basic(username, _) => format!("user {username}"),
                _ => "none".to_owned(),
            };
            return OciError::Unauthorized {
                reference: reference.to_owned(),
                registry: parsed.resolve_registry().to_owned(),
                credentials,
            };
        }
        OciError::Registry {
            reference: reference.to_owned(),
            // `{:#}`-like: the source chain (a TLS or connection failure) on one line.
            message: error_chain(&error),
        }
    }
}

/// Whether the registry answered that the manifest does not exist.
fn is_not_found(error: &OciDistributionError) -> bool {
    match error {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NotFound
            )
        }),
        OciDistributionError::ServerError { code, .. } => *code == 404,
        _ => false,
    }
}

/// `error` as a [`OciError::DigestMismatch`] of `what`, when oci-client's digest verification
/// raised it (directly, or as its [`OciDistributionError::DigestError`]).
fn digest_mismatch(
    reference: &str,
    what: &'static str,
    error: &(dyn std::error::Error + 'static),
) -> Option<OciError> {
    let verification = match error.downcast_ref::<OciDistributionError>() {
        Some(OciDistributionError::DigestError(inner)) => inner,
        _ => error.downcast_ref::<DigestError>()?,
    };
    match verification {
        DigestError::VerificationError { expected, actual } => Some(OciError::DigestMismatch {
            reference: reference.to_owned(),
            what,
            expected: expected.clone(),
            actual: actual.clone(),
        }),
        _ => None,
    }
}

/// `error` and its sources, joined on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The registry host (`host:port`) of `reference`.
pub fn registry_of(reference: &str) -> Result<String, OciError> {
    Ok(parse_reference(reference)?.resolve_registry().to_owned())
}

/// The last name of `reference`'s repository (`r.example/providers/proxmox:1` → `proxmox`).
pub fn repository_name(reference: &str) -> Result<String, OciError> {
    let parsed = parse_reference(reference)?;
    let repository = parsed.repository();
    Ok(repository
        .rsplit('/')
        .next()
        .unwrap_or(repository)
        .to_owned())
}

/// `reference` pinned to `digest`: as given when it names a digest already, else
/// `reference@digest`.
pub fn pinned(reference: &str, digest: &str) -> Result<String, OciError> {
    Ok(match parse_reference(reference)?.digest() {
        Some(_) => reference.to_owned(),
        None => format!("{reference}@{digest}"),
    })
}

fn parse_reference(reference: &str) -> Result<Reference, OciError> {
    reference
        .parse::<Reference>()
        .map_err(|e| OciError::InvalidReference {
            reference: reference.to_owned(),
            message: e.to_string(),
        })
}

/// Refuses a manifest that is not the wasm layout, naming the media types it has.
fn check_wasm_layout(reference: &str, manifest: &OciImageManifest) -> Result<(), OciError> {
    let is_wasm = manifest.config.media_type == WASM_CONFIG_MEDIA_TYPE
        && manifest.layers.len() == 1
        && manifest.layers[0].media_type == WASM_LAYER_MEDIA_TYPE;
    if is_wasm {
        return Ok(());
    }
    let layers: Vec<&str> = manifest
        .layers
        .iter()
        .map(|layer| layer.media_type.as_str())
        .collect();
    Err(OciError::NotWasmComponent {
        reference: reference.to_owned(),
        found: format!(
            "config {}, layers [{}]",
            manifest.config.media_type,
            layers.join(", ")
        ),
    })
}

/// The signature manifest `existing` (a new one when `None`) with the signature `layer` added
/// beside its signatures, and its config: cosign's, an empty image config listing the layers.
fn with_signature(
    existing: Option<OciImageManifest>,
    layer: oci_client::manifest::OciDescriptor,
) -> (OciImageManifest, Vec<u8>) {
    let mut layers: Vec<oci_client::manifest::OciDescriptor> = existing
        .map(|manifest| manifest.layers)
        .unwrap_or_default()
        .into_iter()
        .filter(|layer| layer.media_type == SIGNATURE_MEDIA_TYPE)
        .collect();
    layers.push(layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "",
        "config": {},
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|layer| layer.digest.clone()).collect::<Vec<_>>(),
        },
    }))
    .unwrap_or_default();
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_owned()),
        config: oci_client::manifest::OciDescriptor {
            media_type: oci_client::manifest::IMAGE_CONFIG_MEDIA_TYPE.to_owned(),
            digest: Digest::of(&config).to_string(),
            size: config.len() as i64,
            ..Default::default()
        },
        layers,
        ..Default::default()
    };
    (manifest, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_reads_both_entry_forms_and_strips_schemes() {
        let config = DockerConfig::parse(
            br#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "YWxpY2U6czNjcmV0"},
                "127.0.0.1:5000": {"username": "bob", "password": "hunter2"}
            }}"#,
        )
        .unwrap();
        let basic = |registry: &str| match config.auth_for(registry) {
            RegistryAuth::Basic(user, password) => Some((user, password)),
            _ => None,
        };
        assert_eq!(
            basic("index.docker.io"),
            Some(("alice".into(), "s3cret".into()))
        );
        assert_eq!(
            basic("127.0.0.1:5000"),
            Some(("bob".into(), "hunter2".into()))
        );
        assert_eq!(basic("elsewhere.example"), None);
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn a_bad_docker_config_entry_is_named_without_its_secret() {
        let error = DockerConfig::parse(br#"{"auths": {"r.example": {"auth": "bm9jb2xvbg=="}}}"#)
            .unwrap_err();
        assert!(error.contains("auths.r.example.auth"), "{error}");
        assert!(!error.contains("bm9jb2xvbg"), "{error}");
        let error =
            DockerConfig::parse(br#"{"auths": {"r.example": {"username": "u"}}}"#).unwrap_err();
        assert!(
            error.contains("neither auth nor username and password"),
            "{error}"
        );
    }

    #[test]
    fn references_name_their_registry_repository_and_pin() {
        let tagged = "127.0.0.1:5000/providers/proxmox:1.0";
        assert_eq!(registry_of(tagged).unwrap(), "127.0.0.1:5000");
        assert_eq!(repository_name(tagged).unwrap(), "proxmox");
        let digest = format!("sha256:{}", "a".repeat(64));
        let pinned_once = pinned(tagged, &digest).unwrap();
        assert_eq!(pinned_once, format!("{tagged}@{digest}"));
        assert_eq!(pinned(&pinned_once, &digest).unwrap(), pinned_once);
        let error = registry_of("Not A Reference").unwrap_err().to_string();
        assert!(
            error.contains("\"Not A Reference\" is not an artifact reference"),
            "{error}"
        );
    }

    #[test]
    fn a_manifest_of_another_layout_is_refused_naming_its_media_types() {
        let mut manifest = OciImageManifest::default();
        manifest.config.media_type = "application/vnd.oci.image.config.v1+json".into();
        manifest.layers.push(oci_client::manifest::OciDescriptor {
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            ..Default::default()
        });
        let error = check_wasm_layout("r.example/p:1", &manifest)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("config application/vnd.oci.image.config.v1+json")
                && error.contains("layers [application/vnd.oci.image.layer.v1.tar+gzip]"),
            "{error}"
        );
    }
}
