//! The one lock helper of the host's crates.

use std::sync::{Mutex, MutexGuard};

/// Lock `mutex`, taking it over from a thread that panicked while holding it. The host keeps
/// only plain values and bookkeeping under its locks, each written whole, so a poisoned one is
/// still consistent; failing every later call because one call panicked would be worse.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
