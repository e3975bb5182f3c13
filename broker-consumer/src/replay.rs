//! The paper's randomized coallocation experiment (§5.2.2), over any [`Reserver`].
//!
//! Each trial: `machines` machines of one CPU each, one `background_s` reservation per machine
//! placed uniformly at random inside the trial's window, and a coallocation of `jobs`
//! one-CPU jobs of `job_s` each with start window `[base, base + window_s]` (less `job_s` at
//! the end when jobs must end inside the window) and deviation ε. Homogeneous: every job can
//! use every machine. Heterogeneous: the last job can use exactly one machine (drawn per
//! trial), which forces exchanges when another job took it first. The two experiments draw
//! from different seeds (the heterogeneous one from `seed ^ HETEROGENEOUS_SALT`), as the
//! paper's two series of 1000 tests were separate runs.
//!
//! What varies between runs of one experiment ([`ReplayConfig`]): whether the jobs are
//! `flexible`, how a modify is done ([`ModifyMode`]), and `compete`, the probability that
//! another job takes capacity the coallocator releases while it runs (a [`Competing`]
//! manager), before the coallocator can ask for it again — the way the paper's
//! release-then-create modify on Maui can lose a reservation (§3.3.2).
//!
//! Trials are deterministic in `(seed, index)` and each uses its own time range, so trials
//! never interact even on one shared manager. [`feasible`] decides by brute force whether a
//! trial could be coallocated at all (against the background alone), which bounds what the
//! coallocator can achieve.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::calendar::MemoryReserver;
use crate::coalloc::{
    coallocate_with, CoJob, CoOptions, CoOutcome, CoRequest, CoStats, CoallocError, ModifyMode,
};
use crate::reserve::{Answer, ModifyAnswer, Reservation, ReserveError, ReserveRequest, Reserver};

/// Owner of the trials' background reservations.
pub const BACKGROUND_OWNER: &str = "background";
/// Owner of the trials' coallocations.
pub const REPLAY_OWNER: &str = "replay";
/// Owner of the reservations a [`Competing`] manager makes for other jobs.
pub const COMPETITOR_OWNER: &str = "competitor";
/// Mixed into the seed of the heterogeneous experiment's draws.
pub const HETEROGENEOUS_SALT: u64 = 0x4845_5445_524f_0001;
/// Mixed into the seed of the competitor's draws.
const COMPETE_SALT: u64 = 0x434f_4d50_4554_0002;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Homogeneous,
    Heterogeneous,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReplayConfig {
    pub trials: u32,
    pub seed: u64,
    pub scenario: Scenario,
    pub machines: u32,
    pub jobs: u32,
    pub window_s: i64,
    pub epsilon_s: i64,
    pub job_s: i64,
    pub background_s: i64,
    /// Whether jobs must end inside the window (`T_l = base + window_s − job_s`) or only
    /// start inside it (`T_l = base + window_s`).
    pub job_must_end_in_window: bool,
    /// CPUs per machine (the jobs take one each, a background reservation the whole machine).
    /// 1 is the paper's set-up as written; more lets jobs share a machine.
    pub machine_cpus: u32,
    /// The jobs' [`CoJob::flexible`].
    pub flexible: bool,
    /// How the coallocator modifies reservations.
    pub modify: ModifyMode,
    /// Probability that capacity the coallocator releases while it runs is taken at once by
    /// another job (for the reservation's whole former span). 0 = only the background exists,
    /// as in the paper's tests.
    pub compete: f64,
}

impl Default for ReplayConfig {
    /// The paper's setup: 4 jobs × 4 machines, 4 h window, ε = 5 min, 1 h jobs, 20 min
    /// background per machine.
    fn default() -> Self {
        ReplayConfig {
            trials: 1000,
            seed: 0x5EED_2008,
            scenario: Scenario::Homogeneous,
            machines: 4,
            jobs: 4,
            window_s: 4 * 3600,
            epsilon_s: 300,
            job_s: 3600,
            background_s: 1200,
            job_must_end_in_window: true,
            machine_cpus: 1,
            flexible: true,
            modify: ModifyMode::Atomic,
            compete: 0.0,
        }
    }
}

impl ReplayConfig {
    /// The seed of this experiment's draws (separate for the two experiments).
    pub fn experiment_seed(&self) -> u64 {
        match self.scenario {
            Scenario::Homogeneous => self.seed,
            Scenario::Heterogeneous => self.seed ^ HETEROGENEOUS_SALT,
        }
    }

    fn options(&self, trace: bool, origin_s: i64) -> CoOptions {
        CoOptions {
            modify: self.modify,
            trace,
            origin_s,
        }
    }
}

/// One generated trial.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    pub index: u32,
    pub base_s: i64,
    /// One background block per machine: (machine, start); each lasts `background_s`.
    pub background: Vec<(String, i64)>,
    pub background_s: i64,
    /// CPUs of every machine; a background block takes all of them.
    pub machine_cpus: u32,
    pub request: CoRequest,
}

/// Machine names `m0`, `m1`, … for `cfg.machines` machines.
pub fn machine_names(cfg: &ReplayConfig) -> Vec<String> {
    (0..cfg.machines).map(|i| format!("m{i}")).collect()
}

/// An in-memory manager with one calendar of `cfg.machine_cpus` CPUs per machine.
pub fn memory_machines(cfg: &ReplayConfig) -> MemoryReserver {
    let names = machine_names(cfg);
    MemoryReserver::with_resources(names.iter().map(|n| (n.as_str(), cfg.machine_cpus.max(1))))
}

/// Trial `index` of `cfg`, placed at `base_s`. Deterministic in `(cfg.experiment_seed(), index)`:
/// each index reads its own ChaCha stream, so trials do not depend on each other's draws.
pub fn trial(cfg: &ReplayConfig, index: u32, base_s: i64, machine_names: &[String]) -> Trial {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.experiment_seed());
    rng.set_stream(u64::from(index));
    // The block lies inside [base, base + window]: its start is at most window − length.
    let span = cfg.window_s.saturating_sub(cfg.background_s).max(0);
    let background: Vec<(String, i64)> = machine_names
        .iter()
        .map(|m| (m.clone(), base_s + rng.random_range(0..=span)))
        .collect();
    let only = if machine_names.is_empty() {
        0
    } else {
        rng.random_range(0..machine_names.len())
    };
    let jobs = (0..cfg.jobs)
        .map(|i| {
            let restricted = cfg.scenario == Scenario::Heterogeneous && i + 1 == cfg.jobs;
            let candidates = if restricted {
                machine_names.get(only).cloned().into_iter().collect()
            } else {
                machine_names.to_vec()
            };
            CoJob {
                name: format!("job{i}"),
                cpus: 1,
                memory_mb: 0.0,
                duration_s: cfg.job_s,
                offset_s: 0,
                candidates,
                flexible: cfg.flexible,
            }
        })
        .collect();
    let tail = if cfg.job_must_end_in_window { cfg.job_s } else { 0 };
    Trial {
        index,
        base_s,
        background,
        background_s: cfg.background_s,
        machine_cpus: cfg.machine_cpus.max(1),
        request: CoRequest {
            jobs,
            window_start_s: base_s,
            window_end_s: base_s + cfg.window_s - tail,
            epsilon_s: cfg.epsilon_s,
            owner: REPLAY_OWNER.to_string(),
        },
    }
}

/// The earliest start `>= lo` at which `[s, s + d)` misses every block on the machine (the
/// earliest free start is `lo` or a block end).
fn earliest_free(blocks: &[(i64, i64)], lo: i64, d: i64) -> i64 {
    let mut cands: Vec<i64> = std::iter::once(lo)
        .chain(blocks.iter().map(|b| b.1).filter(|&e| e > lo))
        .collect();
    cands.sort_unstable();
    for s in &cands {
        if blocks.iter().all(|&(bs, be)| s + d <= bs || *s >= be) {
            return *s;
        }
    }
    // After the last block end everything is free; `cands` always holds it.
    cands.last().copied().unwrap_or(lo)
}

/// Kuhn's augmenting-path matching: whether every job gets a distinct machine.
fn perfect_matching(options: &[Vec<usize>], machines: usize) -> bool {
    fn try_job(j: usize, options: &[Vec<usize>], seen: &mut [bool], owner: &mut [Option<usize>]) -> bool {
        for &m in &options[j] {
            if seen[m] {
                continue;
            }
            seen[m] = true;
            if owner[m].is_none_or(|k| try_job(k, options, seen, owner)) {
                owner[m] = Some(j);
                return true;
            }
        }
        false
    }
    let mut owner = vec![None; machines];
    (0..options.len()).all(|j| try_job(j, options, &mut vec![false; machines], &mut owner))
}

/// Brute force: is there any window `[w, w + ε]` inside `[T_e, T_l]` in which every job can
/// start (offset-corrected) on a distinct one of its candidates, free of background for the
/// job's duration? Jobs take one CPU, background blocks a whole machine, and a machine of
/// `machine_cpus` CPUs holds that many jobs; only background load counts.
///
/// Only `w = T_e` and the windows whose right end just reaches a block end need trying: as
/// `w` grows, a (job, machine) option appears only when the window reaches the end of a
/// block, so every other `w` has a subset of the options of the last such point before it.
pub fn feasible(trial: &Trial) -> bool {
    let req = &trial.request;
    let (t_e, t_l, eps) = (req.window_start_s, req.window_end_s, req.epsilon_s);
    let mut machines: Vec<&str> = Vec::new();
    for j in &req.jobs {
        for c in &j.candidates {
            if !machines.contains(&c.as_str()) {
                machines.push(c);
            }
        }
    }
    let blocks: Vec<Vec<(i64, i64)>> = machines
        .iter()
        .map(|m| {
            trial
                .background
                .iter()
                .filter(|(bm, _)| bm == m)
                .map(|&(_, s)| (s, s + trial.background_s))
                .collect()
        })
        .collect();
    let mut ws = vec![t_e];
    for bs in &blocks {
        for &(_, end) in bs {
            for j in &req.jobs {
                let w = end - j.offset_s - eps;
                if w > t_e && w <= t_l {
                    ws.push(w);
                }
            }
        }
    }
    ws.sort_unstable();
    ws.dedup();
    ws.into_iter().any(|w| {
        let hi = (w + eps).min(t_l);
        // One slot per CPU: slots `mi * cap .. (mi + 1) * cap` are machine `mi`'s.
        let cap = trial.machine_cpus.max(1) as usize;
        let options: Vec<Vec<usize>> = req
            .jobs
            .iter()
            .map(|j| {
                j.candidates
                    .iter()
                    .filter_map(|c| machines.iter().position(|m| m == c))
                    .filter(|&mi| earliest_free(&blocks[mi], w + j.offset_s, j.duration_s) <= hi + j.offset_s)
                    .flat_map(|mi| mi * cap..(mi + 1) * cap)
                    .collect()
            })
            .collect();
        perfect_matching(&options, machines.len() * cap)
    })
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrialResult {
    pub index: u32,
    pub success: bool,
    pub feasible: bool,
    pub stats: CoStats,
    pub elapsed: Duration,
    /// Reservations of the replay owner still held after the coallocation was undone.
    pub leaked: usize,
    /// Released slots another job took while the coallocation ran ([`Competing`]).
    pub taken: usize,
    /// The coallocator's steps, with the competitor's takes (only when asked for).
    pub trace: Vec<String>,
}

/// A request for `cpus` of `resource` over exactly `[start_s, start_s + duration_s)`.
fn pinned(resource: &str, cpus: u32, start_s: i64, duration_s: i64, owner: &str) -> ReserveRequest {
    ReserveRequest {
        resource: resource.to_string(),
        cpus,
        duration_s,
        earliest_s: start_s,
        latest_s: start_s,
        flexible: false,
        owner: owner.to_string(),
    }
}

/// What a [`Competing`] manager tracks during one trial.
struct CompeteState {
    rng: ChaCha8Rng,
    active: bool,
    /// Reservations of the coallocation owner granted through this manager, by id.
    ours: HashMap<String, Reservation>,
    /// Reservations made for other jobs: (the released reservation's id, what was taken).
    taken: Vec<(String, Reservation)>,
}

/// A resource manager where other jobs compete for capacity: while active, each time the
/// coallocation owner releases a reservation, with probability `p` another job reserves the
/// same CPUs over the same span at once (a batch scheduler backfilling a queued job into the
/// freed hole before the coallocator asks again). Everything else passes through to `inner`.
pub struct Competing<'a, R> {
    inner: &'a R,
    owner: String,
    p: f64,
    state: Mutex<CompeteState>,
}

impl<'a, R: Reserver> Competing<'a, R> {
    /// A competitor for trial `index` of `cfg` (its draws depend only on the seed and index).
    pub fn new(inner: &'a R, cfg: &ReplayConfig, index: u32, owner: &str) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.experiment_seed() ^ COMPETE_SALT);
        rng.set_stream(u64::from(index));
        Competing {
            inner,
            owner: owner.to_string(),
            p: cfg.compete.clamp(0.0, 1.0),
            state: Mutex::new(CompeteState {
                rng,
                active: true,
                ours: HashMap::new(),
                taken: Vec::new(),
            }),
        }
    }

    /// Stops competing and releases what the other jobs took; returns (released id, taken).
    pub async fn finish(&self) -> Result<Vec<(String, Reservation)>, ReserveError> {
        let taken = {
            let mut st = self.state.lock();
            st.active = false;
            st.ours.clear();
            std::mem::take(&mut st.taken)
        };
        let held: Vec<Reservation> = taken.iter().map(|(_, r)| r.clone()).collect();
        release_all(self.inner, &held).await?;
        Ok(taken)
    }

    fn note_grant(&self, req: &ReserveRequest, a: &Answer) {
        if let Answer::Granted(r) = a {
            if req.owner == self.owner {
                self.state.lock().ours.insert(r.id.clone(), r.clone());
            }
        }
    }
}

impl<R: Reserver> Reserver for Competing<'_, R> {
    async fn reserve(&self, req: &ReserveRequest) -> Result<Answer, ReserveError> {
        let a = self.inner.reserve(req).await?;
        self.note_grant(req, &a);
        Ok(a)
    }

    async fn modify(&self, id: &str, req: &ReserveRequest) -> Result<ModifyAnswer, ReserveError> {
        let m = self.inner.modify(id, req).await?;
        if m.original_released || m.answer.granted().is_some() {
            self.state.lock().ours.remove(id);
        }
        self.note_grant(req, &m.answer);
        Ok(m)
    }

    async fn release(&self, id: &str, owner: &str) -> Result<(), ReserveError> {
        self.inner.release(id, owner).await?;
        let grab = {
            let mut st = self.state.lock();
            let freed = st.ours.remove(id);
            match freed {
                Some(f) if st.active && owner == self.owner => {
                    let draw: f64 = st.rng.random();
                    (draw < self.p).then_some(f)
                }
                _ => None,
            }
        };
        if let Some(f) = grab {
            let req = pinned(
                &f.resource,
                f.cpus,
                f.start_s,
                f.end_s - f.start_s,
                COMPETITOR_OWNER,
            );
            if let Answer::Granted(r) = self.inner.reserve(&req).await? {
                self.state.lock().taken.push((id.to_string(), r));
            }
        }
        Ok(())
    }

    async fn list(&self, resource: &str, owner: &str) -> Result<Vec<Reservation>, ReserveError> {
        self.inner.list(resource, owner).await
    }
}

/// Puts the competitor's takes into the coallocator's trace, after the release that freed them.
fn merge_trace(trace: Vec<String>, taken: &[(String, Reservation)], origin: i64) -> Vec<String> {
    let mut out = Vec::with_capacity(trace.len() + taken.len());
    for line in trace {
        let freed = line
            .trim_start()
            .strip_prefix("release ")
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string);
        out.push(line);
        if let Some(id) = freed {
            for (_, r) in taken.iter().filter(|(i, _)| *i == id) {
                out.push(format!(
                    "    another job takes {} [{}, {}) at once ({})",
                    r.resource,
                    r.start_s - origin,
                    r.end_s - origin,
                    r.id
                ));
            }
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error("background reservation on {machine:?} at {start_s} not granted: {answer}")]
    Background {
        machine: String,
        start_s: i64,
        answer: String,
    },
    #[error(transparent)]
    Reserve(#[from] ReserveError),
    #[error(transparent)]
    Coalloc(#[from] CoallocError),
}

async fn release_all<R: Reserver>(r: &R, held: &[Reservation]) -> Result<(), ReserveError> {
    let mut first = None;
    for res in held {
        if let Err(e) = r.release(&res.id, &res.owner).await {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Runs one trial: background load, coallocation (against other jobs competing for released
/// capacity as `cfg.compete` says), undo, leak check, removal of the background and of what
/// the other jobs took. With `trace`, the result carries the coallocator's steps.
pub async fn run_trial<R: Reserver>(
    cfg: &ReplayConfig,
    t: &Trial,
    r: &R,
    trace: bool,
) -> Result<TrialResult, ReplayError> {
    let mut background = Vec::with_capacity(t.background.len());
    for (machine, start_s) in &t.background {
        let req = pinned(
            machine,
            t.machine_cpus,
            *start_s,
            t.background_s,
            BACKGROUND_OWNER,
        );
        let refused = match r.reserve(&req).await {
            Ok(Answer::Granted(res)) => {
                background.push(res);
                continue;
            }
            Ok(other) => ReplayError::Background {
                machine: machine.clone(),
                start_s: *start_s,
                answer: format!("{other:?}"),
            },
            Err(e) => e.into(),
        };
        // Best effort: the refusal is the error to report.
        let _ = release_all(r, &background).await;
        return Err(refused);
    }
    let feasible = feasible(t);
    let owner = &t.request.owner;
    let comp = Competing::new(r, cfg, t.index, owner);
    let started = Instant::now();
    let (outcome, steps) = coallocate_with(&t.request, &comp, cfg.options(trace, t.base_s)).await;
    let elapsed = started.elapsed();
    let taken = comp.finish().await;
    let outcome = match (outcome, taken) {
        (Ok(o), Ok(taken)) => (o, taken),
        (Err(e), _) => {
            // The coallocator released what it could; remove the rest before reporting.
            if let Ok(left) = r.list("", owner).await {
                let _ = release_all(r, &left).await;
            }
            if let Ok(left) = r.list("", COMPETITOR_OWNER).await {
                let _ = release_all(r, &left).await;
            }
            let _ = release_all(r, &background).await;
            return Err(e.into());
        }
        (Ok(_), Err(e)) => {
            let _ = release_all(r, &background).await;
            return Err(e.into());
        }
    };
    let (outcome, taken) = outcome;
    let (success, stats) = match outcome {
        CoOutcome::Success { reservations, stats } => {
            let held: Vec<Reservation> = reservations.into_iter().map(|(_, res)| res).collect();
            release_all(r, &held).await?;
            (true, stats)
        }
        CoOutcome::Failed { stats, .. } => (false, stats),
    };
    let left = r.list("", owner).await?;
    let leaked = left.len();
    if leaked > 0 {
        tracing::warn!(trial = t.index, leaked, "coallocation leaked reservations");
        release_all(r, &left).await?;
    }
    release_all(r, &background).await?;
    Ok(TrialResult {
        index: t.index,
        success,
        feasible,
        stats,
        elapsed,
        leaked,
        taken: taken.len(),
        trace: merge_trace(steps, &taken, t.base_s),
    })
}

/// Average, minimum and maximum of one metric over a group of trials.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metric {
    pub avg: f64,
    pub min: f64,
    pub max: f64,
}

impl Metric {
    fn of(values: impl Iterator<Item = f64>) -> Metric {
        let (mut n, mut sum, mut min, mut max) = (0usize, 0.0, f64::INFINITY, f64::NEG_INFINITY);
        for v in values {
            n += 1;
            sum += v;
            min = min.min(v);
            max = max.max(v);
        }
        if n == 0 {
            return Metric::default();
        }
        Metric {
            avg: sum / n as f64,
            min,
            max,
        }
    }
}

/// The rows of Tables I/II for one group (successful or failed coallocations).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupSummary {
    pub count: usize,
    pub elapsed_ms: Metric,
    pub iterations: Metric,
    pub creates: Metric,
    pub failed_creates: Metric,
    pub modifies: Metric,
    pub failed_modifies: Metric,
    pub lost_originals: Metric,
    pub augmentations: Metric,
    pub failed_augmentations: Metric,
}

impl GroupSummary {
    fn of(results: &[&TrialResult]) -> GroupSummary {
        let m = |f: fn(&CoStats) -> u32| Metric::of(results.iter().map(|r| f64::from(f(&r.stats))));
        GroupSummary {
            count: results.len(),
            elapsed_ms: Metric::of(results.iter().map(|r| r.elapsed.as_secs_f64() * 1000.0)),
            iterations: m(|s| s.iterations),
            creates: m(|s| s.creates),
            failed_creates: m(|s| s.failed_creates),
            modifies: m(|s| s.modifies),
            failed_modifies: m(|s| s.failed_modifies),
            lost_originals: m(|s| s.lost_originals),
            augmentations: m(|s| s.augmentations),
            failed_augmentations: m(|s| s.failed_augmentations),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Trials that completed (errors not included).
    pub trials: usize,
    pub successes: usize,
    pub success_rate: f64,
    pub feasible: usize,
    pub feasible_rate: f64,
    pub success: GroupSummary,
    pub failure: GroupSummary,
    pub leaked: usize,
    /// Released slots other jobs took during the coallocations (all trials).
    pub taken: usize,
    /// Trials that ended in an error (filled by [`run_replay`]; `summarize` sees none).
    pub errors: usize,
}

pub fn summarize(results: &[TrialResult]) -> Summary {
    let (ok, bad): (Vec<&TrialResult>, Vec<&TrialResult>) = results.iter().partition(|r| r.success);
    let n = results.len();
    let rate = |k: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
    let feasible = results.iter().filter(|r| r.feasible).count();
    Summary {
        trials: n,
        successes: ok.len(),
        success_rate: rate(ok.len()),
        feasible,
        feasible_rate: rate(feasible),
        success: GroupSummary::of(&ok),
        failure: GroupSummary::of(&bad),
        leaked: results.iter().map(|r| r.leaked).sum(),
        taken: results.iter().map(|r| r.taken).sum(),
        errors: 0,
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} trials: {} successes ({:.1}%), {} feasible ({:.1}%), {} leaked, {} errors, {} released slots taken by other jobs",
            self.trials,
            self.successes,
            100.0 * self.success_rate,
            self.feasible,
            100.0 * self.feasible_rate,
            self.leaked,
            self.errors,
            self.taken
        )?;
        for (title, g) in [("successful", &self.success), ("failed", &self.failure)] {
            writeln!(
                f,
                "{title} coallocations ({}):{:>22}{:>9}{:>9}",
                g.count, "average", "min", "max"
            )?;
            let rows = [
                ("execution time (ms)", g.elapsed_ms),
                ("# iterations", g.iterations),
                ("# new ARs", g.creates),
                ("# failed new ARs", g.failed_creates),
                ("# modified ARs", g.modifies),
                ("# failed modified ARs", g.failed_modifies),
                ("  of which lost the original", g.lost_originals),
                ("# path augmentations", g.augmentations),
                ("# failed path augmentations", g.failed_augmentations),
            ];
            for (name, m) in rows {
                writeln!(f, "  {name:<28}{:>12.2}{:>9.2}{:>9.2}", m.avg, m.min, m.max)?;
            }
        }
        Ok(())
    }
}

/// Where trial `index` lies: `base0_s + index · 2 · window_s`.
fn trial_base(cfg: &ReplayConfig, base0_s: i64, index: u32) -> i64 {
    base0_s + i64::from(index) * 2 * cfg.window_s
}

/// Runs trial `index` of `cfg` alone (where [`run_replay`] puts it) and records its trace.
pub async fn trace_trial<R: Reserver>(
    cfg: &ReplayConfig,
    r: &R,
    base0_s: i64,
    index: u32,
) -> Result<(Trial, TrialResult), ReplayError> {
    let t = trial(cfg, index, trial_base(cfg, base0_s, index), &machine_names(cfg));
    let res = run_trial(cfg, &t, r, true).await?;
    Ok((t, res))
}

/// Runs `cfg.trials` trials on `r`, trial `i` at `base0_s + i · 2 · window_s`.
pub async fn run_replay<R: Reserver>(cfg: &ReplayConfig, r: &R, base0_s: i64) -> (Vec<TrialResult>, Summary) {
    let names = machine_names(cfg);
    let mut results = Vec::with_capacity(cfg.trials as usize);
    let mut errors = 0;
    for index in 0..cfg.trials {
        let t = trial(cfg, index, trial_base(cfg, base0_s, index), &names);
        match run_trial(cfg, &t, r, false).await {
            Ok(res) => results.push(res),
            Err(e) => {
                errors += 1;
                tracing::warn!(trial = index, error = %e, "replay trial failed");
            }
        }
    }
    let mut summary = summarize(&results);
    summary.errors = errors;
    (results, summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE0: i64 = 1_000_000;

    fn cfg(scenario: Scenario, trials: u32) -> ReplayConfig {
        ReplayConfig {
            trials,
            scenario,
            ..ReplayConfig::default()
        }
    }

    /// A default-shaped trial with hand-placed background (offsets from the base).
    fn hand_trial(scenario: Scenario, starts: [i64; 4], only: usize) -> Trial {
        let c = cfg(scenario, 1);
        let names = machine_names(&c);
        let mut t = trial(&c, 0, BASE0, &names);
        t.background = names
            .iter()
            .zip(starts)
            .map(|(m, s)| (m.clone(), BASE0 + s))
            .collect();
        if scenario == Scenario::Heterogeneous {
            if let Some(last) = t.request.jobs.last_mut() {
                last.candidates = vec![names[only].clone()];
            }
        }
        t
    }

    async fn outcome(t: &Trial) -> TrialResult {
        let c = cfg(Scenario::Homogeneous, 1);
        let m = memory_machines(&c);
        let res = run_trial(&c, t, &m, false).await.unwrap();
        assert!(
            m.list("", "").await.unwrap().is_empty(),
            "the trial cleans up after itself"
        );
        res
    }

    #[test]
    fn trials_are_deterministic_in_seed_and_index() {
        for scenario in [Scenario::Homogeneous, Scenario::Heterogeneous] {
            let c = cfg(scenario, 10);
            let names = machine_names(&c);
            let a = trial(&c, 3, BASE0, &names);
            assert_eq!(a, trial(&c, 3, BASE0, &names));
            assert_ne!(a.background, trial(&c, 4, BASE0, &names).background);
            let other_seed = ReplayConfig {
                seed: c.seed + 1,
                ..c.clone()
            };
            assert_ne!(a.background, trial(&other_seed, 3, BASE0, &names).background);
            // The two experiments draw independently.
            let other = ReplayConfig {
                scenario: match scenario {
                    Scenario::Homogeneous => Scenario::Heterogeneous,
                    Scenario::Heterogeneous => Scenario::Homogeneous,
                },
                ..c.clone()
            };
            assert_ne!(a.background, trial(&other, 3, BASE0, &names).background);
            for (_, s) in &a.background {
                assert!(BASE0 <= *s && *s + c.background_s <= BASE0 + c.window_s);
            }
            assert_eq!(a.request.window_end_s - a.request.window_start_s, 3 * 3600);
            let last = a.request.jobs.last().unwrap();
            let want = if scenario == Scenario::Heterogeneous { 1 } else { 4 };
            assert_eq!(last.candidates.len(), want);
            assert!(a.request.jobs[..3].iter().all(|j| j.candidates == names));
        }
    }

    #[tokio::test]
    async fn feasibility_agrees_with_hand_cases() {
        // Every block at the start: a common start at 1200 (all free from there).
        let t = hand_trial(Scenario::Homogeneous, [0, 0, 0, 0], 0);
        assert!(feasible(&t));
        let r = outcome(&t).await;
        assert!(r.success && r.feasible && r.leaked == 0, "{r:?}");

        // Blocks at 1000, 5000, 9000 and 13000 s: each forbids starts in (b − 3600, b + 1200),
        // which together cover the whole start window even with ε slack.
        let t = hand_trial(Scenario::Homogeneous, [1000, 5000, 9000, 13000], 0);
        assert!(!feasible(&t));
        let r = outcome(&t).await;
        assert!(!r.success && !r.feasible && r.leaked == 0, "{r:?}");

        // Only the ε slack makes it: m0 is free from 1200, m1 only for starts ≤ 1100 (or from
        // 5900, when m2 and m3 are never both free).
        let t = hand_trial(Scenario::Homogeneous, [0, 4700, 6000, 10000], 0);
        assert!(feasible(&t));
        let mut tight = t.clone();
        tight.request.epsilon_s = 50;
        assert!(!feasible(&tight));
        let r = outcome(&t).await;
        assert!(r.success, "{r:?}");
        assert!(!outcome(&tight).await.success);

        // Heterogeneous: the last job can only use m0, which job0 takes first: an exchange.
        let t = hand_trial(Scenario::Heterogeneous, [13200; 4], 0);
        assert!(feasible(&t));
        let r = outcome(&t).await;
        assert!(r.success && r.stats.augmentations == 1, "{r:?}");
    }

    async fn replay(scenario: Scenario, trials: u32) -> (Vec<TrialResult>, Summary) {
        let c = cfg(scenario, trials);
        let m = memory_machines(&c);
        let (results, summary) = run_replay(&c, &m, BASE0).await;
        assert!(
            m.list("", "").await.unwrap().is_empty(),
            "nothing left on the managers"
        );
        assert!(m.within_capacity());
        (results, summary)
    }

    fn check(results: &[TrialResult], s: &Summary, trials: u32) {
        assert_eq!((s.errors, s.leaked, s.trials), (0, 0, trials as usize), "{s}");
        assert!(s.successes <= s.feasible, "{s}");
        for r in results {
            assert!(
                !r.success || r.feasible,
                "a success on an infeasible trial: {r:?}"
            );
        }
    }

    #[tokio::test]
    async fn homogeneous_replay_runs_clean() {
        let (results, s) = replay(Scenario::Homogeneous, 200).await;
        println!("homogeneous, 200 trials against MemoryReserver:\n{s}");
        check(&results, &s, 200);
        assert_eq!(
            s.success.augmentations.max, 0.0,
            "every job can use every machine"
        );
    }

    #[tokio::test]
    async fn heterogeneous_replay_runs_clean() {
        let (results, s) = replay(Scenario::Heterogeneous, 200).await;
        println!("heterogeneous, 200 trials against MemoryReserver:\n{s}");
        check(&results, &s, 200);
        assert!(
            s.success.augmentations.max <= 1.0,
            "only the last job can need an exchange"
        );
    }

    /// J1 may use X or Z, J2 only X; nothing else runs, so only an exchange places J2.
    fn exchange_trial() -> Trial {
        let job = |name: &str, cands: &[&str]| CoJob {
            name: name.to_string(),
            cpus: 1,
            memory_mb: 0.0,
            duration_s: 3600,
            offset_s: 0,
            candidates: cands.iter().map(|c| c.to_string()).collect(),
            flexible: true,
        };
        Trial {
            index: 0,
            base_s: BASE0,
            background: Vec::new(),
            background_s: 1200,
            machine_cpus: 1,
            request: CoRequest {
                jobs: vec![job("J1", &["X", "Z"]), job("J2", &["X"])],
                window_start_s: BASE0,
                window_end_s: BASE0 + 1800,
                epsilon_s: 300,
                owner: REPLAY_OWNER.to_string(),
            },
        }
    }

    #[tokio::test]
    async fn release_then_create_loses_the_slot_an_atomic_modify_keeps() {
        let t = exchange_trial();
        let run = |modify: ModifyMode| {
            let t = t.clone();
            async move {
                let c = ReplayConfig {
                    modify,
                    compete: 1.0,
                    ..cfg(Scenario::Homogeneous, 1)
                };
                let m = MemoryReserver::with_resources([("X", 1), ("Z", 1)]);
                let r = run_trial(&c, &t, &m, true).await.unwrap();
                assert!(m.list("", "").await.unwrap().is_empty(), "{:?}", r.trace);
                r
            }
        };
        // Atomic: J1 takes X, J2 is refused, the exchange creates J1@Z and hands X over in place.
        let atomic = run(ModifyMode::Atomic).await;
        assert!(atomic.success && atomic.feasible, "{:#?}", atomic.trace);
        assert_eq!((atomic.stats.augmentations, atomic.stats.lost_originals), (1, 0));
        // As the paper's implementation does it: X is released first, another job takes it at
        // once, the create for J2 is refused and J2 has nothing; X stays busy past T_l.
        let written = run(ModifyMode::ReleaseThenCreate).await;
        assert!(!written.success && written.feasible, "{:#?}", written.trace);
        assert_eq!(
            (written.stats.failed_augmentations, written.stats.lost_originals),
            (1, 1),
            "{:#?}",
            written.trace
        );
        assert!(written.taken >= 1);
        let text = written.trace.join("\n");
        assert!(text.contains("another job takes X"), "{text}");
        assert!(text.contains("(original lost)"), "{text}");
        // Without competition the two ways of modifying agree.
        for modify in [ModifyMode::Atomic, ModifyMode::ReleaseThenCreate] {
            let c = ReplayConfig {
                modify,
                ..cfg(Scenario::Homogeneous, 1)
            };
            let m = MemoryReserver::with_resources([("X", 1), ("Z", 1)]);
            assert!(run_trial(&c, &t, &m, false).await.unwrap().success, "{modify:?}");
        }
    }

    #[tokio::test]
    async fn without_competition_release_then_create_matches_the_atomic_modify() {
        // In the paper's experiments the jobs are identical and nothing but the background
        // exists, so a release is never lost: both ways give the same outcome trial by trial.
        for scenario in [Scenario::Homogeneous, Scenario::Heterogeneous] {
            let mut outcomes = Vec::new();
            for modify in [ModifyMode::Atomic, ModifyMode::ReleaseThenCreate] {
                let c = ReplayConfig {
                    modify,
                    ..cfg(scenario, 150)
                };
                let m = memory_machines(&c);
                let (results, s) = run_replay(&c, &m, BASE0).await;
                check(&results, &s, 150);
                assert_eq!(s.taken, 0);
                outcomes.push(
                    results
                        .iter()
                        .map(|r| (r.success, r.stats.iterations, r.stats.augmentations))
                        .collect::<Vec<_>>(),
                );
            }
            assert_eq!(outcomes[0], outcomes[1], "{scenario:?}");
        }
    }

    #[tokio::test]
    async fn competition_costs_the_release_then_create_modify_more() {
        let mut rates = Vec::new();
        for modify in [ModifyMode::Atomic, ModifyMode::ReleaseThenCreate] {
            let c = ReplayConfig {
                modify,
                compete: 1.0,
                ..cfg(Scenario::Heterogeneous, 150)
            };
            let m = memory_machines(&c);
            let (results, s) = run_replay(&c, &m, BASE0).await;
            println!("heterogeneous, compete 1.0, {modify:?}:\n{s}");
            check(&results, &s, 150);
            assert!(m.list("", "").await.unwrap().is_empty());
            rates.push(s.successes);
        }
        assert!(rates[1] < rates[0], "{rates:?}");
    }

    #[tokio::test]
    async fn non_flexible_jobs_cannot_exchange() {
        // The heterogeneous experiment needs exchanges whenever another job took the restricted
        // job's machine first; pinned jobs cannot give it up.
        let mut rates = Vec::new();
        for flexible in [true, false] {
            let c = ReplayConfig {
                flexible,
                ..cfg(Scenario::Heterogeneous, 150)
            };
            let m = memory_machines(&c);
            let (results, s) = run_replay(&c, &m, BASE0).await;
            check(&results, &s, 150);
            if !flexible {
                assert_eq!(s.success.augmentations.max, 0.0, "{s}");
            }
            rates.push(s.successes);
        }
        assert!(rates[1] < rates[0], "{rates:?}");
    }

    #[tokio::test]
    async fn the_restriction_never_changes_feasibility_here() {
        // One job per machine: restricting job 3 never changes feasibility (all four machines
        // must be free). Two CPUs per machine: any two free machines do for the homogeneous
        // experiment, the restricted one needs its own among them — never more feasible, and
        // with one 20-minute block per machine in a 4-hour window, in practice always feasible.
        for cpus in [1u32, 2] {
            let homo = ReplayConfig {
                machine_cpus: cpus,
                ..cfg(Scenario::Homogeneous, 300)
            };
            let names = machine_names(&homo);
            let (mut both, mut only_homo) = (0, 0);
            for i in 0..300 {
                let t = trial(&homo, i, BASE0, &names);
                let mut restricted = t.clone();
                if let Some(last) = restricted.request.jobs.last_mut() {
                    last.candidates = vec![names[(i % 4) as usize].clone()];
                }
                match (feasible(&t), feasible(&restricted)) {
                    (true, true) => both += 1,
                    (true, false) => only_homo += 1,
                    (false, true) => panic!("trial {i}: a restriction made it feasible"),
                    (false, false) => {}
                }
            }
            println!(
                "{cpus} CPU(s) per machine: {both} of 300 feasible either way, {only_homo} only unrestricted"
            );
            assert!(both > 0);
            if cpus == 1 {
                assert_eq!(only_homo, 0);
            }
        }
        // And the coallocator on two-CPU machines: clean, never beyond feasibility.
        for scenario in [Scenario::Homogeneous, Scenario::Heterogeneous] {
            let c = ReplayConfig {
                machine_cpus: 2,
                ..cfg(scenario, 100)
            };
            let m = memory_machines(&c);
            let (results, s) = run_replay(&c, &m, BASE0).await;
            check(&results, &s, 100);
            assert!(m.list("", "").await.unwrap().is_empty());
            assert!(m.within_capacity());
        }
    }

    /// The full §5.2.2 run: `cargo test -p gma-broker --lib replay -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "1000 trials per scenario; run by hand to see the rates"]
    async fn paper_sized_replay() {
        for must_end in [true, false] {
            for scenario in [Scenario::Homogeneous, Scenario::Heterogeneous] {
                let c = ReplayConfig {
                    job_must_end_in_window: must_end,
                    ..cfg(scenario, 1000)
                };
                let m = memory_machines(&c);
                let (results, s) = run_replay(&c, &m, BASE0).await;
                println!("{scenario:?}, job_must_end_in_window = {must_end}, 1000 trials:\n{s}");
                check(&results, &s, 1000);
                assert!(m.list("", "").await.unwrap().is_empty());
            }
        }
    }
}
