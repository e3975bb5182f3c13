//! `gma bench scale`: the fabric at grid scale on one machine, with churn, nothing lost.
//!
//! Real processes: a 3-node directory, `--producers` producer processes sharing `--hosts`
//! simulated hosts (host.load, host.cpu, host.mem every second; host.info every minute), an
//! archiver subscribed to everything, a broker following every load stream; and `--consumers`
//! dashboard-style consumers (host.load of every host) in this process, measuring sample →
//! consumer latency. With churn (default), a third of the way in producer 0 is restarted
//! (SIGTERM, then started again under the same record id: a new run, seqs from 1), and half way
//! the directory leader is killed (SIGKILL) and started again 3 s later.
//!
//! Loss is accounted by seq, producer → archiver: every producer run prints the last seq it
//! published when it stops (`gma producer stopped: epoch E last seq N`); at the end every
//! producer is stopped and the archiver must have received exactly `N` events of every run
//! (seqs 1..=N) and been told of no gap. Figures: loss, latency p50/p99/p99.9, each process's
//! CPU and RSS at start and end, directory CPU, leader failover time, how long each consumer took
//! to see producer 0's new run.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber, SubscriberOptions};
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio::process::Child;

use crate::bench::{cores, proc_usage};
use crate::bench_dir::Cluster;
use crate::cli::Output;

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// CPU seconds and RSS of one process (one incarnation) at start, peak and end.
#[derive(Debug, Clone, Default)]
struct Usage {
    cpu_start: f64,
    cpu_end: f64,
    rss_start: f64,
    rss_peak: f64,
    rss_end: f64,
}

/// A `gma` child process of the benchmark.
struct Role {
    name: String,
    args: Vec<String>,
    child: Option<Child>,
    pid: String,
    addr: String,
    lines: Arc<Mutex<Vec<String>>>,
    usage: Usage,
    /// Usage of earlier incarnations (restarts).
    earlier_cpu: f64,
}

impl Role {
    async fn start(name: &str, args: Vec<String>, marker: &str) -> anyhow::Result<Role> {
        let mut r = Role {
            name: name.to_string(),
            args,
            child: None,
            pid: String::new(),
            addr: String::new(),
            lines: Arc::new(Mutex::new(Vec::new())),
            usage: Usage::default(),
            earlier_cpu: 0.0,
        };
        r.spawn(marker).await?;
        Ok(r)
    }

    async fn spawn(&mut self, marker: &str) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("cannot find the gma binary")?;
        let mut child = tokio::process::Command::new(exe)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        self.pid = child
            .id()
            .ok_or_else(|| anyhow!("{} exited at once", self.name))?
            .to_string();
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow!("no stderr from {}", self.name))?;
        self.child = Some(child);
        let lines = self.lines.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let prefix = format!("{marker} ");
        tokio::spawn(async move {
            let mut r = tokio::io::BufReader::new(stderr).lines();
            let mut tx = Some(tx);
            while let Ok(Some(l)) = r.next_line().await {
                if let Some(a) = l.strip_prefix(&prefix) {
                    if let Some(t) = tx.take() {
                        let _ = t.send(a.trim().to_string());
                    }
                }
                let mut g = lines.lock();
                if g.len() < 10_000 {
                    g.push(l);
                }
            }
        });
        self.addr = tokio::time::timeout(START_TIMEOUT, rx)
            .await
            .map_err(|_| {
                anyhow!(
                    "{} did not start within {START_TIMEOUT:?}: {:?}",
                    self.name,
                    self.lines.lock()
                )
            })?
            .map_err(|_| anyhow!("{} exited before listening: {:?}", self.name, self.lines.lock()))?;
        let (cpu, rss) = proc_usage(&self.pid)?;
        self.usage = Usage {
            cpu_start: cpu,
            cpu_end: cpu,
            rss_start: rss,
            rss_peak: rss,
            rss_end: rss,
        };
        Ok(())
    }

    fn sample(&mut self) {
        if self.child.is_some() {
            if let Ok((cpu, rss)) = proc_usage(&self.pid) {
                self.usage.cpu_end = cpu;
                self.usage.rss_peak = self.usage.rss_peak.max(rss);
                self.usage.rss_end = rss;
            }
        }
    }

    /// SIGTERM, and the process's exit (bounded).
    async fn terminate(&mut self) -> anyhow::Result<()> {
        self.sample();
        self.earlier_cpu += self.usage.cpu_end - self.usage.cpu_start;
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &self.pid])
            .status()
            .await;
        match tokio::time::timeout(Duration::from_secs(15), c.wait()).await {
            Ok(_) => Ok(()),
            Err(_) => {
                let _ = c.start_kill();
                bail!("{} did not stop within 15 s of SIGTERM", self.name)
            }
        }
    }

    fn cpu_total(&self) -> f64 {
        self.earlier_cpu + (self.usage.cpu_end - self.usage.cpu_start).max(0.0)
    }

    /// (epoch, last seq) of every run that printed its stop line.
    fn runs(&self) -> Vec<(u64, u64)> {
        self.lines
            .lock()
            .iter()
            .filter_map(|l| {
                let rest = l.strip_prefix("gma producer stopped: epoch ")?;
                let (e, s) = rest.split_once(" last seq ")?;
                Some((e.trim().parse().ok()?, s.trim().parse().ok()?))
            })
            .collect()
    }
}

struct ConsumerFigures {
    latency: Histogram<u64>,
    events: u64,
    gap_events: u64,
    /// When this consumer first saw producer 0's new run (after the restart).
    recovered_at: Option<Instant>,
}

fn sim_file(dir: &Path, i: u32, hosts: u32) -> anyhow::Result<std::path::PathBuf> {
    let p = dir.join(format!("sim{i}.toml"));
    std::fs::write(
        &p,
        format!(
            "[[generate]]\ncount = {hosts}\nprefix = \"p{i}h\"\nseed = {}\ncpus = 8\nmemory_mb = 16384\n\
             benchmarks = {{ specint = 1200, specfp = 1100 }}\n",
            i + 1
        ),
    )?;
    Ok(p)
}

async fn archive_stats(addr: &str) -> anyhow::Result<pb::ArchiveStatsResponse> {
    let ch = gma_consumer::connect(addr).await?;
    let mut c = pb::archive_client::ArchiveClient::new(ch);
    Ok(
        tokio::time::timeout(Duration::from_secs(10), c.stats(pb::ArchiveStatsRequest {}))
            .await
            .map_err(|_| anyhow!("archiver stats timed out"))??
            .into_inner(),
    )
}

pub async fn scale(
    hosts: u32,
    producers: u32,
    consumers: u32,
    duration: u64,
    churn: bool,
    output: Output,
) -> anyhow::Result<()> {
    if hosts == 0 || producers == 0 || duration == 0 || producers > hosts {
        bail!("--hosts, --producers and --duration must be positive, with no more producers than hosts");
    }
    let tmp = tempfile::Builder::new().prefix("gma-bench-scale-").tempdir()?;
    let setup = Instant::now();
    let mut cluster = Cluster::start(3).await.context("3-node directory")?;
    cluster.agreed_leader(Duration::from_secs(30), false).await?;
    let dirs = cluster.addrs.join(",");
    let s = |v: &str| v.to_string();
    let mut prods = Vec::new();
    for i in 0..producers {
        let n = hosts / producers + u32::from(i < hosts % producers);
        let file = sim_file(tmp.path(), i, n)?;
        let id = format!("scale-p{i}");
        let args = vec![
            s("producer"),
            s("--listen"),
            s("127.0.0.1:0"),
            s("--directory"),
            dirs.clone(),
            s("--no-host-sensors"),
            s("--simulate"),
            file.display().to_string(),
            s("--id"),
            id.clone(),
            s("--source"),
            id.clone(),
            s("--lease-ttl-ms"),
            s("3000"),
        ];
        prods.push(Role::start(&id, args, "gma producer listening on").await?);
    }
    let archiver = Role::start(
        "archiver",
        vec![
            s("archiver"),
            s("--listen"),
            s("127.0.0.1:0"),
            s("--directory"),
            dirs.clone(),
            s("--data"),
            tmp.path().join("archive").display().to_string(),
        ],
        "gma archiver listening on",
    )
    .await?;
    let broker = Role::start(
        "broker",
        vec![
            s("broker"),
            s("--listen"),
            s("127.0.0.1:0"),
            s("--directory"),
            dirs.clone(),
        ],
        "gma broker listening on",
    )
    .await?;
    let mut roles: Vec<Role> = prods;
    roles.push(archiver);
    roles.push(broker);

    // Dashboard-style consumers in this process.
    let restart_at: Arc<Mutex<Option<(Instant, u64)>>> = Arc::new(Mutex::new(None));
    let figures: Arc<Mutex<Vec<ConsumerFigures>>> = Arc::new(Mutex::new(
        (0..consumers)
            .map(|_| {
                Ok(ConsumerFigures {
                    latency: Histogram::new_with_bounds(1, 600_000_000, 3)?,
                    events: 0,
                    gap_events: 0,
                    recovered_at: None,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
    ));
    let seen: Arc<Mutex<Vec<std::collections::HashSet<String>>>> =
        Arc::new(Mutex::new(vec![Default::default(); consumers as usize]));
    let recording = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..consumers as usize {
        let (figures, seen, recording, restart_at) = (
            figures.clone(),
            seen.clone(),
            recording.clone(),
            restart_at.clone(),
        );
        let dirs = dirs.clone();
        tasks.push(tokio::spawn(async move {
            let mut sub = Subscriber::start(
                SubscriberOptions {
                    directory: dirs,
                    stream: StreamOptions {
                        patterns: vec!["host.load".into()],
                        consumer_id: format!("scale-c{c}"),
                        ..StreamOptions::default()
                    },
                    capacity: 64,
                    default_resume: None,
                },
                HashMap::new(),
            );
            while let Some(d) = sub.recv().await {
                match d {
                    Delivery::Events {
                        producer,
                        events,
                        resume,
                    } => {
                        let now = now_ns();
                        let rec = recording.load(std::sync::atomic::Ordering::Relaxed);
                        let mut f = figures.lock();
                        let f = &mut f[c];
                        if rec {
                            for e in &events {
                                let _ = f.latency.record(((now - e.timestamp_ns).max(1000) / 1000) as u64);
                            }
                            f.events += events.len() as u64;
                        }
                        if f.recovered_at.is_none() && producer == "scale-p0" {
                            if let Some((_, old_epoch)) = *restart_at.lock() {
                                if resume.epoch != old_epoch {
                                    f.recovered_at = Some(Instant::now());
                                }
                            }
                        }
                        seen.lock()[c].insert(producer);
                    }
                    Delivery::Gap { gap, .. } if recording.load(std::sync::atomic::Ordering::Relaxed) => {
                        figures.lock()[c].gap_events += gap.dropped;
                    }
                    _ => {}
                }
            }
        }));
    }
    // Warm-up: every consumer follows every producer.
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.lock().iter().any(|s| s.len() < producers as usize) {
        if Instant::now() > deadline {
            bail!("consumers did not reach every producer within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let setup_s = setup.elapsed().as_secs_f64();
    for r in &mut roles {
        r.sample();
        r.usage.cpu_start = r.usage.cpu_end;
        r.usage.rss_start = r.usage.rss_end;
    }
    let dir_cpu0 = cluster.cpu_total();
    let me = std::process::id().to_string();
    let (me_cpu0, me_rss0) = proc_usage(&me)?;
    recording.store(true, std::sync::atomic::Ordering::Relaxed);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(duration);
    let mut restarted = false;
    let mut killed: Option<(usize, Instant)> = None;
    let mut failover_ms = None;
    let mut rejoined = false;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        for r in &mut roles {
            r.sample();
        }
        let elapsed = t0.elapsed();
        if churn && !restarted && elapsed >= Duration::from_secs(duration) / 3 {
            restarted = true;
            let p0 = &mut roles[0];
            p0.terminate().await?;
            let old_epoch = p0.runs().last().map_or(0, |r| r.0);
            *restart_at.lock() = Some((Instant::now(), old_epoch));
            p0.spawn("gma producer listening on").await?;
        }
        if churn && killed.is_none() && elapsed >= Duration::from_secs(duration) / 2 {
            let leader = cluster.agreed_leader(Duration::from_secs(10), false).await?;
            let mut c = cluster.take_for_kill(leader)?;
            let _ = c.start_kill();
            let _ = c.wait().await;
            let at = Instant::now();
            killed = Some((leader, at));
            if cluster
                .agreed_leader(Duration::from_secs(30), false)
                .await
                .is_ok()
            {
                failover_ms = Some(at.elapsed().as_secs_f64() * 1e3);
            }
        }
        if let Some((i, at)) = killed {
            if !rejoined && at.elapsed() >= Duration::from_secs(3) {
                rejoined = true;
                cluster.spawn(i, false).await?;
            }
        }
    }
    recording.store(false, std::sync::atomic::Ordering::Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    let (me_cpu1, me_rss1) = proc_usage(&me)?;
    let dir_cpu = cluster.cpu_total() - dir_cpu0;
    for t in &tasks {
        t.abort();
    }
    // Stop every producer (each prints its last seq), then wait for the archiver to hold them.
    let np = producers as usize;
    for r in roles.iter_mut().take(np) {
        r.terminate().await?;
    }
    let mut runs: Vec<(String, u64, u64)> = Vec::new();
    for r in roles.iter().take(np) {
        for (epoch, last) in r.runs() {
            runs.push((r.name.clone(), epoch, last));
        }
    }
    let arch_addr = roles[np].addr.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (stats, missing) = loop {
        let st = archive_stats(&arch_addr).await?;
        let got: HashMap<(String, u64), u64> = st
            .received
            .iter()
            .map(|r| ((r.producer.clone(), r.epoch), r.events))
            .collect();
        let missing: u64 = runs
            .iter()
            .map(|(p, e, last)| last.saturating_sub(got.get(&(p.clone(), *e)).copied().unwrap_or(0)))
            .sum();
        if missing == 0 || Instant::now() > deadline {
            break (st, missing);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let published: u64 = runs.iter().map(|r| r.2).sum();
    for r in roles.iter_mut().skip(np) {
        r.sample();
        let _ = r.terminate().await;
    }
    let (dir_cpu_each, dir_rss) = cluster.stop().await;

    let figs = figures.lock();
    let mut lat = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut delivered = 0;
    let mut consumer_gaps = 0;
    for f in figs.iter() {
        lat.add(&f.latency)?;
        delivered += f.events;
        consumer_gaps += f.gap_events;
    }
    let recovery: Vec<f64> = match *restart_at.lock() {
        Some((at, _)) => figs
            .iter()
            .filter_map(|f| {
                f.recovered_at
                    .map(|r| r.saturating_duration_since(at).as_secs_f64() * 1e3)
            })
            .collect(),
        None => Vec::new(),
    };
    let pct = |v: &[f64], q: f64| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied()
    };
    let q = |p: f64| lat.value_at_quantile(p) as f64 / 1000.0;
    let procs: Vec<serde_json::Value> = roles
        .iter()
        .map(|r| {
            json!({
                "name": r.name, "cpu_seconds": r.cpu_total(), "cpu_pct": 100.0 * r.cpu_total() / seconds,
                "rss_mib_start": r.usage.rss_start, "rss_mib_peak": r.usage.rss_peak, "rss_mib_end": r.usage.rss_end,
            })
        })
        .chain((0..3).map(|i| {
            json!({
                "name": format!("directory-{}", i + 1), "cpu_seconds": dir_cpu_each.get(i), "rss_mib_peak": dir_rss.get(i),
            })
        }))
        .chain(std::iter::once(json!({
            "name": "bench (consumers)", "cpu_seconds": me_cpu1 - me_cpu0, "cpu_pct": 100.0 * (me_cpu1 - me_cpu0) / seconds,
            "rss_mib_start": me_rss0, "rss_mib_end": me_rss1,
        })))
        .collect();
    let report = json!({
        "scenario": "scale",
        "machine_cores": cores(),
        "duration_s": seconds,
        "setup_s": setup_s,
        "hosts": hosts, "producers": producers, "consumers": consumers, "churn": churn,
        "loss": {
            "published": published,
            "missing_at_archiver": missing,
            "archiver_gap_events": stats.gap_events,
            "consumer_gap_events": consumer_gaps,
            "runs": runs.iter().map(|(p, e, l)| json!({"producer": p, "epoch": e, "last_seq": l})).collect::<Vec<_>>(),
        },
        "delivered_to_consumers": delivered,
        "events_per_s_published": published as f64 / (seconds + setup_s).max(1e-9),
        "latency_ms": {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": lat.max() as f64 / 1000.0, "samples": lat.len()},
        "directory_cpu_pct": 100.0 * dir_cpu / seconds,
        "leader_failover_ms": failover_ms,
        "consumer_recovery_ms": {
            "consumers": recovery.len(), "p50": pct(&recovery, 0.5), "max": pct(&recovery, 1.0),
        },
        "processes": procs,
    });
    match output {
        Output::Json => crate::bench::emit(report),
        Output::Table => {
            println!(
                "scale: {hosts} simulated hosts in {producers} producer processes, 3-node directory, archiver, broker, {consumers} consumers, {seconds:.0} s ({} cores){}",
                cores(),
                if churn { ", with churn" } else { "" }
            );
            println!(
                "  loss: {missing} of {published} published events missing at the archiver; gaps reported: archiver {}, consumers {consumer_gaps}",
                stats.gap_events
            );
            println!(
                "  latency sample -> consumer: p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms ({} samples)",
                q(0.5),
                q(0.99),
                q(0.999),
                lat.max() as f64 / 1000.0,
                lat.len()
            );
            println!(
                "  directory CPU {:.1}% of one core (3 nodes)",
                100.0 * dir_cpu / seconds
            );
            if churn {
                println!(
                    "  leader failover {} ms; consumers seeing producer 0's new run after its restart: {} of {consumers}, p50 {} ms, max {} ms",
                    failover_ms.map_or("-".into(), |v| format!("{v:.0}")),
                    recovery.len(),
                    pct(&recovery, 0.5).map_or("-".into(), |v| format!("{v:.0}")),
                    pct(&recovery, 1.0).map_or("-".into(), |v| format!("{v:.0}")),
                );
            }
            for p in &report["processes"].as_array().cloned().unwrap_or_default() {
                println!("  {p}");
            }
        }
    }
    Ok(())
}
