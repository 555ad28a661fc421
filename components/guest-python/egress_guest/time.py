"""Time: RFC 3339 timestamps from `wasi:clocks/wall-clock`, and waiting on
`wasi:clocks/monotonic-clock` without spinning."""

from wit_world.imports import monotonic_clock, wall_clock


def now_rfc3339() -> str:
    """Now, as an RFC 3339 UTC timestamp with whole seconds (`2024-02-29T12:34:56Z`): what a
    provider writes as an instance's `created-at`."""
    return rfc3339(wall_clock.now().seconds)


def rfc3339(unix_seconds: int) -> str:
    """Seconds since the Unix epoch as RFC 3339 UTC (`2026-09-18T15:02:00Z`). Howard Hinnant's
    days-to-civil algorithm (the Rust guest crate's), so no `datetime` is needed."""
    days, second = divmod(unix_seconds, 86_400)
    era, day_of_era = divmod(days + 719_468, 146_097)
    year_of_era = (day_of_era - day_of_era // 1_460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + 3 if month_index < 10 else month_index - 9
    year = era * 400 + year_of_era + (1 if month <= 2 else 0)
    return f"{year:04}-{month:02}-{day:02}T{second // 3600:02}:{second % 3600 // 60:02}:{second % 60:02}Z"


def monotonic_ms() -> int:
    """Milliseconds on the monotonic clock, for budgets."""
    return monotonic_clock.now() // 1_000_000


def sleep_ms(milliseconds: int) -> None:
    """Block for `milliseconds` on a pollable, so the host can run other work (and cancel or time
    the call out) meanwhile."""
    if milliseconds > 0:
        with monotonic_clock.subscribe_duration(milliseconds * 1_000_000) as ready:
            ready.block()
