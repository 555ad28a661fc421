//! The compile cache: a second load of the same bytes skips compilation; a corrupt entry is
//! recompiled, not an error. Under tiered compilation the entry is written by the background
//! compiler, so each cold load is followed by waiting for its optimized code.

use egress_runtime::{Runtime, RuntimeConfig};

use crate::common::{component_bytes, component_path, test_limits};

#[tokio::test]
async fn second_load_hits_the_cache_and_a_corrupt_entry_is_recompiled() {
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig::default()
        .limits(test_limits())
        .cache_dir(Some(cache.path().to_owned()));
    let runtime = Runtime::new(config).unwrap();
    let path = component_path("reference");
    let bytes = component_bytes("reference");

    let cold = runtime
        .load_bytes("reference", &bytes, &path)
        .await
        .unwrap();
    assert!(!cold.from_cache());
    cold.optimized().await;
    let warm = runtime
        .load_bytes("reference", &bytes, &path)
        .await
        .unwrap();
    assert!(warm.from_cache());
    assert_eq!(warm.description(), cold.description());

    // Flip bytes in the middle of every compiled entry.
    let mut corrupted = 0;
    for entry in std::fs::read_dir(cache.path()).unwrap() {
        let entry = entry.unwrap().path();
        if entry
            .extension()
            .is_some_and(|extension| extension == "cwasm")
        {
            let mut compiled = std::fs::read(&entry).unwrap();
            let middle = compiled.len() / 2;
            for byte in &mut compiled[middle..middle + 64] {
                *byte = !*byte;
            }
            std::fs::write(&entry, compiled).unwrap();
            corrupted += 1;
        }
    }
    assert_eq!(corrupted, 1, "one entry for one component");

    let recompiled = runtime
        .load_bytes("reference", &bytes, &path)
        .await
        .unwrap();
    assert!(
        !recompiled.from_cache(),
        "a corrupt entry must not be loaded"
    );
    recompiled.optimized().await;
    let call = recompiled
        .call(egress_runtime::Request::Describe, &Default::default())
        .await;
    assert!(call.is_ok(), "{call:?}");
    assert!(
        runtime
            .load_bytes("reference", &bytes, &path)
            .await
            .unwrap()
            .from_cache(),
        "the entry was rewritten"
    );
}

#[tokio::test]
async fn no_cache_dir_means_no_cache() {
    let config = RuntimeConfig::default()
        .limits(test_limits())
        .cache_dir(None);
    let runtime = Runtime::new(config).unwrap();
    let path = component_path("misbehave");
    let bytes = component_bytes("misbehave");
    for _ in 0..2 {
        let provider = runtime.load_bytes("misbehave", &bytes, &path).await;
        assert!(!provider.unwrap().from_cache());
    }
}

/// Whoever can write the cache can run native code in the host: a directory or an entry others
/// can write is not trusted.
#[tokio::test]
async fn a_cache_others_can_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig::default()
        .limits(test_limits())
        .cache_dir(Some(cache.path().to_owned()));
    let runtime = Runtime::new(config).unwrap();
    let path = component_path("reference");
    let bytes = component_bytes("reference");
    // A load, once its background compile (which writes the cache) is over.
    let load = || async {
        let provider = runtime
            .load_bytes("reference", &bytes, &path)
            .await
            .unwrap();
        provider.optimized().await;
        provider
    };

    // A world-writable directory: nothing is read from it or written to it.
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(!load().await.from_cache());
    assert!(!load().await.from_cache());
    assert_eq!(
        std::fs::read_dir(cache.path()).unwrap().count(),
        0,
        "nothing written"
    );

    // Once the directory is ours alone, the cache works.
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(!load().await.from_cache());
    assert!(load().await.from_cache());

    // An entry others could have rewritten is not loaded, though its checksum matches.
    for entry in std::fs::read_dir(cache.path()).unwrap() {
        let entry = entry.unwrap().path();
        if entry
            .extension()
            .is_some_and(|extension| extension == "cwasm")
        {
            std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
    }
    assert!(!load().await.from_cache());
}
