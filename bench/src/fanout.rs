//! `gma bench fanout | stall | filter | forecast`: benchmarks that print figures (never
//! pass/fail thresholds).
//!
//! - `fanout`: one in-process producer, N consumers (each its own loopback gRPC connection and
//!   `ProducerStream`, all on `bench.*`, so they share one fan-out group and its encodings). For
//!   each N: a saturation phase (the publisher stays at most half the ring ahead of the slowest
//!   consumer, so nothing is dropped) reports events/s per consumer, delivered events/s, the
//!   process's CPU (it runs producer and consumers alike) and the batches the producer encoded
//!   per batch one consumer received (shared chunks + private batches: 1 with encode-once, N
//!   without); then, once every consumer has caught up, a fixed-rate phase reports sample ->
//!   consumer latency percentiles across all consumers. `--distinct` gives consumer i the change
//!   filter `delta_pct = (i+1)·1e-9 %`, which every bench event passes (field `a` of a series
//!   grows by the source count at each of its events), so the consumers receive the same events
//!   but each subscription is filtered and encoded privately: encode-once is off.
//! - `stall`: slow-consumer isolation. A fast consumer at a fixed rate alone (A), next to a
//!   consumer that subscribes with drop-oldest and never reads again (B), next to one with
//!   latest (C): the fast consumer's throughput and latency in each phase and their ratio to A,
//!   the process CPU and RSS at the start, peak and end of each phase, and what the stalled
//!   consumer is told when it finally reads (gaps, conflated counts).
//! - `filter`: cost per event of the subscription filters without gRPC: a hub of N events
//!   (1,000 sources, 3 fields) drained through a cursor with no filter, `when`, `delta_pct`,
//!   `min_interval_ms` (filtering and encoding, as a stream's task does).
//! - `forecast`: mean absolute error of the served (adaptive) forecast next to every fixed
//!   predictor on synthetic load traces and, optionally, a recorded trace.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_consumer::stream::{ProducerStream, Progress, StreamOptions};
use gma_core::event::EventData;
use gma_core::filter::Filter;
use gma_core::forecast::{evaluate, synthetic_load_trace, synthetic_load_trace_low_noise, Forecaster};
use gma_core::pattern::Pattern;
use gma_core::time::now_ns;
use gma_producer::subscription::{self, Selector, Spec};
use gma_producer::Hub;
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use prost::Message;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::args::Output;
use crate::report::{cores, proc_usage};
use crate::stream::{bench_events, bench_schema, start_producer};

/// Ring (resume buffer) of the fan-out producer, in events.
const FANOUT_RING: usize = 1 << 20;
/// Ring of the stall producer, in events: small enough that a stalled consumer falls out of it.
const STALL_RING: usize = 100_000;
/// Sources the bench events come from (series per event name).
const SOURCES: usize = 100;

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

/// A latency quantile in milliseconds.
fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn me() -> String {
    std::process::id().to_string()
}

/// Stamps `batch` with now and publishes it; field `a` of event j becomes `head + j`, so every
/// series' `a` grows at each of its events (what `--distinct`'s change filter lets through).
fn publish_at(hub: &Hub, batch: &mut [EventData]) {
    let ts = now_ns();
    let head = hub.lock().head();
    for (j, e) in batch.iter_mut().enumerate() {
        e.timestamp_ns = ts;
        e.numbers[0] = (head + j as u64) as f64;
    }
    let _ = hub.publish(batch);
}

fn bench_options() -> StreamOptions {
    StreamOptions {
        patterns: vec!["bench.*".into()],
        max_batch: 1000,
        reconnect: false,
        ..StreamOptions::default()
    }
}

/// What a running bench consumer has received so far.
#[derive(Default)]
struct Counters {
    /// Highest seq received.
    last: AtomicU64,
    events: AtomicU64,
    /// Batches with at least one event.
    batches: AtomicU64,
    dropped: AtomicU64,
    subscribed: AtomicBool,
}

/// A consumer task: reads its stream until `stop`, recording sample -> consumer latency while
/// `record` is set; returns its latency histogram.
struct Consumer {
    counters: Arc<Counters>,
    task: JoinHandle<anyhow::Result<Histogram<u64>>>,
}

fn spawn_consumer(
    addr: &str,
    opts: StreamOptions,
    from_seq: u64,
    record: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) -> Consumer {
    let counters = Arc::new(Counters::default());
    counters.last.store(from_seq, Ordering::Relaxed);
    let c = counters.clone();
    let mut s = ProducerStream::new(addr, opts);
    let task = tokio::spawn(async move {
        let mut lat = histogram()?;
        loop {
            let rec = record.load(Ordering::Relaxed);
            let (mut n, mut last) = (0u64, 0u64);
            let progress = tokio::select! {
                _ = stop.changed() => break,
                p = s.next_with(|e| {
                    n += 1;
                    last = e.seq;
                    if rec {
                        let us = (now_ns() - e.timestamp_ns).max(1000) / 1000;
                        let _ = lat.record(us as u64);
                    }
                }) => p.map_err(|e| anyhow!("{e}"))?,
            };
            match progress {
                None => break,
                Some(Progress::Subscribed { .. }) => c.subscribed.store(true, Ordering::Relaxed),
                Some(Progress::Batch { gaps, events, .. }) => {
                    if events > 0 {
                        c.batches.fetch_add(1, Ordering::Relaxed);
                    }
                    c.dropped
                        .fetch_add(gaps.iter().map(|g| g.dropped).sum(), Ordering::Relaxed);
                }
                Some(Progress::Reconnecting { error, .. }) => bail!("bench stream broke: {error}"),
            }
            c.events.fetch_add(n, Ordering::Relaxed);
            c.last.fetch_max(last, Ordering::Relaxed);
        }
        Ok(lat)
    });
    Consumer { counters, task }
}

/// Waits (polling every 10 ms) until `pred` holds; false after `timeout`.
async fn wait_until(timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !pred() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Publishes `rate` events/s in 1 ms ticks until `stop` is set.
fn spawn_rate_publisher(hub: Arc<Hub>, rate: u64, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let per_ms = (rate / 1000).max(1) as usize;
        let mut batch = bench_events(per_ms, SOURCES);
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            publish_at(&hub, &mut batch);
        }
    })
}

// ------------------------------------------------------------------------------------------
// fanout
// ------------------------------------------------------------------------------------------

/// Batches the producer encoded (shared chunks, private batches) and the consumers received.
#[derive(Clone, Copy, Default)]
struct Encodings {
    shared: u64,
    private: u64,
    received: u64,
}

impl Encodings {
    fn now(counters: &[Arc<Counters>]) -> Encodings {
        let (shared, private) = subscription::encode_counts();
        Encodings {
            shared,
            private,
            received: counters.iter().map(|c| c.batches.load(Ordering::Relaxed)).sum(),
        }
    }

    fn since(self, before: Encodings) -> Encodings {
        Encodings {
            shared: self.shared - before.shared,
            private: self.private - before.private,
            received: self.received - before.received,
        }
    }

    /// Encodings per batch one of `n` consumers received: 1 when every consumer gets the same
    /// encoded chunks, `n` when each subscription encodes its own batches.
    fn per_batch(&self, n: usize) -> f64 {
        (self.shared + self.private) as f64 / (self.received as f64 / n as f64).max(1e-9)
    }

    fn shared_pct(&self) -> f64 {
        self.shared as f64 * 100.0 / ((self.shared + self.private) as f64).max(1.0)
    }

    fn json(&self, n: usize) -> serde_json::Value {
        serde_json::json!({
            "shared_chunks_encoded": self.shared,
            "private_batches_encoded": self.private,
            "batches_received": self.received,
            "encodings_per_batch_per_consumer": self.per_batch(n),
        })
    }
}

struct FanoutRow {
    consumers: usize,
    seconds: f64,
    published: u64,
    delivered: u64,
    per_consumer_min: u64,
    per_consumer_max: u64,
    cpu_seconds: f64,
    encodings: Encodings,
    dropped: u64,
    caught_up: bool,
    latency_rate: f64,
    latency_cpu_cores: f64,
    latency_encodings: Encodings,
    latency: Histogram<u64>,
}

pub async fn fanout(
    duration: u64,
    consumers: Vec<usize>,
    rate: u64,
    distinct: bool,
    output: Output,
) -> anyhow::Result<()> {
    if duration == 0 || rate == 0 {
        bail!("--duration and --rate must be positive");
    }
    if consumers.is_empty() || consumers.contains(&0) {
        bail!("--consumers must list positive counts, e.g. 1,10,100");
    }
    let (hub, addr, stop) = start_producer(FANOUT_RING).await?;
    let mut rows = Vec::new();
    for &n in &consumers {
        rows.push(fanout_one(&hub, &addr, n, duration, rate, distinct).await?);
    }
    let _ = stop.send(());
    print_fanout(&rows, distinct, rate, output);
    Ok(())
}

async fn fanout_one(
    hub: &Arc<Hub>,
    addr: &str,
    n: usize,
    duration: u64,
    rate: u64,
    distinct: bool,
) -> anyhow::Result<FanoutRow> {
    let me = me();
    let (stop_tx, stop_rx) = watch::channel(false);
    let record = Arc::new(AtomicBool::new(false));
    let start_seq = hub.lock().head().saturating_sub(1);
    let fleet: Vec<Consumer> = (0..n)
        .map(|i| {
            let opts = StreamOptions {
                delta_pct: if distinct { 1e-9 * (i + 1) as f64 } else { 0.0 },
                ..bench_options()
            };
            spawn_consumer(addr, opts, start_seq, record.clone(), stop_rx.clone())
        })
        .collect();
    let counters: Vec<Arc<Counters>> = fleet.iter().map(|c| c.counters.clone()).collect();
    if !wait_until(Duration::from_secs(30), || {
        counters.iter().all(|c| c.subscribed.load(Ordering::Relaxed))
    })
    .await
    {
        bail!("{n} consumers did not all subscribe within 30 s");
    }

    // Saturation: as fast as the slowest consumer allows, never overflowing the ring.
    let done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (hub, counters, done) = (hub.clone(), counters.clone(), done.clone());
        tokio::task::spawn_blocking(move || {
            let mut batch = bench_events(1000, SOURCES);
            while !done.load(Ordering::Relaxed) {
                let head = hub.lock().head();
                let slowest = counters
                    .iter()
                    .map(|c| c.last.load(Ordering::Relaxed))
                    .min()
                    .unwrap_or(head);
                if head.saturating_sub(slowest) > (FANOUT_RING as u64) / 2 {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                publish_at(&hub, &mut batch);
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let snapshot = || -> Vec<u64> {
        counters
            .iter()
            .map(|c| c.events.load(Ordering::Relaxed))
            .collect()
    };
    let (t0, ev0, head0, cpu0, enc0) = (
        Instant::now(),
        snapshot(),
        hub.lock().head(),
        proc_usage(&me)?.0,
        Encodings::now(&counters),
    );
    tokio::time::sleep(Duration::from_secs(duration)).await;
    let (seconds, ev1, head1, cpu1, enc1) = (
        t0.elapsed().as_secs_f64(),
        snapshot(),
        hub.lock().head(),
        proc_usage(&me)?.0,
        Encodings::now(&counters),
    );
    done.store(true, Ordering::Relaxed);
    publisher.await?;
    let per: Vec<u64> = ev1.iter().zip(&ev0).map(|(b, a)| b - a).collect();

    // Everyone catches up before latency is measured (a backlog is not latency).
    let head = hub.lock().head();
    let caught_up = wait_until(Duration::from_secs(60), || {
        counters
            .iter()
            .all(|c| c.last.load(Ordering::Relaxed) + 1 >= head)
    })
    .await;

    // Fixed rate: latency across all consumers.
    let stop_pub = Arc::new(AtomicBool::new(false));
    let rate_pub = spawn_rate_publisher(hub.clone(), rate, stop_pub.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    record.store(true, Ordering::Relaxed);
    let (l0, lh0, lcpu0, lenc0) = (
        Instant::now(),
        hub.lock().head(),
        proc_usage(&me)?.0,
        Encodings::now(&counters),
    );
    tokio::time::sleep(Duration::from_secs(duration)).await;
    record.store(false, Ordering::Relaxed);
    let lsecs = l0.elapsed().as_secs_f64();
    let (lh1, lcpu1, lenc1) = (hub.lock().head(), proc_usage(&me)?.0, Encodings::now(&counters));
    stop_pub.store(true, Ordering::Relaxed);
    rate_pub.await?;
    let _ = stop_tx.send(true);
    let mut latency = histogram()?;
    for c in fleet {
        latency.add(c.task.await??)?;
    }
    Ok(FanoutRow {
        consumers: n,
        seconds,
        published: head1 - head0,
        delivered: per.iter().sum(),
        per_consumer_min: per.iter().copied().min().unwrap_or(0),
        per_consumer_max: per.iter().copied().max().unwrap_or(0),
        cpu_seconds: cpu1 - cpu0,
        encodings: enc1.since(enc0),
        dropped: counters.iter().map(|c| c.dropped.load(Ordering::Relaxed)).sum(),
        caught_up,
        latency_rate: (lh1 - lh0) as f64 / lsecs,
        latency_cpu_cores: (lcpu1 - lcpu0) / lsecs,
        latency_encodings: lenc1.since(lenc0),
        latency,
    })
}

fn print_fanout(rows: &[FanoutRow], distinct: bool, rate: u64, output: Output) {
    let derived = |r: &FanoutRow| {
        let cores_used = (r.cpu_seconds / r.seconds).max(0.01);
        (cores_used, r.delivered as f64 / r.seconds)
    };
    match output {
        Output::Json => {
            let list: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    let (cores_used, delivered) = derived(r);
                    serde_json::json!({
                        "consumers": r.consumers,
                        "seconds": r.seconds,
                        "published_events_per_s": r.published as f64 / r.seconds,
                        "delivered_events_per_s": delivered,
                        "events_per_s_per_consumer": {
                            "mean": delivered / r.consumers as f64,
                            "min": r.per_consumer_min as f64 / r.seconds,
                            "max": r.per_consumer_max as f64 / r.seconds,
                        },
                        "cpu_cores_used": cores_used,
                        "delivered_events_per_s_per_core": delivered / cores_used,
                        "encodings": r.encodings.json(r.consumers),
                        "dropped": r.dropped,
                        "caught_up_before_latency": r.caught_up,
                        "latency_rate_events_per_s": r.latency_rate,
                        "latency_cpu_cores_used": r.latency_cpu_cores,
                        "latency_encodings": r.latency_encodings.json(r.consumers),
                        "latency_samples": r.latency.len(),
                        "latency_ms": {
                            "p50": ms(&r.latency, 0.5), "p99": ms(&r.latency, 0.99),
                            "p999": ms(&r.latency, 0.999), "max": r.latency.max() as f64 / 1000.0,
                        },
                    })
                })
                .collect();
            crate::report::emit(serde_json::json!({
                "scenario": "fanout",
                "machine_cores": cores(),
                "distinct_filters": distinct,
                "rows": list,
            }));
        }
        Output::Table => {
            println!(
                "fanout: one producer -> N consumers of bench.* over loopback gRPC (one connection each), 3-value events, batches of 1000, {}",
                if distinct {
                    "each consumer with its own delta_pct filter (encode-once off)"
                } else {
                    "one fan-out group (encode-once)"
                }
            );
            println!(
                "  machine cores {}; cpu = the whole process (publisher, producer, all consumers)",
                cores()
            );
            println!("  saturation (publisher at most half the ring ahead of the slowest consumer):");
            println!(
                "  {:>9} {:>12} {:>23} {:>13} {:>10} {:>14} {:>10} {:>9} {:>8}",
                "consumers",
                "ev/s/cons",
                "(min..max)",
                "delivered/s",
                "cpu cores",
                "delivered/s/c",
                "enc/batch",
                "shared %",
                "dropped"
            );
            for r in rows {
                let (cores_used, delivered) = derived(r);
                println!(
                    "  {:>9} {:>12.0} {:>23} {:>13.0} {:>10.2} {:>14.0} {:>10.2} {:>9.1} {:>8}",
                    r.consumers,
                    delivered / r.consumers as f64,
                    format!(
                        "({:.0}..{:.0})",
                        r.per_consumer_min as f64 / r.seconds,
                        r.per_consumer_max as f64 / r.seconds
                    ),
                    delivered,
                    cores_used,
                    delivered / cores_used,
                    r.encodings.per_batch(r.consumers),
                    r.encodings.shared_pct(),
                    r.dropped
                );
            }
            println!("  latency at a fixed rate ({rate} ev/s asked), every consumer, sample -> consumer:");
            println!(
                "  {:>9} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9}",
                "consumers",
                "ev/s publ",
                "cpu cores",
                "p50 ms",
                "p99 ms",
                "p99.9 ms",
                "max ms",
                "samples",
                "enc/batch",
                "shared %"
            );
            for r in rows {
                println!(
                    "  {:>9} {:>10.0} {:>10.2} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>10} {:>10.2} {:>9.1}{}",
                    r.consumers,
                    r.latency_rate,
                    r.latency_cpu_cores,
                    ms(&r.latency, 0.5),
                    ms(&r.latency, 0.99),
                    ms(&r.latency, 0.999),
                    r.latency.max() as f64 / 1000.0,
                    r.latency.len(),
                    r.latency_encodings.per_batch(r.consumers),
                    r.latency_encodings.shared_pct(),
                    if r.caught_up {
                        ""
                    } else {
                        "  (consumers had not caught up after 60 s)"
                    }
                );
            }
            println!(
                "  enc/batch: batches the producer encoded (shared chunks + private) per batch one consumer received: 1 = encode-once, N = one encoding per consumer"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// stall
// ------------------------------------------------------------------------------------------

/// What a stalled consumer was told when it finally read.
#[derive(Default)]
struct Woken {
    events: u64,
    gaps: u64,
    dropped: u64,
    conflated: u64,
    complete: bool,
}

struct StallPhase {
    name: &'static str,
    stalled: Option<pb::SlowPolicy>,
    seconds: f64,
    events: u64,
    dropped: u64,
    published: u64,
    cpu_seconds: f64,
    rss_start: f64,
    rss_peak: f64,
    rss_end: f64,
    ring: u64,
    latency: Histogram<u64>,
    woken: Option<Woken>,
}

impl StallPhase {
    fn throughput(&self) -> f64 {
        self.events as f64 / self.seconds
    }
}

pub async fn stall(duration: u64, rate: u64, output: Output) -> anyhow::Result<()> {
    if duration == 0 || rate == 0 {
        bail!("--duration and --rate must be positive");
    }
    let (hub, addr, stop) = start_producer(STALL_RING).await?;
    // A full ring from the start: every phase measures the steady state.
    let mut batch = bench_events(1000, SOURCES);
    for _ in 0..STALL_RING / 1000 {
        publish_at(&hub, &mut batch);
    }
    let mut phases = Vec::new();
    for (name, stalled) in [
        ("A: fast consumer alone", None),
        (
            "B: + stalled drop-oldest consumer",
            Some(pb::SlowPolicy::DropOldest),
        ),
        ("C: + stalled latest consumer", Some(pb::SlowPolicy::Latest)),
    ] {
        phases.push(stall_phase(&hub, &addr, duration, rate, name, stalled).await?);
    }
    let _ = stop.send(());
    print_stall(&phases, rate, output);
    Ok(())
}

async fn stall_phase(
    hub: &Arc<Hub>,
    addr: &str,
    duration: u64,
    rate: u64,
    name: &'static str,
    stalled: Option<pb::SlowPolicy>,
) -> anyhow::Result<StallPhase> {
    let me = me();
    let rss_start = proc_usage(&me)?.1;
    let mut stuck = None;
    if let Some(policy) = stalled {
        let mut s = ProducerStream::new(
            addr,
            StreamOptions {
                policy,
                ..bench_options()
            },
        );
        // One call: the subscription is accepted (its first message read); then this stream
        // is not read again until the phase is over.
        match s.next_with(|_| {}).await.map_err(|e| anyhow!("{e}"))? {
            Some(Progress::Subscribed { .. }) => {}
            other => bail!("stalled consumer: unexpected {other:?}"),
        }
        stuck = Some(s);
    }
    // A burst larger than what HTTP/2 flow control lets into the stalled stream's windows
    // (a few MiB): from here on the stalled subscription is blocked in the producer. Every
    // phase gets the same burst.
    let mut batch = bench_events(1000, SOURCES);
    for _ in 0..(2 * STALL_RING) / 1000 {
        publish_at(hub, &mut batch);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (stop_tx, stop_rx) = watch::channel(false);
    let record = Arc::new(AtomicBool::new(false));
    let fast = spawn_consumer(
        addr,
        bench_options(),
        hub.lock().head().saturating_sub(1),
        record.clone(),
        stop_rx,
    );
    let c = fast.counters.clone();
    if !wait_until(Duration::from_secs(10), || c.subscribed.load(Ordering::Relaxed)).await {
        bail!("the fast consumer did not subscribe within 10 s");
    }
    let stop_pub = Arc::new(AtomicBool::new(false));
    let publisher = spawn_rate_publisher(hub.clone(), rate, stop_pub.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    record.store(true, Ordering::Relaxed);
    let (t0, ev0, head0, cpu0) = (
        Instant::now(),
        c.events.load(Ordering::Relaxed),
        hub.lock().head(),
        proc_usage(&me)?.0,
    );
    let mut rss_peak = rss_start;
    while t0.elapsed() < Duration::from_secs(duration) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rss_peak = rss_peak.max(proc_usage(&me)?.1);
    }
    record.store(false, Ordering::Relaxed);
    let (seconds, ev1, head1, (cpu1, rss_end)) = (
        t0.elapsed().as_secs_f64(),
        c.events.load(Ordering::Relaxed),
        hub.lock().head(),
        proc_usage(&me)?,
    );
    stop_pub.store(true, Ordering::Relaxed);
    publisher.await?;
    let _ = stop_tx.send(true);
    let latency = fast.task.await??;
    let (head, ring) = {
        let inner = hub.lock();
        (inner.head(), inner.head() - inner.oldest())
    };

    // The stalled consumer reads at last: what is it told?
    let woken = match stuck {
        None => None,
        Some(mut s) => {
            let mut w = Woken::default();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let mut last = 0;
                let step = tokio::time::timeout(Duration::from_secs(2), s.next_with(|e| last = e.seq)).await;
                match step {
                    Ok(Ok(Some(Progress::Batch {
                        events,
                        gaps,
                        conflated,
                    }))) => {
                        w.events += events as u64;
                        w.gaps += gaps.len() as u64;
                        w.dropped += gaps.iter().map(|g| g.dropped).sum::<u64>();
                        w.conflated += conflated;
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => bail!("stalled consumer: {e}"),
                    Err(_) => break,
                }
                if last + 1 >= head {
                    w.complete = true;
                    break;
                }
            }
            Some(w)
        }
    };
    Ok(StallPhase {
        name,
        stalled,
        seconds,
        events: ev1 - ev0,
        dropped: c.dropped.load(Ordering::Relaxed),
        published: head1 - head0,
        cpu_seconds: cpu1 - cpu0,
        rss_start,
        rss_peak: rss_peak.max(rss_end),
        rss_end,
        ring,
        latency,
        woken,
    })
}

fn print_stall(phases: &[StallPhase], rate: u64, output: Output) {
    let Some(base) = phases.first() else {
        return;
    };
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    match output {
        Output::Json => {
            let list: Vec<serde_json::Value> = phases
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "phase": p.name,
                        "stalled_policy": p.stalled.map(|s| s.as_str_name()),
                        "seconds": p.seconds,
                        "published_events_per_s": p.published as f64 / p.seconds,
                        "fast_events_per_s": p.throughput(),
                        "fast_throughput_ratio_to_a": ratio(p.throughput(), base.throughput()),
                        "fast_dropped": p.dropped,
                        "fast_latency_ms": {
                            "p50": ms(&p.latency, 0.5), "p99": ms(&p.latency, 0.99),
                            "p999": ms(&p.latency, 0.999), "max": p.latency.max() as f64 / 1000.0,
                        },
                        "fast_latency_ratio_to_a": {
                            "p50": ratio(ms(&p.latency, 0.5), ms(&base.latency, 0.5)),
                            "p99": ratio(ms(&p.latency, 0.99), ms(&base.latency, 0.99)),
                        },
                        "cpu_cores_used": p.cpu_seconds / p.seconds,
                        "rss_mb": {"start": p.rss_start, "peak": p.rss_peak, "end": p.rss_end},
                        "ring_events_at_end": p.ring,
                        "stalled_on_wake": p.woken.as_ref().map(|w| serde_json::json!({
                            "events": w.events, "gaps": w.gaps, "dropped": w.dropped,
                            "conflated": w.conflated, "reached_head": w.complete,
                        })),
                    })
                })
                .collect();
            crate::report::emit(serde_json::json!({
                "scenario": "stall",
                "machine_cores": cores(),
                "rate_events_per_s": rate,
                "ring_events": STALL_RING,
                "phases": list,
            }));
        }
        Output::Table => {
            println!(
                "stall: a fast consumer at {rate} ev/s, alone and next to a consumer that subscribed and stopped reading; loopback gRPC, ring {STALL_RING} events"
            );
            println!(
                "  machine cores {}; each phase starts with a burst of {} events so the stalled stream's flow-control windows are full",
                cores(),
                2 * STALL_RING
            );
            println!(
                "  {:<36} {:>10} {:>7} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6} {:>21} {:>7}",
                "phase",
                "fast ev/s",
                "/A",
                "p50 ms",
                "/A",
                "p99 ms",
                "/A",
                "p99.9 ms",
                "cpu",
                "rss MiB start/pk/end",
                "dropped"
            );
            for p in phases {
                println!(
                    "  {:<36} {:>10.0} {:>7.3} {:>9.3} {:>6.2} {:>9.3} {:>6.2} {:>9.3} {:>6.2} {:>21} {:>7}",
                    p.name,
                    p.throughput(),
                    ratio(p.throughput(), base.throughput()),
                    ms(&p.latency, 0.5),
                    ratio(ms(&p.latency, 0.5), ms(&base.latency, 0.5)),
                    ms(&p.latency, 0.99),
                    ratio(ms(&p.latency, 0.99), ms(&base.latency, 0.99)),
                    ms(&p.latency, 0.999),
                    p.cpu_seconds / p.seconds,
                    format!("{:.1}/{:.1}/{:.1}", p.rss_start, p.rss_peak, p.rss_end),
                    p.dropped
                );
            }
            for p in phases {
                if let Some(w) = &p.woken {
                    println!(
                        "  {}: on reading at last it got {} events, {} gap(s) covering {} dropped events, {} conflated{}; ring held {} events",
                        p.name,
                        w.events,
                        w.gaps,
                        w.dropped,
                        w.conflated,
                        if w.complete { "" } else { " (did not reach the head)" },
                        p.ring
                    );
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// filter
// ------------------------------------------------------------------------------------------

/// SplitMix64: a tiny deterministic generator for the bench's values.
struct SplitMix(u64);

impl SplitMix {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct FilterRow {
    name: &'static str,
    delivered: u64,
    bytes: usize,
    /// Median of the runs.
    seconds: f64,
}

const FILTER_SOURCES: usize = 1000;
const FILTER_RUNS: usize = 3;

/// A hub with `events` bench events: 1,000 sources, each sampled every 10 ms; `a` is a random
/// walk in [0, 1] (steps of up to ±0.1), `b` a multiplicative walk around 100 (±5 % steps),
/// `c` constant.
fn filter_hub(events: usize) -> anyhow::Result<Arc<Hub>> {
    let hub = Hub::new(1, events);
    hub.add_schemas(&[bench_schema()]).map_err(|e| anyhow!("{e}"))?;
    let mut rng = SplitMix(42);
    let names: Vec<String> = (0..FILTER_SOURCES).map(|s| format!("s{s}")).collect();
    let mut a = vec![0.5; FILTER_SOURCES];
    let mut b = vec![100.0; FILTER_SOURCES];
    let t0 = now_ns();
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..events {
        let (s, k) = (i % FILTER_SOURCES, i / FILTER_SOURCES);
        a[s] = (a[s] + (rng.uniform() - 0.5) * 0.2).clamp(0.0, 1.0);
        b[s] *= 1.0 + (rng.uniform() - 0.5) * 0.1;
        batch.push(EventData {
            name: "bench.x".into(),
            source: names[s].clone(),
            timestamp_ns: t0 + k as i64 * 10_000_000 + s as i64 * 1_000,
            numbers: vec![a[s], b[s], 1.0],
            strings: vec![],
        });
        if batch.len() == 10_000 || i + 1 == events {
            hub.publish(&batch).1.map_err(|e| anyhow!("{e}"))?;
            batch.clear();
        }
    }
    Ok(hub)
}

pub fn filter(events: usize, output: Output) -> anyhow::Result<()> {
    if events == 0 {
        bail!("--events must be positive");
    }
    let hub = filter_hub(events)?;
    let plain = Spec::plain(Selector {
        patterns: vec![Pattern::event("bench.*").map_err(|e| anyhow!("{e}"))?],
        sources: Vec::new(),
    });
    let when = |text: &str| -> anyhow::Result<Spec> {
        Ok(Spec {
            when: Some(Filter::parse(text).map_err(|e| anyhow!("{e}"))?),
            ..plain.clone()
        })
    };
    let cases: Vec<(&'static str, Spec)> = vec![
        ("no filter", plain.clone()),
        ("when a > 0.5", when("a > 0.5")?),
        ("when a > 2 (never true)", when("a > 2")?),
        (
            "delta_pct 20",
            Spec {
                delta_pct: Some(20.0),
                ..plain.clone()
            },
        ),
        (
            "min_interval_ms 100",
            Spec {
                min_interval_ms: 100,
                ..plain.clone()
            },
        ),
    ];
    let mut rows = Vec::new();
    for (name, spec) in cases {
        let mut times = Vec::new();
        let mut delivered = 0u64;
        let mut bytes = 0usize;
        for _ in 0..FILTER_RUNS {
            let (msgs, elapsed) = subscription::drain_for_bench(&hub, spec.clone());
            times.push(elapsed.as_secs_f64());
            // Counted after the clock stopped.
            delivered = 0;
            bytes = 0;
            for m in &msgs {
                bytes += m.len();
                delivered += pb::EventBatch::decode(m.clone())
                    .context("bench batch does not decode")?
                    .series_ids
                    .len() as u64;
            }
        }
        times.sort_by(f64::total_cmp);
        rows.push(FilterRow {
            name,
            delivered,
            bytes,
            seconds: times[times.len() / 2],
        });
    }
    let n = events as f64;
    match output {
        Output::Json => {
            let list: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "filter": r.name,
                        "events_in": events,
                        "events_out": r.delivered,
                        "encoded_bytes": r.bytes,
                        "seconds": r.seconds,
                        "ns_per_event_in": r.seconds * 1e9 / n,
                        "ns_per_event_out": if r.delivered > 0 { r.seconds * 1e9 / r.delivered as f64 } else { f64::NAN },
                    })
                })
                .collect();
            crate::report::emit(
                serde_json::json!({"scenario": "filter", "sources": FILTER_SOURCES, "runs": FILTER_RUNS, "rows": list}),
            );
        }
        Output::Table => {
            println!(
                "filter: {events} events (3 fields, {FILTER_SOURCES} sources, 10 ms apart per source) read from a hub through a subscription cursor, filtered and encoded, no gRPC; median of {FILTER_RUNS} runs"
            );
            println!(
                "  {:<26} {:>10} {:>7} {:>10} {:>12} {:>12}",
                "filter", "events out", "pass %", "MB encoded", "ns/event in", "ns/event out"
            );
            for r in &rows {
                println!(
                    "  {:<26} {:>10} {:>7.2} {:>10.1} {:>12.1} {:>12.1}",
                    r.name,
                    r.delivered,
                    r.delivered as f64 * 100.0 / n,
                    r.bytes as f64 / 1e6,
                    r.seconds * 1e9 / n,
                    if r.delivered > 0 {
                        r.seconds * 1e9 / r.delivered as f64
                    } else {
                        f64::NAN
                    }
                );
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// forecast
// ------------------------------------------------------------------------------------------

/// A recorded trace: one number per line, or JSON lines with `values.load1` (or `load1`), as
/// `gma subscribe host.load --output json` prints them; with JSON lines, only the first source
/// seen is kept (one series). Blank lines and `#` comments are skipped.
fn read_trace(path: &PathBuf) -> anyhow::Result<(String, Vec<f64>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut values = Vec::new();
    let mut source: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if let Ok(v) = l.parse::<f64>() {
            values.push(v);
            continue;
        }
        let j: serde_json::Value = serde_json::from_str(l)
            .with_context(|| format!("{} line {}: neither a number nor JSON", path.display(), i + 1))?;
        let Some(v) = j
            .pointer("/values/load1")
            .or_else(|| j.get("load1"))
            .and_then(serde_json::Value::as_f64)
        else {
            continue;
        };
        let src = j.get("source").and_then(|s| s.as_str()).unwrap_or("").to_string();
        match &source {
            None => source = Some(src),
            Some(s) if *s != src => continue,
            Some(_) => {}
        }
        values.push(v);
    }
    if values.is_empty() {
        bail!("{}: no values found", path.display());
    }
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let name = match source {
        Some(s) if !s.is_empty() => format!("{name} ({s} load1)"),
        Some(_) => format!("{name} (load1)"),
        None => name,
    };
    Ok((name, values))
}

pub fn forecast(trace: Option<PathBuf>, output: Output) -> anyhow::Result<()> {
    let mut traces: Vec<(String, Vec<f64>)> = Vec::new();
    for seed in 1..=5u64 {
        traces.push((format!("synthetic seed {seed}"), synthetic_load_trace(5000, seed)));
    }
    for seed in 1..=5u64 {
        traces.push((
            format!("low-noise seed {seed}"),
            synthetic_load_trace_low_noise(5000, seed),
        ));
    }
    if let Some(p) = &trace {
        traces.push(read_trace(p)?);
    }
    let evals: Vec<_> = traces.iter().map(|(name, t)| (name, evaluate(t))).collect();
    let methods = Forecaster::methods();
    let best = |e: &gma_core::forecast::Evaluation| {
        e.by_method
            .iter()
            .copied()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or(("-", f64::NAN))
    };
    let last = |e: &gma_core::forecast::Evaluation| e.method_mae("last").unwrap_or(f64::NAN);
    match output {
        Output::Json => {
            let list: Vec<serde_json::Value> = evals
                .iter()
                .map(|(name, e)| {
                    let by: serde_json::Map<String, serde_json::Value> = e
                        .by_method
                        .iter()
                        .map(|(m, v)| (m.to_string(), serde_json::json!(v)))
                        .collect();
                    let (bm, bv) = best(e);
                    serde_json::json!({
                        "trace": name,
                        "steps": e.n,
                        "served_mae": e.served_mae,
                        "last_mae": last(e),
                        "served_vs_last_pct": (e.served_mae / last(e) - 1.0) * 100.0,
                        "best_fixed": {"method": bm, "mae": bv},
                        "fixed_mae": by,
                    })
                })
                .collect();
            crate::report::emit(serde_json::json!({"scenario": "forecast", "traces": list}));
        }
        Output::Table => {
            println!(
                "forecast: mean absolute error of the served (adaptive) forecast vs the fixed predictors, one step ahead"
            );
            println!(
                "  {:<30} {:>6} {:>9} {:>9} {:>12} {:>18}",
                "trace", "steps", "served", "last", "served/last", "best fixed"
            );
            for (name, e) in &evals {
                let (bm, bv) = best(e);
                println!(
                    "  {:<30} {:>6} {:>9.4} {:>9.4} {:>+11.2}% {:>18}",
                    name,
                    e.n,
                    e.served_mae,
                    last(e),
                    (e.served_mae / last(e) - 1.0) * 100.0,
                    format!("{bm} {bv:.4}")
                );
            }
            println!("  every fixed predictor (MAE):");
            let mut head = format!("  {:<30}", "trace");
            for m in methods {
                head.push_str(&format!(" {m:>8}"));
            }
            println!("{head}");
            for (name, e) in &evals {
                let mut line = format!("  {name:<30}");
                for m in methods {
                    line.push_str(&format!(" {:>8.4}", e.method_mae(m).unwrap_or(f64::NAN)));
                }
                println!("{line}");
            }
        }
    }
    Ok(())
}
