//! `RuntimeConfig::memory_creator` replaces the pooling allocator: every guest memory comes from
//! the given creator (tests use it to inspect guest memory).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use egress_runtime::{LoadError, Runtime, RuntimeConfig};
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

use crate::common::{component_bytes, component_path, test_limits};

/// Counts requests for memory and refuses them all.
#[derive(Default)]
struct RefusingCreator {
    asked: AtomicUsize,
}

// SAFETY: it never returns a memory, so it cannot return an unsound one.
unsafe impl MemoryCreator for RefusingCreator {
    fn new_memory(
        &self,
        _ty: MemoryType,
        _minimum: usize,
        _maximum: Option<usize>,
        _reserved_size_in_bytes: Option<usize>,
        _guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Err("refused by the test's memory creator".to_owned())
    }
}

#[tokio::test]
async fn every_guest_memory_comes_from_the_configured_creator() {
    let creator = Arc::new(RefusingCreator::default());
    let config = RuntimeConfig::default()
        .limits(test_limits())
        .cache_dir(None)
        .memory_creator(creator.clone());
    let runtime = Runtime::new(config).unwrap();
    let error = runtime
        .load_bytes(
            "reference",
            &component_bytes("reference"),
            &component_path("reference"),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, LoadError::Describe { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("refused by the test's memory creator"),
        "{error}"
    );
    assert!(creator.asked.load(Ordering::SeqCst) >= 1);
}
