//! # egress-distribution
//!
//! Provider components as OCI artifacts, in the layout the wasm ecosystem shares (the CNCF wasm
//! OCI artifact layout, as Spin, wasmCloud, wkg and Kubewarden read it), and keyed signatures of
//! them in cosign's format.
//!
//! - [`oci`]: push, pull and inspect a component through a registry: credentials, CAs, plain HTTP
//!   per registry, a layer size cap, every digest verified.
//! - [`signing`]: sign an image's manifest digest and verify it against trusted keys, so `cosign
//!   verify --key` and the operator agree about the same image.
//! - [`store`]: pulled components kept by digest, each part checked when read, so a restart or a
//!   registry that is down serves what was pulled before.
//!
//! The operator's image source (`egress-operator`'s `images`) turns what this crate refuses into
//! a ProviderConfig's conditions; the CLI's `provider push|pull|inspect` call it directly. It knows
//! nothing of the operator, the runtime or Kubernetes.

#![warn(missing_docs)]

pub mod oci;
pub mod signing;
pub mod store;

pub use oci::{OciError, RegistryClient, RegistryOptions};
/// An image reference (`REGISTRY/REPOSITORY[:TAG][@sha256:…]`), as the registry client parses it.
pub use oci_client::Reference;
/// An image manifest, as a registry serves it.
pub use oci_client::manifest::OciImageManifest;
pub use signing::{Signature, SigningKey, TrustedKey};
