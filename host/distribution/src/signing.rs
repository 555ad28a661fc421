//! Keyed signatures of provider images, in cosign's format, so `cosign verify --key` and the
//! operator agree about the same image.
//!
//! Cosign stores the signatures of the manifest `sha256:<hex>` as an image manifest tagged
//! `sha256-<hex>.sig` in the same repository ([`signature_tag`]). Each of its layers is one
//! signature: the layer is a JSON "simple signing" payload ([`payload`]) naming the manifest
//! digest, its media type is [`SIGNATURE_MEDIA_TYPE`] and its annotation
//! [`SIGNATURE_ANNOTATION`] holds the base64 of an ASN.1 ECDSA P-256 signature over the payload's
//! SHA-256, the key type `cosign generate-key-pair` makes.
//!
//! [`verify`] accepts an image when one signature verifies under one trusted key *and* its
//! payload names the manifest digest being served: a valid signature of another image does not
//! carry over.

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _,
    UnparsedPublicKey,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use serde::{Deserialize, Serialize};

/// The media type of a signature layer (cosign's simple signing payload).
pub const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The claim type of a cosign image signature.
const SIGNATURE_TYPE: &str = "cosign container image signature";
/// The DER prefix of an ECDSA P-256 SubjectPublicKeyInfo, before the 65-byte uncompressed point:
/// SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING }.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A key that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{what} is not usable: {problem}")]
pub struct KeyError {
    /// Where the key came from.
    pub what: String,
    /// Why.
    pub problem: String,
}

/// Why an image's signatures were not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureRefusal {
    /// No signature is stored beside the image.
    #[error("{digest} is not signed (no {tag} beside it in the registry)")]
    Unsigned {
        /// The manifest digest.
        digest: String,
        /// The tag its signatures would have.
        tag: String,
    },
    /// Signatures exist, none by a trusted key over this digest.
    #[error(
        "none of the {found} signature(s) of {digest} verifies under a trusted key ({keys}){detail}"
    )]
    Untrusted {
        /// The manifest digest.
        digest: String,
        /// How many signatures were found.
        found: usize,
        /// The trusted keys, by name.
        keys: String,
        /// What was seen, when it says more (a signature of another digest).
        detail: String,
    },
}

/// A private key that signs images: ECDSA P-256.
pub struct SigningKey {
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A PEM `PRIVATE KEY` (PKCS#8, unencrypted) for ECDSA P-256, as
    /// `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes; `what` names it
    /// in errors.
    pub fn from_pem(pem: &[u8], what: &str) -> Result<SigningKey, KeyError> {
        let error = |problem: &str| KeyError {
            what: what.to_owned(),
            problem: problem.to_owned(),
        };
        if contains(pem, b"ENCRYPTED") {
            return Err(error(
                "it is encrypted; give an unencrypted PKCS#8 PEM (openssl pkcs8 -topk8 -nocrypt)",
            ));
        }
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem).map_err(|_| {
            error("it holds no PEM PRIVATE KEY (PKCS#8); convert one with openssl pkcs8 -topk8 -nocrypt")
        })?;
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_ASN1_SIGNING,
            der.secret_pkcs8_der(),
            &rng,
        )
        .map_err(|_| error("it is not an ECDSA P-256 key (cosign's key type)"))?;
        Ok(SigningKey { key, rng })
    }

    /// The ASN.1 DER signature of `payload`.
    pub fn sign(&self, payload: &[u8]) -> Vec<u8> {
        self.key
            .sign(&self.rng, payload)
            .map(|signature| signature.as_ref().to_vec())
            // ring fails only when the system RNG does, which nothing can serve around.
            .expect("the system random number generator failed")
    }

    /// The public half, as a PEM `PUBLIC KEY`: what `cosign verify --key` and a trust policy take.
    pub fn public_key_pem(&self) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.key.public_key().as_ref());
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|line| std::str::from_utf8(line).unwrap_or_default())
            .collect();
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            lines.join("\n")
        )
    }
}

/// A public key trusted to sign provider images.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedKey {
    /// Its name in messages (where it came from).
    pub name: String,
    /// The uncompressed P-256 point.
    point: Vec<u8>,
}

impl TrustedKey {
    /// A PEM `PUBLIC KEY` for ECDSA P-256 (cosign's `cosign.pub`), named `name` in messages.
    pub fn from_pem(name: &str, pem: &[u8]) -> Result<TrustedKey, KeyError> {
        let error = |problem: &str| KeyError {
            what: name.to_owned(),
            problem: problem.to_owned(),
        };
        let der = SubjectPublicKeyInfoDer::from_pem_slice(pem)
            .map_err(|_| error("it holds no PEM PUBLIC KEY"))?;
        let point = der
            .as_ref()
            .strip_prefix(P256_SPKI_PREFIX.as_slice())
            .filter(|point| point.len() == 65 && point[0] == 0x04)
            .ok_or_else(|| error("it is not an ECDSA P-256 public key (cosign's key type)"))?;
        Ok(TrustedKey {
            name: name.to_owned(),
            point: point.to_vec(),
        })
    }

    fn verifies(&self, signature: &Signature) -> bool {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.point)
            .verify(&signature.payload, &signature.signature)
            .is_ok()
    }
}

/// One stored signature: the payload and the signature over it, as they came from the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The simple signing payload (JSON).
    #[serde(with = "base64_bytes")]
    pub payload: Vec<u8>,
    /// The ASN.1 DER ECDSA signature.
    #[serde(with = "base64_bytes")]
    pub signature: Vec<u8>,
}

/// The simple signing payload cosign signs for `manifest_digest` in repository
/// `docker_reference` (`REGISTRY/REPOSITORY`).
pub fn payload(docker_reference: &str, manifest_digest: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": {"docker-reference": docker_reference},
            "image": {"docker-manifest-digest": manifest_digest},
            "type": SIGNATURE_TYPE,
        },
        "optional": null,
    }))
    .unwrap_or_default()
}

/// The tag cosign stores the signatures of `manifest_digest` (`sha256:<hex>`) under.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

/// The name of the first trusted key that signed `manifest_digest` among `signatures`.
pub fn verify<'k>(
    manifest_digest: &str,
    signatures: &[Signature],
    keys: &'k [TrustedKey],
) -> Result<&'k str, SignatureRefusal> {
    if signatures.is_empty() {
        return Err(SignatureRefusal::Unsigned {
            digest: manifest_digest.to_owned(),
            tag: signature_tag(manifest_digest),
        });
    }
    let mut other_digests = Vec::new();
    for signature in signatures {
        let Some(key) = keys.iter().find(|key| key.verifies(signature)) else {
            continue;
        };
        // Only a payload naming this digest counts: a signature of another image does not.
        match signed_digest(&signature.payload) {
            Some(signed) if signed == manifest_digest => return Ok(&key.name),
            Some(signed) => other_digests.push(signed),
            None => other_digests.push("a payload that is not a cosign image claim".into()),
        }
    }
    let detail = if other_digests.is_empty() {
        String::new()
    } else {
        format!(
            "; a trusted key signed {} instead",
            other_digests.join(", ")
        )
    };
    Err(SignatureRefusal::Untrusted {
        digest: manifest_digest.to_owned(),
        found: signatures.len(),
        keys: keys
            .iter()
            .map(|key| key.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        detail,
    })
}

/// The digest a cosign image claim names, if `payload` is one.
fn signed_digest(payload: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Claim {
        critical: Critical,
    }
    #[derive(Deserialize)]
    struct Critical {
        image: Image,
        #[serde(rename = "type")]
        kind: String,
    }
    #[derive(Deserialize)]
    struct Image {
        #[serde(rename = "docker-manifest-digest")]
        digest: String,
    }
    let claim: Claim = serde_json::from_slice(payload).ok()?;
    (claim.critical.kind == SIGNATURE_TYPE).then_some(claim.critical.image.digest)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Bytes as base64 in the cache's JSON.
mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const OTHER: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn key() -> SigningKey {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        SigningKey::from_pem(pair.serialize_pem().as_bytes(), "test key").unwrap()
    }

    fn signed(key: &SigningKey, digest: &str) -> Signature {
        let payload = payload("registry.example/providers/proxmox", digest);
        Signature {
            signature: key.sign(&payload),
            payload,
        }
    }

    fn trusted(key: &SigningKey, name: &str) -> TrustedKey {
        TrustedKey::from_pem(name, key.public_key_pem().as_bytes()).unwrap()
    }

    #[test]
    fn a_signature_by_a_trusted_key_over_the_digest_is_accepted() {
        let release = key();
        let keys = [trusted(&key(), "other"), trusted(&release, "release")];
        let key = release;
        assert_eq!(
            verify(DIGEST, &[signed(&key, DIGEST)], &keys),
            Ok("release")
        );
    }

    #[test]
    fn no_signature_is_unsigned() {
        let refusal = verify(DIGEST, &[], &[trusted(&key(), "release")]).unwrap_err();
        assert!(matches!(refusal, SignatureRefusal::Unsigned { .. }));
        assert!(refusal.to_string().contains("sha256-1111"), "{refusal}");
    }

    #[test]
    fn a_signature_by_an_untrusted_key_is_refused_naming_the_trusted_ones() {
        let refusal = verify(
            DIGEST,
            &[signed(&key(), DIGEST)],
            &[trusted(&key(), "release")],
        )
        .unwrap_err();
        assert!(matches!(
            refusal,
            SignatureRefusal::Untrusted { found: 1, .. }
        ));
        assert!(refusal.to_string().contains("release"), "{refusal}");
    }

    #[test]
    fn a_trusted_signature_of_another_digest_does_not_carry_over() {
        let key = key();
        let refusal =
            verify(DIGEST, &[signed(&key, OTHER)], &[trusted(&key, "release")]).unwrap_err();
        assert!(refusal.to_string().contains(OTHER), "{refusal}");
    }

    #[test]
    fn a_tampered_payload_is_refused() {
        let key = key();
        let mut signature = signed(&key, DIGEST);
        signature.payload.push(b' ');
        assert!(verify(DIGEST, &[signature], &[trusted(&key, "release")]).is_err());
    }

    #[test]
    fn keys_that_are_not_p256_are_refused_with_the_reason() {
        let rsa_like = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
        let error = TrustedKey::from_pem("ed25519", rsa_like.as_bytes()).unwrap_err();
        assert!(error.to_string().contains("P-256"), "{error}");
        let error = TrustedKey::from_pem("junk", b"not a key").unwrap_err();
        assert!(error.to_string().contains("PUBLIC KEY"), "{error}");
        let encrypted = b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAA==\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n";
        let error = SigningKey::from_pem(encrypted, "cosign.key").unwrap_err();
        assert!(error.to_string().contains("encrypted"), "{error}");
    }

    #[test]
    fn the_signature_tag_is_cosigns() {
        assert_eq!(
            signature_tag(DIGEST),
            "sha256-1111111111111111111111111111111111111111111111111111111111111111.sig"
        );
    }
}
