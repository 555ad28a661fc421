//! The ownership mark: one element in the provider's own metadata namespace, which the host
//! chooses from the provider's identity (so no other provider can read or forge it).
//!
//! ```xml
//! <proxy uid="6c1f0a2e-…" created-at="2026-09-18T15:02:00Z">
//!   <tag key="egress.io/pool" value="blue"/>
//! </proxy>
//! ```
//!
//! The provider writes it without a namespace; libvirt hands it back with the host's prefix and
//! namespace, so reading matches local names only. A domain without the element is not ours; an
//! element without a `uid` reads as an empty UID (the adoption guard refuses both).

use crate::domain_xml::escape;

/// The mark's element name.
const ELEMENT: &str = "proxy";

/// A parsed mark.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// The Proxy UID.
    pub uid: String,
    /// When create made the VM (RFC 3339).
    pub created_at: Option<String>,
    /// `(key, value)` pairs, in order.
    pub tags: Vec<(String, String)>,
}

impl Mark {
    /// The element `set-metadata` takes.
    pub fn format(&self) -> String {
        let mut xml = format!("<{ELEMENT} uid=\"{}\"", escape(&self.uid));
        if let Some(created_at) = &self.created_at {
            xml.push_str(&format!(" created-at=\"{}\"", escape(created_at)));
        }
        xml.push('>');
        for (key, value) in &self.tags {
            xml.push_str(&format!(
                "<tag key=\"{}\" value=\"{}\"/>",
                escape(key),
                escape(value)
            ));
        }
        xml.push_str(&format!("</{ELEMENT}>"));
        xml
    }

    /// Reads a mark from the metadata element libvirt returned; `None` when there is none or it
    /// is not a mark.
    pub fn parse(metadata: Option<&str>) -> Option<Mark> {
        let document = roxmltree::Document::parse(metadata?).ok()?;
        let root = document.root_element();
        if root.tag_name().name() != ELEMENT {
            return None;
        }
        let tags = root
            .children()
            .filter(|node| node.is_element() && node.tag_name().name() == "tag")
            .filter_map(|node| {
                Some((
                    node.attribute("key")?.to_owned(),
                    node.attribute("value")?.to_owned(),
                ))
            })
            .collect();
        Some(Mark {
            uid: root.attribute("uid").unwrap_or_default().to_owned(),
            created_at: root.attribute("created-at").map(str::to_owned),
            tags,
        })
    }

    /// Whether the mark carries the tag `key=value`.
    pub fn has_tag(&self, key: &str, value: &str) -> bool {
        self.tags.iter().any(|(k, v)| k == key && v == value)
    }
}

/// Seconds since the Unix epoch as RFC 3339 UTC (`2026-09-18T15:02:00Z`), for `created-at`.
/// Howard Hinnant's days-to-civil algorithm, so no date crate is needed.
pub fn rfc3339(unix_seconds: u64) -> String {
    let days = unix_seconds / 86_400;
    let second = unix_seconds % 86_400;
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second / 3_600,
        second % 3_600 / 60,
        second % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark() -> Mark {
        Mark {
            uid: "6c1f0a2e-0000-4000-8000-000000000001".into(),
            created_at: Some("2026-09-18T15:02:00Z".into()),
            tags: vec![
                ("egress.io/pool".into(), "blue".into()),
                ("a\"<".into(), "&'".into()),
            ],
        }
    }

    #[test]
    fn a_mark_round_trips_including_what_needs_escaping() {
        assert_eq!(Mark::parse(Some(&mark().format())), Some(mark()));
    }

    /// What libvirt hands back: the host's prefix and namespace on the element.
    #[test]
    fn the_namespaced_element_libvirt_returns_is_read() {
        let returned = r#"<egress:proxy xmlns:egress="https://egress-operator.io/provider/kvm2" uid="u1" created-at="2026-01-01T00:00:00Z">
  <egress:tag key="k" value="v"/>
</egress:proxy>"#;
        let mark = Mark::parse(Some(returned)).unwrap();
        assert_eq!(mark.uid, "u1");
        assert!(mark.has_tag("k", "v"));
        assert!(!mark.has_tag("k", "w"));
    }

    #[test]
    fn what_is_not_a_mark_reads_as_none_and_a_missing_uid_as_empty() {
        for metadata in [None, Some(""), Some("<other uid='x'/>"), Some("<proxy")] {
            assert_eq!(Mark::parse(metadata), None, "{metadata:?}");
        }
        assert_eq!(Mark::parse(Some("<proxy/>")).unwrap().uid, "");
    }

    // Expected values computed independently with GNU date -u -d @<seconds>.
    #[test]
    fn created_at_is_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_790_145_676), "2026-09-23T06:41:16Z");
    }
}
