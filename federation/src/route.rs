//! `route()`: where a job goes — a pure function of the site's own view, the peers' summaries,
//! the job, the policy and the time (STYLE rule 7: no I/O, no clock inside).
//!
//! `route(local, peers, job, policy, now) -> Local(host) | Forward(site) | Queue(reason)`:
//!
//! 1. **Local now.** If a fresh local host that passes the job's requirements has the CPUs
//!    free, the job runs there (the host the broker's `rank()` orders first by predicted
//!    completion). A site never sends away a job it can start at once (HTCondor's "flock only
//!    when it cannot run here"); a job whose local start is predicted within
//!    `local_start_ok_s` also stays.
//! 2. **Candidates.** A peer is a candidate only if all hold: its session is live; its summary
//!    is fresh (`age <= valid_for_ms`, age measured on our clock plus the sender's age at send:
//!    a stale summary is never used); it is not in the job's visited list nor excluded for
//!    this job; the link and the job allow one more hop; it accepts foreign jobs and its quota
//!    holds the job's CPUs; the work already in flight to it plus the job stays within its cap
//!    (`max(in_flight_fraction × advertised free CPUs, advertised free CPUs on its best node)`);
//!    and a class matches **conservatively**: the arch matches, one node has the job's CPUs
//!    free (`cpus_free_max_node`), and every node of the class has the job's memory
//!    (`memory_mb_min_node`). A job that names software or candidate hosts is never forwarded
//!    (summaries carry neither).
//! 3. **Estimates.** `T_peer = stage_in + predicted_start(probe shape ≥ cpus) + exec(T_ref ×
//!    P_ref / class benchmark minimum) + stage_out + forward_overhead_s + age_s ×
//!    stale_penalty`, over the best matching class. `T_local` = the local completion estimate
//!    ([`local_estimate`]): a first-come-first-served replay of the site's running jobs'
//!    releases and of the queue ahead, with backfill; the broker's load-based wait when
//!    nothing local ever fits.
//! 4. **Decision.** Forward to the best candidate only if it clearly beats local:
//!    `T_peer × (1 + hysteresis) < T_local` and `T_local − T_peer ≥ min_gain_s`; else queue.
//!    Ties between peers break by a hash of (job id, site), so origins spread over equal peers,
//!    and never by the order the peers are given in: the result is deterministic.
//!
//! The caller applies the herd control: after each forward it debits its copy of the peer's
//! summary ([`debit`]) until a newer summary arrives, which also counts as work in flight.
//!
//! That is the default policy, `policy = "ttd"`. With `policy = "utility"` steps 1, 3 and 4
//! are Vasques' Algorithm 1 instead ([`utility`]): the job's partial utility on each local
//! host against its utility on each candidate peer's resume; the same candidate checks (2)
//! and the same debit apply.

use gma_core::Refuse;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use gma_broker::{rank_candidates, scaled_exec_s, Job, Policy, RankConfig, Ranked, Snapshot};
use serde::Deserialize;

use crate::error::Error;
use crate::summary::{ClassStats, Summary, HIST_GRADES};

/// Queued jobs replayed exactly by [`local_estimate`]; the rest of the queue counts as a fluid
/// amount of work spread over the site's CPUs.
pub const MAX_REPLAYED: usize = 64;

/// Which decision `route()` makes (`[route] policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Forwarding {
    /// Forward a job that cannot start here to the peer that clearly beats the local
    /// predicted completion (the module doc).
    #[default]
    Ttd,
    /// Vasques' Algorithm 1: forward to the first peer whose resume gives the job a higher
    /// utility than the best local host, else assign to that host ([`utility`]).
    Utility,
}

impl Forwarding {
    pub fn parse(s: &str) -> Option<Forwarding> {
        Some(match s {
            "" | "ttd" => Forwarding::Ttd,
            "utility" => Forwarding::Utility,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Forwarding::Ttd => "ttd",
            Forwarding::Utility => "utility",
        }
    }
}

/// The forwarding policy (`[route]` of the federation config).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutePolicy {
    /// `ttd` (default) or `utility`.
    pub policy: Forwarding,
    /// A peer must beat the local estimate by this factor: `T_peer × (1 + h) < T_local`.
    pub hysteresis: f64,
    /// ... and by at least this many seconds.
    pub min_gain_s: f64,
    /// Run locally whenever the local start is within this many seconds.
    pub local_start_ok_s: f64,
    /// Added to every peer estimate: the cost of going there (round trips, transfer).
    pub forward_overhead_s: f64,
    /// Seconds of penalty per second of summary age.
    pub stale_penalty: f64,
    /// Cap on CPUs in flight to one peer, as a fraction of its advertised free CPUs.
    pub in_flight_fraction: f64,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        RoutePolicy {
            policy: Forwarding::Ttd,
            hysteresis: 0.10,
            min_gain_s: 30.0,
            local_start_ok_s: 0.0,
            forward_overhead_s: 5.0,
            stale_penalty: 1.0,
            in_flight_fraction: 0.25,
        }
    }
}

impl RoutePolicy {
    pub fn validate(&self) -> Result<(), Error> {
        for (name, v) in [
            ("hysteresis", self.hysteresis),
            ("min_gain_s", self.min_gain_s),
            ("local_start_ok_s", self.local_start_ok_s),
            ("forward_overhead_s", self.forward_overhead_s),
            ("stale_penalty", self.stale_penalty),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid_argument(format!(
                    "route.{name} must be a finite number >= 0"
                )));
            }
        }
        if !(self.in_flight_fraction.is_finite()
            && self.in_flight_fraction > 0.0
            && self.in_flight_fraction <= 1.0)
        {
            return Err(Error::invalid_argument(
                "route.in_flight_fraction must be within (0, 1]",
            ));
        }
        Ok(())
    }
}

/// One of the site's own running jobs: `cpus` come back on `host` in `remaining_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub host: String,
    pub cpus: u32,
    pub remaining_s: f64,
}

/// A job queued ahead (FIFO order).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ahead {
    pub cpus: u32,
    pub exec_s: f64,
}

/// The site as `route()` sees it.
#[derive(Debug, Clone, Copy)]
pub struct LocalView<'a> {
    /// The hosts, free CPUs net of the site's own running jobs.
    pub snapshot: &'a Snapshot,
    pub rank: &'a RankConfig,
    pub releases: &'a [Release],
    pub ahead: &'a [Ahead],
}

/// A peer as `route()` sees it.
#[derive(Debug, Clone, Copy)]
pub struct PeerView<'a> {
    pub site: &'a str,
    /// The summary as received (the cap is taken from it).
    pub advertised: &'a Summary,
    /// The same after this site's debits for forwards not yet reflected.
    pub summary: &'a Summary,
    /// When it arrived (our clock, ns).
    pub received_ns: i64,
    /// Heard from within the session timeout.
    pub live: bool,
    /// Hops the link allows (peer 1, parent/child 2 by default).
    pub link_hops: u32,
    /// CPUs forwarded to it and not yet reflected in a summary.
    pub in_flight_cpus: u32,
}

impl PeerView<'_> {
    /// Age of the summary at `now_ns`: our time since it arrived plus its age when sent.
    pub fn age_ms(&self, now_ns: i64) -> u64 {
        let here = (now_ns.saturating_sub(self.received_ns).max(0) / 1_000_000) as u64;
        here.saturating_add(self.summary.age_at_send_ms)
    }

    pub fn fresh(&self, now_ns: i64) -> bool {
        self.age_ms(now_ns) <= u64::from(self.summary.valid_for_ms)
    }
}

/// The job being routed.
#[derive(Debug, Clone, Copy)]
pub struct RouteJob<'a> {
    pub id: &'a str,
    pub job: &'a Job,
    /// Sites the job was at or was sent to (this one included).
    pub visited: &'a [String],
    /// Forwards still allowed.
    pub hops_left: u32,
    /// Peers that refused it lately.
    pub excluded: &'a [String],
}

#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    Local { host: String },
    Forward { site: String },
    Queue { reason: String },
}

/// A decision and what it was made from.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub route: Route,
    /// Local predicted completion (s from now), when it was needed.
    pub local_s: Option<f64>,
    /// The best candidate peer and its estimate.
    pub best_peer: Option<(String, f64)>,
    /// Peers that passed every check.
    pub candidates: usize,
    /// `utility` policy: the best local utility and the peer utility that decided (the peer
    /// forwarded to, else the highest seen).
    pub utility: Option<(f64, Option<(String, f64)>)>,
}

/// The local estimate for a job.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalEstimate {
    /// A host where it can start now.
    pub now_host: Option<String>,
    /// Predicted start and completion (s from now); +inf when nothing local ever fits.
    pub start_s: f64,
    pub completion_s: f64,
}

fn transfer(t: Option<f64>) -> f64 {
    t.unwrap_or(0.0)
}

fn ranked(local: &LocalView<'_>, job: &Job) -> Vec<Ranked> {
    rank_candidates(local.snapshot, job, Policy::Ttd, local.rank).unwrap_or_default()
}

/// The first ranked host (best predicted completion) with the job's CPUs free now.
pub(crate) fn host_now(local: &LocalView<'_>, ranking: &[Ranked], cpus: u32) -> Option<usize> {
    ranking.iter().position(|r| {
        !r.stale
            && local
                .snapshot
                .resources
                .iter()
                .find(|x| x.name == r.resource)
                .is_some_and(|x| x.free_cpus.is_finite() && x.free_cpus >= f64::from(cpus))
    })
}

#[derive(PartialEq)]
struct Ev(f64, usize, u32);
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on time, then host index.
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

/// Predicted start of `cpus` on one of the `eligible` hosts (indices into the snapshot, in
/// preference order): replay the releases and the queue ahead (FIFO with backfill).
fn replay_start(local: &LocalView<'_>, eligible: &[usize], cpus: u32) -> Option<(usize, f64)> {
    let res = &local.snapshot.resources;
    let now = local.snapshot.now_ns;
    let mut free: Vec<f64> = res
        .iter()
        .map(|r| {
            if r.age_ms(now) > local.rank.max_age_ms || !r.free_cpus.is_finite() {
                0.0
            } else {
                r.free_cpus.max(0.0).floor()
            }
        })
        .collect();
    let total: Vec<f64> = res
        .iter()
        .map(|r| {
            if r.total_cpus.is_finite() {
                r.total_cpus
            } else {
                0.0
            }
        })
        .collect();
    let mut heap = BinaryHeap::new();
    for rel in local.releases {
        if let Some(i) = res.iter().position(|r| r.name == rel.host) {
            heap.push(Ev(rel.remaining_s.max(0.0), i, rel.cpus));
        }
    }
    let mut pending: Vec<Ahead> = local.ahead.iter().take(MAX_REPLAYED).copied().collect();
    let mut t = 0.0;
    loop {
        // The queue ahead takes what fits, in order (backfill: a small job may pass a big one).
        let mut k = 0;
        while k < pending.len() {
            let need = f64::from(pending[k].cpus);
            if let Some(i) = (0..free.len()).find(|i| free[*i] >= need && total[*i] >= need) {
                free[i] -= need;
                heap.push(Ev(t + pending[k].exec_s.max(0.0), i, pending[k].cpus));
                pending.remove(k);
            } else {
                k += 1;
            }
        }
        if let Some(i) = eligible.iter().copied().find(|i| free[*i] >= f64::from(cpus)) {
            return Some((i, t));
        }
        let Ev(at, i, c) = heap.pop()?;
        t = at;
        free[i] += f64::from(c);
        // Everything released at the same instant before placing.
        while heap.peek().is_some_and(|e| e.0 <= t) {
            if let Some(Ev(_, j, c2)) = heap.pop() {
                free[j] += f64::from(c2);
            }
        }
    }
}

/// The local estimate: a host with the CPUs free now (best by predicted completion), else the
/// replayed start, else the broker's load-based estimate plus the queue's work spread over the
/// site's CPUs.
pub fn local_estimate(local: &LocalView<'_>, job: &Job) -> LocalEstimate {
    let ranking = ranked(local, job);
    let stage = transfer(job.stage_in_s) + transfer(job.stage_out_s);
    if let Some(i) = host_now(local, &ranking, job.cpus) {
        let r = &ranking[i];
        return LocalEstimate {
            now_host: Some(r.resource.clone()),
            start_s: r.stage_in_s,
            completion_s: r.stage_in_s + r.exec_s + r.stage_out_s,
        };
    }
    if ranking.is_empty() {
        return LocalEstimate {
            now_host: None,
            start_s: f64::INFINITY,
            completion_s: f64::INFINITY,
        };
    }
    let res = &local.snapshot.resources;
    let eligible: Vec<usize> = ranking
        .iter()
        .filter(|r| !r.stale)
        .filter_map(|r| res.iter().position(|x| x.name == r.resource))
        .collect();
    let rest: f64 = local
        .ahead
        .iter()
        .skip(MAX_REPLAYED)
        .map(|a| f64::from(a.cpus) * a.exec_s)
        .sum();
    let cpus_total: f64 = res
        .iter()
        .filter(|r| r.age_ms(local.snapshot.now_ns) <= local.rank.max_age_ms)
        .map(|r| r.total_cpus)
        .filter(|c| c.is_finite())
        .sum::<f64>()
        .max(1.0);
    let fluid = rest / cpus_total;
    match replay_start(local, &eligible, job.cpus) {
        Some((i, t)) => {
            let exec = ranking
                .iter()
                .find(|r| r.resource == res[i].name)
                .map_or(job.reference_time_s, |r| r.exec_s);
            let start = t + fluid;
            LocalEstimate {
                now_host: None,
                start_s: start,
                completion_s: start + exec + stage,
            }
        }
        None => {
            let best = &ranking[0];
            LocalEstimate {
                now_host: None,
                start_s: best.start_s + fluid,
                completion_s: best.completion_s + fluid,
            }
        }
    }
}

/// The class of `s` that holds the job, conservatively (see the module doc), with the best
/// (lowest) estimated execution time; `None` when no class does.
fn best_class<'s>(s: &'s Summary, job: &Job) -> Option<(&'s ClassStats, f64)> {
    s.classes
        .iter()
        .filter(|(k, c)| {
            k.matches_arch(&job.arch)
                && c.nodes_up > 0
                && c.cpus_free_max_node >= job.cpus
                && (job.memory_mb <= 0.0 || c.mem_min_node as f64 >= job.memory_mb)
        })
        .map(|(_, c)| (c, peer_exec_s(c, job)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Execution time on a class: the class's slowest node for each benchmark (conservative); a
/// benchmark the class does not publish counts at the reference score.
pub fn peer_exec_s(c: &ClassStats, job: &Job) -> f64 {
    scaled_exec_s(job, |b, p_ref| c.benchmarks.get(b).map_or(p_ref, |r| r.min))
}

/// FNV-1a over (job id, site): the tie-break between equal peers.
pub(crate) fn tie(job: &str, site: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.bytes().chain([0u8]).chain(site.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cap on CPUs in flight to a peer (see the module doc).
pub fn in_flight_cap(advertised: &Summary, fraction: f64) -> u32 {
    let by_fraction = (fraction * f64::from(advertised.cpus_free_sum())).ceil() as u32;
    by_fraction.max(advertised.cpus_free_max_node())
}

/// Why a peer is not a candidate (`None`: it is one), with its estimate when it is.
pub fn peer_check(
    p: &PeerView<'_>,
    job: &RouteJob<'_>,
    policy: &RoutePolicy,
    now_ns: i64,
) -> Result<f64, Error> {
    peer_eligible(p, job, policy, now_ns)?;
    let j = job.job;
    let Some((_, exec)) = best_class(p.summary, j) else {
        return Err(Error::failed_precondition("no class has a node that fits now"));
    };
    let start = p.summary.probe_start_for(j.cpus);
    let start = if start.is_finite() { start } else { 0.0 };
    let age_s = p.age_ms(now_ns) as f64 / 1000.0;
    Ok(transfer(j.stage_in_s)
        + start
        + exec
        + transfer(j.stage_out_s)
        + policy.forward_overhead_s
        + age_s * policy.stale_penalty)
}

/// The checks of step 2 that do not depend on the estimate (both policies): why `p` may not
/// take the job.
pub fn peer_eligible(
    p: &PeerView<'_>,
    job: &RouteJob<'_>,
    policy: &RoutePolicy,
    now_ns: i64,
) -> Result<(), Error> {
    let j = job.job;
    if !p.live {
        return Err(Error::failed_precondition("session not live"));
    }
    if !p.fresh(now_ns) {
        return Err(Error::failed_precondition(format!(
            "summary stale ({} ms old, valid for {} ms)",
            p.age_ms(now_ns),
            p.summary.valid_for_ms
        )));
    }
    if job.visited.iter().any(|v| v == p.site) {
        return Err(Error::failed_precondition("already visited"));
    }
    if job.excluded.iter().any(|v| v == p.site) {
        return Err(Error::failed_precondition("refused this job lately"));
    }
    if job.hops_left.min(p.link_hops) == 0 {
        return Err(Error::failed_precondition("no hop left"));
    }
    if !j.software.is_empty() || !j.candidates.is_empty() {
        return Err(Error::failed_precondition(
            "the job names software or hosts: summaries cannot vouch for them",
        ));
    }
    if !p.summary.load.accepts_foreign {
        return Err(Error::failed_precondition("accepts no foreign jobs"));
    }
    if p.summary.load.foreign_quota_free < j.cpus {
        return Err(Error::failed_precondition("foreign CPU quota exhausted"));
    }
    let cap = in_flight_cap(p.advertised, policy.in_flight_fraction);
    if p.in_flight_cpus.saturating_add(j.cpus) > cap {
        return Err(Error::failed_precondition(format!(
            "{} CPUs in flight (cap {cap})",
            p.in_flight_cpus
        )));
    }
    Ok(())
}

/// Decides where `job` goes (see the module doc). Pure and deterministic.
pub fn route(
    local: &LocalView<'_>,
    peers: &[PeerView<'_>],
    job: &RouteJob<'_>,
    policy: &RoutePolicy,
    now_ns: i64,
) -> Decision {
    if policy.policy == Forwarding::Utility {
        return utility::route_utility(local, peers, job, policy, now_ns);
    }
    let j = job.job;
    // 1. A host has the CPUs free now: run here.
    let ranking = ranked(local, j);
    if let Some(i) = host_now(local, &ranking, j.cpus) {
        let r = &ranking[i];
        return Decision {
            route: Route::Local {
                host: r.resource.clone(),
            },
            local_s: Some(r.stage_in_s + r.exec_s + r.stage_out_s),
            best_peer: None,
            candidates: 0,
            utility: None,
        };
    }
    // 2. Candidates, cheapest checks first; the local estimate only when one exists.
    let mut best: Option<(f64, u64, &str)> = None;
    let mut candidates = 0;
    for p in peers {
        let Ok(t) = peer_check(p, job, policy, now_ns) else {
            continue;
        };
        candidates += 1;
        let key = (t, tie(job.id, p.site), p.site);
        let better = match best {
            None => true,
            Some(b) => key.0.total_cmp(&b.0).then(key.1.cmp(&b.1)).then(key.2.cmp(b.2)) == Ordering::Less,
        };
        if better {
            best = Some(key);
        }
    }
    let Some((t_peer, _, site)) = best else {
        return Decision {
            route: Route::Queue {
                reason: if peers.is_empty() {
                    "no local host has the CPUs free".into()
                } else {
                    "no local host has the CPUs free and no peer can take it".into()
                },
            },
            local_s: None,
            best_peer: None,
            candidates,
            utility: None,
        };
    };
    // 3. The local estimate; a start soon enough stays here.
    let est = local_estimate(local, j);
    let best_peer = Some((site.to_string(), t_peer));
    if est.start_s - transfer(j.stage_in_s) <= policy.local_start_ok_s {
        return Decision {
            route: Route::Queue {
                reason: format!("starts here within {} s", policy.local_start_ok_s),
            },
            local_s: Some(est.completion_s),
            best_peer,
            candidates,
            utility: None,
        };
    }
    // 4. Forward only when the peer clearly beats local.
    let t_local = est.completion_s;
    let route = if t_peer * (1.0 + policy.hysteresis) < t_local && t_local - t_peer >= policy.min_gain_s {
        Route::Forward {
            site: site.to_string(),
        }
    } else {
        Route::Queue {
            reason: format!("best peer {site} ({t_peer:.0} s) does not clearly beat local ({t_local:.0} s)"),
        }
    };
    Decision {
        route,
        local_s: Some(t_local),
        best_peer,
        candidates,
        utility: None,
    }
}

/// Debits the origin's copy of a peer's summary for a job of `cpus` (of `arch`, "" = any)
/// forwarded there, so that it never over-promises: every matching class may have received it,
/// so each loses the CPUs from its sum, one node from every histogram grade (the node that took
/// the job can only have dropped out of grades), and its best node keeps only what is provable
/// (the old best minus the job, or the largest grade still counted).
pub fn debit(s: &mut Summary, cpus: u32, arch: &str) {
    for (k, c) in s.classes.iter_mut() {
        if !k.matches_arch(arch) {
            continue;
        }
        c.cpus_free_sum = c.cpus_free_sum.saturating_sub(cpus);
        debit_digests(c, cpus);
        for h in c.free_hist.iter_mut() {
            *h = h.saturating_sub(1);
        }
        let provable = HIST_GRADES
            .iter()
            .zip(c.free_hist)
            .filter(|(_, n)| *n > 0)
            .map(|(g, _)| *g)
            .max()
            .unwrap_or(0);
        c.cpus_free_max_node = c
            .cpus_free_max_node
            .saturating_sub(cpus)
            .max(provable.min(c.cpus_free_max_node))
            .min(c.cpus_free_sum);
    }
    s.load.foreign_quota_free = s.load.foreign_quota_free.saturating_sub(cpus);
    s.load.jobs_running = s.load.jobs_running.saturating_add(1);
}

/// The resume's named nodes lose the job's CPUs too (either may have taken it).
fn debit_digests(c: &mut crate::summary::ClassStats, cpus: u32) {
    for d in [&mut c.least_loaded, &mut c.most_memory].into_iter().flatten() {
        d.cpus_free = d.cpus_free.saturating_sub(cpus);
    }
}

pub mod utility;

#[cfg(test)]
mod tests;
