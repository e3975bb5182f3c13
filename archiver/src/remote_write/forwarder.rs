//! The forwarder loop: list the archived numeric series, build a request from their resume
//! points, record it as in flight (fsync), send it until it is answered (backoff on 5xx, 429,
//! connection errors and timeouts), then record its series as acknowledged (fsync).
//!
//! One request is in flight at a time, so each series reaches the receiver in timestamp order.
//! After a restart, a request that was in flight is read again from the store with the same
//! bounds and sent again: the receiver either stores it (it never had it) or already has it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gma_core::pattern::Pattern;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

use super::batch::{self, Batch, Candidate, SeriesKey, NS_PER_MS};
use super::client::{Client, Outcome};
use super::state::State;
use super::{wire, RemoteWriteError, Settings};
use crate::store::Store;
use crate::telemetry as t;

/// While behind, the pending count is recounted at most this often.
const CENSUS_EVERY: Duration = Duration::from_secs(5);

/// The forwarder's inputs.
pub struct Forwarder {
    pub settings: Settings,
    pub store: Arc<Store>,
    /// Held by the ingest loop from its appends until they are durable: the series list is taken
    /// under it, so a request never reaches past what is on disk.
    pub gate: Arc<Mutex<()>>,
    pub data_dir: PathBuf,
}

/// Loads the resume state (an unreadable one is an error: the role does not start) and starts
/// the loop; it returns when `stop` turns true.
pub fn spawn(f: Forwarder, stop: watch::Receiver<bool>) -> Result<JoinHandle<()>, RemoteWriteError> {
    let state = State::load(&f.data_dir, &f.settings.url)?;
    let client = Client::new(
        f.settings.uri.clone(),
        f.settings.tls.clone(),
        f.settings.headers.clone(),
        f.settings.timeout,
    )?;
    tracing::info!(url = %f.settings.url, in_flight = state.in_flight.is_some(), series = state.acked.len(), "remote write forwarding");
    Ok(tokio::spawn(run(f, state, client, stop)))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RemoteWriteError> + Send + 'static,
) -> Result<T, RemoteWriteError> {
    tokio::task::spawn_blocking(f).await?
}

async fn save(state: &State, dir: &std::path::Path) -> Result<(), RemoteWriteError> {
    let (s, d) = (state.clone(), dir.to_path_buf());
    blocking(move || s.save(&d)).await
}

/// Sleeps `d`; false when `stop` turned true meanwhile.
async fn pause(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = stop.wait_for(|s| *s) => false,
        _ = tokio::time::sleep(d) => true,
    }
}

struct Loop {
    f: Forwarder,
    state: State,
    client: Client,
    /// Rotation of the series list, so no series waits behind others' backlog forever.
    cursor: usize,
    pending: u64,
    /// The newest millisecond acknowledged (the gauge).
    last_ack: i64,
    last_census: Option<Instant>,
}

async fn run(f: Forwarder, state: State, client: Client, mut stop: watch::Receiver<bool>) {
    // The gauge starts from the resume state (the newest acknowledged before a restart).
    let last_ack = state.acked.values().copied().max().unwrap_or(i64::MIN);
    if last_ack > i64::MIN {
        metrics::gauge!(t::RW_LAST_ACK).set(last_ack as f64 / 1000.0);
    }
    let mut l = Loop {
        f,
        state,
        client,
        cursor: 0,
        pending: 0,
        last_ack,
        last_census: None,
    };
    while !*stop.borrow() {
        let next = match l.state.in_flight.clone() {
            Some(bounds) => {
                let store = l.f.store.clone();
                blocking(move || Ok(batch::rebuild(&store, &bounds)?))
                    .await
                    .map(|b| (b, false))
            }
            None => l.next_batch().await.map(|b| (b, true)),
        };
        let (batch, fresh) = match next {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "remote write: cannot read the store; trying again");
                if !pause(l.f.settings.max_backoff, &mut stop).await {
                    return;
                }
                continue;
            }
        };
        if batch.samples() == 0 {
            if l.state.in_flight.is_some() {
                // Its samples are gone (retention): nothing to re-send.
                l.state.settle();
                l.persist().await;
                continue;
            }
            l.pending = 0;
            metrics::gauge!(t::RW_PENDING).set(0.0);
            if !pause(l.f.settings.interval, &mut stop).await {
                return;
            }
            continue;
        }
        if fresh {
            l.state.in_flight = Some(batch.bounds());
            if let Err(e) = save(&l.state, &l.f.data_dir).await {
                tracing::error!(error = %e, "remote write: cannot record the request in flight; not sending it");
                l.state.in_flight = None;
                if !pause(l.f.settings.max_backoff, &mut stop).await {
                    return;
                }
                continue;
            }
        }
        let Some(acked) = l.send(&batch, fresh, &mut stop).await else {
            return;
        };
        l.state.settle();
        l.persist().await;
        let n = batch.samples() as u64;
        l.pending = l.pending.saturating_sub(n);
        metrics::gauge!(t::RW_PENDING).set(l.pending as f64);
        if acked {
            metrics::counter!(t::RW_SENT).increment(n);
            if let Some(newest) = batch
                .series
                .iter()
                .filter_map(|s| s.samples.last())
                .map(|s| s.0)
                .max()
            {
                if newest > l.last_ack {
                    l.last_ack = newest;
                    metrics::gauge!(t::RW_LAST_ACK).set(newest as f64 / 1000.0);
                }
            }
        }
    }
}

impl Loop {
    async fn persist(&mut self) {
        if let Err(e) = save(&self.state, &self.f.data_dir).await {
            // The file keeps the request as in flight: a restart sends it again.
            tracing::error!(error = %e, "remote write: cannot record the acknowledgement");
        }
    }

    /// A new request from the series list (taken while no ingest group is between its append
    /// and its fsync).
    async fn next_batch(&mut self) -> Result<Batch, RemoteWriteError> {
        let listed = {
            let _durable = self.f.gate.lock().await;
            self.f.store.series(&Pattern::any(), None)
        };
        // Series gone from the store (retention) are forgotten.
        let present: std::collections::HashSet<SeriesKey> = listed.iter().map(SeriesKey::of).collect();
        self.state.acked.retain(|k, _| present.contains(k));
        let mut candidates: Vec<Candidate> = listed
            .into_iter()
            .filter(|s| !s.is_string)
            .map(|s| Candidate {
                acked: self.state.acked.get(&SeriesKey::of(&s)).copied(),
                series: s,
            })
            .filter(|c| c.acked.is_none_or(|a| a < c.series.last_ts.div_euclid(NS_PER_MS)))
            .collect();
        if candidates.is_empty() {
            return Ok(Batch::default());
        }
        let start = self.cursor % candidates.len();
        candidates.rotate_left(start);
        let floor = self
            .f
            .settings
            .max_backlog_ms
            .map(|b| gma_core::time::now_ns().div_euclid(NS_PER_MS) - b);
        let census = self.last_census.is_none_or(|t| t.elapsed() >= CENSUS_EVERY);
        let store = self.f.store.clone();
        let budget = self.f.settings.batch_samples;
        let (built, counted) = blocking(move || {
            let built = batch::build(&store, &candidates, budget, floor)?;
            let counted = if built.full && census {
                Some(batch::pending(&store, &candidates)?)
            } else {
                None
            };
            Ok((built, counted))
        })
        .await?;
        let skipped: u64 = built.skipped.iter().map(|s| s.2).sum::<u64>() + built.repeats;
        if skipped > 0 {
            metrics::counter!(t::RW_SKIPPED).increment(skipped);
        }
        for (k, resume, n) in &built.skipped {
            if *n > 0 {
                tracing::warn!(event = %k.event, source = %k.source, field = %k.field, samples = n, "remote write: samples older than max_backlog skipped");
            }
            let e = self.state.acked.entry(k.clone()).or_insert(*resume);
            *e = (*e).max(*resume);
        }
        if built.batch.samples() == 0 && !built.skipped.is_empty() {
            self.persist().await;
        }
        self.cursor = start + built.batch.series.len();
        self.pending = match counted {
            Some(n) => {
                self.last_census = Some(Instant::now());
                n
            }
            None if built.full => self.pending.max(built.batch.samples() as u64),
            None => built.batch.samples() as u64,
        };
        metrics::gauge!(t::RW_PENDING).set(self.pending as f64);
        Ok(built.batch)
    }

    /// Sends `batch` until it is answered: `Some(true)` acknowledged, `Some(false)` refused
    /// (counted), `None` when `stop` turned true first.
    async fn send(&mut self, batch: &Batch, fresh: bool, stop: &mut watch::Receiver<bool>) -> Option<bool> {
        let n = batch.samples() as u64;
        let body = match wire::body(batch) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                tracing::error!(error = %e, "remote write: cannot encode a request; dropped");
                metrics::counter!(t::RW_FAILED).increment(n);
                return Some(false);
            }
        };
        let mut backoff = self.f.settings.min_backoff;
        let mut failures = 0u64;
        loop {
            let outcome = tokio::select! {
                _ = stop.wait_for(|s| *s) => return None,
                o = self.client.post(body.clone()) => o,
            };
            match outcome {
                Outcome::Acked => {
                    if failures > 0 {
                        tracing::info!(failures, "remote write: the receiver accepts again");
                    }
                    return Some(true);
                }
                Outcome::Refused(status, text) if !fresh => {
                    tracing::info!(%status, %text, samples = n, "remote write: the request re-sent after a restart was refused (the receiver most likely stored it before)");
                    metrics::counter!(t::RW_RESEND_REFUSED).increment(n);
                    return Some(false);
                }
                Outcome::Refused(status, text) => {
                    tracing::error!(%status, %text, samples = n, "remote write: the receiver refused a request; its samples are dropped");
                    metrics::counter!(t::RW_FAILED).increment(n);
                    return Some(false);
                }
                Outcome::Retry(why) => {
                    failures += 1;
                    metrics::counter!(t::RW_RETRIES).increment(1);
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(error = %why, failures, retry_in = ?backoff, "remote write: attempt failed; retrying");
                    }
                    if !pause(backoff, stop).await {
                        return None;
                    }
                    backoff = (backoff * 2).min(self.f.settings.max_backoff);
                }
            }
        }
    }
}
