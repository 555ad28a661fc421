//! Conditions, the way a status says what holds of an object and why, and [`NotReady`], why a
//! Proxy's references cannot serve it now. A leaf: it imports nothing of the operator, so every
//! module may use it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition types of the resources' statuses (`Ready`, `Synced`, …): part of their API.
pub use egress_crd::conditions::*;

/// When, and for which generation, one reconcile sets its conditions.
#[derive(Clone, Debug)]
pub struct Stamp {
    /// The generation the conditions observe.
    pub generation: i64,
    /// The reconcile's time: every transition it makes carries it.
    pub now: Time,
}

impl Stamp {
    /// A stamp for `generation`, now.
    pub fn new(generation: i64) -> Stamp {
        Stamp {
            generation,
            now: crate::now(),
        }
    }

    /// [`set_condition`] as of this stamp.
    pub fn set(
        &self,
        conditions: &mut Vec<Condition>,
        kind: &str,
        ok: bool,
        reason: &str,
        message: &str,
    ) {
        set_condition(
            conditions,
            kind,
            ok,
            reason,
            message,
            Some(self.generation),
            &self.now,
        );
    }
}

/// Set condition `kind` in `conditions`, keeping its transition time when its status is
/// unchanged. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = if status { "True" } else { "False" };
    let message = message.to_owned();
    match conditions.iter_mut().find(|c| c.type_ == kind) {
        Some(existing) => {
            let changed = existing.status != status
                || existing.reason != reason
                || existing.message != message
                || existing.observed_generation != generation;
            if existing.status != status {
                existing.last_transition_time = now.clone();
            }
            existing.status = status.to_owned();
            existing.reason = reason.to_owned();
            existing.message = message;
            existing.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: kind.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message,
                observed_generation: generation,
                last_transition_time: now.clone(),
            });
            true
        }
    }
}

/// The condition `kind`, if set.
pub fn condition<'a>(conditions: &'a [Condition], kind: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == kind)
}

/// Whether condition `kind` is set and `True`.
pub fn is_true(conditions: &[Condition], kind: &str) -> bool {
    condition(conditions, kind).is_some_and(|condition| condition.status == "True")
}

/// Why a ProviderConfig cannot serve a Proxy now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    /// A condition reason (`ProviderConfigNotFound`, `ComponentNotLoaded`, …).
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "Provisioning",
            "booting",
            Some(1),
            &time(10)
        ));
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "Provisioning",
            "no address yet",
            Some(1),
            &time(20)
        ));
        assert_eq!(conditions[0].last_transition_time, time(10));
        assert!(!set_condition(
            &mut conditions,
            "Ready",
            false,
            "Provisioning",
            "no address yet",
            Some(1),
            &time(25)
        ));
        assert!(set_condition(
            &mut conditions,
            "Ready",
            true,
            "Running",
            "at 192.0.2.7",
            Some(1),
            &time(30)
        ));
        assert_eq!(conditions[0].last_transition_time, time(30));
        assert_eq!(conditions.len(), 1);
        assert_eq!(condition(&conditions, "Ready").unwrap().reason, "Running");
    }
}
