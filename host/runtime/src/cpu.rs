//! CPU time a call spends computing, as opposed to waiting.
//!
//! A provider's `create` may legitimately wait fifteen minutes for a hypervisor; it may not
//! compute for fifteen minutes. The wall-clock deadline bounds the first; [`CpuMeter`] measures
//! the second: the time spent inside each poll of the call's future (the guest runs only inside
//! those polls, on the polling thread), so time spent waiting for I/O or a timer is not counted.
//!
//! Reading the thread's CPU clock is a system call, and a dear one (the kernel takes the run
//! queue's lock): two per poll were a tenth of a whole no-op call. So a poll is charged its
//! wall-clock time, read from the vDSO, which bounds its CPU time from above, until the epoch
//! callback first reads [`CpuMeter::used`] in it, one tick into a poll that computes; from then
//! on the poll is charged the thread CPU time it uses, so time the thread was descheduled on a
//! loaded machine is not charged past a poll's first tick. The short polls of a call that waits
//! on I/O make no system call, and a guest cannot compute unseen in them: every poll is charged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

/// CPU time used by one call. Shared by the polling wrapper ([`Metered`]) and the epoch callback,
/// which run on the same thread during a poll. Clock readings are in nanoseconds; 0 means "none".
#[derive(Debug, Default)]
pub(crate) struct CpuMeter {
    /// Nanoseconds charged for finished polls.
    used_ns: AtomicU64,
    /// The monotonic clock when the current poll began, or 0 outside a poll.
    poll_started_ns: AtomicU64,
    /// The thread CPU clock when the epoch callback first looked in the current poll, or 0.
    cpu_mark_ns: AtomicU64,
    /// The wall-clock time of the current poll before that first look.
    wall_before_mark_ns: AtomicU64,
}

impl CpuMeter {
    /// Time charged so far, including the poll in progress. The first call within a poll starts
    /// charging that poll by thread CPU time rather than wall-clock time.
    pub(crate) fn used(&self) -> Duration {
        let used = self.used_ns.load(Ordering::Relaxed);
        let started = self.poll_started_ns.load(Ordering::Relaxed);
        if started == 0 {
            return Duration::from_nanos(used);
        }
        let mark = self.cpu_mark_ns.load(Ordering::Relaxed);
        let in_poll = if mark == 0 {
            let wall = monotonic_ns().saturating_sub(started);
            self.wall_before_mark_ns.store(wall, Ordering::Relaxed);
            self.cpu_mark_ns
                .store(thread_cpu_ns().max(1), Ordering::Relaxed);
            wall
        } else {
            self.charged_since_mark(mark)
        };
        Duration::from_nanos(used.saturating_add(in_poll))
    }

    /// The current poll's charge once the epoch callback has looked in it at thread CPU clock
    /// `mark`: its wall-clock time before the look, its thread CPU time since.
    fn charged_since_mark(&self, mark: u64) -> u64 {
        self.wall_before_mark_ns.load(Ordering::Relaxed) + thread_cpu_ns().saturating_sub(mark)
    }

    /// What the poll that began at `started` costs, now that it has returned.
    fn finish_poll(&self, started: u64) {
        let mark = self.cpu_mark_ns.load(Ordering::Relaxed);
        let spent = if mark == 0 {
            monotonic_ns().saturating_sub(started)
        } else {
            self.charged_since_mark(mark)
        };
        self.poll_started_ns.store(0, Ordering::Relaxed);
        self.cpu_mark_ns.store(0, Ordering::Relaxed);
        self.used_ns.fetch_add(spent, Ordering::Relaxed);
    }
}

/// Runs `inner`, charging the time of each poll to `meter`.
pub(crate) struct Metered<F> {
    inner: Pin<Box<F>>,
    meter: Arc<CpuMeter>,
}

impl<F: Future> Metered<F> {
    pub(crate) fn new(inner: F, meter: Arc<CpuMeter>) -> Self {
        Metered {
            inner: Box::pin(inner),
            meter,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Never 0, which means "not in a poll".
        let started = monotonic_ns().max(1);
        self.meter.poll_started_ns.store(started, Ordering::Relaxed);
        let result = self.inner.as_mut().poll(cx);
        self.meter.finish_poll(started);
        result
    }
}

/// The monotonic clock in nanoseconds (`CLOCK_MONOTONIC`, read in the vDSO without a system call).
fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The calling thread's CPU clock in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, a system call).
fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; the clock ids are constants the kernel knows.
    let result = unsafe { libc::clock_gettime(clock, &mut now) };
    if result != 0 {
        return 0;
    }
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn computing_is_charged_and_waiting_is_not() {
        let meter = Arc::new(CpuMeter::default());
        let work = Metered::new(
            async {
                // Compute for at least 30 ms of CPU time.
                let start = thread_cpu_ns();
                let mut x = 0u64;
                while thread_cpu_ns() - start < 30_000_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                // Then wait 200 ms without computing.
                tokio::time::sleep(Duration::from_millis(200)).await;
                x
            },
            Arc::clone(&meter),
        );
        work.await;
        let used = meter.used();
        assert!(used >= Duration::from_millis(30), "{used:?}");
        assert!(
            used < Duration::from_millis(150),
            "the wait was charged: {used:?}"
        );
    }

    /// The thread blocked inside a poll stands for a thread descheduled on a loaded machine: its
    /// wall-clock time passes and its CPU clock does not.
    fn block_thread(time: Duration) {
        std::thread::sleep(time);
    }

    #[tokio::test]
    async fn a_poll_is_charged_cpu_time_once_the_epoch_callback_has_looked_in_it() {
        let meter = Arc::new(CpuMeter::default());
        let inside = Arc::clone(&meter);
        Metered::new(
            async move {
                // What the epoch callback does one tick into a poll that computes.
                inside.used();
                block_thread(Duration::from_millis(200));
            },
            Arc::clone(&meter),
        )
        .await;
        let used = meter.used();
        assert!(
            used < Duration::from_millis(100),
            "time the thread did not run was charged after the callback looked: {used:?}"
        );
    }

    #[tokio::test]
    async fn a_poll_the_epoch_callback_never_looked_in_is_charged_its_wall_clock_time() {
        let meter = Arc::new(CpuMeter::default());
        Metered::new(
            async { block_thread(Duration::from_millis(50)) },
            Arc::clone(&meter),
        )
        .await;
        let used = meter.used();
        assert!(
            used >= Duration::from_millis(50),
            "a poll too short for a tick went uncharged: {used:?}"
        );
    }
}
