//! `gma bench directory`: the replicated directory with real `gma directory` processes on
//! 127.0.0.1, 1 node and then 3 nodes, each on fresh temporary data directories.
//!
//! Per node count, in order:
//! - registrations/s with 60 s leases and unique ids, at 1 client and at 64 concurrent clients
//!   (64 tasks over 8 shared HTTP/2 channels), each for `duration` seconds, clients on the
//!   leader; acked/s and per-request latency percentiles of the acked requests;
//! - Search latency: 2,000 linearizable Searches by exact id (`single`) on the leader, and
//!   2,000 `stale_ok` Searches on a follower (on the node itself with 1 node), after 100
//!   unrecorded warm-up requests each, over 100 records registered for them with a 1 h lease
//!   (a 60 s lease can expire before a slow phase ends);
//! - Watch latency: a watcher (on a follower with 3 nodes) from revision 0, after SYNCED; one
//!   writer on the leader registers 1,000 records at one per 2 ms, each carrying its send time
//!   in `attributes["t_ns"]`; latency = receive time - t_ns;
//! - 3 nodes: leader failover over `trials` trials: kill -9 the leader, then register (a new id
//!   per try, alternating between the two survivors, 1 s per-request timeout, retrying at once)
//!   until one write is acked; time = kill -> first acked write. The killed node is restarted on
//!   the same port, data and id. Before each trial every member agrees on the leader and has
//!   the same last log index, all applied: with a restarted member still a few entries behind,
//!   its elections (refused: shorter log) push the term up and the failover takes 3-5 s instead
//!   of ~1.5 s, which would measure that race rather than the failover of a healthy cluster;
//! - CPU seconds and peak RSS of each directory process over the whole run (sampled from /proc
//!   every 250 ms; a killed incarnation counts up to its last sample).
//!
//! Every child process is killed when the run ends, also on error (`kill_on_drop`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_core::addr::PortLease;
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use pb::directory_client::DirectoryClient;
use tokio::process::Child;
use tonic::transport::Channel;

use crate::args::Output;
use crate::report::{cores, proc_usage};

pub(crate) type DirClient = DirectoryClient<Channel>;

/// Lease TTL of every benchmark registration.
const TTL_MS: u64 = 60_000;
/// Concurrent clients of the second throughput phase, and the channels they share.
const CLIENTS: usize = 64;
const CHANNELS: usize = 8;
/// Searches per kind, after the unrecorded warm-up ones.
const SEARCHES: usize = 2_000;
const SEARCH_WARMUP: usize = 100;
/// Records the Searches look up, and their lease (the longest a lease may be).
const SEARCH_SET: usize = 100;
const SEARCH_TTL_MS: u64 = 3_600_000;
/// Records registered while a watcher measures, and their pace.
const WATCH_RECORDS: usize = 1_000;
const WATCH_PERIOD: Duration = Duration::from_millis(2);
/// The per-request timeout of the failover writer.
const FAILOVER_TRY: Duration = Duration::from_secs(1);
/// Longest wait for a node to listen, a leader to be agreed on, a failover write to land.
const START_TIMEOUT: Duration = Duration::from_secs(15);
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
const SCHEMA: &str = "bench.dir";

pub async fn run(duration: u64, trials: u32, output: Output) -> anyhow::Result<()> {
    if duration == 0 {
        bail!("--duration must be positive");
    }
    for nodes in [1usize, 3] {
        let f = scenario(nodes, Duration::from_secs(duration), trials)
            .await
            .with_context(|| format!("directory benchmark with {nodes} node(s)"))?;
        print(&f, output);
    }
    Ok(())
}

/// CPU and memory of one member slot across its incarnations.
#[derive(Default, Clone)]
struct Usage {
    pid: Option<String>,
    /// CPU seconds of earlier (killed) incarnations, at their last sample.
    cpu_done: f64,
    /// CPU seconds of the current incarnation at its last sample.
    cpu_now: f64,
    peak_rss: f64,
}

impl Usage {
    fn sample(&mut self) {
        if let Some(pid) = &self.pid {
            if let Ok((cpu, rss)) = proc_usage(pid) {
                self.cpu_now = cpu;
                self.peak_rss = self.peak_rss.max(rss);
            }
        }
    }

    fn cpu(&self) -> f64 {
        self.cpu_done + self.cpu_now
    }
}

type UsageTable = Arc<Mutex<Vec<Usage>>>;

fn with_usage<R>(u: &UsageTable, f: impl FnOnce(&mut Vec<Usage>) -> R) -> R {
    let mut g = u.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut g)
}

/// `gma directory` member processes. Field order matters: the children (killed on drop) go
/// before the temporary directory holding their data.
pub(crate) struct Cluster {
    nodes: Vec<Option<Child>>,
    pub(crate) addrs: Vec<String>,
    peers: Option<String>,
    usage: UsageTable,
    sampler: tokio::task::JoinHandle<()>,
    tmp: tempfile::TempDir,
    _ports: Vec<PortLease>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.sampler.abort();
        for c in self.nodes.iter_mut().flatten() {
            let _ = c.start_kill();
        }
    }
}

/// `n` loopback ports kept for child processes until the leases are dropped
/// ([`gma_core::addr::reserve_port`]).
pub(crate) fn reserve_ports(n: usize) -> anyhow::Result<Vec<PortLease>> {
    gma_core::addr::reserve_ports(n).context("cannot reserve ports of 127.0.0.1")
}

impl Cluster {
    /// Starts `n` members on reserved ports of 127.0.0.1: the members must know each other's
    /// addresses before they start, so the ports are chosen first and bound later, and the leases
    /// keep every other benchmark or test from them meanwhile.
    pub(crate) async fn start(n: usize) -> anyhow::Result<Cluster> {
        let tmp = tempfile::tempdir().context("cannot create a temporary directory")?;
        let ports = reserve_ports(n)?;
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{}", p.port())).collect();
        let peers = (n > 1).then(|| {
            addrs
                .iter()
                .enumerate()
                .map(|(i, a)| format!("{}={a}", i + 1))
                .collect::<Vec<_>>()
                .join(",")
        });
        let usage: UsageTable = Arc::new(Mutex::new(vec![Usage::default(); n]));
        let sampler = {
            let usage = usage.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    with_usage(&usage, |u| u.iter_mut().for_each(Usage::sample));
                }
            })
        };
        let mut c = Cluster {
            nodes: (0..n).map(|_| None).collect(),
            addrs,
            peers,
            usage,
            sampler,
            tmp,
            _ports: ports,
        };
        for i in 0..n {
            c.spawn(i, n > 1 && i == 0).await?;
        }
        Ok(c)
    }

    /// Starts member `i` (node id i + 1) and waits until it listens.
    pub(crate) async fn spawn(&mut self, i: usize, init: bool) -> anyhow::Result<()> {
        let data = self.tmp.path().join(format!("n{}", i + 1));
        // Every benchmark client is the same anonymous identity on 127.0.0.1: the per-identity
        // rate limit (`[limits]`, 5,000 requests/s by default) would cap the benchmark, not
        // the directory, and etcd has none.
        let config = self.tmp.path().join(format!("n{}.toml", i + 1));
        let toml = format!(
            "data_dir = {:?}\n[limits]\nrequests_per_s = 1e9\nburst = 1e9\n",
            data.display().to_string()
        );
        std::fs::write(&config, toml).context("cannot write the benchmark's directory config")?;
        let mut cmd = crate::child::command()?;
        cmd.arg("directory")
            .arg("--config")
            .arg(&config)
            .args(["--id", &(i + 1).to_string(), "--listen", &self.addrs[i]])
            .arg("--data")
            .arg(&data);
        if let Some(p) = &self.peers {
            cmd.args(["--peers", p]);
        }
        if init {
            cmd.arg("--init");
        }
        let name = format!("directory node {}", i + 1);
        let mut child = cmd.spawn().with_context(|| format!("cannot start {name}"))?;
        let pid = crate::child::pid(&child, &name)?;
        let mut lines = crate::child::stderr_lines(&mut child, &name)?;
        // Owned from here: killed on drop if it does not come up.
        self.nodes[i] = Some(child);
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
                Err(_) => bail!(
                    "directory node {} did not listen within {:?}; stderr: {}",
                    i + 1,
                    START_TIMEOUT,
                    seen.join(" | ")
                ),
                Ok(Err(e)) => bail!("cannot read the stderr of directory node {}: {e}", i + 1),
                Ok(Ok(None)) => bail!(
                    "directory node {} exited before listening; stderr: {}",
                    i + 1,
                    seen.join(" | ")
                ),
                Ok(Ok(Some(l))) => l,
            };
            if line.starts_with("gma directory listening on ") {
                break;
            }
            seen.push(line);
        }
        crate::child::drain(lines);
        with_usage(&self.usage, |u| {
            u[i].pid = Some(pid);
            u[i].cpu_now = 0.0;
            u[i].sample();
        });
        Ok(())
    }

    /// Each member's CPU seconds over its incarnations and its current RSS in MiB (none while
    /// it is down): one sample of a timeline.
    pub(crate) fn usage_now(&self) -> Vec<Option<(f64, f64)>> {
        with_usage(&self.usage, |u| {
            u.iter()
                .map(|m| {
                    let pid = m.pid.as_ref()?;
                    let (cpu, rss) = proc_usage(pid).ok()?;
                    Some((m.cpu_done + cpu, rss))
                })
                .collect()
        })
    }

    /// Takes member `i` out for killing: its usage is sampled one last time first.
    pub(crate) fn take_for_kill(&mut self, i: usize) -> anyhow::Result<Child> {
        with_usage(&self.usage, |u| {
            u[i].sample();
            u[i].cpu_done += u[i].cpu_now;
            u[i].cpu_now = 0.0;
            u[i].pid = None;
        });
        self.nodes[i]
            .take()
            .ok_or_else(|| anyhow!("directory node {} is not running", i + 1))
    }

    /// Kills every member and returns (CPU seconds, peak RSS MiB) per member.
    pub(crate) async fn stop(mut self) -> (Vec<f64>, Vec<f64>) {
        for i in 0..self.nodes.len() {
            if let Ok(mut c) = self.take_for_kill(i) {
                let _ = c.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
            }
        }
        with_usage(&self.usage, |u| {
            (
                u.iter().map(Usage::cpu).collect(),
                u.iter().map(|x| x.peak_rss).collect(),
            )
        })
    }

    pub(crate) fn cpu_total(&self) -> f64 {
        with_usage(&self.usage, |u| {
            u.iter_mut().for_each(Usage::sample);
            u.iter().map(Usage::cpu).sum()
        })
    }

    fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_some())
            .collect()
    }

    /// The leader's index once every live member reports the same live leader and, with
    /// `caught_up`, the same last log index, all of it applied (no member lags behind).
    pub(crate) async fn agreed_leader(&self, timeout: Duration, caught_up: bool) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut seen = Vec::new();
            for i in self.live() {
                seen.push(
                    status(&self.addrs[i])
                        .await
                        .map(|s| (s.leader_id, s.last_log, s.last_applied))
                        .unwrap_or_default(),
                );
            }
            if let Some(&(first, log, _)) = seen.first() {
                let idx = (first as usize).wrapping_sub(1);
                let agreed = first != 0 && seen.iter().all(|s| s.0 == first) && self.live().contains(&idx);
                let level = !caught_up || seen.iter().all(|s| s.1 == log && s.2 == log);
                if agreed && level {
                    return Ok(idx);
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "the members did not agree on a leader{} within {timeout:?} (leader id, last log, last applied per member: {seen:?})",
                    if caught_up { " and a caught-up log" } else { "" }
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn status(addr: &str) -> Option<pb::ClusterStatusResponse> {
    let mut c = tokio::time::timeout(Duration::from_secs(2), dir_client(addr))
        .await
        .ok()?
        .ok()?;
    let mut req = tonic::Request::new(pb::ClusterStatusRequest {});
    req.set_timeout(Duration::from_secs(2));
    Some(c.cluster_status(req).await.ok()?.into_inner())
}

async fn dir_client(addr: &str) -> anyhow::Result<DirClient> {
    let ch = gma_consumer::connect(addr)
        .await
        .map_err(|e| anyhow!("cannot connect to the directory at {addr}: {e}"))?;
    Ok(DirectoryClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

fn schema() -> pb::EventSchema {
    pb::EventSchema {
        name: SCHEMA.into(),
        version: 1,
        fields: vec![gma_core::event::dbl("v", "", "")],
        description: "directory benchmark".into(),
    }
}

/// A producer registration with a 60 s lease; the schema goes with every request.
pub(crate) fn register_req(id: String, attributes: HashMap<String, String>) -> pb::RegisterRequest {
    pb::RegisterRequest {
        record: Some(pb::Record {
            record: Some(pb::record::Record::Producer(pb::ProducerRecord {
                id,
                address: "http://127.0.0.1:9".into(),
                events: vec![SCHEMA.into()],
                attributes,
                ..Default::default()
            })),
        }),
        schemas: vec![schema()],
        lease_ttl_ms: TTL_MS,
    }
}

pub(crate) fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).context("cannot create a histogram")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

fn rpc_err(what: &str, s: &tonic::Status) -> anyhow::Error {
    anyhow!("{what}: {:?}: {}", s.code(), s.message())
}

/// What one throughput phase measured: acked operations, errors, latency of the acked ones and
/// the CPU the server processes used meanwhile.
pub(crate) struct OpFigures {
    pub(crate) acked: u64,
    pub(crate) errors: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) seconds: f64,
    pub(crate) cpu_cores: f64,
    pub(crate) latency: Histogram<u64>,
}

impl OpFigures {
    fn empty() -> anyhow::Result<OpFigures> {
        Ok(OpFigures {
            acked: 0,
            errors: 0,
            last_error: None,
            seconds: 0.0,
            cpu_cores: 0.0,
            latency: histogram()?,
        })
    }

    pub(crate) fn per_s(&self) -> f64 {
        self.acked as f64 / self.seconds
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "acked_per_s": self.per_s(),
            "acked": self.acked,
            "errors": self.errors,
            "last_error": self.last_error,
            "latency_ms": pct(&self.latency),
            "server_cpu_cores_used": self.cpu_cores,
        })
    }
}

struct RegFigures {
    ops: OpFigures,
}

/// `clients` concurrent loops of `op(client, n)` (n = 1, 2, ...) for `duration`: each loop
/// awaits its operation before starting the next one. `cpu` reads the CPU seconds used so far
/// by the server processes. The same harness drives the directory and etcd
/// (`gma bench etcd`), so both are measured alike.
pub(crate) async fn op_phase<F, Fut>(
    cpu: &dyn Fn() -> f64,
    clients: usize,
    duration: Duration,
    what: &str,
    op: F,
) -> anyhow::Result<OpFigures>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), tonic::Status>> + Send,
{
    let cpu0 = cpu();
    let t0 = Instant::now();
    let deadline = t0 + duration;
    let mut set = tokio::task::JoinSet::new();
    for k in 0..clients {
        let op = op.clone();
        let mut r = OpFigures::empty()?;
        set.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let t = Instant::now();
                match op(k, n).await {
                    Ok(()) => {
                        let _ = r.latency.record(micros(t.elapsed()));
                        r.acked += 1;
                    }
                    Err(s) => {
                        r.errors += 1;
                        r.last_error = Some(format!("{:?}: {}", s.code(), s.message()));
                    }
                }
            }
            r
        });
    }
    let mut f = OpFigures::empty()?;
    while let Some(r) = set.join_next().await {
        let r = r.with_context(|| format!("a {what} client task failed"))?;
        f.acked += r.acked;
        f.errors += r.errors;
        if r.last_error.is_some() {
            f.last_error = r.last_error;
        }
        f.latency
            .add(&r.latency)
            .context("cannot merge latency histograms")?;
    }
    f.seconds = t0.elapsed().as_secs_f64();
    f.cpu_cores = (cpu() - cpu0) / f.seconds;
    if f.acked == 0 {
        bail!(
            "no {what} acked at {clients} client(s) ({} errors, last: {})",
            f.errors,
            f.last_error.as_deref().unwrap_or("none")
        );
    }
    Ok(f)
}

/// `clients` concurrent register loops on `addr` (sharing up to 8 channels) for `duration`.
async fn register_phase(
    cluster: &Cluster,
    addr: &str,
    clients: usize,
    duration: Duration,
    prefix: &str,
) -> anyhow::Result<RegFigures> {
    let channels = dir_channels(addr, clients).await?;
    let prefix = prefix.to_string();
    let ops = op_phase(
        &|| cluster.cpu_total(),
        clients,
        duration,
        "registration",
        move |k, n| {
            let mut c = channels[k % channels.len()].clone();
            let id = format!("{prefix}-{k}-{n}");
            async move {
                c.register(register_req(id, HashMap::new())).await?;
                Ok(())
            }
        },
    )
    .await
    .with_context(|| format!("on {addr}"))?;
    Ok(RegFigures { ops })
}

/// The records the Search phases look up: [`SEARCH_SET`] registered at once on `addr` with a
/// lease that outlives the run. (They used to be the 1-client phase's, with 60 s leases: on a
/// loaded machine the phases took longer than that, the leases expired and a search rightly
/// found nothing.)
async fn search_set(addr: &str) -> anyhow::Result<Vec<String>> {
    let c = dir_client(addr).await?;
    let mut set = tokio::task::JoinSet::new();
    for n in 0..SEARCH_SET {
        let mut c = c.clone();
        set.spawn(async move {
            let id = format!("s-{n}");
            let mut req = register_req(id.clone(), HashMap::new());
            req.lease_ttl_ms = SEARCH_TTL_MS;
            c.register(req).await.map(|_| id)
        });
    }
    let mut ids = Vec::new();
    while let Some(r) = set.join_next().await {
        ids.push(
            r.context("a search-set registration task failed")?
                .map_err(|s| rpc_err(&format!("registering the search set on {addr}"), &s))?,
        );
    }
    ids.sort();
    Ok(ids)
}

/// Up to 8 shared channels to the directory at `addr` for `clients` clients.
pub(crate) async fn dir_channels(addr: &str, clients: usize) -> anyhow::Result<Vec<DirClient>> {
    let mut channels = Vec::new();
    for _ in 0..clients.clamp(1, CHANNELS) {
        channels.push(dir_client(addr).await?);
    }
    Ok(channels)
}

/// What each member holds of `id`, read locally (`stale_ok`): for the error of a search that
/// did not find a registration it had acknowledged.
async fn stale_counts(members: &[String], id: &str) -> Vec<(String, Result<usize, String>)> {
    let mut out = Vec::new();
    for m in members {
        let n = match dir_client(m).await {
            Ok(mut c) => c
                .search(pb::SearchRequest {
                    kind: pb::RecordKind::Producer as i32,
                    id: id.to_string(),
                    single: true,
                    stale_ok: true,
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().entries.len())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
            Err(e) => Err(e.to_string()),
        };
        out.push((m.clone(), n));
    }
    out
}

/// 2,000 Searches by exact id on `addr` (after the warm-up), each answering one record;
/// `members`: every member's address (for the error).
async fn search_phase(
    addr: &str,
    members: &[String],
    ids: &[String],
    stale_ok: bool,
) -> anyhow::Result<Histogram<u64>> {
    if ids.is_empty() {
        bail!("no registered ids to search for");
    }
    let mut c = dir_client(addr).await?;
    let mut h = histogram()?;
    for i in 0..SEARCH_WARMUP + SEARCHES {
        let id = &ids[i % ids.len()];
        let req = pb::SearchRequest {
            kind: pb::RecordKind::Producer as i32,
            id: id.clone(),
            single: true,
            stale_ok,
            ..Default::default()
        };
        let t = Instant::now();
        let r = c
            .search(req)
            .await
            .map_err(|s| rpc_err(&format!("search for {id} on {addr}"), &s))?
            .into_inner();
        let us = micros(t.elapsed());
        if r.entries.len() != 1 {
            bail!(
                "search for {id} on {addr} answered {} records, not 1 (stale_ok on each member: {:?})",
                r.entries.len(),
                stale_counts(members, id).await
            );
        }
        if i >= SEARCH_WARMUP {
            let _ = h.record(us);
        }
    }
    Ok(h)
}

/// Watch latency: watcher on `watch_addr`, one writer on `write_addr`.
async fn watch_phase(watch_addr: &str, write_addr: &str) -> anyhow::Result<Histogram<u64>> {
    let mut w = dir_client(watch_addr).await?;
    let mut stream = w
        .watch(pb::WatchRequest {
            from_revision: 0,
            kind: pb::RecordKind::Producer as i32,
            ..Default::default()
        })
        .await
        .map_err(|s| rpc_err(&format!("watch on {watch_addr}"), &s))?
        .into_inner();
    // Skip the initial snapshot.
    let synced = async {
        loop {
            match stream.message().await {
                Ok(Some(ev)) if ev.r#type == pb::WatchEventType::Synced as i32 => return Ok(()),
                Ok(Some(_)) => {}
                Ok(None) => bail!("the watch on {watch_addr} ended before SYNCED"),
                Err(s) => return Err(rpc_err(&format!("watch on {watch_addr}"), &s)),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), synced)
        .await
        .context("the watch did not reach SYNCED within 60 s")??;
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = {
        let seen = seen.clone();
        let watch_addr = watch_addr.to_string();
        let mut h = histogram()?;
        tokio::spawn(async move {
            while seen.load(std::sync::atomic::Ordering::Relaxed) < WATCH_RECORDS {
                let ev = match stream.message().await {
                    Ok(Some(ev)) => ev,
                    Ok(None) => bail!("the watch on {watch_addr} ended"),
                    Err(s) => return Err(rpc_err(&format!("watch on {watch_addr}"), &s)),
                };
                let now = now_ns();
                if ev.r#type != pb::WatchEventType::Put as i32 {
                    continue;
                }
                let Some(p) = ev.entry.and_then(gma_consumer::directory::producer_of) else {
                    continue;
                };
                if !p.id.starts_with("w-") {
                    continue;
                }
                let Some(t) = p.attributes.get("t_ns").and_then(|v| v.parse::<i64>().ok()) else {
                    bail!("watched record {} has no t_ns attribute", p.id);
                };
                let _ = h.record(((now - t).max(1000) / 1000) as u64);
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(h)
        })
    };
    let c = dir_client(write_addr).await?;
    let mut writes = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..WATCH_RECORDS {
        tick.tick().await;
        let mut c = c.clone();
        writes.spawn(async move {
            let attributes = HashMap::from([("t_ns".to_string(), now_ns().to_string())]);
            c.register(register_req(format!("w-{n}"), attributes)).await
        });
    }
    while let Some(r) = writes.join_next().await {
        r.context("a watch writer task failed")?
            .map_err(|s| rpc_err(&format!("register on {write_addr}"), &s))?;
    }
    match tokio::time::timeout(Duration::from_secs(30), watcher).await {
        Ok(r) => r.context("the watcher task failed")?,
        Err(_) => bail!(
            "the watcher saw {} of {WATCH_RECORDS} registrations within 30 s of the last write",
            seen.load(std::sync::atomic::Ordering::Relaxed)
        ),
    }
}

/// Leader failover: kill -9 the leader, time until a survivor acks a write; restart it.
async fn failover(cluster: &mut Cluster, trials: u32) -> anyhow::Result<Vec<f64>> {
    let mut samples = Vec::new();
    for trial in 0..trials {
        let l = cluster
            .agreed_leader(LEADER_TIMEOUT, true)
            .await
            .with_context(|| format!("before failover trial {}", trial + 1))?;
        let mut survivors = Vec::new();
        for i in (0..cluster.addrs.len()).filter(|i| *i != l) {
            survivors.push(dir_client(&cluster.addrs[i]).await?);
        }
        let mut child = cluster.take_for_kill(l)?;
        let t0 = Instant::now();
        child
            .start_kill()
            .with_context(|| format!("cannot kill directory node {}", l + 1))?;
        let mut n = 0usize;
        let mut last = String::new();
        loop {
            if t0.elapsed() > FAILOVER_TIMEOUT {
                bail!(
                    "failover trial {}: no write acked within {FAILOVER_TIMEOUT:?} after killing leader node {} (last error: {last})",
                    trial + 1,
                    l + 1
                );
            }
            let mut c = survivors[n % survivors.len()].clone();
            n += 1;
            let mut req = tonic::Request::new(register_req(format!("f{trial}-{n}"), HashMap::new()));
            req.set_timeout(FAILOVER_TRY);
            match tokio::time::timeout(FAILOVER_TRY, c.register(req)).await {
                Ok(Ok(_)) => break,
                Ok(Err(s)) => last = format!("{:?}: {}", s.code(), s.message()),
                Err(_) => last = format!("no answer within {FAILOVER_TRY:?}"),
            }
        }
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
        tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .with_context(|| format!("killed node {} did not exit", l + 1))?
            .with_context(|| format!("cannot reap killed node {}", l + 1))?;
        cluster
            .spawn(l, false)
            .await
            .with_context(|| format!("restarting node {} after failover trial {}", l + 1, trial + 1))?;
        cluster
            .agreed_leader(LEADER_TIMEOUT, false)
            .await
            .with_context(|| format!("after restarting node {} (trial {})", l + 1, trial + 1))?;
    }
    Ok(samples)
}

struct Figures {
    nodes: usize,
    duration_s: u64,
    reg1: RegFigures,
    reg64: RegFigures,
    search_lin: Histogram<u64>,
    search_stale: Histogram<u64>,
    watch: Histogram<u64>,
    failover_ms: Option<Vec<f64>>,
    cpu_s: Vec<f64>,
    rss_mb: Vec<f64>,
    seconds: f64,
}

async fn scenario(nodes: usize, duration: Duration, trials: u32) -> anyhow::Result<Figures> {
    let t0 = Instant::now();
    let mut cluster = Cluster::start(nodes).await.context("starting the directory")?;
    let l = cluster
        .agreed_leader(LEADER_TIMEOUT, false)
        .await
        .context("electing a leader")?;
    let leader = cluster.addrs[l].clone();
    // A follower for stale reads and the watcher (the node itself with one node).
    let follower = (0..nodes)
        .find(|i| *i != l)
        .map(|i| cluster.addrs[i].clone())
        .unwrap_or_else(|| leader.clone());
    let reg1 = register_phase(&cluster, &leader, 1, duration, "r1")
        .await
        .context("registrations at 1 client")?;
    let reg64 = register_phase(&cluster, &leader, CLIENTS, duration, "r64")
        .await
        .context("registrations at 64 clients")?;
    let searched = search_set(&leader)
        .await
        .context("registering the records to search")?;
    let search_lin = search_phase(&leader, &cluster.addrs, &searched, false)
        .await
        .context("linearizable searches on the leader")?;
    let search_stale = search_phase(&follower, &cluster.addrs, &searched, true)
        .await
        .context("stale_ok searches")?;
    let watch = watch_phase(&follower, &leader).await.context("watch latency")?;
    let failover_ms = if nodes > 1 && trials > 0 {
        Some(failover(&mut cluster, trials).await.context("leader failover")?)
    } else {
        None
    };
    let (cpu_s, rss_mb) = cluster.stop().await;
    Ok(Figures {
        nodes,
        duration_s: duration.as_secs(),
        reg1,
        reg64,
        search_lin,
        search_stale,
        watch,
        failover_ms,
        cpu_s,
        rss_mb,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

pub(crate) fn pct(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({"p50": ms(h, 0.5), "p99": ms(h, 0.99), "max": h.max() as f64 / 1000.0, "samples": h.len()})
}

/// (median, p90 by nearest rank, max) of unsorted samples.
pub(crate) fn spread(samples: &[f64]) -> (f64, f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    let p90 = s[((0.9 * n as f64).ceil() as usize).clamp(1, n) - 1];
    (median, p90, s[n - 1])
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn print(f: &Figures, output: Output) {
    let failover = f.failover_ms.as_ref().map(|s| {
        let (median, p90, max) = spread(s);
        (median, p90, max, s)
    });
    match output {
        Output::Json => crate::report::emit(serde_json::json!({
            "scenario": "directory",
            "nodes": f.nodes,
            "machine_cores": cores(),
            "duration_s": f.duration_s,
            "register_1_client_per_s": f.reg1.ops.per_s(),
            "register_64_clients_per_s": f.reg64.ops.per_s(),
            "register_errors": {"clients_1": f.reg1.ops.errors, "clients_64": f.reg64.ops.errors},
            "register_last_error": {"clients_1": f.reg1.ops.last_error, "clients_64": f.reg64.ops.last_error},
            "register_latency_ms": {"clients_1": pct(&f.reg1.ops.latency), "clients_64": pct(&f.reg64.ops.latency)},
            "register_cpu_cores_used": {"clients_1": f.reg1.ops.cpu_cores, "clients_64": f.reg64.ops.cpu_cores},
            "search_linearizable_ms": pct(&f.search_lin),
            "search_stale_ms": pct(&f.search_stale),
            "watch_latency_ms": pct(&f.watch),
            "failover_ms": failover.map(|(median, p90, max, s)| serde_json::json!({
                "median": median, "p90": p90, "max": max,
                "samples": s.iter().map(|v| round2(*v)).collect::<Vec<_>>(),
            })),
            "cpu_seconds": f.cpu_s.iter().map(|v| round2(*v)).collect::<Vec<_>>(),
            "rss_mb": f.rss_mb.iter().map(|v| round2(*v)).collect::<Vec<_>>(),
            "seconds": f.seconds,
            "processes": f.cpu_s.iter().zip(&f.rss_mb).enumerate().map(|(i, (c, r))| serde_json::json!({
                "name": format!("directory-{}", i + 1), "cpu_seconds": round2(*c), "rss_mib_peak": round2(*r),
            })).collect::<Vec<_>>(),
        })),
        Output::Table => {
            let lat = |h: &Histogram<u64>| {
                format!(
                    "p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms ({} samples)",
                    ms(h, 0.5),
                    ms(h, 0.99),
                    h.max() as f64 / 1000.0,
                    h.len()
                )
            };
            let reg = |r: &RegFigures| {
                let r = &r.ops;
                format!(
                    "{:>8.0} acked/s ({} in {:.1} s, {} errors), {:.2} cores  latency {}",
                    r.per_s(),
                    r.acked,
                    r.seconds,
                    r.errors,
                    r.cpu_cores,
                    lat(&r.latency)
                )
            };
            let (follower, watcher) = if f.nodes > 1 {
                ("a follower", "on a follower")
            } else {
                ("the node", "on the node")
            };
            println!(
                "directory: {} node{}, real `gma directory` processes on 127.0.0.1, fsynced raft log, 60 s leases",
                f.nodes,
                if f.nodes > 1 { "s" } else { "" }
            );
            println!("  machine cores            {}", cores());
            println!("  register, 1 client       {}", reg(&f.reg1));
            println!("  register, 64 clients     {}", reg(&f.reg64));
            if let Some(e) = f.reg1.ops.last_error.as_ref().or(f.reg64.ops.last_error.as_ref()) {
                println!("  last register error      {e}");
            }
            println!("  search, linearizable     {} (leader)", lat(&f.search_lin));
            println!("  search, stale_ok         {} ({follower})", lat(&f.search_stale));
            println!(
                "  watch latency            {} (watcher {watcher}, 1 write / {} ms)",
                lat(&f.watch),
                WATCH_PERIOD.as_millis()
            );
            if let Some((median, p90, max, s)) = failover {
                println!(
                    "  leader failover          median {median:.0} ms  p90 {p90:.0} ms  max {max:.0} ms ({} trials, kill -9 -> first acked write, members caught up before each kill)",
                    s.len()
                );
                println!(
                    "  failover samples         {} ms",
                    s.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ")
                );
            }
            for (i, (cpu, rss)) in f.cpu_s.iter().zip(&f.rss_mb).enumerate() {
                println!(
                    "  node {}                   cpu {cpu:.2} s  peak rss {rss:.1} MiB",
                    i + 1
                );
            }
            println!("  run time                 {:.1} s", f.seconds);
        }
    }
}
