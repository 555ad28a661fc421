//! Form/query parameters with the schema checks Proxmox applies before a handler runs.

use std::collections::BTreeMap;

use crate::reply::{ApiError, MISSING, NOT_IN_SCHEMA};

/// Parameters merged from the query string and a form-encoded body.
#[derive(Debug, Default, Clone)]
pub(crate) struct Params(pub BTreeMap<String, String>);

impl Params {
    pub fn parse(query: Option<&str>, form_body: &[u8]) -> Self {
        let mut map = BTreeMap::new();
        for source in [query.unwrap_or_default().as_bytes(), form_body] {
            for (key, value) in form_urlencoded::parse(source) {
                map.insert(key.into_owned(), value.into_owned());
            }
        }
        Params(map)
    }

    /// Rejects any parameter outside `allowed` (`additionalProperties => 0`).
    pub fn allow(&self, allowed: &[&str]) -> Result<(), ApiError> {
        self.allow_if(|key| allowed.contains(&key))
    }

    pub fn allow_if(&self, allowed: impl Fn(&str) -> bool) -> Result<(), ApiError> {
        match self.0.keys().find(|k| !allowed(k)) {
            Some(key) => Err(ApiError::param(key, NOT_IN_SCHEMA)),
            None => Ok(()),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn required(&self, key: &str) -> Result<&str, ApiError> {
        self.get(key).ok_or_else(|| ApiError::param(key, MISSING))
    }

    /// A Proxmox boolean (`0/1`, `yes/no`, `on/off`, `true/false`).
    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match value.to_ascii_lowercase().as_str() {
            "1" | "yes" | "on" | "true" => Ok(Some(true)),
            "0" | "no" | "off" | "false" => Ok(Some(false)),
            _ => Err(ApiError::param(
                key,
                format!("type check ('boolean') failed - got '{value}'"),
            )),
        }
    }
}

/// Parses a VMID as pve-vmid does (100 ..= 999_999_999).
pub(crate) fn parse_vmid(key: &str, text: &str) -> Result<u32, ApiError> {
    text.parse::<u32>()
        .ok()
        .filter(|id| (100..=999_999_999).contains(id) && !text.starts_with('0'))
        .ok_or_else(|| ApiError::format(key, "value does not look like a valid VM ID"))
}

/// The dns-name format `name` must have (F10: a 22-character `proxy-<base32>` passes).
pub(crate) fn is_dns_name(name: &str) -> bool {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    !name.is_empty() && name.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_body_merge_and_unknowns_are_refused() {
        let params = Params::parse(Some("a=1"), b"b=x%0Ay&c=2");
        assert_eq!(params.get("b"), Some("x\ny"));
        let err = params.allow(&["a", "b"]).unwrap_err();
        assert_eq!(err.errors.unwrap()["c"], NOT_IN_SCHEMA);
    }

    #[test]
    fn vmids_and_names() {
        assert_eq!(parse_vmid("vmid", "199999").unwrap(), 199_999);
        for bad in ["99", "abc", "0100", ""] {
            assert!(parse_vmid("vmid", bad).is_err(), "{bad}");
        }
        assert!(is_dns_name("proxy-abcdefghijklmnop"));
        assert!(!is_dns_name("bad_name"));
        assert!(!is_dns_name("-x"));
    }
}
