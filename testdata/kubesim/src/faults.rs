//! Fault injection and the request log, both settable and readable while the server runs.

use std::sync::Mutex;

/// What an injected fault does instead of serving the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this HTTP status and a `metav1.Status` body (reason `InternalError` for 500,
    /// `ServiceUnavailable` for 503, `TooManyRequests` for 429, `Timeout` for 504).
    Status(u16),
    /// Close the connection without answering.
    Drop,
}

/// A rule: the next `times` requests matching `method` and `path` get `action`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    /// HTTP method, upper case, or `*` for any.
    pub method: String,
    /// Path pattern: `*` stands for one segment, a final `**` for any rest, e.g.
    /// `/api/v1/namespaces/*/configmaps/**`. The query string is not matched.
    pub path: String,
    /// How many matching requests it still hits.
    pub times: u32,
    /// What it does to them.
    pub action: FaultAction,
}

impl FaultRule {
    fn matches(&self, method: &str, path: &str) -> bool {
        (self.method == "*" || self.method.eq_ignore_ascii_case(method))
            && path_matches(&self.path, path)
    }
}

/// Whether a path matches a pattern of segments, `*` and a trailing `**`.
fn path_matches(pattern: &str, path: &str) -> bool {
    let mut want = pattern.trim_matches('/').split('/');
    let mut have = path.trim_matches('/').split('/');
    loop {
        match (want.next(), have.next()) {
            (Some("**"), _) => return true,
            (None, None) => return true,
            (Some(w), Some(h)) if w == "*" || w == h => {}
            _ => return false,
        }
    }
}

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path, without the query.
    pub path: String,
    /// The raw query string, empty if none.
    pub query: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The status answered; 0 when an injected fault dropped the connection.
    pub status: u16,
}

/// The live fault rules.
#[derive(Debug, Default)]
pub(crate) struct Faults(Mutex<Vec<FaultRule>>);

impl Faults {
    pub(crate) fn add(&self, rule: FaultRule) {
        crate::lock(&self.0).push(rule);
    }

    /// The action for this request, if a rule hits it; spends one of that rule's hits.
    pub(crate) fn take(&self, method: &str, path: &str) -> Option<FaultAction> {
        let mut rules = crate::lock(&self.0);
        let index = rules
            .iter()
            .position(|r| r.times > 0 && r.matches(method, path))?;
        let rule = &mut rules[index];
        rule.times -= 1;
        let action = rule.action;
        if rule.times == 0 {
            rules.remove(index);
        }
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::path_matches;

    #[test]
    fn patterns_match_segments() {
        assert!(path_matches(
            "/api/v1/namespaces/*/configmaps",
            "/api/v1/namespaces/a/configmaps"
        ));
        assert!(!path_matches(
            "/api/v1/namespaces/*/configmaps",
            "/api/v1/namespaces/a/configmaps/b"
        ));
        assert!(path_matches(
            "/apis/**",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/b"
        ));
        assert!(!path_matches("/api/v1/*", "/api/v1"));
    }
}
