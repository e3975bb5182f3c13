//! Broker benchmarks (figures, never thresholds):
//!
//! - `broker`: decisions/s and decision latency through the gRPC `Broker.Select` API with
//!   `--resources` live simulated hosts (a directory, a producer of simulated hosts and the
//!   broker, all real servers on loopback in this process; clients in this process too).
//! - `coalloc`: the paper's randomized coallocation experiment (§5.2.2) against a `gma simres`
//!   resource manager over gRPC: success rates, iterations and reservation operations next to
//!   Tables I/II.
//! - `placement`: mean job completion time of `ttd` against random and round-robin placement
//!   in a discrete-event simulation of heterogeneous hosts.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_broker::coalloc::ModifyMode;
use gma_broker::placement::{simulate, Placement, SimConfig};
use gma_broker::remote::RemoteReserver;
use gma_broker::replay::{
    machine_names, run_replay, trace_trial as trace_trial_of, ReplayConfig, Scenario, Summary, Trial,
    TrialResult,
};
use gma_broker::service::BrokerConfig;
use gma_broker::simres::{ResourceSpec, SimresConfig};
use gma_core::time::now_ns;
use gma_producer::ProducerConfig;
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use serde_json::json;

use crate::args::{CoallocArgs, CoallocScenario, Output};
use crate::report::{cores, proc_usage};

type Stop = tokio::sync::watch::Receiver<bool>;

/// An endpoint whose per-identity rate limit is lifted: the default (5,000 requests/s) would be
/// the figure the benchmark measures.
fn unthrottled() -> gma_core::endpoint::Endpoint {
    gma_core::endpoint::Endpoint {
        limits: gma_core::guard::Limits {
            requests_per_s: 1e9,
            burst: 1e9,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn stopper(rx: &Stop) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|v| *v).await;
    }
}

/// The paper's figures for the coallocation experiment (Tables I and II).
const PAPER_HOMOGENEOUS: (f64, f64, f64) = (86.0, 3.02, 7.0);
const PAPER_HETEROGENEOUS: (f64, f64, f64) = (66.3, 1.97, 4.0);

pub async fn broker(resources: u32, duration: u64, clients: usize, output: Output) -> anyhow::Result<()> {
    if resources == 0 || clients == 0 {
        bail!("--resources and --clients must be at least 1");
    }
    let tmp = tempfile::Builder::new().prefix("gma-bench-broker-").tempdir()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let dir_l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let dir_addr = dir_l.local_addr()?.to_string();
    let dir_task = tokio::spawn(gma_directory::run(
        gma_directory::DirectoryConfig::new(tmp.path().join("dir")),
        dir_l,
        stopper(&stop_rx),
    ));
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        format!(
            "[[generate]]\ncount = {resources}\nprefix = \"h\"\nseed = 3\ncpus = 16\nmemory_mb = 65536\n\
             benchmarks = {{ specint = 1500, specfp = 1400 }}\n"
        ),
    )?;
    let prod_l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let producer = gma_producer::Producer::new(ProducerConfig {
        registration: gma_core::registration::Registration::new(Some(dir_addr.clone())),
        host_sensors: false,
        source: Some("bench-sim".into()),
        simulate: Some(sim),
        buffer_events: 200_000,
        ..ProducerConfig::default()
    })
    .map_err(|e| anyhow!("{e}"))?;
    let prod_task = tokio::spawn(producer.run(prod_l, stopper(&stop_rx)));
    let broker_l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let broker_addr = broker_l.local_addr()?.to_string();
    let broker_task = tokio::spawn(gma_broker::service::run(
        BrokerConfig {
            registration: gma_core::registration::Registration::new(Some(dir_addr.clone())),
            endpoint: unthrottled(),
            ..BrokerConfig::default()
        },
        broker_l,
        stopper(&stop_rx),
    ));
    // Wait until the broker's view holds every host.
    let mut c = client(&broker_addr).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = c
            .view(pb::BrokerViewRequest {})
            .await
            .map(|r| r.into_inner().resources.iter().filter(|r| !r.stale).count())
            .unwrap_or(0);
        if n >= resources as usize {
            break;
        }
        if Instant::now() > deadline {
            bail!("the broker saw {n} of {resources} hosts after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let job = gma_broker::job::Job {
        name: "bench".into(),
        cpus: 4,
        memory_mb: 4096.0,
        reference_time_s: 3600.0,
        reference: [("specint".to_string(), 1000.0)].into_iter().collect(),
        stage_in_s: Some(30.0),
        ..Default::default()
    }
    .to_proto();
    let me = std::process::id().to_string();
    let (cpu0, _) = proc_usage(&me)?;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(duration.max(1));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let addr = broker_addr.clone();
        let job = job.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = client(&addr).await?;
            let mut lat = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut server = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut n = 0u64;
            while Instant::now() < end {
                let s = Instant::now();
                let r = c
                    .select(pb::SelectRequest {
                        job: Some(job.clone()),
                        policy: pb::BrokerPolicy::Ttd as i32,
                        limit: 10,
                        include_rejected: false,
                    })
                    .await
                    .map_err(|e| anyhow!("select: {e}"))?
                    .into_inner();
                lat.record(s.elapsed().as_micros().max(1) as u64)?;
                server.record(r.decide_us.max(1.0) as u64)?;
                if r.ranked.is_empty() {
                    bail!("an empty ranking: the benchmark job fits every host");
                }
                n += 1;
            }
            anyhow::Ok((n, lat, server))
        }));
    }
    let mut total = 0u64;
    let mut lat = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut server = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        let (n, l, s) = t.await??;
        total += n;
        lat.add(&l)?;
        server.add(&s)?;
    }
    let wall = t0.elapsed().as_secs_f64();
    let (cpu1, rss) = proc_usage(&me)?;
    let cpu = cpu1 - cpu0;
    let _ = stop_tx.send(true);
    for t in [prod_task] {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), broker_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), dir_task).await;
    let rate = total as f64 / wall;
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    match output {
        Output::Json => crate::report::emit(json!({
            "scenario": "broker", "resources": resources, "clients": clients, "duration_s": wall,
            "decisions": total, "decisions_per_s": rate,
            "cpu_cores_used": cpu / wall, "decisions_per_cpu_s": total as f64 / cpu.max(1e-9),
            "latency_ms": { "p50": ms(&lat, 0.5), "p99": ms(&lat, 0.99), "p999": ms(&lat, 0.999), "max": lat.max() as f64 / 1000.0 },
            "rank_us": { "p50": server.value_at_quantile(0.5), "p99": server.value_at_quantile(0.99) },
            "rss_mib": rss, "cores": cores(),
            "paper": { "jobs_per_minute": 250, "response_s": 1.0 },
        })),
        Output::Table => {
            println!(
                "broker Select over gRPC, {resources} live resources, {clients} clients, {wall:.1} s ({} cores):",
                cores()
            );
            println!(
                "  {total} decisions: {rate:.0} decisions/s ({:.0} per CPU-second of this process; {:.2} cores used by clients, broker, directory and simulated hosts)",
                total as f64 / cpu.max(1e-9),
                cpu / wall
            );
            println!(
                "  latency (client) p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms",
                ms(&lat, 0.5),
                ms(&lat, 0.99),
                ms(&lat, 0.999),
                lat.max() as f64 / 1000.0
            );
            println!(
                "  ranking inside the broker p50 {} us  p99 {} us;  RSS {rss:.1} MiB",
                server.value_at_quantile(0.5),
                server.value_at_quantile(0.99)
            );
            println!(
                "  paper (Elmroth & Tordsson): \"just over 250 jobs per minute\" (~4.2/s), response \"under one second\" at best"
            );
        }
    }
    Ok(())
}

fn summary_json(s: &Summary) -> serde_json::Value {
    let g = |g: &gma_broker::replay::GroupSummary| {
        let m = |m: &gma_broker::replay::Metric| json!({"avg": m.avg, "min": m.min, "max": m.max});
        json!({
            "count": g.count, "elapsed_ms": m(&g.elapsed_ms), "iterations": m(&g.iterations),
            "creates": m(&g.creates), "failed_creates": m(&g.failed_creates), "modifies": m(&g.modifies),
            "failed_modifies": m(&g.failed_modifies), "lost_originals": m(&g.lost_originals),
            "augmentations": m(&g.augmentations),
            "failed_augmentations": m(&g.failed_augmentations),
        })
    };
    json!({
        "trials": s.trials, "successes": s.successes, "success_rate": s.success_rate,
        "feasible": s.feasible, "feasible_rate": s.feasible_rate, "leaked": s.leaked, "errors": s.errors,
        "taken": s.taken,
        "success": g(&s.success), "failure": g(&s.failure),
    })
}

/// One way of running an experiment: how the coallocator modifies, whether the jobs are
/// flexible, and how often another job takes capacity the coallocator releases.
struct Variant {
    name: &'static str,
    modify: ModifyMode,
    flexible: bool,
    compete: f64,
}

fn variants(compete: f64) -> Vec<Variant> {
    let v = |name, modify, flexible, compete| Variant {
        name,
        modify,
        flexible,
        compete,
    };
    vec![
        v("ours", ModifyMode::Atomic, true, 0.0),
        v("as written", ModifyMode::ReleaseThenCreate, true, 0.0),
        v("ours, competing", ModifyMode::Atomic, true, compete),
        v(
            "as written, competing",
            ModifyMode::ReleaseThenCreate,
            true,
            compete,
        ),
        v("ours, jobs not flexible", ModifyMode::Atomic, false, 0.0),
    ]
}

/// One experiment's runs: (variant, per-trial results, summary, wall time).
type Runs = Vec<(Variant, Vec<TrialResult>, Summary, Duration)>;

/// Trials where `a` succeeded and `b` did not (first 20).
fn only_in(a: &[TrialResult], b: &[TrialResult]) -> Vec<u32> {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.success && !y.success)
        .map(|(x, _)| x.index)
        .take(20)
        .collect()
}

/// The trial's set-up and its trace, times in seconds from the trial's window start.
fn trace_text(name: &str, t: &Trial, r: &TrialResult) -> Vec<String> {
    let mut out = vec![format!(
        "trial {} ({name}): {}; feasible {}",
        t.index,
        if r.success { "success" } else { "failure" },
        r.feasible
    )];
    let bg: Vec<String> = t
        .background
        .iter()
        .map(|(m, s)| format!("{m} [{}, {})", s - t.base_s, s - t.base_s + t.background_s))
        .collect();
    out.push(format!("  background: {}", bg.join(", ")));
    for j in &t.request.jobs {
        out.push(format!(
            "  {}: {} s on {}{}",
            j.name,
            j.duration_s,
            j.candidates.join("|"),
            if j.flexible { "" } else { " (not flexible)" }
        ));
    }
    out.push(format!(
        "  start window [0, {}], epsilon {} s",
        t.request.window_end_s - t.base_s,
        t.request.epsilon_s
    ));
    out.extend(r.trace.iter().map(|l| format!("  {l}")));
    out
}

pub async fn coalloc(args: CoallocArgs) -> anyhow::Result<()> {
    let CoallocArgs {
        trials,
        scenario,
        simres,
        seed,
        compete,
        trace_trial,
        machine_cpus,
        output,
    } = args;
    let scenarios = match scenario {
        CoallocScenario::Homogeneous => vec![Scenario::Homogeneous],
        CoallocScenario::Heterogeneous => vec![Scenario::Heterogeneous],
        CoallocScenario::Both => vec![Scenario::Homogeneous, Scenario::Heterogeneous],
    };
    if machine_cpus == 0 {
        bail!("--machine-cpus must be at least 1");
    }
    if !(0.0..=1.0).contains(&compete) {
        bail!("--compete must be a probability within [0, 1], got {compete}");
    }
    if let Some(n) = trace_trial {
        if n >= trials {
            bail!("--trace-trial {n} is not one of the {trials} trials (0..{trials})");
        }
    }
    let base = ReplayConfig {
        machine_cpus,
        ..ReplayConfig::default()
    };
    let names = machine_names(&base);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (addr, server) = match simres {
        Some(a) => (a, None),
        None => {
            // A simres with the paper's machines (one job each at a time unless --machine-cpus),
            // over real gRPC.
            let cfg = SimresConfig {
                resources: names
                    .iter()
                    .map(|n| ResourceSpec {
                        name: n.clone(),
                        cpus: machine_cpus,
                        memory_mb: 2048.0,
                        arch: "x86_64".into(),
                        background: Vec::new(),
                    })
                    .collect(),
                // The replay is far faster than the default per-identity rate limit.
                endpoint: unthrottled(),
                ..SimresConfig::default()
            };
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let a = l.local_addr()?.to_string();
            let task = tokio::spawn(gma_broker::simres::run(cfg, l, stopper(&stop_rx)));
            (a, Some(task))
        }
    };
    let reserver = RemoteReserver::connect(std::slice::from_ref(&addr))
        .await
        .with_context(|| format!("resource manager {addr}"))?;
    for n in &names {
        if reserver.manager_of(n).is_none() {
            bail!("the resource manager at {addr} does not offer machine {n:?} (the replay needs {names:?}, {machine_cpus} CPU(s) each)");
        }
    }
    // Trials run a day ahead (the manager refuses windows in the past).
    let base0 = now_ns() / 1_000_000_000 + 86_400;
    let mut results: Vec<(Scenario, Runs, Vec<String>)> = Vec::new();
    for scenario in scenarios {
        let mut runs: Runs = Vec::new();
        let mut traces = Vec::new();
        for v in variants(compete) {
            let cfg = ReplayConfig {
                trials,
                seed,
                scenario,
                machine_cpus,
                flexible: v.flexible,
                modify: v.modify,
                compete: v.compete,
                ..ReplayConfig::default()
            };
            let t0 = Instant::now();
            let (res, summary) = run_replay(&cfg, &reserver, base0).await;
            let wall = t0.elapsed();
            if let Some(n) = trace_trial {
                if v.compete > 0.0 || v.name == "ours" {
                    let (t, r) = trace_trial_of(&cfg, &reserver, base0, n)
                        .await
                        .map_err(|e| anyhow!("tracing trial {n}: {e}"))?;
                    traces.extend(trace_text(&format!("{scenario:?}, {}", v.name), &t, &r));
                }
            }
            runs.push((v, res, summary, wall));
        }
        results.push((scenario, runs, traces));
    }
    let _ = stop_tx.send(true);
    if let Some(t) = server {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let paper_of = |sc: Scenario| {
        if sc == Scenario::Homogeneous {
            PAPER_HOMOGENEOUS
        } else {
            PAPER_HETEROGENEOUS
        }
    };
    let differ = |runs: &Runs| {
        (
            only_in(&runs[2].1, &runs[3].1),
            only_in(&runs[3].1, &runs[2].1),
            runs[0]
                .1
                .iter()
                .filter(|r| r.feasible && !r.success)
                .map(|r| r.index)
                .take(20)
                .collect::<Vec<u32>>(),
        )
    };
    match output {
        Output::Json => {
            let v: Vec<serde_json::Value> = results
                .iter()
                .map(|(sc, runs, traces)| {
                    let paper = paper_of(*sc);
                    // The top level is the "ours" run (as before); every run is under "runs".
                    let mut j = summary_json(&runs[0].2);
                    j["scenario"] = json!(format!("{sc:?}").to_lowercase());
                    j["wall_s"] = json!(runs[0].3.as_secs_f64());
                    j["paper"] =
                        json!({"success_pct": paper.0, "iterations_avg": paper.1, "iterations_max": paper.2});
                    j["runs"] = json!(runs
                        .iter()
                        .map(|(v, _, s, wall)| {
                            let mut r = summary_json(s);
                            r["name"] = json!(v.name);
                            r["modify"] = json!(format!("{:?}", v.modify));
                            r["flexible"] = json!(v.flexible);
                            r["compete"] = json!(v.compete);
                            r["wall_s"] = json!(wall.as_secs_f64());
                            r
                        })
                        .collect::<Vec<_>>());
                    let (ours_only, written_only, feasible_failed) = differ(runs);
                    j["differ"] = json!({
                        "competing_ours_only": ours_only,
                        "competing_as_written_only": written_only,
                        "feasible_but_ours_failed": feasible_failed,
                    });
                    j["trace"] = json!(traces);
                    j
                })
                .collect();
            crate::report::emit(
                json!({"scenario": "coalloc", "simres": addr, "compete": compete, "machine_cpus": machine_cpus, "results": v}),
            );
        }
        Output::Table => {
            println!(
                "coallocation replay against gma simres at {addr}, {trials} trials per run (4 one-CPU jobs x 4 machines of {machine_cpus} CPU(s), 4 h window, epsilon 5 min, 1 h jobs, one 20-min background reservation per machine; heterogeneous: the last job can use one machine only; separate draws per experiment):"
            );
            println!();
            println!(
                "{:<14}{:>7}{:>10}{:>8}{:>12}  | other jobs take released capacity (p {compete}):{:>6}{:>12}  | ours, jobs not flexible",
                "experiment", "paper", "feasible", "ours", "as written", "ours", "as written"
            );
            for (sc, runs, _) in &results {
                let pct = |i: usize| 100.0 * runs[i].2.success_rate;
                println!(
                    "{:<14}{:>6.1}%{:>9.1}%{:>7.1}%{:>11.1}%  | {:>47.1}%{:>11.1}%  | {:>6.1}%",
                    format!("{sc:?}").to_lowercase(),
                    paper_of(*sc).0,
                    100.0 * runs[0].2.feasible_rate,
                    pct(0),
                    pct(1),
                    pct(2),
                    pct(3),
                    pct(4)
                );
            }
            println!("(ours: atomic modify; as written: the paper's modify, release then create)");
            for (sc, runs, traces) in &results {
                let paper = paper_of(*sc);
                println!();
                println!(
                    "{sc:?} (paper: success {:.1}%, iterations of successes avg {:.2} max {}):",
                    paper.0, paper.1, paper.2
                );
                for (v, _, s, wall) in runs {
                    println!();
                    println!(
                        "{sc:?}, {} (modify {:?}, flexible {}, compete {}), {:.1} s:",
                        v.name,
                        v.modify,
                        v.flexible,
                        v.compete,
                        wall.as_secs_f64()
                    );
                    print!("{s}");
                }
                let (ours_only, written_only, feasible_failed) = differ(runs);
                println!();
                println!("{sc:?}: trials ours solves and as written does not (competing): {ours_only:?}");
                println!("{sc:?}: trials as written solves and ours does not (competing): {written_only:?}");
                println!("{sc:?}: feasible trials ours does not solve (no competition): {feasible_failed:?}");
                for l in traces {
                    println!("{l}");
                }
            }
        }
    }
    Ok(())
}

pub fn placement(
    hosts: usize,
    jobs: usize,
    utilization: f64,
    seeds: u64,
    output: Output,
) -> anyhow::Result<()> {
    if hosts == 0 || jobs == 0 || seeds == 0 || !(utilization > 0.0 && utilization < 1.5) {
        bail!("--hosts, --jobs and --seeds must be at least 1 and --utilization within (0, 1.5)");
    }
    let mut rows = Vec::new();
    for p in [Placement::Ttd, Placement::Random, Placement::RoundRobin] {
        let mut mean = 0.0;
        let mut p95 = 0.0;
        let mut wait = 0.0;
        for seed in 1..=seeds {
            let r = simulate(
                &SimConfig {
                    hosts,
                    jobs,
                    utilization,
                    seed,
                    ..SimConfig::default()
                },
                p,
            );
            mean += r.mean_completion_s / seeds as f64;
            p95 += r.p95_completion_s / seeds as f64;
            wait += r.mean_wait_s / seeds as f64;
        }
        rows.push((p, mean, p95, wait));
    }
    let ttd = rows[0].1;
    match output {
        Output::Json => crate::report::emit(json!({
            "scenario": "placement", "hosts": hosts, "jobs": jobs, "utilization": utilization, "seeds": seeds,
            "results": rows.iter().map(|(p, m, p95, w)| json!({
                "placement": p.as_str(), "mean_completion_s": m, "p95_completion_s": p95, "mean_wait_s": w,
                "vs_ttd": m / ttd,
            })).collect::<Vec<_>>(),
        })),
        Output::Table => {
            println!(
                "placement quality: {hosts} heterogeneous hosts (4/8/16 CPUs, benchmark 500..3000), {jobs} jobs, offered load {:.0}%, mean of {seeds} seeds",
                utilization * 100.0
            );
            println!(
                "{:<12} {:>18} {:>16} {:>14} {:>8}",
                "placement", "mean completion s", "p95 completion s", "mean wait s", "vs ttd"
            );
            for (p, m, p95, w) in &rows {
                println!(
                    "{:<12} {:>18.1} {:>16.1} {:>14.1} {:>7.2}x",
                    p.as_str(),
                    m,
                    p95,
                    w,
                    m / ttd
                );
            }
        }
    }
    Ok(())
}

/// A Broker client with the fabric's message-size bound.
async fn client(addr: &str) -> anyhow::Result<pb::broker_client::BrokerClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(pb::broker_client::BrokerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}
