//! `gma bench dashboard`: the dashboard's cost with many browsers watching many live series.
//!
//! Real processes on loopback: a directory, one producer with `--hosts` simulated hosts (each
//! publishes host.load, host.cpu and host.mem every `--period-ms`: 3 live series per host), and
//! a `gma dashboard`. Phase 1 measures the dashboard with no browser attached; phase 2 with
//! `--clients` SSE clients reading `/api/events` (plain HTTP clients that parse the stream as a
//! browser's EventSource would, without rendering: the figure is the dashboard's side). Reported:
//! the dashboard process's CPU (% of one core, from /proc/<pid>/stat) and RSS (VmRSS), and the
//! fan-out latency of every chart point at every client (event timestamp -> client receipt),
//! as hdrhistogram percentiles.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use hdrhistogram::Histogram;
use std::sync::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::args::Output;
use crate::child::spawn;
use crate::report::{cores, proc_usage};

async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default())
}

fn now_ms() -> f64 {
    gma_core::time::now_ns() as f64 / 1e6
}

#[derive(Default)]
struct ClientFigures {
    messages: AtomicU64,
    points: AtomicU64,
    bytes: AtomicU64,
}

/// One SSE client: reads `/api/events` (chunked), records the latency of every chart point.
async fn sse_client(
    addr: String,
    figures: Arc<ClientFigures>,
    latency: Arc<Mutex<Histogram<u64>>>,
    measuring: Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let mut s = tokio::net::TcpStream::connect(&addr).await?;
    s.write_all(
        format!("GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut r = BufReader::new(s);
    // Response head.
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            bail!("stream closed in the head");
        }
        if line == "\r\n" {
            break;
        }
    }
    // Chunked body: size line, data, CRLF. Events end with a blank line.
    let mut pending = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let n = usize::from_str_radix(line.trim(), 16).map_err(|_| anyhow!("bad chunk size {line:?}"))?;
        if n == 0 {
            return Ok(());
        }
        let mut buf = vec![0u8; n + 2];
        r.read_exact(&mut buf).await?;
        figures.bytes.fetch_add(n as u64, Ordering::Relaxed);
        pending.push_str(&String::from_utf8_lossy(&buf[..n]));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(data) = event.strip_prefix("data: ") else {
                continue; // ": ping"
            };
            let received = now_ms();
            figures.messages.fetch_add(1, Ordering::Relaxed);
            let v: serde_json::Value = serde_json::from_str(data.trim_end()).unwrap_or_default();
            if v["type"] != "points" || !measuring.load(Ordering::Relaxed) {
                continue;
            }
            let pts = v["points"].as_array().cloned().unwrap_or_default();
            figures.points.fetch_add(pts.len() as u64, Ordering::Relaxed);
            let mut h = latency.lock().unwrap_or_else(|p| p.into_inner());
            for p in pts {
                if let Some(t) = p[2].as_f64() {
                    h.saturating_record(((received - t).max(0.0) * 1000.0) as u64);
                }
            }
        }
    }
}

struct Phase {
    cpu_pct: f64,
    rss_mb: f64,
    peak_rss_mb: f64,
}

async fn measure(pid: &str, seconds: u64) -> anyhow::Result<Phase> {
    let (c0, _) = proc_usage(pid)?;
    let t0 = Instant::now();
    let mut peak: f64 = 0.0;
    while t0.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(proc_usage(pid)?.1);
    }
    let (c1, rss) = proc_usage(pid)?;
    Ok(Phase {
        cpu_pct: (c1 - c0) / t0.elapsed().as_secs_f64() * 100.0,
        rss_mb: rss,
        peak_rss_mb: peak.max(rss),
    })
}

pub async fn run(
    duration: u64,
    hosts: usize,
    clients: usize,
    period_ms: u64,
    output: Output,
) -> anyhow::Result<()> {
    if duration < 2 || hosts == 0 || period_ms == 0 {
        bail!("--duration must be at least 2, --hosts and --period-ms at least 1");
    }
    let tmp = tempfile::Builder::new().prefix("gma-bench-dash-").tempdir()?;
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        format!(
            "period_ms = {period_ms}\n[[generate]]\ncount = {hosts}\nprefix = \"b\"\nseed = 3\ncpus = 8\nmemory_mb = 8192\n"
        ),
    )?;
    let data = tmp.path().join("dir");
    let dir = spawn(
        &[
            "directory",
            "--listen",
            "127.0.0.1:0",
            "--data",
            data.to_str().unwrap_or("dir"),
        ],
        "gma directory listening on",
    )
    .await?;
    let _prod = spawn(
        &[
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--no-host-sensors",
            "--simulate",
            sim.to_str().unwrap_or("sim.toml"),
        ],
        "gma producer listening on",
    )
    .await?;
    let mut dash = spawn(
        &["dashboard", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma dashboard listening on",
    )
    .await?;
    // Wait until the dashboard charts every host.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let snap = http_get(&dash.addr, "/api/snapshot").await.unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&snap).unwrap_or_default();
        if v["hosts"].as_array().is_some_and(|h| h.len() >= hosts) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the dashboard did not chart {hosts} hosts within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let series = hosts * 3;
    let idle = measure(&dash.pid, duration).await?;

    let latency = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?));
    let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let figures: Vec<Arc<ClientFigures>> = (0..clients).map(|_| Arc::new(ClientFigures::default())).collect();
    let tasks: Vec<_> = figures
        .iter()
        .map(|f| {
            tokio::spawn(sse_client(
                dash.addr.clone(),
                f.clone(),
                latency.clone(),
                measuring.clone(),
            ))
        })
        .collect();
    // Warm up: every client has its snapshot.
    let deadline = Instant::now() + Duration::from_secs(30);
    while figures.iter().any(|f| f.messages.load(Ordering::Relaxed) == 0) {
        if Instant::now() > deadline {
            bail!("not every SSE client got its snapshot within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    measuring.store(true, Ordering::Relaxed);
    let m0: u64 = figures.iter().map(|f| f.messages.load(Ordering::Relaxed)).sum();
    let p0: u64 = figures.iter().map(|f| f.points.load(Ordering::Relaxed)).sum();
    let b0: u64 = figures.iter().map(|f| f.bytes.load(Ordering::Relaxed)).sum();
    let t0 = Instant::now();
    let busy = measure(&dash.pid, duration).await?;
    let secs = t0.elapsed().as_secs_f64();
    measuring.store(false, Ordering::Relaxed);
    let messages = figures
        .iter()
        .map(|f| f.messages.load(Ordering::Relaxed))
        .sum::<u64>()
        - m0;
    let points = figures
        .iter()
        .map(|f| f.points.load(Ordering::Relaxed))
        .sum::<u64>()
        - p0;
    let bytes = figures
        .iter()
        .map(|f| f.bytes.load(Ordering::Relaxed))
        .sum::<u64>()
        - b0;
    for t in tasks {
        t.abort();
    }
    let _ = dash.child.kill().await;
    let h = latency.lock().unwrap_or_else(|p| p.into_inner());
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let per_client = |n: u64| n as f64 / secs / clients.max(1) as f64;
    match output {
        Output::Json => crate::report::emit(serde_json::json!({
            "scenario": "dashboard",
            "machine_cores": cores(),
            "hosts": hosts,
            "live_series": series,
            "period_ms": period_ms,
            "clients": clients,
            "seconds": secs,
            "idle": {"cpu_pct_of_one_core": idle.cpu_pct, "rss_mb": idle.rss_mb, "peak_rss_mb": idle.peak_rss_mb},
            "with_clients": {"cpu_pct_of_one_core": busy.cpu_pct, "rss_mb": busy.rss_mb, "peak_rss_mb": busy.peak_rss_mb},
            "per_client": {"messages_per_s": per_client(messages), "points_per_s": per_client(points), "bytes_per_s": per_client(bytes)},
            "fanout_latency_ms": {"samples": h.len(), "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "max": h.max() as f64 / 1000.0},
        })),
        Output::Table => {
            println!(
                "dashboard: {hosts} simulated hosts x 3 events = {series} live series every {period_ms} ms, {clients} SSE clients, {secs:.0} s per phase"
            );
            println!("  machine cores               {}", cores());
            println!(
                "  no client attached          cpu {:.2} % of one core, rss {:.1} MiB (peak {:.1})",
                idle.cpu_pct, idle.rss_mb, idle.peak_rss_mb
            );
            println!(
                "  {clients:>2} clients attached          cpu {:.2} % of one core, rss {:.1} MiB (peak {:.1})",
                busy.cpu_pct, busy.rss_mb, busy.peak_rss_mb
            );
            println!(
                "  per client                  {:.1} messages/s, {:.0} chart points/s, {:.1} KB/s",
                per_client(messages),
                per_client(points),
                per_client(bytes) / 1000.0
            );
            println!(
                "  fan-out latency (event timestamp -> SSE client), {} points: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                h.len(),
                ms(0.5),
                ms(0.9),
                ms(0.99),
                h.max() as f64 / 1000.0
            );
        }
    }
    Ok(())
}
