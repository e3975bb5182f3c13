//! Coallocation: Algorithms 1 and 2 of Elmroth & Tordsson (§3.2), over any [`Reserver`].
//!
//! The coallocator looks for the earliest common start `c` in the user's window
//! `[T_e, T_l]` such that every job `i` holds a reservation on one of its candidates starting
//! in `[t_e + offset_i, min(t_l, T_l) + offset_i]`, where `[t_e, t_l]` is a sliding window of
//! width ε. Each iteration moves held reservations into the window (modify), creates missing
//! ones (trying candidates in rank order), and, when every unplaced job could in principle
//! take a resource held by another job, exchanges reservations along shortest augmenting
//! paths (Algorithm 2). When some job is still unplaced, the window jumps to the earliest
//! later start any refusal announced (`T_best`); past `T_l` the request fails.
//!
//! Two properties matter beyond the paper's pseudocode: the coallocator never holds and
//! waits (a reservation that cannot be moved into the current window is released at once),
//! and it never leaks: on failure, and on any error from a manager, everything it still holds
//! is released before it returns.
//!
//! Two knobs follow the paper's own discussion. A job's `flexible` flag says whether its
//! reservation may move to another machine once it holds one (re-created on any candidate after
//! a refused modify, or handed over by an exchange); a non-flexible job only ever moves in time
//! on the machine it first got. [`ModifyMode::ReleaseThenCreate`] does every modify the way the
//! paper's implementation had to on Maui (§3.3.2): release, then create; if the create is
//! refused — say because another job took the released capacity meanwhile — the original is
//! gone. [`coallocate_with`] can also record a step-by-step trace.

use std::collections::{BTreeMap, VecDeque};

use crate::reserve::{Answer, ModifyAnswer, Reservation, ReserveError, ReserveRequest, Reserver};

/// Iterations after which the coallocator gives up even if the window could still move (a
/// manager announcing ever-later retries one second apart must not keep it busy forever).
pub const MAX_ITERATIONS: u32 = 10_000;

/// One job (resource request) of a coallocation.
#[derive(Debug, Clone, PartialEq)]
pub struct CoJob {
    pub name: String,
    pub cpus: u32,
    pub memory_mb: f64,
    pub duration_s: i64,
    /// Start offset from the common start (the job must start `offset_s` after it).
    pub offset_s: i64,
    /// Resources able to run the job, ranked best first.
    pub candidates: Vec<String>,
    /// Whether the job may move to any of its candidates once it holds a reservation (after a
    /// refused modify, or by an exchange along an augmenting path). A non-flexible job stays on
    /// the machine of its first reservation: it is re-created only there and never gives its
    /// reservation to another job.
    pub flexible: bool,
}

/// How the coallocator modifies a held reservation (Algorithm 1 step 7, Algorithm 2 step 5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ModifyMode {
    /// The manager's `modify`: the reservation is reshaped in place or kept as it was.
    #[default]
    Atomic,
    /// The paper's implementation (Maui has no modify, §3.3.2): release, then create. Between
    /// the two the manager may give the capacity to someone else, and a refused create loses
    /// the original reservation.
    ReleaseThenCreate,
}

/// Options of [`coallocate_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoOptions {
    pub modify: ModifyMode,
    /// Record every step (window, create, modify, release, exchange) as a line of text.
    pub trace: bool,
    /// Times in the trace are seconds after this instant.
    pub origin_s: i64,
}

/// A coallocation request.
#[derive(Debug, Clone, PartialEq)]
pub struct CoRequest {
    pub jobs: Vec<CoJob>,
    /// `T_e`: the earliest acceptable common start.
    pub window_start_s: i64,
    /// `T_l`: the latest acceptable common start.
    pub window_end_s: i64,
    /// ε: the largest allowed deviation between (offset-corrected) starts.
    pub epsilon_s: i64,
    pub owner: String,
}

/// Operation counts of one coallocation (the columns of the paper's Tables I and II).
#[derive(Default, Clone, Debug, PartialEq)]
pub struct CoStats {
    pub iterations: u32,
    /// Granted creates (Algorithm 1 step 9 and Algorithm 2 step 1).
    pub creates: u32,
    pub failed_creates: u32,
    /// Granted modifies (Algorithm 1 step 7 and Algorithm 2 step 5).
    pub modifies: u32,
    pub failed_modifies: u32,
    /// Refused modifies that lost the original reservation (release-then-create, or a manager
    /// whose modify is not atomic).
    pub lost_originals: u32,
    pub augmentations: u32,
    pub failed_augmentations: u32,
    pub releases: u32,
    /// Algorithm-2 invocations (an augmenting path was found and updated or tried).
    pub augment_attempts: u32,
}

/// The result of a coallocation that did not hit a manager error.
#[derive(Debug, Clone, PartialEq)]
pub enum CoOutcome {
    /// One reservation per job, in the request's job order.
    Success {
        reservations: Vec<(String, Reservation)>,
        stats: CoStats,
    },
    /// No common start was found; nothing is held any more.
    Failed { reason: String, stats: CoStats },
}

impl CoOutcome {
    pub fn stats(&self) -> &CoStats {
        match self {
            CoOutcome::Success { stats, .. } | CoOutcome::Failed { stats, .. } => stats,
        }
    }

    pub fn is_success(&self) -> bool {
        matches!(self, CoOutcome::Success { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoallocError {
    #[error("invalid coallocation request: {0}")]
    Invalid(String),
    /// A manager failed (not refused); everything held was released (best effort) first.
    #[error("coallocation aborted: {0}")]
    Reserve(#[from] ReserveError),
}

/// Why Algorithm 1 ended without a coallocation (reported as [`CoOutcome::Failed`]'s reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NoFit {
    #[error("gave up after {MAX_ITERATIONS} iterations (window at [{t_e}, {t_l}])")]
    GaveUp { t_e: i64, t_l: i64 },
    #[error("no reservation possible after the window [{t_e}, {t_l}] (every refusal was final)")]
    Final { t_e: i64, t_l: i64 },
    #[error("the window would not move forward (T_best {next} <= t_l {t_l})")]
    Stuck { next: i64, t_l: i64 },
    #[error("the earliest possible common start window [{t_e}, {t_l}] begins after T_l = {end}")]
    PastEnd { t_e: i64, t_l: i64, end: i64 },
}

impl NoFit {
    /// The same reason with every time counted from `origin` (for traces).
    fn shifted(&self, origin: i64) -> NoFit {
        let o = |t: i64| t.saturating_sub(origin);
        match *self {
            NoFit::GaveUp { t_e, t_l } => NoFit::GaveUp {
                t_e: o(t_e),
                t_l: o(t_l),
            },
            NoFit::Final { t_e, t_l } => NoFit::Final {
                t_e: o(t_e),
                t_l: o(t_l),
            },
            NoFit::Stuck { next, t_l } => NoFit::Stuck {
                next: o(next),
                t_l: o(t_l),
            },
            NoFit::PastEnd { t_e, t_l, end } => NoFit::PastEnd {
                t_e: o(t_e),
                t_l: o(t_l),
                end: o(end),
            },
        }
    }
}

/// One answer as a trace shows it.
fn show(a: &Answer, origin: i64) -> String {
    match a {
        Answer::Granted(r) => format!("granted {} [{}, {})", r.id, r.start_s - origin, r.end_s - origin),
        Answer::Retry { from_s, .. } => format!("refused, free from {}", from_s - origin),
        Answer::Never(why) => format!("never ({why})"),
    }
}

/// A modify's answer for the trace, saying when the original reservation was lost.
fn show_modify(m: &ModifyAnswer, origin: i64) -> String {
    let lost = if m.original_released {
        " (original lost)"
    } else {
        ""
    };
    format!("{}{lost}", show(&m.answer, origin))
}

/// Checks a request before any reservation is made.
pub fn validate(req: &CoRequest) -> Result<(), CoallocError> {
    let bad = |m: String| Err(CoallocError::Invalid(m));
    if req.jobs.is_empty() {
        return bad("no jobs".to_string());
    }
    if req.epsilon_s <= 0 {
        return bad(format!("epsilon_s must be positive, got {}", req.epsilon_s));
    }
    if req.window_start_s > req.window_end_s {
        return bad(format!(
            "window_start_s {} is after window_end_s {}",
            req.window_start_s, req.window_end_s
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for j in &req.jobs {
        if j.cpus < 1 {
            return bad(format!("job {:?}: cpus must be at least 1", j.name));
        }
        if j.duration_s < 1 {
            return bad(format!(
                "job {:?}: duration_s must be at least 1, got {}",
                j.name, j.duration_s
            ));
        }
        if j.candidates.is_empty() {
            return bad(format!("job {:?}: no candidate resources", j.name));
        }
        if !names.insert(j.name.as_str()) {
            return bad(format!("job name {:?} appears twice", j.name));
        }
    }
    Ok(())
}

/// Processing order: decreasing (cpus, memory, runtime), ties in input order. Big jobs first
/// leaves the small ones the leftover holes, so fewer exchanges are needed (§3.3.4).
fn size_order(jobs: &[CoJob]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&jobs[a], &jobs[b]);
        y.cpus
            .cmp(&x.cpus)
            .then(y.memory_mb.total_cmp(&x.memory_mb))
            .then(y.duration_s.cmp(&x.duration_s))
    });
    order
}

/// The sliding start window in common-start terms.
#[derive(Debug, Clone, Copy)]
struct Window {
    t_e: i64,
    /// `min(t_l, T_l)`: no reservation may start (offset-corrected) after `T_l`.
    hi: i64,
    t_l: i64,
}

/// An augmenting path: `jobs[0]` is unplaced; `resources[i]` (i < n-1) is held by
/// `jobs[i + 1]`; `resources[n-1]` is held by nobody.
#[derive(Debug, Clone, PartialEq)]
struct Path {
    jobs: Vec<usize>,
    resources: Vec<String>,
}

struct Run<'a, R> {
    req: &'a CoRequest,
    r: &'a R,
    order: Vec<usize>,
    /// The reservation each job holds (by input index).
    held: Vec<Option<Reservation>>,
    /// During Algorithm 2, the reservation meant for the next job down the path: held by us,
    /// owned by no job yet, so it must be in the cleanup set.
    limbo: Option<Reservation>,
    /// The machine a non-flexible job is bound to (that of its first reservation).
    home: Vec<Option<String>>,
    opts: CoOptions,
    trace: Vec<String>,
    stats: CoStats,
}

/// Folds a retry (common-start terms) into `T_best`. Only times after the current window
/// count: `T_best` is "the earliest time later than [t_e, t_l]" (step 4), and an Algorithm-2
/// modify pinned to a start inside the window can announce one that is not.
fn fold_best(best: &mut Option<i64>, w: Window, from: Option<i64>) {
    if let Some(f) = from {
        if f > w.t_l {
            *best = Some(best.map_or(f, |b| b.min(f)));
        }
    }
}

impl<'a, R: Reserver> Run<'a, R> {
    fn new(req: &'a CoRequest, r: &'a R, opts: CoOptions) -> Self {
        Run {
            req,
            r,
            order: size_order(&req.jobs),
            held: vec![None; req.jobs.len()],
            limbo: None,
            home: vec![None; req.jobs.len()],
            opts,
            trace: Vec::new(),
            stats: CoStats::default(),
        }
    }

    /// Adds a trace line (built only when tracing).
    fn note(&mut self, line: impl FnOnce(&Self) -> String) {
        if self.opts.trace {
            let l = line(self);
            self.trace.push(l);
        }
    }

    fn name(&self, job: usize) -> &str {
        &self.req.jobs[job].name
    }

    /// The resources `job` may take now: every candidate for a flexible job or one that holds
    /// nothing yet, else only its home.
    fn candidates_of(&self, job: usize) -> Vec<String> {
        let j = &self.req.jobs[job];
        match &self.home[job] {
            Some(h) if !j.flexible => vec![h.clone()],
            _ => j.candidates.clone(),
        }
    }

    /// Records that `job` now holds `res` (binding a non-flexible job to its machine).
    fn hold(&mut self, job: usize, res: Reservation) {
        if !self.req.jobs[job].flexible && self.home[job].is_none() {
            self.home[job] = Some(res.resource.clone());
        }
        self.held[job] = Some(res);
    }

    /// Reshapes `old` into `req` as [`CoOptions::modify`] says.
    async fn reshape(
        &mut self,
        old: &Reservation,
        req: &ReserveRequest,
    ) -> Result<ModifyAnswer, ReserveError> {
        match self.opts.modify {
            ModifyMode::Atomic => self.r.modify(&old.id, req).await,
            ModifyMode::ReleaseThenCreate => {
                self.release(old).await?;
                Ok(match self.r.reserve(req).await? {
                    Answer::Granted(res) => ModifyAnswer {
                        answer: Answer::Granted(res),
                        original_released: false,
                    },
                    other => ModifyAnswer {
                        answer: other,
                        original_released: true,
                    },
                })
            }
        }
    }

    fn request(&self, job: usize, resource: &str, earliest_s: i64, latest_s: i64) -> ReserveRequest {
        let j = &self.req.jobs[job];
        ReserveRequest {
            resource: resource.to_string(),
            cpus: j.cpus,
            duration_s: j.duration_s,
            earliest_s,
            latest_s,
            flexible: false,
            owner: self.req.owner.clone(),
        }
    }

    /// Job `job`'s start window in absolute terms.
    fn job_window(&self, job: usize, w: Window) -> (i64, i64) {
        let off = self.req.jobs[job].offset_s;
        (w.t_e.saturating_add(off), w.hi.saturating_add(off))
    }

    fn in_window(&self, job: usize, w: Window) -> bool {
        let (lo, hi) = self.job_window(job, w);
        self.held[job]
            .as_ref()
            .is_some_and(|r| lo <= r.start_s && r.start_s <= hi)
    }

    /// Releases a reservation we hold. A manager that no longer knows it has nothing to
    /// release, so `NotFound` is not an error here.
    async fn release(&mut self, res: &Reservation) -> Result<(), ReserveError> {
        self.stats.releases += 1;
        let o = self.opts.origin_s;
        self.note(|_| {
            format!(
                "    release {} on {} [{}, {})",
                res.id,
                res.resource,
                res.start_s - o,
                res.end_s - o
            )
        });
        match self.r.release(&res.id, &self.req.owner).await {
            Ok(()) | Err(ReserveError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Best-effort release of everything still held (failure and error paths).
    async fn release_all(&mut self) {
        let mut all: Vec<Reservation> = self.held.iter_mut().filter_map(Option::take).collect();
        all.extend(self.limbo.take());
        for res in all {
            if let Err(e) = self.release(&res).await {
                tracing::warn!(id = %res.id, resource = %res.resource, error = %e,
                    "coallocation cleanup could not release a reservation");
            }
        }
    }

    /// Step 7: moves `job`'s reservation into the window. `Ok(true)` if it now starts there;
    /// otherwise the old reservation is gone (released here unless the manager lost it).
    async fn move_into(&mut self, job: usize, old: Reservation, w: Window) -> Result<bool, ReserveError> {
        let (lo, hi) = self.job_window(job, w);
        let m = self
            .reshape(&old, &self.request(job, &old.resource, lo, hi))
            .await?;
        self.note(|s| {
            format!(
                "  modify {} on {} into [{}, {}]: {}",
                s.name(job),
                old.resource,
                lo - s.opts.origin_s,
                hi - s.opts.origin_s,
                show_modify(&m, s.opts.origin_s),
            )
        });
        match m.answer {
            Answer::Granted(res) => {
                self.stats.modifies += 1;
                self.held[job] = Some(res);
                Ok(true)
            }
            _ => {
                self.stats.failed_modifies += 1;
                self.stats.lost_originals += u32::from(m.original_released);
                // "Implicitly cancelled": holding a reservation outside the window while
                // waiting for others would be hold-and-wait.
                if m.original_released {
                    self.held[job] = None;
                } else {
                    self.release(&old).await?;
                    self.held[job] = None;
                }
                Ok(false)
            }
        }
    }

    /// Step 9: creates a reservation for `job` at its candidates in rank order. On refusal
    /// everywhere, returns the earliest announced retry (common-start terms).
    async fn create(&mut self, job: usize, w: Window) -> Result<Result<(), Option<i64>>, ReserveError> {
        let (lo, hi) = self.job_window(job, w);
        let off = self.req.jobs[job].offset_s;
        let mut earliest: Option<i64> = None;
        for cand in self.candidates_of(job) {
            let a = self.r.reserve(&self.request(job, &cand, lo, hi)).await?;
            self.note(|s| {
                let o = s.opts.origin_s;
                format!(
                    "  create {} on {cand} in [{}, {}]: {}",
                    s.name(job),
                    lo - o,
                    hi - o,
                    show(&a, o)
                )
            });
            match a {
                Answer::Granted(res) => {
                    self.stats.creates += 1;
                    self.hold(job, res);
                    return Ok(Ok(()));
                }
                Answer::Retry { from_s, .. } => {
                    self.stats.failed_creates += 1;
                    let f = from_s.saturating_sub(off);
                    earliest = Some(earliest.map_or(f, |e| e.min(f)));
                }
                Answer::Never(_) => self.stats.failed_creates += 1,
            }
        }
        Ok(Err(earliest))
    }

    /// Resource name → jobs holding a reservation there.
    fn holders(&self) -> BTreeMap<&str, Vec<usize>> {
        let mut h: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (job, res) in self.held.iter().enumerate() {
            if let Some(res) = res {
                h.entry(res.resource.as_str()).or_default().push(job);
            }
        }
        h
    }

    /// Step 13's test for one job: another job holds a reservation on one of its candidates.
    fn augmentable(&self, job: usize) -> bool {
        let h = self.holders();
        self.candidates_of(job)
            .iter()
            .any(|c| h.get(c.as_str()).is_some_and(|js| js.iter().any(|&k| k != job)))
    }

    /// Step 15: the shortest augmenting path from unplaced `start`, by BFS over jobs. Edges
    /// alternate: a candidate resource held by another job leads to that job; the path ends at
    /// a candidate nobody holds. The first hop must be a held resource (the start job's own
    /// creates were just refused). Only flexible jobs give up their reservation, so a
    /// non-flexible holder ends the search there.
    fn shortest_path(&self, start: usize) -> Option<Path> {
        let h = self.holders();
        let n = self.req.jobs.len();
        let mut parent: Vec<Option<(usize, String)>> = vec![None; n];
        let mut seen = vec![false; n];
        seen[start] = true;
        let mut queue = VecDeque::from([start]);
        while let Some(x) = queue.pop_front() {
            if x != start && !self.req.jobs[x].flexible {
                continue;
            }
            for cand in &self.candidates_of(x) {
                match h.get(cand.as_str()) {
                    None if x != start => {
                        let mut jobs = vec![x];
                        let mut resources = vec![cand.clone()];
                        let mut at = x;
                        while let Some((prev, via)) = &parent[at] {
                            jobs.push(*prev);
                            resources.push(via.clone());
                            at = *prev;
                        }
                        jobs.reverse();
                        resources.reverse();
                        return Some(Path { jobs, resources });
                    }
                    None => {}
                    Some(js) => {
                        for &k in js {
                            if !seen[k] {
                                seen[k] = true;
                                parent[k] = Some((x, cand.clone()));
                                queue.push_back(k);
                            }
                        }
                    }
                }
            }
        }
        None
    }

    /// Algorithm 2: create for the last job at the free resource, then walk back handing each
    /// held reservation to the previous job (same resource, same common start; only the shape
    /// changes). On failure returns the announced retry (common-start terms); the matching is
    /// left consistent: every job holds at most one reservation and nothing is orphaned.
    async fn augment(&mut self, p: &Path, w: Window) -> Result<Result<(), Option<i64>>, ReserveError> {
        let n = p.jobs.len();
        let (Some(&last), Some(free)) = (p.jobs.last(), p.resources.last()) else {
            return Ok(Err(None));
        };
        let (lo, hi) = self.job_window(last, w);
        self.note(|s| {
            let hops: Vec<String> = p
                .jobs
                .iter()
                .zip(&p.resources)
                .map(|(&j, r)| format!("{} -> {r}", s.name(j)))
                .collect();
            format!("  exchange along {}", hops.join(", "))
        });
        let a = self.r.reserve(&self.request(last, free, lo, hi)).await?;
        self.note(|s| {
            format!(
                "  create {} on {free} in [{}, {}]: {}",
                s.name(last),
                lo - s.opts.origin_s,
                hi - s.opts.origin_s,
                show(&a, s.opts.origin_s)
            )
        });
        match a {
            Answer::Granted(res) => {
                self.stats.creates += 1;
                self.limbo = Some(res);
            }
            Answer::Retry { from_s, .. } => {
                self.stats.failed_creates += 1;
                return Ok(Err(Some(from_s.saturating_sub(self.req.jobs[last].offset_s))));
            }
            Answer::Never(_) => {
                self.stats.failed_creates += 1;
                return Ok(Err(None));
            }
        }
        for i in (0..n - 1).rev() {
            let (taker, giver) = (p.jobs[i], p.jobs[i + 1]);
            let Some(given) = self.held[giver].clone() else {
                // Cannot happen (the path was built from `held`); fail rather than guess.
                if let Some(x) = self.limbo.clone() {
                    self.release(&x).await?;
                    self.limbo = None;
                }
                return Ok(Err(None));
            };
            // Keep the common start: with equal offsets this is the held start unchanged.
            let common = given.start_s.saturating_sub(self.req.jobs[giver].offset_s);
            let start = common.saturating_add(self.req.jobs[taker].offset_s);
            let m = self
                .reshape(&given, &self.request(taker, &given.resource, start, start))
                .await?;
            self.note(|s| {
                format!(
                    "  modify {}'s reservation on {} for {} at {}: {}",
                    s.name(giver),
                    given.resource,
                    s.name(taker),
                    start - s.opts.origin_s,
                    show_modify(&m, s.opts.origin_s),
                )
            });
            match m.answer {
                Answer::Granted(res) => {
                    self.stats.modifies += 1;
                    self.held[giver] = self.limbo.take();
                    self.limbo = Some(res);
                }
                other => {
                    self.stats.failed_modifies += 1;
                    self.stats.lost_originals += u32::from(m.original_released);
                    if m.original_released {
                        // The giver's old reservation is gone; the one meant for it is its own.
                        self.held[giver] = self.limbo.take();
                    } else if let Some(x) = self.limbo.clone() {
                        // The giver keeps its old reservation; the new one has no job.
                        self.release(&x).await?;
                        self.limbo = None;
                    }
                    let off = self.req.jobs[taker].offset_s;
                    return Ok(Err(match other {
                        Answer::Retry { from_s, .. } => Some(from_s.saturating_sub(off)),
                        _ => None,
                    }));
                }
            }
        }
        if let Some(res) = self.limbo.take() {
            self.hold(p.jobs[0], res);
        }
        Ok(Ok(()))
    }

    /// Algorithm 1. `Ok(Err(reason))` is a failure (cleanup is the caller's).
    async fn run(&mut self) -> Result<Result<(), NoFit>, ReserveError> {
        let out = self.search().await;
        if let Ok(Err(why)) = &out {
            self.note(|s| format!("failed: {}", why.shifted(s.opts.origin_s)));
        }
        out
    }

    /// The loop of Algorithm 1.
    async fn search(&mut self) -> Result<Result<(), NoFit>, ReserveError> {
        let (big_t_e, big_t_l, eps) = (self.req.window_start_s, self.req.window_end_s, self.req.epsilon_s);
        let mut t_e = big_t_e;
        let mut t_l = big_t_e.saturating_add(eps);
        loop {
            if self.stats.iterations >= MAX_ITERATIONS {
                return Ok(Err(NoFit::GaveUp { t_e, t_l }));
            }
            self.stats.iterations += 1;
            let w = Window {
                t_e,
                hi: t_l.min(big_t_l),
                t_l,
            };
            self.note(|s| {
                let o = s.opts.origin_s;
                format!(
                    "iteration {}: window [{}, {}]",
                    s.stats.iterations,
                    t_e - o,
                    w.hi - o
                )
            });
            tracing::debug!(
                iteration = self.stats.iterations,
                t_e,
                t_l,
                "coallocation iteration"
            );
            let mut unplaced: Vec<usize> = Vec::new();
            let mut best: Option<i64> = None;
            for job in self.order.clone() {
                if self.in_window(job, w) {
                    continue;
                }
                if let Some(old) = self.held[job].clone() {
                    if self.move_into(job, old, w).await? {
                        continue;
                    }
                }
                if let Err(retry) = self.create(job, w).await? {
                    unplaced.push(job);
                    fold_best(&mut best, w, retry);
                }
            }
            // Step 13: exchanging helps only if it can place every unplaced job.
            let all_augmentable = unplaced.iter().all(|&j| self.augmentable(j));
            if !unplaced.is_empty() && !all_augmentable {
                self.note(|_| {
                    "  no exchange: some unplaced job's candidates are held by no other job".to_string()
                });
            }
            if !unplaced.is_empty() && all_augmentable {
                for &job in &unplaced {
                    let Some(path) = self.shortest_path(job) else {
                        continue;
                    };
                    self.stats.augment_attempts += 1;
                    tracing::debug!(job = %self.req.jobs[job].name, len = path.jobs.len(), "augmenting path");
                    match self.augment(&path, w).await? {
                        Ok(()) => self.stats.augmentations += 1,
                        Err(retry) => {
                            self.stats.failed_augmentations += 1;
                            fold_best(&mut best, w, retry);
                        }
                    }
                }
            }
            if (0..self.req.jobs.len()).all(|j| self.in_window(j, w)) {
                return Ok(Ok(()));
            }
            let Some(next) = best else {
                return Ok(Err(NoFit::Final { t_e, t_l }));
            };
            self.note(|s| format!("  T_best {}: the window moves", next - s.opts.origin_s));
            if next <= t_l {
                return Ok(Err(NoFit::Stuck { next, t_l }));
            }
            t_l = next;
            t_e = next.saturating_sub(eps);
            if t_e > big_t_l {
                return Ok(Err(NoFit::PastEnd {
                    t_e,
                    t_l,
                    end: big_t_l,
                }));
            }
        }
    }
}

/// Coallocates `req` over `r`. On `Failed` and on `Err` nothing is held any more (best effort
/// for `Err`: the failing manager may keep what it cannot be told to release).
pub async fn coallocate<R: Reserver>(req: &CoRequest, r: &R) -> Result<CoOutcome, CoallocError> {
    coallocate_with(req, r, CoOptions::default()).await.0
}

/// [`coallocate`] with options; the second value is the trace (empty unless `opts.trace`).
pub async fn coallocate_with<R: Reserver>(
    req: &CoRequest,
    r: &R,
    opts: CoOptions,
) -> (Result<CoOutcome, CoallocError>, Vec<String>) {
    if let Err(e) = validate(req) {
        return (Err(e), Vec::new());
    }
    let mut run = Run::new(req, r, opts);
    let out = run.outcome().await;
    if let Ok(CoOutcome::Success { .. }) = &out {
        run.note(|_| "success".to_string());
    }
    (out, run.trace)
}

impl<R: Reserver> Run<'_, R> {
    async fn outcome(&mut self) -> Result<CoOutcome, CoallocError> {
        let req = self.req;
        let run = self;
        match run.run().await {
            Ok(Ok(())) => {
                let mut reservations = Vec::with_capacity(req.jobs.len());
                for (job, res) in req.jobs.iter().zip(run.held.iter()) {
                    match res {
                        Some(res) => reservations.push((job.name.clone(), res.clone())),
                        None => {
                            // Unreachable by the loop's exit condition; never report a partial set.
                            run.release_all().await;
                            return Ok(CoOutcome::Failed {
                                reason: format!("job {:?} lost its reservation", job.name),
                                stats: run.stats.clone(),
                            });
                        }
                    }
                }
                Ok(CoOutcome::Success {
                    reservations,
                    stats: run.stats.clone(),
                })
            }
            Ok(Err(reason)) => {
                run.release_all().await;
                Ok(CoOutcome::Failed {
                    reason: reason.to_string(),
                    stats: run.stats.clone(),
                })
            }
            Err(e) => {
                run.release_all().await;
                Err(CoallocError::Reserve(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use parking_lot::Mutex;
    use proptest::prelude::*;

    use super::*;
    use crate::calendar::{Calendar, Calendars, MemoryReserver};

    const MIN: i64 = 60;

    /// One call seen by [`Spy`].
    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Reserve(ReserveRequest),
        Modify(String, ReserveRequest),
        Release(String),
        List,
    }

    /// A reserver that records calls and can fail the `fail_at`-th one (1-based).
    struct Spy<'a> {
        inner: &'a MemoryReserver,
        calls: Mutex<Vec<Call>>,
        n: AtomicUsize,
        fail_at: Option<usize>,
    }

    impl<'a> Spy<'a> {
        fn new(inner: &'a MemoryReserver, fail_at: Option<usize>) -> Self {
            Spy {
                inner,
                calls: Mutex::new(Vec::new()),
                n: AtomicUsize::new(0),
                fail_at,
            }
        }

        fn note(&self, c: Call) -> Result<(), ReserveError> {
            self.calls.lock().push(c);
            let n = self.n.fetch_add(1, Ordering::SeqCst) + 1;
            if Some(n) == self.fail_at {
                return Err(ReserveError::Unavailable {
                    resource: "?".into(),
                    message: format!("call {n}"),
                });
            }
            Ok(())
        }

        fn calls(&self) -> Vec<Call> {
            self.calls.lock().clone()
        }

        fn reserves(&self) -> Vec<ReserveRequest> {
            self.calls()
                .into_iter()
                .filter_map(|c| match c {
                    Call::Reserve(r) => Some(r),
                    _ => None,
                })
                .collect()
        }
    }

    impl Reserver for Spy<'_> {
        async fn reserve(&self, req: &ReserveRequest) -> Result<Answer, ReserveError> {
            self.note(Call::Reserve(req.clone()))?;
            self.inner.reserve(req).await
        }
        async fn modify(&self, id: &str, req: &ReserveRequest) -> Result<ModifyAnswer, ReserveError> {
            self.note(Call::Modify(id.to_string(), req.clone()))?;
            self.inner.modify(id, req).await
        }
        async fn release(&self, id: &str, owner: &str) -> Result<(), ReserveError> {
            self.note(Call::Release(id.to_string()))?;
            self.inner.release(id, owner).await
        }
        async fn list(&self, resource: &str, owner: &str) -> Result<Vec<Reservation>, ReserveError> {
            self.note(Call::List)?;
            self.inner.list(resource, owner).await
        }
    }

    fn job(name: &str, cpus: u32, duration_s: i64, candidates: &[&str]) -> CoJob {
        CoJob {
            name: name.to_string(),
            cpus,
            memory_mb: 0.0,
            duration_s,
            offset_s: 0,
            candidates: candidates.iter().map(|c| c.to_string()).collect(),
            flexible: true,
        }
    }

    fn request(jobs: Vec<CoJob>, t_e: i64, t_l: i64, eps: i64) -> CoRequest {
        CoRequest {
            jobs,
            window_start_s: t_e,
            window_end_s: t_l,
            epsilon_s: eps,
            owner: "co".to_string(),
        }
    }

    async fn block(
        m: &MemoryReserver,
        resource: &str,
        cpus: u32,
        start: i64,
        end: i64,
    ) -> Option<Reservation> {
        let req = ReserveRequest {
            resource: resource.to_string(),
            cpus,
            duration_s: end - start,
            earliest_s: start,
            latest_s: start,
            flexible: false,
            owner: "background".to_string(),
        };
        m.reserve(&req).await.unwrap().granted().cloned()
    }

    fn success(o: &CoOutcome) -> (BTreeMap<String, Reservation>, CoStats) {
        match o {
            CoOutcome::Success { reservations, stats } => {
                (reservations.iter().cloned().collect(), stats.clone())
            }
            CoOutcome::Failed { reason, stats } => panic!("failed: {reason} ({stats:?})"),
        }
    }

    fn failed(o: &CoOutcome) -> CoStats {
        match o {
            CoOutcome::Failed { stats, .. } => stats.clone(),
            other => panic!("expected failure, got {other:?}"),
        }
    }

    /// The §3.2.4 example with background load matching Fig. 4.
    async fn paper_example() -> (MemoryReserver, CoRequest) {
        let m = MemoryReserver::with_resources([("R1", 1), ("R2", 1), ("R3", 1), ("R4", 1)]);
        block(&m, "R1", 1, 10 * MIN, 13 * MIN).await.unwrap();
        block(&m, "R2", 1, 14 * MIN, 30 * MIN).await.unwrap();
        block(&m, "R3", 1, 2 * MIN, 13 * MIN).await.unwrap();
        block(&m, "R4", 1, MIN, 8 * MIN).await.unwrap();
        let req = request(
            vec![
                job("J1", 1, 10 * MIN, &["R1", "R3"]),
                job("J2", 1, 10 * MIN, &["R2", "R4"]),
                job("J3", 1, 10 * MIN, &["R3", "R4"]),
            ],
            0,
            20 * MIN,
            5 * MIN,
        );
        (m, req)
    }

    #[tokio::test]
    async fn paper_example_is_reproduced() {
        let (m, req) = paper_example().await;
        let spy = Spy::new(&m, None);
        let out = coallocate(&req, &spy).await.unwrap();
        let (res, stats) = success(&out);
        assert_eq!(stats.iterations, 3, "{stats:?}");
        assert_eq!(res["J1"].resource, "R1");
        assert_eq!(res["J2"].resource, "R4");
        assert_eq!(res["J3"].resource, "R3");
        assert_eq!(
            (res["J1"].start_s, res["J2"].start_s, res["J3"].start_s),
            (13 * MIN, 8 * MIN, 13 * MIN)
        );
        assert_eq!(
            (
                stats.augmentations,
                stats.augment_attempts,
                stats.failed_augmentations
            ),
            (1, 1, 0)
        );
        // Iteration 2 moved J2 (granted) and failed J1's move; iteration 3 failed J2's move,
        // then Algorithm 2 modified J3's R4 reservation for J2.
        assert_eq!((stats.modifies, stats.failed_modifies), (2, 2), "{stats:?}");
        // The path update: create J3@R3, then modify the R4 reservation (start kept at 8 min).
        let calls = spy.calls();
        let n = calls.len();
        assert!(matches!(&calls[n - 2], Call::Reserve(r) if r.resource == "R3" && r.latest_s == 13 * MIN));
        assert!(
            matches!(&calls[n - 1], Call::Modify(_, r) if r.resource == "R4" && r.earliest_s == 8 * MIN && r.latest_s == 8 * MIN)
        );
        let mine: Vec<Reservation> = m.list("", "co").await.unwrap();
        assert_eq!(mine.len(), 3);
        let others: Vec<Reservation> = m
            .list("", "")
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.owner != "background")
            .collect();
        assert_eq!(
            others, mine,
            "only the three coallocated reservations are held besides the background"
        );
        assert!(m.within_capacity());
    }

    #[tokio::test]
    async fn the_window_jumps_to_the_earliest_retry() {
        let m = MemoryReserver::with_resources([("A", 1), ("B", 1)]);
        block(&m, "A", 1, 0, 1000).await.unwrap();
        block(&m, "B", 1, 0, 700).await.unwrap();
        let req = request(
            vec![job("J1", 1, 100, &["A"]), job("J2", 1, 100, &["B"])],
            0,
            5000,
            300,
        );
        let spy = Spy::new(&m, None);
        let (res, stats) = success(&coallocate(&req, &spy).await.unwrap());
        // Iteration 1: both refused (retries 1000 and 700) → window [400, 700]; J2 fits at 700,
        // J1 refused again (1000) → [700, 1000]: J1 at 1000, J2 still inside.
        let windows: Vec<(String, i64, i64)> = spy
            .reserves()
            .into_iter()
            .map(|r| (r.resource, r.earliest_s, r.latest_s))
            .collect();
        assert_eq!(
            windows,
            vec![
                ("A".to_string(), 0, 300),
                ("B".to_string(), 0, 300),
                ("A".to_string(), 400, 700),
                ("B".to_string(), 400, 700),
                ("A".to_string(), 700, 1000),
            ]
        );
        assert_eq!(stats.iterations, 3);
        assert_eq!((res["J1"].start_s, res["J2"].start_s), (1000, 700));
    }

    #[tokio::test]
    async fn all_never_fails_after_one_iteration_and_leaks_nothing() {
        let m = MemoryReserver::with_resources([("A", 1), ("B", 1)]);
        // J2 needs 5 CPUs: every manager says never; J1 was granted and must be released.
        let req = request(
            vec![job("J1", 1, 100, &["A"]), job("J2", 5, 100, &["A", "B"])],
            0,
            5000,
            300,
        );
        let stats = failed(&coallocate(&req, &m).await.unwrap());
        assert_eq!(stats.iterations, 1);
        assert_eq!((stats.creates, stats.failed_creates, stats.releases), (1, 2, 1));
        assert!(m.list("", "co").await.unwrap().is_empty());

        let req = request(
            vec![job("J1", 2, 100, &["A", "B"]), job("J2", 3, 100, &["nope"])],
            0,
            5000,
            300,
        );
        let stats = failed(&coallocate(&req, &m).await.unwrap());
        assert_eq!((stats.iterations, stats.creates, stats.failed_creates), (1, 0, 3));
        assert!(m.list("", "").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_window_past_t_l_fails_and_leaks_nothing() {
        let m = MemoryReserver::with_resources([("A", 1), ("B", 1)]);
        block(&m, "A", 1, 0, 2000).await.unwrap();
        let req = request(
            vec![job("J1", 1, 100, &["A"]), job("J2", 1, 100, &["B"])],
            0,
            1000,
            300,
        );
        let out = coallocate(&req, &m).await.unwrap();
        let stats = failed(&out);
        assert_eq!(stats.iterations, 1);
        assert!(
            matches!(&out, CoOutcome::Failed { reason, .. } if reason.contains("after T_l")),
            "{out:?}"
        );
        assert!(m.list("", "co").await.unwrap().is_empty());
        assert_eq!(
            m.list("", "").await.unwrap().len(),
            1,
            "only the background block"
        );
    }

    #[tokio::test]
    async fn no_augmentation_unless_every_unplaced_job_is_augmentable() {
        let setup = || async {
            let m = MemoryReserver::with_resources([("X", 1), ("Y", 1), ("Z", 1)]);
            block(&m, "Y", 1, 0, 100_000).await.unwrap();
            m
        };
        // J2 could take X from J1 (J1 → Z), but J3 (only Y, busy) cannot be helped by anyone.
        let m = setup().await;
        let jobs = vec![
            job("J1", 1, 1000, &["X", "Z"]),
            job("J2", 1, 1000, &["X"]),
            job("J3", 1, 1000, &["Y"]),
        ];
        let stats = failed(
            &coallocate(&request(jobs.clone(), 0, 1000, 300), &m)
                .await
                .unwrap(),
        );
        assert_eq!(stats.augment_attempts, 0, "{stats:?}");
        assert!(m.list("", "co").await.unwrap().is_empty());
        // Control: without J3 the exchange happens.
        let m = setup().await;
        let (res, stats) = success(
            &coallocate(&request(jobs[..2].to_vec(), 0, 1000, 300), &m)
                .await
                .unwrap(),
        );
        assert_eq!(
            (stats.augment_attempts, stats.augmentations, stats.iterations),
            (1, 1, 1)
        );
        assert_eq!(
            (res["J1"].resource.as_str(), res["J2"].resource.as_str()),
            ("Z", "X")
        );
    }

    #[tokio::test]
    async fn only_flexible_jobs_give_up_their_machine_in_an_exchange() {
        // J2 can only use X, which J1 (X or Z) takes first: an exchange moves J1 to Z — unless
        // J1 is not flexible, when J2 is never placed and the window runs out.
        let jobs = |flexible: bool| {
            let mut j1 = job("J1", 1, 1000, &["X", "Z"]);
            j1.flexible = flexible;
            vec![j1, job("J2", 1, 1000, &["X"])]
        };
        let m = MemoryReserver::with_resources([("X", 1), ("Z", 1)]);
        let (res, stats) = success(&coallocate(&request(jobs(true), 0, 1500, 300), &m).await.unwrap());
        assert_eq!(
            (res["J1"].resource.as_str(), res["J2"].resource.as_str()),
            ("Z", "X")
        );
        assert_eq!(stats.augmentations, 1);

        let m = MemoryReserver::with_resources([("X", 1), ("Z", 1)]);
        let spy = Spy::new(&m, None);
        let (out, trace) = coallocate_with(
            &request(jobs(false), 0, 1500, 300),
            &spy,
            CoOptions {
                trace: true,
                ..CoOptions::default()
            },
        )
        .await;
        let stats = failed(&out.unwrap());
        assert_eq!(stats.augment_attempts, 0, "{trace:#?}");
        // J1 was only ever asked for on X, its machine.
        assert!(spy.reserves().iter().all(|r| r.resource == "X"), "{trace:#?}");
        assert!(m.list("", "co").await.unwrap().is_empty());
        // The failure (times from the origin), then the cleanup of what was still held.
        let failed = trace
            .iter()
            .position(|l| l.starts_with("failed: "))
            .expect("a failure line");
        assert!(trace[failed].contains("T_l = 1500"), "{trace:#?}");
        assert!(
            trace[failed + 1..].iter().all(|l| l.contains("release ")),
            "{trace:#?}"
        );
    }

    #[tokio::test]
    async fn a_non_flexible_job_is_re_created_only_on_its_own_machine() {
        // J1 gets A at 0; J2 waits for C until 500, so the window moves to [200, 500]; A is
        // busy from 100 on, so J1's modify is refused. A flexible J1 is re-created on B; a
        // non-flexible one only tries A again and the coallocation fails.
        let setup = || async {
            let m = MemoryReserver::with_resources([("A", 1), ("B", 1), ("C", 1)]);
            block(&m, "A", 1, 100, 10_000).await.unwrap();
            block(&m, "C", 1, 0, 500).await.unwrap();
            m
        };
        let jobs = |flexible: bool| {
            let mut j1 = job("J1", 1, 100, &["A", "B"]);
            j1.flexible = flexible;
            vec![j1, job("J2", 1, 100, &["C"])]
        };
        let m = setup().await;
        let (res, stats) = success(&coallocate(&request(jobs(true), 0, 1000, 300), &m).await.unwrap());
        assert_eq!((res["J1"].resource.as_str(), res["J1"].start_s), ("B", 200));
        assert_eq!((stats.iterations, stats.failed_modifies), (2, 1));

        let m = setup().await;
        let spy = Spy::new(&m, None);
        let stats = failed(
            &coallocate(&request(jobs(false), 0, 1000, 300), &spy)
                .await
                .unwrap(),
        );
        assert_eq!(stats.failed_modifies, 1);
        assert!(
            spy.reserves().iter().all(|r| r.resource != "B"),
            "{:?}",
            spy.calls()
        );
        assert!(m.list("", "co").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_shortest_augmenting_path_is_used() {
        let m = MemoryReserver::with_resources(
            ["X", "Y", "Z", "W", "F1", "F2"]
                .into_iter()
                .map(|r| (r, 1))
                .collect::<Vec<_>>(),
        );
        // Held after the creates: B@X, C@Y, D@Z, E@W. A is refused at Y and X. Paths from A:
        // A→Y(C)→C→Z(D)→D→W(E)→E→F2 (4 jobs, Y ranked first) and A→X(B)→B→F1 (2 jobs).
        let jobs = vec![
            job("B", 1, 1000, &["X", "F1"]),
            job("C", 1, 1000, &["Y", "Z"]),
            job("D", 1, 1000, &["Z", "W"]),
            job("E", 1, 1000, &["W", "F2"]),
            job("A", 1, 1000, &["Y", "X"]),
        ];
        let spy = Spy::new(&m, None);
        let (res, stats) = success(&coallocate(&request(jobs, 0, 1000, 300), &spy).await.unwrap());
        let got: Vec<(&str, &str)> = res
            .iter()
            .map(|(j, r)| (j.as_str(), r.resource.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![("A", "X"), ("B", "F1"), ("C", "Y"), ("D", "Z"), ("E", "W")]
        );
        assert_eq!((stats.augmentations, stats.modifies, stats.iterations), (1, 1, 1));
        // Algorithm 2: the create comes first, then the modify of B's X reservation, pinned to
        // its start.
        let calls = spy.calls();
        let n = calls.len();
        assert!(
            matches!(&calls[n - 2], Call::Reserve(r) if r.resource == "F1"),
            "{calls:?}"
        );
        assert!(
            matches!(&calls[n - 1], Call::Modify(_, r) if r.resource == "X" && r.earliest_s == 0 && r.latest_s == 0),
            "{calls:?}"
        );
        assert_eq!(res["A"].start_s, 0);
    }

    #[tokio::test]
    async fn jobs_are_tried_in_decreasing_size() {
        let m = MemoryReserver::with_resources([("big", 16)]);
        let mut jobs = vec![
            job("a", 1, 60, &["big"]),
            job("b", 4, 61, &["big"]),
            job("c", 2, 62, &["big"]),
            job("d", 2, 120, &["big"]),
            job("e", 2, 30, &["big"]),
        ];
        jobs[0].memory_mb = 100.0;
        jobs[2].memory_mb = 500.0;
        jobs[3].memory_mb = 500.0;
        jobs[4].memory_mb = 800.0;
        let spy = Spy::new(&m, None);
        success(&coallocate(&request(jobs, 0, 1000, 300), &spy).await.unwrap());
        let durations: Vec<i64> = spy.reserves().iter().map(|r| r.duration_s).collect();
        // b (4 cpus); then the 2-cpu jobs by memory (e 800, then d/c at 500 by runtime); a.
        assert_eq!(durations, vec![61, 30, 120, 62, 60]);
    }

    #[tokio::test]
    async fn offsets_shift_the_starts() {
        let m = MemoryReserver::with_resources([("A", 1), ("B", 1)]);
        block(&m, "B", 1, 0, 900).await.unwrap();
        block(&m, "A", 1, 200, 400).await.unwrap();
        let mut jobs = vec![job("J1", 1, 100, &["A"]), job("J2", 1, 100, &["B"])];
        jobs[1].offset_s = 600;
        let (res, _) = success(&coallocate(&request(jobs, 0, 3600, 300), &m).await.unwrap());
        let diff = res["J2"].start_s - res["J1"].start_s;
        assert!(
            (diff - 600).abs() <= 300,
            "starts {} and {}",
            res["J1"].start_s,
            res["J2"].start_s
        );

        // Without background, exactly 600 apart at the earliest time.
        let m = MemoryReserver::with_resources([("A", 1), ("B", 1)]);
        let mut jobs = vec![job("J1", 1, 100, &["A"]), job("J2", 1, 100, &["B"])];
        jobs[1].offset_s = 600;
        let (res, _) = success(&coallocate(&request(jobs, 50, 3600, 300), &m).await.unwrap());
        assert_eq!((res["J1"].start_s, res["J2"].start_s), (50, 650));
    }

    #[tokio::test]
    async fn a_manager_error_aborts_and_releases_everything() {
        // Count the calls of a clean run, then fail each one in turn.
        let (m, req) = paper_example().await;
        let spy = Spy::new(&m, None);
        success(&coallocate(&req, &spy).await.unwrap());
        let total = spy.calls().len();
        assert!(total > 10);
        for n in 1..=total {
            let (m, req) = paper_example().await;
            let spy = Spy::new(&m, Some(n));
            match coallocate(&req, &spy).await {
                Err(CoallocError::Reserve(ReserveError::Unavailable { .. })) => {}
                other => panic!("call {n}: {other:?}"),
            }
            // The injected error hits one call of the run; the cleanup after it goes through.
            let left = m.list("", "co").await.unwrap();
            assert!(left.is_empty(), "call {n}: leaked {left:?}");
        }
    }

    #[test]
    fn validation_names_the_problem() {
        let ok = request(vec![job("J1", 1, 10, &["A"])], 0, 10, 5);
        assert_eq!(validate(&ok), Ok(()));
        let cases: Vec<(CoRequest, &str)> = vec![
            (request(vec![], 0, 10, 5), "no jobs"),
            (request(ok.jobs.clone(), 0, 10, 0), "epsilon"),
            (request(ok.jobs.clone(), 11, 10, 5), "window_start_s"),
            (request(vec![job("J9", 0, 10, &["A"])], 0, 10, 5), "\"J9\": cpus"),
            (
                request(vec![job("J9", 1, 0, &["A"])], 0, 10, 5),
                "\"J9\": duration_s",
            ),
            (
                request(vec![job("J9", 1, 10, &[])], 0, 10, 5),
                "\"J9\": no candidate",
            ),
            (
                request(vec![job("J1", 1, 10, &["A"]), job("J1", 1, 10, &["B"])], 0, 10, 5),
                "twice",
            ),
        ];
        for (req, want) in cases {
            match validate(&req) {
                Err(CoallocError::Invalid(m)) => assert!(m.contains(want), "{m:?} lacks {want:?}"),
                other => panic!("{want}: {other:?}"),
            }
        }
    }

    /// Blocks taken on a resource before the coallocation: (CPUs, start, length).
    type Blocks = Vec<(u32, i64, i64)>;

    /// A random instance: per resource its capacity (1 or 2 CPUs) and 0 to 3 blocks (CPUs, start,
    /// length) taken before the coallocation; whether the managers' modifies are non-atomic (3
    /// in 10) and whether the coallocator modifies by release-then-create (3 in 10); 2 to 4 jobs
    /// of (candidate resources in rank order, CPUs (2 one in 5), memory, duration, offset
    /// (non-zero 3 in 10), flexible (7 in 10)); the end of the window and epsilon.
    #[derive(Debug, Clone)]
    struct Instance {
        resources: Vec<(u32, Blocks)>,
        non_atomic: bool,
        release_then_create: bool,
        jobs: Vec<(Vec<usize>, u32, u32, i64, i64, bool)>,
        window_end_s: i64,
        epsilon_s: i64,
    }

    fn instance() -> impl Strategy<Value = Instance> {
        let resources = prop::collection::vec(
            (1..=2u32).prop_flat_map(|cap| {
                (
                    Just(cap),
                    prop::collection::vec((1..=cap, 0..14_400i64, 300..=3600i64), 0..=3),
                )
            }),
            2..=5,
        );
        resources.prop_flat_map(|resources| {
            let n = resources.len();
            let job = (
                prop::sample::subsequence((0..n).collect::<Vec<_>>(), 1..=n).prop_shuffle(),
                prop::sample::select(vec![1u32, 1, 1, 1, 2]),
                0..4u32,
                300..=3600i64,
                prop::option::weighted(0.3, 0..=900i64).prop_map(|o| o.unwrap_or(0)),
                prop::bool::weighted(0.7),
            );
            (
                Just(resources),
                prop::bool::weighted(0.3),
                prop::bool::weighted(0.3),
                prop::collection::vec(job, 2..=4),
                0..=7200i64,
                60..=600i64,
            )
                .prop_map(
                    |(resources, non_atomic, release_then_create, jobs, window_end_s, epsilon_s)| Instance {
                        resources,
                        non_atomic,
                        release_then_create,
                        jobs,
                        window_end_s,
                        epsilon_s,
                    },
                )
        })
    }

    #[test]
    fn random_instances_never_leak_and_succeed_consistently() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (successes, failures, augmented, non_atomic_runs) =
            (Cell::new(0), Cell::new(0), Cell::new(0), Cell::new(0));
        proptest!(ProptestConfig::with_cases(300), |(inst in instance())| rt.block_on(async {
            let names: Vec<String> = (0..inst.resources.len()).map(|i| format!("R{i}")).collect();
            non_atomic_runs.set(non_atomic_runs.get() + usize::from(inst.non_atomic));
            let mut cals = Calendars::new();
            for (name, (cap, _)) in names.iter().zip(&inst.resources) {
                cals.insert(Calendar::new(name.clone(), *cap).with_non_atomic_modify(inst.non_atomic));
            }
            let m = MemoryReserver::new(cals);
            for (name, (_, blocks)) in names.iter().zip(&inst.resources) {
                for &(cpus, start, len) in blocks {
                    // Overlapping blocks beyond capacity are simply refused.
                    block(&m, name, cpus, start, start + len).await;
                }
            }
            let jobs: Vec<CoJob> = inst
                .jobs
                .iter()
                .enumerate()
                .map(|(i, (cands, cpus, mem, duration_s, offset_s, flexible))| CoJob {
                    name: format!("J{i}"),
                    cpus: *cpus,
                    memory_mb: f64::from(*mem) * 512.0,
                    duration_s: *duration_s,
                    offset_s: *offset_s,
                    candidates: cands.iter().map(|&c| names[c].clone()).collect(),
                    flexible: *flexible,
                })
                .collect();
            let req = request(jobs, 0, inst.window_end_s, inst.epsilon_s);
            let opts = CoOptions {
                modify: if inst.release_then_create {
                    ModifyMode::ReleaseThenCreate
                } else {
                    ModifyMode::Atomic
                },
                ..CoOptions::default()
            };
            let out = coallocate_with(&req, &m, opts).await.0.unwrap();
            prop_assert!(m.within_capacity(), "over capacity");
            match &out {
                CoOutcome::Failed { .. } => {
                    failures.set(failures.get() + 1);
                    let left = m.list("", "co").await.unwrap();
                    prop_assert!(left.is_empty(), "leaked {:?} ({:?})", left, out);
                }
                CoOutcome::Success { reservations, stats } => {
                    successes.set(successes.get() + 1);
                    augmented.set(augmented.get() + usize::from(stats.augmentations > 0));
                    prop_assert_eq!(reservations.len(), req.jobs.len());
                    let mut commons = Vec::new();
                    for (j, (name, r)) in req.jobs.iter().zip(reservations) {
                        prop_assert_eq!(&j.name, name);
                        prop_assert!(
                            j.candidates.contains(&r.resource),
                            "{} on {}",
                            name,
                            r.resource
                        );
                        prop_assert_eq!((r.cpus, r.end_s - r.start_s), (j.cpus, j.duration_s));
                        let c = r.start_s - j.offset_s;
                        prop_assert!(
                            req.window_start_s <= c && c <= req.window_end_s,
                            "start {} outside [{}, {}]",
                            c,
                            req.window_start_s,
                            req.window_end_s
                        );
                        commons.push(c);
                    }
                    let spread = commons.iter().max().unwrap() - commons.iter().min().unwrap();
                    prop_assert!(
                        spread <= req.epsilon_s,
                        "spread {} > ε {}",
                        spread,
                        req.epsilon_s
                    );
                    let mut held: Vec<String> = m
                        .list("", "co")
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|r| r.id)
                        .collect();
                    let mut ours: Vec<String> = reservations.iter().map(|(_, r)| r.id.clone()).collect();
                    held.sort();
                    ours.sort();
                    prop_assert_eq!(held, ours, "exactly one reservation per job is held");
                    for (_, r) in reservations {
                        m.release(&r.id, "co").await.unwrap();
                    }
                }
            }
            Ok::<(), TestCaseError>(())
        })?);
        let (successes, failures) = (successes.get(), failures.get());
        println!(
            "random instances: {successes} successes ({} with an exchange), {failures} failures, {} non-atomic",
            augmented.get(),
            non_atomic_runs.get()
        );
        assert!(
            successes > 20 && failures > 20,
            "the generator should exercise both outcomes"
        );
    }
}
