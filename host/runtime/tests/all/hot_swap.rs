//! Hot swap: files replaced, broken, fixed and removed while calls run.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use egress_runtime::{CallContext, CallError, Registry, RegistryEvent, Request, Response};
use tokio::sync::broadcast;

use crate::common::{component_bytes, get_web, runtime, sha256_hex, with_custom_section};

/// `reference.wasm` alone in a temporary folder, served by a [`Registry`] watching it.
struct Watched {
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    original: Vec<u8>,
    registry: Registry,
    events: broadcast::Receiver<RegistryEvent>,
}

impl Watched {
    async fn reference() -> Watched {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reference.wasm");
        let original = component_bytes("reference");
        std::fs::write(&path, &original).unwrap();
        let registry = Registry::watch(runtime(), dir.path()).await.unwrap();
        let events = registry.subscribe();
        Watched {
            dir,
            path,
            original,
            registry,
            events,
        }
    }
}

/// Wait (at most 60 s) for an event matching `wanted`, skipping others.
async fn wait_for(
    events: &mut broadcast::Receiver<RegistryEvent>,
    what: &str,
    wanted: impl Fn(&RegistryEvent) -> bool,
) -> RegistryEvent {
    let wait = async {
        loop {
            match events.recv().await {
                Ok(event) if wanted(&event) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("no event: {what}"))
}

fn loaded_with(digest: String) -> impl Fn(&RegistryEvent) -> bool {
    move |event| matches!(event, RegistryEvent::Loaded { digest: loaded, .. } if loaded.hex() == digest)
}

/// Write `bytes` to a temporary name beside `path`, then rename it over `path` (atomic).
fn replace_atomically(path: &Path, bytes: &[u8]) {
    let temporary = path.with_extension("wasm.partial");
    std::fs::write(&temporary, bytes).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_under_concurrent_calls_fail_no_call() {
    let Watched {
        dir: _dir,
        path,
        original,
        registry,
        mut events,
    } = Watched::reference().await;
    let first = registry.get("reference").expect("loaded at start");

    // Callers hammer the provider by name for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let succeeded = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let (registry, stop, succeeded) = (registry.clone(), stop.clone(), succeeded.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match registry
                        .call("reference", get_web(), &CallContext::default())
                        .await
                    {
                        Ok(Response::Get(_)) => _ = succeeded.fetch_add(1, Ordering::Relaxed),
                        other => failures.push(format!("{other:?}")),
                    }
                    // A failing call returns without awaiting anything: yield so two callers
                    // cannot starve the test's own task on two workers.
                    tokio::task::yield_now().await;
                }
                failures
            })
        })
        .collect();

    // A slow call in flight on the first generation across every swap.
    let slow = {
        let first = first.clone();
        tokio::spawn(async move {
            let request = Request::Get {
                config: r#"{"delayMs": 2000}"#.into(),
                provider_id: "ref/web".into(),
            };
            first.call(request, &CallContext::default()).await
        })
    };

    let mut generation = first.load_generation();
    for round in 1..=4u8 {
        let bytes = with_custom_section(&original, "egress-test-generation", &[round]);
        if round == 4 {
            // A plain overwrite: the watcher may see a half-written file first; that is
            // rejected and the previous generation keeps serving until the whole file lands.
            std::fs::write(&path, &bytes).unwrap();
        } else {
            replace_atomically(&path, &bytes);
        }
        wait_for(
            &mut events,
            "the new generation loads",
            loaded_with(sha256_hex(&bytes)),
        )
        .await;
        let current = registry.get("reference").unwrap();
        assert!(
            current.load_generation() > generation,
            "generations increase"
        );
        assert_eq!(current.component_digest().hex(), sha256_hex(&bytes));
        generation = current.load_generation();
    }

    let slow_result = slow.await.unwrap();
    assert!(
        matches!(slow_result, Ok(Response::Get(_))),
        "in-flight call on the old generation: {slow_result:?}"
    );
    assert_eq!(
        first.component_digest().hex(),
        sha256_hex(&original),
        "the in-flight call ran on the first bytes"
    );
    assert_ne!(
        registry.get("reference").unwrap().load_generation(),
        first.load_generation()
    );

    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        let failures = caller.await.unwrap();
        assert!(
            failures.is_empty(),
            "calls failed during swaps: {failures:?}"
        );
    }
    assert!(
        succeeded.load(Ordering::Relaxed) > 0,
        "the callers made calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_replacement_leaves_the_old_generation_serving_until_fixed() {
    let Watched {
        dir: _dir,
        path,
        original,
        registry,
        mut events,
    } = Watched::reference().await;
    let serving = registry.get("reference").unwrap();

    replace_atomically(&path, &original[..original.len() / 3]);
    let rejected = wait_for(&mut events, "the truncated file is rejected", |event| {
        matches!(event, RegistryEvent::Rejected { .. })
    })
    .await;
    let RegistryEvent::Rejected {
        path: rejected_path,
        error,
    } = rejected
    else {
        unreachable!()
    };
    assert_eq!(rejected_path, path);
    assert!(error.contains("invalid wasm component"), "{error}");
    assert_eq!(
        registry.get("reference").unwrap().load_generation(),
        serving.load_generation()
    );
    assert!(
        registry
            .call("reference", get_web(), &CallContext::default())
            .await
            .is_ok()
    );

    replace_atomically(&path, b"not a component, just text\n");
    wait_for(&mut events, "the text file is rejected", |event| {
        matches!(event, RegistryEvent::Rejected { error, .. } if error.contains("text file"))
    })
    .await;
    assert_eq!(
        registry.get("reference").unwrap().load_generation(),
        serving.load_generation()
    );

    let fixed = with_custom_section(&original, "egress-test-fixed", b"1");
    replace_atomically(&path, &fixed);
    wait_for(
        &mut events,
        "the fixed file loads",
        loaded_with(sha256_hex(&fixed)),
    )
    .await;
    assert!(registry.get("reference").unwrap().load_generation() > serving.load_generation());
}

#[tokio::test]
async fn removing_a_file_removes_its_provider() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reference.wasm");
    std::fs::write(&path, component_bytes("reference")).unwrap();
    let registry = Registry::watch(runtime(), dir.path()).await.unwrap();
    let mut events = registry.subscribe();
    assert_eq!(registry.providers().len(), 1);

    std::fs::remove_file(&path).unwrap();
    let removed = wait_for(&mut events, "the provider is removed", |event| {
        matches!(event, RegistryEvent::Removed { .. })
    })
    .await;
    assert_eq!(
        removed,
        RegistryEvent::Removed {
            identity: "reference".into(),
            path
        }
    );
    assert!(registry.get("reference").is_none());
    let error = registry
        .call("reference", get_web(), &CallContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(error, CallError::NotLoaded { ref name } if name == "reference"),
        "{error:?}"
    );
}

#[tokio::test]
async fn two_files_claiming_one_name_each_serve_as_their_own_identity() {
    let dir = tempfile::tempdir().unwrap();
    let original = component_bytes("reference");
    let first = dir.path().join("a-reference.wasm");
    std::fs::write(&first, &original).unwrap();
    let registry = Registry::watch(runtime(), dir.path()).await.unwrap();
    let mut events = registry.subscribe();
    let serving = registry.get("a-reference").expect("the first file serves");

    // A second component describing itself as `reference` too: it neither replaces the first
    // nor is refused; it serves as its own file's identity.
    let second = dir.path().join("b-reference.wasm");
    let copy = with_custom_section(&original, "egress-test-copy", b"2");
    std::fs::write(&second, &copy).unwrap();
    registry.reload_now().await.unwrap();
    let loaded = wait_for(
        &mut events,
        "the second file loads",
        loaded_with(sha256_hex(&copy)),
    )
    .await;
    let RegistryEvent::Loaded {
        identity,
        described_as,
        path,
        ..
    } = loaded
    else {
        unreachable!()
    };
    assert_eq!(
        (identity.as_str(), described_as.as_str()),
        ("b-reference", "reference")
    );
    assert_eq!(path, second);

    let first_now = registry.get("a-reference").unwrap();
    assert_eq!(
        first_now.load_generation(),
        serving.load_generation(),
        "the first was not replaced"
    );
    assert_eq!(registry.get("b-reference").unwrap().path(), second);
    assert!(
        registry.get("reference").is_none(),
        "no provider serves under the claimed name"
    );
    let identities: Vec<String> = registry
        .providers()
        .iter()
        .map(|provider| provider.identity().to_owned())
        .collect();
    assert_eq!(identities, ["a-reference", "b-reference"]);
}

#[tokio::test]
async fn a_file_whose_name_is_no_identity_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("Bad_Name.wasm");
    std::fs::write(&path, component_bytes("reference")).unwrap();
    let registry = Registry::watch(runtime(), dir.path()).await.unwrap();
    assert!(registry.providers().is_empty());
    let error = crate::common::runtime().load_file(&path).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("the file name gives the provider its identity"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_slowly_in_place_is_loaded_only_when_whole() {
    let Watched {
        dir: _dir,
        path,
        original,
        registry,
        mut events,
    } = Watched::reference().await;

    // Truncate, then write in chunks paced below the debounce, as a slow `cp` would: no rescan
    // may see the file until it is whole, so nothing half-written is examined or rejected.
    let bytes = with_custom_section(&original, "egress-test-slow-write", &[1]);
    let writer = {
        let (path, bytes) = (path.clone(), bytes.clone());
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut file = std::fs::File::create(&path).unwrap();
            for chunk in bytes.chunks(bytes.len().div_ceil(8)) {
                file.write_all(chunk).unwrap();
                file.flush().unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let first = wait_for(&mut events, "the written file is examined", |event| {
        matches!(
            event,
            RegistryEvent::Loaded { .. } | RegistryEvent::Rejected { .. }
        )
    })
    .await;
    writer.await.unwrap();
    assert_eq!(
        first,
        RegistryEvent::Loaded {
            identity: "reference".into(),
            described_as: registry
                .get("reference")
                .unwrap()
                .description()
                .name
                .clone(),
            generation: registry.get("reference").unwrap().load_generation(),
            digest: sha256_hex(&bytes).parse().unwrap(),
            path: path.clone(),
        },
        "only the whole file is examined"
    );
}
