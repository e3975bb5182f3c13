//! `gma bench agent`: the host agent's cost, measured as node_exporter is measured with its
//! scraper — a real agent process with every host sensor (`gma-agent`, the agent alone, or `gma
//! producer`: `--agent-bin`), and (unless
//! `--no-subscriber`) a subscriber in this process taking every event it publishes (pattern
//! `*`, gRPC over loopback). Reported from /proc/<pid> of the agent alone: CPU % of one core,
//! µs of CPU per value sampled (the agent's own count, `gma.agent values_per_s` over the run's
//! window; its latest figure without a subscriber) and per value
//! delivered to the subscriber, VmRSS at the end and VmHWM (peak), and apart the CPU of the
//! host commands it ran and waited for (`df`, `dpkg-query` of host.info: its children's
//! `cutime` + `cstime`); per thread, from `/proc/<pid>/task/*/`, its wake-ups a second
//! (voluntary context switches: a count the machine's load does not change), its preemptions,
//! and its CPU in nanoseconds (schedstat) rather than 10 ms ticks. `--agent-arg` passes options to the agent (e.g.
//! `--agent-arg=--buffer-bytes=1048576`) to compare configurations.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_consumer::stream::{ProducerStream, StreamOptions};
use gma_proto::v1 as pb;
use tokio::io::AsyncBufReadExt;

use crate::args::Output;
use crate::report::{cores, emit, peak_rss_mib, proc_usage};

/// Events and values (numbers and strings) the subscriber took while `counting` was set, and
/// the agent's own count of values sampled over the same window: the sum of its `gma.agent`
/// `values_per_s` times the time since its previous event (each rate is over that interval,
/// so the sum is the agent's count between its first and last event of the window).
#[derive(Default)]
struct Delivered {
    counting: AtomicBool,
    events: AtomicU64,
    values: AtomicU64,
    sampled: parking_lot::Mutex<Sampled>,
}

/// `gma.agent`'s counts over the window.
#[derive(Default)]
struct Sampled {
    /// Timestamps (ns) of the window's first and latest `gma.agent` event.
    first_ns: Option<i64>,
    last_ns: i64,
    /// Values sampled between them.
    values: f64,
}

impl Sampled {
    /// One `gma.agent` event at `ts` reporting `per_s` values a second since its previous one.
    fn see(&mut self, ts: i64, per_s: f64) {
        match self.first_ns {
            None => self.first_ns = Some(ts),
            Some(_) if ts > self.last_ns => self.values += per_s * (ts - self.last_ns) as f64 / 1e9,
            Some(_) => return,
        }
        self.last_ns = ts;
    }

    /// Values a second between the first and the latest event, if they are apart.
    fn per_s(&self) -> Option<f64> {
        let first = self.first_ns?;
        (self.last_ns > first).then(|| self.values / ((self.last_ns - first) as f64 / 1e9))
    }
}

/// Per thread of `pid`, by thread id: CPU nanoseconds (`task/*/schedstat`, not 10 ms ticks),
/// voluntary and involuntary context switches (`task/*/status`). A voluntary switch is the
/// thread going to sleep, so their count is its wake-ups, a figure the machine's load does not
/// change; the involuntary ones are preemptions (more on a busy machine: the subscriber, woken
/// by the agent's write, takes the CPU).
fn sched_counts(pid: &str) -> std::collections::HashMap<String, [u64; 3]> {
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in dir.flatten() {
        let ns = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let counts = [
            ns,
            field("voluntary_ctxt_switches:"),
            field("nonvoluntary_ctxt_switches:"),
        ];
        out.insert(t.file_name().to_string_lossy().into_owned(), counts);
    }
    out
}

/// What the threads of a process ran since a first reading: each thread's last reading less
/// its first (zero for a thread born since). Read it often: a thread that exits (the blocking
/// pool's, at most one a minute on an agent) takes what it ran since the last reading with it.
#[derive(Default)]
struct SchedDelta {
    first: std::collections::HashMap<String, [u64; 3]>,
    last: std::collections::HashMap<String, [u64; 3]>,
}

impl SchedDelta {
    fn update(&mut self, now: std::collections::HashMap<String, [u64; 3]>) {
        self.last.extend(now);
    }

    /// CPU nanoseconds, voluntary and involuntary switches since the first reading.
    fn total(&self) -> [u64; 3] {
        let mut sum = [0u64; 3];
        for (tid, now) in &self.last {
            let first = self.first.get(tid).copied().unwrap_or_default();
            for i in 0..3 {
                sum[i] += now[i].saturating_sub(first[i]);
            }
        }
        sum
    }
}

/// Subscribes to every event of the agent at `addr` and counts what arrives until the stream
/// ends (the agent is killed) or fails.
fn subscribe_all(addr: &str, d: Arc<Delivered>) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let mut s = ProducerStream::new(
        addr,
        StreamOptions {
            patterns: vec!["*".into()],
            reconnect: false,
            ..StreamOptions::default()
        },
    );
    tokio::spawn(async move {
        loop {
            let (mut n, mut v) = (0u64, 0u64);
            let mut agent = Vec::new();
            let p = s
                .next_with(|e| {
                    n += 1;
                    v += (e.numbers.len() + e.strings.len()) as u64;
                    if e.series.name == "gma.agent" {
                        if let Some(per_s) = e.number("values_per_s") {
                            agent.push((e.timestamp_ns, per_s));
                        }
                    }
                })
                .await;
            match p {
                Ok(Some(_)) => {
                    if d.counting.load(Ordering::Relaxed) {
                        d.events.fetch_add(n, Ordering::Relaxed);
                        d.values.fetch_add(v, Ordering::Relaxed);
                        let mut sampled = d.sampled.lock();
                        for (ts, per_s) in agent {
                            sampled.see(ts, per_s);
                        }
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(anyhow!("subscriber: {e}")),
            }
        }
    })
}

/// A `kB` line of /proc/<pid>/status (`RssAnon`, `RssFile`, ...), in MiB.
fn status_mib(pid: &str, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// CPU seconds of the agent's children that it has waited for (`cutime` + `cstime` of
/// /proc/<pid>/stat): the host commands `host.info` and `batch.queue` run (`df`, `dpkg-query`,
/// `sinfo`), which the agent's own CPU time does not include.
fn children_cpu_s(pid: &str) -> f64 {
    crate::report::proc_stat_seconds(pid, &[13, 14]).unwrap_or(f64::NAN)
}

/// The agent's own sampling rate, from its latest `gma.agent` event (`values_per_s`, over its
/// latest tick).
async fn sampled_per_s(addr: &str) -> anyhow::Result<f64> {
    let ch = gma_consumer::connect(addr).await.map_err(|e| anyhow!("{e}"))?;
    let mut client = pb::producer_client::ProducerClient::new(ch);
    let r = client
        .query(pb::QueryRequest {
            patterns: vec!["gma.agent".into()],
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow!("query gma.agent: {}", s.message()))?
        .into_inner();
    Ok(r.events
        .first()
        .and_then(|e| {
            let schema = r.schemas.iter().find(|s| s.name == e.name)?;
            let i = schema.fields.iter().position(|f| f.name == "values_per_s")?;
            match e.values.get(i)?.kind {
                Some(pb::value::Kind::Number(n)) => Some(n),
                _ => None,
            }
        })
        .unwrap_or(f64::NAN))
}

/// What `gma bench agent` runs.
pub struct AgentRun {
    pub duration: u64,
    pub period_ms: u64,
    /// A subscriber of every event attached.
    pub subscriber: bool,
    /// Options passed to the agent.
    pub agent_args: Vec<String>,
    /// The agent executable (`--agent-bin`).
    pub agent_bin: Option<PathBuf>,
}

/// The agent's command: `gma-agent` (a file named so) runs as is, any other executable as
/// `EXE producer`. Without `--agent-bin`: the `gma-agent` next to this executable when there
/// is one, else this executable.
fn agent_command(bin: Option<&Path>) -> anyhow::Result<(PathBuf, Option<&'static str>)> {
    let exe = match bin {
        Some(b) => b.to_path_buf(),
        None => {
            let me = std::env::current_exe().context("cannot find the gma binary")?;
            let next = me.with_file_name(format!("gma-agent{}", std::env::consts::EXE_SUFFIX));
            if next.is_file() {
                next
            } else {
                me
            }
        }
    };
    if !exe.is_file() {
        bail!("--agent-bin {}: no such executable", exe.display());
    }
    let alone = exe
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("gma-agent"));
    Ok((exe, (!alone).then_some("producer")))
}

pub async fn agent(run: AgentRun, output: Output) -> anyhow::Result<()> {
    let AgentRun {
        duration,
        period_ms,
        subscriber,
        agent_args,
        agent_bin,
    } = run;
    if duration < 2 {
        bail!("--duration must be at least 2 seconds");
    }
    let (exe, command) = agent_command(agent_bin.as_deref())?;
    let what = match command {
        Some(c) => format!("{} {c}", exe.display()),
        None => exe.display().to_string(),
    };
    let period = period_ms.to_string();
    let mut child = tokio::process::Command::new(&exe)
        .args(command)
        .args(["--listen", "127.0.0.1:0", "--period-ms", &period])
        .args(["--source", "bench-agent"])
        .args(&agent_args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the agent")?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("agent exited at once"))?
        .to_string();
    let stderr = child.stderr.take().ok_or_else(|| anyhow!("no agent stderr"))?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = loop {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .context("agent did not start in 10 s")??
            .ok_or_else(|| anyhow!("agent exited before listening"))?;
        if let Some(a) = line.strip_prefix("gma producer listening on ") {
            break a.trim().to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let delivered = Arc::new(Delivered::default());
    let sub = subscriber.then(|| subscribe_all(&addr, delivered.clone()));
    // Let it start up, take its first samples and serve the subscriber's first batch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    delivered.counting.store(true, Ordering::Relaxed);
    let (cpu0, _) = proc_usage(&pid)?;
    let child0 = children_cpu_s(&pid);
    let mut sched = SchedDelta {
        first: sched_counts(&pid),
        ..SchedDelta::default()
    };
    let t0 = Instant::now();
    let mut peak_rss: f64 = 0.0;
    while t0.elapsed() < Duration::from_secs(duration) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak_rss = peak_rss.max(proc_usage(&pid)?.1);
        sched.update(sched_counts(&pid));
    }
    let (cpu1, rss) = proc_usage(&pid)?;
    let child1 = children_cpu_s(&pid);
    sched.update(sched_counts(&pid));
    let [run_ns, voluntary, preempted] = sched.total();
    let seconds = t0.elapsed().as_secs_f64();
    delivered.counting.store(false, Ordering::Relaxed);
    let hwm = peak_rss_mib(&pid).unwrap_or(f64::NAN);
    // Heap, stacks and relocated data against the executable's mapped pages.
    let (anon, file) = (status_mib(&pid, "RssAnon"), status_mib(&pid, "RssFile"));
    let threads = status_mib(&pid, "Threads") * 1024.0;
    let cpu_pct = (cpu1 - cpu0) / seconds * 100.0;
    // Over the window from the subscriber's `gma.agent` events; without a subscriber, the
    // agent's latest figure (one tick's).
    let over_window = delivered.sampled.lock().per_s();
    let values_per_s = match over_window {
        Some(v) => v,
        None => sampled_per_s(&addr).await?,
    };
    if let Some(h) = &sub {
        if h.is_finished() {
            bail!("the subscriber stopped before the end of the run");
        }
    }
    let _ = child.kill().await;
    if let Some(h) = sub {
        // The agent is gone: the stream ends (or breaks); either is the expected end here.
        let _ = h.await;
    }
    let events_out = delivered.events.load(Ordering::Relaxed) as f64 / seconds;
    let values_out = delivered.values.load(Ordering::Relaxed) as f64 / seconds;
    let us_per_value = (cpu1 - cpu0) * 1e6 / (values_per_s * seconds);
    let us_per_delivered = (cpu1 - cpu0) * 1e6 / (values_out * seconds);
    let children = child1 - child0;
    let wakes_per_s = voluntary as f64 / seconds;
    let preemptions_per_s = preempted as f64 / seconds;
    let run_s = run_ns as f64 / 1e9;
    let us_per_delivered_ns = run_s * 1e6 / (values_out * seconds);
    let us_per_value_with_children = (cpu1 - cpu0 + children) * 1e6 / (values_per_s * seconds);
    match output {
        Output::Json => emit(serde_json::json!({
            "scenario": "agent",
            "machine_cores": cores(),
            "period_ms": period_ms,
            "agent": what,
            "agent_args": agent_args,
            "subscriber": subscriber,
            "seconds": seconds,
            "cpu_pct_of_one_core": cpu_pct,
            "rss_mb": rss,
            "peak_rss_mb": peak_rss.max(rss),
            "vm_hwm_mib": hwm,
            "rss_anon_mib": anon,
            "rss_file_mib": file,
            "threads": threads,
            "values_per_s": values_per_s,
            "cpu_us_per_value": us_per_value,
            "children_cpu_seconds": children,
            "cpu_us_per_value_with_children": us_per_value_with_children,
            "delivered_events_per_s": events_out,
            "delivered_values_per_s": values_out,
            "cpu_us_per_value_delivered": if subscriber { serde_json::json!(us_per_delivered) } else { serde_json::Value::Null },
            "schedstat_cpu_seconds": run_s,
            "schedstat_us_per_value_delivered": if subscriber { serde_json::json!(us_per_delivered_ns) } else { serde_json::Value::Null },
            "wakes_per_s": wakes_per_s,
            "preemptions_per_s": preemptions_per_s,
            "processes": [{
                "name": what, "cpu_seconds": cpu1 - cpu0,
                "cpu_pct": cpu_pct, "rss_mib_peak": hwm, "rss_mib_end": rss,
            }],
        })),
        Output::Table => {
            let with = if subscriber {
                "one subscriber of `*`"
            } else {
                "no subscriber"
            };
            println!(
                "agent: `{what}` with host sensors, {period_ms} ms sampling, {with}, measured {seconds:.0} s"
            );
            if !agent_args.is_empty() {
                println!("  agent options            {}", agent_args.join(" "));
            }
            println!("  machine cores            {}", cores());
            println!("  cpu                      {cpu_pct:.3} % of one core");
            println!(
                "  rss (VmRSS)              {rss:.1} MiB at the end, {:.1} MiB highest sampled",
                peak_rss.max(rss)
            );
            println!("  peak rss (VmHWM)         {hwm:.1} MiB");
            println!("  rss anonymous / file     {anon:.1} MiB / {file:.1} MiB, {threads:.0} threads");
            println!("  wake-ups                 {wakes_per_s:.2} /s, preempted {preemptions_per_s:.2} /s (context switches, all threads)");
            println!("  values sampled           {values_per_s:.0} /s");
            println!("  cost per value sampled   {us_per_value:.2} us of CPU");
            println!(
                "  with its commands        {us_per_value_with_children:.2} us ({children:.2} s of CPU in the commands it ran)"
            );
            if subscriber {
                println!("  delivered                {events_out:.1} events/s, {values_out:.0} values/s");
                println!("  cost per value delivered {us_per_delivered:.2} us of CPU ({us_per_delivered_ns:.2} us by schedstat's ns)");
            }
        }
    }
    Ok(())
}
