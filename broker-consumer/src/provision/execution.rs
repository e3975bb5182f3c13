//! Provisioned against best-effort execution of a workflow on one batch-scheduled site with
//! background load (Singh, Kesselman, Deelman §5–6, Figs. 5–9; docs/provisioning.md). Pure: a
//! discrete-event model, no I/O.
//!
//! The site: `processors` processors under a batch queue with **conservative backfilling** and
//! exact runtimes: every job, on arrival, gets the earliest start at which its processors are
//! free for its whole run given every job that arrived before it, and never moves (runtimes
//! are exact, so nothing ends early). Background jobs arrive as a Poisson process (processors
//! uniform in 1..=`max_job_cpus`, runtime exponential with mean `mean_job_s`, clamped to
//! 60 s..=8 × the mean) at the rate that offers `utilization` of the site.
//!
//! - **Best effort**: the workflow's first tasks are submitted at `t0`; every task is submitted
//!   when its last parent ends and waits in the queue behind the background jobs that arrived
//!   before it (a background job arriving at the same second goes first).
//! - **Provisioned**: at `t0` the site's free capacity (the holes of the schedule of the jobs
//!   that arrived before `t0`, from `t0` to `t0 + horizon_s`, as maximal bands:
//!   [`free_bands`](super::free::free_bands)) is offered as slots; MOGA plans the workflow on
//!   them and α picks a plan, whose slots are then reserved (background jobs arriving later go
//!   around them). Runtimes are exact, so the workflow runs as planned: its makespan is the
//!   plan's. Its cost is the planner's (with `MogaConfig::divisible`, the paper's charge for a
//!   divisible slot: what the schedule uses of it), and also reported with the slots bought
//!   whole.
//!
//! Both are measured from `t0`. Best effort's allocation cost is the work itself
//! (`Σ runtime × processors`, the paper's AC_BE).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::format::{Offer, Workflow, MAX_SLOTS};
use super::free::{free_bands, Capacity};
use super::heft::Problem;
use super::moga::{choose, moga, MogaConfig};

/// The site and its background load.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteConfig {
    pub processors: u32,
    /// Offered background utilization, 0..1.
    pub utilization: f64,
    pub mean_job_s: f64,
    pub max_job_cpus: u32,
    /// When the workflow is submitted (background jobs arrive from 0: the queue is warm).
    pub t0_s: i64,
    /// Background jobs keep arriving until `t0 + tail_s`.
    pub tail_s: i64,
    /// Provisioned: slots are offered up to `t0 + horizon_s`.
    pub horizon_s: i64,
    pub seed: u64,
}

impl Default for SiteConfig {
    fn default() -> Self {
        SiteConfig {
            processors: 64,
            utilization: 0.85,
            mean_job_s: 1800.0,
            max_job_cpus: 16,
            t0_s: 2 * 86_400,
            tail_s: 7 * 86_400,
            horizon_s: 86_400,
            seed: 1,
        }
    }
}

/// A background job: arrival, runtime, processors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    pub arrival_s: i64,
    pub runtime_s: i64,
    pub cpus: u32,
}

/// The background jobs of `cfg` (deterministic per seed), by arrival.
pub fn background(cfg: &SiteConfig) -> Vec<Job> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mean_cpus = (1.0 + f64::from(cfg.max_job_cpus.max(1))) / 2.0;
    let rate = cfg.utilization * f64::from(cfg.processors) / (mean_cpus * cfg.mean_job_s);
    let mut out = Vec::new();
    if !(rate.is_finite() && rate > 0.0) {
        return out;
    }
    let max_run = (8.0 * cfg.mean_job_s) as i64;
    let mut t = 0.0;
    loop {
        let u: f64 = rng.random_range(f64::EPSILON..1.0);
        t += -u.ln() / rate;
        if t > (cfg.t0_s + cfg.tail_s) as f64 {
            return out;
        }
        let v: f64 = rng.random_range(f64::EPSILON..1.0);
        let runtime_s = ((-v.ln() * cfg.mean_job_s) as i64).clamp(60, max_run.max(60));
        let cpus = rng.random_range(1..=cfg.max_job_cpus.clamp(1, cfg.processors));
        out.push(Job {
            arrival_s: t as i64,
            runtime_s,
            cpus,
        });
    }
}

/// The background work of `jobs` as a fraction of the site over the run.
pub fn offered_utilization(cfg: &SiteConfig, jobs: &[Job]) -> f64 {
    let span = (cfg.t0_s + cfg.tail_s) as f64 * f64::from(cfg.processors);
    jobs.iter()
        .map(|j| j.runtime_s as f64 * f64::from(j.cpus))
        .sum::<f64>()
        / span
}

/// The site's schedule: what each placed job holds, (start, end, processors).
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub processors: u32,
    pub held: Vec<(i64, i64, u32)>,
}

impl Profile {
    /// The usage as a step function: (time, processors held from it to the next step).
    fn steps(&self) -> Vec<(i64, u32)> {
        let mut ev: Vec<(i64, i64)> = self
            .held
            .iter()
            .flat_map(|h| [(h.0, i64::from(h.2)), (h.1, -i64::from(h.2))])
            .collect();
        ev.sort_unstable();
        let mut out: Vec<(i64, u32)> = Vec::with_capacity(ev.len());
        let mut level = 0i64;
        for (t, d) in ev {
            level += d;
            let l = u32::try_from(level.max(0)).unwrap_or(u32::MAX);
            match out.last_mut() {
                Some(last) if last.0 == t => last.1 = l,
                _ => out.push((t, l)),
            }
        }
        out
    }

    /// The most processors held at once over `[a, b)`, on `steps`.
    fn peak(steps: &[(i64, u32)], a: i64, b: i64) -> u32 {
        let first = steps.partition_point(|s| s.0 <= a);
        let at_a = if first == 0 { 0 } else { steps[first - 1].1 };
        steps[first..]
            .iter()
            .take_while(|s| s.0 < b)
            .map(|s| s.1)
            .fold(at_a, u32::max)
    }

    /// Places a job arriving at `from`: the earliest start at which `cpus` are free for
    /// `runtime_s` (conservative backfilling). Returns the start.
    pub fn place(&mut self, from: i64, runtime_s: i64, cpus: u32) -> i64 {
        self.held.retain(|h| h.1 > from);
        let run = runtime_s.max(1);
        let cpus = cpus.min(self.processors);
        let steps = self.steps();
        let candidates = std::iter::once(from).chain(steps.iter().map(|s| s.0).filter(|&t| t > from));
        let mut start = from;
        for t in candidates {
            start = t;
            if Profile::peak(&steps, t, t + run) + cpus <= self.processors {
                break;
            }
        }
        // The last candidate is the last end: the site is empty from it, so the loop ends
        // there at the latest.
        self.held.push((start, start + run, cpus));
        start
    }
}

/// Best effort from `t0`: the workflow's makespan (seconds from `t0`).
pub fn best_effort(cfg: &SiteConfig, jobs: &[Job], wf: &Workflow) -> i64 {
    let mut site = Profile {
        processors: cfg.processors,
        held: Vec::new(),
    };
    let mut parents_left: Vec<usize> = wf.parents.iter().map(Vec::len).collect();
    let mut ready_at: Vec<i64> = vec![cfg.t0_s; wf.tasks.len()];
    // (submission time, task)
    let mut ready: BinaryHeap<Reverse<(i64, usize)>> = (0..wf.tasks.len())
        .filter(|&t| parents_left[t] == 0)
        .map(|t| Reverse((cfg.t0_s, t)))
        .collect();
    let mut next_job = 0;
    let mut end = cfg.t0_s;
    while let Some(&Reverse((at, task))) = ready.peek() {
        if let Some(j) = jobs.get(next_job).filter(|j| j.arrival_s <= at) {
            site.place(j.arrival_s, j.runtime_s, j.cpus);
            next_job += 1;
            continue;
        }
        ready.pop();
        let t = &wf.tasks[task];
        let start = site.place(at, t.runtime_s, t.processors);
        let finish = start + t.runtime_s;
        end = end.max(finish);
        for &(child, _) in &wf.children[task] {
            ready_at[child] = ready_at[child].max(finish);
            parents_left[child] -= 1;
            if parents_left[child] == 0 {
                ready.push(Reverse((ready_at[child], child)));
            }
        }
    }
    end - cfg.t0_s
}

/// The site's offer at `t0`: the free slots of the schedule of the jobs that arrived before.
pub fn offer_at_t0(cfg: &SiteConfig, jobs: &[Job]) -> Result<Offer, super::FormatError> {
    let mut site = Profile {
        processors: cfg.processors,
        held: Vec::new(),
    };
    for j in jobs.iter().take_while(|j| j.arrival_s < cfg.t0_s) {
        site.place(j.arrival_s, j.runtime_s, j.cpus);
    }
    site.held.retain(|h| h.1 > cfg.t0_s);
    let mut slots = free_bands(
        cfg.t0_s,
        &Capacity {
            resource: "site".into(),
            cpus: cfg.processors,
            until_s: cfg.t0_s + cfg.horizon_s,
            reserved: site.held,
            price: 1.0,
        },
    );
    slots.truncate(MAX_SLOTS);
    Offer::new(cfg.t0_s, 100.0, 0, slots)
}

/// One provisioned run's plan for one α.
#[derive(Debug, Clone, PartialEq)]
pub struct Provisioned {
    pub alpha: f64,
    pub makespan_s: i64,
    /// The planner's cost (divisible or whole, as configured).
    pub cost_su: f64,
    /// The plan's slots bought whole.
    pub whole_su: f64,
    pub slots: usize,
}

/// One seed: best effort, and the provisioned plan for every α.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub seed: u64,
    pub background_jobs: usize,
    /// Background work offered over the run, as a fraction of the site.
    pub offered_utilization: f64,
    pub slots_offered: usize,
    pub pareto: usize,
    pub best_effort_s: i64,
    /// Empty when no plan was feasible within the horizon.
    pub provisioned: Vec<Provisioned>,
}

/// Runs one seed of the comparison for `wf`.
pub fn trial(
    cfg: &SiteConfig,
    wf: &Workflow,
    moga_cfg: &MogaConfig,
    alphas: &[f64],
) -> Result<Trial, super::FormatError> {
    let jobs = background(cfg);
    let offered_utilization = offered_utilization(cfg, &jobs);
    let best_effort_s = best_effort(cfg, &jobs, wf);
    let offer = offer_at_t0(cfg, &jobs)?;
    let problem = Problem::new(wf.clone(), offer);
    let out = moga(&problem, moga_cfg);
    let mut provisioned = Vec::new();
    for &alpha in alphas {
        let Some(i) = choose(&out.front, alpha) else { break };
        let plan = &out.front[i];
        provisioned.push(Provisioned {
            alpha,
            makespan_s: plan.makespan_s,
            cost_su: plan.cost,
            whole_su: problem.cost(&plan.slots),
            slots: plan.slots.len(),
        });
    }
    Ok(Trial {
        seed: cfg.seed,
        background_jobs: jobs.len(),
        offered_utilization,
        slots_offered: problem.slots(),
        pareto: out.front.len(),
        best_effort_s,
        provisioned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::format::Task;

    fn chain(runtimes: &[(i64, u32)]) -> Workflow {
        let tasks = runtimes
            .iter()
            .enumerate()
            .map(|(i, &(r, p))| Task {
                id: format!("t{i}"),
                runtime_s: r,
                processors: p,
            })
            .collect();
        let edges = (1..runtimes.len())
            .map(|i| (format!("t{}", i - 1), format!("t{i}"), 0.0))
            .collect();
        Workflow::new("chain".into(), tasks, edges).unwrap()
    }

    #[test]
    fn conservative_backfilling_fills_holes_without_delaying_earlier_jobs() {
        let mut site = Profile {
            processors: 4,
            held: Vec::new(),
        };
        assert_eq!(site.place(0, 100, 3), 0);
        assert_eq!(site.place(0, 50, 4), 100, "waits for the 3 processors");
        assert_eq!(site.place(10, 90, 1), 10, "backfills beside the first job");
        assert_eq!(
            site.place(10, 91, 1),
            150,
            "would delay the 4-processor job: after it"
        );
        assert_eq!(site.place(200, 10, 4), 241, "after the last job ends");
    }

    #[test]
    fn best_effort_waits_behind_background_and_an_empty_site_runs_the_critical_path() {
        let wf = chain(&[(100, 2), (50, 4)]);
        let cfg = SiteConfig {
            processors: 4,
            t0_s: 1000,
            ..SiteConfig::default()
        };
        assert_eq!(best_effort(&cfg, &[], &wf), 150);
        // A background job arriving while t0 runs takes the site when t1 is submitted.
        let jobs = [Job {
            arrival_s: 1050,
            runtime_s: 500,
            cpus: 3,
        }];
        // It starts when t0 ends (1100) and holds 3 processors to 1600; t1 runs 1600..1650.
        assert_eq!(best_effort(&cfg, &jobs, &wf), 650);
        // Arriving after t1's submission it goes after t1 instead.
        let jobs = [Job {
            arrival_s: 1101,
            runtime_s: 500,
            cpus: 3,
        }];
        assert_eq!(best_effort(&cfg, &jobs, &wf), 150);
    }

    #[test]
    fn provisioning_plans_on_the_holes_and_beats_best_effort_here() {
        // One long background job holds 3 of 4 processors from before t0; another arrives
        // just after t0 and would delay every later best-effort task.
        let wf = chain(&[(100, 1), (100, 1), (100, 1)]);
        let cfg = SiteConfig {
            processors: 4,
            t0_s: 1000,
            horizon_s: 10_000,
            ..SiteConfig::default()
        };
        let jobs = [
            Job {
                arrival_s: 0,
                runtime_s: 5000,
                cpus: 3,
            },
            Job {
                arrival_s: 1001,
                runtime_s: 4000,
                cpus: 1,
            },
        ];
        let be = best_effort(&cfg, &jobs, &wf);
        assert_eq!(be, 100 + (5000 - 1100) + 200, "t1 waits behind the second job");
        let offer = offer_at_t0(&cfg, &jobs).unwrap();
        assert_eq!(
            (offer.slots[0].start_s, offer.slots[0].processors),
            (1000, 1),
            "the hole beside the first job"
        );
        // Bands: the free processor stays free to the horizon; three more from 5000.
        let bands: Vec<(i64, i64, u32)> = offer
            .slots
            .iter()
            .map(|s| (s.start_s, s.end_s, s.processors))
            .collect();
        assert_eq!(bands, [(1000, 11_000, 1), (5000, 11_000, 3)]);
        let p = Problem::new(wf, offer);
        let cfg = MogaConfig {
            divisible: true,
            ..MogaConfig::default()
        };
        let out = moga(&p, &cfg);
        let fastest = &out.front[choose(&out.front, 0.0).unwrap()];
        assert_eq!(fastest.makespan_s, 300);
        // Charged for one processor over the 300 s the chain uses of the slot.
        assert!((fastest.cost - 300.0 / 3600.0).abs() < 1e-9, "{}", fastest.cost);
        assert!(p.cost(&fastest.slots) > fastest.cost);
    }

    #[test]
    fn background_offers_about_the_utilization_asked() {
        let cfg = SiteConfig::default();
        let jobs = background(&cfg);
        let u = offered_utilization(&cfg, &jobs);
        assert!((0.7..1.0).contains(&u), "{u}");
        assert!(jobs.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
    }
}
