//! gma-archiver: durable, compact event history that analysts query, aggregate and export —
//! "just another consumer" of the fabric.
//!
//! - [`chunk`]: the columnar compressed chunk (delta-of-delta timestamps, XOR-coded doubles,
//!   run-coded strings) one stream of events is stored in.
//! - [`store`]: the store: sealed chunks in an fsynced chunk log with sled as their index, the
//!   write-ahead log with group commit (both gma-durable logs), resume points, queries with
//!   in-scan downsampling, retention, stats.
//! - [`keep`]: the keep-policy (every abnormal event, a sampling of normal ones).
//! - [`promlabels`]: an archived series' Prometheus metric name and labels (PromQL API, remote
//!   write).
//! - [`remote_write`]: forwarding what is archived to a Prometheus-compatible store (remote
//!   write 1.0), with its own durable resume point.
//! - [`promql`]: the Prometheus HTTP query API (PromQL over the archive) on `http_listen`.
//! - [`provenance`]: optionally, each event's producer run and seq stored with it.
//! - [`server`]: the role: discovery and subscriptions through the directory, ingest with group
//!   commit, registration, retention, the `Archive` endpoint.
//! - [`service`]: the `Archive` gRPC service.
//! - [`telemetry`]: the names of the Prometheus metrics this crate records.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub mod chunk;
pub mod error;
pub mod keep;
pub mod promlabels;
pub mod promql;
pub mod provenance;
pub mod remote_write;
pub mod server;
pub mod service;
pub mod store;
pub mod telemetry;

pub use server::{run, run_with_rpc, ArchiverConfig, ArchiverError, ARCHIVE_ADDRESS_ATTR, MANNER};

/// Live figures of a running archiver (for `Stats`).
#[derive(Default)]
pub struct Counters {
    pub kept_abnormal: AtomicU64,
    pub sampled_out: AtomicU64,
    pub retention_deleted: AtomicU64,
    /// (when, samples made durable then), the last 10 s.
    recent: Mutex<VecDeque<(Instant, u64)>>,
    producers: Mutex<HashSet<String>>,
    /// Events producers reported lost before they reached the archiver.
    pub gap_events: AtomicU64,
    /// (producer, epoch) -> (highest seq received, events received); the newest
    /// [`MAX_RUNS_TRACKED`] runs.
    received: Mutex<std::collections::BTreeMap<(String, u64), (u64, u64)>>,
}

/// Producer runs whose reception [`Counters::received`] keeps.
pub const MAX_RUNS_TRACKED: usize = 4096;

/// The window of [`Counters::ingest_rate`].
const RATE_WINDOW: Duration = Duration::from_secs(10);

impl Counters {
    /// Notes events of one producer run up to `last_seq`.
    pub fn note_received(&self, producer: &str, epoch: u64, last_seq: u64, events: u64) {
        let mut g = self.received.lock();
        let e = g.entry((producer.to_string(), epoch)).or_insert((0, 0));
        e.0 = e.0.max(last_seq);
        e.1 += events;
        if g.len() > MAX_RUNS_TRACKED {
            // Forget the oldest run (smallest epoch).
            if let Some(k) = g.keys().min_by_key(|k| k.1).cloned() {
                g.remove(&k);
            }
        }
    }

    /// Every tracked run: (producer, epoch, highest seq, events).
    pub fn received(&self) -> Vec<(String, u64, u64, u64)> {
        let g = self.received.lock();
        g.iter().map(|((p, e), (s, n))| (p.clone(), *e, *s, *n)).collect()
    }

    pub fn add(&self, c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self, c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// `n` samples became durable now.
    pub fn ingested(&self, n: u64) {
        let now = Instant::now();
        let mut r = self.recent.lock();
        r.push_back((now, n));
        while r
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            r.pop_front();
        }
    }

    /// Samples per second made durable over the last 10 s.
    pub fn ingest_rate(&self) -> f64 {
        let now = Instant::now();
        let r = self.recent.lock();
        let total: u64 = r
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= RATE_WINDOW)
            .map(|(_, n)| n)
            .sum();
        total as f64 / RATE_WINDOW.as_secs_f64()
    }

    pub fn follow(&self, producer: &str, on: bool) {
        let mut p = self.producers.lock();
        if on {
            p.insert(producer.to_string());
        } else {
            p.remove(producer);
        }
    }

    pub fn producers(&self) -> u64 {
        self.producers.lock().len() as u64
    }
}
