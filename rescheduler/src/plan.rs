//! The rescheduling decision (notes §1.3.3; acceptance points 11-14, 21-24).
//!
//! # The rule
//!
//! `gain = (ret_current - (ret_new + C)) / ret_current`, and the application migrates iff
//! `gain > threshold` (strict: a gain of exactly 0.30 stays). `C` is the worst-case cost of a
//! migration, 900 s by default (the paper's Table 1: 40 + 90 + 120 + 80 + 10 + 60 + 500). With
//! `ret_new >= 0` nothing migrates once `ret_current <= C / (1 - threshold)` (about 1285.7 s
//! with the defaults): the built-in protection of applications about to finish.
//!
//! # The model behind `ret_current` and `ret_new`
//!
//! Both are `remaining * slowdown`, `remaining = (1 - fraction_completed) * total_predicted_s`
//! the predicted time left on an unloaded reference host:
//!
//! - **current hosts**: the larger of the contract monitor's observed average ratio (the
//!   slowdown seen so far continues) and the slowdown the latest fresh samples of the current
//!   hosts predict (point 14: "with the latest load data"). The whole-history average lags a
//!   slowdown that just began; the load term catches it. The application's own load counts
//!   for at most one of the host's CPUs, and the load term is 1 until a host is overloaded
//!   (`load1 > cpus`), so an application alone on its hosts is not mistaken for slowed.
//! - **a target host** ([`slowdown`]): `max(1, load1 / cpus) / bench`, where `bench` is the
//!   host's speed relative to the reference host (1 = as fast; NaN, 0 or not finite = unknown,
//!   taken as 1). Non-decreasing in load, non-increasing in speed. A host with a free CPU
//!   normally has `load1 < cpus`, so the load term is 1 and the speed ranks the hosts; the
//!   load term only bites when `free_cpus` and `load1` disagree (queued work, samples taken
//!   at different times).
//! - **a target set**: a parallel application runs at the pace of its slowest host, so the
//!   set's slowdown is the largest of its hosts'.
//!
//! # Choosing the target
//!
//! Candidates are the hosts of the view that are not current hosts, not stale
//! (`age_ms > max_age_ms`; listed in [`Plan::excluded_stale`]), with usable numbers
//! (`cpus > 0`, `load1 >= 0`, both finite) and at least one free CPU (`floor(free_cpus)`).
//! The set must offer `cpus_needed` free CPUs; its host count may differ from the current one
//! (point 21). Among the feasible sets the plan takes the one with the smallest slowdown: the
//! fastest hosts first (ties by name) until enough CPUs are found fix that smallest slowdown
//! `s*`; then, among the hosts no slower than `s*`, the fewest hosts (most free CPUs first,
//! then faster, then by name). No feasible set means STAY with the reason (point 22): a STOP
//! is never separated from a destination. When a host appears more than once in the view the
//! freshest sample is used (the first of equally fresh ones).
//!
//! The plan does not depend on the order of the view or of the current hosts, and
//! non-numbers never migrate: a NaN anywhere in the inputs ends in STAY.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The worst-case cost of a migration, seconds (the paper's Table 1 total).
pub const DEFAULT_COST_S: f64 = 900.0;
/// The paper's threshold: migrate when the gain is above 30%.
pub const DEFAULT_THRESHOLD: f64 = 0.30;
/// Load samples older than this are not trusted for a target, milliseconds.
pub const DEFAULT_MAX_AGE_MS: u64 = 5000;

/// An override of the rule for experiments (point 24); the plan still records the rule's own
/// decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Force {
    /// Migrate whenever a feasible target exists (never without one).
    ForceMigrate,
    /// Never migrate.
    ForceStay,
}

/// The deployment's parameters of the rule (point 23).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// `C`: the assumed cost of a migration, seconds.
    pub cost_s: f64,
    /// Migrate iff the gain is strictly above this.
    pub threshold: f64,
    /// Staleness bound of load data, milliseconds.
    pub max_age_ms: u64,
    pub force: Option<Force>,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            cost_s: DEFAULT_COST_S,
            threshold: DEFAULT_THRESHOLD,
            max_age_ms: DEFAULT_MAX_AGE_MS,
            force: None,
        }
    }
}

/// A policy that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("invalid rescheduler policy: {0}")]
    Policy(String),
}

impl Policy {
    /// Checks `cost_s` is finite and `>= 0` and `threshold` is finite in `[0, 1)` (the gain is
    /// at most 1, so a threshold of 1 or more would never migrate; a negative one would migrate
    /// at a loss). [`plan()`] does not check: call this once when the config is loaded.
    pub fn validate(&self) -> Result<(), PlanError> {
        if !(self.cost_s.is_finite() && self.cost_s >= 0.0) {
            return Err(PlanError::Policy(format!(
                "cost_s {} must be a finite number of seconds >= 0",
                self.cost_s
            )));
        }
        if !(self.threshold.is_finite() && (0.0..1.0).contains(&self.threshold)) {
            return Err(PlanError::Policy(format!(
                "threshold {} must be in [0, 1)",
                self.threshold
            )));
        }
        Ok(())
    }
}

/// The rescheduling gain `(ret_current - (ret_new + cost)) / ret_current`.
///
/// `ret_current <= 0` (or NaN) gives `-inf`: an application with no time left never migrates.
/// Any other input that makes the formula NaN also gives `-inf`, so the gain is never NaN.
/// `ret_new = +inf` (no schedule) gives `-inf` too.
pub fn gain(ret_current_s: f64, ret_new_s: f64, cost_s: f64) -> f64 {
    if ret_current_s.is_nan() || ret_current_s <= 0.0 {
        return f64::NEG_INFINITY;
    }
    let g = (ret_current_s - (ret_new_s + cost_s)) / ret_current_s;
    if g.is_nan() {
        f64::NEG_INFINITY
    } else {
        g
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Decision {
    Migrate,
    Stay,
}

/// The rule alone: `(gain, Migrate iff gain > threshold)`. `policy.force` is not applied here
/// (an override needs a target, which only [`plan()`] knows).
pub fn decide(ret_current_s: f64, ret_new_s: f64, policy: &Policy) -> (f64, Decision) {
    let g = gain(ret_current_s, ret_new_s, policy.cost_s);
    let d = if g > policy.threshold {
        Decision::Migrate
    } else {
        Decision::Stay
    };
    (g, d)
}

/// One host's latest load sample, as the monitoring fabric reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostLoad {
    pub host: String,
    pub cpus: f64,
    pub free_cpus: f64,
    pub load1: f64,
    /// Speed relative to the reference host the predictions are for (1 = as fast, 2 = twice
    /// as fast); NaN when unknown. The service divides a `host.load` benchmark score by the
    /// reference host's.
    pub bench: f64,
    /// How old the sample is, milliseconds.
    pub age_ms: u64,
}

/// What the rescheduler knows about one running application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppState {
    pub app_id: String,
    pub hosts: Vec<String>,
    pub cpus_needed: u32,
    /// 0..=1, from the contract monitor.
    pub fraction_completed: f64,
    /// Predicted time of the whole application on an unloaded reference host, seconds.
    pub total_predicted_s: f64,
    /// The contract monitor's average of actual/predicted.
    pub observed_avg_ratio: f64,
}

/// Why the rescheduler is evaluating (notes §1.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mode {
    /// The contract monitor asked for a migration.
    OnRequest,
    /// Another application completed and freed hosts.
    Opportunistic,
}

/// One evaluation and everything it was based on: the content of a decision event (point 16).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub app_id: String,
    pub mode: Mode,
    /// What to do: the natural decision, or the override when one applied.
    pub decision: Decision,
    /// What the rule alone says.
    pub natural: Decision,
    /// Whether an override set `decision`. A force-migrate without a feasible target does not
    /// apply (`false`, STAY).
    pub forced: bool,
    pub gain: f64,
    pub ret_current_s: f64,
    /// `+inf` when there is no feasible target (serialized as JSON `null`).
    pub ret_new_s: f64,
    pub cost_s: f64,
    pub threshold: f64,
    /// Sorted by name, duplicates removed.
    pub current_hosts: Vec<String>,
    /// Sorted by name; empty when there is no feasible target.
    pub target_hosts: Vec<String>,
    /// Hosts that could have been candidates but whose sample was too old, sorted by name.
    pub excluded_stale: Vec<String>,
    pub reason: String,
}

impl Plan {
    /// Whether the contract monitor must be told to adjust its limits (points 18 and 19):
    /// every STAY answering a request does, so the request is no longer in flight; an
    /// opportunistic STAY tells nobody.
    pub fn adjust_tolerance(&self) -> bool {
        self.mode == Mode::OnRequest && self.decision == Decision::Stay
    }
}

/// The predicted slowdown of `host` against the reference host: `max(1, load1 / cpus) / bench`
/// (`bench` taken as 1 when unknown). `None` when `cpus` or `load1` is unusable.
pub fn slowdown(host: &HostLoad) -> Option<f64> {
    if !(host.cpus.is_finite() && host.cpus > 0.0 && host.load1.is_finite() && host.load1 >= 0.0) {
        return None;
    }
    let speed = if host.bench.is_finite() && host.bench > 0.0 {
        host.bench
    } else {
        1.0
    };
    Some((host.load1 / host.cpus).max(1.0) / speed)
}

struct Candidate<'a> {
    name: &'a str,
    slowdown: f64,
    free: f64,
}

/// The best target for `needed` CPUs (see the module docs) and its slowdown.
fn choose(mut cands: Vec<Candidate<'_>>, needed: f64) -> Option<(Vec<String>, f64)> {
    cands.sort_by(|a, b| a.slowdown.total_cmp(&b.slowdown).then(a.name.cmp(b.name)));
    let mut acc = 0.0;
    let best = cands.iter().find(|c| {
        acc += c.free;
        acc >= needed
    })?;
    let s_star = best.slowdown;
    let mut pool: Vec<&Candidate<'_>> = cands.iter().filter(|c| c.slowdown <= s_star).collect();
    pool.sort_by(|a, b| {
        b.free
            .total_cmp(&a.free)
            .then(a.slowdown.total_cmp(&b.slowdown))
            .then(a.name.cmp(b.name))
    });
    let (mut acc, mut worst) = (0.0, f64::NEG_INFINITY);
    let mut target = Vec::new();
    for c in pool {
        if acc >= needed {
            break;
        }
        acc += c.free;
        worst = worst.max(c.slowdown);
        target.push(c.name.to_string());
    }
    target.sort();
    Some((target, worst))
}

/// The whole decision for `app` given the hosts' latest samples (see the module docs).
pub fn plan(app: &AppState, view: &[HostLoad], mode: Mode, policy: &Policy) -> Plan {
    let current: BTreeSet<&str> = app.hosts.iter().map(String::as_str).collect();

    // One sample per host: the freshest, the first of equally fresh ones.
    let mut latest: BTreeMap<&str, &HostLoad> = BTreeMap::new();
    for h in view {
        latest
            .entry(h.host.as_str())
            .and_modify(|old| {
                if h.age_ms < old.age_ms {
                    *old = h;
                }
            })
            .or_insert(h);
    }

    let mut excluded_stale = Vec::new();
    let mut cands = Vec::new();
    for (&name, h) in &latest {
        if current.contains(name) {
            continue;
        }
        if h.age_ms > policy.max_age_ms {
            excluded_stale.push(name.to_string());
            continue;
        }
        let free = h.free_cpus.floor();
        if let Some(s) = slowdown(h).filter(|_| free.is_finite() && free >= 1.0) {
            cands.push(Candidate {
                name,
                slowdown: s,
                free,
            });
        }
    }
    let n_cands = cands.len();
    let free_total: f64 = cands.iter().map(|c| c.free).sum();

    let remaining = (1.0 - app.fraction_completed.clamp(0.0, 1.0)) * app.total_predicted_s;
    let current_load = latest
        .iter()
        .filter(|(name, h)| current.contains(*name) && h.age_ms <= policy.max_age_ms)
        .filter_map(|(_, h)| slowdown(h))
        .fold(None, |acc: Option<f64>, s| Some(acc.map_or(s, |a| a.max(s))));
    let current_slowdown = match current_load {
        Some(s) if !app.observed_avg_ratio.is_nan() => app.observed_avg_ratio.max(s),
        _ => app.observed_avg_ratio,
    };
    let ret_current_s = remaining * current_slowdown;
    let needed = f64::from(app.cpus_needed);
    let chosen = if app.cpus_needed == 0 {
        None
    } else {
        choose(cands, needed)
    };
    let (target_hosts, ret_new_s) = match chosen {
        Some((t, s)) => (t, remaining * s),
        None => (Vec::new(), f64::INFINITY),
    };
    let (gain, rule) = decide(ret_current_s, ret_new_s, policy);
    let natural = if target_hosts.is_empty() {
        Decision::Stay
    } else {
        rule
    };

    let mut reason = if app.cpus_needed == 0 {
        "no feasible target: the application needs 0 cpus".to_string()
    } else if target_hosts.is_empty() {
        format!(
            "no feasible target: {n_cands} candidate hosts ({} stale excluded) offer {free_total} free cpus, \
             {} needed",
            excluded_stale.len(),
            app.cpus_needed
        )
    } else {
        let cmp = if natural == Decision::Migrate { ">" } else { "<=" };
        format!(
            "gain {gain:.4} {cmp} threshold {:.4} (ret_current {ret_current_s:.1} s, ret_new {ret_new_s:.1} s \
             on {} hosts, cost {:.1} s)",
            policy.threshold,
            target_hosts.len(),
            policy.cost_s
        )
    };
    let (decision, forced) = match policy.force {
        None => (natural, false),
        Some(Force::ForceStay) => {
            reason.push_str("; force-stay override");
            (Decision::Stay, true)
        }
        Some(Force::ForceMigrate) if !target_hosts.is_empty() => {
            reason.push_str("; force-migrate override");
            (Decision::Migrate, true)
        }
        Some(Force::ForceMigrate) => {
            reason.push_str("; force-migrate ignored: no target");
            (Decision::Stay, false)
        }
    };

    Plan {
        app_id: app.app_id.clone(),
        mode,
        decision,
        natural,
        forced,
        gain,
        ret_current_s,
        ret_new_s,
        cost_s: policy.cost_s,
        threshold: policy.threshold,
        current_hosts: current.iter().map(|s| s.to_string()).collect(),
        target_hosts,
        excluded_stale,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    use proptest::prelude::*;

    fn host(name: &str, cpus: f64, load1: f64, bench: f64) -> HostLoad {
        HostLoad {
            host: name.into(),
            cpus,
            free_cpus: (cpus - load1).max(0.0).floor(),
            load1,
            bench,
            age_ms: 100,
        }
    }

    fn app(hosts: &[&str], cpus_needed: u32, fraction: f64, total: f64, ratio: f64) -> AppState {
        AppState {
            app_id: "qr".into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            cpus_needed,
            fraction_completed: fraction,
            total_predicted_s: total,
            observed_avg_ratio: ratio,
        }
    }

    fn with_cost(cost_s: f64) -> Policy {
        Policy {
            cost_s,
            ..Policy::default()
        }
    }

    /// Point 11.
    #[test]
    fn gain_formula_migrates_above_threshold() {
        let (g, d) = decide(3000.0, 1000.0, &Policy::default());
        assert!((g - 1100.0 / 3000.0).abs() < 1e-12);
        assert!((g - 0.3667).abs() < 1e-4);
        assert_eq!(d, Decision::Migrate);
    }

    /// Point 12: exactly 0.30 stays.
    #[test]
    fn threshold_is_strict() {
        let (g, d) = decide(2000.0, 500.0, &Policy::default());
        assert_eq!(g, 0.30);
        assert_eq!(d, Decision::Stay);
    }

    #[test]
    fn gain_without_time_left_is_minus_infinity() {
        for rc in [0.0, -5.0, f64::NAN] {
            assert_eq!(gain(rc, 0.0, 900.0), f64::NEG_INFINITY);
        }
        assert_eq!(gain(1000.0, f64::INFINITY, 900.0), f64::NEG_INFINITY);
        assert_eq!(gain(1000.0, f64::NAN, 900.0), f64::NEG_INFINITY);
        assert_eq!(gain(f64::INFINITY, 10.0, 900.0), f64::NEG_INFINITY);
        assert_eq!(decide(0.0, 0.0, &Policy::default()).1, Decision::Stay);
    }

    /// Point 13: with C = 900 nothing migrates at ret_current <= 1285.7 s, whatever ret_new.
    #[test]
    fn near_completion_never_migrates() {
        for rc in [1200.0, 1285.0, 1285.7] {
            let mut rn: f64 = 0.0;
            while rn <= rc {
                assert_eq!(decide(rc, rn, &Policy::default()).1, Decision::Stay, "{rc} {rn}");
                rn += 0.5;
            }
        }
        assert_eq!(decide(1200.0, 0.0, &Policy::default()).0, 0.25);
        // Just past the bound an instant new schedule does pay off.
        assert_eq!(decide(1286.0, 0.0, &Policy::default()).1, Decision::Migrate);
    }

    /// Point 14: ret_new = (1 - 0.25) * 4000 = 3000 on an unloaded reference-speed host, and
    /// ret_current carries the observed slowdown.
    #[test]
    fn remaining_time_inputs() {
        let view = [host("b1", 8.0, 0.0, f64::NAN)];
        let p = plan(
            &app(&["a1"], 4, 0.25, 4000.0, 2.0),
            &view,
            Mode::OnRequest,
            &Policy::default(),
        );
        assert_eq!(p.ret_new_s, 3000.0);
        assert_eq!(p.ret_current_s, 6000.0);
        assert_eq!(p.gain, (6000.0 - 3900.0) / 6000.0);
        assert_eq!(
            (p.decision, p.natural, p.forced),
            (Decision::Migrate, Decision::Migrate, false)
        );
        assert_eq!(p.target_hosts, vec!["b1"]);
        assert_eq!(p.current_hosts, vec!["a1"]);
        assert!(!p.adjust_tolerance());
        // A host twice as fast halves ret_new.
        let view = [host("b1", 8.0, 0.0, 2.0)];
        let p = plan(
            &app(&["a1"], 4, 0.25, 4000.0, 2.0),
            &view,
            Mode::OnRequest,
            &Policy::default(),
        );
        assert_eq!(p.ret_new_s, 1500.0);
    }

    /// Point 23: C = 420 (the cost the paper measured) flips a case that stays at C = 900.
    #[test]
    fn cost_420_flips_a_stay() {
        // ret_current = 0.75 * 4000 * 1.8 = 5400, ret_new = 3000.
        let a = app(&["a1", "a2"], 4, 0.25, 4000.0, 1.8);
        let view = [host("b1", 4.0, 0.0, 1.0)];
        let p900 = plan(&a, &view, Mode::OnRequest, &with_cost(900.0));
        assert!((p900.gain - 1500.0 / 5400.0).abs() < 1e-12, "{}", p900.gain);
        assert_eq!(p900.decision, Decision::Stay);
        assert!(p900.adjust_tolerance());
        let p420 = plan(&a, &view, Mode::OnRequest, &with_cost(420.0));
        assert!((p420.gain - 1980.0 / 5400.0).abs() < 1e-12, "{}", p420.gain);
        assert_eq!(p420.decision, Decision::Migrate);
        // The same flip on the bare rule.
        assert_eq!(decide(2000.0, 500.0, &with_cost(900.0)).1, Decision::Stay);
        assert_eq!(decide(2000.0, 500.0, &with_cost(420.0)).1, Decision::Migrate);
    }

    /// Point 24: overrides decide but the natural decision is recorded.
    #[test]
    fn overrides_record_the_natural_decision() {
        let view = [host("b1", 8.0, 0.0, 1.0)];
        let stays = app(&["a1"], 4, 0.25, 4000.0, 1.0);
        let moves = app(&["a1"], 4, 0.25, 4000.0, 3.0);
        let force = |f| Policy {
            force: Some(f),
            ..Policy::default()
        };
        let p = plan(&stays, &view, Mode::OnRequest, &force(Force::ForceMigrate));
        assert_eq!(
            (p.decision, p.natural, p.forced),
            (Decision::Migrate, Decision::Stay, true)
        );
        assert_eq!(p.target_hosts, vec!["b1"]);
        let p = plan(&moves, &view, Mode::OnRequest, &force(Force::ForceStay));
        assert_eq!(
            (p.decision, p.natural, p.forced),
            (Decision::Stay, Decision::Migrate, true)
        );
        assert!(p.reason.contains("force-stay"));
        // Point 22 wins over force-migrate: no target, no STOP.
        let p = plan(&moves, &[], Mode::OnRequest, &force(Force::ForceMigrate));
        assert_eq!(
            (p.decision, p.natural, p.forced),
            (Decision::Stay, Decision::Stay, false)
        );
        assert!(p.reason.contains("ignored"));
    }

    /// Point 22: no feasible target (none, full hosts, only the current hosts) means STAY.
    /// Point 14: ret_current uses the latest load of the current hosts when it shows more
    /// slowdown than the whole-history average (a slowdown that just began).
    #[test]
    fn ret_current_follows_fresh_load_of_the_current_hosts() {
        let a = app(&["a"], 1, 0.5, 4000.0, 1.2);
        let view = vec![host("a", 8.0, 40.0, f64::NAN), host("b", 8.0, 0.5, f64::NAN)];
        let p = plan(&a, &view, Mode::OnRequest, &with_cost(100.0));
        assert_eq!(p.ret_current_s, 2000.0 * 5.0);
        assert_eq!(p.ret_new_s, 2000.0);
        assert_eq!(p.decision, Decision::Migrate);
        // An unloaded current host does not lower the observed slowdown.
        let view = vec![host("a", 8.0, 0.5, f64::NAN), host("b", 8.0, 0.5, f64::NAN)];
        let p = plan(&a, &view, Mode::OnRequest, &with_cost(100.0));
        assert_eq!(p.ret_current_s, 2000.0 * 1.2);
        // A stale sample of the current host is not used.
        let mut stale = host("a", 8.0, 40.0, f64::NAN);
        stale.age_ms = 60_000;
        let p = plan(
            &a,
            &[stale, host("b", 8.0, 0.5, f64::NAN)],
            Mode::OnRequest,
            &with_cost(100.0),
        );
        assert_eq!(p.ret_current_s, 2000.0 * 1.2);
    }

    #[test]
    fn no_target_stays() {
        let a = app(&["a1", "a2"], 4, 0.1, 100_000.0, 10.0);
        let views: [Vec<HostLoad>; 4] = [
            vec![],
            vec![host("a1", 8.0, 0.0, 1.0), host("a2", 8.0, 0.0, 1.0)],
            vec![host("b1", 4.0, 3.5, 1.0), host("b2", 2.0, 0.0, 1.0)],
            vec![host("b1", f64::NAN, 0.0, 1.0), host("b2", 0.0, 0.0, 1.0)],
        ];
        for view in &views {
            let p = plan(&a, view, Mode::OnRequest, &Policy::default());
            assert_eq!(
                (p.decision, p.natural),
                (Decision::Stay, Decision::Stay),
                "{view:?}"
            );
            assert!(p.target_hosts.is_empty());
            assert_eq!(p.ret_new_s, f64::INFINITY);
            assert_eq!(p.gain, f64::NEG_INFINITY);
            assert!(p.reason.starts_with("no feasible target"), "{}", p.reason);
        }
        let p = plan(
            &app(&["a1"], 0, 0.1, 1e5, 10.0),
            &views[2],
            Mode::OnRequest,
            &Policy::default(),
        );
        assert_eq!(p.decision, Decision::Stay);
    }

    /// Point 15: stale hosts are not candidates and are listed; current hosts are not listed.
    #[test]
    fn stale_hosts_excluded_and_listed() {
        let mut fast = host("b-fast", 16.0, 0.0, 4.0);
        fast.age_ms = 5001;
        let mut stale_current = host("a1", 8.0, 0.0, 1.0);
        stale_current.age_ms = 60_000;
        let mut edge = host("b-edge", 8.0, 0.0, 1.0);
        edge.age_ms = 5000; // exactly the bound is still fresh
        let view = [fast, stale_current, edge];
        let p = plan(
            &app(&["a1"], 4, 0.0, 10_000.0, 3.0),
            &view,
            Mode::Opportunistic,
            &Policy::default(),
        );
        assert_eq!(p.excluded_stale, vec!["b-fast"]);
        assert_eq!(p.target_hosts, vec!["b-edge"]);
        assert_eq!(p.decision, Decision::Migrate);
        assert!(!p.adjust_tolerance(), "opportunistic never adjusts");
    }

    /// Point 21 and the choice: fastest first, fewest hosts at that speed, names break ties.
    #[test]
    fn target_choice() {
        // Four 2-cpu current hosts; one free 8-cpu host can take the whole job.
        let a = app(&["a1", "a2", "a3", "a4"], 8, 0.0, 10_000.0, 2.0);
        let view = [
            host("b2", 2.0, 0.0, 1.0),
            host("b1", 2.0, 0.0, 1.0),
            host("c1", 8.0, 0.0, 1.0),
            host("d1", 2.0, 0.0, 1.0),
            host("d2", 2.0, 0.0, 1.0),
        ];
        let p = plan(&a, &view, Mode::OnRequest, &Policy::default());
        assert_eq!(p.target_hosts, vec!["c1"]);
        // The set runs at its slowest host's pace: the fastest host lacks cpus alone, so it
        // is paired with the faster of the rest (two equal ones: the first by name).
        let view = [
            host("fast", 4.0, 0.0, 2.0),
            host("mid-b", 4.0, 0.0, 1.5),
            host("mid-a", 4.0, 0.0, 1.5),
            host("slow", 8.0, 0.0, 1.0),
        ];
        let p = plan(&a, &view, Mode::OnRequest, &Policy::default());
        assert_eq!(p.target_hosts, vec!["fast", "mid-a"]);
        assert!((p.ret_new_s - 10_000.0 / 1.5).abs() < 1e-9);
        // Load above the cpu count slows a host down.
        let mut busy = host("busy", 8.0, 16.0, 1.0);
        busy.free_cpus = 8.0; // disagreeing data
        assert_eq!(slowdown(&busy), Some(2.0));
        assert_eq!(slowdown(&host("x", 8.0, 2.0, f64::NAN)), Some(1.0));
        assert_eq!(slowdown(&host("x", 8.0, 2.0, -1.0)), Some(1.0));
        assert_eq!(slowdown(&host("x", 0.0, 2.0, 1.0)), None);
    }

    #[test]
    fn duplicate_samples_use_the_freshest() {
        let mut old = host("b1", 8.0, 0.0, 1.0);
        old.age_ms = 4000;
        let mut new = host("b1", 8.0, 8.0, 1.0); // now full
        new.age_ms = 10;
        let a = app(&["a1"], 4, 0.0, 10_000.0, 3.0);
        let p = plan(
            &a,
            &[old.clone(), new.clone()],
            Mode::OnRequest,
            &Policy::default(),
        );
        assert!(p.target_hosts.is_empty());
        let p2 = plan(&a, &[new, old], Mode::OnRequest, &Policy::default());
        assert_eq!(format!("{p:?}"), format!("{p2:?}"));
    }

    #[test]
    fn serializes_to_json_and_policy_from_json() {
        let view = [host("b1", 8.0, 0.0, 1.0)];
        let p = plan(
            &app(&["a1"], 4, 0.25, 4000.0, 3.0),
            &view,
            Mode::OnRequest,
            &Policy::default(),
        );
        let v: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert_eq!(v["decision"], "MIGRATE");
        assert_eq!(v["mode"], "ON_REQUEST");
        assert_eq!(v["target_hosts"][0], "b1");
        let p = plan(
            &app(&["a1"], 4, 0.25, 4000.0, 3.0),
            &[],
            Mode::Opportunistic,
            &Policy::default(),
        );
        let v: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert!(v["ret_new_s"].is_null() && v["gain"].is_null());
        let pol: Policy = serde_json::from_str(r#"{"cost_s": 420, "force": "FORCE_STAY"}"#).unwrap();
        assert_eq!(
            pol,
            Policy {
                cost_s: 420.0,
                force: Some(Force::ForceStay),
                ..Policy::default()
            }
        );
        assert!(serde_json::from_str::<Policy>(r#"{"cost": 1}"#).is_err());
        pol.validate().unwrap();
        for bad in [
            with_cost(-1.0),
            with_cost(f64::NAN),
            Policy {
                threshold: 1.0,
                ..Policy::default()
            },
            Policy {
                threshold: -0.1,
                ..Policy::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    /// One host of a random view: (cpus, load1 as a fraction of 1.5 x cpus, free CPUs published
    /// apart from the load as a fraction of cpus (1 in 5), benchmark (7 in 10), age).
    fn host_params() -> impl Strategy<Value = (f64, f64, Option<f64>, Option<f64>, u64)> {
        (
            prop::sample::select(vec![1.0, 2.0, 4.0, 8.0, 16.0]),
            0.0..1.0f64,
            prop::option::weighted(0.2, 0.0..=1.0f64),
            prop::option::weighted(0.7, 0.5..2.0f64),
            0..8000u64,
        )
    }

    /// A view of 1 to 10 hosts `h00`.., the indices of the application's current hosts (1 to 3
    /// of them, in any order) and the same view in another order.
    fn view_current_shuffled() -> impl Strategy<Value = (Vec<HostLoad>, Vec<usize>, Vec<HostLoad>)> {
        prop::collection::vec(host_params(), 1..=10)
            .prop_map(|hosts| {
                hosts
                    .into_iter()
                    .enumerate()
                    .map(|(i, (cpus, load, free, bench, age_ms))| {
                        let mut h = host(&format!("h{i:02}"), cpus, load * cpus * 1.5, f64::NAN);
                        if let Some(f) = free {
                            h.free_cpus = f * cpus;
                        }
                        if let Some(b) = bench {
                            h.bench = b;
                        }
                        h.age_ms = age_ms;
                        h
                    })
                    .collect::<Vec<_>>()
            })
            .prop_flat_map(|view| {
                let n = view.len();
                (
                    Just(view.clone()),
                    prop::sample::subsequence((0..n).collect::<Vec<_>>(), 1..=n.min(3)).prop_shuffle(),
                    Just(view).prop_shuffle(),
                )
            })
    }

    fn force() -> impl Strategy<Value = Option<Force>> {
        prop_oneof![
            1 => Just(Some(Force::ForceMigrate)),
            1 => Just(Some(Force::ForceStay)),
            8 => Just(None),
        ]
    }

    /// A random case: the application, the view, the view in another order, the mode and the
    /// policy.
    fn random_case() -> impl Strategy<Value = (AppState, Vec<HostLoad>, Vec<HostLoad>, Mode, Policy)> {
        (
            view_current_shuffled(),
            (1..=12u32, 0.0..1.0f64, 1000.0..20_000.0f64, 0.5..4.0f64),
            prop::bool::ANY,
            (0.0..1500.0f64, 0.0..0.6f64, 1000..8000u64, force()),
        )
            .prop_map(
                |(
                    (view, current, shuffled),
                    (cpus, fraction, total, ratio),
                    on_request,
                    (cost_s, threshold, max_age_ms, force),
                )| {
                    let names: Vec<&str> = current.iter().map(|&i| view[i].host.as_str()).collect();
                    let a = app(&names, cpus, fraction, total, ratio);
                    let mode = if on_request {
                        Mode::OnRequest
                    } else {
                        Mode::Opportunistic
                    };
                    let policy = Policy {
                        cost_s,
                        threshold,
                        max_age_ms,
                        force,
                    };
                    (a, view, shuffled, mode, policy)
                },
            )
    }

    /// STYLE rule 7: determinism, the gain formula, and no STOP without a proper target.
    #[test]
    fn property_determinism_and_safety() {
        let migrations = Cell::new(0u32);
        // 1000 cases: about 15 % migrate, so that the check of the generator below (at least
        // 10 %) fails by chance about once in 10^5 runs (at 500 cases: once in 10^3).
        let config = ProptestConfig::with_cases(1000);
        proptest!(config, |((a, view, shuffled_view, mode, policy) in random_case())| {
            let p = plan(&a, &view, mode, &policy);
            prop_assert_eq!(format!("{p:?}"), format!("{:?}", plan(&a, &view, mode, &policy)));
            let mut shuffled = a.clone();
            shuffled.hosts.reverse();
            prop_assert_eq!(
                format!("{p:?}"),
                format!("{:?}", plan(&shuffled, &shuffled_view, mode, &policy))
            );

            if p.target_hosts.is_empty() {
                prop_assert_eq!(p.gain, f64::NEG_INFINITY);
            } else {
                let want = (p.ret_current_s - (p.ret_new_s + policy.cost_s)) / p.ret_current_s;
                prop_assert!(
                    (p.gain - want).abs() <= 1e-12 * want.abs().max(1.0),
                    "gain {} want {}",
                    p.gain,
                    want
                );
            }
            let rule = p.gain > policy.threshold && !p.target_hosts.is_empty();
            prop_assert_eq!(p.natural == Decision::Migrate, rule);
            if policy.force.is_none() {
                prop_assert_eq!((p.decision, p.forced), (p.natural, false));
            }
            for s in &p.excluded_stale {
                let h = view.iter().find(|h| &h.host == s).unwrap();
                prop_assert!(h.age_ms > policy.max_age_ms && !a.hosts.contains(s), "{s} excluded as stale");
            }
            if p.decision == Decision::Migrate {
                migrations.set(migrations.get() + 1);
                prop_assert!(!p.target_hosts.is_empty());
                let mut free = 0.0;
                for t in &p.target_hosts {
                    prop_assert!(!a.hosts.contains(t), "{t} is a current host");
                    let h = view.iter().find(|h| &h.host == t).unwrap();
                    prop_assert!(h.age_ms <= policy.max_age_ms, "{t} is stale");
                    free += h.free_cpus.floor();
                }
                prop_assert!(free >= f64::from(a.cpus_needed), "{free} free CPUs for {}", a.cpus_needed);
            }
        });
        let migrations = migrations.get();
        eprintln!("{migrations} migrations in 1000 cases");
        assert!(
            migrations > 100,
            "the generator should exercise migrations: {migrations}"
        );
    }

    /// No thrash: when the observed ratio matches the model, a migration A -> B is never
    /// followed by B -> A, and a second migration is always to a strictly faster set.
    #[test]
    fn property_no_round_trip() {
        let (firsts, pairs) = (Cell::new(0u32), Cell::new(0u32));
        // Cheap migrations and a low threshold, so that second migrations happen at all.
        let case = (random_case(), 0.0..50.0f64, 0.0..0.05f64);
        let config = ProptestConfig::with_cases(2000);
        proptest!(config, |(((mut a, view, _, mode, mut policy), cost_s, threshold) in case)| {
            policy.force = None;
            policy.cost_s = cost_s;
            policy.threshold = threshold;
            policy.max_age_ms = u64::MAX;
            let model = |hosts: &[String]| {
                hosts
                    .iter()
                    .map(|n| view.iter().find(|h| &h.host == n).and_then(slowdown).unwrap())
                    .fold(f64::NEG_INFINITY, f64::max)
            };
            a.observed_avg_ratio = model(&a.hosts);
            let p = plan(&a, &view, mode, &policy);
            if p.decision != Decision::Migrate || a.fraction_completed >= 1.0 {
                return Ok(());
            }
            firsts.set(firsts.get() + 1);
            let mut b = a.clone();
            b.hosts = p.target_hosts.clone();
            b.observed_avg_ratio = model(&b.hosts);
            let q = plan(&b, &view, mode, &policy);
            if q.decision == Decision::Migrate {
                pairs.set(pairs.get() + 1);
                prop_assert_ne!(&q.target_hosts, &p.current_hosts, "back to the start");
                prop_assert!(q.ret_new_s < p.ret_new_s, "{} then {}", p.ret_new_s, q.ret_new_s);
            }
        });
        let (firsts, pairs) = (firsts.get(), pairs.get());
        eprintln!("{firsts} migrations, {pairs} followed by a second one");
        assert!(firsts > 400 && pairs > 10, "{firsts} {pairs}");
    }
}
