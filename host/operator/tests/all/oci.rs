//! Providers as OCI artifacts, against a real registry (Debian's `docker-registry`, TLS with the
//! run's CA, basic auth): `provider push`, `pull` and `inspect REF` as a user runs them, and each
//! bad input refused with an error naming its cause.
//!
//! Needs `docker-registry` (`just setup`) and `target/components/proxmox.wasm`
//! (`just build-components`).

use crate::oci_support::*;
use testkit::sha256_hex;

const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
const WASM_LAYER: &str = "application/wasm";

/// Pushes proxmox.wasm to `repository:tag` with the CLI; returns the printed `REF@sha256:…`.
fn push_proxmox(registry: &Registry, repository_and_tag: &str) -> String {
    let reference = registry.reference(repository_and_tag);
    let file = component("proxmox");
    let output = run_against(registry, &["provider", "push", path_str(&file), &reference]);
    assert!(
        output.status.success(),
        "{}\n{}",
        stderr(&output),
        registry.log()
    );
    let printed = stdout(&output).trim().to_owned();
    let digest = printed
        .strip_prefix(&format!("{reference}@sha256:"))
        .unwrap_or_else(|| panic!("not {reference}@sha256:…: {printed}"));
    assert_eq!(digest.len(), 64, "{printed}");
    printed
}

#[test]
fn a_pushed_component_pulls_back_byte_identical_by_tag_and_by_digest() {
    let registry = Registry::start();
    let pinned = push_proxmox(&registry, "providers/proxmox:1.0");
    let out = tempfile::tempdir().unwrap();
    for reference in [registry.reference("providers/proxmox:1.0"), pinned.clone()] {
        let file = out.path().join("pulled.wasm");
        let output = run_against(
            &registry,
            &["provider", "pull", &reference, "-o", path_str(&file)],
        );
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(
            stdout(&output).trim(),
            pinned,
            "pull prints the pinned reference"
        );
        assert!(
            std::fs::read(&file).unwrap() == std::fs::read(component("proxmox")).unwrap(),
            "{reference} pulled other bytes"
        );
    }
}

#[test]
fn inspect_of_a_reference_prints_what_inspect_of_the_file_prints() {
    let registry = Registry::start();
    let pinned = push_proxmox(&registry, "providers/proxmox:1.0");
    let of_file = run(&["provider", "inspect", path_str(&component("proxmox"))]);
    assert!(of_file.status.success(), "{}", stderr(&of_file));
    let of_reference = run_against(&registry, &["provider", "inspect", &pinned]);
    assert!(of_reference.status.success(), "{}", stderr(&of_reference));
    assert_eq!(stdout(&of_reference), stdout(&of_file));
}

/// Other tools read our artifacts: the manifest, read over the registry's own HTTP API, has the
/// wasm layout's media types, and the config the layout's fields.
#[tokio::test]
async fn the_pushed_artifact_has_the_wasm_oci_media_types() {
    let registry = Registry::start();
    push_proxmox(&registry, "providers/proxmox:1.0");
    let manifest = registry.manifest("providers/proxmox", "1.0").await;
    assert_eq!(manifest["schemaVersion"], 2, "{manifest}");
    assert_eq!(
        manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json",
        "{manifest}"
    );
    assert_eq!(manifest["config"]["mediaType"], WASM_CONFIG, "{manifest}");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(layers[0]["mediaType"], WASM_LAYER, "{manifest}");
    let bytes = std::fs::read(component("proxmox")).unwrap();
    assert_eq!(layers[0]["size"], bytes.len(), "{manifest}");

    let digest = manifest["config"]["digest"].as_str().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&registry.blob("providers/proxmox", digest).await).unwrap();
    assert_eq!(config["architecture"], "wasm", "{config}");
    assert_eq!(config["os"], "wasip2", "{config}");
    assert_eq!(config["layerDigests"][0], layers[0]["digest"], "{config}");
    let exports = config["component"]["exports"].as_array().unwrap();
    assert!(
        exports.iter().any(|export| export
            .as_str()
            .unwrap()
            .starts_with("egress:provider/provider@")),
        "{config}"
    );
}

#[test]
fn wrong_credentials_are_refused_naming_the_registry_and_never_the_password() {
    let registry = Registry::start();
    let wrong = registry.write_auth_file("wrong.json", USER, "not-the-password");
    let reference = registry.reference("providers/proxmox:1.0");
    let proxmox = component("proxmox");
    let out = tempfile::tempdir().unwrap();
    let pulled = out.path().join("pulled.wasm");
    for args in [
        vec!["provider", "push", path_str(&proxmox), &reference],
        vec!["provider", "pull", &reference, "-o", path_str(&pulled)],
    ] {
        let mut args = args;
        args.extend(["--ca-file", path_str(&registry.ca_file)]);
        args.extend(["--auth-file", path_str(&wrong)]);
        let output = run(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stdout(&output)
        );
        let error = stderr(&output);
        assert!(
            error.contains("refused the credentials")
                && error.contains(&registry.host)
                && error.contains(USER),
            "{error}"
        );
        assert!(!error.contains("not-the-password"), "{error}");
    }
}

/// The registry's storage is altered under it: it serves a component layer that is not the
/// bytes its digest names.
#[test]
fn a_layer_that_does_not_match_its_digest_is_refused() {
    let registry = Registry::start();
    let pinned = push_proxmox(&registry, "providers/proxmox:1.0");
    let bytes = std::fs::read(component("proxmox")).unwrap();
    let layer_digest = format!("sha256:{}", sha256_hex(&bytes));
    let mut altered = bytes.clone();
    // Same length, one byte changed: only the digest can tell.
    *altered.last_mut().unwrap() ^= 0xff;
    std::fs::write(registry.blob_file(&layer_digest), &altered).unwrap();

    let output = pull(&registry, &pinned);
    assert_eq!(output.status.code(), Some(2));
    let error = stderr(&output);
    assert!(
        error.contains(&format!(
            "the component layer does not match its digest: expected {layer_digest}"
        )),
        "{error}"
    );
}

/// A pinned reference whose manifest the registry serves altered (valid JSON, other bytes).
#[test]
fn a_manifest_that_does_not_match_its_pinned_digest_is_refused() {
    let registry = Registry::start();
    let pinned = push_proxmox(&registry, "providers/proxmox:1.0");
    let digest = pinned.rsplit_once('@').unwrap().1;
    let manifest_file = registry.blob_file(digest);
    let mut manifest = std::fs::read(&manifest_file).unwrap();
    manifest.push(b'\n');
    std::fs::write(&manifest_file, &manifest).unwrap();

    let output = pull(&registry, &pinned);
    assert_eq!(output.status.code(), Some(2));
    let error = stderr(&output);
    assert!(
        error.contains(&format!(
            "the manifest does not match its digest: expected {digest}"
        )),
        "{error}"
    );
}

/// An OCI image-like artifact (a tar layer, an image config) pushed by another tool.
#[tokio::test]
async fn an_artifact_that_is_not_a_wasm_component_is_refused_naming_its_media_types() {
    let registry = Registry::start();
    let reference = registry.push_not_wasm("images/busybox:1").await;

    let output = pull(&registry, &reference);
    assert_eq!(output.status.code(), Some(2));
    let error = stderr(&output);
    assert!(
        error.contains("not a wasm component artifact")
            && error.contains("config application/vnd.oci.image.config.v1+json")
            && error.contains("layers [application/vnd.oci.image.layer.v1.tar+gzip]"),
        "{error}"
    );
}

#[test]
fn a_layer_over_the_cap_is_refused_before_it_is_downloaded() {
    let registry = Registry::start();
    let pinned = push_proxmox(&registry, "providers/proxmox:1.0");
    let size = std::fs::metadata(component("proxmox")).unwrap().len();
    let cap = (size - 1).to_string();
    let over_cap = [
        pull_with(&registry, &pinned, &["--max-layer-bytes", &cap]),
        run_against(
            &registry,
            &["provider", "inspect", &pinned, "--max-layer-bytes", &cap],
        ),
    ];
    for output in over_cap {
        assert_eq!(output.status.code(), Some(2), "{}", stdout(&output));
        let error = stderr(&output);
        assert!(
            error.contains(&format!("{size} bytes, over the cap of {cap} bytes")),
            "{error}"
        );
    }
}

/// The registry's storage grows the layer after the manifest was written: the download stops
/// once more bytes arrive than the descriptor declares.
#[test]
fn a_registry_that_sends_more_than_the_layer_declares_is_cut_off() {
    let registry = Registry::start();
    let pinned = push_proxmox(&registry, "providers/proxmox:1.0");
    let bytes = std::fs::read(component("proxmox")).unwrap();
    let layer_file = registry.blob_file(&format!("sha256:{}", sha256_hex(&bytes)));
    let mut grown = bytes.clone();
    grown.extend(std::iter::repeat_n(0u8, 1 << 20));
    std::fs::write(layer_file, grown).unwrap();

    let output = pull(&registry, &pinned);
    assert_eq!(output.status.code(), Some(2));
    let error = stderr(&output);
    assert!(
        error.contains(&format!("which declares {}", bytes.len())),
        "{error}"
    );
}

#[test]
fn without_the_ca_the_registry_certificate_is_refused() {
    let registry = Registry::start();
    let out = tempfile::tempdir().unwrap();
    let output = run(&[
        "provider",
        "pull",
        &registry.reference("providers/proxmox:1.0"),
        "-o",
        path_str(&out.path().join("pulled.wasm")),
        "--auth-file",
        path_str(&registry.auth_file),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let error = stderr(&output);
    assert!(error.to_lowercase().contains("certificate"), "{error}");
}

/// `provider pull REFERENCE` into a temporary folder.
fn pull(registry: &Registry, reference: &str) -> std::process::Output {
    pull_with(registry, reference, &[])
}

/// `provider pull REFERENCE EXTRA…` into a temporary folder.
fn pull_with(registry: &Registry, reference: &str, extra: &[&str]) -> std::process::Output {
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("pulled.wasm");
    let mut args = vec!["provider", "pull", reference, "-o", path_str(&file)];
    args.extend(extra);
    run_against(registry, &args)
}

/// `--plain-http` speaks HTTP to the reference's registry; without it the CLI insists on TLS.
#[test]
fn plain_http_is_spoken_only_when_asked() {
    let registry = Registry::start_plain_http();
    let reference = registry.reference("providers/proxmox:1.0");
    let proxmox = component("proxmox");
    let auth = path_str(&registry.auth_file);
    let push = |extra: &[&str]| {
        let mut args = vec![
            "provider",
            "push",
            path_str(&proxmox),
            &reference,
            "--auth-file",
            auth,
        ];
        args.extend(extra);
        run(&args)
    };
    let over_tls = push(&[]);
    assert_eq!(over_tls.status.code(), Some(2), "{}", stdout(&over_tls));
    let plain = push(&["--plain-http"]);
    assert!(
        plain.status.success(),
        "{}\n{}",
        stderr(&plain),
        registry.log()
    );
    assert!(
        stdout(&plain).starts_with(&format!("{reference}@sha256:")),
        "{}",
        stdout(&plain)
    );
}
