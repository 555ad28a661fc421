//! Per-run TLS material: a fresh CA and a leaf for 127.0.0.1/localhost, like a Proxmox node's
//! self-signed `pve-root-ca.pem` chain. ALPN offers `http/1.1` only, because pveproxy never speaks
//! HTTP/2 (F18).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The generated chain: the CA in PEM (for clients) and a ready rustls server config.
pub(crate) struct TlsMaterial {
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

/// Builds a CA and a leaf certificate whose SANs cover the loopback names, plus the node names as
/// Proxmox's own leaf does (one listener answers for every node, so its leaf names them all).
pub(crate) fn generate(nodes: &[String]) -> anyhow::Result<TlsMaterial> {
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pvesim Proxmox Virtual Environment CA");
    ca_params
        .distinguished_name
        .push(DnType::OrganizationName, "PVE Cluster Manager CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("self-signing the CA")?;

    let leaf_key = KeyPair::generate().context("generating the leaf key")?;
    let names = std::iter::once("localhost".to_string()).chain(nodes.iter().cloned());
    let mut leaf_params = CertificateParams::new(names.collect::<Vec<_>>())?;
    leaf_params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    leaf_params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    leaf_params.distinguished_name = DistinguishedName::new();
    leaf_params.distinguished_name.push(
        DnType::CommonName,
        nodes.first().map_or("localhost", String::as_str),
    );
    leaf_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf_params
        .signed_by(&leaf_key, &ca_cert, &ca_key)
        .context("signing the leaf certificate")?;

    let chain = vec![
        leaf_cert.der().clone(),
        CertificateDer::from(ca_cert.der().to_vec()),
    ];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("choosing TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("loading the leaf certificate")?;
    // F18: a client asking for h2 still gets HTTP/1.1.
    server_config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsMaterial {
        ca_pem: ca_cert.pem(),
        server_config: Arc::new(server_config),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpn_offers_only_http1() {
        let material = generate(&["pv1-1".to_string()]).unwrap();
        assert_eq!(
            material.server_config.alpn_protocols,
            vec![b"http/1.1".to_vec()]
        );
        assert!(material.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
