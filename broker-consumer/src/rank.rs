//! The ranking: a pure function of a view snapshot, a job and a policy (STYLE rule 7). No I/O
//! and no clock: the snapshot carries the time it was taken, and ages are computed from it.
//!
//! For each resource (notes/broker-and-meta-scheduling.md §1.3):
//!
//! 1. **Filter** on hard requirements: total CPUs, memory, architecture, software, the job's
//!    candidate list. A resource whose value is unknown does not pass.
//! 2. **Freshness**: data older than `max_age_ms` is stale. Stale resources are excluded, or
//!    (`stale = "conservative"`) estimated as if no CPU were free and one more job were
//!    queued — never as fresh.
//! 3. **Execution time** `T_exec = mean over the job's benchmarks b of T_ref × P_ref(b) / P_r(b)`
//!    (higher score = faster). A resource without a score for `b` gets the lowest score any
//!    resource in the view publishes for `b` (so less information never predicts faster); if
//!    none publishes it, the reference score. A job without benchmarks runs `T_ref` anywhere.
//! 4. **Queue wait** from load (monotone: more waiting jobs or fewer free CPUs never shorten
//!    it): 0 when `free_cpus >= cpus` and nothing waits; otherwise
//!    `typical_job_s × (queue_waiting + deficit) / slots` with `deficit = clamp((cpus −
//!    free_cpus) / cpus, 0, 1)` and `slots = max(1, floor(total_cpus / cpus))`. A reservation
//!    overrides it: the job starts at the reservation's start.
//! 5. **Stage-in/out**: the user's times, or bytes over the resource's bandwidth (a resource
//!    without one gets the lowest bandwidth in the view, else `default_bandwidth_mbps`).
//!    Stage-out is 0 unless given.
//!
//! `TTS = stage_in + wait`, `TTD = TTS + exec + stage_out`. Policies: `ttd` orders by TTD,
//! `tts` by TTS (then TTD), `utility` by the user class's combined partial utility (highest
//! first; utility 0 is rejected), `cost` keeps the resources meeting the deadline and budget
//! with a published price and orders by `tradeoff × cost' + (1 − tradeoff) × TTD'` (both
//! min-max normalized over those resources). Every order is total: ties fall to TTD, then the
//! resource name.

use gma_core::Refuse;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::job::{Job, JobError};
use crate::utility::combine;

/// One resource as the broker knows it at a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub name: String,
    pub site: String,
    /// The producer record it was learned from.
    pub producer: String,
    pub total_cpus: f64,
    pub free_cpus: f64,
    pub load1: f64,
    pub queue_waiting: f64,
    pub memory_mb: f64,
    /// Empty when unknown.
    pub arch: String,
    pub os: String,
    pub software: Vec<String>,
    /// Benchmark scores by name (`specint`, `specfp`, ...); higher is faster.
    pub benchmarks: BTreeMap<String, f64>,
    /// Bandwidth for stage-in/out, Mbit/s; NaN when unknown.
    pub bandwidth_mbps: f64,
    /// Price per CPU-hour; NaN when the resource publishes none.
    pub cost_per_cpu_hour: f64,
    /// When the load data was sampled (UTC ns).
    pub updated_ns: i64,
    /// Seconds from the snapshot to a reserved start, when a reservation is held for the job.
    pub reservation_start_s: Option<f64>,
}

impl Resource {
    /// A resource with nothing known but its name (every number NaN).
    pub fn unknown(name: &str) -> Resource {
        Resource {
            name: name.to_string(),
            site: String::new(),
            producer: String::new(),
            total_cpus: f64::NAN,
            free_cpus: f64::NAN,
            load1: f64::NAN,
            queue_waiting: f64::NAN,
            memory_mb: f64::NAN,
            arch: String::new(),
            os: String::new(),
            software: Vec::new(),
            benchmarks: BTreeMap::new(),
            bandwidth_mbps: f64::NAN,
            cost_per_cpu_hour: f64::NAN,
            updated_ns: 0,
            reservation_start_s: None,
        }
    }

    pub fn age_ms(&self, now_ns: i64) -> u64 {
        (now_ns.saturating_sub(self.updated_ns).max(0) / 1_000_000) as u64
    }
}

/// The view at one instant: what [`rank`] reads.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub now_ns: i64,
    pub resources: Arc<[Arc<Resource>]>,
}

impl Snapshot {
    pub fn new(now_ns: i64, resources: Vec<Resource>) -> Snapshot {
        Snapshot {
            now_ns,
            resources: resources.into_iter().map(Arc::new).collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    #[default]
    Ttd,
    Tts,
    Utility,
    Cost,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        Some(match s {
            "" | "ttd" => Policy::Ttd,
            "tts" => Policy::Tts,
            "utility" => Policy::Utility,
            "cost" => Policy::Cost,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Ttd => "ttd",
            Policy::Tts => "tts",
            Policy::Utility => "utility",
            Policy::Cost => "cost",
        }
    }
}

/// What to do with a resource whose data is older than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleMode {
    #[default]
    Exclude,
    Conservative,
}

/// Ranking parameters (the `[rank]` table of the broker config).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RankConfig {
    /// Load data older than this is stale.
    pub max_age_ms: u64,
    pub stale: StaleMode,
    /// Typical run time of a job already queued or running, for the load-based wait.
    pub typical_job_s: f64,
    /// Bandwidth assumed when no resource publishes one, Mbit/s.
    pub default_bandwidth_mbps: f64,
}

impl Default for RankConfig {
    fn default() -> Self {
        RankConfig {
            max_age_ms: 5_000,
            stale: StaleMode::Exclude,
            typical_job_s: 600.0,
            default_bandwidth_mbps: 100.0,
        }
    }
}

impl RankConfig {
    /// Checks every field; the error (INVALID_ARGUMENT) names the first bad one.
    pub fn validate(&self) -> Result<(), crate::error::Error> {
        let bad = |m: &str| Err(crate::error::Error::invalid_argument(m));
        if self.max_age_ms == 0 {
            return bad("rank.max_age_ms must be > 0");
        }
        if !self.typical_job_s.is_finite() || self.typical_job_s < 0.0 {
            return bad("rank.typical_job_s must be a finite number >= 0");
        }
        if !self.default_bandwidth_mbps.is_finite() || self.default_bandwidth_mbps <= 0.0 {
            return bad("rank.default_bandwidth_mbps must be a finite number > 0");
        }
        Ok(())
    }
}

/// One ranked resource and the predictions that placed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub resource: String,
    pub site: String,
    pub rank: u32,
    pub start_s: f64,
    pub completion_s: f64,
    pub exec_s: f64,
    pub wait_s: f64,
    pub stage_in_s: f64,
    pub stage_out_s: f64,
    pub utility: f64,
    pub cost: f64,
    /// What the policy ordered by (lower is better).
    pub score: f64,
    pub stale: bool,
    pub age_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub resource: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ranking {
    /// Best first; a total order.
    pub ranked: Vec<Ranked>,
    pub rejected: Vec<Rejected>,
    /// Resources in the snapshot that were stale.
    pub stale: u32,
}

/// What to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Most ranked entries (0 = all).
    pub limit: usize,
    /// Also explain every resource filtered out.
    pub rejected: bool,
}

/// The load-based queue-wait estimate (see the module doc); monotone in both inputs.
pub fn load_wait_s(
    cpus: u32,
    total_cpus: f64,
    free_cpus: f64,
    queue_waiting: f64,
    typical_job_s: f64,
) -> f64 {
    let need = f64::from(cpus.max(1));
    let free = if free_cpus.is_nan() {
        0.0
    } else {
        free_cpus.max(0.0)
    };
    let queue = if queue_waiting.is_nan() {
        0.0
    } else {
        queue_waiting.max(0.0)
    };
    if free >= need && queue <= 0.0 {
        return 0.0;
    }
    let slots = if total_cpus.is_finite() {
        (total_cpus / need).floor().max(1.0)
    } else {
        1.0
    };
    let deficit = ((need - free) / need).clamp(0.0, 1.0);
    typical_job_s * (queue + deficit) / slots
}

/// Predicted execution time on a resource with `scores` (see the module doc); `worst` gives
/// the conservative score for a benchmark the resource lacks.
pub fn exec_time_s(job: &Job, scores: &BTreeMap<String, f64>, worst: &BTreeMap<&str, f64>) -> f64 {
    scaled_exec_s(job, |b, p_ref| {
        scores
            .get(b)
            .copied()
            .filter(|s| s.is_finite() && *s > 0.0)
            .or_else(|| worst.get(b).copied())
            .unwrap_or(p_ref)
    })
}

/// The benchmark-scaled execution time of `job` where `score(benchmark, reference score)`
/// gives the score that stands for each of its reference benchmarks: the mean over them of
/// `reference_time_s × p_ref / p`; `reference_time_s` when the job names none. The broker's
/// ranking ([`exec_time_s`]) and the federation's per-class estimate share it.
pub fn scaled_exec_s(job: &Job, score: impl Fn(&str, f64) -> f64) -> f64 {
    if job.reference.is_empty() {
        return job.reference_time_s;
    }
    let sum: f64 = job
        .reference
        .iter()
        .map(|(b, p_ref)| job.reference_time_s * p_ref / score(b, *p_ref))
        .sum();
    sum / job.reference.len() as f64
}

fn transfer_s(time: Option<f64>, bytes: Option<f64>, bandwidth_mbps: f64) -> f64 {
    match (time, bytes) {
        (Some(t), _) => t,
        (None, Some(b)) => b * 8.0 / (bandwidth_mbps * 1e6),
        (None, None) => 0.0,
    }
}

struct Cand {
    idx: usize,
    start_s: f64,
    completion_s: f64,
    exec_s: f64,
    wait_s: f64,
    stage_in_s: f64,
    stage_out_s: f64,
    utility: f64,
    cost: f64,
    score: f64,
    stale: bool,
}

fn filter_reason(job: &Job, r: &Resource) -> Option<String> {
    if !job.candidates.is_empty() && !job.candidates.contains(&r.name) {
        return Some("not among the job's candidates".into());
    }
    if r.total_cpus.is_nan() {
        return Some("total CPUs unknown".into());
    }
    if r.total_cpus < f64::from(job.cpus) {
        return Some(format!("has {} CPUs, the job needs {}", r.total_cpus, job.cpus));
    }
    if job.memory_mb > 0.0 {
        if r.memory_mb.is_nan() {
            return Some("memory unknown".into());
        }
        if r.memory_mb < job.memory_mb {
            return Some(format!(
                "has {} MiB, the job needs {}",
                r.memory_mb, job.memory_mb
            ));
        }
    }
    if !job.arch.is_empty() && r.arch != job.arch {
        return Some(if r.arch.is_empty() {
            "architecture unknown".into()
        } else {
            format!("architecture {} is not {}", r.arch, job.arch)
        });
    }
    if let Some(sw) = job.software.iter().find(|s| !r.software.contains(s)) {
        return Some(format!("does not provide {sw}"));
    }
    None
}

fn attribute(r: &Resource, c: &Cand, free: f64, queue: f64, name: &str) -> f64 {
    match name {
        "free_cpus" => free,
        "cpus" => r.total_cpus,
        "memory_mb" => r.memory_mb,
        "load1" => r.load1,
        "queue_waiting" => queue,
        "start_s" => c.start_s,
        "completion_s" => c.completion_s,
        "exec_s" => c.exec_s,
        "cost" => c.cost,
        other => other
            .strip_prefix("bench_")
            .and_then(|b| r.benchmarks.get(b).copied())
            .unwrap_or(f64::NAN),
    }
}

/// Ranks the snapshot's resources for `job` under `policy`. Errors only for an invalid job.
pub fn rank(
    snap: &Snapshot,
    job: &Job,
    policy: Policy,
    cfg: &RankConfig,
    limits: Limits,
) -> Result<Ranking, JobError> {
    job.validate()?;
    let resources = &snap.resources;
    // Conservative fill-ins, over the whole view.
    let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
    for b in job.reference.keys() {
        let w = resources
            .iter()
            .filter_map(|r| r.benchmarks.get(b).copied())
            .filter(|s| s.is_finite() && *s > 0.0)
            .fold(f64::INFINITY, f64::min);
        if w.is_finite() {
            worst.insert(b.as_str(), w);
        }
    }
    let needs_bw = job.input_bytes.is_some() || job.output_bytes.is_some();
    let worst_bw = if needs_bw {
        let w = resources
            .iter()
            .map(|r| r.bandwidth_mbps)
            .filter(|b| b.is_finite() && *b > 0.0)
            .fold(f64::INFINITY, f64::min);
        if w.is_finite() {
            w
        } else {
            cfg.default_bandwidth_mbps
        }
    } else {
        cfg.default_bandwidth_mbps
    };

    let mut out = Ranking::default();
    let mut cands: Vec<Cand> = Vec::with_capacity(resources.len());
    let mut partials: Vec<f64> = Vec::with_capacity(job.utility.len());
    let weights: Vec<f64> = job.utility.iter().map(|r| r.weight).collect();
    for (idx, r) in resources.iter().enumerate() {
        let age = r.age_ms(snap.now_ns);
        let stale = age > cfg.max_age_ms;
        if stale {
            out.stale += 1;
        }
        let reject = |out: &mut Ranking, reason: String| {
            if limits.rejected {
                out.rejected.push(Rejected {
                    resource: r.name.clone(),
                    reason,
                });
            }
        };
        if let Some(reason) = filter_reason(job, r) {
            reject(&mut out, reason);
            continue;
        }
        if stale && cfg.stale == StaleMode::Exclude {
            reject(
                &mut out,
                format!("stale: its data is {age} ms old (bound {} ms)", cfg.max_age_ms),
            );
            continue;
        }
        // Stale data is never used as fresh: no CPU free, one more job queued.
        let (free, queue) = if stale {
            (
                0.0,
                if r.queue_waiting.is_nan() {
                    1.0
                } else {
                    r.queue_waiting.max(0.0) + 1.0
                },
            )
        } else {
            (r.free_cpus, r.queue_waiting)
        };
        let bw = if r.bandwidth_mbps.is_finite() && r.bandwidth_mbps > 0.0 {
            r.bandwidth_mbps
        } else {
            worst_bw
        };
        let stage_in_s = transfer_s(job.stage_in_s, job.input_bytes, bw);
        let stage_out_s = transfer_s(job.stage_out_s, job.output_bytes, bw);
        let exec_s = exec_time_s(job, &r.benchmarks, &worst);
        let (start_s, wait_s) = match r.reservation_start_s {
            Some(t) => (t.max(stage_in_s), (t - stage_in_s).max(0.0)),
            None => {
                let w = load_wait_s(job.cpus, r.total_cpus, free, queue, cfg.typical_job_s);
                (stage_in_s + w, w)
            }
        };
        let completion_s = start_s + exec_s + stage_out_s;
        let cost = r.cost_per_cpu_hour * f64::from(job.cpus) * exec_s / 3600.0;
        let mut c = Cand {
            idx,
            start_s,
            completion_s,
            exec_s,
            wait_s,
            stage_in_s,
            stage_out_s,
            utility: f64::NAN,
            cost,
            score: completion_s,
            stale,
        };
        match policy {
            Policy::Ttd => {}
            Policy::Tts => c.score = start_s,
            Policy::Utility => {
                partials.clear();
                partials.extend(
                    job.utility
                        .iter()
                        .map(|q| q.partial(attribute(r, &c, free, queue, &q.attribute))),
                );
                let u = combine(job.user_class, job.utility_operator, &partials, &weights);
                if u <= 0.0 {
                    reject(
                        &mut out,
                        format!("utility 0 for class {}", job.user_class.as_str()),
                    );
                    continue;
                }
                c.utility = u;
                c.score = -u;
            }
            Policy::Cost => {
                if cost.is_nan() {
                    reject(&mut out, "publishes no price".into());
                    continue;
                }
                if let Some(d) = job.deadline_s {
                    if completion_s > d {
                        reject(
                            &mut out,
                            format!("misses the deadline: completes in {completion_s:.0} s > {d} s"),
                        );
                        continue;
                    }
                }
                if let Some(b) = job.budget {
                    if cost > b {
                        reject(&mut out, format!("over budget: costs {cost:.4} > {b}"));
                        continue;
                    }
                }
            }
        }
        cands.push(c);
    }
    if policy == Policy::Cost && !cands.is_empty() {
        let alpha = job.tradeoff.unwrap_or(1.0);
        let span = |f: fn(&Cand) -> f64| {
            let lo = cands.iter().map(f).fold(f64::INFINITY, f64::min);
            let hi = cands.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
            (lo, hi - lo)
        };
        let (c_lo, c_span) = span(|c| c.cost);
        let (t_lo, t_span) = span(|c| c.completion_s);
        let norm = |v: f64, lo: f64, span: f64| if span > 0.0 { (v - lo) / span } else { 0.0 };
        for c in &mut cands {
            c.score = alpha * norm(c.cost, c_lo, c_span) + (1.0 - alpha) * norm(c.completion_s, t_lo, t_span);
        }
    }
    let order = |a: &Cand, b: &Cand| -> Ordering {
        a.score
            .total_cmp(&b.score)
            .then(a.completion_s.total_cmp(&b.completion_s))
            .then_with(|| {
                if policy == Policy::Cost {
                    a.cost.total_cmp(&b.cost)
                } else {
                    Ordering::Equal
                }
            })
            .then_with(|| resources[a.idx].name.cmp(&resources[b.idx].name))
    };
    let keep = if limits.limit == 0 {
        cands.len()
    } else {
        limits.limit.min(cands.len())
    };
    if keep < cands.len() {
        // Only the best `keep` need a full order.
        cands.select_nth_unstable_by(keep, order);
        cands.truncate(keep);
    }
    cands.sort_unstable_by(order);
    out.ranked = cands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let r = &resources[c.idx];
            Ranked {
                resource: r.name.clone(),
                site: r.site.clone(),
                rank: i as u32 + 1,
                start_s: c.start_s,
                completion_s: c.completion_s,
                exec_s: c.exec_s,
                wait_s: c.wait_s,
                stage_in_s: c.stage_in_s,
                stage_out_s: c.stage_out_s,
                utility: c.utility,
                cost: c.cost,
                score: c.score,
                stale: c.stale,
                age_ms: r.age_ms(snap.now_ns),
            }
        })
        .collect();
    Ok(out)
}

#[cfg(test)]
mod tests;
