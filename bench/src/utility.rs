//! `gma bench utility`: Vasques' planned metrics (mean user utility, per user class too,
//! makespan, resource utilization, requests never allocated) for local-only scheduling, TTD
//! forwarding and utility forwarding (Algorithm 1) on the same generated workload. Simulated:
//! the in-process federation world (`gma_federation::sim`) runs the real job manager and the
//! real `route()` with simulated hosts and 20 ms one-way latency between three sites (VOs).
//!
//! The world (docs/federation.md, "Vasques"):
//! - `s0`: 16 hosts × 4 CPUs, 8 GiB, specint 1000 (a small, slow VO);
//! - `s1`: 16 hosts × 4 CPUs, 16 GiB, specint 2000 (fast);
//! - `s2`: 8 hosts × 8 CPUs, half with 64 GiB and half with 16 GiB, specint 1000 (memory).
//!
//! Jobs arrive at each site during the same window (`--hours`) as a Poisson stream of the
//! offered load given per site (fraction of its CPUs at reference speed), 1, 2 or 4 CPUs,
//! exponential reference run time (mean 1 h, at least 1 min),
//! the user class uniform over the four, and one of two requirement sets (equal odds), each an
//! `and` of three step functions ([design]: the paper gives no curves):
//! - memory-hungry: memory ≥ 32 GiB → 1, ≥ 16 GiB → 0.5, else 0.2; specint: any → 1;
//! - speed-hungry: memory ≥ 8 GiB → 1, else 0.3; specint ≥ 2000 → 1, else 0.4;
//! - both: completion within 1.5 × the reference time → 1, 3 × → 0.6, 10 × → 0.3, else 0.1.
//!
//! A job's **achieved utility** is its class's combination of those step functions on the host
//! it ran on, with its actual completion time (submit → finish, forwarding and waiting
//! included); a job not finished by the end of the run (an admin's job that no resource ever
//! satisfies fully waits forever under the utility policy) counts 0 and as not allocated.
//! **Makespan**: last finish − first submit. **Utilization**: busy CPU-seconds / (all CPUs ×
//! makespan) (Vasques' Appendix A eq. 4 over CPUs).

use std::collections::{BTreeMap, HashMap};

use anyhow::bail;
use gma_broker::utility::{combine, Interval, Operator, Requirement, UserClass};
use gma_broker::{Job, Resource};
use gma_federation::route::{Forwarding, RoutePolicy};
use gma_federation::sim::{sim_params, SiteSpec, World, T0};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::Output;

const CLASSES: [UserClass; 4] = [
    UserClass::Guest,
    UserClass::OtherVo,
    UserClass::Local,
    UserClass::Admin,
];
const SITES: [&str; 3] = ["s0", "s1", "s2"];

/// The three ways of scheduling compared.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Local,
    Ttd,
    Utility,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Local => "local-only",
            Mode::Ttd => "ttd forwarding",
            Mode::Utility => "utility forwarding",
        }
    }
}

/// (hosts, CPUs per host) of each site, and each host's (memory MiB, specint).
fn host_of(site: usize, i: usize) -> (f64, f64) {
    match site {
        0 => (8192.0, 1000.0),
        1 => (16384.0, 2000.0),
        _ if i.is_multiple_of(2) => (65536.0, 1000.0),
        _ => (16384.0, 1000.0),
    }
}

fn shape_of(site: usize) -> (u32, u32) {
    if site == 2 {
        (8, 8)
    } else {
        (16, 4)
    }
}

fn steps(attribute: &str, weight: f64, steps: &[(Option<f64>, Option<f64>, f64)]) -> Requirement {
    Requirement {
        attribute: attribute.into(),
        intervals: steps
            .iter()
            .map(|&(min, max, utility)| Interval { min, max, utility })
            .collect(),
        weight,
    }
}

/// The job's requirements (see the module doc).
fn requirements(memory_hungry: bool, reference_s: f64) -> Vec<Requirement> {
    let (mem, speed) = if memory_hungry {
        (
            steps(
                "memory_mb",
                0.4,
                &[
                    (Some(32768.0), None, 1.0),
                    (Some(16384.0), None, 0.5),
                    (None, None, 0.2),
                ],
            ),
            steps("bench_specint", 0.2, &[(None, None, 1.0)]),
        )
    } else {
        (
            steps("memory_mb", 0.2, &[(Some(8192.0), None, 1.0), (None, None, 0.3)]),
            steps(
                "bench_specint",
                0.4,
                &[(Some(2000.0), None, 1.0), (None, None, 0.4)],
            ),
        )
    };
    let r = reference_s;
    let done = steps(
        "completion_s",
        0.4,
        &[
            (None, Some(1.5 * r), 1.0),
            (None, Some(3.0 * r), 0.6),
            (None, Some(10.0 * r), 0.3),
            (None, None, 0.1),
        ],
    );
    vec![mem, speed, done]
}

/// The figures of one run.
#[derive(Debug, Clone, Default)]
struct Run {
    submitted: usize,
    jobs: usize,
    finished: usize,
    forwarded: usize,
    mean_utility: f64,
    class_utility: [f64; 4],
    makespan_h: f64,
    utilization: f64,
    mean_completion_s: f64,
}

fn run(loads: &[f64; 3], hours: f64, seed: u64, mode: Mode) -> Run {
    let policy = RoutePolicy {
        policy: if mode == Mode::Utility {
            Forwarding::Utility
        } else {
            Forwarding::Ttd
        },
        ..RoutePolicy::default()
    };
    let specs = (0..3)
        .map(|s| SiteSpec {
            params: sim_params(SITES[s], &policy),
            hosts: shape_of(s).0,
            cpus_per_host: shape_of(s).1,
        })
        .collect();
    let links: Vec<(&str, &str)> = if mode == Mode::Local {
        Vec::new()
    } else {
        vec![("s0", "s1"), ("s0", "s2"), ("s1", "s2")]
    };
    let mut w = World::new(specs, &links);
    w.latency_ns = 20_000_000;
    let mut attrs: HashMap<String, (f64, f64)> = HashMap::new();
    for (s, site) in SITES.iter().enumerate() {
        w.reshape_hosts(site, |i, h: &mut Resource| {
            let (mem, spec) = host_of(s, i);
            h.memory_mb = mem;
            h.benchmarks.insert("specint".into(), spec);
        });
        for i in 0..shape_of(s).0 as usize {
            attrs.insert(format!("{site}-h{i:03}"), host_of(s, i));
        }
    }
    // name -> (class, requirements, reference time, CPUs)
    let mut jobs: HashMap<String, (UserClass, Vec<Requirement>, u32)> = HashMap::new();
    let shapes = [1u32, 2, 4];
    let mean_cpus = 7.0 / 3.0;
    let mean_exec_s = 3600.0;
    let mut end = T0;
    let window_end = T0 as f64 + hours * 3600e9;
    let mut submitted = 0;
    for (s, load) in loads.iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(7_919).wrapping_add(s as u64));
        let (h, c) = shape_of(s);
        let rate = load * f64::from(h * c) / (mean_cpus * mean_exec_s);
        let mut t = T0 as f64;
        for k in 0.. {
            t += -rng.random_range(f64::EPSILON..1.0f64).ln() / rate * 1e9;
            if t > window_end {
                break;
            }
            submitted += 1;
            let cpus = shapes[rng.random_range(0..shapes.len())];
            let reference_s = (-rng.random_range(f64::EPSILON..1.0f64).ln() * mean_exec_s).max(60.0);
            let class = CLASSES[rng.random_range(0..CLASSES.len())];
            let reqs = requirements(rng.random_bool(0.5), reference_s);
            let name = format!("{}-{k}", SITES[s]);
            let mut job = Job {
                name: name.clone(),
                cpus,
                reference_time_s: reference_s,
                user_class: class,
                utility_operator: Operator::And,
                utility: reqs.clone(),
                ..Job::default()
            };
            job.reference.insert("specint".into(), 1000.0);
            jobs.insert(name, (class, reqs, cpus));
            w.submit_at(t as i64, SITES[s], job);
            end = end.max(t as i64);
        }
    }
    // Until every job is done, or 20 × the arrival span (jobs left then never run).
    let horizon = end + 20 * (end - T0);
    let mut t = T0;
    loop {
        t += 3_600_000_000_000;
        w.run_until(t);
        let idle = SITES
            .iter()
            .all(|n| w.site(n).counts().0 == 0 && w.site(n).counts().1 == 0);
        if (t > end && idle) || t > horizon {
            break;
        }
    }
    let mut out = Run {
        submitted,
        ..Run::default()
    };
    let (mut busy, mut last, mut util_sum, mut completion_sum) = (0.0, T0, 0.0, 0.0);
    let mut per_class = [(0.0f64, 0usize); 4];
    for evs in w.by_job().values() {
        let Some(name) = evs.first().map(|e| e.name.clone()) else {
            continue;
        };
        let Some((class, reqs, cpus)) = jobs.get(&name) else {
            continue;
        };
        out.jobs += 1;
        out.forwarded += usize::from(evs.iter().any(|e| e.state == "forwarded"));
        let at = |state: &str| {
            evs.iter()
                .find(|e| e.state == state && e.site == e.current_site)
                .map(|e| (e.timestamp_ns, e.host.clone()))
        };
        let submitted = evs
            .iter()
            .find(|e| e.state == "submitted")
            .map(|e| e.timestamp_ns);
        let u = match (submitted, at("started"), at("finished")) {
            (Some(sub), Some((st, host)), Some((fin, _))) => {
                out.finished += 1;
                busy += f64::from(*cpus) * (fin - st) as f64 / 1e9;
                last = last.max(fin);
                let completion = (fin - sub) as f64 / 1e9;
                completion_sum += completion;
                let (mem, spec) = attrs.get(&host).copied().unwrap_or((f64::NAN, f64::NAN));
                let partials: Vec<f64> = reqs
                    .iter()
                    .map(|r| {
                        r.partial(match r.attribute.as_str() {
                            "memory_mb" => mem,
                            "bench_specint" => spec,
                            _ => completion,
                        })
                    })
                    .collect();
                let weights: Vec<f64> = reqs.iter().map(|r| r.weight).collect();
                combine(*class, Operator::And, &partials, &weights)
            }
            _ => 0.0,
        };
        util_sum += u;
        let k = CLASSES.iter().position(|c| c == class).unwrap_or(0);
        per_class[k].0 += u;
        per_class[k].1 += 1;
    }
    let cpus: f64 = (0..3).map(|s| f64::from(shape_of(s).0 * shape_of(s).1)).sum();
    let makespan_s = (last - T0) as f64 / 1e9;
    out.mean_utility = util_sum / out.jobs.max(1) as f64;
    for (k, (sum, n)) in per_class.iter().enumerate() {
        out.class_utility[k] = sum / (*n).max(1) as f64;
    }
    out.makespan_h = makespan_s / 3600.0;
    out.utilization = if makespan_s > 0.0 {
        busy / (cpus * makespan_s)
    } else {
        0.0
    };
    out.mean_completion_s = completion_sum / out.finished.max(1) as f64;
    out
}

/// Mean and sample standard deviation.
fn spread(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n.max(1.0);
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub fn utility(hours: f64, seeds: u64, loads: Vec<f64>, output: Output) -> anyhow::Result<()> {
    if seeds == 0 || !(hours.is_finite() && hours > 0.0 && hours <= 24.0 * 30.0) {
        bail!("--seeds must be >= 1 and --hours within (0, 720]");
    }
    let Ok(loads) = <[f64; 3]>::try_from(loads) else {
        bail!("--loads: give three offered loads, one per site (s0,s1,s2)");
    };
    if loads.iter().any(|l| !(l.is_finite() && *l > 0.0 && *l <= 2.0)) {
        bail!("--loads: each within (0, 2]");
    }
    let started = std::time::Instant::now();
    let mut rows = Vec::new();
    for mode in [Mode::Local, Mode::Ttd, Mode::Utility] {
        let runs: Vec<Run> = (1..=seeds).map(|seed| run(&loads, hours, seed, mode)).collect();
        let col = |f: fn(&Run) -> f64| spread(&runs.iter().map(f).collect::<Vec<_>>());
        let classes: BTreeMap<&str, (f64, f64)> = CLASSES
            .iter()
            .enumerate()
            .map(|(k, c)| {
                (
                    c.as_str(),
                    spread(&runs.iter().map(|r| r.class_utility[k]).collect::<Vec<_>>()),
                )
            })
            .collect();
        rows.push((
            mode,
            col(|r| r.mean_utility),
            classes,
            col(|r| r.makespan_h),
            col(|r| r.utilization),
            col(|r| r.mean_completion_s),
            col(|r| r.forwarded as f64 / r.jobs.max(1) as f64 * 100.0),
            col(|r| r.submitted.saturating_sub(r.finished) as f64),
            runs.iter().map(|r| r.submitted).sum::<usize>(),
        ));
    }
    let wall = started.elapsed().as_secs_f64();
    let per_seed = rows.first().map_or(0, |r| r.8) / seeds as usize;
    match output {
        Output::Json => {
            let modes: Vec<_> = rows
                .iter()
                .map(|(m, u, cl, mk, ut, comp, fwd, lost, n)| {
                    json!({
                        "mode": m.name(),
                        "mean_utility": {"mean": r3(u.0), "sd": r3(u.1)},
                        "class_utility": cl.iter().map(|(k, v)| (k.to_string(), json!({"mean": r3(v.0), "sd": r3(v.1)}))).collect::<serde_json::Map<_, _>>(),
                        "makespan_h": {"mean": r3(mk.0), "sd": r3(mk.1)},
                        "utilization": {"mean": r3(ut.0), "sd": r3(ut.1)},
                        "mean_completion_s": {"mean": comp.0.round(), "sd": comp.1.round()},
                        "forwarded_pct": {"mean": r3(fwd.0), "sd": r3(fwd.1)},
                        "not_allocated": {"mean": r3(lost.0), "sd": r3(lost.1)},
                        "jobs": n,
                    })
                })
                .collect();
            println!(
                "{}",
                json!({"bench": "utility", "simulated": true, "loads": loads,
                    "hours": hours, "seeds": seeds, "modes": modes, "wall_s": r3(wall)})
            );
        }
        Output::Table => {
            println!(
                "simulated: 3 VOs (s0 64 CPUs slow 8 GiB; s1 64 CPUs fast 16 GiB; s2 64 CPUs, half 64 GiB), offered loads {loads:?}, arrivals during {hours} h ({} jobs per seed), {seeds} seeds (mean ± sd over seeds; {wall:.1} s wall)",
                per_seed
            );
            println!(
                "{:<19} {:>13} {:>13} {:>13} {:>13} {:>13} {:>12} {:>12} {:>11} {:>9} {:>10}",
                "mode",
                "utility",
                "guest",
                "other_vo",
                "local",
                "admin",
                "makespan_h",
                "utilization",
                "completion",
                "fwd %",
                "unalloc."
            );
            for (m, u, cl, mk, ut, comp, fwd, lost, _) in &rows {
                let pm = |v: &(f64, f64)| format!("{:.3}±{:.3}", v.0, v.1);
                println!(
                    "{:<19} {:>13} {:>13} {:>13} {:>13} {:>13} {:>12} {:>12} {:>11} {:>9} {:>10}",
                    m.name(),
                    pm(u),
                    pm(&cl["guest"]),
                    pm(&cl["other_vo"]),
                    pm(&cl["local"]),
                    pm(&cl["admin"]),
                    format!("{:.1}±{:.1}", mk.0, mk.1),
                    pm(ut),
                    format!("{:.0}±{:.0}", comp.0, comp.1),
                    format!("{:.1}", fwd.0),
                    format!("{:.1}", lost.0),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_accounts_for_every_job_in_every_mode() {
        for mode in [Mode::Local, Mode::Ttd, Mode::Utility] {
            let r = run(&[0.9, 0.4, 0.3], 3.0, 1, mode);
            assert!(r.submitted > 20, "{mode:?} {r:?}");
            assert_eq!(r.jobs, r.submitted, "{mode:?}: every job has events");
            assert!(r.finished <= r.jobs);
            assert!((0.0..=1.0).contains(&r.mean_utility), "{mode:?} {r:?}");
            assert!(r.utilization > 0.0 && r.utilization <= 1.0, "{mode:?} {r:?}");
            if mode == Mode::Local {
                assert_eq!(r.forwarded, 0);
                assert_eq!(r.finished, r.jobs, "local-only runs every job");
            }
        }
    }
}
