//! The reconcilers' clock settings, [`Timing`], and the one rule every wait follows: a base
//! doubled per attempt, capped at [`Timing::backoff_max`], jittered where many may retry in step.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The reconcilers' clock settings.
#[derive(Clone, Debug)]
pub struct Timing {
    /// How often a Proxy that is fine is looked at again (drift).
    pub resync: Duration,
    /// The first poll of a VM still provisioning; polls then slow down to `poll_max`.
    pub poll_min: Duration,
    /// The slowest poll of a VM still provisioning.
    pub poll_max: Duration,
    /// The first retry after a transient error; doubled each time, up to `backoff_max`.
    pub backoff_base: Duration,
    /// The longest retry wait.
    pub backoff_max: Duration,
    /// The retry after `quota-exceeded`.
    pub quota_retry: Duration,
    /// The retry while the ProviderConfig or user-data is missing (changes also trigger one).
    pub not_ready_retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            resync: Duration::from_secs(60),
            poll_min: Duration::from_secs(2),
            poll_max: Duration::from_secs(30),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            quota_retry: Duration::from_secs(600),
            not_ready_retry: Duration::from_secs(60),
        }
    }
}

impl Timing {
    /// The wait before attempt `n + 1` (counting from 0): `base × 2^n`, capped at `backoff_max`.
    pub fn exponential(&self, base: Duration, n: u32) -> Duration {
        base.saturating_mul(1u32 << n.min(16)).min(self.backoff_max)
    }

    /// The wait before a reconcile that failed in the adapter (an API or store error, not a
    /// provider's answer) runs again, in both modes: two doublings of the first retry.
    pub fn after_adapter_failure(&self) -> Duration {
        self.exponential(self.backoff_base, 2)
    }

    /// How long until the next VM recovery may run: `base × 2^(n-1)` after the last of the `n`
    /// recoveries in `recent`, capped; zero when there are none.
    pub fn recovery_wait(&self, recent: &[Time], base: Duration, now: &Time) -> Duration {
        let Some(last) = recent.last() else {
            return Duration::ZERO;
        };
        let count = recent.len() as u32;
        self.exponential(base, count - 1)
            .saturating_sub(age(now, last))
    }
}

/// How long ago `then` was at `now` (zero if in the future).
pub fn age(now: &Time, then: &Time) -> Duration {
    Duration::try_from(now.0.duration_since(then.0)).unwrap_or(Duration::ZERO)
}

/// A wait in `[ceiling / 2, ceiling]`, so a burst of failures does not retry in step.
pub fn jitter(ceiling: Duration) -> Duration {
    if ceiling.is_zero() {
        return ceiling;
    }
    let half = ceiling / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap())
    }

    #[test]
    fn each_recovery_waits_twice_as_long_as_the_last_capped() {
        let timing = Timing::default();
        let base = Duration::from_secs(10);
        assert_eq!(timing.recovery_wait(&[], base, &at(0)), Duration::ZERO);
        assert_eq!(
            timing.recovery_wait(&[at(0)], base, &at(4)),
            Duration::from_secs(6)
        );
        let three = [at(0), at(10), at(30)];
        assert_eq!(
            timing.recovery_wait(&three, base, &at(40)),
            Duration::from_secs(30),
            "40 s after the third"
        );
        assert_eq!(timing.recovery_wait(&three, base, &at(99)), Duration::ZERO);
        let twelve: Vec<Time> = (0..12).map(at).collect();
        assert_eq!(
            timing.recovery_wait(&twelve, base, &at(11)),
            timing.backoff_max,
            "capped"
        );
    }

    #[test]
    fn a_failure_in_the_adapter_waits_four_first_retries_at_most_the_longest() {
        let timing = Timing::default();
        assert_eq!(timing.after_adapter_failure(), Duration::from_secs(4));
        let short = Timing {
            backoff_max: Duration::from_secs(3),
            ..Timing::default()
        };
        assert_eq!(short.after_adapter_failure(), Duration::from_secs(3));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for _ in 0..100 {
            let wait = jitter(Duration::from_secs(8));
            assert!(
                (Duration::from_secs(4)..=Duration::from_secs(8)).contains(&wait),
                "{wait:?}"
            );
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
