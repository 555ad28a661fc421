//! Reading the operator's metrics page (OpenMetrics text) in tests.

/// The sum of the counters on a metrics page whose name and leading labels are `prefix`
/// (`name{label="value",`): one count over every value of the labels left out.
pub fn counter(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
