//! Fault injection, settable at runtime. A rule matches requests by method and path pattern
//! (relative to `/api2/json`, `*` standing for one segment, a trailing `**` for any rest) and
//! fires on its Nth match, at a seeded rate, or always. Separately, [`Faults::abort_after`]
//! resets every request once a budget of requests is spent, for crash-consistency tests.

use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// When a rule fires, counted over the requests it matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// Only the Nth matching call (1-based).
    Nth(u64),
    /// Each matching call with this probability, drawn from the seeded RNG.
    Rate(f64),
    /// Every matching call.
    Always,
}

/// What a firing rule does to the request.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer with this status and message (the usual envelope and reason phrase).
    Status {
        /// HTTP status code, such as 500 or 595.
        status: u16,
        /// The message, without a trailing newline.
        message: String,
    },
    /// Close the connection without answering.
    Reset,
    /// Wait this long, then answer normally.
    Delay(Duration),
    /// 500 `can't lock file '/var/lock/qemu-server/lock-<vmid>.conf' - got timeout`.
    LockContention,
    /// Accept the request, but the task it starts ends with this exitstatus and no effect.
    TaskFails(String),
    /// Accept the request; the task does its work and ends `WARNINGS: n`.
    TaskWarnings(u32),
}

/// One fault rule. Build it with [`FaultRule::new`] or parse it from the binary's `--fault` syntax.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// HTTP method to match (upper case); `None` matches any.
    pub method: Option<String>,
    /// Path pattern under `/api2/json`, e.g. `/nodes/*/qemu/*/clone`.
    pub path: String,
    /// When the rule fires.
    pub trigger: Trigger,
    /// What it does.
    pub action: FaultAction,
}

impl FaultRule {
    /// A rule for `method` (`"*"` for any) and `path`.
    pub fn new(method: &str, path: &str, trigger: Trigger, action: FaultAction) -> Self {
        let method = (method != "*").then(|| method.to_ascii_uppercase());
        FaultRule {
            method,
            path: path.to_string(),
            trigger,
            action,
        }
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        if self.method.as_deref().is_some_and(|m| m != method) {
            return false;
        }
        path_matches(&self.path, path)
    }
}

/// Parses `METHOD PATH TRIGGER ACTION`, where TRIGGER is `nth=N`, `rate=P` or `always`, and
/// ACTION is `status=CODE:MESSAGE`, `reset`, `delay=MS`, `lock`, `task-fail=TEXT` or
/// `task-warnings=N`. MESSAGE and TEXT run to the end of the line.
impl FromStr for FaultRule {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let mut parts = spec.trim().splitn(4, ' ');
        let (Some(method), Some(path), Some(trigger), Some(action)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "fault {spec:?}: expected `METHOD PATH TRIGGER ACTION`"
            ));
        };
        let trigger = match trigger.split_once('=') {
            None if trigger == "always" => Trigger::Always,
            Some(("nth", n)) => Trigger::Nth(
                n.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(format!("fault: bad nth {n:?}"))?,
            ),
            Some(("rate", p)) => Trigger::Rate(
                p.parse()
                    .ok()
                    .filter(|p: &f64| (0.0..=1.0).contains(p))
                    .ok_or(format!("fault: bad rate {p:?}"))?,
            ),
            _ => return Err(format!("fault: unknown trigger {trigger:?}")),
        };
        let action = match action.split_once('=') {
            None if action == "reset" => FaultAction::Reset,
            None if action == "lock" => FaultAction::LockContention,
            Some(("status", rest)) => {
                let (code, message) = rest
                    .split_once(':')
                    .ok_or("fault: status needs CODE:MESSAGE")?;
                let status = code
                    .parse()
                    .ok()
                    .filter(|c| (400..=599).contains(c))
                    .ok_or(format!("fault: bad status {code:?}"))?;
                FaultAction::Status {
                    status,
                    message: message.to_string(),
                }
            }
            Some(("delay", ms)) => FaultAction::Delay(Duration::from_millis(
                ms.parse().map_err(|_| format!("fault: bad delay {ms:?}"))?,
            )),
            Some(("task-fail", text)) if !text.is_empty() => FaultAction::TaskFails(text.into()),
            Some(("task-warnings", n)) => FaultAction::TaskWarnings(
                n.parse()
                    .map_err(|_| format!("fault: bad warning count {n:?}"))?,
            ),
            _ => return Err(format!("fault: unknown action {action:?}")),
        };
        Ok(FaultRule::new(method, path, trigger, action))
    }
}

/// Whether `path` (split on `/`) fits `pattern`.
fn path_matches(pattern: &str, path: &str) -> bool {
    let mut pattern_segments = pattern.trim_matches('/').split('/');
    let mut path_segments = path.trim_matches('/').split('/');
    loop {
        match (pattern_segments.next(), path_segments.next()) {
            (Some("**"), _) => return true,
            (Some(p), Some(s)) if p == "*" || p == s => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A handle identifying an added rule, for [`Faults::remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultId(u64);

struct ActiveRule {
    id: FaultId,
    rule: FaultRule,
    matched: u64,
}

struct FaultState {
    rules: Vec<ActiveRule>,
    next_id: u64,
    rng: StdRng,
    requests_seen: u64,
    abort_at: Option<u64>,
}

/// The simulator's fault switchboard; cheap to call from tests while the server runs.
pub struct Faults {
    state: Mutex<FaultState>,
}

/// What the server must do with one request, decided before it is handled.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    Proceed,
    Act(FaultAction),
}

impl Faults {
    pub(crate) fn new(seed: u64) -> Self {
        Faults {
            state: Mutex::new(FaultState {
                rules: Vec::new(),
                next_id: 0,
                rng: StdRng::seed_from_u64(seed),
                requests_seen: 0,
                abort_at: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a rule; rules are tried in the order they were added and the first that fires wins.
    pub fn add(&self, rule: FaultRule) -> FaultId {
        let mut state = self.lock();
        state.next_id += 1;
        let id = FaultId(state.next_id);
        state.rules.push(ActiveRule {
            id,
            rule,
            matched: 0,
        });
        id
    }

    /// Removes one rule.
    pub fn remove(&self, id: FaultId) {
        self.lock().rules.retain(|r| r.id != id);
    }

    /// Removes every rule and the abort budget.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.rules.clear();
        state.abort_at = None;
    }

    /// Reseeds the RNG behind [`Trigger::Rate`], so a run can be repeated.
    pub fn reseed(&self, seed: u64) {
        self.lock().rng = StdRng::seed_from_u64(seed);
    }

    /// Serves the next `n` requests (any endpoint), then resets every further connection without
    /// an answer until [`Faults::clear_abort`].
    pub fn abort_after(&self, n: u64) {
        let mut state = self.lock();
        state.abort_at = Some(state.requests_seen + n);
    }

    /// Lifts the abort budget.
    pub fn clear_abort(&self) {
        self.lock().abort_at = None;
    }

    /// Requests seen since the server started.
    pub fn requests_seen(&self) -> u64 {
        self.lock().requests_seen
    }

    /// Counts the request and decides its fate. `path` is relative to `/api2/json`.
    pub(crate) fn decide(&self, method: &str, path: &str) -> Decision {
        let mut state = self.lock();
        state.requests_seen += 1;
        if state
            .abort_at
            .is_some_and(|limit| state.requests_seen > limit)
        {
            return Decision::Act(FaultAction::Reset);
        }
        let FaultState { rules, rng, .. } = &mut *state;
        for active in rules.iter_mut().filter(|r| r.rule.matches(method, path)) {
            active.matched += 1;
            let fires = match active.rule.trigger {
                Trigger::Nth(n) => active.matched == n,
                Trigger::Rate(p) => rng.gen_bool(p.clamp(0.0, 1.0)),
                Trigger::Always => true,
            };
            if fires {
                return Decision::Act(active.rule.action.clone());
            }
        }
        Decision::Proceed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_by_segment() {
        assert!(path_matches(
            "/nodes/*/qemu/*/clone",
            "/nodes/pv1-1/qemu/9001/clone"
        ));
        assert!(!path_matches(
            "/nodes/*/qemu/*/clone",
            "/nodes/pv1-1/qemu/9001/config"
        ));
        assert!(!path_matches(
            "/nodes/*/qemu/*",
            "/nodes/pv1-1/qemu/9001/config"
        ));
        assert!(path_matches("/nodes/**", "/nodes/pv1-1/qemu/9001/config"));
        assert!(path_matches("/**", "/version"));
    }

    #[test]
    fn nth_fires_once_on_the_nth_match_only() {
        let faults = Faults::new(1);
        faults.add(FaultRule::new(
            "POST",
            "/a",
            Trigger::Nth(2),
            FaultAction::Reset,
        ));
        let fired: Vec<bool> = (0..4)
            .map(|_| faults.decide("POST", "/a") != Decision::Proceed)
            .collect();
        assert_eq!(fired, [false, true, false, false]);
        assert_eq!(faults.decide("GET", "/a"), Decision::Proceed);
    }

    #[test]
    fn rate_is_repeatable_with_a_seed() {
        let run = || {
            let faults = Faults::new(42);
            faults.add(FaultRule::new(
                "*",
                "/**",
                Trigger::Rate(0.5),
                FaultAction::Reset,
            ));
            (0..64)
                .map(|_| faults.decide("GET", "/x") != Decision::Proceed)
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run());
        assert!(first.iter().any(|f| *f) && first.iter().any(|f| !*f));
    }

    #[test]
    fn abort_after_resets_everything_past_the_budget() {
        let faults = Faults::new(0);
        faults.decide("GET", "/version");
        faults.abort_after(2);
        let outcomes: Vec<Decision> = (0..4).map(|_| faults.decide("GET", "/version")).collect();
        assert_eq!(outcomes[..2], [Decision::Proceed, Decision::Proceed]);
        assert_eq!(
            outcomes[2..],
            [
                Decision::Act(FaultAction::Reset),
                Decision::Act(FaultAction::Reset)
            ]
        );
        faults.clear_abort();
        assert_eq!(faults.decide("GET", "/version"), Decision::Proceed);
    }

    #[test]
    fn parses_the_flag_syntax() {
        let rule: FaultRule = "POST /nodes/*/qemu/*/clone nth=2 status=500:boom, it broke"
            .parse()
            .unwrap();
        assert_eq!(rule.method.as_deref(), Some("POST"));
        assert_eq!(rule.trigger, Trigger::Nth(2));
        assert_eq!(
            rule.action,
            FaultAction::Status {
                status: 500,
                message: "boom, it broke".into()
            }
        );
        let rule: FaultRule = "* /** rate=0.25 task-fail=clone failed: out of space"
            .parse()
            .unwrap();
        assert_eq!(rule.method, None);
        assert_eq!(
            rule.action,
            FaultAction::TaskFails("clone failed: out of space".into())
        );
        assert_eq!(
            "GET /x always delay=30"
                .parse::<FaultRule>()
                .unwrap()
                .action,
            FaultAction::Delay(Duration::from_millis(30))
        );
        assert_eq!(
            "GET /x always lock".parse::<FaultRule>().unwrap().action,
            FaultAction::LockContention
        );
        assert_eq!(
            "GET /x always task-warnings=1"
                .parse::<FaultRule>()
                .unwrap()
                .action,
            FaultAction::TaskWarnings(1)
        );
        for bad in [
            "GET /x",
            "GET /x nth=0 reset",
            "GET /x rate=2 reset",
            "GET /x always status=200:ok",
            "GET /x always explode",
        ] {
            assert!(bad.parse::<FaultRule>().is_err(), "{bad} should not parse");
        }
    }
}
