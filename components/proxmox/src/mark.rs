//! The ownership mark, written as the VM's description in the clone call (F10) and read back from
//! its config. A clone copies the template's `meta`, so the mark carries its own creation time
//! (F11). It also carries the request's tags, which Proxmox's tag syntax cannot hold (F9: no `=`).
//!
//! ```text
//! egress-operator: managed
//! uid: 6c1f0a2e-…
//! created-at: 2026-09-18T15:02:00Z
//! tag: egress.io/pool=blue
//! ```
//!
//! The first line is the header that makes a description a mark; a description without it is not
//! ours. A mark without a `uid:` line reads as an empty UID, not as "unmanaged" (Phase 5).

/// The first line of every mark.
pub const HEADER: &str = "egress-operator: managed";

/// A parsed mark.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub uid: String,
    pub created_at: Option<String>,
    /// `(key, value)` pairs, in order.
    pub tags: Vec<(String, String)>,
}

/// Replace line breaks so a value cannot forge another line of the mark.
fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

impl Mark {
    /// The description text for this mark.
    pub fn format(&self) -> String {
        let mut text = format!("{HEADER}\nuid: {}\n", one_line(&self.uid));
        if let Some(created_at) = &self.created_at {
            text.push_str(&format!("created-at: {}\n", one_line(created_at)));
        }
        for (key, value) in &self.tags {
            text.push_str(&format!("tag: {}={}\n", one_line(key), one_line(value)));
        }
        text
    }

    /// Read a mark from a VM description; `None` when the description is not a mark.
    pub fn parse(description: Option<&str>) -> Option<Mark> {
        let mut lines = description?.lines().map(|line| line.trim_end_matches('\r'));
        if lines.next()?.trim() != HEADER {
            return None;
        }
        let mut mark = Mark::default();
        for line in lines {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match key.trim() {
                "uid" => mark.uid = value.to_string(),
                "created-at" if !value.is_empty() => mark.created_at = Some(value.to_string()),
                "tag" => {
                    if let Some((tag_key, tag_value)) = value.split_once('=') {
                        mark.tags.push((tag_key.to_string(), tag_value.to_string()));
                    }
                }
                _ => {}
            }
        }
        Some(mark)
    }

    /// Whether the mark carries the tag `key=value`.
    pub fn has_tag(&self, key: &str, value: &str) -> bool {
        self.tags.iter().any(|(k, v)| k == key && v == value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f10_f11_mark_round_trips_with_uid_time_and_tags() {
        let mark = Mark {
            uid: "6c1f0a2e-1111".into(),
            created_at: Some("2026-09-18T15:02:00Z".into()),
            tags: vec![
                ("egress.io/pool".into(), "blue".into()),
                ("team".into(), "a=b".into()),
            ],
        };
        let text = mark.format();
        assert_eq!(
            text,
            "egress-operator: managed\nuid: 6c1f0a2e-1111\ncreated-at: 2026-09-18T15:02:00Z\ntag: egress.io/pool=blue\ntag: team=a=b\n"
        );
        assert_eq!(Mark::parse(Some(&text)), Some(mark.clone()));
        assert!(mark.has_tag("team", "a=b") && !mark.has_tag("team", "a"));
    }

    #[test]
    fn phase5_mark_without_uid_line_is_an_empty_uid_not_unmanaged() {
        let mark = Mark::parse(Some(
            "egress-operator: managed\ncreated-at: 2026-01-01T00:00:00Z\n",
        ))
        .unwrap();
        assert_eq!(mark.uid, "");
        assert_eq!(mark.created_at.as_deref(), Some("2026-01-01T00:00:00Z"));
    }

    #[test]
    fn descriptions_without_the_header_are_not_marks() {
        for text in [
            None,
            Some(""),
            Some("uid: 6c1f\n"),
            Some("my notes\negress-operator: managed\nuid: x"),
        ] {
            assert_eq!(Mark::parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn crlf_and_padding_are_tolerated_and_newlines_cannot_forge_lines() {
        let mark = Mark::parse(Some("egress-operator: managed\r\nuid:  abc \r\n")).unwrap();
        assert_eq!(mark.uid, "abc");
        let forged = Mark {
            uid: "a\nuid: b".into(),
            created_at: None,
            tags: vec![],
        }
        .format();
        assert_eq!(Mark::parse(Some(&forged)).unwrap().uid, "a uid: b");
    }
}
