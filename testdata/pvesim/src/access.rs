//! The tokens' privileges, as `GET /access/permissions` reports them (F13, F17).
//!
//! Both tokens hold the role the predecessor planned, granted on `/` (F17: it covered clone,
//! config, resize, power, agent read, upload and destroy, but not `Datastore.Allocate`). The main
//! token also holds the seed role (`ProxyOperatorSeeds` in the Phase 0 setup) on
//! `/storage/<id>` for each storage it may delete volumes on. An ACL on a more specific path
//! replaces the inherited one for that user (the Phase 0 ACL caveat), so the seed role repeats
//! AllocateTemplate, AllocateSpace and Audit beside Allocate. The privilege names follow the PVE 9
//! role editor, not a capture.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::api::Token;

/// The role on `/` (F17): no `Datastore.Allocate`, so seed deletes get 403 (F13).
pub(crate) const ROOT_ROLE: &[&str] = &[
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "SDN.Use",
    "VM.Allocate",
    "VM.Audit",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Disk",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.GuestAgent.Audit",
    "VM.PowerMgmt",
];

/// The seed role on `/storage/<id>` (Phase 0: `ProxyOperatorSeeds`).
pub(crate) const SEED_ROLE: &[&str] = &[
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
];

/// The token's ACLs: path → role, `/` first.
fn acls(token: &Token) -> Vec<(String, &'static [&'static str])> {
    let mut acls = vec![("/".to_string(), ROOT_ROLE)];
    acls.extend(
        token
            .allocate_on
            .iter()
            .map(|storage| (format!("/storage/{storage}"), SEED_ROLE)),
    );
    acls
}

/// Whether ACL `acl_path` applies to `path` (the same path or an ancestor of it).
fn covers(acl_path: &str, path: &str) -> bool {
    acl_path == "/"
        || path == acl_path
        || path
            .strip_prefix(acl_path)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The privileges `token` holds at `path`: the role of the most specific ACL covering it.
pub(crate) fn privileges_at(token: &Token, path: &str) -> &'static [&'static str] {
    acls(token)
        .into_iter()
        .filter(|(acl_path, _)| covers(acl_path, path))
        .max_by_key(|(acl_path, _)| acl_path.len())
        .map_or(&[], |(_, role)| role)
}

/// `{privilege: 1}` (1: the ACL propagates).
fn privilege_map(role: &[&str]) -> Value {
    Value::Object(role.iter().map(|p| (p.to_string(), json!(1))).collect())
}

/// The answer of `GET /access/permissions`: for one `path`, `{path: {privilege: 1}}`; without
/// one, every path the token has an ACL on.
pub(crate) fn permissions(token: &Token, path: Option<&str>) -> Value {
    let entries: BTreeMap<String, Value> = match path {
        Some(path) => {
            BTreeMap::from([(path.to_string(), privilege_map(privileges_at(token, path)))])
        }
        None => acls(token)
            .into_iter()
            .map(|(acl_path, role)| (acl_path, privilege_map(role)))
            .collect(),
    };
    json!(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(allocate_on: &[&str]) -> Token {
        Token {
            user: "egress@pve".into(),
            tokenid: "t".into(),
            secret: "s".into(),
            allocate_on: allocate_on.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_most_specific_acl_replaces_the_inherited_one() {
        let main = token(&["proxy-seeds"]);
        assert_eq!(privileges_at(&main, "/storage/proxy-seeds"), SEED_ROLE);
        assert_eq!(privileges_at(&main, "/storage/local"), ROOT_ROLE);
        assert_eq!(privileges_at(&main, "/storage/proxy-seeds-2"), ROOT_ROLE);
        assert_eq!(privileges_at(&main, "/vms/100"), ROOT_ROLE);
        let limited = token(&[]);
        assert!(!privileges_at(&limited, "/storage/proxy-seeds").contains(&"Datastore.Allocate"));
    }

    #[test]
    fn without_a_path_every_acl_is_listed() {
        let answer = permissions(&token(&["proxy-seeds"]), None);
        let paths: Vec<&String> = answer.as_object().unwrap().keys().collect();
        assert_eq!(paths, ["/", "/storage/proxy-seeds"]);
        assert_eq!(answer["/storage/proxy-seeds"]["Datastore.Allocate"], 1);
        assert!(answer["/"].get("Datastore.Allocate").is_none());
    }
}
