//! The crate's one way to take a lock.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, also after a panic in another holder: every lock in this crate guards plain
/// data (caches, armed watches, the grant map), still consistent when a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
