//! One Event store seen through two APIs, as on the real server: Events are stored once, in
//! the core `v1` shape, and `events.k8s.io/v1` is a view of the same objects with renamed
//! fields (`note` is `message`, `regarding` is `involvedObject`, `reportingController` is
//! `reportingComponent`, `deprecatedSource`/`deprecatedCount`/`deprecated*Timestamp` are
//! `source`/`count`/`*Timestamp`). An Event recorded through either API is listed, watched and
//! selected through both, under one name, uid and resourceVersion.

use serde_json::{Map, Value};

use crate::resource::ResourceType;

/// The group and plural of the view.
const VIEW: (&str, &str) = ("events.k8s.io", "events");
/// Where its objects are stored: core v1 Events.
const STORAGE: (&str, &str) = ("", "events");

/// Field names as `events.k8s.io/v1` spells them, beside core v1's (the real server's
/// conversion, `pkg/apis/events/v1/conversion.go`). The fields both share (`eventTime`,
/// `series`, `reportingInstance`, `action`, `reason`, `related`, `type`, `metadata`) are kept as
/// they are.
const RENAMED: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn is_view(rt: &ResourceType) -> bool {
    (rt.group.as_str(), rt.plural.as_str()) == VIEW
}

/// The (group, plural) under which objects of `rt` are stored.
pub(crate) fn storage_of(rt: &ResourceType) -> (&str, &str) {
    if is_view(rt) {
        STORAGE
    } else {
        (&rt.group, &rt.plural)
    }
}

fn rename(object: &Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) -> Value {
    let Some(map) = object.as_object() else {
        return object.clone();
    };
    let pairs: Vec<_> = pairs.collect();
    let out: Map<String, Value> = map
        .iter()
        .map(|(k, v)| {
            let name = pairs
                .iter()
                .find(|(from, _)| from == k)
                .map_or(k.as_str(), |(_, to)| to);
            (name.to_string(), v.clone())
        })
        .collect();
    Value::Object(out)
}

/// A stored object as `rt` shows it (the `apiVersion` is set by the caller).
pub(crate) fn to_view(rt: &ResourceType, stored: &Value) -> Value {
    if is_view(rt) {
        rename(stored, RENAMED.iter().map(|(view, core)| (*core, *view)))
    } else {
        stored.clone()
    }
}

/// An object written through `rt`, in the shape it is stored in.
pub(crate) fn to_storage(rt: &ResourceType, written: &Value) -> Value {
    if !is_view(rt) {
        return written.clone();
    }
    let mut out = rename(written, RENAMED.iter().copied());
    if let Some(map) = out.as_object_mut()
        && map.contains_key("apiVersion")
    {
        map.insert("apiVersion".into(), Value::String("v1".into()));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn view() -> ResourceType {
        ResourceType::namespaced("events.k8s.io", "v1", "Event", "events")
    }

    #[test]
    fn the_view_renames_fields_both_ways_and_keeps_the_rest() {
        let written = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "Proxy", "name": "web"},
            "note": "VM created", "reason": "Created", "type": "Normal", "action": "Create",
            "reportingController": "egress-operator", "reportingInstance": "pod-0",
            "eventTime": "2025-01-01T00:00:00.000000Z",
            "series": {"count": 2, "lastObservedTime": "2025-01-01T00:00:01.000000Z"},
            "deprecatedSource": {"component": "old"}, "deprecatedCount": 3,
            "deprecatedFirstTimestamp": "2025-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2025-01-01T00:00:02Z",
        });
        let stored = to_storage(&view(), &written);
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "web");
        assert_eq!(stored["message"], "VM created");
        assert_eq!(stored["reportingComponent"], "egress-operator");
        assert_eq!(stored["source"]["component"], "old");
        assert_eq!(stored["count"], 3);
        assert_eq!(stored["firstTimestamp"], "2025-01-01T00:00:00Z");
        assert_eq!(stored["lastTimestamp"], "2025-01-01T00:00:02Z");
        for kept in [
            "reason",
            "type",
            "action",
            "reportingInstance",
            "eventTime",
            "series",
        ] {
            assert_eq!(stored[kept], written[kept], "{kept}");
        }
        for gone in [
            "regarding",
            "note",
            "reportingController",
            "deprecatedCount",
        ] {
            assert!(stored.get(gone).is_none(), "{gone}");
        }
        let mut back = to_view(&view(), &stored);
        back["apiVersion"] = json!("events.k8s.io/v1");
        assert_eq!(back, written);
    }

    #[test]
    fn other_kinds_are_stored_as_written() {
        let core = ResourceType::namespaced("", "v1", "Event", "events");
        let object = json!({"apiVersion": "v1", "kind": "Event", "message": "m"});
        assert_eq!(to_storage(&core, &object), object);
        assert_eq!(to_view(&core, &object), object);
        assert_eq!(storage_of(&view()), ("", "events"));
        assert_eq!(storage_of(&core), ("", "events"));
    }
}
