//! Time: RFC 3339 timestamps from `wasi:clocks/wall-clock`, and waiting on
//! `wasi:clocks/monotonic-clock`. One timestamp format and one way to wait, written out here
//! instead of pulling a date crate into every component.

use wasip2::clocks::{monotonic_clock, wall_clock};

/// Now, as an RFC 3339 UTC timestamp with whole seconds (`2024-02-29T12:34:56Z`): what a provider
/// writes as an instance's `created-at` when it creates one.
pub fn now_rfc3339() -> String {
    rfc3339_from_unix_seconds(wall_clock::now().seconds)
}

/// Milliseconds on the monotonic clock, for budgets.
pub fn monotonic_ms() -> u64 {
    monotonic_clock::now() / 1_000_000
}

/// Block this call for `milliseconds` without spinning: subscribe to the monotonic clock and
/// wait on the pollable, so the host can run other work (and cancel or time us out) meanwhile.
pub fn sleep_ms(milliseconds: u64) {
    if milliseconds == 0 {
        return;
    }
    monotonic_clock::subscribe_duration(milliseconds.saturating_mul(1_000_000)).block();
}

/// Format seconds since 1970-01-01T00:00:00Z as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339_from_unix_seconds(seconds: u64) -> String {
    let days = seconds / 86_400;
    let second_of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3_600,
        second_of_day % 3_600 / 60,
        second_of_day % 60,
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
///
/// Howard Hinnant's `civil_from_days`: count in 400-year eras of 146 097 days, with years that
/// start on March 1st so the leap day is the last day of the year.
fn civil_from_days(days_since_epoch: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01, the start of an era.
    let days = days_since_epoch + 719_468;
    let era = days / 146_097;
    let day_of_era = days % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values were produced independently with Python's `datetime`.
    #[test]
    fn formats_the_epoch_and_leap_days() {
        assert_eq!(rfc3339_from_unix_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_from_unix_seconds(951_782_400),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339_from_unix_seconds(1_709_210_096),
            "2024-02-29T12:34:56Z"
        );
        assert_eq!(
            rfc3339_from_unix_seconds(1_790_145_676),
            "2026-09-23T06:41:16Z"
        );
    }

    #[test]
    fn formats_century_and_far_future_boundaries() {
        // 2100 is not a leap year: January 1st must follow December 31st directly.
        assert_eq!(
            rfc3339_from_unix_seconds(4_102_444_800),
            "2100-01-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339_from_unix_seconds(4_102_444_799),
            "2099-12-31T23:59:59Z"
        );
        assert_eq!(
            rfc3339_from_unix_seconds(253_402_300_799),
            "9999-12-31T23:59:59Z"
        );
    }

    #[test]
    fn a_leap_year_has_the_right_days_in_each_month_in_order() {
        // Walk every day from 2024-01-01 and count how many land in each month.
        let first_day = 1_704_067_200 / 86_400;
        let mut days_in_month = [0u64; 12];
        for offset in 0..366 {
            let (year, month, day) = civil_from_days(first_day + offset);
            assert_eq!(year, 2024, "day {offset}");
            days_in_month[(month - 1) as usize] += 1;
            assert_eq!(day, days_in_month[(month - 1) as usize], "day {offset}");
        }
        assert_eq!(
            days_in_month,
            [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        );
    }
}
