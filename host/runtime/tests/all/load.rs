//! Files that must not serve are rejected before serving, each with its own one-line message.

use std::path::Path;

use egress_runtime::LoadError;

use crate::common::{component_bytes, component_path, runtime};

async fn load_error(bytes: &[u8], path: &Path) -> LoadError {
    let error = runtime()
        .load_bytes("under-test", bytes, path)
        .await
        .expect_err("the load must fail");
    let message = error.to_string();
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(
        message.starts_with(&path.display().to_string()),
        "names the file: {message}"
    );
    error
}

#[tokio::test]
async fn a_text_file_is_not_a_component() {
    let path = Path::new("/providers/README.wasm");
    let error = load_error(b"# Providers\n\nPut provider components here.\n", path).await;
    assert!(matches!(error, LoadError::NotWasm { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "/providers/README.wasm: not a wasm component: it is a text file"
    );
}

#[tokio::test]
async fn a_core_module_is_not_a_component() {
    // The smallest valid core module: magic and version 1, no sections.
    let error = load_error(b"\0asm\x01\0\0\0", Path::new("core.wasm")).await;
    assert!(matches!(error, LoadError::CoreModule { .. }), "{error:?}");
    assert!(error.to_string().contains("core wasm module"), "{error}");
}

#[tokio::test]
async fn an_empty_file_is_not_a_component() {
    let error = load_error(b"", Path::new("empty.wasm")).await;
    assert!(matches!(error, LoadError::Empty { .. }), "{error:?}");
    assert!(error.to_string().contains("the file is empty"), "{error}");
}

#[tokio::test]
async fn a_truncated_component_does_not_compile() {
    let bytes = component_bytes("reference");
    let error = load_error(&bytes[..bytes.len() / 2], Path::new("truncated.wasm")).await;
    assert!(matches!(error, LoadError::Compile { .. }), "{error:?}");
    assert!(
        error.to_string().contains("invalid wasm component"),
        "{error}"
    );
}

#[tokio::test]
async fn a_future_contract_version_is_refused() {
    let path = component_path("future-contract");
    let error = load_error(&component_bytes("future-contract"), &path).await;
    assert!(
        matches!(error, LoadError::UnsupportedContract { .. }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .ends_with("exports egress:provider/provider@0.9.0; this host serves contract versions >=0.1.0, <0.3.0"),
        "{error}"
    );
}

#[tokio::test]
async fn an_import_the_host_does_not_provide_is_named() {
    let path = component_path("bad-import");
    let error = load_error(&component_bytes("bad-import"), &path).await;
    assert!(
        matches!(error, LoadError::UnknownImport { .. }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .ends_with("imports acme:exfil/upload@0.1.0, which this host does not provide"),
        "{error}"
    );
}

#[tokio::test]
async fn an_unreadable_file_says_so() {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-provider.wasm");
    let error = runtime().load_file(&path).await.unwrap_err();
    assert!(matches!(error, LoadError::Read { .. }), "{error:?}");
    assert!(error.to_string().contains("cannot read"), "{error}");
    assert_eq!(error.path(), path);
}

#[tokio::test]
async fn a_component_without_the_provider_export_is_the_wrong_world() {
    // The smallest valid component: magic and the component layer, no sections, no exports.
    let error = load_error(b"\0asm\x0d\0\x01\0", Path::new("empty-component.wasm")).await;
    assert!(
        matches!(error, LoadError::MissingExport { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "empty-component.wasm: exports no egress:provider/provider interface (wrong world?); its exports: none"
    );
}

#[tokio::test]
async fn an_operation_with_the_wrong_signature_is_refused_at_load() {
    // The reference provider with the names of its exports `create` and `delete` swapped (each an
    // export entry: a plain name of 6 bytes, then the function sort): its `create` is now the
    // function that takes a config and a provider ID and answers no instance.
    let mut bytes = component_bytes("reference");
    let entry = |name: &[u8]| {
        let entry = [&[0x00, 0x06][..], name, &[0x01]].concat();
        let mut found = (0..bytes.len()).filter(|&at| bytes[at..].starts_with(&entry));
        let at = found.next().expect("the export entry is there");
        assert!(found.next().is_none(), "one export entry of each");
        at + 2
    };
    let (create, delete) = (entry(b"create"), entry(b"delete"));
    bytes[create..create + 6].copy_from_slice(b"delete");
    bytes[delete..delete + 6].copy_from_slice(b"create");
    let error = load_error(&bytes, Path::new("/providers/swapped.wasm")).await;
    assert!(matches!(error, LoadError::Describe { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("type mismatch with parameters"),
        "says why: {message}"
    );
}
