//! The contract's ownership rules (docs/contract.md, "The same rules for any backend") for a
//! backend that keeps key/value labels on its VMs (a cloud API's labels or tags, an inventory's
//! metadata): the mark as labels, and the create, delete and provider-ID rules every provider
//! follows, whatever its backend.

use std::collections::BTreeMap;

use crate::contract::Problem;
use crate::errors::ErrorClass;
use crate::time;

/// The label that says the operator made the VM, and its value.
pub const MANAGED_BY: (&str, &str) = ("managed-by", "egress-operator");
/// The label holding the Proxy's UID.
pub const UID_LABEL: &str = "egress-uid";
/// The label holding the creation time, RFC 3339 UTC.
pub const CREATED_AT_LABEL: &str = "created-at";
/// The prefix of a tag's label: `tag.<key>=<value>`.
pub const TAG_PREFIX: &str = "tag.";

/// The ownership mark: written once, when the provider creates the VM, and read back by `get`,
/// `list-by-tag` and an adopting `create`. A VM without it is not ours, whatever its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub uid: String,
    /// When the provider created the VM; a mark without it answers no `created-at`.
    pub created_at: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl Mark {
    /// The mark of a VM created now for the Proxy `uid` with `tags` (`created-at` from the wall
    /// clock: the provider writes it, the operator only reads it).
    pub fn new<'a>(uid: &str, tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> Mark {
        Mark {
            uid: uid.to_string(),
            created_at: Some(time::now_rfc3339()),
            tags: tags
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The mark as labels: `managed-by=egress-operator`, `egress-uid`, `created-at`, `tag.<key>`.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
            (UID_LABEL.to_string(), self.uid.clone()),
        ]);
        if let Some(created_at) = &self.created_at {
            labels.insert(CREATED_AT_LABEL.to_string(), created_at.clone());
        }
        for (key, value) in &self.tags {
            labels.insert(format!("{TAG_PREFIX}{key}"), value.clone());
        }
        labels
    }

    /// The mark in `labels`, or `None` when they do not say the operator made the VM.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Option<Mark> {
        (labels.get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)).then(|| Mark {
            uid: labels.get(UID_LABEL).cloned().unwrap_or_default(),
            created_at: labels.get(CREATED_AT_LABEL).cloned(),
            tags: labels
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(TAG_PREFIX)?.to_string(), v.clone())))
                .collect(),
        })
    }

    /// For `#[serde(rename = "labels", deserialize_with = "Mark::from_labels_field")]` on an
    /// `Option<Mark>`: the mark in a VM's labels, `None` when they are not ours.
    pub fn from_labels_field<'de, D: serde::Deserializer<'de>>(
        labels: D,
    ) -> Result<Option<Mark>, D::Error> {
        Ok(Mark::from_labels(&serde::Deserialize::deserialize(labels)?))
    }

    /// The label `tag.<key>=<value>` a `list-by-tag` selects on.
    pub fn tag_label(key: &str, value: &str) -> String {
        format!("{TAG_PREFIX}{key}={value}")
    }
}

/// `create`'s rule, idempotent by name, for a VM already named `name`: with our mark and this
/// `uid` it is adopted (`Ok`); with another UID, or without our mark, it is `permanent`.
pub fn adopt(name: &str, uid: &str, mark: Option<&Mark>) -> Result<(), Problem> {
    match mark {
        Some(mark) if mark.uid == uid => Ok(()),
        Some(_) => Err(Problem::permanent(format!(
            "VM `{name}` exists for another Proxy"
        ))),
        None => Err(Problem::permanent(format!(
            "VM `{name}` exists without our mark"
        ))),
    }
}

/// `delete`'s rule: a VM without our mark (`mark`) is never deleted, `permanent`. (One with our
/// mark is deleted whatever UID it carries: the operator passes only IDs this provider answered.)
pub fn deletable(mark: Option<&Mark>, provider_id: &str) -> Result<(), Problem> {
    match mark {
        Some(_) => Ok(()),
        None => Err(Problem::permanent(format!(
            "{provider_id} lacks our mark: not deleting it"
        ))),
    }
}

/// A VM that is gone is `Ok(None)`, for `delete` (gone is success) and reads that may race one.
pub fn unless_gone<T>(result: Result<T, Problem>) -> Result<Option<T>, Problem> {
    match result {
        Err(problem) if problem.class == ErrorClass::NotFound => Ok(None),
        answer => answer.map(Some),
    }
}

/// The digits of a provider ID `<prefix><digits>`. Any other shape names no VM this provider
/// made: `not-found`, as `get` answers it. `delete` answers it `permanent` instead: an ID it never
/// made could be an older version's, and success would leak that VM.
pub fn numeric_id<'a>(provider_id: &'a str, prefix: &str) -> Result<&'a str, Problem> {
    let digits = |id: &&str| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
    let id = provider_id.strip_prefix(prefix).filter(digits);
    id.ok_or_else(|| {
        Problem::not_found(format!(
            "`{provider_id}` is not of the form {prefix}<digits>"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_round_trips_through_labels_and_foreign_labels_are_no_mark() {
        let mark = Mark {
            uid: "uid-1".into(),
            created_at: Some("2026-09-18T15:02:00Z".into()),
            tags: BTreeMap::from([("team".into(), "a=b".into())]),
        };
        let labels = mark.labels();
        assert_eq!(labels["managed-by"], "egress-operator");
        assert_eq!(labels["tag.team"], "a=b");
        assert_eq!(Mark::from_labels(&labels), Some(mark.clone()));
        let field = serde_json::to_value(&labels).unwrap();
        assert_eq!(Mark::from_labels_field(field).unwrap(), Some(mark));
        let foreign = BTreeMap::from([("managed-by".to_string(), "someone".to_string())]);
        assert_eq!(Mark::from_labels(&foreign), None);
        assert_eq!(Mark::tag_label("team", "a=b"), "tag.team=a=b");
    }

    #[test]
    fn create_adopts_only_its_own_uid() {
        let ours = Mark {
            uid: "u".into(),
            ..Mark::default()
        };
        assert_eq!(adopt("a", "u", Some(&ours)), Ok(()));
        for mark in [
            Some(&Mark {
                uid: "v".into(),
                ..Mark::default()
            }),
            None,
        ] {
            assert_eq!(
                adopt("a", "u", mark).unwrap_err().class,
                ErrorClass::Permanent
            );
        }
    }

    #[test]
    fn only_a_marked_vm_is_deletable() {
        assert_eq!(deletable(Some(&Mark::default()), "inv/1"), Ok(()));
        assert_eq!(
            deletable(None, "inv/1").unwrap_err().class,
            ErrorClass::Permanent
        );
    }

    #[test]
    fn gone_is_none_and_other_problems_stay() {
        assert_eq!(unless_gone::<u8>(Err(Problem::not_found("x"))), Ok(None));
        assert_eq!(unless_gone(Ok(1)), Ok(Some(1)));
        assert!(unless_gone::<u8>(Err(Problem::permanent("x"))).is_err());
    }

    #[test]
    fn only_prefix_and_digits_are_ids() {
        assert_eq!(numeric_id("inv/12", "inv/"), Ok("12"));
        for malformed in ["inv/", "inv/../1", "ref/1", "", "inv/+1"] {
            let problem = numeric_id(malformed, "inv/").unwrap_err();
            assert_eq!(problem.class, ErrorClass::NotFound, "{malformed}");
        }
    }
}
