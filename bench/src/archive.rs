//! `gma bench archive`: the archiver's store, in process — sustained ingest with group commit,
//! bytes per sample on disk, query time over one series of 1,000,000 samples (raw and
//! downsampled with p99), and the process's RSS.

use std::sync::Arc;
use std::time::Instant;

use anyhow::anyhow;
use gma_archiver::store::{Agg, QuerySpec, Store, StoreOptions, StoreStats};
use gma_consumer::stream::ResumePoint;
use gma_core::codec::{Mark, OwnedEvent, SeriesInfo};
use gma_core::pattern::Pattern;
use gma_proto::v1 as pb;

use crate::args::Output;
use crate::report::{cores, proc_usage};

/// 1 s gauges: `hosts` streams of 3 doubles (load-like, 2 decimals), ns jitter up to 1 ms.
fn streams(hosts: usize) -> Vec<Arc<SeriesInfo>> {
    let schema = pb::EventSchema {
        name: "host.load".into(),
        version: 1,
        fields: vec![
            gma_core::event::dbl("load1", "", ""),
            gma_core::event::dbl("load5", "", ""),
            gma_core::event::dbl("free_cpus", "", ""),
        ],
        description: String::new(),
    };
    (0..hosts)
        .map(|h| {
            Arc::new(SeriesInfo::new(
                h as u32 + 1,
                "host.load",
                &format!("h{h:04}"),
                &schema,
            ))
        })
        .collect()
}

/// One event at second `tick`, its timestamp `jitter`ed by up to 1 ms (a sampler's wake-up)
/// or exactly on the second (a regular gauge).
fn event(series: &Arc<SeriesInfo>, seq: u64, tick: i64, rng: &mut u64, jitter: bool) -> OwnedEvent {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    let jitter = if jitter { (*rng % 1_000_000) as i64 } else { 0 };
    let base = 1_700_000_000_000_000_000i64;
    let load = (tick % 600) as f64 / 100.0 + ((*rng >> 20) % 4) as f64 / 100.0;
    OwnedEvent {
        series: series.clone(),
        seq,
        timestamp_ns: base + tick * 1_000_000_000 + jitter,
        numbers: vec![load, (load * 0.9 * 100.0).round() / 100.0, (tick % 8) as f64],
        strings: Vec::new(),
        mark: Mark::None,
    }
}

type Opened = (tempfile::TempDir, Arc<Store>);

/// Ingests `rows` events of 1,000 hosts (3 samples each) into a new store, or fewer when
/// `until` passes first, one group commit (flush) per batch of 1,000 events, then checkpoints.
/// Returns the seconds and CPU-seconds of the ingest, the store's figures, the rows ingested
/// and the store.
async fn ingest(
    rows: u64,
    jitter: bool,
    until: Option<Instant>,
    me: &str,
) -> anyhow::Result<(f64, f64, StoreStats, u64, Opened)> {
    let tmp = tempfile::Builder::new().prefix("gma-bench-archive-").tempdir()?;
    let store = Arc::new(Store::open(tmp.path(), StoreOptions::default()).map_err(|e| anyhow!("{e}"))?);
    let hosts = 1000usize;
    let all = streams(hosts);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (cpu0, _) = proc_usage(me)?;
    let t0 = Instant::now();
    let mut seq = 0u64;
    let mut batch = Vec::with_capacity(1000);
    while seq < rows && until.is_none_or(|u| Instant::now() < u) {
        batch.clear();
        for _ in 0..1000.min(rows - seq) {
            seq += 1;
            let s = &all[(seq as usize - 1) % hosts];
            let tick = ((seq - 1) / hosts as u64) as i64;
            batch.push(event(s, seq, tick, &mut rng, jitter));
        }
        let resume = ResumePoint {
            epoch: 1,
            next_seq: seq + 1,
        };
        store
            .append("bench", resume, &batch)
            .map_err(|e| anyhow!("{e}"))?;
        store.flush().await.map_err(|e| anyhow!("{e}"))?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let (cpu1, _) = proc_usage(me)?;
    store.checkpoint().await.map_err(|e| anyhow!("{e}"))?;
    let stats = store.stats();
    Ok((secs, cpu1 - cpu0, stats, seq, (tmp, store)))
}

/// `duration`: at most this many seconds of ingest (the samples ingested by then count).
pub async fn run(samples: u64, duration: Option<u64>, output: Output) -> anyhow::Result<()> {
    if samples < 3_000 {
        anyhow::bail!("--samples must be at least 3000");
    }
    if duration == Some(0) {
        anyhow::bail!("--duration must be positive");
    }
    let me = std::process::id().to_string();
    let until = duration.map(|d| Instant::now() + std::time::Duration::from_secs(d));
    let (ingest_s, ingest_cpu, stats, rows, (tmp, store)) = ingest(samples / 3, true, until, &me).await?;
    let ingest_rate = (rows * 3) as f64 / ingest_s;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut batch = Vec::with_capacity(10_000);

    // One series of 1,000,000 samples: a host sampled every second for 11.6 days.
    let one = streams(1).pop().ok_or_else(|| anyhow!("no stream"))?;
    let one = Arc::new(SeriesInfo::new(
        999_999,
        "bench.one",
        "h",
        &pb::EventSchema {
            name: "bench.one".into(),
            version: 1,
            fields: one.fields.to_vec(),
            description: String::new(),
        },
    ));
    let n = 1_000_000u64;
    let mut s = 0u64;
    while s < n {
        batch.clear();
        for _ in 0..10_000.min(n - s) {
            s += 1;
            batch.push(event(&one, s, s as i64, &mut rng, true));
        }
        store
            .append(
                "one",
                ResumePoint {
                    epoch: 1,
                    next_seq: s + 1,
                },
                &batch,
            )
            .map_err(|e| anyhow!("{e}"))?;
    }
    store.flush().await.map_err(|e| anyhow!("{e}"))?;
    store.checkpoint().await.map_err(|e| anyhow!("{e}"))?;
    let spec = |agg: Agg, step: Option<i64>| QuerySpec {
        name: Pattern::event("bench.one").unwrap_or_else(|_| Pattern::any()),
        names: None,
        source: None,
        field: Some("load1".into()),
        from_ns: 1_700_000_000_000_000_000,
        to_ns: 1_700_000_000_000_000_000 + (n as i64 + 2) * 1_000_000_000,
        step_ns: step,
        agg,
        max_points: 10_000,
    };
    let timed = |q: QuerySpec| -> anyhow::Result<(f64, u64)> {
        let t = Instant::now();
        let mut points = 0u64;
        store
            .query(&q, &mut |p| {
                points += p.timestamps.len() as u64;
                true
            })
            .map_err(|e| anyhow!("{e}"))?;
        Ok((t.elapsed().as_secs_f64() * 1000.0, points))
    };
    let (raw_ms, raw_points) = timed(spec(Agg::Raw, None))?;
    let (p99_ms, p99_points) = timed(spec(Agg::P99, Some(60_000_000_000)))?;
    let (mean_ms, _) = timed(spec(Agg::Mean, Some(60_000_000_000)))?;
    let (_, rss_mib) = proc_usage(&me)?;
    drop(store);
    drop(tmp);
    // Regular 1 s gauges (timestamps on the second): what the ≤ 3 bytes/sample target is
    // about. Last, so its CPU does not count in the figures above.
    let (_, _, regular, _, _) = ingest(rows, false, None, &me).await?;

    let j = serde_json::json!({
        "scenario": "archive",
        "machine_cores": cores(),
        "ingest_samples": rows * 3,
        "ingest_seconds": ingest_s,
        "ingest_samples_per_s": ingest_rate,
        "ingest_samples_per_cpu_s": (rows * 3) as f64 / ingest_cpu.max(1e-9),
        "group_commit": "one flush per batch of 1000 events (3000 samples)",
        "bytes_on_disk": stats.bytes_on_disk,
        "sealed_bytes": stats.sealed_bytes,
        "bytes_per_sample_on_disk": stats.bytes_per_sample,
        "bytes_per_sample_chunks": stats.sealed_bytes as f64 / stats.samples.max(1) as f64,
        "regular_bytes_on_disk": regular.bytes_on_disk,
        "regular_bytes_per_sample_on_disk": regular.bytes_per_sample,
        "regular_bytes_per_sample_chunks": regular.sealed_bytes as f64 / regular.samples.max(1) as f64,
        "query_raw_1m_ms": raw_ms,
        "query_raw_points": raw_points,
        "query_step_1m_p99_ms": p99_ms,
        "query_step_1m_p99_points": p99_points,
        "query_step_1m_mean_ms": mean_ms,
        "rss_mib": rss_mib,
    });
    match output {
        Output::Json => crate::report::emit(j),
        Output::Table => {
            println!("archive: the archiver's store (sled), in process");
            println!("  machine cores            {}", cores());
            println!(
                "  ingest                   {} samples in {:.2} s: {:.0} samples/s ({:.0} per CPU-second), a flush per 3000 samples",
                rows * 3,
                ingest_s,
                ingest_rate,
                (rows * 3) as f64 / ingest_cpu.max(1e-9)
            );
            for (what, st) in [("jittered ±1 ms", &stats), ("regular 1 s", &regular)] {
                println!(
                    "  on disk, {what:<15} {} bytes = {:.2} bytes/sample (sled + log files); chunks alone {:.2} bytes/sample",
                    st.bytes_on_disk,
                    st.bytes_per_sample,
                    st.sealed_bytes as f64 / st.samples.max(1) as f64
                );
            }
            println!("  query 1M samples raw     {raw_ms:.1} ms ({raw_points} points)");
            println!("  query 1M, 1m p99         {p99_ms:.1} ms ({p99_points} buckets)");
            println!("  query 1M, 1m mean        {mean_ms:.1} ms");
            println!("  RSS                      {rss_mib:.0} MiB");
        }
    }
    Ok(())
}

/// `gma bench archive --export-parquet`: `samples` regular 1 s gauges of 1,000 hosts ingested
/// into a store, served by an archiver (in this process), then exported whole by `gma archive
/// export` in a child process, as Parquet and (for comparison) CSV: wall time, file size and
/// the exporter's peak RSS, which it prints itself (VmHWM).
pub async fn export_parquet(samples: u64, output: Output) -> anyhow::Result<()> {
    use anyhow::Context;
    if samples < 3_000 {
        anyhow::bail!("--samples must be at least 3000");
    }
    let me = std::process::id().to_string();
    let (_, _, _, rows, (tmp, store)) = ingest(samples / 3, false, None, &me).await?;
    drop(store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let cfg = gma_archiver::ArchiverConfig {
        listen: addr.clone(),
        data_dir: tmp.path().to_path_buf(),
        ..Default::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gma_archiver::run(cfg, listener, async {
        let _ = stop_rx.await;
    }));
    let base = 1_700_000_000_000_000_000i64;
    let ticks = (rows / 1000 + 2) as i64;
    let (from, to) = ((base - 1).to_string(), (base + ticks * 1_000_000_000).to_string());
    let exe = std::env::current_exe().context("cannot find the gma binary")?;
    let mut runs = Vec::new();
    for format in ["parquet", "csv"] {
        let out = tmp.path().join(format!("export.{format}"));
        let t = Instant::now();
        let o = tokio::process::Command::new(&exe)
            .args([
                "archive",
                "--archiver",
                &addr,
                "export",
                "host.load",
                "--from",
                &from,
                "--to",
                &to,
            ])
            .args(["--format", format, "--out"])
            .arg(&out)
            .output()
            .await
            .context("gma archive export")?;
        let secs = t.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            anyhow::bail!("gma archive export --format {format} failed: {err}");
        }
        // "wrote N samples of M series to FILE (peak RSS X MiB)"
        let exported: u64 = err
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("no sample count in: {err}"))?;
        let peak: f64 = err
            .split("peak RSS ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("no peak RSS in: {err}"))?;
        let bytes = std::fs::metadata(&out)?.len();
        std::fs::remove_file(&out)?;
        runs.push((format, exported, secs, bytes, peak));
    }
    let _ = stop_tx.send(());
    server
        .await
        .map_err(|e| anyhow!("archiver task: {e}"))?
        .map_err(|e| anyhow!("archiver: {e}"))?;
    drop(tmp);
    let j = serde_json::json!({
        "scenario": "archive-export",
        "machine_cores": cores(),
        "archived_samples": rows * 3,
        "exports": runs.iter().map(|(f, n, s, b, p)| serde_json::json!({
            "format": f, "samples": n, "seconds": s, "file_bytes": b,
            "bytes_per_sample": *b as f64 / (*n).max(1) as f64, "exporter_peak_rss_mib": p,
        })).collect::<Vec<_>>(),
    });
    match output {
        Output::Json => crate::report::emit(j),
        Output::Table => {
            println!(
                "archive export: {} samples (1,000 hosts x 3 fields, 1 s gauges) served by an archiver, exported by a `gma archive export` process",
                rows * 3
            );
            println!("  machine cores            {}", cores());
            for (f, n, s, b, p) in &runs {
                println!(
                    "  {f:<8} {n} samples in {s:.2} s ({:.0} samples/s), {b} bytes ({:.2} bytes/sample), exporter peak RSS {p:.0} MiB",
                    *n as f64 / s.max(1e-9),
                    *b as f64 / (*n).max(1) as f64
                );
            }
        }
    }
    Ok(())
}

/// The archiver process under test: its pid, its address and its metrics address, read from
/// the lines it prints on stderr.
struct ArchiverProc {
    child: tokio::process::Child,
    pid: String,
    addr: String,
    metrics: String,
}

impl ArchiverProc {
    async fn start(directory: &str, data: &std::path::Path) -> anyhow::Result<ArchiverProc> {
        use anyhow::Context;
        let mut child = crate::child::command()?
            .args(["archiver", "--listen", "127.0.0.1:0", "--directory", directory])
            .args([
                "--pattern",
                "host.load",
                "--metrics-listen",
                "127.0.0.1:0",
                "--data",
            ])
            .arg(data)
            .spawn()
            .context("cannot start the archiver")?;
        let pid = crate::child::pid(&child, "the archiver")?;
        let mut lines = crate::child::stderr_lines(&mut child, "the archiver")?;
        let (mut addr, mut metrics) = (None, None);
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while addr.is_none() || metrics.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = tokio::time::timeout(left, lines.next_line())
                .await
                .map_err(|_| anyhow!("the archiver did not start within 30 s"))??
                .ok_or_else(|| anyhow!("the archiver exited before listening"))?;
            if let Some(a) = line.strip_prefix("gma archiver listening on ") {
                addr = Some(a.trim().to_string());
            } else if let Some(a) = line.strip_prefix("gma archiver metrics on ") {
                metrics = Some(a.trim().to_string());
            }
        }
        crate::child::drain(lines);
        Ok(ArchiverProc {
            child,
            pid,
            addr: addr.unwrap_or_default(),
            metrics: metrics.unwrap_or_default(),
        })
    }

    async fn samples(&self) -> anyhow::Result<u64> {
        let ch = gma_consumer::connect(&self.addr).await?;
        let mut c = pb::archive_client::ArchiveClient::new(ch);
        Ok(c.stats(pb::ArchiveStatsRequest {}).await?.into_inner().samples)
    }

    /// The sum of the counter `name` in its Prometheus exposition.
    async fn counter(&self, name: &str) -> anyhow::Result<u64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.metrics).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
            .await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        Ok(body
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(k, _)| *k == name || k.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
            .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
            .sum::<f64>() as u64)
    }
}

/// `gma bench archive --live`: the archiver's live path by itself. A producer in this process
/// (registered in a directory process) holds `samples` (1,000 hosts × 3 doubles, the events of
/// the store-only run) in its resume ring; then a `gma archiver` process starts, discovers it and
/// drains the backlog through a real gRPC subscription (decode, series resolution, keep rules,
/// append, group commit with fdatasync), as fast as it can. Its samples/s and CPU-seconds per
/// million samples come from its own /proc between its first stored sample and the last; the
/// store-only figure of the same run (in process, `ingest`) stands beside them.
pub async fn live(samples: u64, output: Output) -> anyhow::Result<()> {
    if !(3_000..=90_000_000).contains(&samples) {
        anyhow::bail!(
            "--samples must lie in 3000..=90000000 with --live (the producer's ring holds them all)"
        );
    }
    let me = std::process::id().to_string();
    let rows = samples / 3;
    let total = rows * 3;
    let cluster = crate::dir::Cluster::start(1).await?;
    cluster
        .agreed_leader(std::time::Duration::from_secs(30), false)
        .await?;
    let directory = cluster.addrs.join(",");
    let p = gma_producer::Producer::new(gma_producer::ProducerConfig {
        registration: gma_core::registration::Registration {
            directory: Some(directory.clone()),
            id: Some("bench-live".into()),
            ..Default::default()
        },
        source: Some("bench-live".into()),
        host_sensors: false,
        buffer_events: rows as usize + 1000,
        ..gma_producer::ProducerConfig::default()
    })
    .map_err(|e| anyhow!("{e}"))?;
    let all = streams(1000);
    let schema = pb::EventSchema {
        name: "host.load".into(),
        version: 1,
        fields: all[0].fields.to_vec(),
        description: String::new(),
    };
    p.hub.add_schemas(&[schema]).map_err(|e| anyhow!("{e}"))?;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut batch = Vec::with_capacity(1000);
    let mut seq = 0u64;
    while seq < rows {
        batch.clear();
        for _ in 0..1000.min(rows - seq) {
            seq += 1;
            let s = &all[(seq as usize - 1) % all.len()];
            let e = event(s, seq, ((seq - 1) / all.len() as u64) as i64, &mut rng, true);
            batch.push(gma_core::event::EventData {
                name: s.name.clone(),
                source: s.source.clone(),
                timestamp_ns: e.timestamp_ns,
                numbers: e.numbers,
                strings: Vec::new(),
            });
        }
        if let (_, Err(e)) = p.hub.publish(&batch) {
            anyhow::bail!("the producer refused the benchmark's events: {e}");
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let producer = tokio::spawn(p.run(listener, async {
        let _ = stop_rx.await;
    }));

    let tmp = tempfile::Builder::new()
        .prefix("gma-bench-archive-live-")
        .tempdir()?;
    let mut arch = ArchiverProc::start(&directory, &tmp.path().join("archive")).await?;
    let started = Instant::now();
    let poll = std::time::Duration::from_millis(20);
    // From its first stored sample (discovery and subscription are not ingest) ...
    let (t0, cpu0, first) = loop {
        let n = arch.samples().await.unwrap_or(0);
        if n > 0 {
            break (Instant::now(), proc_usage(&arch.pid)?.0, n);
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            anyhow::bail!("the archiver stored nothing within 60 s");
        }
        tokio::time::sleep(poll).await;
    };
    // ... to the last.
    let mut last = (first, Instant::now());
    let stored = loop {
        let n = arch.samples().await?;
        if n >= total {
            break n;
        }
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > std::time::Duration::from_secs(30) {
            anyhow::bail!("the archiver stopped at {n} of {total} samples");
        }
        tokio::time::sleep(poll).await;
    };
    let secs = t0.elapsed().as_secs_f64();
    let (cpu1, rss_mib) = proc_usage(&arch.pid)?;
    let (hits, misses) = (
        arch.counter("gma_archiver_series_cache_hits_total").await?,
        arch.counter("gma_archiver_series_cache_misses_total").await?,
    );
    let st = tokio::process::Command::new("kill")
        .args(["-TERM", &arch.pid])
        .status()
        .await?;
    if st.success() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(30), arch.child.wait()).await;
    }
    let _ = stop_tx.send(());
    let _ = producer.await;
    drop(cluster);
    let live_samples = stored - first;
    let live_cpu = cpu1 - cpu0;
    let live_rate = live_samples as f64 / secs.max(1e-9);
    let live_per_m = live_cpu / live_samples.max(1) as f64 * 1e6;

    // The store alone, same events, in this process.
    let (store_s, store_cpu, _, store_rows, _) = ingest(rows, true, None, &me).await?;
    let store_rate = (store_rows * 3) as f64 / store_s.max(1e-9);
    let store_per_m = store_cpu / (store_rows * 3).max(1) as f64 * 1e6;
    let j = serde_json::json!({
        "scenario": "archive-live",
        "machine_cores": cores(),
        "producer": "in the benchmark process, its resume ring holding every event before the archiver starts",
        "samples": total,
        "live_measured_samples": live_samples,
        "live_seconds": secs,
        "live_samples_per_s": live_rate,
        "live_archiver_cpu_s": live_cpu,
        "live_archiver_cpu_s_per_m_samples": live_per_m,
        "live_samples_per_archiver_cpu_s": live_samples as f64 / live_cpu.max(1e-9),
        "live_archiver_rss_mib": rss_mib,
        "series_cache_hits": hits,
        "series_cache_misses": misses,
        "store_samples_per_s": store_rate,
        "store_cpu_s_per_m_samples": store_per_m,
        "live_over_store_cpu": live_per_m / store_per_m.max(1e-12),
    });
    match output {
        Output::Json => crate::report::emit(j),
        Output::Table => {
            println!("archive --live: a `gma archiver` process drains {total} samples (1,000 hosts x 3 fields) from a producer through gRPC");
            println!("  machine cores            {}", cores());
            println!(
                "  live ingest              {live_samples} samples in {secs:.2} s: {live_rate:.0} samples/s; archiver {live_cpu:.2} CPU-s = {live_per_m:.3} CPU-s per million samples ({:.0} samples per CPU-second), RSS {rss_mib:.0} MiB",
                live_samples as f64 / live_cpu.max(1e-9)
            );
            println!("  series cache             {hits} hits, {misses} misses");
            println!(
                "  store alone (in process) {} samples: {store_rate:.0} samples/s, {store_per_m:.3} CPU-s per million samples",
                store_rows * 3
            );
            println!(
                "  live / store CPU         {:.2}x",
                live_per_m / store_per_m.max(1e-12)
            );
        }
    }
    Ok(())
}
