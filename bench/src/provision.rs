//! `gma bench provision`: the paper's synthetic-slot MOGA experiment (Singh, Kesselman,
//! Deelman §3; docs/provisioning.md): per seed, the slots offered, the plans MOGA evaluated,
//! how many were feasible and the size of its Pareto set (the paper: 124 slots, 1,742 feasible
//! plans, 40 Pareto-optimal), and for the first seed the plan chosen across α (the paper's
//! Fig. 2). Part (b), provisioned against best-effort execution: [`exec`].

pub mod exec;

use std::time::Instant;

use gma_broker::provision::moga::{choose, moga, MogaConfig};
use gma_broker::provision::synthetic::{synthetic, SyntheticConfig};
use serde_json::json;

use crate::Output;

fn num(v: f64) -> serde_json::Value {
    json!((v * 1000.0).round() / 1000.0)
}

/// Which part of the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    A,
    B,
    Both,
}

pub fn provision(
    part: Part,
    utilization: f64,
    seeds: u64,
    population: usize,
    generations: usize,
    output: Output,
) -> anyhow::Result<()> {
    if part != Part::B {
        // The paper's plan (every drawn slot paid for), then ours (unused slots dropped).
        for drop_unused in [false, true] {
            run(seeds, population, generations, drop_unused, output)?;
        }
    }
    if part != Part::A {
        exec::execution(utilization, seeds, population, generations, output)?;
    }
    Ok(())
}

fn run(
    seeds: u64,
    population: usize,
    generations: usize,
    drop_unused: bool,
    output: Output,
) -> anyhow::Result<()> {
    if seeds == 0 || !(2..=10_000).contains(&population) || generations > 10_000 {
        anyhow::bail!("--seeds must be >= 1, --population within 2..=10000, --generations at most 10000");
    }
    let mut runs = Vec::new();
    let mut sweep = Vec::new();
    for seed in 1..=seeds {
        let p = synthetic(&SyntheticConfig {
            seed,
            ..SyntheticConfig::default()
        })
        .map_err(|e| anyhow::anyhow!("synthetic instance: {e}"))?;
        let started = Instant::now();
        let out = moga(
            &p,
            &MogaConfig {
                population,
                generations,
                seed,
                drop_unused,
                ..MogaConfig::default()
            },
        );
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if seed == 1 {
            for k in 0..=10 {
                let alpha = f64::from(k) / 10.0;
                if let Some(i) = choose(&out.front, alpha) {
                    let c = &out.front[i];
                    sweep.push((alpha, c.cost, c.makespan_s, c.slots.len()));
                }
            }
        }
        runs.push((
            seed,
            p.slots(),
            out.evaluations,
            out.feasible,
            out.front.len(),
            ms,
        ));
    }
    let n = runs.len() as f64;
    let feasible = runs.iter().map(|r| r.3 as f64).sum::<f64>() / n;
    let pareto = runs.iter().map(|r| r.4 as f64).sum::<f64>() / n;
    match output {
        Output::Json => println!(
            "{}",
            json!({
                "population": population, "generations": generations, "drop_unused": drop_unused,
                "paper": {"slots": 124, "feasible": 1742, "pareto": 40},
                "runs": runs.iter().map(|r| json!({"seed": r.0, "slots": r.1, "evaluations": r.2,
                    "feasible": r.3, "pareto": r.4, "ms": num(r.5)})).collect::<Vec<_>>(),
                "mean_feasible": num(feasible), "mean_pareto": num(pareto),
                "alpha_sweep": sweep.iter().map(|s| json!({"alpha": s.0, "cost_su": num(s.1),
                    "makespan_s": s.2, "slots": s.3})).collect::<Vec<_>>(),
            })
        ),
        Output::Table => {
            println!(
                "synthetic slots (4 sites of 10/20/30/40 processors, Poisson slots to t = 30000 s), 100-task workflow; MOGA population {population}, {generations} generations; {}",
                if drop_unused { "unused slots dropped from plans" } else { "every drawn slot paid for (the paper's plan)" }
            );
            println!(
                "{:>5} {:>6} {:>12} {:>9} {:>7} {:>10}",
                "seed", "slots", "evaluations", "feasible", "pareto", "ms"
            );
            for r in &runs {
                println!(
                    "{:>5} {:>6} {:>12} {:>9} {:>7} {:>10.0}",
                    r.0, r.1, r.2, r.3, r.4, r.5
                );
            }
            println!("mean: {feasible:.0} feasible, {pareto:.1} Pareto-optimal (paper: 124 slots, 1742 feasible, 40 Pareto-optimal)");
            println!("seed 1, plan chosen across alpha (paper Fig. 2):");
            println!(
                "{:>6} {:>10} {:>13} {:>6}",
                "alpha", "cost (SU)", "makespan (s)", "slots"
            );
            for s in &sweep {
                println!("{:>6.1} {:>10.2} {:>13} {:>6}", s.0, s.1, s.2, s.3);
            }
        }
    }
    Ok(())
}
