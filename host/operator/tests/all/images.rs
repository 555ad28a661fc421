//! ProviderConfigs by image, against a real registry (Debian's `docker-registry`, TLS with the
//! run's CA, basic auth): the operator pulls, verifies the digest and the cosign signature,
//! caches by digest, and serves; each bad image is a condition with its reason while the last good
//! component keeps serving; a digest change is a hot swap that fails no call.
//!
//! The ProviderConfig reconciler runs in-process here (with the reference provider, whose `get`
//! makes no request); the end-to-end test runs the real binary in local mode with the Proxmox
//! provider against `pvesim`.
//!
//! Needs `docker-registry` (`just setup`) and the built components (`just build-components`).

use crate::local_support;
use crate::oci_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::oci_support::{Registry, component, path_str, run_against, stderr, stdout};
use egress_operator::conditions::{self, condition};
use egress_operator::crd::{ProviderConfigSpec, ProviderConfigStatus};
use egress_operator::installation::Installation;
use egress_operator::operator::{Operator, Settings};
use egress_operator::provider_config_reconciler::{ProviderConfigOutcome, ProviderConfigState};
use egress_operator::{Missing, Objects};
use egress_runtime::types::{Request, Response};
use egress_runtime::{CallContext, RegistryEvent};
use testkit::sha256_hex;

const PC: &str = "lab";
/// Above the reference provider (about 190 KB), below the Proxmox one (about 500 KB).
const CAP: u64 = 300 * 1024;

/// Signing keys made for the run: `release` is trusted, `stranger` is not.
struct Keys {
    dir: tempfile::TempDir,
    release_public: String,
}

impl Keys {
    fn new() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        let mut release_public = String::new();
        for name in ["release", "stranger"] {
            let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            std::fs::write(dir.path().join(format!("{name}.key")), pair.serialize_pem()).unwrap();
            std::fs::write(
                dir.path().join(format!("{name}.pub")),
                pair.public_key_pem(),
            )
            .unwrap();
            if name == "release" {
                release_public = pair.public_key_pem();
            }
        }
        Keys {
            dir,
            release_public,
        }
    }

    fn private(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.key"))
    }
}

/// Pushes the built component `name` to `repository_and_tag` with the CLI, signed with `key` if
/// given; returns the printed `REF@sha256:…`.
fn push(registry: &Registry, name: &str, repository_and_tag: &str, key: Option<&Path>) -> String {
    let reference = registry.reference(repository_and_tag);
    let file = component(name);
    let mut args = vec!["provider", "push", path_str(&file), &reference];
    if let Some(key) = key {
        args.extend(["--sign", path_str(key)]);
    }
    let output = run_against(registry, &args);
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output).trim().to_owned()
}

/// Secrets and ConfigMaps in memory, as the adapters' caches hold them.
#[derive(Default)]
struct Store {
    secrets: HashMap<(String, String, String), Vec<u8>>,
    config_maps: HashMap<(String, String, String), String>,
}

impl Objects for Store {
    fn secret_value(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, Missing> {
        let found = self
            .secrets
            .get(&(namespace.into(), name.into(), key.into()));
        found.cloned().ok_or(Missing::Key)
    }
    fn config_map_value(&self, namespace: &str, name: &str, key: &str) -> Result<String, Missing> {
        let found = self
            .config_maps
            .get(&(namespace.into(), name.into(), key.into()));
        found.cloned().ok_or(Missing::Key)
    }
}

/// The operator in-process over an empty components folder, a private image cache, the size
/// cap [`CAP`], tags allowed (as in local mode); one ProviderConfig reconciled by hand.
struct Harness {
    operator: Arc<Operator>,
    objects: Store,
    state: ProviderConfigState,
    components: tempfile::TempDir,
    _cache: tempfile::TempDir,
}

impl Harness {
    async fn start(registry: &Registry, keys: &Keys) -> Harness {
        Harness::start_with_tags(registry, keys, true).await
    }

    /// With tags allowed or not (as in a cluster).
    async fn start_with_tags(registry: &Registry, keys: &Keys, allow_tags: bool) -> Harness {
        let components = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let mut settings = Settings::new(
            Installation::new("test-cluster").unwrap(),
            components.path().to_path_buf(),
        );
        settings.images.cache_dir = cache.path().to_path_buf();
        settings.images.max_component_bytes = CAP;
        settings.images.allow_tags = allow_tags;
        let operator = Operator::start(settings).await.unwrap();
        let mut objects = Store::default();
        let auth = std::fs::read(&registry.auth_file).unwrap();
        let wrong =
            std::fs::read(registry.write_auth_file("wrong.json", "publisher", "guess")).unwrap();
        for (name, json) in [("regcred", auth), ("wrongcred", wrong)] {
            objects.secrets.insert(
                ("default".into(), name.into(), ".dockerconfigjson".into()),
                json,
            );
        }
        objects.config_maps.insert(
            ("default".into(), "registry-ca".into(), "ca.crt".into()),
            std::fs::read_to_string(&registry.ca_file).unwrap(),
        );
        objects.config_maps.insert(
            ("default".into(), "signers".into(), "release.pub".into()),
            keys.release_public.clone(),
        );
        Harness {
            operator,
            objects,
            state: ProviderConfigState {
                name: PC.into(),
                generation: 0,
                spec: ProviderConfigSpec::default(),
                status: ProviderConfigStatus::default(),
            },
            components,
            _cache: cache,
        }
    }

    /// Reconciles the ProviderConfig with `spec` (a new generation when it changed) and keeps
    /// the status it writes, as the adapters do.
    async fn reconcile(&mut self, spec: &ProviderConfigSpec) -> ProviderConfigOutcome {
        if *spec != self.state.spec {
            self.state.spec = spec.clone();
            self.state.generation += 1;
        }
        let outcome = self
            .operator
            .provider_configs
            .reconcile(
                &self.operator.providers,
                &self.state,
                &self.objects,
                async { None::<egress_operator::sweep::LiveProxies> },
            )
            .await;
        self.state.status = outcome.status.clone();
        outcome
    }

    /// The digest of the component Proxies call through now.
    fn serving_digest(&self) -> String {
        let binding = self
            .operator
            .providers
            .binding(PC)
            .expect("a binding serves");
        binding.provider.component_digest().to_string()
    }

    /// One `get` through the binding that serves.
    async fn call(&self) -> Result<Response, String> {
        let binding = self.operator.providers.binding(PC).map_err(|e| e.message)?;
        binding
            .provider
            .call(get(&binding.config, 0), &CallContext::default())
            .await
            .map_err(|e| e.to_string())
    }
}

fn get(config: &str, delay_ms: u64) -> Request {
    let config = if delay_ms == 0 {
        config.to_owned()
    } else {
        format!(r#"{{"delayMs": {delay_ms}}}"#)
    };
    Request::Get {
        config,
        provider_id: "ref/web".into(),
    }
}

/// The ProviderConfig spec of the reference provider by `image`, the registry reached with the
/// Secret `pull_secret` and the run's CA, signed by the `release` key.
fn spec(image: &str, pull_secret: &str) -> ProviderConfigSpec {
    serde_json::from_value(serde_json::json!({
        "component": {
            "image": image,
            "registry": {
                "pullSecret": pull_secret,
                "caConfigMapRef": {"name": "registry-ca", "key": "ca.crt"},
            },
            "signedBy": [{"configMapRef": {"name": "signers", "key": "release.pub"}}],
        },
        "config": {},
        // The reference imports wasi:http; its `get` makes no request.
        "grant": {"http": {"origins": ["http://pve.example:8006"]}},
        "orphanSweep": {"mode": "Off"},
    }))
    .unwrap()
}

/// `(status, reason)` of condition `kind`.
fn state_of(outcome: &ProviderConfigOutcome, kind: &str) -> (String, String) {
    condition(&outcome.status.conditions, kind)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

fn digest_of(pinned: &str) -> String {
    pinned.rsplit_once('@').unwrap().1.to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_bad_image_is_a_condition_with_its_reason_and_the_last_good_one_keeps_serving() {
    let registry = Registry::start();
    let keys = Keys::new();
    let release = keys.private("release");
    let mut harness = Harness::start(&registry, &keys).await;

    let good = push(
        &registry,
        "reference",
        "providers/reference:1",
        Some(&release),
    );
    let outcome = harness.reconcile(&spec(&good, "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::READY).0,
        "True",
        "{outcome:?}"
    );
    let loaded = outcome.status.loaded.clone().unwrap();
    assert_eq!(loaded.image.as_deref(), Some(good.as_str()));
    assert_eq!(harness.serving_digest(), loaded.digest);
    let serving = harness.serving_digest();
    // Reconciled again unchanged: nothing is read or compiled again, nothing rebinds.
    let again = harness.reconcile(&spec(&good, "regcred")).await;
    assert!(!again.rebound, "{again:?}");
    assert_eq!(again.status.loaded.as_ref(), Some(&loaded));

    // Each case: a spec naming a bad image, and the reason it must be refused with.
    let not_wasm = registry.push_not_wasm("images/busybox:1").await;
    let tampered = {
        let pinned = push(
            &registry,
            "reference",
            "providers/reference:2",
            Some(&release),
        );
        let layer = format!(
            "sha256:{}",
            sha256_hex(&std::fs::read(component("reference")).unwrap())
        );
        // The layer is shared by every push of these bytes: tamper after the others are cached.
        (pinned, layer)
    };
    let down = {
        let pinned = push(
            &registry,
            "reference",
            "providers/reference:3",
            Some(&release),
        );
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        pinned.replacen(&registry.host, &format!("127.0.0.1:{port}"), 1)
    };
    let cases = [
        (
            spec(
                &push(
                    &registry,
                    "reference",
                    "providers/reference:4",
                    Some(&release),
                ),
                "wrongcred",
            ),
            "RegistryUnauthorized",
            "user publisher",
        ),
        (spec(&down, "regcred"), "RegistryUnavailable", "127.0.0.1"),
        (
            {
                let pinned = push(
                    &registry,
                    "reference",
                    "providers/reference:7",
                    Some(&release),
                );
                let mut without_ca = spec(&pinned, "regcred");
                without_ca
                    .component
                    .registry
                    .as_mut()
                    .unwrap()
                    .ca_config_map_ref = None;
                without_ca
            },
            "RegistryUnavailable",
            "certificate",
        ),
        (
            spec(&not_wasm, "regcred"),
            "NotAWasmComponent",
            "application/vnd.oci.image.layer.v1.tar+gzip",
        ),
        (
            spec(
                &push(&registry, "proxmox", "providers/proxmox:1", Some(&release)),
                "regcred",
            ),
            "ComponentTooLarge",
            &format!("over the cap of {CAP} bytes"),
        ),
        (
            spec(
                &push(&registry, "reference", "providers/reference:5", None),
                "regcred",
            ),
            "Unsigned",
            ".sig",
        ),
        (
            spec(
                &push(
                    &registry,
                    "reference",
                    "providers/reference:6",
                    Some(&keys.private("stranger")),
                ),
                "regcred",
            ),
            "UntrustedSignature",
            "signers/release.pub",
        ),
        (
            {
                let mut unsigned_allowed = spec(&good, "regcred");
                unsigned_allowed.component.signed_by.clear();
                unsigned_allowed
            },
            "Unsigned",
            "--allow-unsigned-images",
        ),
    ];
    for (bad, reason, names) in &cases {
        let outcome = harness.reconcile(bad).await;
        let (status, found) = state_of(&outcome, conditions::DEGRADED);
        assert_eq!(
            (status.as_str(), found.as_str()),
            ("True", *reason),
            "{outcome:?}"
        );
        let message = condition(&outcome.status.conditions, conditions::DEGRADED)
            .unwrap()
            .message
            .clone();
        assert!(message.contains(names), "{reason}: {message}");
        assert!(
            !message.contains(oci_support::PASSWORD),
            "{reason}: {message}"
        );
        assert_eq!(
            harness.serving_digest(),
            serving,
            "{reason}: the last good one serves"
        );
        assert_eq!(
            outcome.status.loaded.as_ref().unwrap().image.as_deref(),
            Some(good.as_str()),
            "{reason}"
        );
        harness
            .call()
            .await
            .unwrap_or_else(|e| panic!("{reason}: {e}"));
    }

    // A layer the registry serves altered (same bytes for every push of reference.wasm: tampered
    // only now, after the good one is loaded).
    let (pinned, layer) = tampered;
    let mut altered = std::fs::read(registry.blob_file(&layer)).unwrap();
    *altered.last_mut().unwrap() ^= 0xff;
    std::fs::write(registry.blob_file(&layer), &altered).unwrap();
    let outcome = harness.reconcile(&spec(&pinned, "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::DEGRADED),
        ("True".into(), "DigestMismatch".into()),
        "{outcome:?}"
    );
    assert_eq!(harness.serving_digest(), serving);
    harness.call().await.unwrap();

    // Every fetch is counted by where it came from and how it ended.
    let metrics = &harness.operator.metrics;
    assert_eq!(metrics.image_loads(PC, "registry", "ok"), 1);
    assert_eq!(metrics.image_loads(PC, "loaded", "ok"), 1);
    assert_eq!(
        metrics.image_loads(PC, "registry", "RegistryUnauthorized"),
        1
    );
    assert_eq!(metrics.image_loads(PC, "registry", "Unsigned"), 1);
    assert_eq!(metrics.image_loads(PC, "loaded", "Unsigned"), 1);

    // The good spec again: not Degraded, served from what is loaded (not compiled again).
    let outcome = harness.reconcile(&spec(&good, "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::DEGRADED).0,
        "False",
        "{outcome:?}"
    );
    assert_eq!(outcome.status.loaded.unwrap().generation, loaded.generation);
}

/// In a cluster a tag alone is refused by the CRD's rule; the operator refuses it too, for a
/// ProviderConfig admitted before the rule (or by a server that does not check it), nothing
/// pulled.
#[tokio::test(flavor = "multi_thread")]
async fn where_tags_are_not_allowed_a_tag_alone_is_an_invalid_image() {
    let registry = Registry::start();
    let keys = Keys::new();
    let mut harness = Harness::start_with_tags(&registry, &keys, false).await;
    push(
        &registry,
        "reference",
        "providers/reference:stable",
        Some(&keys.private("release")),
    );
    let tag = registry.reference("providers/reference:stable");
    let outcome = harness.reconcile(&spec(&tag, "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::READY),
        ("False".into(), "InvalidImage".into()),
        "{outcome:?}"
    );
    assert!(outcome.status.loaded.is_none(), "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tag_is_resolved_once_and_a_tag_that_moved_is_reported_not_followed() {
    let registry = Registry::start();
    let keys = Keys::new();
    let release = keys.private("release");
    let mut harness = Harness::start(&registry, &keys).await;
    let first = push(
        &registry,
        "reference",
        "providers/reference:stable",
        Some(&release),
    );
    let tag = registry.reference("providers/reference:stable");

    let outcome = harness.reconcile(&spec(&tag, "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::READY).0,
        "True",
        "{outcome:?}"
    );
    let recorded = outcome.status.loaded.clone().unwrap().image.unwrap();
    assert_eq!(recorded, first, "the digest the tag named is recorded");
    let serving = harness.serving_digest();

    let moved = push(
        &registry,
        "reference",
        "providers/reference:stable",
        Some(&release),
    );
    assert_ne!(moved, first);
    let outcome = harness.reconcile(&spec(&tag, "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::DEGRADED),
        ("True".into(), "TagMoved".into()),
        "{outcome:?}"
    );
    let message = &condition(&outcome.status.conditions, conditions::DEGRADED)
        .unwrap()
        .message;
    assert!(message.contains(&digest_of(&moved)), "{message}");
    assert_eq!(harness.serving_digest(), serving);
    assert_eq!(
        outcome.status.loaded.unwrap().image.as_deref(),
        Some(first.as_str())
    );

    // Pinning the new digest moves it.
    let outcome = harness.reconcile(&spec(&moved, "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::DEGRADED).0,
        "False",
        "{outcome:?}"
    );
    assert_eq!(
        outcome.status.loaded.unwrap().image.as_deref(),
        Some(moved.as_str())
    );
}

/// The hot-swap test's shape (the runtime's `swaps_under_concurrent_calls_fail_no_call`), with
/// the swap made by changing the digest in the spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_digest_change_in_the_spec_swaps_the_provider_with_no_failed_call() {
    let registry = Registry::start();
    let keys = Keys::new();
    let release = keys.private("release");
    let mut harness = Harness::start(&registry, &keys).await;
    let images: Vec<String> = (1..=3)
        .map(|round| {
            push(
                &registry,
                "reference",
                &format!("providers/reference:{round}"),
                Some(&release),
            )
        })
        .collect();
    let outcome = harness.reconcile(&spec(&images[0], "regcred")).await;
    assert_eq!(
        state_of(&outcome, conditions::READY).0,
        "True",
        "{outcome:?}"
    );
    let first = harness.operator.providers.binding(PC).unwrap();

    let harness = Arc::new(tokio::sync::Mutex::new(harness));
    let operator = Arc::clone(&harness.lock().await.operator);
    let stop = Arc::new(AtomicBool::new(false));
    let succeeded = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let (operator, stop, succeeded) =
                (Arc::clone(&operator), stop.clone(), succeeded.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let result = match operator.providers.binding(PC) {
                        Ok(binding) => binding
                            .provider
                            .call(get(&binding.config, 0), &CallContext::default())
                            .await
                            .map_err(|e| e.to_string()),
                        Err(refused) => Err(refused.message),
                    };
                    match result {
                        Ok(Response::Get(_)) => _ = succeeded.fetch_add(1, Ordering::Relaxed),
                        other => failures.push(format!("{other:?}")),
                    }
                    tokio::task::yield_now().await;
                }
                failures
            })
        })
        .collect();
    // A slow call in flight on the first image across every swap.
    let slow = {
        let first = Arc::clone(&first);
        tokio::spawn(async move {
            first
                .provider
                .call(get("", 2000), &CallContext::default())
                .await
        })
    };

    for image in &images[1..] {
        let outcome = harness
            .lock()
            .await
            .reconcile(&spec(image, "regcred"))
            .await;
        assert_eq!(
            state_of(&outcome, conditions::DEGRADED).0,
            "False",
            "{outcome:?}"
        );
        assert_eq!(
            outcome.status.loaded.unwrap().image.as_deref(),
            Some(image.as_str())
        );
    }
    let slow_result = slow.await.unwrap();
    assert!(
        matches!(slow_result, Ok(Response::Get(_))),
        "the call in flight on the old image: {slow_result:?}"
    );
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        let failures = caller.await.unwrap();
        assert!(failures.is_empty(), "failed calls: {failures:?}");
    }
    assert!(succeeded.load(Ordering::Relaxed) > 0);
    let last = operator.providers.binding(PC).unwrap();
    assert!(last.provider.load_generation() > first.provider.load_generation());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_file_over_the_cap_is_refused_from_its_size() {
    let registry = Registry::start();
    let keys = Keys::new();
    let harness = Harness::start(&registry, &keys).await;
    let registry_of_files = harness.operator.registry().clone();
    let mut events = registry_of_files.subscribe();
    std::fs::copy(
        component("proxmox"),
        harness.components.path().join("proxmox.wasm"),
    )
    .unwrap();
    registry_of_files.reload_now().await.unwrap();
    let size = std::fs::metadata(component("proxmox")).unwrap().len();
    let rejected = loop {
        match tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("an event")
            .unwrap()
        {
            RegistryEvent::Rejected { error, .. } => break error,
            RegistryEvent::Loaded { identity, .. } => panic!("{identity} loaded over the cap"),
            RegistryEvent::Removed { .. } => {}
        }
    };
    assert!(
        rejected.contains(&format!("{size} bytes, over the {CAP}-byte cap")),
        "{rejected}"
    );
    assert!(registry_of_files.get("proxmox").is_none());
}

/// What `cosign verify --key` checks, checked with OpenSSL rather than our own code: the
/// signature manifest sits at `sha256-<hex>.sig` with cosign's media type and annotation, its
/// payload names the digest, and the signature is an ECDSA P-256 SHA-256 signature of the payload
/// under the public key.
#[tokio::test]
async fn the_signature_is_stored_as_cosign_stores_it() {
    let registry = Registry::start();
    let keys = Keys::new();
    let pinned = push(
        &registry,
        "reference",
        "providers/reference:1",
        Some(&keys.private("release")),
    );
    let digest = digest_of(&pinned);
    let tag = format!("{}.sig", digest.replacen(':', "-", 1));
    let manifest = registry.manifest("providers/reference", &tag).await;
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    let layer = &layers[0];
    assert_eq!(
        layer["mediaType"],
        "application/vnd.dev.cosign.simplesigning.v1+json"
    );
    let payload = registry
        .blob("providers/reference", layer["digest"].as_str().unwrap())
        .await;
    let claim: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(claim["critical"]["image"]["docker-manifest-digest"], digest);
    assert_eq!(
        claim["critical"]["type"],
        "cosign container image signature"
    );
    assert_eq!(
        claim["critical"]["identity"]["docker-reference"],
        format!("{}/providers/reference", registry.host)
    );
    let signature = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        layer["annotations"]["dev.cosignproject.cosign/signature"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let dir = keys.dir.path();
    std::fs::write(dir.join("payload"), &payload).unwrap();
    std::fs::write(dir.join("signature"), &signature).unwrap();
    let verified = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(dir.join("release.pub"))
        .arg("-signature")
        .arg(dir.join("signature"))
        .arg(dir.join("payload"))
        .output()
        .expect("openssl runs");
    assert!(
        verified.status.success()
            && String::from_utf8_lossy(&verified.stdout).contains("Verified OK"),
        "{}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
    let other = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(dir.join("stranger.pub"))
        .arg("-signature")
        .arg(dir.join("signature"))
        .arg(dir.join("payload"))
        .output()
        .unwrap();
    assert!(!other.status.success(), "another key does not verify it");
}

/// The stored status of the local-mode ProviderConfig `name`, once there is one.
fn config_status(local: &local_support::Local, name: &str) -> Option<ProviderConfigStatus> {
    let path = local.path(".egress-operator/state.db");
    let store = egress_operator::local::store::Store::open_read_only(&path).ok()?;
    store
        .config(name)
        .ok()
        .flatten()
        .map(|record| record.status)
}

/// Polls until `check` holds of the ProviderConfig's status, at most a minute.
fn wait_for_config(
    local: &local_support::Local,
    what: &str,
    check: impl Fn(&ProviderConfigStatus) -> bool,
) -> ProviderConfigStatus {
    let started = std::time::Instant::now();
    loop {
        let status = config_status(local, "proxmox-lab");
        if let Some(status) = status.as_ref().filter(|status| check(status)) {
            return status.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}: {status:#?}\n{}",
            local.log()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The ProviderConfig of `local_support` with its component by `image`, pulled with a
/// dockerconfigjson Secret and the registry's CA, signed by the `release` key.
fn provider_config_by_image(local: &local_support::Local, image: &str) {
    let by_file = local_support::provider_config(&local.sim, "Delete");
    let by_image = by_file.replace(
        "  component: {file: proxmox.wasm}\n",
        &format!(
            "  component:\n    image: {image}\n    registry:\n      pullSecret: regcred\n      caConfigMapRef: {{name: registry-ca, key: ca.crt}}\n    signedBy:\n      - configMapRef: {{name: signers, key: release.pub}}\n"
        ),
    );
    assert_ne!(by_image, by_file);
    local.write("providerconfig.yaml", &by_image);
}

/// The Secret and ConfigMaps [`provider_config_by_image`] names, as manifests.
fn registry_objects(local: &local_support::Local, registry: &Registry, keys: &Keys) {
    let indent =
        |text: &str| -> String { text.lines().map(|line| format!("    {line}\n")).collect() };
    let docker_config = std::fs::read_to_string(&registry.auth_file).unwrap();
    local.write(
        "registry.yaml",
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: regcred}}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{docker_config}'\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: registry-ca}}\ndata:\n  ca.crt: |\n{}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: signers}}\ndata:\n  release.pub: |\n{}",
            indent(&std::fs::read_to_string(&registry.ca_file).unwrap()),
            indent(&keys.release_public),
        ),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_image_serves_three_proxies_and_serves_from_the_cache_with_the_registry_down() {
    let registry = Registry::start();
    let keys = Keys::new();
    let release = keys.private("release");
    let pinned = push(
        &registry,
        "proxmox",
        "providers/proxmox:1.0",
        Some(&release),
    );
    // Pushed now, never pulled: with the registry down it cannot be fetched.
    let uncached = push(
        &registry,
        "proxmox",
        "providers/proxmox:1.1",
        Some(&release),
    );

    let mut local = local_support::Local::new().await;
    // Only the image can serve.
    local.remove("components/proxmox.wasm");
    registry_objects(&local, &registry, &keys);
    provider_config_by_image(&local, &pinned);
    for name in ["web", "api", "mail"] {
        local.write(
            &format!("proxy-{name}.yaml"),
            &local_support::proxy("default", name),
        );
    }
    local.start();
    local.wait_until(
        "three Proxies running",
        Duration::from_secs(90),
        |proxies| proxies.len() == 3 && proxies.iter().all(local_support::running),
    );
    let status = wait_for_config(&local, "the image loaded", |status| status.loaded.is_some());
    assert_eq!(
        status.loaded.unwrap().image.as_deref(),
        Some(pinned.as_str())
    );
    let vms = local.vms();
    assert_eq!(vms.len(), 3);

    // The registry goes away; the operator restarts.
    drop(registry);
    local.stop_with(libc::SIGTERM).expect("the operator stops");
    local.start();
    local.write(
        "proxy-extra.yaml",
        &local_support::proxy("default", "extra"),
    );
    local.wait_until("four Proxies running", Duration::from_secs(90), |proxies| {
        proxies.len() == 4 && proxies.iter().all(local_support::running)
    });
    let status = wait_for_config(&local, "Ready from the cache", |status| {
        condition(&status.conditions, conditions::READY).is_some_and(|c| c.status == "True")
    });
    assert_eq!(
        status.loaded.unwrap().image.as_deref(),
        Some(pinned.as_str())
    );

    // A new digest cannot be fetched: a condition, the cached one serves, no VM touched.
    let vms = local.vms();
    provider_config_by_image(&local, &uncached);
    let status = wait_for_config(&local, "RegistryUnavailable", |status| {
        condition(&status.conditions, conditions::DEGRADED)
            .is_some_and(|c| c.reason == "RegistryUnavailable")
    });
    assert_eq!(
        status.loaded.unwrap().image.as_deref(),
        Some(pinned.as_str())
    );
    assert_eq!(local.vms(), vms);
    assert!(local.proxies().iter().all(local_support::running));
}

/// Plain HTTP is spoken to an image's registry only when its ProviderConfig says so.
#[tokio::test(flavor = "multi_thread")]
async fn plain_http_is_spoken_to_a_registry_only_when_the_provider_config_says_so() {
    let registry = Registry::start_plain_http();
    let keys = Keys::new();
    let reference = registry.reference("providers/reference:1");
    let file = component("reference");
    let output = oci_support::run(&[
        "provider",
        "push",
        path_str(&file),
        &reference,
        "--auth-file",
        path_str(&registry.auth_file),
        "--plain-http",
        "--sign",
        path_str(&keys.private("release")),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let pinned = stdout(&output).trim().to_owned();
    let mut harness = Harness::start(&registry, &keys).await;

    let mut over_tls = spec(&pinned, "regcred");
    over_tls
        .component
        .registry
        .as_mut()
        .unwrap()
        .ca_config_map_ref = None;
    let outcome = harness.reconcile(&over_tls).await;
    assert_eq!(
        state_of(&outcome, conditions::READY),
        ("False".into(), "RegistryUnavailable".into()),
        "{outcome:?}"
    );
    let mut plain = over_tls.clone();
    plain.component.registry.as_mut().unwrap().plain_http = true;
    let outcome = harness.reconcile(&plain).await;
    assert_eq!(
        state_of(&outcome, conditions::READY).0,
        "True",
        "{outcome:?}"
    );
    harness.call().await.unwrap();
}
