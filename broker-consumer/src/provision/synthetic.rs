//! The synthetic set-up of the paper's MOGA experiment (§3): four sites of 10, 20, 30 and 40
//! processors, each offering slots as a Poisson process (mean slot length 1000 s, mean
//! inter-arrival 1000 s, the first at 0, starts up to t = 30000 s), processors uniform in
//! 1..=the site's, price 1 and no fee; a 100-task workflow with mean runtime 100 s and mean
//! transfer time of the same order. The paper's task-graph generator is not described: ours
//! is layered (10 levels of 10 tasks, each task with 1–3 parents in the level above,
//! one processor each, runtimes uniform in 1..=199 s, transfers uniform in 0..=200 s between
//! sites).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::format::{FormatError, Offer, Slot, Task, Workflow};
use super::heft::Problem;

#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticConfig {
    pub sites: Vec<u32>,
    pub mean_slot_s: f64,
    pub mean_gap_s: f64,
    pub until_s: i64,
    pub levels: usize,
    pub per_level: usize,
    pub mean_runtime_s: i64,
    pub mean_transfer_s: i64,
    pub seed: u64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            sites: vec![10, 20, 30, 40],
            mean_slot_s: 1000.0,
            mean_gap_s: 1000.0,
            until_s: 30_000,
            levels: 10,
            per_level: 10,
            mean_runtime_s: 100,
            mean_transfer_s: 100,
            seed: 1,
        }
    }
}

fn exp(rng: &mut ChaCha8Rng, mean: f64) -> i64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    ((-u.ln() * mean).round() as i64).max(1)
}

/// The instance for `cfg` (deterministic per seed); an error only for a config that yields
/// no tasks or no slots.
pub fn synthetic(cfg: &SyntheticConfig) -> Result<Problem, FormatError> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut slots = Vec::new();
    for (i, &procs) in cfg.sites.iter().enumerate() {
        let mut t = 0;
        let mut k = 0;
        while t <= cfg.until_s && slots.len() < super::format::MAX_SLOTS {
            slots.push(Slot {
                id: format!("site{i}-{k}"),
                resource: format!("site{i}"),
                start_s: t,
                end_s: t + exp(&mut rng, cfg.mean_slot_s),
                processors: rng.random_range(1..=procs.max(1)),
                price: 1.0,
                fee: 0.0,
            });
            t += exp(&mut rng, cfg.mean_gap_s);
            k += 1;
        }
    }
    let name = |l: usize, j: usize| format!("L{l}T{j}");
    let mut tasks = Vec::new();
    let mut edges = Vec::new();
    let max_rt = (2 * cfg.mean_runtime_s - 1).max(1);
    for l in 0..cfg.levels {
        for j in 0..cfg.per_level {
            tasks.push(Task {
                id: name(l, j),
                runtime_s: rng.random_range(1..=max_rt),
                processors: 1,
            });
            if l > 0 && cfg.per_level > 0 {
                let want = rng.random_range(1..=3.min(cfg.per_level));
                let mut parents: Vec<usize> = Vec::new();
                while parents.len() < want {
                    let p = rng.random_range(0..cfg.per_level);
                    if !parents.contains(&p) {
                        parents.push(p);
                    }
                }
                for p in parents {
                    // Bandwidth 1 MB/s: megabytes are seconds.
                    let mb = rng.random_range(0..=2 * cfg.mean_transfer_s.max(0));
                    edges.push((name(l - 1, p), name(l, j), mb as f64));
                }
            }
        }
    }
    let wf = Workflow::new("synthetic".into(), tasks, edges)?;
    let offer = Offer::new(0, 1.0, 0, slots)?;
    Ok(Problem::new(wf, offer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_set_up_has_the_papers_shape() {
        let p = synthetic(&SyntheticConfig::default()).unwrap();
        // About 30 slots per site (the paper: 124 in all).
        assert!((90..=160).contains(&p.slots()), "{}", p.slots());
        assert_eq!(p.workflow.tasks.len(), 100);
        let mean = p.workflow.tasks.iter().map(|t| t.runtime_s).sum::<i64>() as f64 / 100.0;
        assert!((70.0..=130.0).contains(&mean), "{mean}");
        assert_eq!(p.resources.len(), 4);
        assert!(p
            .offer
            .slots
            .iter()
            .all(|s| s.start_s <= 30_000 && s.price == 1.0));
        assert_eq!(synthetic(&SyntheticConfig::default()).unwrap().offer, p.offer);
        let none = SyntheticConfig {
            levels: 0,
            ..SyntheticConfig::default()
        };
        assert_eq!(synthetic(&none).unwrap_err(), FormatError::NoTasks);
    }
}
