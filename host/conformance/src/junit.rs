//! The report as JUnit XML (the de-facto schema CI systems read: `testsuites` › `testsuite` ›
//! `testcase` with `failure` or `skipped`). Small enough to write by hand; every text goes
//! through [`escape`].

use std::fmt::Write as _;

use super::{Outcome, Report};

/// The whole document.
pub(crate) fn render(report: &Report) -> String {
    let total: f64 = report.rules.iter().map(|r| r.elapsed.as_secs_f64()).sum();
    let counts = format!(
        r#"tests="{}" failures="{}" errors="0" skipped="{}" time="{total:.3}""#,
        report.rules.len(),
        report.failed(),
        report.skipped()
    );
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(xml, r#"<testsuites name="egress-conformance" {counts}>"#);
    let _ = writeln!(
        xml,
        r#"  <testsuite name="{}" {counts}>"#,
        escape(&report.identity)
    );
    for rule in &report.rules {
        let family = rule.id.split('.').next().unwrap_or(rule.id);
        let open = format!(
            r#"    <testcase name="{}" classname="conformance.{}" time="{:.3}""#,
            escape(rule.id),
            escape(family),
            rule.elapsed.as_secs_f64()
        );
        match &rule.outcome {
            Outcome::Pass => {
                let _ = writeln!(xml, "{open}/>");
            }
            Outcome::Fail(reason) => {
                let _ = writeln!(
                    xml,
                    "{open}>\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                    escape(reason),
                    escape(reason)
                );
            }
            Outcome::Skip(why) => {
                let _ = writeln!(
                    xml,
                    "{open}>\n      <skipped message=\"{}\"/>\n    </testcase>",
                    escape(why)
                );
            }
        }
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}

/// Text safe in XML content and attribute values. Characters XML 1.0 cannot carry at all
/// (control characters other than tab, newline, carriage return) become U+FFFD.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            '\t' | '\n' | '\r' => escaped.push(c),
            c if c.is_control() => escaped.push('\u{FFFD}'),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup_quotes_and_control_characters() {
        assert_eq!(
            escape(r#"a<b>&"c"'d'"#),
            "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;"
        );
        assert_eq!(escape("tab\there\u{1b}[31m"), "tab\there\u{FFFD}[31m");
    }
}
