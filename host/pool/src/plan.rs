//! The planner: from a pool and its members, the deletes, creates and status of one pass.
//!
//! In order: remediation (unhealthy members), scale-in (more members than `replicas`), the
//! rollout's deletes (older templates), then creates up to `replicas` within the surge. Each
//! step sees the deletes of the steps before it.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::{
    AVAILABLE, Create, Delete, DeleteReason, Health, Member, PLACEMENT_SHORTAGE, PROGRESSING,
    PlacementRequest, Plan, REMEDIATION_HALTED, Retry, reasons,
};
use egress_crd::{
    IntOrString, ProxyPool, ProxyPoolSpec, ProxyPoolStatus, SpreadPolicy, StrategyType,
    pool_selector, template_hash,
};

/// What `pool` does next with `members` (the Proxies it owns, in any order), as of `now`.
pub fn plan(pool: &ProxyPool, members: &[Member], now: &Time) -> Plan {
    let hash = template_hash(&pool.spec.template);
    let previous = pool.status.clone().unwrap_or_default();
    let mut conditions = Conditions {
        list: previous.conditions.clone(),
        generation: pool.metadata.generation,
        now,
    };
    let mut status = counts(pool, members, &hash);
    let bounds = match Bounds::of(&pool.spec) {
        Ok(bounds) => bounds,
        Err(problem) => {
            conditions.set(PROGRESSING, "False", reasons::INVALID_SPEC, problem);
            status.last_progress_time = previous.last_progress_time;
            status.conditions = conditions.list;
            return Plan {
                create: Vec::new(),
                delete: Vec::new(),
                retry: Vec::new(),
                status,
            };
        }
    };
    let mut pass = Pass::new(members, &hash, bounds);
    let progress = Progress::of(pool, &previous, &pass, now);
    status.last_progress_time = progress.last_progress.clone();
    let unhealthy = pass.remediate();
    pass.scale_in();
    let rollout_acts = !pool.spec.paused && !progress.deadline_exceeded;
    if rollout_acts {
        match pool.spec.strategy.type_ {
            StrategyType::RollingUpdate => pass.roll(),
            StrategyType::Recreate => pass.recreate(),
        }
    }
    let required = pool
        .spec
        .spread
        .as_ref()
        .map(|spread| spread.policy == SpreadPolicy::Required);
    let create = pass.creates(rollout_acts, required);
    let retry = pass.retries(required);
    progress.write(
        &mut conditions,
        &pass,
        status.updated_replicas,
        pool.spec.paused,
    );
    pass.write_available(&mut conditions);
    write_halt(&mut conditions, unhealthy);
    pass.write_shortage(&mut conditions, required.is_some());
    status.conditions = conditions.list;
    Plan {
        create,
        delete: pass.deletes,
        retry,
        status,
    }
}

/// The counts of the status, as observed before this pass's actions.
fn counts(pool: &ProxyPool, members: &[Member], hash: &str) -> ProxyPoolStatus {
    let live: Vec<&Member> = members.iter().filter(|member| !member.deleting).collect();
    let count = |keep: &dyn Fn(&Member) -> bool| -> i32 {
        i32::try_from(live.iter().filter(|member| keep(member)).count()).unwrap_or(i32::MAX)
    };
    let ready = count(&Member::is_ready);
    ProxyPoolStatus {
        replicas: count(&|_| true),
        ready_replicas: ready,
        updated_replicas: count(&|member| member.template_hash == hash),
        available_replicas: ready,
        unavailable_replicas: (pool.spec.replicas - ready).max(0),
        observed_generation: pool.metadata.generation,
        selector: pool.metadata.name.as_deref().map(pool_selector),
        template_hash: Some(hash.to_owned()),
        last_progress_time: None,
        conditions: Vec::new(),
    }
}

/// The spec's numbers, resolved against `replicas`.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    replicas: i32,
    /// Members beyond `replicas` that may hold a VM.
    max_surge: i32,
    /// Ready members fewer than `replicas` the pool's own deletes may leave.
    max_unavailable: i32,
    /// The most unhealthy members for remediation still to act.
    max_unhealthy: i32,
    recreate: bool,
    deadline_seconds: i64,
}

impl Bounds {
    fn of(spec: &ProxyPoolSpec) -> Result<Bounds, String> {
        let replicas = spec.replicas;
        if replicas < 0 {
            return Err(format!("replicas is {replicas}; it is at least 0"));
        }
        if spec.progress_deadline_seconds < 1 {
            return Err("progressDeadlineSeconds is at least 1".into());
        }
        let recreate = spec.strategy.type_ == StrategyType::Recreate;
        let rolling = spec.strategy.rolling_update.clone().unwrap_or_default();
        // As a Deployment's: a Recreate pool has no surge and wants every replica available.
        let (mut max_surge, mut max_unavailable) = (0, 0);
        if !recreate {
            max_surge = resolve("maxSurge", &rolling.max_surge, replicas, true)?;
            max_unavailable = resolve("maxUnavailable", &rolling.max_unavailable, replicas, false)?;
            // As Kubernetes resolves the fence posts: a rollout must be able to move.
            if max_surge == 0 && max_unavailable == 0 {
                max_unavailable = 1;
            }
        }
        let max_unhealthy = resolve(
            "maxUnhealthy",
            &spec.remediation.max_unhealthy,
            replicas,
            true,
        )?;
        Ok(Bounds {
            replicas,
            max_surge,
            max_unavailable: max_unavailable.min(replicas),
            max_unhealthy,
            recreate,
            deadline_seconds: i64::from(spec.progress_deadline_seconds),
        })
    }

    /// The fewest Ready members the pool's own deletes may leave.
    fn min_ready(&self) -> i32 {
        self.replicas - self.max_unavailable
    }
}

/// A count, or a percent of `total` rounded up or down.
fn resolve(field: &str, value: &IntOrString, total: i32, round_up: bool) -> Result<i32, String> {
    let percent = match value {
        IntOrString::Int(count) if *count >= 0 => return Ok(*count),
        IntOrString::Int(count) => return Err(format!("{field} is {count}; it is at least 0")),
        IntOrString::String(text) => text
            .strip_suffix('%')
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<i64>().ok())
            .ok_or_else(|| {
                format!("{field} is {text:?}; it is a count or a percent such as 25%")
            })?,
    };
    let scaled = percent * i64::from(total);
    let rounded = if round_up {
        (scaled + 99) / 100
    } else {
        scaled / 100
    };
    Ok(i32::try_from(rounded).unwrap_or(i32::MAX))
}

/// One pass over the members: which are still live after the deletes chosen so far.
struct Pass<'a> {
    members: &'a [Member],
    hash: &'a str,
    bounds: Bounds,
    /// Per member: deleting already, or deleted by this pass.
    gone: Vec<bool>,
    deletes: Vec<Delete>,
}

impl<'a> Pass<'a> {
    fn new(members: &'a [Member], hash: &'a str, bounds: Bounds) -> Pass<'a> {
        Pass {
            members,
            hash,
            bounds,
            gone: members.iter().map(|member| member.deleting).collect(),
            deletes: Vec::new(),
        }
    }

    /// The members not deleting nor deleted by this pass, in a fixed order (oldest first, then
    /// by name) whatever order they came in.
    fn live(&self) -> Vec<(usize, &'a Member)> {
        let mut live: Vec<(usize, &Member)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(index, _)| !self.gone[*index])
            .collect();
        live.sort_by(|(_, a), (_, b)| (&a.created.0, &a.name).cmp(&(&b.created.0, &b.name)));
        live
    }

    fn count(&self, keep: impl Fn(&Member) -> bool) -> i32 {
        let live = self.live().into_iter().filter(|(_, member)| keep(member));
        i32::try_from(live.count()).unwrap_or(i32::MAX)
    }

    fn is_current(&self, member: &Member) -> bool {
        member.template_hash == self.hash
    }

    fn delete(&mut self, index: usize, reason: DeleteReason) {
        self.gone[index] = true;
        self.deletes.push(Delete {
            name: self.members[index].name.clone(),
            reason,
        });
    }

    /// Delete the unhealthy members, unless more are unhealthy than `maxUnhealthy` allows
    /// (those being deleted count until gone): then none. A Ready member is never remediated
    /// (Ready includes the health check; the two disagree only for a moment), so remediation
    /// never lowers the Ready count.
    fn remediate(&mut self) -> Unhealthy {
        let unhealthy = |member: &Member| matches!(member.health, Health::Unhealthy { .. });
        let count = self
            .members
            .iter()
            .filter(|member| unhealthy(member))
            .count();
        let found = Unhealthy {
            count: i32::try_from(count).unwrap_or(i32::MAX),
            allowed: self.bounds.max_unhealthy,
        };
        if found.halts() {
            return found;
        }
        let candidates: Vec<usize> = self
            .live()
            .into_iter()
            .filter(|(_, member)| unhealthy(member) && !member.is_ready())
            .map(|(index, _)| index)
            .collect();
        for index in candidates {
            self.delete(index, DeleteReason::Remediation);
        }
        found
    }

    /// Delete the members beyond `replicas`: not Ready first, then of older templates, then the
    /// oldest. While members of an older template remain, the new ones a surge made (up to
    /// `maxSurge`) are not beyond: the rollout removes the old ones for them.
    fn scale_in(&mut self) {
        let mut order = self.live();
        // `live` is oldest first; a stable sort keeps that order within each group.
        order.sort_by_key(|(_, member)| (member.is_ready(), self.is_current(member)));
        for (index, _) in order {
            let current = self.count(|member| self.is_current(member));
            let live = self.count(|_| true);
            let surging = if current < live {
                current.min(self.bounds.max_surge)
            } else {
                0
            };
            if live <= self.bounds.replicas + surging {
                break;
            }
            self.delete(index, DeleteReason::ScaleIn);
        }
    }

    /// A rolling update's deletes, as a Deployment's: old members not Ready first, as long as
    /// the live members stay at least `replicas - maxUnavailable` plus the new ones not yet
    /// Ready; then old Ready ones, as long as `replicas - maxUnavailable` stay Ready. Oldest
    /// first within each.
    fn roll(&mut self) {
        let min_ready = self.bounds.min_ready();
        let new_unready = self.count(|member| self.is_current(member) && !member.is_ready());
        let old = |pass: &Self, ready: bool| -> Vec<usize> {
            let live = pass.live().into_iter();
            live.filter(|(_, member)| !pass.is_current(member) && member.is_ready() == ready)
                .map(|(index, _)| index)
                .collect()
        };
        let may_go = self.count(|_| true) - min_ready - new_unready;
        for index in old(self, false).into_iter().take(may_go.max(0) as usize) {
            self.delete(index, DeleteReason::Rollout);
        }
        let may_go = self.count(Member::is_ready) - min_ready;
        for index in old(self, true).into_iter().take(may_go.max(0) as usize) {
            self.delete(index, DeleteReason::Rollout);
        }
    }

    /// Recreate's deletes: every member of an older template at once.
    fn recreate(&mut self) {
        let old: Vec<usize> = self
            .live()
            .into_iter()
            .filter(|(_, member)| !self.is_current(member))
            .map(|(index, _)| index)
            .collect();
        for index in old {
            self.delete(index, DeleteReason::Recreate);
        }
    }

    /// The members to make: up to `replicas` of the current template while the rollout acts,
    /// else only as many as bring the live members back to `replicas`; never more than
    /// `replicas + maxSurge` members in all (those being deleted count until gone); under
    /// Recreate none while a member of an older template remains at all.
    fn creates(&self, rollout_acts: bool, required: Option<bool>) -> Vec<Create> {
        let replicas = self.bounds.replicas;
        if self.bounds.recreate && self.members.iter().any(|m| !self.is_current(m)) {
            return Vec::new();
        }
        let wanted = if rollout_acts {
            replicas - self.count(|member| self.is_current(member))
        } else {
            replicas - self.count(|_| true)
        };
        let holding = i32::try_from(self.members.len()).unwrap_or(i32::MAX);
        let room = replicas + self.bounds.max_surge - holding;
        let placement = required.map(|required| self.placement(required));
        let count = wanted.min(room).max(0) as usize;
        vec![
            Create {
                template_hash: self.hash.to_owned(),
                placement,
            };
            count
        ]
    }

    /// A placement request away from every host a member still has a VM on.
    fn placement(&self, required: bool) -> PlacementRequest {
        let hosts: BTreeSet<&String> = self
            .members
            .iter()
            .filter_map(|m| m.host.as_ref())
            .collect();
        PlacementRequest {
            avoid_hosts: hosts.into_iter().cloned().collect(),
            required,
        }
    }

    /// The live members the provider could not place, to place again (with `spread` only).
    fn retries(&self, required: Option<bool>) -> Vec<Retry> {
        let Some(required) = required else {
            return Vec::new();
        };
        self.live()
            .into_iter()
            .filter(|(_, member)| member.pending.is_some())
            .map(|(_, member)| Retry {
                name: member.name.clone(),
                placement: self.placement(required),
            })
            .collect()
    }

    fn write_available(&self, conditions: &mut Conditions) {
        let ready = self
            .members
            .iter()
            .filter(|member| member.is_ready())
            .count();
        let min_ready = self.bounds.min_ready();
        let message = format!(
            "{ready} of {} Ready; at least {min_ready} wanted",
            self.bounds.replicas
        );
        if ready as i64 >= i64::from(min_ready) {
            conditions.set(
                AVAILABLE,
                "True",
                reasons::MINIMUM_REPLICAS_AVAILABLE,
                message,
            );
        } else {
            conditions.set(
                AVAILABLE,
                "False",
                reasons::MINIMUM_REPLICAS_UNAVAILABLE,
                message,
            );
        }
    }

    fn write_shortage(&self, conditions: &mut Conditions, spread: bool) {
        if !spread {
            conditions
                .list
                .retain(|condition| condition.type_ != PLACEMENT_SHORTAGE);
            return;
        }
        let pending: Vec<&Member> = self
            .members
            .iter()
            .filter(|member| !member.deleting && member.pending.is_some())
            .collect();
        match pending.first() {
            None => conditions.set(
                PLACEMENT_SHORTAGE,
                "False",
                reasons::ALL_PLACED,
                "every member is placed as the spread asks".into(),
            ),
            Some(first) => conditions.set(
                PLACEMENT_SHORTAGE,
                "True",
                reasons::TOO_FEW_HOSTS,
                format!(
                    "{} of {} members could not be placed as the spread asks and stay pending: {}",
                    pending.len(),
                    self.bounds.replicas,
                    first.pending.as_deref().unwrap_or_default()
                ),
            ),
        }
    }
}

fn write_halt(conditions: &mut Conditions, unhealthy: Unhealthy) {
    let Unhealthy { count, allowed } = unhealthy;
    if unhealthy.halts() {
        let message = format!(
            "{count} members are unhealthy, more than remediation.maxUnhealthy allows ({allowed}): \
             something beyond the proxies is wrong, so none is replaced"
        );
        conditions.set(
            REMEDIATION_HALTED,
            "True",
            reasons::TOO_MANY_UNHEALTHY,
            message,
        );
    } else {
        let message = format!("{count} members unhealthy, replaced while at most {allowed}");
        conditions.set(REMEDIATION_HALTED, "False", reasons::WITHIN_LIMIT, message);
    }
}

/// How many members are unhealthy, and how many may be for remediation to act.
#[derive(Clone, Copy)]
struct Unhealthy {
    count: i32,
    allowed: i32,
}

impl Unhealthy {
    fn halts(self) -> bool {
        self.count > self.allowed
    }
}

/// Where the pool's change stands: done, and if not, since when it last moved.
struct Progress {
    complete: bool,
    last_progress: Option<Time>,
    deadline_exceeded: bool,
}

impl Progress {
    /// The clock runs while a change is under way and not paused: it starts when the template
    /// hash changes or the change begins (no stored time), restarts when a pause ends, and
    /// moves to the latest time a member of the current template became Ready.
    fn of(pool: &ProxyPool, previous: &ProxyPoolStatus, pass: &Pass<'_>, now: &Time) -> Progress {
        let replicas = pass.bounds.replicas;
        let complete = pass.members.iter().all(|member| pass.is_current(member))
            && pass.count(|_| true) == replicas
            && pass.count(Member::is_ready) == replicas;
        if complete || pool.spec.paused {
            return Progress {
                complete,
                last_progress: None,
                deadline_exceeded: false,
            };
        }
        let same_change = previous.template_hash.as_deref() == Some(pass.hash);
        let start = previous
            .last_progress_time
            .clone()
            .filter(|_| same_change)
            .unwrap_or_else(|| now.clone());
        let latest_ready = pass
            .live()
            .into_iter()
            .filter(|(_, member)| pass.is_current(member))
            .filter_map(|(_, member)| member.ready_since.clone())
            .filter(|since| since.0 <= now.0)
            .max_by_key(|since| since.0);
        let last = latest_ready
            .filter(|ready| ready.0 > start.0)
            .unwrap_or(start);
        let idle = now.0.as_second() - last.0.as_second();
        Progress {
            complete,
            last_progress: Some(last),
            deadline_exceeded: idle > pass.bounds.deadline_seconds,
        }
    }

    fn write(&self, conditions: &mut Conditions, pass: &Pass<'_>, updated: i32, paused: bool) {
        let replicas = pass.bounds.replicas;
        let (status, reason, message) = if self.complete {
            let message = format!(
                "{replicas} of {replicas} members run template {} and are Ready",
                pass.hash
            );
            ("True", reasons::ROLLOUT_COMPLETE, message)
        } else if paused {
            let message = format!(
                "paused with {updated} of {replicas} members on template {}",
                pass.hash
            );
            ("Unknown", reasons::ROLLOUT_PAUSED, message)
        } else if self.deadline_exceeded {
            let message = format!(
                "no member of template {} became Ready within {}s: no surge members are made and \
                 no old ones deleted until one does or the template changes",
                pass.hash, pass.bounds.deadline_seconds
            );
            ("False", reasons::PROGRESS_DEADLINE_EXCEEDED, message)
        } else {
            let message = format!("{updated} of {replicas} members on template {}", pass.hash);
            ("True", reasons::REPLICAS_UPDATED, message)
        };
        conditions.set(PROGRESSING, status, reason, message);
    }
}

/// The pool's conditions as this pass sets them; a condition keeps its transition time while
/// its status holds.
struct Conditions<'a> {
    list: Vec<Condition>,
    generation: Option<i64>,
    now: &'a Time,
}

impl Conditions<'_> {
    fn set(&mut self, kind: &str, status: &str, reason: &str, message: String) {
        let fresh = Condition {
            type_: kind.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: self.generation,
            last_transition_time: self.now.clone(),
        };
        match self
            .list
            .iter_mut()
            .find(|condition| condition.type_ == kind)
        {
            Some(existing) if existing.status == status => {
                let since = existing.last_transition_time.clone();
                *existing = Condition {
                    last_transition_time: since,
                    ..fresh
                };
            }
            Some(existing) => *existing = fresh,
            None => self.list.push(fresh),
        }
    }
}
