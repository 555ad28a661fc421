//! CPU time a call spends computing, as opposed to waiting.
//!
//! A provider's `create` may legitimately wait fifteen minutes for a hypervisor; it may not
//! compute for fifteen minutes. The wall-clock deadline bounds the first; [`CpuMeter`] measures
//! the second: the thread CPU time spent inside each poll of the call's future (the guest runs
//! only inside those polls, on the polling thread), so time spent waiting for I/O or a timer is
//! not counted and time the thread was descheduled on a loaded machine is not charged either.
//! The epoch callback reads [`CpuMeter::used`] every tick, mid-poll, and stops a guest past its
//! budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

/// CPU time used by one call. Shared by the polling wrapper ([`Metered`]) and the epoch callback,
/// which run on the same thread during a poll.
#[derive(Debug, Default)]
pub(crate) struct CpuMeter {
    /// Nanoseconds of thread CPU time spent in finished polls.
    used_ns: AtomicU64,
    /// The thread CPU clock when the current poll began, or 0 outside a poll.
    poll_started_ns: AtomicU64,
}

impl CpuMeter {
    /// CPU time used so far, including the poll in progress.
    pub(crate) fn used(&self) -> Duration {
        let mut used = self.used_ns.load(Ordering::Relaxed);
        let started = self.poll_started_ns.load(Ordering::Relaxed);
        if started != 0 {
            used += thread_cpu_ns().saturating_sub(started);
        }
        Duration::from_nanos(used)
    }
}

/// Runs `inner`, charging the CPU time of each poll to `meter`.
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
        let started = thread_cpu_ns().max(1);
        self.meter.poll_started_ns.store(started, Ordering::Relaxed);
        let result = self.inner.as_mut().poll(cx);
        let spent = thread_cpu_ns().saturating_sub(started);
        self.meter.poll_started_ns.store(0, Ordering::Relaxed);
        self.meter.used_ns.fetch_add(spent, Ordering::Relaxed);
        result
    }
}

/// The calling thread's CPU clock in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
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
}
