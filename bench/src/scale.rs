//! `gma bench scale`: the fabric at grid scale on one machine, with faults, loss counted per seq.
//!
//! Real processes: a 3-node directory, `--producers` producer processes sharing `--hosts`
//! simulated hosts (host.load, host.cpu, host.mem every second; host.info every minute), an
//! archiver subscribed to everything, a broker following every load stream, a `gma subscribe`
//! consumer process (host.* of the last producer, drop-oldest), and `--consumers`
//! dashboard-style consumers (host.load of every host) in this process, measuring sample →
//! consumer latency.
//!
//! # Faults (churn, default; each can be turned off)
//!
//! At fixed fractions of `--duration` D (in order: a fault that runs late delays the next; every
//! planned fault runs, so a short run may last longer than D):
//!
//! - 0.10 D: the archiver is killed with SIGKILL, stays down 5 s (at most D/10) and is started
//!   again on its data; 0.85 D: again, restarted at once (`--no-archiver-kill`). Each kill is
//!   aimed at ingest in progress: it follows the moment the archiver's `Stats` show a new
//!   group of deliveries noted (noted before they are appended and fsynced). The archiver
//!   checkpoints every D/15 s (at most 20 s), so a kill finds sealed chunks and a log tail;
//! - 0.15 D: the consumer process is stopped with SIGSTOP for D/6 s (at most 40 s,
//!   `--consumer-stop-s`), longer than its queue at the producer, then SIGCONT
//!   (`--no-consumer-stop`);
//! - 1/3 D: producer 0 is restarted gracefully (SIGTERM, then started again under the same
//!   record id: a new run, seqs from 1) (`--no-producer-restart`);
//! - 0.50 D: the directory leader is killed with SIGKILL and started again 3 s later
//!   (`--no-leader-kill`);
//! - 0.70 D: producer 1 (producer 0 with one producer) is killed with SIGKILL and started again
//!   (`--no-producer-kill`).
//!
//! # Loss, per seq
//!
//! A producer run (epoch) numbers its events 1, 2, … across all its series. Each run prints its
//! epoch when it starts (`gma producer run: epoch E`) and, when stopped gracefully, the last seq
//! it published (`gma producer stopped: epoch E last seq N`). The archiver runs with
//! `provenance = true` (and no keep rule: it must keep everything), so every row it stores
//! carries the event's run and seq (`_gma_run`, `_gma_seq`; gma_archiver::provenance).
//!
//! At the end every producer is stopped (SIGTERM), the archiver is stopped (SIGTERM: flush and
//! checkpoint) and started again on its data without a directory, and every row is read back
//! through `Archive.Query` (both fields of every series, paired row by row). Per run, the union
//! of its rows over all series must be 1..=N, each seq exactly once: missing and duplicated seqs
//! are counted (first missing ranges listed). A run killed with SIGKILL prints no last seq: its
//! N is the highest seq known to have been published — its head read through `Producer.Query`
//! just before the kill, the highest seq the consumers were sent, the highest the archive holds
//! — and the seqs above the archive's highest are reported as that run's *undelivered tail*,
//! not as loss. Each missing range and duplicate is attributed to the fault whose time window
//! holds the sample time of its neighbour in the archive, or reported as unattributed.
//!
//! `--lossy-keep N` gives the archiver a keep rule that stores one host.cpu event in N: the
//! check must then report those seqs missing (a benchmark that can show a bad result).
//!
//! Figures: loss per run and per fault, latency p50/p99/p99.9, each process's CPU and RSS at
//! start and end, directory CPU, leader failover time, the archiver's outage and resume time
//! against the producers' resume window, the stopped consumer's gap reports, how long each
//! consumer took to see producer 0's new run; every process's RSS and CPU sampled every
//! `--sample-every` over the run, with its RSS growth over the last half (computed, not judged).
//! `--hosts N,M` runs one after the other; `--plot DIR` draws them (crate::plot).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_archiver::provenance::{parse_run, RUN_FIELD, SEQ_FIELD};
use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber, SubscriberOptions};
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio::process::Child;

use crate::args::Output;
use crate::dir::Cluster;
use crate::plot::{Chart, Series};
use crate::report::{cores, proc_usage, Point, Timeline};

const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Select calls asked of the broker at the end of the measurement.
const BROKER_DECISIONS: u32 = 100;
/// How long the archiver may take to catch up with the producers at the end of the
/// measurement, and to stop cleanly (its shutdown checkpoint seals every stream's open chunk).
const ARCHIVER_END_WAIT: Duration = Duration::from_secs(300);
/// The smallest resume ring a producer gets (`--buffer-events`), whatever `--resume-window`.
const MIN_BUFFER_EVENTS: u64 = 100_000;
/// Events one simulated host publishes per second: host.load, host.cpu and host.mem every
/// second, host.info every 60 (gma_sensors::sim::INFO_EVERY_TICKS).
const EVENTS_PER_HOST_S: f64 = 3.0 + 1.0 / gma_sensors::sim::INFO_EVERY_TICKS as f64;

/// The resume ring (`--buffer-events`) that holds `window_s` seconds of the events of a
/// producer simulating `hosts` hosts, at least [`MIN_BUFFER_EVENTS`].
pub(crate) fn ring_for_window(hosts: u32, window_s: u64) -> u64 {
    let events = (f64::from(hosts) * EVENTS_PER_HOST_S * window_s as f64).ceil() as u64;
    events.max(MIN_BUFFER_EVENTS)
}
/// The archiver's record id, kept across its restarts.
const ARCHIVER_ID: &str = "scale-archiver";
/// Missing ranges listed per run.
const RANGES_LISTED: usize = 5;
/// A loss is attributed to a fault when its time lies within the fault's window widened by this
/// much after it ends (what a fault breaks can show up a little later).
const ATTRIBUTION_SLACK_NS: i64 = 30_000_000_000;

/// Which faults a churn run injects.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Faults {
    pub archiver_kill: bool,
    pub consumer_stop: bool,
    pub producer_restart: bool,
    pub leader_kill: bool,
    pub producer_kill: bool,
}

impl Faults {
    pub(crate) const NONE: Faults = Faults {
        archiver_kill: false,
        consumer_stop: false,
        producer_restart: false,
        leader_kill: false,
        producer_kill: false,
    };

    fn any(&self) -> bool {
        self.archiver_kill
            || self.consumer_stop
            || self.producer_restart
            || self.leader_kill
            || self.producer_kill
    }
}

/// `gma bench scale` parameters.
#[derive(Debug, Clone)]
pub(crate) struct ScaleOptions {
    pub hosts: u32,
    pub producers: u32,
    pub consumers: u32,
    pub duration: u64,
    pub faults: Faults,
    /// How long the consumer process stays stopped (default D/6, at most 40 s).
    pub consumer_stop_s: Option<f64>,
    /// Archiver keep rule: one host.cpu event in N (shows the check finding loss).
    pub lossy_keep: Option<u64>,
    /// Seconds between samples of every process's RSS and CPU (default: D/100, 1 to 10 s).
    pub sample_every: Option<u64>,
    /// Folder for the SVG figures (`--plot`).
    pub plot: Option<PathBuf>,
    /// Seconds of its simulated events each producer's resume ring holds (`--resume-window`).
    pub resume_window_s: u64,
    pub output: Output,
}

/// CPU seconds and RSS of one process (one incarnation) at start, peak and end.
#[derive(Debug, Clone, Default)]
struct Usage {
    cpu_start: f64,
    cpu_end: f64,
    rss_start: f64,
    rss_peak: f64,
    rss_end: f64,
}

/// What a consumer process printed on stdout (JSON lines, one per event).
#[derive(Debug, Default)]
struct Printed {
    events: u64,
    max_seq: u64,
}

type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

/// A `gma` child process of the benchmark.
struct Role {
    name: String,
    args: Vec<String>,
    /// The stderr line announcing it listens (its address follows); none: not waited for.
    marker: Option<String>,
    child: Option<Child>,
    pid: String,
    addr: String,
    /// Its stderr lines, with their arrival time.
    lines: Lines,
    /// Its stdout, when read (the consumer process).
    printed: Option<Arc<Mutex<Printed>>>,
    usage: Usage,
    /// Usage of earlier incarnations (restarts).
    earlier_cpu: f64,
    /// When the current incarnation started listening.
    started: Instant,
    /// Processes started for this role (1 + restarts).
    starts: u32,
}

impl Role {
    async fn start(
        name: &str,
        args: Vec<String>,
        marker: Option<&str>,
        stdout: bool,
    ) -> anyhow::Result<Role> {
        let mut r = Role {
            name: name.to_string(),
            args,
            marker: marker.map(str::to_string),
            child: None,
            pid: String::new(),
            addr: String::new(),
            lines: Arc::new(Mutex::new(Vec::new())),
            printed: stdout.then(Default::default),
            usage: Usage::default(),
            earlier_cpu: 0.0,
            started: Instant::now(),
            starts: 0,
        };
        r.spawn().await?;
        Ok(r)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let mut cmd = crate::child::command()?;
        if self.printed.is_some() {
            cmd.stdout(Stdio::piped());
        }
        let mut child = cmd
            .args(&self.args)
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        self.pid = crate::child::pid(&child, &self.name)?;
        let mut r = crate::child::stderr_lines(&mut child, &self.name)?;
        if let (Some(printed), Some(out)) = (self.printed.clone(), child.stdout.take()) {
            tokio::spawn(async move {
                let mut r = tokio::io::BufReader::new(out).lines();
                while let Ok(Some(l)) = r.next_line().await {
                    let seq = l
                        .split_once("\"seq\":")
                        .and_then(|(_, s)| s.split(|c: char| !c.is_ascii_digit()).next())
                        .and_then(|s| s.parse::<u64>().ok());
                    let mut p = printed.lock();
                    p.events += 1;
                    p.max_seq = p.max_seq.max(seq.unwrap_or(0));
                }
            });
        }
        self.child = Some(child);
        let lines = self.lines.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let prefix = self.marker.as_ref().map(|m| format!("{m} "));
        tokio::spawn(async move {
            let mut tx = Some(tx);
            while let Ok(Some(l)) = r.next_line().await {
                if let Some(a) = prefix.as_ref().and_then(|p| l.strip_prefix(p.as_str())) {
                    if let Some(t) = tx.take() {
                        let _ = t.send(a.trim().to_string());
                    }
                }
                let l = strip_ansi(&l);
                let mut g = lines.lock();
                // Bounded, but the lines the accounting needs are always kept.
                if g.len() < 10_000 || l.starts_with("gma ") || l.starts_with("gap from ") {
                    g.push((Instant::now(), l));
                }
            }
        });
        if self.marker.is_some() {
            self.addr = tokio::time::timeout(START_TIMEOUT, rx)
                .await
                .map_err(|_| {
                    anyhow!(
                        "{} did not start within {START_TIMEOUT:?}: {:?}",
                        self.name,
                        self.stderr_tail()
                    )
                })?
                .map_err(|_| anyhow!("{} exited before listening: {:?}", self.name, self.stderr_tail()))?;
        }
        self.started = Instant::now();
        let (cpu, rss) = proc_usage(&self.pid)?;
        // CPU per incarnation (earlier ones are added up); RSS at the first start, peak over
        // every incarnation, and now.
        if self.starts == 0 {
            self.usage.rss_start = rss;
        }
        self.starts += 1;
        self.usage.cpu_start = cpu;
        self.usage.cpu_end = cpu;
        self.usage.rss_peak = self.usage.rss_peak.max(rss);
        self.usage.rss_end = rss;
        Ok(())
    }

    fn stderr_tail(&self) -> Vec<String> {
        let g = self.lines.lock();
        g.iter().rev().take(20).rev().map(|(_, l)| l.clone()).collect()
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

    /// Sample one last time and keep the incarnation's CPU.
    fn retire(&mut self) {
        self.sample();
        self.earlier_cpu += (self.usage.cpu_end - self.usage.cpu_start).max(0.0);
        self.usage.cpu_start = self.usage.cpu_end;
    }

    async fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let st = tokio::process::Command::new("kill")
            .args([format!("-{sig}"), self.pid.clone()])
            .status()
            .await
            .with_context(|| format!("cannot run kill -{sig}"))?;
        if !st.success() {
            bail!("kill -{sig} {} ({}) failed", self.pid, self.name);
        }
        Ok(())
    }

    /// SIGTERM, and the process's exit (bounded).
    async fn terminate(&mut self) -> anyhow::Result<()> {
        match self.terminate_within(Duration::from_secs(15)).await? {
            Some(_) => Ok(()),
            None => bail!("{} did not stop within 15 s of SIGTERM", self.name),
        }
    }

    /// SIGTERM, and the seconds until the process exited; None if it had not exited within
    /// `limit` (it is then killed with SIGKILL).
    async fn terminate_within(&mut self, limit: Duration) -> anyhow::Result<Option<f64>> {
        self.retire();
        let Some(mut c) = self.child.take() else {
            return Ok(Some(0.0));
        };
        let asked = Instant::now();
        self.signal("TERM").await?;
        match tokio::time::timeout(limit, c.wait()).await {
            Ok(_) => Ok(Some(asked.elapsed().as_secs_f64())),
            Err(_) => {
                let _ = c.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(15), c.wait()).await;
                Ok(None)
            }
        }
    }

    /// SIGKILL, and the process's exit (bounded).
    async fn kill9(&mut self) -> anyhow::Result<()> {
        self.retire();
        let Some(mut c) = self.child.take() else {
            bail!("{} is not running", self.name);
        };
        c.start_kill()
            .with_context(|| format!("cannot kill {}", self.name))?;
        tokio::time::timeout(Duration::from_secs(15), c.wait())
            .await
            .map_err(|_| anyhow!("{} did not die within 15 s of SIGKILL", self.name))??;
        Ok(())
    }

    fn cpu_total(&self) -> f64 {
        self.earlier_cpu + (self.usage.cpu_end - self.usage.cpu_start).max(0.0)
    }

    /// Every run this producer role started, in order, as its stderr told: the epoch when it
    /// started, its last seq when it stopped.
    fn runs(&self) -> Vec<RunSeen> {
        let mut out: Vec<RunSeen> = Vec::new();
        for (at, l) in self.lines.lock().iter() {
            if let Some(e) = l.strip_prefix("gma producer run: epoch ") {
                if let Ok(epoch) = e.trim().parse() {
                    out.push(RunSeen {
                        producer: self.name.clone(),
                        epoch,
                        started: *at,
                        stop: None,
                    });
                }
            } else if let Some(rest) = l.strip_prefix("gma producer stopped: epoch ") {
                let parsed = rest
                    .split_once(" last seq ")
                    .and_then(|(e, s)| Some((e.trim().parse::<u64>().ok()?, s.trim().parse::<u64>().ok()?)));
                if let Some((epoch, n)) = parsed {
                    match out.iter_mut().find(|r| r.epoch == epoch) {
                        Some(r) => r.stop = Some((n, *at)),
                        None => out.push(RunSeen {
                            producer: self.name.clone(),
                            epoch,
                            started: *at,
                            stop: Some((n, *at)),
                        }),
                    }
                }
            }
        }
        out
    }

    /// The stderr lines that arrived within `[from, to)` and start with `prefix`.
    fn lines_between(&self, prefix: &str, from: Instant, to: Option<Instant>) -> Vec<String> {
        self.lines
            .lock()
            .iter()
            .filter(|(at, l)| *at >= from && to.is_none_or(|t| *at < t) && l.starts_with(prefix))
            .map(|(_, l)| l.clone())
            .collect()
    }
}

/// Writes an archiver config (`listen` on port 0, id [`ARCHIVER_ID`], provenance on, then
/// `rest`) to `conf` and starts `gma archiver --config` on it. Its /metrics is served on a
/// loopback port of its own (`gma archiver metrics on ADDR` on its stderr; `ss -ltnp` finds
/// it), for a heap profile during a run (`gma_process_heap_*`).
async fn start_archiver(name: &str, conf: &Path, rest: String) -> anyhow::Result<Role> {
    std::fs::write(
        conf,
        format!(
            "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\nid = {ARCHIVER_ID:?}\nprovenance = true\n{rest}"
        ),
    )?;
    Role::start(
        name,
        vec!["archiver".into(), "--config".into(), conf.display().to_string()],
        Some("gma archiver listening on"),
        false,
    )
    .await
}

/// The events a `gma subscribe` gap line reports lost
/// (`gap from P: seqs A..=B (N events lost): reason`).
fn gap_events(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once(" (")?;
    let (n, _) = rest.split_once(" events lost")?;
    n.parse().ok()
}

/// `l` without ANSI escape sequences (colored log lines).
fn strip_ansi(l: &str) -> String {
    let mut out = String::with_capacity(l.len());
    let mut chars = l.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte (0x40..=0x7e).
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
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

async fn archive_client(
    addr: &str,
) -> anyhow::Result<pb::archive_client::ArchiveClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(pb::archive_client::ArchiveClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

async fn archive_stats(addr: &str) -> anyhow::Result<pb::ArchiveStatsResponse> {
    let mut c = archive_client(addr).await?;
    Ok(
        tokio::time::timeout(Duration::from_secs(30), c.stats(pb::ArchiveStatsRequest {}))
            .await
            .map_err(|_| anyhow!("archiver stats timed out"))??
            .into_inner(),
    )
}

/// Waits until the archiver (this incarnation) has received events of every one of
/// `producers`; returns when.
async fn wait_following(addr: &str, producers: &[String], timeout: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match archive_stats(addr).await {
            Ok(st) => {
                let missing: Vec<&String> = producers
                    .iter()
                    .filter(|p| !st.received.iter().any(|r| &r.producer == *p && r.events > 0))
                    .collect();
                if missing.is_empty() {
                    return Ok(Instant::now());
                }
                format!(
                    "nothing yet from {missing:?}; it holds {} samples of {} streams, ingesting {:.0} samples/s",
                    st.samples, st.streams, st.ingest_samples_per_s
                )
            }
            Err(e) => format!("its Stats failed: {e}"),
        };
        if Instant::now() > deadline {
            bail!("the archiver did not receive events from every producer within {timeout:?}: {last}");
        }
        // Not faster: Stats walks every stream under the lock the archiver's ingest takes.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Polls the archiver's `Stats` until the events it has noted as received change (its ingest
/// notes a group of deliveries before it appends and fsyncs them), within `timeout`. Returns
/// those stats, or `None` when nothing moved.
async fn ingest_moves(addr: &str, timeout: Duration) -> Option<pb::ArchiveStatsResponse> {
    let mut c = archive_client(addr).await.ok()?;
    let deadline = Instant::now() + timeout;
    let mut first = None;
    while Instant::now() < deadline {
        let st = c.stats(pb::ArchiveStatsRequest {}).await.ok()?.into_inner();
        let n: u64 = st.received.iter().map(|r| r.events).sum();
        match first {
            None => first = Some(n),
            Some(f) if n != f => return Some(st),
            _ => {}
        }
    }
    None
}

/// The directory's records, leases and raft position, as one member answers
/// (`ClusterStatus`).
async fn directory_status(dirs: &str) -> anyhow::Result<(Instant, pb::ClusterStatusResponse)> {
    let mut c = gma_consumer::registrar::connect(dirs).await?;
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        c.cluster_status(pb::ClusterStatusRequest {}),
    )
    .await
    .map_err(|_| anyhow!("directory status timed out"))??
    .into_inner();
    Ok((Instant::now(), r))
}

/// Directory figures over the measurement: what it holds at the end, and the raft entries it
/// applied per second (every lease renewal is one, as is every record write).
fn directory_figures(
    before: &Option<(Instant, pb::ClusterStatusResponse)>,
    after: &Option<(Instant, pb::ClusterStatusResponse)>,
) -> serde_json::Value {
    let Some((t1, a)) = after else {
        return json!({"error": "the directory did not answer ClusterStatus at the end"});
    };
    let per_s = before.as_ref().map(|(t0, b)| {
        a.last_applied.saturating_sub(b.last_applied) as f64 / t1.duration_since(*t0).as_secs_f64().max(1e-9)
    });
    json!({
        "producer_records": a.producers, "consumer_records": a.consumers, "schemas": a.schemas,
        "leases": a.leases, "raft_entries_applied_per_s": per_s,
    })
}

type BrokerClient = pb::broker_client::BrokerClient<tonic::transport::Channel>;

async fn broker_client(addr: &str) -> anyhow::Result<BrokerClient> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(pb::broker_client::BrokerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

/// The job every decision places: 2 CPUs of any simulated host (each has 8).
fn broker_job() -> pb::JobSpec {
    gma_broker::job::Job {
        name: "scale".into(),
        cpus: 2,
        memory_mb: 2048.0,
        reference_time_s: 600.0,
        reference: [("specint".to_string(), 1200.0)].into_iter().collect(),
        ..Default::default()
    }
    .to_proto()
}

/// One `Select` of [`broker_job`], at most 30 s.
async fn select_once(c: &mut BrokerClient, limit: u32) -> anyhow::Result<pb::SelectResponse> {
    Ok(tokio::time::timeout(
        Duration::from_secs(30),
        c.select(pb::SelectRequest {
            job: Some(broker_job()),
            policy: pb::BrokerPolicy::Ttd as i32,
            limit,
            include_rejected: false,
        }),
    )
    .await
    .map_err(|_| anyhow!("a Select took more than 30 s"))??
    .into_inner())
}

/// The error when the broker's view holds `view` of the `hosts` simulated hosts: a decision
/// over a partial view is not a decision over N hosts, so the run fails instead of printing one.
fn short_view(view: u32, hosts: u32, when: &str) -> Option<anyhow::Error> {
    (view < hosts).then(|| {
        anyhow!(
            "the broker's view holds {view} of the {hosts} simulated hosts {when}: its decision latency would not be over {hosts} hosts (see the broker's warnings: a stream from a producer that keeps breaking, a refused subscription)"
        )
    })
}

/// Waits until the broker's view holds every simulated host (`view_resources` of a `Select`),
/// within `timeout`.
async fn wait_broker_view(addr: &str, hosts: u32, timeout: Duration) -> anyhow::Result<()> {
    let mut c = broker_client(addr).await?;
    let deadline = Instant::now() + timeout;
    loop {
        let view = select_once(&mut c, 1).await?.view_resources;
        match short_view(view, hosts, &format!("after {timeout:?}")) {
            None => return Ok(()),
            Some(e) if Instant::now() > deadline => return Err(e),
            Some(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Select decisions asked of the broker one after another through gRPC, over its live view of
/// the simulated hosts: latency at the client and the broker's own ranking time. Fails when
/// the view held fewer than `hosts` resources during a decision.
async fn broker_decisions(addr: &str, n: u32, hosts: u32) -> anyhow::Result<serde_json::Value> {
    let mut c = broker_client(addr).await?;
    let mut at_client = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut ranking = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let (mut view, mut stale, mut ranked) = (u32::MAX, 0, 0);
    for _ in 0..n {
        let s = Instant::now();
        let r = select_once(&mut c, 10).await?;
        at_client.record(s.elapsed().as_micros().max(1) as u64)?;
        ranking.record(r.decide_us.max(1.0) as u64)?;
        view = view.min(r.view_resources);
        (stale, ranked) = (stale.max(r.view_stale), r.ranked.len());
    }
    if let Some(e) = short_view(view, hosts, "at the end of the run") {
        return Err(e);
    }
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(json!({
        "decisions": n, "view_resources": view, "view_stale": stale, "ranked": ranked,
        "p50_ms": ms(&at_client, 0.5), "p99_ms": ms(&at_client, 0.99),
        "ranking_p50_ms": ms(&ranking, 0.5), "ranking_p99_ms": ms(&ranking, 0.99),
    }))
}

/// Archiver figures over the measurement: what its store holds at the end, bytes per sample,
/// and its CPU per million samples stored during the run.
fn archiver_figures(
    before: &Option<pb::ArchiveStatsResponse>,
    after: &Option<pb::ArchiveStatsResponse>,
    cpu_s: f64,
) -> serde_json::Value {
    let Some(a) = after else {
        return json!({"error": "the archiver did not answer Stats at the end"});
    };
    let stored = before.as_ref().map(|b| a.samples.saturating_sub(b.samples));
    json!({
        "streams": a.streams, "series": a.series, "samples": a.samples,
        "bytes_on_disk": a.bytes_on_disk, "bytes_per_sample": a.bytes_per_sample,
        "samples_stored_during_run": stored,
        "cpu_s_per_million_samples": stored.filter(|n| *n > 0).map(|n| cpu_s / (n as f64 / 1e6)),
    })
}

/// Events a restarted archiver received again: per run, those the killed one had noted
/// (`before`) from the seq the new one resumed at (`after`: it receives every seq of a run from
/// its durable resume point, so its first seq is `last_seq - events + 1`). Not durable when the
/// kill came, so delivered again — neither lost nor stored twice, the read-back checks.
fn redelivered(before: &pb::ArchiveStatsResponse, after: &pb::ArchiveStatsResponse) -> u64 {
    after
        .received
        .iter()
        .filter_map(|a| {
            let b = before
                .received
                .iter()
                .find(|b| b.producer == a.producer && b.epoch == a.epoch)?;
            let resumed_at = (a.last_seq + 1).saturating_sub(a.events);
            Some((b.last_seq + 1).saturating_sub(resumed_at).min(a.events))
        })
        .sum()
}

/// Waits (at most [`ARCHIVER_END_WAIT`]) until the archiver has received, from each producer's
/// current run, everything it had published when called. Reports the lag it started from and
/// how long catching up took (null if it did not within the bound).
async fn archiver_catch_up(archiver: &str, producers: &[Role]) -> serde_json::Value {
    let start = Instant::now();
    let mut heads = Vec::new();
    for p in producers {
        match producer_head(&p.addr).await {
            Ok((epoch, seq)) => heads.push((p.name.clone(), epoch, seq)),
            Err(e) => return json!({"error": format!("{} head: {e:#}", p.name)}),
        }
    }
    let behind = |st: &pb::ArchiveStatsResponse| -> u64 {
        heads
            .iter()
            .map(|(name, epoch, seq)| {
                let got = st
                    .received
                    .iter()
                    .find(|x| &x.producer == name && x.epoch == *epoch)
                    .map_or(0, |x| x.last_seq);
                seq.saturating_sub(got)
            })
            .sum()
    };
    let mut first = None;
    loop {
        let now_behind = match archive_stats(archiver).await {
            Ok(st) => behind(&st),
            Err(e) => return json!({"error": format!("archiver stats: {e:#}")}),
        };
        let first = *first.get_or_insert(now_behind);
        if now_behind == 0 {
            return json!({"events_behind_at_end": first, "caught_up_s": start.elapsed().as_secs_f64()});
        }
        if start.elapsed() > ARCHIVER_END_WAIT {
            return json!({"events_behind_at_end": first, "caught_up_s": null, "still_behind": now_behind});
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The highest seq producer `addr` has published in its current run: (epoch, seq), from the
/// latest event of every series (`Producer.Query`).
async fn producer_head(addr: &str) -> anyhow::Result<(u64, u64)> {
    let ch = gma_consumer::connect(addr).await?;
    // The latest event of every series in one answer: 14 MB at 25,000 hosts per producer, over
    // the usual 4 MiB limit of a message; this one answer may be as large as 256 MiB.
    let mut c = pb::producer_client::ProducerClient::new(ch).max_decoding_message_size(256 << 20);
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        c.query(pb::QueryRequest {
            patterns: vec!["*".into()],
            sources: Vec::new(),
            max_age_ms: 0,
            ..Default::default()
        }),
    )
    .await
    .map_err(|_| anyhow!("producer query timed out"))??
    .into_inner();
    Ok((r.epoch, r.events.iter().map(|e| e.seq).max().unwrap_or(0)))
}

/// Every row the archive holds that carries provenance: per producer run (producer, epoch),
/// its (seq, sample time) pairs. Read through `Archive.Query`: the `_gma_seq` and `_gma_run`
/// fields of every series, paired row by row (the two answers of one series must have the same
/// timestamps, or the read-back fails). Also returns rows whose seq is not a positive integer.
async fn read_back(addr: &str) -> anyhow::Result<(HashMap<(String, u64), Vec<(u64, i64)>>, u64)> {
    let mut c = archive_client(addr).await?;
    let ask = |field: &str| pb::ArchiveQueryRequest {
        pattern: "*".into(),
        source: String::new(),
        field: field.into(),
        from_ns: i64::MIN,
        to_ns: i64::MAX,
        step_ns: 0,
        aggregate: pb::Aggregate::Raw as i32,
        max_points: 50_000,
    };
    type Key = (String, String);
    let mut seqs: BTreeMap<Key, (Vec<i64>, Vec<f64>)> = BTreeMap::new();
    let mut s = c.query(ask(SEQ_FIELD)).await?.into_inner();
    while let Some(m) = s.message().await? {
        for p in m.series {
            let e = seqs.entry((p.name, p.source)).or_default();
            e.0.extend(p.timestamps_ns);
            e.1.extend(p.values);
        }
    }
    // The run labels run-length coded: a series holds few runs, and one String per row would
    // be most of what the read-back holds at 100,000 hosts.
    let mut runs: BTreeMap<Key, (Vec<i64>, Vec<LabelRun>)> = BTreeMap::new();
    let mut s = c.query(ask(RUN_FIELD)).await?.into_inner();
    while let Some(m) = s.message().await? {
        for p in m.series {
            let e = runs.entry((p.name, p.source)).or_default();
            e.0.extend(p.timestamps_ns);
            push_runs(&mut e.1, p.texts);
        }
    }
    if seqs.len() != runs.len() {
        bail!(
            "read-back: {} series have {SEQ_FIELD} but {} have {RUN_FIELD}",
            seqs.len(),
            runs.len()
        );
    }
    let mut out: HashMap<(String, u64), Vec<(u64, i64)>> = HashMap::new();
    let mut malformed = 0u64;
    for (key, (ts, values)) in seqs {
        let Some((rts, labels)) = runs.get(&key) else {
            bail!("read-back: series {key:?} has {SEQ_FIELD} but no {RUN_FIELD}");
        };
        let n_labels: usize = labels.iter().map(|l| l.1).sum();
        if ts != *rts || values.len() != ts.len() || n_labels != ts.len() {
            bail!(
                "read-back: the {SEQ_FIELD} and {RUN_FIELD} rows of {key:?} differ ({} and {n_labels} rows)",
                values.len(),
            );
        }
        let labels = labels.iter().flat_map(|(l, n)| std::iter::repeat_n(l, *n));
        let mut last: Option<(&str, (String, u64))> = None;
        for ((t, v), label) in ts.iter().zip(&values).zip(labels) {
            let run = match &last {
                Some((l, r)) if *l == label.as_str() => r.clone(),
                _ => {
                    let Some((p, e)) = parse_run(label) else {
                        malformed += 1;
                        continue;
                    };
                    let r = (p.to_string(), e);
                    last = Some((label.as_str(), r.clone()));
                    r
                }
            };
            if !(v.fract() == 0.0 && *v >= 1.0 && *v < 9.0e15) {
                malformed += 1;
                continue;
            }
            out.entry(run).or_default().push((*v as u64, *t));
        }
    }
    Ok((out, malformed))
}

/// A run label and how many rows in a row carry it.
type LabelRun = (String, usize);

/// Appends `texts` to the run-length coded `runs`.
fn push_runs(runs: &mut Vec<LabelRun>, texts: Vec<String>) {
    for t in texts {
        match runs.last_mut() {
            Some((l, n)) if *l == t => *n += 1,
            _ => runs.push((t, 1)),
        }
    }
}

/// What the archive holds of one producer run, against the seqs 1..=`last` it published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunCheck {
    /// Distinct seqs of 1..=last held.
    pub held: u64,
    /// Seqs of 1..=last not held.
    pub missing: u64,
    /// The missing seqs as inclusive ranges, in order.
    pub missing_ranges: Vec<(u64, u64)>,
    /// Extra copies: a seq held k times counts k - 1.
    pub duplicated: u64,
    /// The seqs held more than once (each listed once), in order.
    pub duplicated_seqs: Vec<u64>,
    /// Rows whose seq lies outside 1..=last (none for a correct run).
    pub outside: u64,
    /// The highest seq held within 1..=last (0: none).
    pub max_held: u64,
}

/// Checks that `seqs` (every row of one run, any order) hold every seq of 1..=`last` exactly
/// once. Sorts `seqs`.
pub(crate) fn check_run(seqs: &mut [u64], last: u64) -> RunCheck {
    seqs.sort_unstable();
    let mut c = RunCheck::default();
    let mut expect = 1u64; // the next seq not yet seen
    let mut prev: Option<u64> = None;
    for &s in seqs.iter() {
        if s == 0 || s > last {
            c.outside += 1;
            continue;
        }
        if prev == Some(s) {
            c.duplicated += 1;
            if c.duplicated_seqs.last() != Some(&s) {
                c.duplicated_seqs.push(s);
            }
            continue;
        }
        if s > expect {
            c.missing_ranges.push((expect, s - 1));
            c.missing += s - expect;
        }
        c.held += 1;
        c.max_held = s;
        expect = s + 1;
        prev = Some(s);
    }
    if expect <= last {
        c.missing_ranges.push((expect, last));
        c.missing += last - expect + 1;
    }
    c
}

/// A fault injected during the run, with its window (unix ns) and what it is blamed for.
struct Fault {
    kind: &'static str,
    target: String,
    /// Seconds after the measurement began.
    at_s: f64,
    start_ns: i64,
    end_ns: i64,
    detail: serde_json::Map<String, serde_json::Value>,
    missing: u64,
    duplicated: u64,
}

impl Fault {
    fn new(kind: &'static str, target: &str, t0: Instant) -> Fault {
        let n = now_ns();
        Fault {
            kind,
            target: target.to_string(),
            at_s: t0.elapsed().as_secs_f64(),
            start_ns: n,
            end_ns: n,
            detail: serde_json::Map::new(),
            missing: 0,
            duplicated: 0,
        }
    }

    fn set(&mut self, k: &str, v: serde_json::Value) {
        self.detail.insert(k.to_string(), v);
    }
}

/// The fault a loss at sample time `t_ns` is attributed to: the latest one that began before it
/// (1 s of clock slack) and ended at most [`ATTRIBUTION_SLACK_NS`] before it.
fn blame(faults: &[Fault], t_ns: i64) -> Option<usize> {
    faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.start_ns - 1_000_000_000 <= t_ns && t_ns <= f.end_ns + ATTRIBUTION_SLACK_NS)
        .max_by_key(|(_, f)| f.start_ns)
        .map(|(i, _)| i)
}

/// The sample time of the archived row nearest below `seq` (else above it) in `rows` (sorted by
/// seq).
fn time_near(rows: &[(u64, i64)], seq: u64) -> Option<i64> {
    let i = rows.partition_point(|r| r.0 < seq);
    i.checked_sub(1)
        .and_then(|j| rows.get(j))
        .or_else(|| rows.get(i))
        .map(|r| r.1)
}

/// A planned fault.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    ArchiverKill { down: Duration },
    ConsumerStop { for_s: f64 },
    ConsumerCont,
    ProducerRestart,
    LeaderKill,
    LeaderRejoin { member: usize },
    ProducerKill { producer: usize },
}

/// One producer run as its process reported it.
struct RunSeen {
    producer: String,
    epoch: u64,
    started: Instant,
    /// Its last seq, from its stop line, and when that came.
    stop: Option<(u64, Instant)>,
}

const END_STOPPED: &str = "stopped";
const END_KILLED: &str = "kill -9";
const END_UNKNOWN: &str = "no stop line";

/// One producer run as accounted.
struct Run {
    producer: String,
    epoch: u64,
    /// How it ended: [`END_STOPPED`], [`END_KILLED`], [`END_UNKNOWN`].
    end: &'static str,
    /// The last seq and where it came from.
    last: u64,
    last_from: String,
    check: RunCheck,
    /// Of a run without a stop line: its seqs above the highest the archive holds.
    undelivered_tail: u64,
}

/// Checks every run in `seen` against the archive's rows of it (taken out of `archived`) and
/// blames each hole and duplicate on the fault whose window holds its sample time. A run
/// without a stop line gets as last seq the highest known published: `killed` (its head read
/// just before the SIGKILL), `heads` (what consumers were sent), the archive's highest; the
/// seqs above the archive's highest are its undelivered tail, not loss.
fn account(
    seen: &[RunSeen],
    archived: &mut HashMap<(String, u64), Vec<(u64, i64)>>,
    killed: &HashMap<(String, u64), u64>,
    heads: &HashMap<(String, u64), u64>,
    faults: &mut [Fault],
) -> Vec<Run> {
    let mut runs = Vec::new();
    for r in seen {
        let key = (r.producer.clone(), r.epoch);
        let mut rows = archived.remove(&key).unwrap_or_default();
        rows.sort_unstable();
        let archive_max = rows.last().map_or(0, |x| x.0);
        let (end, last, last_from) = match r.stop {
            Some((n, _)) => (END_STOPPED, n, "its stop line".to_string()),
            None => {
                let h = killed.get(&key).copied().unwrap_or(0);
                let c = heads.get(&key).copied().unwrap_or(0);
                (
                    if killed.contains_key(&key) {
                        END_KILLED
                    } else {
                        END_UNKNOWN
                    },
                    h.max(c).max(archive_max),
                    format!(
                        "highest seq known published: head before the kill {h}, consumers sent up to {c}, archive holds up to {archive_max}"
                    ),
                )
            }
        };
        let mut seqs: Vec<u64> = rows.iter().map(|x| x.0).collect();
        let check = check_run(&mut seqs, last);
        let undelivered_tail = if end == END_STOPPED {
            0
        } else {
            last - check.max_held
        };
        for &(a, b) in &check.missing_ranges {
            if end != END_STOPPED && b == last && a > check.max_held {
                continue; // the tail
            }
            if let Some(i) = time_near(&rows, a).and_then(|t| blame(faults, t)) {
                faults[i].missing += b - a + 1;
            }
        }
        for &d in &check.duplicated_seqs {
            let copies = (rows.partition_point(|x| x.0 <= d) - rows.partition_point(|x| x.0 < d)) as u64;
            if let Some(i) = time_near(&rows, d).and_then(|t| blame(faults, t)) {
                faults[i].duplicated += copies - 1;
            }
        }
        runs.push(Run {
            producer: r.producer.clone(),
            epoch: r.epoch,
            end,
            last,
            last_from,
            check,
            undelivered_tail,
        });
    }
    runs
}

/// `gma bench scale --hosts N,M,...`: one run per host count, each reported as it ends; with
/// `--plot`, CPU and RSS per role against host count and latency against the published rate
/// when there are several.
pub(crate) async fn scale_steps(o: ScaleOptions, hosts: &[u32]) -> anyhow::Result<()> {
    if hosts.is_empty() {
        bail!("--hosts needs at least one host count");
    }
    let mut reports = Vec::new();
    for &h in hosts {
        let r = scale(ScaleOptions {
            hosts: h,
            ..o.clone()
        })
        .await
        .with_context(|| format!("scale run with {h} hosts"))?;
        reports.push(r);
    }
    if let (Some(dir), true) = (&o.plot, reports.len() > 1) {
        for f in plot_steps(dir, &reports)? {
            eprintln!("gma bench scale: wrote {}", f.display());
        }
    }
    Ok(())
}

/// The role a process of the scale run belongs to: producers and directory members are summed
/// per role.
fn role_of(process: &str) -> String {
    if process.starts_with("scale-p") {
        "producers (sum)".into()
    } else if process.starts_with("directory-") {
        "directory (sum of 3)".into()
    } else {
        process.to_string()
    }
}

/// CPU (% of one core) and peak RSS per role against host count, and latency percentiles
/// against the published rate, one point per scale run.
fn plot_steps(dir: &Path, reports: &[serde_json::Value]) -> anyhow::Result<Vec<PathBuf>> {
    let mut cpu: Vec<Series> = Vec::new();
    let mut rss: Vec<Series> = Vec::new();
    for r in reports {
        let hosts = r["hosts"].as_f64().unwrap_or(0.0);
        let mut sums: Vec<(String, f64, f64)> = Vec::new();
        for p in r["processes"].as_array().into_iter().flatten() {
            let role = role_of(p["name"].as_str().unwrap_or("?"));
            let secs = r["duration_s"].as_f64().unwrap_or(1.0).max(1e-9);
            let c = 100.0 * p["cpu_seconds"].as_f64().unwrap_or(0.0) / secs;
            let m = p["rss_mib_peak"]
                .as_f64()
                .or(p["rss_mib_end"].as_f64())
                .unwrap_or(0.0);
            match sums.iter_mut().find(|s| s.0 == role) {
                Some(s) => (s.1, s.2) = (s.1 + c, s.2 + m),
                None => sums.push((role, c, m)),
            }
        }
        for (role, c, m) in sums {
            for (set, v) in [(&mut cpu, c), (&mut rss, m)] {
                match set.iter_mut().find(|s| s.name == role) {
                    Some(s) => s.points.push((hosts, v)),
                    None => set.push(Series {
                        name: role.clone(),
                        points: vec![(hosts, v)],
                    }),
                }
            }
        }
    }
    let lat: Vec<Series> = [("p50", "p50"), ("p99", "p99"), ("p99.9", "p999")]
        .iter()
        .map(|(name, key)| Series {
            name: format!("{name} sample -> consumer"),
            points: reports
                .iter()
                .map(|r| {
                    (
                        r["events_per_s_published"].as_f64().unwrap_or(0.0),
                        r["latency_ms"][key].as_f64().unwrap_or(f64::NAN),
                    )
                })
                .collect(),
        })
        .collect();
    let mut out = Vec::new();
    for (name, title, x, y, series) in [
        (
            "scale-cpu-vs-hosts.svg",
            "CPU per role against host count",
            "simulated hosts",
            "CPU, % of one core",
            &cpu,
        ),
        (
            "scale-rss-vs-hosts.svg",
            "Peak RSS per role against host count",
            "simulated hosts",
            "RSS, MiB",
            &rss,
        ),
        (
            "scale-latency-vs-rate.svg",
            "Latency sample -> consumer against published rate",
            "events/s published",
            "latency, ms",
            &lat,
        ),
    ] {
        let f = crate::plot::file_in(dir, name)?;
        crate::plot::draw(
            &f,
            &Chart {
                title,
                x_label: x,
                y_label: y,
                series,
            },
        )?;
        out.push(f);
    }
    Ok(out)
}

/// RSS over time of every process of one scale run.
fn plot_timeline(dir: &Path, hosts: u32, t: &Timeline) -> anyhow::Result<PathBuf> {
    let series: Vec<Series> = t
        .series
        .iter()
        .map(|(name, v)| Series {
            name: name.clone(),
            points: v.iter().map(|p| (p.t_s, p.rss_mib)).collect(),
        })
        .collect();
    let f = crate::plot::file_in(dir, &format!("scale-rss-over-time-{hosts}-hosts.svg"))?;
    let title = format!("RSS per process over the run, {hosts} simulated hosts");
    crate::plot::draw(
        &f,
        &Chart {
            title: &title,
            x_label: "seconds since the measurement began",
            y_label: "RSS, MiB",
            series: &series,
        },
    )?;
    Ok(f)
}

/// Records one sample of every running process of the run into `t`.
fn sample_all(t: &mut Timeline, t0: Instant, roles: &[Role], cluster: &Cluster, me: &str) {
    let t_s = t0.elapsed().as_secs_f64();
    for r in roles.iter().filter(|r| r.child.is_some()) {
        t.record(
            &r.name,
            Point {
                t_s,
                cpu_s: r.cpu_total(),
                rss_mib: r.usage.rss_end,
            },
        );
    }
    for (i, u) in cluster.usage_now().into_iter().enumerate() {
        if let Some((cpu_s, rss_mib)) = u {
            t.record(&format!("directory-{}", i + 1), Point { t_s, cpu_s, rss_mib });
        }
    }
    if let Ok((cpu_s, rss_mib)) = proc_usage(me) {
        t.record("bench (consumers)", Point { t_s, cpu_s, rss_mib });
    }
}

pub(crate) async fn scale(o: ScaleOptions) -> anyhow::Result<serde_json::Value> {
    let ScaleOptions {
        hosts,
        producers,
        consumers,
        duration,
        faults: plan,
        consumer_stop_s,
        lossy_keep,
        sample_every,
        plot,
        resume_window_s,
        output,
    } = o;
    if hosts == 0 || producers == 0 || duration == 0 || producers > hosts {
        bail!("--hosts, --producers and --duration must be positive, with no more producers than hosts");
    }
    if lossy_keep == Some(0) {
        bail!("--lossy-keep must be at least 1 (one host.cpu event kept in N)");
    }
    let churn = plan.any();
    let tmp = tempfile::Builder::new().prefix("gma-bench-scale-").tempdir()?;
    let setup = Instant::now();
    let mut cluster = Cluster::start(3).await.context("3-node directory")?;
    cluster.agreed_leader(Duration::from_secs(30), false).await?;
    let dirs = cluster.addrs.join(",");
    let s = |v: &str| v.to_string();
    let np = producers as usize;
    let mut roles: Vec<Role> = Vec::new();
    let mut ids = Vec::new();
    let mut hosts_of = Vec::new();
    // Every producer gets the ring of the busiest one (they differ by one host at most).
    let buffer_events = ring_for_window(hosts.div_ceil(producers), resume_window_s);
    for i in 0..producers {
        let n = hosts / producers + u32::from(i < hosts % producers);
        hosts_of.push(n);
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
            s("--buffer-events"),
            buffer_events.to_string(),
        ];
        roles.push(Role::start(&id, args, Some("gma producer listening on"), false).await?);
        ids.push(id);
    }
    // The archiver keeps everything (no keep rule) and stores each event's run and seq. With
    // archiver kills it checkpoints every D/15 s (at most 20 s, not the default 300 s), so its
    // kills find sealed chunks and a write-ahead tail to replay next to them (rows already
    // sealed are skipped).
    let data = tmp.path().join("archive");
    let keep = match lossy_keep {
        Some(n) => format!("\n[[keep]]\npattern = \"host.cpu\"\nsample_normal = {n}\n"),
        None => String::new(),
    };
    // Without archiver kills it checkpoints as configured by default: a short interval seals
    // every stream's open chunk that often, and the chunk index (one entry per chunk, in memory
    // and in sled) grows that much faster.
    let checkpoint_s = if plan.archiver_kill {
        (duration / 15).clamp(1, 20)
    } else {
        gma_archiver::store::StoreOptions::default()
            .checkpoint_interval
            .as_secs()
    };
    let ia = roles.len();
    roles.push(
        start_archiver(
            "archiver",
            &tmp.path().join("archiver.toml"),
            format!(
                "directory = {dirs:?}\ndata_dir = {:?}\n{keep}\n[store]\ncheckpoint_interval_s = {checkpoint_s}\n",
                data.display().to_string()
            ),
        )
        .await?,
    );
    roles.push(
        Role::start(
            "broker",
            vec![
                s("broker"),
                s("--listen"),
                s("127.0.0.1:0"),
                s("--directory"),
                dirs.clone(),
            ],
            Some("gma broker listening on"),
            false,
        )
        .await?,
    );
    // The consumer process stopped with SIGSTOP: host.* of the last producer, drop-oldest, a
    // queue of 4 s of that producer's events (3 events per host per second).
    let stopped_producer = np - 1;
    let stop_queue = u64::from(hosts_of[stopped_producer]) * 3 * 4;
    let ic = roles.len();
    if plan.consumer_stop {
        roles.push(
            Role::start(
                "consumer (gma subscribe, SIGSTOP)",
                vec![
                    s("subscribe"),
                    s("host.*"),
                    s("--directory"),
                    dirs.clone(),
                    s("--source"),
                    format!("p{stopped_producer}h*"),
                    s("--policy"),
                    s("drop-oldest"),
                    s("--queue-events"),
                    stop_queue.to_string(),
                    s("--output"),
                    s("json"),
                ],
                None,
                true,
            )
            .await?,
        );
    }

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
    // (producer, epoch) -> the highest seq any consumer was sent past (its resume point - 1):
    // that run published at least this far.
    let heads: Arc<Mutex<HashMap<(String, u64), u64>>> = Arc::new(Mutex::new(HashMap::new()));
    let recording = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..consumers as usize {
        let (figures, seen, recording, restart_at, heads) = (
            figures.clone(),
            seen.clone(),
            recording.clone(),
            restart_at.clone(),
            heads.clone(),
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
                        {
                            let mut h = heads.lock();
                            let e = h.entry((producer.clone(), resume.epoch)).or_insert(0);
                            *e = (*e).max(resume.next_seq.saturating_sub(1));
                        }
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
    // Warm-up: every consumer follows every producer, the archiver receives from every
    // producer, the consumer process prints events.
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.lock().iter().any(|s| s.len() < np)
        || roles
            .get(ic)
            .and_then(|r| r.printed.as_ref())
            .is_some_and(|p| p.lock().events == 0)
    {
        if Instant::now() > deadline {
            bail!("the consumers did not reach every producer within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_following(&roles[ia].addr, &ids, Duration::from_secs(120)).await?;
    wait_broker_view(&roles[ia + 1].addr, hosts, Duration::from_secs(120)).await?;
    let setup_s = setup.elapsed().as_secs_f64();
    for r in &mut roles {
        r.sample();
        r.usage.cpu_start = r.usage.cpu_end;
        r.usage.rss_start = r.usage.rss_end;
    }
    let dir_cpu0 = cluster.cpu_total();
    let me = std::process::id().to_string();
    let (me_cpu0, me_rss0) = proc_usage(&me)?;
    let dir_status0 = directory_status(&dirs).await.ok();
    let arch_stats0 = archive_stats(&roles[ia].addr).await.ok();
    recording.store(true, std::sync::atomic::Ordering::Relaxed);

    // The fault schedule.
    let d = Duration::from_secs(duration);
    let mut plan_steps: Vec<(Duration, Step)> = Vec::new();
    if plan.archiver_kill {
        let down = Duration::from_secs(5).min(d / 10);
        plan_steps.push((d / 10, Step::ArchiverKill { down }));
        plan_steps.push((d.mul_f64(0.85), Step::ArchiverKill { down: Duration::ZERO }));
    }
    if plan.consumer_stop {
        let for_s = consumer_stop_s.unwrap_or((duration as f64 / 6.0).min(40.0));
        plan_steps.push((d.mul_f64(0.15), Step::ConsumerStop { for_s }));
    }
    if plan.producer_restart {
        plan_steps.push((d / 3, Step::ProducerRestart));
    }
    if plan.leader_kill {
        plan_steps.push((d / 2, Step::LeaderKill));
    }
    if plan.producer_kill {
        plan_steps.push((
            d.mul_f64(0.7),
            Step::ProducerKill {
                producer: usize::from(np > 1),
            },
        ));
    }
    plan_steps.sort_by_key(|p| p.0);
    let mut steps: std::collections::VecDeque<(Duration, Step)> = plan_steps.into();

    let t0 = Instant::now();
    let end = t0 + d;
    let every = Duration::from_secs(sample_every.unwrap_or(duration / 100).clamp(1, u64::MAX));
    let every = if sample_every.is_some() {
        every
    } else {
        every.min(Duration::from_secs(10))
    };
    let mut timeline = Timeline::new(every.as_secs_f64());
    sample_all(&mut timeline, t0, &roles, &cluster, &me);
    let mut next_sample = t0 + every;
    let mut faults: Vec<Fault> = Vec::new();
    let mut failover_ms = None;
    // Open faults: index into `faults` of the stopped consumer's and the killed leader's.
    let mut open_stop: Option<(usize, Instant)> = None;
    let mut open_leader: Option<usize> = None;
    // When each archiver after the first started.
    let mut archiver_starts: Vec<Instant> = Vec::new();
    let mut killed_runs: HashMap<(String, u64), u64> = HashMap::new();
    while Instant::now() < end || !steps.is_empty() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        for r in &mut roles {
            r.sample();
        }
        if Instant::now() >= next_sample {
            sample_all(&mut timeline, t0, &roles, &cluster, &me);
            while next_sample <= Instant::now() {
                next_sample += every;
            }
        }
        let elapsed = t0.elapsed();
        let Some(&(when, step)) = steps.front() else {
            continue;
        };
        if elapsed < when {
            continue;
        }
        // Every planned fault runs, in order, even when earlier ones ran late (a short run then
        // lasts longer than --duration; `duration_s` says how long).
        steps.pop_front();
        match step {
            Step::ArchiverKill { down } => {
                let a = &mut roles[ia];
                // Aimed at ingest in progress: the kill follows the moment the archiver notes a
                // new group (before it appends and fsyncs it).
                let noted = ingest_moves(&a.addr, Duration::from_secs(3)).await;
                let mut f = Fault::new("archiver_kill9", "archiver", t0);
                a.kill9().await?;
                let killed = Instant::now();
                f.set("aimed_at_ingest", json!(noted.is_some()));
                tokio::time::sleep(down).await;
                a.spawn().await?;
                archiver_starts.push(a.started);
                let restarted = killed.elapsed();
                let resumed = wait_following(&a.addr, &ids, Duration::from_secs(120)).await?;
                if let (Some(b), Ok(after)) = (&noted, archive_stats(&a.addr).await) {
                    f.set("redelivered_after_restart", json!(redelivered(b, &after)));
                }
                f.end_ns = now_ns();
                f.set("down_s", json!(down.as_secs_f64()));
                f.set("restarted_after_ms", json!(restarted.as_secs_f64() * 1e3));
                f.set(
                    "resumed_every_producer_after_ms",
                    json!(resumed.duration_since(killed).as_secs_f64() * 1e3),
                );
                faults.push(f);
            }
            Step::ConsumerStop { for_s } => {
                let mut f = Fault::new("consumer_sigstop", &roles[ic].name, t0);
                roles[ic].signal("STOP").await?;
                let before = roles[ic].printed.as_ref().map_or(0, |p| p.lock().events);
                f.set("planned_stop_s", json!(for_s));
                f.set("follows", json!(format!("host.* of {}", ids[stopped_producer])));
                f.set("policy", json!("drop-oldest"));
                f.set("queue_events", json!(stop_queue));
                f.set("events_printed_before", json!(before));
                faults.push(f);
                open_stop = Some((faults.len() - 1, Instant::now()));
                let at = t0.elapsed() + Duration::from_secs_f64(for_s);
                let i = steps.partition_point(|s| s.0 <= at);
                steps.insert(i, (at, Step::ConsumerCont));
            }
            Step::ConsumerCont => {
                roles[ic].signal("CONT").await?;
                if let Some((i, _)) = open_stop {
                    faults[i].end_ns = now_ns();
                }
                // The gap reports are collected at the end (they come after the backlog).
                open_stop = open_stop.map(|(i, _)| (i, Instant::now()));
            }
            Step::ProducerRestart => {
                let mut f = Fault::new("producer_restart_sigterm", &ids[0], t0);
                let p0 = &mut roles[0];
                p0.terminate().await?;
                let old = p0.runs().pop();
                *restart_at.lock() = Some((Instant::now(), old.as_ref().map_or(0, |r| r.epoch)));
                p0.spawn().await?;
                f.end_ns = now_ns();
                if let Some(r) = old {
                    f.set("old_epoch", json!(r.epoch));
                    f.set("old_last_seq", json!(r.stop.map(|l| l.0)));
                }
                f.set("new_epoch", json!(p0.runs().pop().map(|r| r.epoch)));
                faults.push(f);
            }
            Step::LeaderKill => {
                let leader = cluster.agreed_leader(Duration::from_secs(10), false).await?;
                let mut f = Fault::new("directory_leader_kill9", &format!("directory-{}", leader + 1), t0);
                let mut c = cluster.take_for_kill(leader)?;
                let _ = c.start_kill();
                let _ = c.wait().await;
                let at = Instant::now();
                if cluster
                    .agreed_leader(Duration::from_secs(30), false)
                    .await
                    .is_ok()
                {
                    failover_ms = Some(at.elapsed().as_secs_f64() * 1e3);
                }
                f.set("failover_ms", json!(failover_ms));
                faults.push(f);
                open_leader = Some(faults.len() - 1);
                let back = t0.elapsed().max(at.duration_since(t0) + Duration::from_secs(3));
                let i = steps.partition_point(|s| s.0 <= back);
                steps.insert(i, (back, Step::LeaderRejoin { member: leader }));
            }
            Step::LeaderRejoin { member } => {
                cluster.spawn(member, false).await?;
                if let Some(i) = open_leader {
                    let f = &mut faults[i];
                    f.end_ns = now_ns();
                    let after = (f.end_ns - f.start_ns) as f64 / 1e9;
                    f.set("restarted_after_s", json!(after));
                }
            }
            Step::ProducerKill { producer } => {
                let mut f = Fault::new("producer_kill9", &ids[producer], t0);
                let p = &mut roles[producer];
                // What it published just before: a lower bound of its run's last seq.
                let head = producer_head(&p.addr).await.ok();
                p.kill9().await?;
                let epoch = p.runs().pop().map(|r| r.epoch);
                p.spawn().await?;
                f.end_ns = now_ns();
                if let Some(e) = epoch {
                    let h = head.filter(|h| h.0 == e).map_or(0, |h| h.1);
                    killed_runs.insert((ids[producer].clone(), e), h);
                    f.set("epoch", json!(e));
                    f.set("head_before_kill", json!(h));
                }
                f.set("new_epoch", json!(p.runs().pop().map(|r| r.epoch)));
                faults.push(f);
            }
        }
    }
    recording.store(false, std::sync::atomic::Ordering::Relaxed);
    sample_all(&mut timeline, t0, &roles, &cluster, &me);
    // Drawn now: a long soak's figure survives a failure of the end phase.
    let plotted = match &plot {
        Some(dir) => Some(plot_timeline(dir, hosts, &timeline)?),
        None => None,
    };
    let seconds = t0.elapsed().as_secs_f64();
    let (me_cpu1, me_rss1) = proc_usage(&me)?;
    let dir_cpu = cluster.cpu_total() - dir_cpu0;
    for t in &tasks {
        t.abort();
    }
    // The directory, the archiver and the broker as the run left them (producers still up).
    let directory = directory_figures(&dir_status0, &directory_status(&dirs).await.ok());
    roles[ia].sample();
    let archiver = archiver_figures(
        &arch_stats0,
        &archive_stats(&roles[ia].addr).await.ok(),
        roles[ia].cpu_total(),
    );
    let broker = broker_decisions(&roles[ia + 1].addr, BROKER_DECISIONS, hosts).await?;

    // Before the producers stop (and their rings with them), the archiver catches up with
    // what each had published when the measurement ended: its lag is a figure, not a loss.
    let lag = archiver_catch_up(&roles[ia].addr, &roles[..np]).await;
    // Stop every producer (each prints its last seq), then wait for the archiver to have
    // received every run that ended while it ran (its Stats: a wait condition, not the check).
    for r in roles.iter_mut().take(np) {
        r.terminate().await?;
    }
    let last_start = archiver_starts.last().copied();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = archive_stats(&roles[ia].addr).await?;
        let behind: Vec<String> = roles
            .iter()
            .take(np)
            .flat_map(Role::runs)
            .filter_map(|r| {
                let (n, ended) = r.stop?;
                if last_start.is_some_and(|s| ended < s) {
                    return None;
                }
                let got = st
                    .received
                    .iter()
                    .find(|x| x.producer == r.producer && x.epoch == r.epoch)
                    .map_or(0, |x| x.last_seq);
                (got < n).then(|| format!("{} epoch {}: {got} of {n}", r.producer, r.epoch))
            })
            .collect();
        if behind.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            tracing::warn!(
                ?behind,
                "the archiver did not receive every run within 60 s; checking what it holds"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The consumer process: the drops its producer reported to it after SIGCONT (until that
    // producer was restarted or killed).
    if let Some((i, cont)) = open_stop {
        let followed = &ids[stopped_producer];
        let until = faults
            .iter()
            .filter(|f| f.start_ns > faults[i].end_ns && &f.target == followed)
            .map(|f| cont + Duration::from_nanos((f.start_ns - faults[i].end_ns).max(0) as u64))
            .min();
        let c = &mut roles[ic];
        // Drops have a seq range; a restart's gap ("producer restarted ...") has none.
        let gaps = c.lines_between(&format!("gap from {followed}: seqs "), cont, until);
        let (events, max_seq) = c.printed.as_ref().map_or((0, 0), |p| {
            let p = p.lock();
            (p.events, p.max_seq)
        });
        let alive = c
            .child
            .as_mut()
            .is_some_and(|ch| matches!(ch.try_wait(), Ok(None)));
        let f = &mut faults[i];
        let before = f
            .detail
            .get("events_printed_before")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        f.set("gaps_reported_to_it", json!(gaps.len()));
        f.set(
            "events_reported_lost_to_it",
            json!(gaps.iter().filter_map(|l| gap_events(l)).sum::<u64>()),
        );
        f.set("gap_lines", json!(gaps.iter().take(4).collect::<Vec<_>>()));
        f.set("events_printed_after", json!(events.saturating_sub(before)));
        f.set("highest_seq_printed", json!(max_seq));
        f.set("alive_at_end", json!(alive));
    }
    if plan.consumer_stop {
        let _ = roles[ic].kill9().await;
    }

    // The archiver stops cleanly (flush, checkpoint) and starts again on its data, alone: the
    // read-back sees what the store reopens from disk.
    let archiver_stop_s = roles[ia].terminate_within(ARCHIVER_END_WAIT).await?;
    if archiver_stop_s.is_none() {
        tracing::warn!(
            "the archiver did not stop within {ARCHIVER_END_WAIT:?} of SIGTERM: killed; the read-back replays its write-ahead log"
        );
    }
    let mut reader = start_archiver(
        "archiver (read-back)",
        &tmp.path().join("archiver-readback.toml"),
        format!("data_dir = {:?}\n", data.display().to_string()),
    )
    .await?;
    let read_started = Instant::now();
    let (mut archived, malformed) = tokio::time::timeout(Duration::from_secs(600), read_back(&reader.addr))
        .await
        .map_err(|_| anyhow!("reading the archive back took more than 600 s"))??;
    let read_back_s = read_started.elapsed().as_secs_f64();
    let rows_read: usize = archived.values().map(Vec::len).sum();
    let _ = reader.terminate().await;
    let archiver_lines = roles[ia].lines_between("", t0, None);
    for r in roles.iter_mut().skip(np) {
        r.sample();
        let _ = r.terminate().await;
    }
    let (dir_cpu_each, dir_rss) = cluster.stop().await;

    // The accounting, per run.
    let heads = heads.lock().clone();
    let seen: Vec<RunSeen> = roles.iter().take(np).flat_map(Role::runs).collect();
    // The fastest publishing rate of a run that stopped (seqs over its lifetime).
    let rate_max = seen
        .iter()
        .filter_map(|r| {
            let (n, ended) = r.stop?;
            let lived = ended.saturating_duration_since(r.started).as_secs_f64();
            (lived >= 1.0).then(|| n as f64 / lived)
        })
        .fold(0.0, f64::max);
    let runs = account(&seen, &mut archived, &killed_runs, &heads, &mut faults);
    let unknown_runs: Vec<String> = archived
        .keys()
        .filter(|(p, _)| ids.contains(p))
        .map(|(p, e)| format!("{p}/{e}"))
        .collect();
    let published: u64 = runs.iter().map(|r| r.last).sum();
    let held: u64 = runs.iter().map(|r| r.check.held).sum();
    let tails: u64 = runs.iter().map(|r| r.undelivered_tail).sum();
    let missing: u64 = runs.iter().map(|r| r.check.missing - r.undelivered_tail).sum();
    let duplicated: u64 = runs.iter().map(|r| r.check.duplicated).sum();
    let outside: u64 = runs.iter().map(|r| r.check.outside).sum();
    let blamed_missing: u64 = faults.iter().map(|f| f.missing).sum();
    let blamed_dup: u64 = faults.iter().map(|f| f.duplicated).sum();
    for f in &mut faults {
        if f.kind == "producer_kill9" {
            let tail: u64 = runs
                .iter()
                .filter(|r| r.end == END_KILLED && r.producer == f.target)
                .map(|r| r.undelivered_tail)
                .sum();
            f.set("undelivered_tail", json!(tail));
        }
    }
    let archiver_gaps: Vec<&String> = archiver_lines
        .iter()
        .filter(|l| l.contains("events lost before reaching the archiver"))
        .collect();

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
    // The resume window: the ring of the fastest producer, in seconds of its events.
    let window_s = buffer_events as f64 / rate_max.max(1e-9);
    let outage_max_s = faults
        .iter()
        .filter(|f| f.kind == "archiver_kill9")
        .filter_map(|f| {
            f.detail
                .get("resumed_every_producer_after_ms")
                .and_then(|v| v.as_f64())
        })
        .fold(0.0, f64::max)
        / 1e3;
    let procs: Vec<serde_json::Value> = roles
        .iter()
        .map(|r| {
            json!({
                "name": r.name, "starts": r.starts, "cpu_seconds": r.cpu_total(), "cpu_pct": 100.0 * r.cpu_total() / seconds,
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
    let runs_json: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            json!({
                "producer": r.producer, "epoch": r.epoch, "end": r.end,
                "last_seq": r.last, "last_seq_from": r.last_from,
                "held": r.check.held, "missing": r.check.missing - r.undelivered_tail,
                "undelivered_tail": r.undelivered_tail, "duplicated": r.check.duplicated,
                "outside_1_to_last": r.check.outside,
                "missing_ranges": r.check.missing_ranges.iter().take(RANGES_LISTED).map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
                "missing_range_count": r.check.missing_ranges.len(),
                "duplicated_seqs": r.check.duplicated_seqs.iter().take(RANGES_LISTED).collect::<Vec<_>>(),
            })
        })
        .collect();
    let faults_json: Vec<serde_json::Value> = faults
        .iter()
        .map(|f| {
            let mut m = serde_json::Map::new();
            m.insert("kind".into(), json!(f.kind));
            m.insert("target".into(), json!(f.target));
            m.insert("at_s".into(), json!(f.at_s));
            m.insert("lasted_s".into(), json!((f.end_ns - f.start_ns) as f64 / 1e9));
            m.insert(
                "loss_attributed".into(),
                json!({"missing": f.missing, "duplicated": f.duplicated}),
            );
            m.extend(f.detail.clone());
            serde_json::Value::Object(m)
        })
        .collect();
    let report = json!({
        "scenario": "scale",
        "machine_cores": cores(),
        "duration_s": seconds,
        "setup_s": setup_s,
        "hosts": hosts, "producers": producers, "consumers": consumers, "churn": churn,
        "lossy_keep": lossy_keep,
        "archiver_checkpoint_s": checkpoint_s,
        "loss": {
            "checked_by": "Archive.Query read-back of every row's _gma_run/_gma_seq after the archiver restarted on its data",
            "published": published,
            "held": held,
            "missing_at_archiver": missing,
            "duplicated_at_archiver": duplicated,
            "undelivered_tail": tails,
            "outside_published": outside,
            "malformed_rows": malformed,
            "unknown_runs": unknown_runs,
            "unattributed": {"missing": missing - blamed_missing.min(missing), "duplicated": duplicated - blamed_dup.min(duplicated)},
            "archiver_gaps_logged": archiver_gaps.len(),
            "archiver_gap_lines": archiver_gaps.iter().take(6).collect::<Vec<_>>(),
            "consumer_gap_events": consumer_gaps,
            "rows_read_back": rows_read,
            "read_back_s": read_back_s,
            "runs": runs_json,
        },
        "faults": faults_json,
        "resume_window": {
            "buffer_events": buffer_events,
            "planned_window_s": resume_window_s,
            "fastest_producer_events_per_s": rate_max,
            "window_s": window_s,
            "longest_archiver_outage_s": outage_max_s,
        },
        "delivered_to_consumers": delivered,
        "events_per_s_published": published as f64 / (seconds + setup_s).max(1e-9),
        "latency_ms": {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": lat.max() as f64 / 1000.0, "samples": lat.len()},
        "directory_cpu_pct": 100.0 * dir_cpu / seconds,
        "directory": directory,
        "archiver": archiver,
        "archiver_end": {
            "catch_up": lag,
            "clean_stop_s": archiver_stop_s,
        },
        "broker_decisions": broker,
        "leader_failover_ms": failover_ms,
        "consumer_recovery_ms": {
            "consumers": recovery.len(), "p50": pct(&recovery, 0.5), "max": pct(&recovery, 1.0),
        },
        "processes": procs,
        "rss_timeline": timeline.to_json(),
    });
    match output {
        Output::Json => crate::report::emit(report.clone()),
        Output::Table => {
            println!(
                "scale: {hosts} simulated hosts in {producers} producer processes, 3-node directory, archiver, broker, {consumers} consumers, {seconds:.0} s ({} cores){}",
                cores(),
                if churn { ", with faults" } else { "" }
            );
            println!(
                "  loss, read back per seq ({rows_read} rows in {read_back_s:.1} s): {published} published in {} runs, {held} held, {missing} missing, {duplicated} duplicated, {tails} undelivered by killed producers",
                runs.len()
            );
            for r in &runs {
                println!(
                    "    {} epoch {} ({}): 1..={} ({}), held {}, missing {}{}, duplicated {}, tail {}",
                    r.producer,
                    r.epoch,
                    r.end,
                    r.last,
                    r.last_from,
                    r.check.held,
                    r.check.missing - r.undelivered_tail,
                    if r.check.missing_ranges.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " {:?}",
                            &r.check.missing_ranges[..r.check.missing_ranges.len().min(RANGES_LISTED)]
                        )
                    },
                    r.check.duplicated,
                    r.undelivered_tail
                );
            }
            for f in &faults_json {
                println!("  fault {f}");
            }
            println!(
                "  resume window {window_s:.0} s ({buffer_events} events at {rate_max:.0}/s, planned {resume_window_s} s); longest archiver outage {outage_max_s:.1} s; consumer gaps {consumer_gaps}"
            );
            println!("  archiver at the end: {}", report["archiver_end"]);
            println!(
                "  latency sample -> consumer: p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms ({} samples)",
                q(0.5),
                q(0.99),
                q(0.999),
                lat.max() as f64 / 1000.0,
                lat.len()
            );
            println!(
                "  directory CPU {:.1}% of one core (3 nodes); {}",
                100.0 * dir_cpu / seconds,
                report["directory"]
            );
            println!("  archiver {}", report["archiver"]);
            println!("  broker decisions {}", report["broker_decisions"]);
            if plan.producer_restart {
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
            println!(
                "  RSS growth over the last half of the run ({} samples every {:.0} s; the issue asks < 5 %):",
                timeline.series.iter().map(|(_, v)| v.len()).max().unwrap_or(0),
                timeline.every_s
            );
            for g in timeline.growth_last_half() {
                println!(
                    "    {}: {:.1} -> {:.1} MiB ({:+.1} %), highest {:.1} MiB ({:+.1} %)",
                    g.name, g.rss_mib_at_half, g.rss_mib_end, g.growth_pct, g.rss_mib_max, g.max_growth_pct
                );
            }
        }
    }
    if let Some(f) = plotted {
        eprintln!("gma bench scale: wrote {}", f.display());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_labels_are_run_length_coded_across_pieces() {
        let mut r = Vec::new();
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        push_runs(&mut r, v(&["a", "a", "b"]));
        push_runs(&mut r, v(&["b", "b", "a"]));
        push_runs(&mut r, Vec::new());
        assert_eq!(
            r,
            vec![("a".to_string(), 2), ("b".to_string(), 3), ("a".to_string(), 1)]
        );
    }

    #[test]
    fn a_view_short_of_the_hosts_is_an_error() {
        assert!(short_view(10_000, 10_000, "now").is_none());
        let e = short_view(0, 10_000, "now").unwrap().to_string();
        assert!(e.contains("holds 0 of the 10000 simulated hosts now"), "{e}");
        assert!(short_view(9_999, 10_000, "now").is_some());
    }

    #[test]
    fn the_ring_holds_the_resume_window() {
        // 2,500 hosts: 7,542 events/s; 30 s of them.
        assert_eq!(ring_for_window(2_500, 30), 226_250);
        // 25,000 hosts (100,000 in 4 producers): 30 s is 2.3 M events.
        assert_eq!(ring_for_window(25_000, 30), 2_262_500);
        assert_eq!(ring_for_window(10, 30), MIN_BUFFER_EVENTS);
    }

    #[test]
    fn a_complete_run_checks_clean() {
        let mut s: Vec<u64> = (1..=1000).rev().collect();
        let c = check_run(&mut s, 1000);
        assert_eq!(
            c,
            RunCheck {
                held: 1000,
                max_held: 1000,
                ..RunCheck::default()
            }
        );
    }

    #[test]
    fn holes_duplicates_and_strays_are_counted() {
        // 1..=20 less 3, 7..=9 and 20; 5 twice, 11 three times; 0 and 25 are not of the run.
        let mut s: Vec<u64> = (1..=20)
            .filter(|x| ![3, 7, 8, 9, 20].contains(x))
            .chain([5, 11, 11, 0, 25])
            .collect();
        let c = check_run(&mut s, 20);
        assert_eq!(c.missing, 5);
        assert_eq!(c.missing_ranges, vec![(3, 3), (7, 9), (20, 20)]);
        assert_eq!(c.duplicated, 3);
        assert_eq!(c.duplicated_seqs, vec![5, 11]);
        assert_eq!(c.outside, 2);
        assert_eq!(c.held, 15);
        assert_eq!(c.max_held, 19);
    }

    #[test]
    fn nothing_held_is_all_missing() {
        let c = check_run(&mut [], 7);
        assert_eq!(
            (c.missing, c.missing_ranges.clone(), c.held),
            (7, vec![(1, 7)], 0)
        );
        let c = check_run(&mut [], 0);
        assert_eq!(c, RunCheck::default());
    }

    /// Every multiset of seqs from 1..=7 (each 0, 1 or 2 times, plus a stray 9) against a
    /// plain count: held + missing = last, the ranges are exactly the absent seqs, duplicates
    /// are the extra copies.
    #[test]
    fn check_run_agrees_with_counting_on_every_small_case() {
        let last = 7u64;
        for code in 0..3u32.pow(last as u32) {
            let mut times = vec![0u64; last as usize + 1];
            let mut seqs = vec![9];
            let mut c = code;
            for s in 1..=last {
                times[s as usize] = u64::from(c % 3);
                c /= 3;
                seqs.extend(std::iter::repeat_n(s, times[s as usize] as usize));
            }
            seqs.reverse();
            let r = check_run(&mut seqs, last);
            let absent: Vec<u64> = (1..=last).filter(|s| times[*s as usize] == 0).collect();
            let from_ranges: Vec<u64> = r.missing_ranges.iter().flat_map(|(a, b)| *a..=*b).collect();
            assert_eq!(from_ranges, absent, "case {code}");
            assert_eq!(r.missing, absent.len() as u64);
            assert_eq!(r.held + r.missing, last);
            assert_eq!(
                r.duplicated,
                times.iter().map(|t| t.saturating_sub(1)).sum::<u64>()
            );
            assert_eq!(r.outside, 1);
            assert!(
                r.missing_ranges.windows(2).all(|w| w[0].1 + 1 < w[1].0),
                "ranges merged"
            );
        }
    }

    fn fault(start: i64, end: i64) -> Fault {
        Fault {
            kind: "x",
            target: String::new(),
            at_s: 0.0,
            start_ns: start,
            end_ns: end,
            detail: Default::default(),
            missing: 0,
            duplicated: 0,
        }
    }

    #[test]
    fn a_killed_runs_tail_is_undelivered_and_a_hole_is_loss_blamed_on_its_fault() {
        const S: i64 = 1_000_000_000;
        let now = Instant::now();
        let seen = vec![
            RunSeen {
                producer: "p0".into(),
                epoch: 1,
                started: now,
                stop: Some((10, now)),
            },
            RunSeen {
                producer: "p1".into(),
                epoch: 2,
                started: now,
                stop: None,
            },
        ];
        // p0: 1..=10 but 4..=5 (sampled at 4 s and 5 s), and 7 twice. p1: 1..=6, killed after
        // publishing 9 (its head read before the kill).
        let mut archived: HashMap<(String, u64), Vec<(u64, i64)>> = HashMap::new();
        archived.insert(
            ("p0".into(), 1),
            [1, 2, 3, 6, 7, 7, 8, 9, 10]
                .iter()
                .map(|&q| (q, q as i64 * S))
                .collect(),
        );
        archived.insert(("p1".into(), 2), (1..=6).map(|q| (q, q as i64 * S)).collect());
        archived.insert(("p9".into(), 3), vec![(1, 0)]);
        let killed = HashMap::from([(("p1".to_string(), 2), 9)]);
        let heads = HashMap::from([(("p1".to_string(), 2), 8)]);
        // A fault from 2.5 s to 3.5 s; another long after.
        let mut faults = vec![fault(2 * S + S / 2, 3 * S + S / 2), fault(500 * S, 501 * S)];
        let runs = account(&seen, &mut archived, &killed, &heads, &mut faults);
        assert_eq!(runs.len(), 2);
        let (p0, p1) = (&runs[0], &runs[1]);
        assert_eq!(
            (p0.end, p0.last, p0.check.missing, p0.check.duplicated),
            (END_STOPPED, 10, 2, 1)
        );
        assert_eq!(p0.check.missing_ranges, vec![(4, 5)]);
        assert_eq!(p0.undelivered_tail, 0);
        assert_eq!(
            (p1.end, p1.last, p1.check.missing, p1.undelivered_tail),
            (END_KILLED, 9, 3, 3)
        );
        // The hole follows seq 3 (3 s): the first fault; so does the duplicate (7 s).
        assert_eq!((faults[0].missing, faults[0].duplicated), (2, 1));
        assert_eq!((faults[1].missing, faults[1].duplicated), (0, 0));
        // Runs of other producers are left in `archived`.
        assert_eq!(archived.len(), 1);
    }

    #[test]
    fn redelivered_counts_what_the_killed_archiver_had_noted_again() {
        let rec = |p: &str, epoch, last_seq, events| pb::ArchiveReceived {
            producer: p.into(),
            epoch,
            last_seq,
            events,
        };
        let before = pb::ArchiveStatsResponse {
            received: vec![rec("p0", 1, 100, 100), rec("p1", 1, 50, 50)],
            ..Default::default()
        };
        // p0 resumed at 91 (90 durable: 10 again), p1 at 51 (nothing again), p2 unknown before.
        let after = pb::ArchiveStatsResponse {
            received: vec![rec("p0", 1, 120, 30), rec("p1", 1, 60, 10), rec("p2", 1, 9, 9)],
            ..Default::default()
        };
        assert_eq!(redelivered(&before, &after), 10);
    }

    #[test]
    fn losses_are_blamed_on_the_fault_whose_window_holds_them() {
        let mk = |start: i64, end: i64| Fault {
            kind: "x",
            target: String::new(),
            at_s: 0.0,
            start_ns: start,
            end_ns: end,
            detail: Default::default(),
            missing: 0,
            duplicated: 0,
        };
        let s = 1_000_000_000;
        let f = vec![mk(100 * s, 105 * s), mk(120 * s, 121 * s)];
        assert_eq!(blame(&f, 50 * s), None);
        assert_eq!(blame(&f, 101 * s), Some(0));
        assert_eq!(blame(&f, 99 * s + 1), Some(0));
        // Inside both widened windows: the later fault.
        assert_eq!(blame(&f, 125 * s), Some(1));
        assert_eq!(blame(&f, 152 * s), None);
        let rows = [(1, 10), (2, 20), (5, 50)];
        assert_eq!(time_near(&rows, 3), Some(20));
        assert_eq!(time_near(&rows, 1), Some(10));
        assert_eq!(time_near(&rows, 9), Some(50));
        assert_eq!(time_near(&[], 9), None);
    }
}
