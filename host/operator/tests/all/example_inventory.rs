//! The example provider (`components/example-inventory`, built on `egress-guest`) against its toy
//! backend (`testdata/inventory/inventory.py`, a real HTTP server on loopback), through the real
//! runtime and egress broker: the broker adds the backend's bearer token, the provider never sees
//! it. This is what a third party's first provider should pass: the contract's lifecycle,
//! idempotent create and adoption, the ownership mark, malformed IDs, check reasons, and `check`
//! answering `unreachable` against a hung endpoint under the default limits.
//!
//! Needs `target/components/example-inventory.wasm` (`just build-components`) and `python3`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use egress_capability_set::{Capabilities, GrantsFile};
use egress_runtime::types::{CheckReason, CreateRequest, Request, Response, Tag};
use egress_runtime::{CallContext, CallError, ErrorClass, Provider, Runtime, VmState};
use egress_runtime::{Limits, RuntimeConfig};
use serde_json::json;

pub(crate) const TOKEN: &str = "inventory-token-5f1e2d3c";
const UID: &str = "0b7c2f3e-1111-4a53-9c7b-3f1b8f0a0001";

pub(crate) fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The toy inventory over HTTPS (the broker injects a credential only over TLS), killed on drop.
pub(crate) struct Inventory {
    child: Child,
    pub(crate) url: String,
    _files: tempfile::TempDir,
    pub(crate) token_file: PathBuf,
    pub(crate) ca_file: PathBuf,
}

impl Drop for Inventory {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Inventory {
    pub(crate) fn start(extra: &[&str]) -> Inventory {
        let files = tempfile::tempdir().unwrap();
        let token_file = files.path().join("token");
        std::fs::write(&token_file, TOKEN).unwrap();
        // A CA made for this run, and the inventory's certificate for 127.0.0.1 signed by it.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        let (ca_file, cert_file, key_file) = (
            files.path().join("ca.pem"),
            files.path().join("cert.pem"),
            files.path().join("key.pem"),
        );
        std::fs::write(&ca_file, ca.pem()).unwrap();
        std::fs::write(&cert_file, leaf.pem()).unwrap();
        std::fs::write(&key_file, leaf_key.serialize_pem()).unwrap();
        let mut child = Command::new("python3")
            .arg(repository().join("testdata/inventory/inventory.py"))
            .args(["--token-file", token_file.to_str().unwrap()])
            .args(["--tls-cert", cert_file.to_str().unwrap()])
            .args(["--tls-key", key_file.to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the toy inventory");
        // Its first line is `url: http://127.0.0.1:PORT`, printed once it listens.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("url: ")
            .expect("url line")
            .to_string();
        Inventory {
            child,
            url,
            _files: files,
            token_file,
            ca_file,
        }
    }

    pub(crate) fn config(&self) -> String {
        json!({ "url": self.url }).to_string()
    }

    /// The provider loaded in a runtime with `limits`, granted the inventory with `token_file`.
    async fn provider(&self, limits: Limits, token_file: &std::path::Path) -> Arc<Provider> {
        let capabilities = Capabilities::new();
        GrantsFile::parse(
            &json!({"grants": {"example-inventory": {"http": {
                "origins": [self.url],
                "credential": {"header": "Authorization", "format": "Bearer {secret}", "secretFile": token_file},
                "tls": {"caFile": self.ca_file},
            }}}})
            .to_string(),
        )
        .unwrap()
        .grant(&capabilities)
        .unwrap();
        let runtime =
            Runtime::new(capabilities.serve(RuntimeConfig::default().limits(limits))).unwrap();
        let path = repository().join("target/components/example-inventory.wasm");
        assert!(
            path.exists(),
            "{} is missing: run `just build-components`",
            path.display()
        );
        runtime
            .load_file(&path)
            .await
            .expect("loads under the given limits")
    }
}

async fn call(provider: &Provider, request: Request) -> Result<Response, CallError> {
    let outcome = provider.call(request, &CallContext::default()).await;
    assert!(
        !format!("{outcome:?}").contains(TOKEN),
        "the token leaked: {outcome:?}"
    );
    outcome
}

fn create_request(inventory: &Inventory, name: &str, uid: &str) -> Request {
    Request::Create {
        request: CreateRequest {
            name: name.into(),
            uid: uid.into(),
            tags: vec![Tag {
                key: "team".into(),
                value: "web".into(),
            }],
            user_data: "#cloud-config\n".into(),
            config: inventory.config(),
            placement: None,
        },
    }
}

fn get(inventory: &Inventory, provider_id: &str) -> Request {
    Request::Get {
        config: inventory.config(),
        provider_id: provider_id.into(),
    }
}

fn delete(inventory: &Inventory, provider_id: &str) -> Request {
    Request::Delete {
        config: inventory.config(),
        provider_id: provider_id.into(),
    }
}

fn class(outcome: &Result<Response, CallError>) -> Option<ErrorClass> {
    outcome.as_ref().err().map(CallError::class)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lifecycle_runs_through_the_broker_with_the_mark() {
    let inventory = Inventory::start(&[]);
    let provider = inventory
        .provider(Limits::default(), &inventory.token_file)
        .await;

    let Ok(Response::Create(created)) =
        call(&provider, create_request(&inventory, "proxy-a", UID)).await
    else {
        panic!("create failed");
    };
    assert_eq!(
        (created.name.as_str(), created.uid.as_str()),
        ("proxy-a", UID)
    );
    // The provider wrote `created-at` into the mark, RFC 3339 UTC.
    let created_at = created.created_at.clone().expect("created-at");
    assert!(
        created_at.ends_with('Z') && created_at.len() == 20,
        "{created_at}"
    );

    // The toy VM runs from its second read on, with an address.
    let mut running = None;
    for _ in 0..10 {
        if let Ok(Response::Get(vm)) = call(&provider, get(&inventory, &created.provider_id)).await
            && vm.state == VmState::Running
        {
            running = Some(vm);
            break;
        }
    }
    let running = running.expect("the VM runs within ten reads");
    assert_eq!(running.addresses.len(), 1);
    assert_eq!(running.created_at.as_deref(), Some(created_at.as_str()));

    let listed = call(
        &provider,
        Request::ListByTag {
            config: inventory.config(),
            key: "team".into(),
            value: "web".into(),
        },
    )
    .await;
    assert!(
        matches!(&listed, Ok(Response::ListByTag(listing)) if listing.vms.len() == 1 && listing.vms[0].provider_id == created.provider_id),
        "{listed:?}"
    );

    assert!(
        call(&provider, delete(&inventory, &created.provider_id))
            .await
            .is_ok()
    );
    let gone = call(&provider, get(&inventory, &created.provider_id)).await;
    assert_eq!(class(&gone), Some(ErrorClass::NotFound), "{gone:?}");
    assert!(
        call(&provider, delete(&inventory, &created.provider_id))
            .await
            .is_ok(),
        "delete again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn create_adopts_its_own_vm_and_refuses_another_uid() {
    let inventory = Inventory::start(&[]);
    let provider = inventory
        .provider(Limits::default(), &inventory.token_file)
        .await;
    let first = call(&provider, create_request(&inventory, "proxy-b", UID)).await;
    let again = call(&provider, create_request(&inventory, "proxy-b", UID)).await;
    match (&first, &again) {
        (Ok(Response::Create(a)), Ok(Response::Create(b))) => {
            assert_eq!(a.provider_id, b.provider_id)
        }
        other => panic!("{other:?}"),
    }
    let other_uid = call(
        &provider,
        create_request(&inventory, "proxy-b", "another-uid"),
    )
    .await;
    assert_eq!(
        class(&other_uid),
        Some(ErrorClass::Permanent),
        "{other_uid:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_vm_is_never_ours_and_a_malformed_id_is_not_found_and_never_deleted() {
    // VM 1 exists without the operator's mark.
    let inventory = Inventory::start(&["--seed", "someone-elses"]);
    let provider = inventory
        .provider(Limits::default(), &inventory.token_file)
        .await;
    let foreign = call(&provider, get(&inventory, "inv/1")).await;
    assert_eq!(class(&foreign), Some(ErrorClass::NotFound), "{foreign:?}");
    let refused = call(&provider, delete(&inventory, "inv/1")).await;
    assert_eq!(class(&refused), Some(ErrorClass::Permanent), "{refused:?}");
    let adopted = call(&provider, create_request(&inventory, "someone-elses", UID)).await;
    assert_eq!(class(&adopted), Some(ErrorClass::Permanent), "{adopted:?}");
    for malformed in ["inv/", "inv/../1", "ref/1", "", "inv/+1"] {
        let outcome = call(&provider, get(&inventory, malformed)).await;
        assert_eq!(
            class(&outcome),
            Some(ErrorClass::NotFound),
            "{malformed:?}: {outcome:?}"
        );
        let outcome = call(&provider, delete(&inventory, malformed)).await;
        assert_eq!(
            class(&outcome),
            Some(ErrorClass::Permanent),
            "{malformed:?}: {outcome:?}"
        );
    }
    // Still there: nothing deleted it.
    let still = call(&provider, get(&inventory, "inv/1")).await;
    assert_eq!(class(&still), Some(ErrorClass::NotFound));
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_validate_and_check_answer_as_the_contract_says() {
    let inventory = Inventory::start(&[]);
    let provider = inventory
        .provider(Limits::default(), &inventory.token_file)
        .await;
    assert_eq!(provider.description().name, "example-inventory");
    for garbage in [
        "",
        "[]",
        r#"{"url":"ftp://x"}"#,
        r#"{"url":"http://a","extra":1}"#,
        "{}",
    ] {
        let outcome = call(
            &provider,
            Request::ValidateConfig {
                config: garbage.into(),
            },
        )
        .await;
        assert_eq!(
            class(&outcome),
            Some(ErrorClass::Permanent),
            "{garbage:?}: {outcome:?}"
        );
    }
    let good = call(
        &provider,
        Request::Check {
            config: inventory.config(),
        },
    )
    .await;
    assert!(
        matches!(&good, Ok(Response::Check(c)) if c.reason == CheckReason::Ok),
        "{good:?}"
    );

    // A wrong token on the host's side: the inventory says 401, the provider `unauthorized`.
    let files = tempfile::tempdir().unwrap();
    let wrong = files.path().join("wrong");
    std::fs::write(&wrong, "not-the-token").unwrap();
    let refused = inventory.provider(Limits::default(), &wrong).await;
    let outcome = call(
        &refused,
        Request::Check {
            config: inventory.config(),
        },
    )
    .await;
    assert!(
        matches!(&outcome, Ok(Response::Check(c)) if c.reason == CheckReason::Unauthorized),
        "{outcome:?}"
    );
}

/// A `check` against an endpoint that accepts the connection and never answers comes back as the
/// reason `unreachable`, not as a deadline error, under the default limits and grant timeouts:
/// the broker's first-byte timeout (20 s) ends before the call's 30 s deadline.
#[tokio::test(flavor = "multi_thread")]
async fn check_against_a_hung_endpoint_answers_unreachable_within_its_deadline() {
    let inventory = Inventory::start(&["--hang"]);
    let provider = inventory
        .provider(Limits::default(), &inventory.token_file)
        .await;
    let outcome = call(
        &provider,
        Request::Check {
            config: inventory.config(),
        },
    )
    .await;
    match outcome {
        Ok(Response::Check(result)) => {
            assert_eq!(result.reason, CheckReason::Unreachable, "{result:?}")
        }
        other => panic!("expected a check reason, got {other:?}"),
    }
}

/// `src` copied to `dst` as `cp -rL` copies it (links followed), but without build output.
pub(crate) fn copy_dereferenced(src: &std::path::Path, dst: &std::path::Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap().flatten() {
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        if entry.file_name() == "target" {
            continue;
        }
        // `metadata` follows links, as `-L` does.
        if std::fs::metadata(&from).unwrap().is_dir() {
            copy_dereferenced(&from, &to);
        } else {
            std::fs::copy(&from, &to).unwrap();
        }
    }
}

/// The authoring guide's §2 recipe, run from a folder outside this repository: copy the guest
/// library and the example, rename it, build it with plain cargo, and inspect what was built.
#[test]
fn the_guides_copy_recipe_builds_a_provider_outside_the_repository() {
    let guide = std::fs::read_to_string(repository().join("docs/providers/authoring.md")).unwrap();
    assert!(
        guide.contains(r#"cp -rL "$EGRESS/components/guest" guest"#)
            && guide.contains(r#"cp -rL "$EGRESS/components/example-inventory" my-provider"#),
        "the guide's recipe changed: change this test with it"
    );
    let folder = tempfile::tempdir().unwrap();
    copy_dereferenced(
        &repository().join("components/guest"),
        &folder.path().join("guest"),
    );
    let provider = folder.path().join("my-provider");
    copy_dereferenced(
        &repository().join("components/example-inventory"),
        &provider,
    );
    let manifest = provider.join("Cargo.toml");
    let renamed = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace(r#"name = "example-inventory""#, r#"name = "my-provider""#);
    std::fs::write(&manifest, renamed).unwrap();

    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("guide-recipe");
    let built = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(&provider)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    // `cp target/wasm32-wasip2/release/my_provider.wasm my-provider.wasm`: the file's stem is
    // the identity grants name, and `-` is allowed where `_` is not.
    let wasm = provider.join("my-provider.wasm");
    std::fs::copy(target.join("wasm32-wasip2/release/my_provider.wasm"), &wasm).unwrap();
    let inspected = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args([
            "provider",
            "inspect",
            wasm.to_str().unwrap(),
            "--cache-dir",
            "none",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&inspected.stdout);
    assert!(
        inspected.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&inspected.stderr)
    );
    assert!(text.contains("my-provider"), "{text}");
    assert!(text.contains("contract version: 0.1.0"), "{text}");
}
