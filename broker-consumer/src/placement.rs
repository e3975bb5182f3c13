//! Placement quality: a discrete-event simulation of a synthetic workload on heterogeneous
//! hosts, placed by the broker's `ttd` ranking, at random, or round-robin, reporting the mean
//! job completion time (arrival to finish) of each.
//!
//! Hosts have 4, 8 or 16 CPUs and a benchmark score in `[500, 3000]` (reference 1000); each
//! runs its jobs first-come first-served (a job starts when its CPUs are free and every job
//! queued before it has started). Jobs arrive as a Poisson stream and need 1, 2 or 4 CPUs for
//! an exponentially distributed reference time. The broker sees each host's published state at
//! the arrival (total and free CPUs, jobs waiting, benchmark): exactly what `host.load` carries.
//! Random and round-robin only respect capacity (a job goes to a host with enough CPUs).

use std::collections::{BTreeMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::job::Job;
use crate::rank::{rank, Limits, Policy, RankConfig, Resource, Snapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Ttd,
    Random,
    RoundRobin,
}

impl Placement {
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Ttd => "ttd",
            Placement::Random => "random",
            Placement::RoundRobin => "round-robin",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub hosts: usize,
    pub jobs: usize,
    /// Offered load: the mean number of busy CPUs over the total, if jobs ran at reference speed.
    pub utilization: f64,
    pub mean_job_s: f64,
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            hosts: 50,
            jobs: 5_000,
            utilization: 0.7,
            mean_job_s: 600.0,
            seed: 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    pub placement: Placement,
    pub mean_completion_s: f64,
    pub p95_completion_s: f64,
    pub mean_wait_s: f64,
    pub makespan_s: f64,
}

#[derive(Clone)]
struct SimJob {
    arrival: f64,
    cpus: u32,
    reference_s: f64,
}

struct Host {
    cpus: u32,
    score: f64,
    /// End times of running jobs with their CPUs.
    running: Vec<(f64, u32)>,
    /// Queued jobs with their execution time here, first come first served.
    queue: VecDeque<(usize, f64)>,
    /// Everything before this has been simulated.
    clock: f64,
}

/// When each job started and finished.
struct Times {
    start: Vec<f64>,
    finish: Vec<f64>,
}

impl Host {
    fn free(&self) -> u32 {
        self.cpus - self.running.iter().map(|r| r.1).sum::<u32>()
    }

    /// Starts queued jobs, in order, while the first fits.
    fn start_fitting(&mut self, jobs: &[SimJob], times: &mut Times) {
        while let Some(&(j, exec)) = self.queue.front() {
            if jobs[j].cpus > self.free() {
                break;
            }
            self.queue.pop_front();
            times.start[j] = self.clock;
            times.finish[j] = self.clock + exec;
            self.running.push((self.clock + exec, jobs[j].cpus));
        }
    }

    /// Simulates up to time `t` (jobs ending at or before `t` end; the queue moves up).
    fn advance(&mut self, t: f64, jobs: &[SimJob], times: &mut Times) {
        loop {
            self.start_fitting(jobs, times);
            let next = self.running.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
            if next > t || self.running.is_empty() {
                break;
            }
            self.clock = next;
            self.running.retain(|r| r.0 > next);
        }
        if t.is_finite() && t > self.clock {
            self.clock = t;
        }
    }
}

/// The workload and hosts of a seed (identical for every placement).
fn workload(cfg: &SimConfig) -> (Vec<(u32, f64)>, Vec<SimJob>) {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let hosts: Vec<(u32, f64)> = (0..cfg.hosts)
        .map(|_| {
            (
                [4u32, 8, 16][rng.random_range(0..3)],
                rng.random_range(500.0..3000.0),
            )
        })
        .collect();
    let total_cpus: f64 = hosts.iter().map(|h| f64::from(h.0)).sum();
    let mean_cpus = (1.0 + 2.0 + 4.0) / 3.0;
    // Poisson arrivals at the rate that offers `utilization` of the CPUs at reference speed.
    let rate = cfg.utilization * total_cpus / (mean_cpus * cfg.mean_job_s);
    let mut t = 0.0;
    let jobs = (0..cfg.jobs)
        .map(|_| {
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            SimJob {
                arrival: t,
                cpus: [1, 2, 4][rng.random_range(0..3)],
                reference_s: -(1.0 - rng.random::<f64>()).ln() * cfg.mean_job_s,
            }
        })
        .collect();
    (hosts, jobs)
}

/// Runs the workload of `cfg.seed` under `placement`.
pub fn simulate(cfg: &SimConfig, placement: Placement) -> SimResult {
    let (specs, jobs) = workload(cfg);
    let mut hosts: Vec<Host> = specs
        .iter()
        .map(|&(cpus, score)| Host {
            cpus,
            score,
            running: Vec::new(),
            queue: VecDeque::new(),
            clock: 0.0,
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5eed);
    let mut rr = 0usize;
    let mut times = Times {
        start: vec![f64::NAN; jobs.len()],
        finish: vec![f64::NAN; jobs.len()],
    };
    let rank_cfg = RankConfig {
        typical_job_s: cfg.mean_job_s,
        ..RankConfig::default()
    };
    let reference = BTreeMap::from([("specint".to_string(), 1000.0)]);
    for (j, job) in jobs.iter().enumerate() {
        for h in &mut hosts {
            h.advance(job.arrival, &jobs, &mut times);
        }
        let fits: Vec<usize> = (0..hosts.len()).filter(|&i| hosts[i].cpus >= job.cpus).collect();
        let Some(&first_fit) = fits.first() else {
            continue; // no host is big enough (not with the default shapes)
        };
        let chosen = match placement {
            Placement::Random => fits[rng.random_range(0..fits.len())],
            Placement::RoundRobin => {
                let k = fits
                    .iter()
                    .copied()
                    .find(|&k| k >= rr % hosts.len())
                    .unwrap_or(first_fit);
                rr = k + 1;
                k
            }
            Placement::Ttd => {
                let now_ns = (job.arrival * 1e9) as i64;
                let view: Vec<Resource> = hosts
                    .iter()
                    .enumerate()
                    .map(|(i, h)| {
                        let mut r = Resource::unknown(&format!("{i:06}"));
                        r.total_cpus = f64::from(h.cpus);
                        r.free_cpus = f64::from(h.free());
                        r.queue_waiting = h.queue.len() as f64;
                        r.benchmarks = BTreeMap::from([("specint".to_string(), h.score)]);
                        r.updated_ns = now_ns;
                        r
                    })
                    .collect();
                let spec = Job {
                    name: "job".into(),
                    cpus: job.cpus,
                    reference_time_s: job.reference_s.max(1e-3),
                    reference: reference.clone(),
                    ..Job::default()
                };
                let limits = Limits {
                    limit: 1,
                    rejected: false,
                };
                rank(
                    &Snapshot::new(now_ns, view),
                    &spec,
                    Policy::Ttd,
                    &rank_cfg,
                    limits,
                )
                .ok()
                .and_then(|r| r.ranked.first().and_then(|x| x.resource.parse().ok()))
                .unwrap_or(first_fit)
            }
        };
        let h = &mut hosts[chosen];
        h.queue.push_back((j, job.reference_s * 1000.0 / h.score));
        h.start_fitting(&jobs, &mut times);
    }
    for h in &mut hosts {
        h.advance(f64::INFINITY, &jobs, &mut times);
    }
    let done: Vec<usize> = (0..jobs.len()).filter(|&j| times.finish[j].is_finite()).collect();
    let mut completion: Vec<f64> = done.iter().map(|&j| times.finish[j] - jobs[j].arrival).collect();
    let n = done.len().max(1) as f64;
    let mean_wait_s = done
        .iter()
        .map(|&j| times.start[j] - jobs[j].arrival)
        .sum::<f64>()
        / n;
    let mean = completion.iter().sum::<f64>() / n;
    completion.sort_by(f64::total_cmp);
    let p95 = completion
        .get(((completion.len() as f64) * 0.95) as usize)
        .copied()
        .unwrap_or(f64::NAN);
    SimResult {
        placement,
        mean_completion_s: mean,
        p95_completion_s: p95,
        mean_wait_s,
        makespan_s: times
            .finish
            .iter()
            .copied()
            .filter(|f| f.is_finite())
            .fold(0.0, f64::max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_completes_and_the_simulation_is_deterministic() {
        let cfg = SimConfig {
            hosts: 10,
            jobs: 500,
            ..SimConfig::default()
        };
        for p in [Placement::Ttd, Placement::Random, Placement::RoundRobin] {
            let a = simulate(&cfg, p);
            let b = simulate(&cfg, p);
            assert_eq!(a, b);
            assert!(a.mean_completion_s.is_finite() && a.mean_completion_s > 0.0);
            assert!(a.mean_wait_s >= 0.0);
            assert!(a.p95_completion_s >= a.mean_completion_s * 0.5);
        }
    }

    #[test]
    fn a_single_idle_host_runs_jobs_back_to_back() {
        // One 4-CPU host at score 1000, jobs far apart: completion = reference time.
        let cfg = SimConfig {
            hosts: 1,
            jobs: 20,
            utilization: 0.001,
            ..SimConfig::default()
        };
        let (specs, jobs) = workload(&cfg);
        let r = simulate(&cfg, Placement::Ttd);
        let expect: f64 = jobs
            .iter()
            .map(|j| j.reference_s * 1000.0 / specs[0].1)
            .sum::<f64>()
            / jobs.len() as f64;
        assert!(
            (r.mean_completion_s - expect).abs() < 1e-6 * expect.max(1.0),
            "{} vs {expect}",
            r.mean_completion_s
        );
        assert!(r.mean_wait_s.abs() < 1e-9);
    }
}
