//! The authoring guide's Python provider (§3: `components/example-inventory-python/app.py` on the
//! Python guest library `components/guest-python`), built as the guide builds it in a folder
//! outside this repository, and run through the `egress-operator` binary (the conformance suite
//! and `provider call`) against the toy inventory over TLS, the broker adding its token. Built
//! twice: with the broker's exchange call (the guide's world) and without it, where the library
//! falls back to `wasi:http` and must send `content-length` itself (the inventory reads the body
//! by it).
//!
//! Needs componentize-py in `target/py/venv` (`just build-components` installs it) and `python3`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::example_inventory::{Inventory, copy_dereferenced, repository};

const APP: &str = "components/example-inventory-python/app.py";
/// The identity: the component file's stem, as the guide names it.
const IDENTITY: &str = "py-inventory";

/// `app.py` is shown whole in the guide, and is the minimal provider it claims to be.
#[test]
fn the_guide_shows_the_example_whole() {
    let guide = std::fs::read_to_string(repository().join("docs/providers/authoring.md")).unwrap();
    let app = std::fs::read_to_string(repository().join(APP)).unwrap();
    let opening = format!("<!-- {APP} -->\n```python\n");
    let start = guide
        .find(&opening)
        .expect("the guide shows app.py after its marker")
        + opening.len();
    let length = guide[start..].find("```\n").expect("the block ends");
    assert_eq!(
        &guide[start..start + length],
        app,
        "the guide's copy of {APP} differs from the file"
    );
    assert!(
        app.lines().count() <= 100,
        "{APP} has {} lines",
        app.lines().count()
    );
}

/// Which world the component is built against.
enum World {
    /// The guide's: the guest library's `wit/`, the contract 0.1.0 plus the exchange call.
    WithExchange,
    /// The contract's own world alone, as for a host that predates the exchange call.
    ContractOnly,
}

/// A folder outside the repository with the guide's copies in it, and the component built there.
fn build(folder: &Path, world: World) -> PathBuf {
    let guide = std::fs::read_to_string(repository().join("docs/providers/authoring.md")).unwrap();
    for step in [
        r#"cp -r "$EGRESS/components/guest-python/egress_guest" egress_guest"#,
        r#"cp -rL "$EGRESS/components/guest-python/wit" guest-wit"#,
        r#"cp "$EGRESS/components/example-inventory-python/app.py" app.py"#,
        "componentize-py -d guest-wit -w provider componentize app -o py-inventory.wasm",
    ] {
        assert!(
            guide.contains(step),
            "the guide's recipe changed ({step}): change this test with it"
        );
    }
    let guest = repository().join("components/guest-python");
    copy_dereferenced(&guest.join("egress_guest"), &folder.join("egress_guest"));
    copy_dereferenced(&guest.join("wit"), &folder.join("guest-wit"));
    std::fs::copy(repository().join(APP), folder.join("app.py")).unwrap();
    let (wit, name) = match world {
        World::WithExchange => (folder.join("guest-wit"), "provider"),
        World::ContractOnly => {
            copy_dereferenced(
                &repository().join("wit/provider-v0.1.0"),
                &folder.join("contract-wit"),
            );
            (folder.join("contract-wit"), "provider-world")
        }
    };
    let componentize = repository().join("target/py/venv/bin/componentize-py");
    assert!(
        componentize.exists(),
        "{} is missing: run `just build-components`",
        componentize.display()
    );
    let wasm = folder.join(format!("{IDENTITY}.wasm"));
    let built = Command::new(componentize)
        .arg("-d")
        .arg(wit)
        .args(["-w", name, "componentize", "app", "-o"])
        .arg(&wasm)
        .current_dir(folder)
        .env_remove("VIRTUAL_ENV")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    wasm
}

/// The config and grants files for `inventory`, in `folder`: the broker adds `token_file`.
fn write_files(folder: &Path, inventory: &Inventory, token_file: &Path) -> (PathBuf, PathBuf) {
    let (config, grants) = (folder.join("config.json"), folder.join("grants.yaml"));
    std::fs::write(&config, inventory.config()).unwrap();
    let grant = json!({"grants": {IDENTITY: {"http": {
        "origins": [inventory.url],
        "credential": {"header": "Authorization", "format": "Bearer {secret}", "secretFile": token_file},
        "tls": {"caFile": inventory.ca_file},
    }}}});
    std::fs::write(&grants, grant.to_string()).unwrap(); // JSON is YAML
    (config, grants)
}

/// `egress-operator <args> --config … --grants …` with the compile cache in `folder`.
fn operator(folder: &Path, (config, grants): &(PathBuf, PathBuf), args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(args)
        .arg("--config")
        .arg(config)
        .arg("--grants")
        .arg(grants)
        .arg("--cache-dir")
        .arg(folder.join("cache"))
        .output()
        .unwrap()
}

/// `provider call`'s answer: `Ok(result)` or `Err(class)`.
fn call(
    folder: &Path,
    files: &(PathBuf, PathBuf),
    operation: &str,
    input: Value,
) -> Result<Value, String> {
    let wasm = folder.join(format!("{IDENTITY}.wasm"));
    let input = input.to_string();
    let args = [
        "provider",
        "call",
        wasm.to_str().unwrap(),
        operation,
        "--input",
        &input,
    ];
    let output = operator(folder, files, &args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !stdout.contains(crate::example_inventory::TOKEN),
        "the token leaked: {stdout}"
    );
    let answer: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|_| panic!("{stdout}{}", String::from_utf8_lossy(&output.stderr)));
    match answer.get("error") {
        Some(error) => Err(error["class"].as_str().unwrap().to_string()),
        None => Ok(answer.get("result").cloned().unwrap_or(Value::Null)),
    }
}

fn imports(folder: &Path, wasm: &Path) -> String {
    let inspected = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["provider", "inspect", wasm.to_str().unwrap(), "--cache-dir"])
        .arg(folder.join("cache"))
        .output()
        .unwrap();
    assert!(
        inspected.status.success(),
        "{}",
        String::from_utf8_lossy(&inspected.stderr)
    );
    String::from_utf8_lossy(&inspected.stdout).into_owned()
}

#[test]
fn the_guides_python_provider_passes_the_conformance_suite_and_the_lifecycle() {
    let folder = tempfile::tempdir().unwrap();
    let wasm = build(folder.path(), World::WithExchange);
    assert!(imports(folder.path(), &wasm).contains("egress:http-broker/exchange@0.2.0"));
    let inventory = Inventory::start(&[]);
    let files = write_files(folder.path(), &inventory, &inventory.token_file);

    let suite = operator(
        folder.path(),
        &files,
        &["conformance", wasm.to_str().unwrap()],
    );
    let report = String::from_utf8_lossy(&suite.stdout);
    assert!(
        report.contains(" rules: "),
        "{report}{}",
        String::from_utf8_lossy(&suite.stderr)
    );
    for rule in [
        "lifecycle.create-get-list-delete",
        "create.idempotent",
        "create.foreign-uid-permanent",
        "get.unknown-not-found",
        "check.reasons",
        "faults.server-error-transient",
        "errors.classified-no-secret",
        "egress.no-denials",
    ] {
        assert!(
            report.contains(&format!("pass  {rule}")),
            "{rule}: {report}"
        );
    }
    // Every other rule passes too, `create.starts-stopped` included: create starts a stopped VM
    // of its own (`POST /vms/<id>/start`), as the operator's restart of a stopped Proxy needs.
    assert!(report.contains("pass  create.starts-stopped"), "{report}");
    for line in report.lines() {
        assert!(
            !line.starts_with("fail") && !line.starts_with("skip"),
            "{line}\n{report}"
        );
    }
    assert!(suite.status.success(), "{report}");

    // The lifecycle by hand: what the suite checks, with the values.
    let create = json!({"name": "proxy-a", "uid": "uid-a", "tags": [{"key": "team", "value": "web"}], "userData": ""});
    let created = call(folder.path(), &files, "create", create.clone()).expect("create");
    let id = created["providerId"].as_str().unwrap().to_string();
    assert!(
        id.starts_with("inv/") && created["createdAt"].as_str().unwrap().ends_with('Z'),
        "{created}"
    );
    let adopted = call(folder.path(), &files, "create", create).expect("create adopts its VM");
    assert_eq!(
        (&adopted["providerId"], &adopted["createdAt"]),
        (&created["providerId"], &created["createdAt"])
    );
    let get = json!({"providerId": id});
    let _provisioning = call(folder.path(), &files, "get", get.clone()).expect("get");
    let running = call(folder.path(), &files, "get", get.clone()).expect("get");
    assert_eq!(
        (
            running["state"].as_str(),
            running["addresses"].as_array().map(Vec::len)
        ),
        (Some("running"), Some(1))
    );
    assert_eq!(running["createdAt"], created["createdAt"]);
    let listed = call(
        folder.path(),
        &files,
        "list-by-tag",
        json!({"key": "team", "value": "web"}),
    )
    .unwrap();
    let vms = listed["vms"].as_array().expect("a listing");
    assert_eq!(
        (vms.len(), &vms[0]["providerId"]),
        (1, &created["providerId"]),
        "{listed}"
    );
    assert_eq!(
        call(folder.path(), &files, "delete", get.clone()),
        Ok(Value::Null)
    );
    assert_eq!(
        call(folder.path(), &files, "get", get.clone()),
        Err("not-found".into()),
        "a 404 is not-found"
    );
    assert_eq!(
        call(folder.path(), &files, "delete", get),
        Ok(Value::Null),
        "gone is success"
    );
    assert_eq!(
        call(
            folder.path(),
            &files,
            "get",
            json!({"providerId": "inv/../1"})
        ),
        Err("not-found".into())
    );
    assert_eq!(
        call(
            folder.path(),
            &files,
            "delete",
            json!({"providerId": "inv/../1"})
        ),
        Err("permanent".into())
    );

    // A token the inventory refuses: 401 is `unauthorized`.
    let wrong = folder.path().join("wrong-token");
    std::fs::write(&wrong, "not-the-token").unwrap();
    let refused = write_files(folder.path(), &inventory, &wrong);
    let check = call(folder.path(), &refused, "check", json!({})).expect("check answers");
    assert_eq!(check["reason"], "unauthorized", "{check}");
}

#[test]
fn without_the_exchange_call_the_library_sends_through_wasi_http_with_its_length() {
    let folder = tempfile::tempdir().unwrap();
    let wasm = build(folder.path(), World::ContractOnly);
    assert!(
        !imports(folder.path(), &wasm).contains("egress:http-broker"),
        "built without the exchange call"
    );
    let inventory = Inventory::start(&[]);
    let files = write_files(folder.path(), &inventory, &inventory.token_file);
    // The inventory reads a POST's body by its content-length: without it the body is empty (400).
    let create = json!({"name": "proxy-b", "uid": "uid-b", "tags": [], "userData": ""});
    let created = call(folder.path(), &files, "create", create).expect("create over wasi:http");
    assert_eq!(created["name"], "proxy-b");
    let get = json!({"providerId": created["providerId"]});
    assert_eq!(
        call(folder.path(), &files, "delete", get.clone()),
        Ok(Value::Null)
    );
    assert_eq!(
        call(folder.path(), &files, "get", get),
        Err("not-found".into()),
        "a 404 is not-found"
    );
    let check = call(folder.path(), &files, "check", json!({})).expect("check answers");
    assert_eq!(check["reason"], "ok", "{check}");
}
