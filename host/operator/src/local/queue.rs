//! Local mode's work queue: each Proxy key is due at some time, handed to one worker at a time
//! (calls for one Proxy are serialised), and a key scheduled while it runs comes back once it is
//! done.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Default)]
struct State {
    /// Keys waiting, by due time.
    due: BTreeSet<(Instant, String)>,
    /// When each waiting key is due.
    when: HashMap<String, Instant>,
    /// Keys a worker holds now.
    running: HashSet<String>,
    /// Keys scheduled while running: due again when their worker lets go.
    again: HashMap<String, Instant>,
    closed: bool,
}

/// The queue. Shared by the workers and whatever schedules.
#[derive(Default)]
pub struct Queue {
    state: Mutex<State>,
    wake: Notify,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Make `key` due at `at` (or earlier, if it already is).
    pub fn schedule(&self, key: &str, at: Instant) {
        let mut state = self.lock();
        if state.running.contains(key) {
            let again = state.again.entry(key.to_owned()).or_insert(at);
            *again = (*again).min(at);
            return;
        }
        if let Some(&existing) = state.when.get(key) {
            if existing <= at {
                return;
            }
            state.due.remove(&(existing, key.to_owned()));
        }
        state.when.insert(key.to_owned(), at);
        state.due.insert((at, key.to_owned()));
        drop(state);
        self.wake.notify_one();
    }

    /// Forget `key` if it is waiting (its object is gone).
    pub fn forget(&self, key: &str) {
        let mut state = self.lock();
        if let Some(at) = state.when.remove(key) {
            state.due.remove(&(at, key.to_owned()));
        }
        state.again.remove(key);
    }

    /// The next due key, once it is due; `None` once the queue is closed.
    pub async fn next(&self) -> Option<String> {
        loop {
            let earliest = {
                let mut state = self.lock();
                if state.closed {
                    return None;
                }
                match state.due.first().cloned() {
                    Some((at, key)) if at <= Instant::now() => {
                        state.due.remove(&(at, key.clone()));
                        state.when.remove(&key);
                        state.running.insert(key.clone());
                        return Some(key);
                    }
                    Some((at, _)) => Some(at),
                    None => None,
                }
            };
            match earliest {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// A worker is done with `key`: if it was scheduled meanwhile, it is due again.
    pub fn done(&self, key: &str) {
        let again = {
            let mut state = self.lock();
            state.running.remove(key);
            state.again.remove(key)
        };
        if let Some(at) = again {
            self.schedule(key, at);
        }
        // Another worker may be waiting for a key that was held.
        self.wake.notify_one();
    }

    /// Whether any key is waiting or running.
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.running.is_empty() && state.due.is_empty()
    }

    /// Stop handing out keys; every worker's `next` returns `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn keys_come_due_in_order_and_once_while_running() {
        let queue = Queue::default();
        let now = Instant::now();
        queue.schedule("b", now + Duration::from_secs(2));
        queue.schedule("a", now + Duration::from_secs(1));
        queue.schedule("a", now + Duration::from_secs(5)); // later: the earlier time stands
        assert_eq!(queue.next().await.as_deref(), Some("a"));
        assert!(Instant::now() >= now + Duration::from_secs(1));
        // Scheduled while running: not handed to a second worker, due again when done.
        queue.schedule("a", Instant::now());
        assert_eq!(queue.next().await.as_deref(), Some("b"));
        queue.done("a");
        assert_eq!(queue.next().await.as_deref(), Some("a"));
        queue.done("a");
        queue.done("b");
        assert!(queue.is_idle());
        queue.schedule("c", Instant::now() + Duration::from_secs(60));
        queue.forget("c");
        assert!(queue.is_idle());
        queue.close();
        assert_eq!(queue.next().await, None);
    }
}
