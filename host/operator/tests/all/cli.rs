//! The `egress-operator` binary, run as a user runs it, against the real built components.

use std::path::PathBuf;
use std::process::{Command, Output};

use testkit::component;

fn run(args: &[&str]) -> Output {
    // A private compile cache per run keeps tests independent of the user's cache.
    let cache = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(args)
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn inspect_lists_every_contract_operation() {
    let reference = component("reference");
    let output = run(&["provider", "inspect", reference.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("name:             reference"), "{text}");
    assert!(text.contains("contract version: 0.1.0"), "{text}");
    for operation in [
        "create",
        "get",
        "delete",
        "list-by-tag",
        "check",
        "describe",
        "validate-config",
    ] {
        assert!(
            text.lines()
                .any(|line| line.trim() == format!("egress:provider/provider@0.1.0#{operation}")),
            "{operation} missing from:\n{text}"
        );
    }
    assert!(
        !text.contains("#create-request"),
        "types are listed as exports:\n{text}"
    );
    assert!(
        text.contains("wasi:http/outgoing-handler@0.2.12"),
        "imports not listed:\n{text}"
    );
    assert!(text.contains("capabilities:     http"), "{text}");
}

#[test]
fn inspect_reads_the_contract_version_and_capabilities_from_the_component() {
    // contract-v2 exports egress:provider@0.2.0, imports wasi:http, and declares nothing.
    let v2 = component("contract-v2");
    let output = run(&["provider", "inspect", v2.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("contract version: 0.2.0"), "{text}");
    assert!(text.contains("capabilities:     http\n"), "{text}");
    assert!(
        text.contains("egress:provider/provider@0.2.0#create"),
        "{text}"
    );
}

/// The libvirt provider: contract 0.2.0, the libvirt capability read from its imports, and
/// neither a filesystem nor a socket among them (#9).
#[test]
fn inspect_shows_the_libvirt_provider_and_its_imports_hold_no_filesystem_or_socket() {
    let libvirt = component("libvirt");
    let output = run(&["provider", "inspect", "--json", libvirt.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["contractVersion"], "0.2.0");
    assert_eq!(report["capabilities"], serde_json::json!(["libvirt"]));
    let imports: Vec<&str> = report["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|import| import.as_str().unwrap())
        .collect();
    assert!(
        imports.contains(&"egress:libvirt/libvirt@0.1.0"),
        "{imports:?}"
    );
    for refused in ["wasi:filesystem/", "wasi:sockets/", "wasi:http/"] {
        assert!(
            !imports.iter().any(|import| import.starts_with(refused)),
            "{refused} in {imports:?}"
        );
    }
}

/// `provider call` reads the libvirt grant from the same grants file as the HTTP grants: with
/// it, check reaches libvirt's test driver; without it, the connection is denied.
#[test]
fn call_gives_the_provider_the_libvirt_grant_of_the_grants_file() {
    let libvirt = component("libvirt");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "connections": ["node"],
            "pool": "default-pool",
            "network": "default",
            "image": { "url": "https://images.invalid/b.raw", "sha256": "a".repeat(64), "format": "raw" },
            "domainType": "test",
        })
        .to_string(),
    )
    .unwrap();
    let grants = dir.path().join("grants.yaml");
    std::fs::write(
        &grants,
        "grants:\n  proxmox:\n    http:\n      origins: [\"http://127.0.0.1:8006\"]\n  libvirt:\n    libvirt:\n      connections:\n        - { name: node, uri: \"test:///default\", pools: [default-pool], networks: [default], undefineFlags: [managedSave] }\n",
    )
    .unwrap();
    let check = |grants: Option<&std::path::Path>| {
        let mut args = vec![
            "provider",
            "call",
            libvirt.to_str().unwrap(),
            "check",
            "--config",
            config.to_str().unwrap(),
        ];
        if let Some(grants) = grants {
            args.extend(["--grants", grants.to_str().unwrap()]);
        }
        let output = run(&args);
        assert!(output.status.success(), "{}", stderr(&output));
        serde_json::from_str::<serde_json::Value>(&stdout(&output)).unwrap()
    };
    let granted = check(Some(&grants));
    assert_eq!(granted["result"]["reason"], "ok", "{granted}");
    let ungranted = check(None);
    assert_eq!(ungranted["result"]["reason"], "forbidden", "{ungranted}");
}

#[test]
fn inspect_json_is_machine_readable() {
    let reference = component("reference");
    let output = run(&["provider", "inspect", "--json", reference.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["name"], "reference");
    assert_eq!(report["contractVersion"], "0.1.0");
    assert!(
        report["exports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "egress:provider/provider@0.1.0#list-by-tag")
    );
}

#[test]
fn inspect_of_a_text_file_is_one_line_and_exit_2() {
    let readme = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let output = run(&["provider", "inspect", readme.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains("not a wasm component"), "{err}");
    assert!(err.contains("README.md"), "the file is not named: {err}");
}

#[test]
fn inspect_names_an_unsupported_contract_version() {
    let future = component("future-contract");
    let output = run(&["provider", "inspect", future.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("0.9.0"), "{}", stderr(&output));
}

#[test]
fn call_create_prints_the_instance() {
    let reference = component("reference");
    let output = run(&[
        "provider",
        "call",
        reference.to_str().unwrap(),
        "create",
        "--input",
        r#"{"name":"proxy-a","uid":"uid-1"}"#,
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let response: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(response["operation"], "create");
    assert_eq!(response["result"]["providerId"], "ref/proxy-a");
    assert_eq!(response["result"]["uid"], "uid-1");
    assert_eq!(response["result"]["state"], "running");
}

#[test]
fn call_with_a_classified_error_prints_it_and_exits_1() {
    let reference = component("reference");
    let output = run(&[
        "provider",
        "call",
        reference.to_str().unwrap(),
        "get",
        "--input",
        r#"{"providerId":"ref/missing-a"}"#,
    ]);
    assert_eq!(output.status.code(), Some(1));
    let response: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(response["error"]["class"], "not-found");
    // The class is said once, in its field: the message is the provider's own.
    let message = response["error"]["message"].as_str().unwrap();
    assert!(!message.is_empty());
    assert!(
        !message.contains("not-found") && !message.contains("provider error"),
        "{message}"
    );
}

#[test]
fn call_passes_the_config_file_to_the_provider() {
    let reference = component("reference");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"failWith":"quota-exceeded"}"#).unwrap();
    let output = run(&[
        "provider",
        "call",
        reference.to_str().unwrap(),
        "get",
        "--config",
        config.to_str().unwrap(),
        "--input",
        r#"{"providerId":"ref/a"}"#,
    ]);
    assert_eq!(output.status.code(), Some(1));
    let response: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(response["error"]["class"], "quota-exceeded");
}

#[test]
fn bad_input_is_refused_before_loading() {
    let reference = component("reference");
    for (operation, input, expected) in [
        ("get", None, "get needs --input"),
        ("get", Some(r#"{"id":"x"}"#), "--input for get"),
        ("frobnicate", None, "frobnicate"),
    ] {
        let mut args = vec!["provider", "call", reference.to_str().unwrap(), operation];
        if let Some(input) = input {
            args.extend(["--input", input]);
        }
        let output = run(&args);
        assert_eq!(output.status.code(), Some(2), "{operation} {input:?}");
        let err = stderr(&output);
        assert!(err.contains(expected), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    }
}

#[test]
fn a_config_that_is_not_json_is_named() {
    let reference = component("reference");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, "endpoint: [").unwrap();
    let output = run(&[
        "provider",
        "call",
        reference.to_str().unwrap(),
        "check",
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("is not valid JSON"),
        "{}",
        stderr(&output)
    );
}

/// Check reasons print as the WIT, the errors and every doc spell them: kebab-case
/// (`credentials-unavailable`, never `credentialsUnavailable`).
#[test]
fn a_check_reason_prints_in_kebab_case() {
    let reference = component("reference");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"endpoint":"https://127.0.0.1:9"}"#).unwrap();
    // The grant's secret file does not exist: the broker answers `credentials-unavailable`
    // before it connects anywhere.
    let grants = dir.path().join("grants.yaml");
    let missing = dir.path().join("no-such-token");
    // Any PEM will do for a CA that is never used: nothing is reached.
    let ca = dir.path().join("ca.pem");
    std::fs::write(
        &ca,
        rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem(),
    )
    .unwrap();
    std::fs::write(
        &grants,
        format!(
            "grants:\n  reference:\n    http:\n      origins: [\"https://127.0.0.1:9\"]\n      \
             credential:\n        header: Authorization\n        format: \"Bearer {{secret}}\"\n        \
             secretFile: {}\n      tls:\n        caFile: {}\n",
            missing.display(),
            ca.display()
        ),
    )
    .unwrap();
    let output = run(&[
        "provider",
        "call",
        reference.to_str().unwrap(),
        "check",
        "--config",
        config.to_str().unwrap(),
        "--grants",
        grants.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let response: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(response["operation"], "check");
    assert_eq!(
        response["result"]["reason"], "credentials-unavailable",
        "{response}"
    );
}

/// `provider call` shows the provider's own log lines (info and up) on stderr without `RUST_LOG`,
/// and stderr that is not a terminal carries no ANSI colour codes.
#[test]
fn provider_log_lines_show_by_default_without_colour_off_a_terminal() {
    let reference = component("reference");
    let cache = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["provider", "call", reference.to_str().unwrap(), "create"])
        .args(["--input", r#"{"name":"proxy-log","uid":"uid-log"}"#])
        .env("XDG_CACHE_HOME", cache.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("the binary runs");
    assert!(output.status.success(), "{}", stderr(&output));
    let err = stderr(&output);
    // The reference provider logs `created` with the name at info.
    assert!(
        err.contains("created") && err.contains("proxy-log"),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "ANSI escape in {err:?}");
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    // `inspect … | head -1`: the pipe closes after one line; no panic message on stderr.
    let reference = component("reference");
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["provider", "inspect", reference.to_str().unwrap()])
        .env("XDG_CACHE_HOME", cache.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // Close our end of stdout before the command writes: every write hits a closed pipe.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let text = stderr(&output);
    assert!(!text.contains("panicked"), "{text}");
}

/// SSH keys from Secrets are written only to a memory-backed folder: `--key-dir` on a disk is
/// refused at start, naming it, before anything runs.
#[test]
fn run_refuses_a_key_dir_that_is_not_memory_backed() {
    let folder = tempfile::tempdir().unwrap();
    let on_disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = run(&[
        "run",
        "--local",
        folder.path().to_str().unwrap(),
        "--key-dir",
        on_disk.path().to_str().unwrap(),
        "--exit-when-settled",
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let error = stderr(&output);
    assert!(
        error.contains("--key-dir") && error.contains("memory-backed"),
        "{error}"
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn commands_that_compile_cache_where_cache_dir_says_and_none_writes_nothing() {
    let reference = component("reference");
    let reference = reference.to_str().unwrap();
    let home = tempfile::tempdir().unwrap();
    let chosen = tempfile::tempdir().unwrap();
    let run_in_home = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_egress-operator"))
            .args(args)
            .env("XDG_CACHE_HOME", home.path())
            // A `none` taken for a folder would land here.
            .current_dir(home.path())
            .output()
            .expect("the binary runs")
    };
    let chosen_dir = chosen.path().to_str().unwrap();
    for args in [
        vec!["provider", "inspect", reference, "--cache-dir", chosen_dir],
        vec![
            "provider",
            "call",
            reference,
            "describe",
            "--cache-dir",
            chosen_dir,
        ],
    ] {
        let output = run_in_home(&args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    }
    assert!(
        !files_under(chosen.path()).is_empty(),
        "nothing cached in --cache-dir"
    );
    assert!(
        files_under(home.path()).is_empty(),
        "the default cache was written"
    );

    let output = run_in_home(&["provider", "inspect", reference, "--cache-dir", "none"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        files_under(home.path()).is_empty(),
        "--cache-dir none wrote a cache"
    );
    // Without the flag: the documented default, under $XDG_CACHE_HOME.
    let output = run_in_home(&["provider", "inspect", reference]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        files_under(&home.path().join("egress-operator"))
            .iter()
            .any(|file| file.is_file()),
        "the default cache is $XDG_CACHE_HOME/egress-operator"
    );
}
