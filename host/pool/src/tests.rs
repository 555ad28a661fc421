//! The planner's rules one by one, then a small world stepped through rollouts (members become
//! Ready a few steps after they are made, in an order a fixed seed shuffles), checking the two
//! rollout bounds at every step.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::*;
use egress_crd::{
    IntOrString, PoolStrategy, ProxyPool, ProxyPoolSpec, ProxySpec, RollingUpdate, Spread,
    SpreadAcross, SpreadPolicy, StrategyType, UserData, template_hash,
};

/// A template hash no current template has.
const OLD: &str = "0000000old";

fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + seconds).unwrap())
}

fn pool(replicas: i32) -> ProxyPool {
    let template = ProxySpec {
        provider_config_ref: "pve".into(),
        ..ProxySpec::default()
    };
    let mut pool = ProxyPool::new("edge", ProxyPoolSpec::new(replicas, template));
    pool.metadata.namespace = Some("team-a".into());
    pool.metadata.generation = Some(1);
    pool
}

fn rolling(mut pool: ProxyPool, surge: IntOrString, unavailable: IntOrString) -> ProxyPool {
    pool.spec.strategy = PoolStrategy {
        type_: StrategyType::RollingUpdate,
        rolling_update: Some(RollingUpdate {
            max_surge: surge,
            max_unavailable: unavailable,
        }),
    };
    pool
}

fn int(count: i32) -> IntOrString {
    IntOrString::Int(count)
}

fn percent(text: &str) -> IntOrString {
    IntOrString::String(text.into())
}

fn hash(pool: &ProxyPool) -> String {
    template_hash(&pool.spec.template)
}

/// A template change: the user-data of the next version.
fn change_template(pool: &mut ProxyPool, version: u32) {
    pool.spec.template.spec.user_data = Some(UserData {
        inline: Some(format!("#cloud-config\n# v{version}\n")),
        ..UserData::default()
    });
}

/// A member made at `created` seconds, Ready since then if `ready`.
fn member(name: &str, template_hash: &str, created: i64, ready: bool) -> Member {
    Member {
        name: name.into(),
        template_hash: template_hash.into(),
        created: at(created),
        ready_since: ready.then(|| at(created)),
        deleting: false,
        health: if ready {
            Health::Healthy
        } else {
            Health::Starting
        },
        host: None,
        pending: None,
    }
}

/// `count` Ready members of `template_hash`, named `prefix-0…`, made a second apart.
fn ready_members(prefix: &str, template_hash: &str, count: usize) -> Vec<Member> {
    (0..count)
        .map(|i| member(&format!("{prefix}-{i}"), template_hash, i as i64, true))
        .collect()
}

fn deleted(plan: &Plan) -> Vec<(&str, DeleteReason)> {
    let deletes = plan.delete.iter();
    deletes
        .map(|delete| (delete.name.as_str(), delete.reason))
        .collect()
}

fn condition<'a>(plan: &'a Plan, kind: &str) -> &'a Condition {
    let conditions = &plan.status.conditions;
    conditions
        .iter()
        .find(|c| c.type_ == kind)
        .unwrap_or_else(|| panic!("{kind} is set"))
}

/// The pool with the status `plan` wrote, as the next pass reads it.
fn written(mut pool: ProxyPool, plan: &Plan) -> ProxyPool {
    pool.status = Some(plan.status.clone());
    pool
}

#[test]
fn an_empty_pool_makes_replicas_members_of_the_current_template() {
    let pool = pool(3);
    let plan = plan(&pool, &[], &at(100));
    assert_eq!(plan.create.len(), 3);
    for create in &plan.create {
        assert_eq!(create.template_hash, hash(&pool));
        assert_eq!(create.placement, None);
    }
    assert!(plan.delete.is_empty());
    assert_eq!(
        condition(&plan, PROGRESSING).reason,
        reasons::REPLICAS_UPDATED
    );
    assert_eq!(plan.status.last_progress_time, Some(at(100)));
}

#[test]
fn a_settled_pool_does_nothing_and_writes_its_counts() {
    let pool = pool(3);
    let members = ready_members("edge", &hash(&pool), 3);
    let plan = plan(&pool, &members, &at(100));
    assert!(plan.create.is_empty() && plan.delete.is_empty() && plan.retry.is_empty());
    let status = &plan.status;
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.updated_replicas
        ),
        (3, 3, 3)
    );
    assert_eq!(
        (status.available_replicas, status.unavailable_replicas),
        (3, 0)
    );
    assert_eq!(
        status.selector.as_deref(),
        Some("egress-operator.io/pool=edge")
    );
    assert_eq!(status.template_hash.as_deref(), Some(hash(&pool).as_str()));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.last_progress_time, None, "no change under way");
    let progressing = condition(&plan, PROGRESSING);
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", reasons::ROLLOUT_COMPLETE)
    );
    assert_eq!(condition(&plan, AVAILABLE).status, "True");
    assert_eq!(condition(&plan, REMEDIATION_HALTED).status, "False");
    assert!(
        plan.status
            .conditions
            .iter()
            .all(|c| c.type_ != PLACEMENT_SHORTAGE)
    );
}

#[test]
fn scaling_up_is_not_held_to_the_surge() {
    let pool = pool(5);
    let members = ready_members("edge", &hash(&pool), 3);
    assert_eq!(plan(&pool, &members, &at(100)).create.len(), 2);
}

#[test]
fn members_being_deleted_count_against_the_surge_until_gone() {
    let pool = rolling(pool(3), int(0), int(1));
    let mut members = ready_members("edge", &hash(&pool), 3);
    members[0].deleting = true;
    // Two live and one going: with no surge, the third is made once the going one is gone.
    assert!(plan(&pool, &members, &at(100)).create.is_empty());
    let pool = rolling(pool, int(1), int(0));
    assert_eq!(plan(&pool, &members, &at(100)).create.len(), 1);
}

#[test]
fn scaling_in_deletes_not_ready_members_first_then_older_templates_then_the_oldest() {
    let pool = pool(2);
    let current = hash(&pool);
    let members = vec![
        member("oldest-current", &current, 1, true),
        member("old-template", OLD, 5, true),
        member("newest-current", &current, 9, true),
        member("not-ready", &current, 8, false),
        member("older-current", &current, 2, true),
    ];
    let plan = plan(&pool, &members, &at(100));
    assert_eq!(
        deleted(&plan),
        [
            ("not-ready", DeleteReason::ScaleIn),
            ("old-template", DeleteReason::ScaleIn),
            ("oldest-current", DeleteReason::ScaleIn),
        ]
    );
    assert!(plan.create.is_empty());
}

#[test]
fn scaling_to_zero_deletes_every_member_and_completes() {
    let pool = pool(0);
    let members = ready_members("edge", &hash(&pool), 3);
    let plan = plan(&pool, &members, &at(100));
    assert_eq!(plan.delete.len(), 3);
    assert!(plan.create.is_empty());
    let gone: Vec<Member> = Vec::new();
    let after = super::plan(&written(pool, &plan), &gone, &at(110));
    assert_eq!(
        condition(&after, PROGRESSING).reason,
        reasons::ROLLOUT_COMPLETE
    );
}

#[test]
fn a_rolling_update_with_surge_one_makes_one_new_member_and_keeps_every_old_one_until_it_is_ready()
{
    let mut pool = rolling(pool(3), int(1), int(0));
    let old = ready_members("old", OLD, 3);
    change_template(&mut pool, 2);
    let plan = plan(&pool, &old, &at(100));
    assert_eq!(plan.create.len(), 1);
    assert!(plan.delete.is_empty());
    let mut members = old.clone();
    members.push(member("new-0", &hash(&pool), 100, false));
    let plan = super::plan(&written(pool.clone(), &plan), &members, &at(110));
    assert!(plan.create.is_empty(), "four hold a VM: the surge is used");
    assert!(
        plan.delete.is_empty(),
        "no old one goes before a new one is Ready"
    );
    members[3].ready_since = Some(at(115));
    let plan = super::plan(&written(pool, &plan), &members, &at(120));
    assert_eq!(
        deleted(&plan),
        [("old-0", DeleteReason::Rollout)],
        "the oldest old one"
    );
    assert!(plan.create.is_empty(), "the old one still holds its VM");
}

#[test]
fn a_rolling_update_with_unavailable_one_deletes_an_old_member_first() {
    let mut pool = rolling(pool(3), int(0), int(1));
    change_template(&mut pool, 2);
    let plan = plan(&pool, &ready_members("old", OLD, 3), &at(100));
    assert_eq!(deleted(&plan), [("old-0", DeleteReason::Rollout)]);
    assert!(
        plan.create.is_empty(),
        "no surge: the new one waits for the old one to go"
    );
}

#[test]
fn percents_round_the_surge_up_and_the_unavailable_down() {
    // 10 replicas, 25% each: a surge of 3 (2.5 up) and 2 unavailable (2.5 down).
    let mut pool = rolling(pool(10), percent("25%"), percent("25%"));
    change_template(&mut pool, 2);
    let plan = plan(&pool, &ready_members("old", OLD, 10), &at(100));
    assert_eq!(plan.create.len(), 3);
    assert_eq!(plan.delete.len(), 2);
    assert!(
        plan.delete
            .iter()
            .all(|d| d.reason == DeleteReason::Rollout)
    );
}

#[test]
fn a_surge_and_unavailable_both_zero_resolve_to_one_unavailable() {
    // 10% of 3 is 0 rounded down; with no surge, Kubernetes makes the unavailable 1.
    let mut pool = rolling(pool(3), percent("0%"), percent("10%"));
    change_template(&mut pool, 2);
    let plan = plan(&pool, &ready_members("old", OLD, 3), &at(100));
    assert_eq!(deleted(&plan), [("old-0", DeleteReason::Rollout)]);
    assert_eq!(
        condition(&plan, AVAILABLE).message,
        "3 of 3 Ready; at least 2 wanted"
    );
}

#[test]
fn old_members_not_ready_go_first_while_enough_members_remain() {
    let mut pool = rolling(pool(3), int(1), int(0));
    change_template(&mut pool, 2);
    let mut members = ready_members("old", OLD, 3);
    members[2].ready_since = None;
    members.push(member("new-0", &hash(&pool), 50, true));
    // Four live, three wanted Ready, no new one unready: one may go, the unready old one.
    let plan = plan(&pool, &members, &at(100));
    assert_eq!(deleted(&plan)[0], ("old-2", DeleteReason::Rollout));
    assert_eq!(
        plan.delete.len(),
        1,
        "the ready ones are all needed: 3 Ready, 3 wanted"
    );
}

#[test]
fn an_old_member_not_ready_stays_while_a_new_one_is_not_ready_either() {
    // As a Deployment: the members that may yet serve stay at `replicas - maxUnavailable` plus
    // the new ones still starting, so a not-Ready old member that may recover is kept until the
    // new one is Ready.
    let mut pool = rolling(pool(3), int(1), int(0));
    change_template(&mut pool, 2);
    let mut members = ready_members("old", OLD, 3);
    members[2].ready_since = None;
    members.push(member("new-0", &hash(&pool), 50, false));
    let plan = plan(&pool, &members, &at(100));
    assert!(plan.delete.is_empty(), "{:?}", plan.delete);
    members[3].ready_since = Some(at(90));
    let plan = super::plan(&pool, &members, &at(100));
    assert_eq!(deleted(&plan), [("old-2", DeleteReason::Rollout)]);
}

#[test]
fn recreate_deletes_every_old_member_and_makes_none_while_one_remains() {
    let mut pool = pool(3);
    pool.spec.strategy.type_ = StrategyType::Recreate;
    change_template(&mut pool, 2);
    let plan = plan(&pool, &ready_members("old", OLD, 3), &at(100));
    assert_eq!(plan.delete.len(), 3);
    assert!(
        plan.delete
            .iter()
            .all(|d| d.reason == DeleteReason::Recreate)
    );
    assert!(plan.create.is_empty());
    let mut going = ready_members("old", OLD, 3);
    going.truncate(1);
    going[0].deleting = true;
    assert!(
        super::plan(&pool, &going, &at(110)).create.is_empty(),
        "one old one remains"
    );
    assert_eq!(super::plan(&pool, &[], &at(120)).create.len(), 3);
}

#[test]
fn paused_holds_a_rollout_but_still_scales() {
    let mut pool = rolling(pool(3), int(1), int(1));
    change_template(&mut pool, 2);
    pool.spec.paused = true;
    let old = ready_members("old", OLD, 3);
    let plan = plan(&pool, &old, &at(100));
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    let progressing = condition(&plan, PROGRESSING);
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("Unknown", reasons::ROLLOUT_PAUSED)
    );
    assert_eq!(
        plan.status.last_progress_time, None,
        "the clock stops while paused"
    );
    pool.spec.replicas = 4;
    assert_eq!(
        super::plan(&pool, &old, &at(110)).create.len(),
        1,
        "scaled up"
    );
    pool.spec.replicas = 2;
    let plan = super::plan(&pool, &old, &at(120));
    assert_eq!(
        deleted(&plan),
        [("old-0", DeleteReason::ScaleIn)],
        "scaled in"
    );
}

#[test]
fn a_rollout_without_progress_past_the_deadline_stops_and_says_why() {
    let mut pool = rolling(pool(3), int(1), int(0));
    change_template(&mut pool, 2);
    let mut members = ready_members("old", OLD, 3);
    members.push(member("new-0", &hash(&pool), 0, false));
    let started = plan(&pool, &members, &at(0));
    assert_eq!(started.status.last_progress_time, Some(at(0)));
    let pool = written(pool, &started);
    let within = plan(&pool, &members, &at(600));
    assert_eq!(
        condition(&within, PROGRESSING).reason,
        reasons::REPLICAS_UPDATED
    );
    let past = plan(&pool, &members, &at(601));
    let progressing = condition(&past, PROGRESSING);
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", reasons::PROGRESS_DEADLINE_EXCEEDED)
    );
    assert!(past.create.is_empty() && past.delete.is_empty());
    assert_eq!(
        past.status.last_progress_time,
        Some(at(0)),
        "the clock stays where it stopped"
    );
}

#[test]
fn past_the_deadline_no_surge_member_is_made_but_a_missing_one_is() {
    let mut pool = rolling(pool(3), int(2), int(0));
    change_template(&mut pool, 2);
    let mut members = ready_members("old", OLD, 2);
    members.push(member("new-0", &hash(&pool), 0, false));
    let pool = written(pool.clone(), &plan(&pool, &members, &at(0)));
    let past = plan(&pool, &members, &at(700));
    assert_eq!(
        condition(&past, PROGRESSING).reason,
        reasons::PROGRESS_DEADLINE_EXCEEDED
    );
    // Within the deadline the surge would add two more new ones; past it only the missing third.
    assert_eq!(past.create.len(), 0, "three live: none missing");
    members.remove(0);
    assert_eq!(plan(&pool, &members, &at(700)).create.len(), 1);
}

#[test]
fn a_member_of_the_template_becoming_ready_is_progress() {
    let mut pool = rolling(pool(3), int(1), int(0));
    change_template(&mut pool, 2);
    let mut members = ready_members("old", OLD, 3);
    members.push(member("new-0", &hash(&pool), 0, false));
    let pool = written(pool.clone(), &plan(&pool, &members, &at(0)));
    members[3].ready_since = Some(at(500));
    let plan = plan(&pool, &members, &at(1000));
    assert_eq!(plan.status.last_progress_time, Some(at(500)));
    assert_eq!(
        condition(&plan, PROGRESSING).reason,
        reasons::REPLICAS_UPDATED
    );
    assert_eq!(deleted(&plan), [("old-0", DeleteReason::Rollout)]);
}

#[test]
fn a_template_change_or_the_end_of_a_pause_restarts_the_progress_clock() {
    let mut pool = rolling(pool(3), int(1), int(0));
    change_template(&mut pool, 2);
    let old = ready_members("old", OLD, 3);
    let stuck = written(pool.clone(), &plan(&pool, &old, &at(0)));
    assert_eq!(
        condition(&plan(&stuck, &old, &at(900)), PROGRESSING).reason,
        reasons::PROGRESS_DEADLINE_EXCEEDED
    );
    let mut changed = stuck.clone();
    change_template(&mut changed, 3);
    let plan_changed = plan(&changed, &old, &at(900));
    assert_eq!(plan_changed.status.last_progress_time, Some(at(900)));
    assert_eq!(plan_changed.create.len(), 1);
    let mut paused = stuck.clone();
    paused.spec.paused = true;
    let mut resumed = written(paused.clone(), &plan(&paused, &old, &at(900)));
    resumed.spec.paused = false;
    assert_eq!(
        plan(&resumed, &old, &at(950)).status.last_progress_time,
        Some(at(950))
    );
}

#[test]
fn remediation_replaces_unhealthy_members_within_max_unhealthy() {
    let pool = pool(5); // 40% of 5: 2
    let mut members = ready_members("edge", &hash(&pool), 5);
    for member in &mut members[..2] {
        member.ready_since = None;
        member.health = Health::Unhealthy { since: at(50) };
    }
    let plan = plan(&pool, &members, &at(100));
    assert_eq!(
        deleted(&plan),
        [
            ("edge-0", DeleteReason::Remediation),
            ("edge-1", DeleteReason::Remediation)
        ]
    );
    assert_eq!(
        plan.create.len(),
        1,
        "the surge of 1: the other waits for a VM to go"
    );
    assert_eq!(condition(&plan, REMEDIATION_HALTED).status, "False");
}

#[test]
fn remediation_halts_when_more_members_are_unhealthy_than_max_unhealthy_allows() {
    let pool = pool(5);
    let mut members = ready_members("edge", &hash(&pool), 5);
    for member in &mut members[..3] {
        member.ready_since = None;
        member.health = Health::Unhealthy { since: at(50) };
    }
    let plan = plan(&pool, &members, &at(100));
    assert!(plan.delete.is_empty() && plan.create.is_empty());
    let halted = condition(&plan, REMEDIATION_HALTED);
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("True", reasons::TOO_MANY_UNHEALTHY)
    );
    assert!(
        halted.message.starts_with("3 members are unhealthy"),
        "{}",
        halted.message
    );
    assert!(halted.message.contains("(2)"), "{}", halted.message);
    assert_eq!(condition(&plan, AVAILABLE).status, "False");
}

#[test]
fn members_being_remediated_count_as_unhealthy_until_gone() {
    let pool = pool(5);
    let mut members = ready_members("edge", &hash(&pool), 5);
    for member in &mut members[..3] {
        member.ready_since = None;
        member.health = Health::Unhealthy { since: at(50) };
    }
    members[0].deleting = true;
    let plan = plan(&pool, &members, &at(100));
    assert_eq!(condition(&plan, REMEDIATION_HALTED).status, "True");
    assert!(plan.delete.is_empty());
}

#[test]
fn a_ready_member_is_never_remediated() {
    let pool = pool(3);
    let mut members = ready_members("edge", &hash(&pool), 3);
    members[0].health = Health::Unhealthy { since: at(50) };
    members[1].health = Health::Unknown;
    members[2].health = Health::Starting;
    let plan = plan(&pool, &members, &at(100));
    assert!(plan.delete.is_empty());
}

#[test]
fn the_default_max_unhealthy_rounds_up_so_a_pool_of_one_heals_and_zero_turns_it_off() {
    let mut pool = pool(1);
    let mut members = vec![member("edge-0", &hash(&pool), 0, false)];
    members[0].health = Health::Unhealthy { since: at(10) };
    assert_eq!(
        deleted(&plan(&pool, &members, &at(100))),
        [("edge-0", DeleteReason::Remediation)]
    );
    pool.spec.remediation.max_unhealthy = int(0);
    let off = plan(&pool, &members, &at(100));
    assert!(off.delete.is_empty());
    assert_eq!(condition(&off, REMEDIATION_HALTED).status, "True");
}

#[test]
fn a_create_asks_to_avoid_every_host_a_sibling_still_has_a_vm_on() {
    let mut pool = pool(4);
    pool.spec.spread = Some(Spread {
        across: SpreadAcross::Host,
        policy: SpreadPolicy::Preferred,
    });
    let mut members = ready_members("edge", &hash(&pool), 3);
    members[0].host = Some("pv1-2".into());
    members[1].host = Some("pv1-1".into());
    members[2].host = Some("pv1-2".into());
    members.push(Member {
        deleting: true,
        host: Some("pv1-3".into()),
        ..member("going", &hash(&pool), 9, true)
    });
    let plan = plan(&pool, &members, &at(100));
    let expected = PlacementRequest {
        avoid_hosts: vec!["pv1-1".into(), "pv1-2".into(), "pv1-3".into()],
        required: false,
    };
    assert_eq!(plan.create.len(), 1);
    assert_eq!(plan.create[0].placement.as_ref(), Some(&expected));
    assert_eq!(condition(&plan, PLACEMENT_SHORTAGE).status, "False");
}

#[test]
fn a_member_no_host_could_take_stays_pending_is_retried_and_named_and_no_more_are_made() {
    let mut pool = pool(3);
    pool.spec.spread = Some(Spread {
        across: SpreadAcross::Host,
        policy: SpreadPolicy::Required,
    });
    let mut members = ready_members("edge", &hash(&pool), 2);
    members[0].host = Some("pv1-1".into());
    members[1].host = Some("pv1-2".into());
    let mut pending = member("edge-2", &hash(&pool), 5, false);
    pending.pending = Some("2 hosts, each holds a member of the pool".into());
    members.push(pending);
    let plan = plan(&pool, &members, &at(100));
    assert!(
        plan.create.is_empty(),
        "the pending one is the third: no more"
    );
    assert_eq!(
        plan.retry,
        [Retry {
            name: "edge-2".into(),
            placement: PlacementRequest {
                avoid_hosts: vec!["pv1-1".into(), "pv1-2".into()],
                required: true
            },
        }]
    );
    let shortage = condition(&plan, PLACEMENT_SHORTAGE);
    assert_eq!(
        (shortage.status.as_str(), shortage.reason.as_str()),
        ("True", reasons::TOO_FEW_HOSTS)
    );
    assert!(
        shortage
            .message
            .starts_with("1 of 3 members could not be placed"),
        "{}",
        shortage.message
    );
    assert!(shortage.message.contains("2 hosts"), "{}", shortage.message);
}

#[test]
fn without_spread_there_is_no_placement_and_no_shortage_condition() {
    let mut pool = pool(2);
    pool.spec.spread = Some(Spread {
        across: SpreadAcross::Host,
        policy: SpreadPolicy::Required,
    });
    let with_spread = plan(&pool, &[], &at(100));
    assert!(
        with_spread
            .create
            .iter()
            .all(|c| c.placement.as_ref().is_some_and(|p| p.required))
    );
    let mut pool = written(pool, &with_spread);
    pool.spec.spread = None;
    let without = plan(&pool, &[], &at(110));
    assert!(without.create.iter().all(|c| c.placement.is_none()));
    assert!(
        without
            .status
            .conditions
            .iter()
            .all(|c| c.type_ != PLACEMENT_SHORTAGE)
    );
}

#[test]
fn an_invalid_spec_changes_nothing_and_says_why() {
    for (surge, unavailable, replicas, named) in [
        (percent("25"), int(0), 3, "maxSurge"),
        (int(1), percent("x%"), 3, "maxUnavailable"),
        (int(-1), int(0), 3, "maxSurge"),
        (int(1), int(0), -1, "replicas"),
    ] {
        let pool = rolling(pool(replicas), surge, unavailable);
        let plan = plan(&pool, &ready_members("old", OLD, 2), &at(100));
        assert!(plan.create.is_empty() && plan.delete.is_empty());
        let progressing = condition(&plan, PROGRESSING);
        assert_eq!(progressing.reason, reasons::INVALID_SPEC);
        assert!(
            progressing.message.contains(named),
            "{}",
            progressing.message
        );
    }
}

#[test]
fn the_plan_is_the_same_whatever_order_the_members_come_in() {
    let mut pool = rolling(pool(4), int(1), int(1));
    change_template(&mut pool, 2);
    let mut members = ready_members("old", OLD, 4);
    members[1].ready_since = None;
    members.push(member("new-0", &hash(&pool), 20, true));
    let forward = plan(&pool, &members, &at(100));
    members.reverse();
    members.swap(0, 2);
    assert_eq!(plan(&pool, &members, &at(100)), forward);
}

#[test]
fn a_condition_keeps_its_transition_time_while_its_status_holds() {
    let pool = pool(2);
    let first = plan(&pool, &[], &at(100));
    let pool = written(pool, &first);
    let second = plan(
        &pool,
        &[member("edge-0", &hash(&pool), 100, false)],
        &at(110),
    );
    let progressing = condition(&second, PROGRESSING);
    assert_eq!(progressing.last_transition_time, at(100));
    let ready = ready_members("edge", &hash(&pool), 2);
    let third = plan(&written(pool, &second), &ready, &at(120));
    assert_eq!(
        condition(&third, PROGRESSING).last_transition_time,
        at(100),
        "True both times"
    );
    assert_eq!(
        condition(&third, AVAILABLE).last_transition_time,
        at(120),
        "False, then True"
    );
}

/// A pool's world: members the planner's creates add and its deletes remove a step later,
/// Ready one to three steps after they are made, on hosts a provider picks.
struct World {
    pool: ProxyPool,
    members: Vec<Member>,
    ready_at: BTreeMap<String, i64>,
    /// The hosts there are; empty for a provider that reports none.
    hosts: Vec<String>,
    now: i64,
    seed: u64,
    made: u32,
    /// The bounds the test expects the spec to resolve to: (surge, unavailable).
    expected: (i32, i32),
}

impl World {
    fn new(pool: ProxyPool, expected: (i32, i32), seed: u64, hosts: &[&str]) -> World {
        let mut world = World {
            pool,
            members: Vec::new(),
            ready_at: BTreeMap::new(),
            hosts: hosts.iter().map(|host| host.to_string()).collect(),
            now: 0,
            seed,
            made: 0,
            expected,
        };
        world.settle(100);
        world
    }

    /// A number below `below` from a fixed-seed generator (Knuth's MMIX constants).
    fn random(&mut self, below: u64) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.seed >> 33) % below
    }

    fn step(&mut self) -> Plan {
        self.now += 10;
        self.members.retain(|member| !member.deleting);
        for member in &mut self.members {
            if member.ready_since.is_none()
                && member.pending.is_none()
                && self.ready_at[&member.name] <= self.now
            {
                member.ready_since = Some(at(self.now));
                member.health = Health::Healthy;
            }
        }
        for index in (1..self.members.len()).rev() {
            let other = self.random(index as u64 + 1) as usize;
            self.members.swap(index, other);
        }
        let plan = plan(&self.pool, &self.members, &at(self.now));
        self.check_bounds(&plan);
        self.apply(&plan);
        self.pool.status = Some(plan.status.clone());
        plan
    }

    /// Never more than `replicas + maxSurge` members made into, never fewer than
    /// `replicas - maxUnavailable` Ready left by the pool's own deletes.
    fn check_bounds(&self, plan: &Plan) {
        let (surge, unavailable) = self.expected;
        let replicas = self.pool.spec.replicas as usize;
        let holding = self.members.len() + plan.create.len();
        assert!(
            plan.create.is_empty() || holding <= replicas + surge as usize,
            "at {}s: {holding} members hold a VM, more than {replicas} + {surge}",
            self.now
        );
        let ready = self.members.iter().filter(|m| m.is_ready()).count();
        let deleted_ready = plan
            .delete
            .iter()
            .filter(|d| {
                self.members
                    .iter()
                    .any(|m| m.name == d.name && m.is_ready())
            })
            .count();
        let floor = (replicas as i64 - unavailable as i64).max(0) as usize;
        assert!(
            ready - deleted_ready >= floor.min(ready),
            "at {}s: {ready} Ready, the pool deleted {deleted_ready}, under {floor}",
            self.now
        );
    }

    fn apply(&mut self, plan: &Plan) {
        for delete in &plan.delete {
            let member = self
                .members
                .iter_mut()
                .find(|m| m.name == delete.name)
                .unwrap();
            assert!(!member.deleting, "{} deleted twice", member.name);
            member.deleting = true;
        }
        for create in &plan.create {
            self.made += 1;
            let name = format!("edge-{}", self.made);
            let delay = 10 * (1 + self.random(3) as i64);
            self.ready_at.insert(name.clone(), self.now + delay);
            let mut made = member(&name, &create.template_hash, self.now, false);
            // As an adapter does: each create also avoids the hosts of those made before it.
            if let Some(placement) = &create.placement {
                self.place(&mut made, placement);
            }
            self.members.push(made);
        }
        for retry in &plan.retry {
            let mut member = self
                .members
                .iter()
                .find(|m| m.name == retry.name)
                .unwrap()
                .clone();
            self.place(&mut member, &retry.placement);
            *self
                .members
                .iter_mut()
                .find(|m| m.name == retry.name)
                .unwrap() = member;
        }
    }

    /// The provider: the first host no sibling uses and the request does not avoid.
    fn place(&self, member: &mut Member, request: &PlacementRequest) {
        let used: Vec<&String> = self
            .members
            .iter()
            .filter_map(|m| m.host.as_ref())
            .collect();
        let free = self
            .hosts
            .iter()
            .find(|host| !request.avoid_hosts.contains(host) && !used.contains(host));
        member.host = free.cloned();
        member.pending = match free {
            Some(_) => None,
            None if request.required => Some(format!(
                "{} hosts, each holds a member of the pool",
                self.hosts.len()
            )),
            None => {
                member.host = self.hosts.first().cloned();
                None
            }
        };
    }

    /// Step until the pool does nothing more; the steps it took.
    fn settle(&mut self, steps: usize) -> usize {
        for step in 1..=steps {
            let plan = self.step();
            if plan.create.is_empty() && plan.delete.is_empty() && plan.retry.is_empty() {
                let reason = &condition(&plan, PROGRESSING).reason;
                if reason == reasons::ROLLOUT_COMPLETE {
                    return step;
                }
            }
        }
        panic!(
            "not settled after {steps} steps at {}s: {:#?}",
            self.now, self.members
        );
    }

    fn assert_all_current(&self) {
        let current = hash(&self.pool);
        assert_eq!(self.members.len(), self.pool.spec.replicas as usize);
        assert!(
            self.members
                .iter()
                .all(|m| m.template_hash == current && m.is_ready())
        );
    }
}

#[test]
fn rolling_updates_hold_both_bounds_at_every_step() {
    for (replicas, surge, unavailable, expected) in [
        (3, int(1), int(0), (1, 0)),
        (3, int(0), int(1), (0, 1)),
        (3, int(2), int(2), (2, 2)),
        (5, percent("25%"), percent("25%"), (2, 1)),
        (10, percent("30%"), percent("20%"), (3, 2)),
        (4, percent("0%"), percent("10%"), (0, 1)),
        (1, int(0), int(1), (0, 1)),
        (7, percent("100%"), int(0), (7, 0)),
    ] {
        for seed in [1, 7, 42] {
            let pool = rolling(pool(replicas), surge.clone(), unavailable.clone());
            let mut world = World::new(pool, expected, seed, &[]);
            change_template(&mut world.pool, 2);
            world.settle(200);
            world.assert_all_current();
        }
    }
}

#[test]
fn scaling_up_and_in_in_the_middle_of_a_rollout_holds_the_bounds_and_ends_at_the_new_count() {
    for (from, to) in [(3, 5), (5, 2), (4, 0), (2, 6)] {
        let pool = rolling(pool(from), int(1), int(1));
        let mut world = World::new(pool, (1, 1), 3, &[]);
        change_template(&mut world.pool, 2);
        world.step();
        world.step();
        world.pool.spec.replicas = to;
        world.settle(200);
        world.assert_all_current();
    }
}

#[test]
fn two_template_changes_in_a_row_end_on_the_last() {
    let pool = rolling(pool(4), int(1), int(0));
    let mut world = World::new(pool, (1, 0), 9, &[]);
    change_template(&mut world.pool, 2);
    world.step();
    world.step();
    change_template(&mut world.pool, 3);
    world.settle(200);
    world.assert_all_current();
}

#[test]
fn recreate_never_runs_old_and_new_members_together() {
    let mut pool = pool(3);
    pool.spec.strategy.type_ = StrategyType::Recreate;
    let mut world = World::new(pool, (0, 3), 5, &[]);
    change_template(&mut world.pool, 2);
    let current = hash(&world.pool);
    for _ in 0..20 {
        world.step();
        let old = world.members.iter().any(|m| m.template_hash != current);
        let new = world.members.iter().any(|m| m.template_hash == current);
        assert!(!(old && new), "old and new together at {}s", world.now);
    }
    world.assert_all_current();
}

#[test]
fn a_paused_rollout_moves_only_when_resumed() {
    let pool = rolling(pool(3), int(1), int(0));
    let mut world = World::new(pool, (1, 0), 11, &[]);
    world.pool.spec.paused = true;
    change_template(&mut world.pool, 2);
    for _ in 0..5 {
        let plan = world.step();
        assert!(plan.create.is_empty() && plan.delete.is_empty());
    }
    world.pool.spec.paused = false;
    world.settle(100);
    world.assert_all_current();
}

#[test]
fn a_required_spread_on_as_many_hosts_as_replicas_rolls_one_host_at_a_time() {
    let mut pool = rolling(pool(3), int(0), int(1));
    pool.spec.spread = Some(Spread {
        across: SpreadAcross::Host,
        policy: SpreadPolicy::Required,
    });
    let mut world = World::new(pool, (0, 1), 13, &["pv1-1", "pv1-2", "pv1-3"]);
    change_template(&mut world.pool, 2);
    for _ in 0..40 {
        world.step();
        let mut hosts: Vec<&String> = world
            .members
            .iter()
            .filter_map(|m| m.host.as_ref())
            .collect();
        let placed = hosts.len();
        hosts.sort();
        hosts.dedup();
        assert_eq!(hosts.len(), placed, "two VMs on one host at {}s", world.now);
    }
    world.assert_all_current();
}
