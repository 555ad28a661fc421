//! Timestamps as the API server writes them: RFC 3339 in UTC with whole seconds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, as `2025-01-31T12:00:00Z`.
pub(crate) fn now() -> String {
    format_unix(now_unix())
}

/// Now, in seconds since the Unix epoch.
pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the Unix epoch of an RFC 3339 time (`2025-01-31T12:00:00Z`, fractions and
/// offsets allowed), or `None` when it is not one.
pub(crate) fn parse(text: &str) -> Option<i64> {
    let number = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
    };
    let (date, rest) = text.split_once(['T', 't'])?;
    let mut ymd = date.splitn(3, '-');
    let (year, month, day) = (
        number(ymd.next()?)?,
        number(ymd.next()?)?,
        number(ymd.next()?)?,
    );
    let clock = rest.get(..8)?;
    let mut hms = clock.splitn(3, ':');
    let (hour, minute, second) = (
        number(hms.next()?)?,
        number(hms.next()?)?,
        number(hms.next()?)?,
    );
    let mut zone = &rest[8..];
    if let Some(fraction) = zone.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        zone = &fraction[digits..];
    }
    let offset = match zone {
        "Z" | "z" => 0,
        _ => {
            let sign = match zone.get(..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let (h, m) = zone[1..].split_once(':')?;
            sign * (number(h)? * 3600 + number(m)? * 60)
        }
    };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// Formats seconds since the Unix epoch (proleptic Gregorian calendar, days-from-civil inverse).
fn format_unix(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Howard Hinnant's civil_from_days, shifted so eras start on 0000-03-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    use super::{format_unix, parse};

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_unix(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn parses_what_it_formats_and_what_clients_send() {
        for secs in [0, 951_782_400, 1_735_689_599, 4_102_444_800] {
            assert_eq!(parse(&format_unix(secs)), i64::try_from(secs).ok());
        }
        assert_eq!(parse("2025-01-01T00:00:00.123456Z"), Some(1_735_689_600));
        assert_eq!(parse("2025-01-01T01:00:00+01:00"), Some(1_735_689_600));
        assert_eq!(parse("yesterday"), None);
        assert_eq!(parse("2025-13-01T00:00:00Z"), None);
    }
}
