//! What an adapter decides beside the plan: how many of a plan's creates to make now.

use crate::Member;

/// How many of a plan's `planned` creates to make in this pass. Without `spread`, all of them.
/// With it, one, and none while a sibling holding a VM has not reported its host yet: a
/// placement request's avoid-list is only as complete as what has landed.
pub fn creates_now(spread: bool, members: &[Member], planned: usize) -> usize {
    if !spread {
        return planned;
    }
    let unplaced = members
        .iter()
        .any(|member| !member.deleting && member.host.is_none() && member.pending.is_none());
    if unplaced { 0 } else { planned.min(1) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Health;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn member(host: Option<&str>, pending: Option<&str>, deleting: bool) -> Member {
        Member {
            name: "m".into(),
            template_hash: "h".into(),
            created: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            ready_since: None,
            deleting,
            health: Health::Unknown,
            host: host.map(Into::into),
            pending: pending.map(Into::into),
        }
    }

    #[test]
    fn without_spread_every_create_is_made_at_once() {
        assert_eq!(creates_now(false, &[member(None, None, false)], 3), 3);
    }

    #[test]
    fn with_spread_one_create_a_pass_once_every_sibling_has_landed() {
        let landed = member(Some("pv1"), None, false);
        let pending = member(None, Some("no host"), false);
        let going = member(None, None, true);
        assert_eq!(creates_now(true, &[landed.clone(), pending, going], 3), 1);
        assert_eq!(creates_now(true, &[], 0), 0);
        let unplaced = member(None, None, false);
        assert_eq!(creates_now(true, &[landed, unplaced], 2), 0);
    }
}
