//! `gma bench provision` part (b): provisioned against best-effort execution of the shipped
//! Montage-shaped workflows on a batch site with background load, across α (Singh, Kesselman,
//! Deelman §5–6, Figs. 5–9; the model: `gma_broker::provision::execution`). Per workflow and
//! α: the makespan and the allocation cost over the seeds (mean and standard deviation), next
//! to best effort's.

use gma_broker::provision::execution::{trial, SiteConfig, Trial};
use gma_broker::provision::moga::MogaConfig;
use gma_broker::provision::Workflow;
use serde_json::json;

use super::num;
use crate::Output;

const ALPHAS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];

/// The shipped workflows compared (montage-100 plans in tens of seconds per run: left out).
const WORKFLOWS: [(&str, &str); 2] = [
    (
        "montage-4",
        include_str!("../../../examples/workflows/montage-4.toml"),
    ),
    (
        "montage-25",
        include_str!("../../../examples/workflows/montage-25.toml"),
    ),
];

/// Mean and sample standard deviation.
fn spread(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// One α over the seeds.
struct AlphaRow {
    alpha: f64,
    runs: usize,
    makespan: (f64, f64),
    cost: (f64, f64),
    /// The same plans with their slots bought whole.
    whole: (f64, f64),
    /// Seeds where the provisioned makespan is below best effort's.
    faster: usize,
}

fn rows(trials: &[Trial]) -> Vec<AlphaRow> {
    ALPHAS
        .iter()
        .map(|&alpha| {
            let mut ms = Vec::new();
            let mut cost = Vec::new();
            let mut whole = Vec::new();
            let mut faster = 0;
            for t in trials {
                if let Some(p) = t.provisioned.iter().find(|p| p.alpha == alpha) {
                    ms.push(p.makespan_s as f64);
                    cost.push(p.cost_su);
                    whole.push(p.whole_su);
                    faster += usize::from(p.makespan_s < t.best_effort_s);
                }
            }
            AlphaRow {
                alpha,
                runs: ms.len(),
                makespan: spread(&ms),
                cost: spread(&cost),
                whole: spread(&whole),
                faster,
            }
        })
        .collect()
}

pub fn execution(
    utilization: f64,
    seeds: u64,
    population: usize,
    generations: usize,
    output: Output,
) -> anyhow::Result<()> {
    if !(0.0..1.0).contains(&utilization)
        || seeds == 0
        || !(2..=10_000).contains(&population)
        || generations > 10_000
    {
        anyhow::bail!(
            "--utilization must be within 0..1, --seeds >= 1, --population within 2..=10000, --generations at most 10000"
        );
    }
    for (name, text) in WORKFLOWS {
        let wf = Workflow::from_toml(text).map_err(|e| anyhow::anyhow!("shipped workflow {name}: {e}"))?;
        let work_su = wf.work_s() as f64 / 3600.0;
        let mut trials = Vec::new();
        let started = std::time::Instant::now();
        for seed in 1..=seeds {
            let cfg = SiteConfig {
                utilization,
                seed,
                ..SiteConfig::default()
            };
            let moga_cfg = MogaConfig {
                population,
                generations,
                seed,
                divisible: true,
                ..MogaConfig::default()
            };
            trials.push(
                trial(&cfg, &wf, &moga_cfg, &ALPHAS)
                    .map_err(|e| anyhow::anyhow!("{name}, seed {seed}: {e}"))?,
            );
        }
        let secs = started.elapsed().as_secs_f64();
        let be: Vec<f64> = trials.iter().map(|t| t.best_effort_s as f64).collect();
        let be = spread(&be);
        let table = rows(&trials);
        let site = SiteConfig::default();
        match output {
            Output::Json => println!(
                "{}",
                json!({
                    "part": "b", "workflow": name, "tasks": wf.tasks.len(),
                    "site": {"processors": site.processors, "utilization": utilization,
                        "mean_job_s": site.mean_job_s, "max_job_cpus": site.max_job_cpus,
                        "horizon_s": site.horizon_s, "slots": "bands", "charge": "divisible"},
                    "population": population, "generations": generations, "seeds": seeds,
                    "best_effort": {"makespan_mean_s": num(be.0), "makespan_sd_s": num(be.1), "cost_su": num(work_su)},
                    "provisioned": table.iter().map(|r| json!({
                        "alpha": r.alpha, "runs": r.runs,
                        "makespan_mean_s": num(r.makespan.0), "makespan_sd_s": num(r.makespan.1),
                        "cost_mean_su": num(r.cost.0), "cost_sd_su": num(r.cost.1),
                        "whole_mean_su": num(r.whole.0), "whole_sd_su": num(r.whole.1),
                        "faster_than_best_effort": r.faster,
                    })).collect::<Vec<_>>(),
                    "trials": trials.iter().map(|t| json!({
                        "seed": t.seed, "background_jobs": t.background_jobs,
                        "offered_utilization": num(t.offered_utilization), "slots": t.slots_offered,
                        "pareto": t.pareto, "best_effort_s": t.best_effort_s,
                        "provisioned_s": t.provisioned.iter().map(|p| p.makespan_s).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                    "seconds": num(secs),
                })
            ),
            Output::Table => {
                println!(
                    "{name} ({} tasks) on a {}-processor site, conservative backfilling, background utilization {utilization} (jobs 1..={} processors, mean {} s); slots: free bands over {} h, charged as divisible; {seeds} seeds; MOGA population {population}, {generations} generations; {secs:.1} s",
                    wf.tasks.len(),
                    site.processors,
                    site.max_job_cpus,
                    site.mean_job_s,
                    site.horizon_s / 3600
                );
                println!(
                    "best effort: makespan {:.0} ± {:.0} s, cost {work_su:.3} SU (the work)",
                    be.0, be.1
                );
                println!(
                    "{:>6} {:>20} {:>22} {:>22} {:>10}",
                    "alpha", "makespan (s)", "cost (SU)", "slots whole (SU)", "< best eff"
                );
                for r in &table {
                    println!(
                        "{:>6.2} {:>11.0} ± {:>6.0} {:>13.3} ± {:>6.3} {:>13.3} ± {:>6.3} {:>6}/{}",
                        r.alpha,
                        r.makespan.0,
                        r.makespan.1,
                        r.cost.0,
                        r.cost.1,
                        r.whole.0,
                        r.whole.1,
                        r.faster,
                        r.runs
                    );
                }
                for t in &trials {
                    println!(
                        "  seed {}: {} background jobs (utilization offered {:.2}), {} slots, Pareto set {}, best effort {} s, provisioned {:?} s",
                        t.seed,
                        t.background_jobs,
                        t.offered_utilization,
                        t.slots_offered,
                        t.pareto,
                        t.best_effort_s,
                        t.provisioned.iter().map(|p| p.makespan_s).collect::<Vec<_>>()
                    );
                }
            }
        }
    }
    Ok(())
}
