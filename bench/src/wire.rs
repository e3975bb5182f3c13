//! `gma bench stream` across processes (the default; `--in-process` is the older one-process
//! run in [`crate::stream`]).
//!
//! Processes: a producer process, K consumer processes (`gma bench stream-consumer`, hidden)
//! holding N subscriptions between them, and this process, which runs the window and adds up
//! the books (and, with `--source ingest`, the publisher; with `--proxy`, a counting TCP
//! proxy):
//!
//! - `--source generator` (default): the producer process is `gma bench stream-producer`
//!   (hidden): the producer library `gma producer` runs (hub, ring, subscription policies, gRPC
//!   server), no sensors, and a bench-only thread publishing 3-value `bench.x` events into its
//!   hub at `--publish-rate` events/s (0: back to back). The stream path alone.
//! - `--source ingest`: the producer is a real `gma producer --no-host-sensors`, and this process
//!   pushes the events through its `Ingest` service (batches of `--batch`, `--publish-lanes`
//!   pushes in flight): the producer's CPU then includes decoding them.
//!
//! Either way nothing tells the source where the consumers are: the only flow control is the
//! producer's — its ring, the subscriptions' policy (`--policy`), HTTP/2 windows. With `block`
//! (the default) each subscription pins the ring at the next seq it has to read
//! ([`gma_producer::Hub::pin`]); the subscription's task stops reading when its channel and
//! HTTP/2 stream window are full (the consumer's socket is behind), and the generator, a source
//! that can wait, waits for room before each batch ([`gma_producer::Hub::publisher_with_room`]): the
//! figure is then what the stream sustains with nothing dropped. (An Ingest push is not held
//! back: with `--source ingest` block keeps events only within the ring's block reserve, then
//! gaps.) With `drop-oldest` the source runs free and the subscriptions' losses show as gaps.
//! Every consumer connection counts the bytes read from and written to its socket in its own
//! transport ([`gma_consumer::counted`]): everything gRPC and HTTP/2 put on the socket, both
//! ways, at the cost of an atomic add per read or write call. With `--proxy` the connections go
//! through a TCP proxy in this process that copies and counts them too (the same bytes: the
//! proxy's count is reported beside the consumers'); its CPU, a hop NATS does not have, is
//! this process's, reported apart from the producer's and consumers'. Each subscription (pattern
//! `*`) books every seq it receives: a seq below the next expected one is a duplicate, a jump
//! must be covered by the `Gap`s the producer reported; what is neither received nor covered
//! is `unexplained`. Drops are the gaps'.
//!
//! The window: once every subscription is live and the source has run 1 s, this process tells
//! the consumers (a `start` line on their stdin) to count (events and socket bytes), samples
//! /proc (and the proxy's counters), and after `--duration` s samples again and tells them `stop`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_consumer::counted::SocketBytes;
use gma_consumer::stream::{ProducerStream, Progress, StreamOptions};
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};
use tokio::task::JoinHandle;

use crate::args::{Output, Source, StreamPolicy, StreamProcs};
use crate::child::{self, wait_line};
use crate::report::{cores, emit, peak_rss_mib, proc_usage};
use crate::stream::{bench_events, bench_schema};

/// Sources the bench events come from.
const SOURCES: usize = 100;

// ------------------------------------------------------------------------------------------
// The counting proxy
// ------------------------------------------------------------------------------------------

/// A TCP proxy to one address that counts the bytes it copies each way.
pub struct Proxy {
    pub addr: String,
    /// Producer -> consumer.
    pub down: Arc<AtomicU64>,
    /// Consumer -> producer.
    pub up: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    pub async fn start(target: &str) -> anyhow::Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (down, up) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let target = target.to_string();
        let (d, u) = (down.clone(), up.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let _ = client.set_nodelay(true);
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(copy_counting(sr, cw, d.clone()));
                tokio::spawn(copy_counting(cr, sw, u.clone()));
            }
        });
        Ok(Proxy { addr, down, up, task })
    }

    /// Bytes copied so far, both ways.
    pub fn bytes(&self) -> u64 {
        self.down.load(Ordering::Relaxed) + self.up.load(Ordering::Relaxed)
    }
}

async fn copy_counting(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    count: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                count.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
    let _ = to.shutdown().await;
}

// ------------------------------------------------------------------------------------------
// Per-seq accounting
// ------------------------------------------------------------------------------------------

/// Every seq one subscription received, checked against the gaps the producer reported.
#[derive(Default, Debug, Clone)]
pub struct SeqBook {
    pub first: Option<u64>,
    next: u64,
    pub received: u64,
    pub duplicates: u64,
    /// Seqs skipped between received ones (jumps), all of them.
    pub missing: u64,
    /// Sum of `dropped` of the gaps reported.
    pub gap_dropped: u64,
    pub gaps: u64,
    /// Seqs of the jumps the reported gaps do not wholly cover (after [`SeqBook::finish`]).
    pub unexplained: u64,
    /// Jumps not yet covered by a gap: (from, to) inclusive.
    pending: Vec<(u64, u64)>,
    /// Gaps reported, (from, to) inclusive; the recent ones.
    reported: Vec<(u64, u64)>,
}

impl SeqBook {
    /// Books one seq; called per event, so inlined into the subscription's decode loop.
    #[inline]
    pub fn see(&mut self, seq: u64) {
        match self.first {
            None => {
                self.first = Some(seq);
                self.next = seq + 1;
                self.received += 1;
            }
            Some(_) if seq == self.next => {
                self.next += 1;
                self.received += 1;
            }
            Some(_) if seq < self.next => self.duplicates += 1,
            Some(_) => {
                self.pending.push((self.next, seq - 1));
                self.missing += seq - self.next;
                self.next = seq + 1;
                self.received += 1;
            }
        }
    }

    /// The gaps of a batch (after its events were seen): settles the jumps they cover.
    pub fn gaps(&mut self, gaps: &[pb::Gap]) {
        for g in gaps {
            self.gaps += 1;
            self.gap_dropped += g.dropped;
            self.reported.push((g.from_seq, g.to_seq));
        }
        let reported = &self.reported;
        self.pending.retain(|&(a, b)| {
            let covered: u64 = reported
                .iter()
                .map(|&(f, t)| t.min(b).saturating_add(1).saturating_sub(f.max(a)))
                .sum();
            covered < b - a + 1
        });
        // Keep the gaps that may still cover a later jump (a bounded, recent few).
        if self.reported.len() > 64 {
            let excess = self.reported.len() - 64;
            self.reported.drain(..excess);
        }
    }

    /// Ends the book: jumps no gap covered are unexplained.
    pub fn finish(&mut self) {
        self.unexplained += self.pending.drain(..).map(|(a, b)| b - a + 1).sum::<u64>();
    }

    /// Seqs from the first to the last received.
    pub fn span(&self) -> u64 {
        self.first.map_or(0, |f| self.next - f)
    }
}

// ------------------------------------------------------------------------------------------
// The consumer process (`gma bench stream-consumer`)
// ------------------------------------------------------------------------------------------

/// Window states a consumer process's subscriptions read.
pub(crate) const BEFORE: u8 = 0;
pub(crate) const COUNTING: u8 = 1;
pub(crate) const AFTER: u8 = 2;

/// Follows the window lines on stdin (read on a thread of its own: blocking reads): `start`
/// sets `state` to [`COUNTING`]; returns at `stop` or the end of stdin, having set [`AFTER`].
pub(crate) async fn follow_window(state: &tokio::sync::watch::Sender<u8>) {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let tx = state.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            match line.as_deref().map(str::trim) {
                Ok("start") => {
                    tx.send_replace(COUNTING);
                }
                Ok("stop") | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = done_tx.send(());
    });
    let _ = done_rx.await;
    state.send_replace(AFTER);
}

struct SubResult {
    book: SeqBook,
    window_events: u64,
    latency: Histogram<u64>,
}

/// `gma bench stream-consumer`: `subscribers` subscriptions to `addr` with `policy` and batches
/// of up to `max_batch`, each its own connection; prints `ready` once all are live, counts between `start` and `stop` lines on
/// stdin, then prints one JSON object with the books and exits.
pub async fn consumer(
    addr: String,
    subscribers: usize,
    policy: StreamPolicy,
    max_batch: u32,
) -> anyhow::Result<()> {
    if !(1..=10_000).contains(&max_batch) {
        bail!("--max-batch must be within 1..=10000");
    }
    let policy = match policy {
        StreamPolicy::Block => pb::SlowPolicy::Block,
        StreamPolicy::DropOldest => pb::SlowPolicy::DropOldest,
    };
    let (state_tx, state_rx) = tokio::sync::watch::channel(BEFORE);
    let live = Arc::new(AtomicU64::new(0));
    // Every byte this process's subscriptions read and write on their sockets, counted in
    // their own transport (gma_consumer::counted), read at `start` and at `stop`.
    let bytes = SocketBytes::new();
    let window_bytes = {
        let (mut state, bytes) = (state_rx.clone(), bytes.clone());
        tokio::spawn(async move {
            let mut at_start = (0, 0);
            while state.changed().await.is_ok() {
                let now = (bytes.read(), bytes.written());
                match *state.borrow_and_update() {
                    COUNTING => at_start = now,
                    AFTER => return (now.0 - at_start.0, now.1 - at_start.1),
                    _ => {}
                }
            }
            (0, 0)
        })
    };
    let mut tasks = Vec::new();
    for i in 0..subscribers {
        let mut s = ProducerStream::new(
            &addr,
            StreamOptions {
                patterns: vec!["*".into()],
                consumer_id: format!("bench-{}-{i}", std::process::id()),
                max_batch,
                policy,
                reconnect: false,
                ..StreamOptions::default()
            },
        )
        .with_socket_bytes(bytes.clone());
        let (mut state, live) = (state_rx.clone(), live.clone());
        tasks.push(tokio::spawn(async move {
            let mut r = SubResult {
                book: SeqBook::default(),
                window_events: 0,
                latency: Histogram::new_with_bounds(1, 600_000_000, 3)?,
            };
            loop {
                let st = *state.borrow_and_update();
                if st == AFTER {
                    break;
                }
                let (mut n, mut first_ts) = (0u64, None);
                let book = &mut r.book;
                let p = tokio::select! {
                    _ = state.changed() => continue,
                    p = s.next_with(|e| {
                        n += 1;
                        first_ts.get_or_insert(e.timestamp_ns);
                        book.see(e.seq);
                    }) => p.map_err(|e| anyhow!("subscription {i}: {e}"))?,
                };
                match p {
                    None => bail!("subscription {i}: the producer ended the stream"),
                    Some(Progress::Subscribed { .. }) => {
                        live.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Progress::Reconnecting { error, .. }) => bail!("subscription {i} broke: {error}"),
                    Some(Progress::Batch { gaps, .. }) => r.book.gaps(&gaps),
                }
                if st == COUNTING {
                    r.window_events += n;
                    if let Some(ts) = first_ts {
                        let _ = r.latency.record(((now_ns() - ts).max(1000) / 1000) as u64);
                    }
                }
            }
            r.book.finish();
            anyhow::Ok(r)
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while live.load(Ordering::Relaxed) < subscribers as u64 {
        if Instant::now() > deadline {
            bail!(
                "only {} of {subscribers} subscriptions to {addr} were accepted within 60 s",
                live.load(Ordering::Relaxed)
            );
        }
        if tasks.iter().any(|t| t.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("ready");
    follow_window(&state_tx).await;
    let mut subs = Vec::new();
    let mut lat = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for t in tasks {
        // A subscription waiting for its next batch is ended where it stands.
        let r = match tokio::time::timeout(Duration::from_secs(5), t).await {
            Ok(r) => r.context("subscription task")??,
            Err(_) => bail!("a subscription did not stop within 5 s"),
        };
        lat.add(&r.latency)?;
        subs.push(serde_json::json!({
            "received": r.book.received,
            "window_events": r.window_events,
            "duplicates": r.book.duplicates,
            "missing": r.book.missing,
            "gaps": r.book.gaps,
            "gap_dropped": r.book.gap_dropped,
            "unexplained": r.book.unexplained,
            "span": r.book.span(),
        }));
    }
    let (read, written) = window_bytes.await.context("the byte window")?;
    let q = |p: f64| lat.value_at_quantile(p) as f64 / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "socket_bytes": {"read": read, "written": written},
            "subscriptions": subs,
            "latency_ms": {"p50": q(0.5), "p99": q(0.99), "max": lat.max() as f64 / 1000.0, "batches": lat.len()},
        })
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------
// The producer process with a bench source (`gma bench stream-producer`)
// ------------------------------------------------------------------------------------------

/// `gma bench stream-producer`: the producer library `gma producer` runs (its hub, ring,
/// subscription policy and gRPC server), with no sensors and one bench-only source: a thread
/// that publishes `batch`-event batches of 3-value `bench.x` events into its hub at `rate`
/// events/s (0: back to back). It knows nothing of the consumers; it honours the producer's
/// block policy (waits for room before each batch, see [`gma_producer::Hub::publisher_with_room`]).
/// Prints `gma producer listening on ADDR` like `gma producer`, then runs until killed (or,
/// with `events` > 0, until it published that many, rounded up to whole batches). It
/// publishes through series handles resolved once ([`gma_producer::Hub::series`]), or, with
/// `by_name`, whole events looked up by name and source ([`gma_producer::Hub::publish`]).
/// With `wait_subscribers` > 0 it publishes only once that many block-policy subscriptions
/// are live and, with `events`, exits only once they have read all of them: the producer's
/// whole work for a fixed count of events streamed (callgrind).
pub async fn producer(
    rate: u64,
    batch: usize,
    buffer_events: usize,
    by_name: bool,
    events: u64,
    wait_subscribers: usize,
) -> anyhow::Result<()> {
    if batch == 0 || batch > buffer_events {
        bail!("--batch must be positive and at most --buffer-events");
    }
    let (hub, addr, _stop) = crate::stream::start_producer(buffer_events).await?;
    eprintln!("gma producer listening on {addr}");
    let source = tokio::task::spawn_blocking(move || {
        // Each source's series resolved once, as a sensor would: no lookup per event.
        let series = (0..SOURCES)
            .map(|s| hub.series("bench.x", &format!("s{s}")))
            .collect::<Result<Vec<_>, _>>();
        let series = match series {
            Ok(s) => s,
            Err(e) => return Err(anyhow::anyhow!("bench source: {e}")),
        };
        let mut by_name_events = bench_events(if by_name { batch } else { 0 }, SOURCES);
        // Subscribers come from another process: poll for them (a bench harness, not a test).
        let poll = |what: &str, done: &dyn Fn(&gma_producer::hub::HubInner) -> bool| {
            let deadline = Instant::now() + Duration::from_secs(600);
            while !done(&hub.lock()) {
                if Instant::now() > deadline {
                    return Err(anyhow::anyhow!("bench source: no {what} within 600 s"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(())
        };
        if wait_subscribers > 0 {
            poll("subscribers", &|i| i.pinned() >= wait_subscribers)?;
        }
        let t0 = Instant::now();
        let mut sent = 0u64;
        loop {
            if events > 0 && sent >= events {
                if wait_subscribers > 0 {
                    poll("catching up", &|i| i.unread() == 0)?;
                }
                return Ok(sent);
            }
            if rate > 0 {
                let due = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
                if sent + batch as u64 > due {
                    std::thread::sleep(Duration::from_micros(500));
                    continue;
                }
            }
            // A block subscription that has not read far enough holds the source back.
            let Some(mut p) = hub.publisher_with_room(batch, Instant::now() + Duration::from_millis(100))
            else {
                continue;
            };
            // The same events as `bench_events`: value i of the batch, from source i % 100.
            let ts = now_ns();
            if by_name {
                drop(p);
                for (j, e) in by_name_events.iter_mut().enumerate() {
                    e.timestamp_ns = ts;
                    e.numbers[0] = (sent + j as u64) as f64;
                }
                if let (_, Err(e)) = hub.publish(&by_name_events) {
                    return Err(anyhow::anyhow!("bench source: {e}"));
                }
                sent += batch as u64;
                continue;
            }
            for j in 0..batch {
                let v = [(sent + j as u64) as f64, 0.5, 1.0];
                if let Err(e) = p.publish(&series[j % SOURCES], ts, &v, &[]) {
                    return Err(anyhow::anyhow!("bench source: {e}"));
                }
            }
            drop(p);
            sent += batch as u64;
        }
    });
    let sent = source.await.context("bench source")??;
    eprintln!("bench source: published {sent} events");
    Ok(())
}

// ------------------------------------------------------------------------------------------
// The run
// ------------------------------------------------------------------------------------------

/// A child `gma` process of the run.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) pid: String,
}

impl Proc {
    pub(crate) fn spawn(name: &str, args: &[String], stdin: bool) -> anyhow::Result<Proc> {
        let mut cmd = child::command()?;
        if stdin {
            // The consumers' books come on stdout; the producer's is not read.
            cmd.stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped());
        }
        let child = cmd
            .args(args)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let pid = child::pid(&child, name)?;
        Ok(Proc {
            name: name.to_string(),
            child,
            pid,
        })
    }

    fn usage(&self) -> (f64, f64) {
        proc_usage(&self.pid).unwrap_or((f64::NAN, f64::NAN))
    }
}

/// Pushes bench events into the producer through `Ingest` until `stop`: `rate` events/s (0 =
/// as fast as it takes them), `batch` per push, from `lanes` concurrent pushers. Returns the
/// events the producer accepted.
fn spawn_publisher(
    addr: &str,
    rate: u64,
    batch: usize,
    lanes: usize,
    stop: tokio::sync::watch::Receiver<bool>,
) -> JoinHandle<anyhow::Result<u64>> {
    let addr = addr.to_string();
    tokio::spawn(async move {
        let ch = gma_consumer::connect(&addr).await.map_err(|e| anyhow!("{e}"))?;
        let schema = bench_schema();
        let events: Vec<pb::Event> = bench_events(batch, SOURCES)
            .iter()
            .map(|e| e.to_wire(0, &schema.fields))
            .collect();
        // The schema first, on its own.
        pb::ingest_client::IngestClient::new(ch.clone())
            .push(pb::IngestRequest {
                events: events[..1].to_vec(),
                schemas: vec![schema.clone()],
            })
            .await
            .map_err(|s| anyhow!("ingest the schema: {}", s.message()))?;
        let sent = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let mut lanes_tasks = Vec::new();
        for _ in 0..lanes.max(1) {
            let mut client = pb::ingest_client::IngestClient::new(ch.clone());
            let (sent, mut events, stop) = (sent.clone(), events.clone(), stop.clone());
            lanes_tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !*stop.borrow() {
                    if rate > 0 {
                        let due = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
                        if sent.load(Ordering::Relaxed) + batch as u64 > due {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                    }
                    sent.fetch_add(batch as u64, Ordering::Relaxed);
                    let ts = now_ns();
                    for e in events.iter_mut() {
                        i += 1;
                        e.timestamp_ns = ts;
                        if let Some(pb::Value {
                            kind: Some(pb::value::Kind::Number(a)),
                        }) = e.values.first_mut()
                        {
                            *a = i as f64;
                        }
                    }
                    client
                        .push(pb::IngestRequest {
                            events: events.clone(),
                            schemas: vec![],
                        })
                        .await
                        .map_err(|s| anyhow!("ingest: {}", s.message()))?;
                }
                anyhow::Ok(())
            }));
        }
        for t in lanes_tasks {
            t.await.context("publisher task")??;
        }
        Ok(sent.load(Ordering::Relaxed))
    })
}

pub(crate) async fn tell(stdin: &mut ChildStdin, what: &str) -> std::io::Result<()> {
    stdin.write_all(format!("{what}\n").as_bytes()).await?;
    stdin.flush().await
}

/// CPU seconds and RSS of every process at one instant, and the proxy's bytes (with
/// `--proxy`).
struct Sample {
    at: Instant,
    cpu: Vec<f64>,
    /// System (kernel) CPU seconds of each process.
    sys: Vec<f64>,
    /// Each process's read and write calls and their bytes (/proc/PID/io).
    io: Vec<ProcIo>,
    bytes: u64,
    down: u64,
}

fn sample(procs: &[&Proc], proxy: Option<&Proxy>) -> Sample {
    let me = std::process::id().to_string();
    let mut cpu: Vec<f64> = procs.iter().map(|p| p.usage().0).collect();
    cpu.push(proc_usage(&me).map(|u| u.0).unwrap_or(f64::NAN));
    let pids = procs.iter().map(|p| p.pid.as_str()).chain([me.as_str()]);
    let (sys, io) = pids.map(|p| (proc_sys(p), proc_io(p))).unzip();
    Sample {
        at: Instant::now(),
        cpu,
        sys,
        io,
        bytes: proxy.map_or(0, Proxy::bytes),
        down: proxy.map_or(0, |p| p.down.load(Ordering::Relaxed)),
    }
}

/// Write system calls of a process and the bytes they moved (`syscw`, `wchar` of
/// /proc/PID/io: `write`/`writev` on sockets included, which is how tokio writes; its socket
/// reads are `recv` calls, which /proc/PID/io does not count, so reads are left out).
#[derive(Debug, Clone, Copy, Default)]
struct ProcIo {
    writes: u64,
    write_bytes: u64,
}

fn proc_io(pid: &str) -> ProcIo {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    ProcIo {
        writes: field("syscw:"),
        write_bytes: field("wchar:"),
    }
}

/// System CPU seconds of a process (stime, field 15 of /proc/PID/stat).
fn proc_sys(pid: &str) -> f64 {
    crate::report::proc_stat_seconds(pid, &[12]).unwrap_or(f64::NAN)
}

pub async fn run(duration: u64, o: StreamProcs, output: Output) -> anyhow::Result<()> {
    if duration == 0 || o.subscribers == 0 || o.consumer_procs == 0 || o.batch == 0 || o.publish_lanes == 0 {
        bail!("--duration, --subscribers, --consumer-procs, --batch and --publish-lanes must be positive");
    }
    if o.batch > 10_000 {
        bail!("--batch is at most 10000 (the producer's Ingest limit)");
    }
    if !(1..=10_000).contains(&o.max_batch) {
        bail!("--max-batch must be within 1..=10000 (the producer's limit)");
    }
    if o.batch > o.buffer_events {
        bail!(
            "--batch ({}) is more than --buffer-events ({})",
            o.batch,
            o.buffer_events
        );
    }
    if o.consumer_procs > o.subscribers {
        bail!(
            "--consumer-procs ({}) is more than --subscribers ({})",
            o.consumer_procs,
            o.subscribers
        );
    }
    if gma_core::tls::client_tls_on() {
        bail!("the cross-process bench stream runs without TLS: leave out --tls-ca/GMA_TLS_CA");
    }
    let producer_args: Vec<String> = match o.source {
        Source::Ingest => vec![
            "producer".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--no-host-sensors".into(),
            "--source".into(),
            "bench".into(),
            "--buffer-events".into(),
            o.buffer_events.to_string(),
        ],
        Source::Generator => vec![
            "bench".into(),
            "stream-producer".into(),
            "--publish-rate".into(),
            o.publish_rate.to_string(),
            "--batch".into(),
            o.batch.to_string(),
            "--buffer-events".into(),
            o.buffer_events.to_string(),
        ]
        .into_iter()
        .chain(o.by_name.then(|| "--by-name".to_string()))
        .collect(),
    };
    let producer_name = match o.source {
        Source::Ingest => "gma producer",
        Source::Generator => "gma bench stream-producer (producer + bench source)",
    };
    let mut producer = Proc::spawn(producer_name, &producer_args, false)?;
    let mut lines = child::stderr_lines(&mut producer.child, "gma producer")?;
    let addr = wait_line(
        &mut lines,
        "gma producer listening on ",
        "gma producer",
        Duration::from_secs(30),
    )
    .await?;
    crate::child::drain(lines);
    // With --proxy the consumers connect through a counting proxy in this process (the
    // bench's older way to count socket bytes, a hop of its own CPU); by default they connect
    // to the producer directly and count the bytes in their own transport.
    let proxy = match o.proxy {
        true => Some(Proxy::start(&addr).await?),
        false => None,
    };
    let consumer_addr = proxy.as_ref().map_or(addr.clone(), |p| p.addr.clone());

    // Consumer processes: the subscriptions spread evenly.
    let mut consumers = Vec::new();
    for k in 0..o.consumer_procs {
        let n = o.subscribers / o.consumer_procs + usize::from(k < o.subscribers % o.consumer_procs);
        let mut p = Proc::spawn(
            &format!("gma bench stream-consumer #{k} ({n} subscriptions)"),
            &[
                "bench".into(),
                "stream-consumer".into(),
                "--addr".into(),
                consumer_addr.clone(),
                "--subscribers".into(),
                n.to_string(),
                "--policy".into(),
                o.policy.as_str().into(),
                "--max-batch".into(),
                o.max_batch.to_string(),
            ],
            true,
        )?;
        let stdout = p
            .child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no consumer stdout"))?;
        let stdin = p.child.stdin.take().ok_or_else(|| anyhow!("no consumer stdin"))?;
        let stderr = p
            .child
            .stderr
            .take()
            .ok_or_else(|| anyhow!("no consumer stderr"))?;
        let err_tail = Arc::new(parking_lot::Mutex::new(String::new()));
        let tail = err_tail.clone();
        tokio::spawn(async move {
            let mut l = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = l.next_line().await {
                let mut t = tail.lock();
                if t.len() < 4096 {
                    t.push_str(&line);
                    t.push('\n');
                }
            }
        });
        consumers.push((p, tokio::io::BufReader::new(stdout).lines(), stdin, err_tail));
    }
    for (p, out, _, err) in consumers.iter_mut() {
        if let Err(e) = wait_line(out, "ready", &p.name, Duration::from_secs(90)).await {
            bail!("{e}; its stderr: {}", err.lock());
        }
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let publisher = match o.source {
        Source::Ingest => spawn_publisher(&addr, o.publish_rate, o.batch, o.publish_lanes, stop_rx),
        Source::Generator => tokio::spawn(async { anyhow::Ok(0) }),
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    if o.source == Source::Ingest && publisher.is_finished() {
        publisher.await.context("publisher")??;
        bail!("the publisher stopped early");
    }
    let mut all: Vec<&Proc> = vec![&producer];
    all.extend(consumers.iter().map(|c| &c.0));
    let s0 = sample(&all, proxy.as_ref());
    drop(all);
    for c in consumers.iter_mut() {
        tell(&mut c.2, "start")
            .await
            .context("tell a consumer to start")?;
    }
    tokio::time::sleep(Duration::from_secs(duration)).await;
    let mut all: Vec<&Proc> = vec![&producer];
    all.extend(consumers.iter().map(|c| &c.0));
    let s1 = sample(&all, proxy.as_ref());
    let rss: Vec<(f64, Option<f64>)> = all.iter().map(|p| (p.usage().1, peak_rss_mib(&p.pid))).collect();
    drop(all);
    for c in consumers.iter_mut() {
        tell(&mut c.2, "stop").await.context("tell a consumer to stop")?;
    }

    // The books.
    let mut subs = Vec::new();
    let mut lat_p99: f64 = 0.0;
    let mut lat_p50: f64 = 0.0;
    let (mut read, mut written) = (0u64, 0u64);
    for (p, out, _, err) in consumers.iter_mut() {
        let json = match wait_line(out, "{", &p.name, Duration::from_secs(30)).await {
            Ok(rest) => format!("{{{rest}"),
            Err(e) => bail!("{e}; its stderr: {}", err.lock()),
        };
        let v: serde_json::Value =
            serde_json::from_str(&json).with_context(|| format!("{}: bad JSON {json}", p.name))?;
        read += v["socket_bytes"]["read"].as_u64().unwrap_or(0);
        written += v["socket_bytes"]["written"].as_u64().unwrap_or(0);
        lat_p50 = lat_p50.max(v["latency_ms"]["p50"].as_f64().unwrap_or(f64::NAN));
        lat_p99 = lat_p99.max(v["latency_ms"]["p99"].as_f64().unwrap_or(f64::NAN));
        if let Some(a) = v["subscriptions"].as_array() {
            subs.extend(a.iter().cloned());
        }
    }
    let _ = stop_tx.send(true);
    let published = publisher.await.context("publisher")??;
    for (p, ..) in consumers.iter_mut() {
        let _ = p.child.wait().await;
    }
    let _ = producer.child.kill().await;

    let sum = |k: &str| subs.iter().map(|s| s[k].as_u64().unwrap_or(0)).sum::<u64>();
    let window_events = sum("window_events");
    let seconds = s1.at.duration_since(s0.at).as_secs_f64();
    let per_sub: Vec<u64> = subs
        .iter()
        .map(|s| s["window_events"].as_u64().unwrap_or(0))
        .collect();
    let min_sub = per_sub.iter().copied().min().unwrap_or(0) as f64 / seconds;
    // The consumers' own counts (their sockets, between their `start` and `stop`); the
    // proxy's, the same bytes copied, are reported beside them with --proxy.
    let window_bytes = read + written;
    let bytes_per_event = window_bytes as f64 / window_events.max(1) as f64;
    let mut names: Vec<String> = vec![producer.name.clone()];
    names.extend(consumers.iter().map(|c| c.0.name.clone()));
    names.push(match (o.source, o.proxy) {
        (Source::Ingest, true) => "gma bench (Ingest publisher and counting proxy)".into(),
        (Source::Ingest, false) => "gma bench (Ingest publisher)".into(),
        (Source::Generator, true) => "gma bench (counting proxy)".into(),
        (Source::Generator, false) => "gma bench (run and books)".into(),
    });
    let me = std::process::id().to_string();
    let processes: Vec<serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let cpu = s1.cpu[i] - s0.cpu[i];
            let (a, b) = (s0.io.get(i).copied().unwrap_or_default(), s1.io.get(i).copied().unwrap_or_default());
            let (rss_end, peak) = rss.get(i).copied().unwrap_or_else(|| {
                (
                    proc_usage(&me).map(|u| u.1).unwrap_or(f64::NAN),
                    peak_rss_mib(&me),
                )
            });
            serde_json::json!({
                "name": name, "cpu_seconds": cpu, "cores": cpu / seconds,
                "sys_cpu_seconds": s1.sys.get(i).copied().unwrap_or(f64::NAN) - s0.sys.get(i).copied().unwrap_or(f64::NAN),
                "write_calls": b.writes - a.writes, "write_bytes": b.write_bytes - a.write_bytes,
                "rss_mib_end": rss_end, "rss_mib_peak": peak,
            })
        })
        .collect();
    let fig = serde_json::json!({
        "scenario": "stream",
        "mode": "processes",
        "source": match o.source { Source::Generator => "generator", Source::Ingest => "ingest" },
        "subscribers": o.subscribers,
        "consumer_procs": o.consumer_procs,
        "publish_rate": o.publish_rate,
        "batch": o.batch,
        "publish_lanes": o.publish_lanes,
        "buffer_events": o.buffer_events,
        "policy": o.policy.as_str(),
        "max_batch": o.max_batch,
        "seconds": seconds,
        "ingest_published_total": published,
        "window_events": window_events,
        "events_per_s": window_events as f64 / seconds,
        "per_subscriber_events_per_s": window_events as f64 / seconds / o.subscribers as f64,
        "min_subscriber_events_per_s": min_sub,
        "socket_bytes": window_bytes,
        "socket_bytes_down": read,
        "socket_bytes_counted_at": if o.proxy { "consumers' transport, through the proxy" } else { "consumers' transport" },
        "proxy_bytes": o.proxy.then(|| s1.bytes - s0.bytes),
        "proxy_bytes_down": o.proxy.then(|| s1.down - s0.down),
        "socket_bytes_per_event": bytes_per_event,
        "received": sum("received"),
        "dropped": sum("gap_dropped"),
        "gaps": sum("gaps"),
        "missing": sum("missing"),
        "unexplained": sum("unexplained"),
        "duplicates": sum("duplicates"),
        "span": sum("span"),
        "latency_ms": {"p50_worst_process": lat_p50, "p99_worst_process": lat_p99},
        "subscriptions": subs,
        "processes": processes,
    });
    match output {
        Output::Json => emit(fig),
        Output::Table => print_table(&fig),
    }
    Ok(())
}

fn print_table(f: &serde_json::Value) {
    let n = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
    let offered = if f["publish_rate"].as_u64() == Some(0) {
        "back to back".to_string()
    } else {
        format!("{} events/s offered", f["publish_rate"])
    };
    println!(
        "stream across processes: producer process -> {} subscriptions ({}) in {} consumer processes, \
         3-value events from the {} source ({offered}), bytes counted on the consumers' sockets",
        f["subscribers"],
        f["policy"].as_str().unwrap_or("?"),
        f["consumer_procs"],
        f["source"].as_str().unwrap_or("?"),
    );
    println!("  machine cores            {}", cores());
    println!(
        "  delivered                {:.0} events/s over {:.1} s (all subscriptions)",
        n("events_per_s"),
        n("seconds")
    );
    println!(
        "  per subscription         {:.0} events/s (slowest {:.0})",
        n("per_subscriber_events_per_s"),
        n("min_subscriber_events_per_s")
    );
    println!(
        "  on the socket            {:.1} bytes/event ({} bytes, counted in the {})",
        n("socket_bytes_per_event"),
        f["socket_bytes"],
        f["socket_bytes_counted_at"].as_str().unwrap_or("?")
    );
    if let Some(p) = f["proxy_bytes"].as_u64() {
        println!("  through the proxy        {p} bytes");
    }
    println!(
        "  protocol accounting      {} received, {} dropped in {} gaps, {} unexplained, {} duplicates",
        f["received"], f["dropped"], f["gaps"], f["unexplained"], f["duplicates"]
    );
    println!(
        "  latency (per batch)      p50 {:.3} ms  p99 {:.3} ms (worst consumer process)",
        f["latency_ms"]["p50_worst_process"].as_f64().unwrap_or(f64::NAN),
        f["latency_ms"]["p99_worst_process"].as_f64().unwrap_or(f64::NAN)
    );
    if let Some(ps) = f["processes"].as_array() {
        for p in ps {
            let per = |b: &str, c: &str| {
                p[b].as_f64().unwrap_or(f64::NAN) / p[c].as_f64().unwrap_or(f64::NAN).max(1.0)
            };
            println!(
                "  {:<45} {:.2} cores ({:.2} system), RSS {:.1} MiB, {} writes of {:.0} B",
                p["name"].as_str().unwrap_or("?"),
                p["cores"].as_f64().unwrap_or(f64::NAN),
                p["sys_cpu_seconds"].as_f64().unwrap_or(f64::NAN) / n("seconds"),
                p["rss_mib_end"].as_f64().unwrap_or(f64::NAN),
                p["write_calls"],
                per("write_bytes", "write_calls"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gap(from: u64, to: u64) -> pb::Gap {
        pb::Gap {
            from_seq: from,
            to_seq: to,
            dropped: to - from + 1,
            reason: "buffer window exceeded".into(),
        }
    }

    #[test]
    fn a_book_settles_jumps_with_gaps_and_keeps_the_rest() {
        let mut b = SeqBook::default();
        for s in [5, 6, 7] {
            b.see(s);
        }
        // A jump over 8..=10, reported as a gap with the batch.
        for s in [11, 12] {
            b.see(s);
        }
        b.gaps(&[gap(8, 10)]);
        // A seq seen twice.
        b.see(12);
        // A jump over 13..=14 that no gap covers, and one over 16 covered by two gaps in part.
        b.see(15);
        b.gaps(&[]);
        b.see(20);
        b.gaps(&[gap(16, 17), gap(18, 19)]);
        b.finish();
        assert_eq!(b.received, 7);
        assert_eq!(b.duplicates, 1);
        assert_eq!(b.missing, 3 + 2 + 4);
        assert_eq!(b.unexplained, 2);
        assert_eq!(b.gaps, 3);
        assert_eq!(b.gap_dropped, 3 + 2 + 2);
        assert_eq!(b.span(), 16);
        assert_eq!(b.received + b.missing, b.span());
    }

    #[test]
    fn a_jump_a_gap_covers_only_in_part_is_unexplained() {
        let mut b = SeqBook::default();
        b.see(1);
        b.see(10);
        b.gaps(&[gap(2, 5)]);
        b.finish();
        assert_eq!(b.unexplained, 8);
    }
}
