//! The ownership mark: one element in the metadata namespace of the grant's owner, which the host
//! chooses (so a provider of another owner can neither read nor forge it, and a ProviderConfig
//! renamed keeps its marks).
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
        let returned = r#"<egress:proxy xmlns:egress="https://egress-operator.io/owner/egress-operator" uid="u1" created-at="2026-01-01T00:00:00Z">
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
}
