//! Subscriptions: a cursor over the hub's log per consumer stream.
//!
//! A subscription task copies matching events from the log into a [`BatchEncoder`] under the
//! hub lock (bounded work: at most `max_batch` events), releases the lock and sends the batch.
//! When the consumer is slow the send waits (HTTP/2 flow control) while sensors keep publishing;
//! if the ring overwrites events the cursor had not reached, the next batch carries a `Gap`
//! naming the lost seqs. Memory per subscription is one batch plus a small channel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use gma_core::codec::BatchEncoder;
use gma_core::event::to_wire;
use gma_core::pattern::{any_match, Pattern};
use gma_proto::v1 as pb;
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tonic::Status;

use crate::hub::{Hub, HubInner};

pub const DEFAULT_MAX_BATCH: usize = 1000;
pub const MAX_MAX_BATCH: usize = 10_000;

/// What a subscription selects.
#[derive(Debug, Clone)]
pub struct Selector {
    pub patterns: Vec<Pattern>,
    pub sources: Vec<Pattern>,
}

impl Selector {
    pub fn matches(&self, name: &str, source: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(name)) && any_match(&self.sources, source)
    }
}

/// Where a new subscription starts.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    /// The latest value of each matching series, then new events.
    Latest,
    /// Every buffered event from this seq on (same epoch).
    From(u64),
    /// The consumer's seqs belong to another run of this producer.
    OtherEpoch { epoch: u64, from_seq: u64 },
}

/// Per-subscription read state.
pub struct Cursor {
    selector: Selector,
    next: u64,
    max_batch: usize,
    min_interval_ns: i64,
    /// Per series id: 0 = not yet classified, 1 = selected, 2 = not selected.
    class: Vec<u8>,
    last_sent: HashMap<u32, i64>,
    pub encoder: BatchEncoder,
}

impl Cursor {
    pub fn new(selector: Selector, max_batch: usize, min_interval_ms: u64) -> Cursor {
        Cursor {
            selector,
            next: 0,
            max_batch: max_batch.clamp(1, MAX_MAX_BATCH),
            min_interval_ns: (min_interval_ms.min(86_400_000) as i64) * 1_000_000,
            class: Vec::new(),
            last_sent: HashMap::new(),
            encoder: BatchEncoder::new(),
        }
    }

    fn selected(&mut self, inner: &HubInner, series: u32) -> bool {
        let i = series as usize;
        if i >= self.class.len() {
            self.class.resize(inner.series.len().max(i + 1), 0);
        }
        if self.class[i] == 0 {
            let s = &inner.series[i];
            self.class[i] = if self.selector.matches(&s.name, &s.source) {
                1
            } else {
                2
            };
        }
        self.class[i] == 1
    }

    fn rate_ok(&mut self, series: u32, ts: i64) -> bool {
        if self.min_interval_ns == 0 {
            return true;
        }
        match self.last_sent.get(&series) {
            Some(last) if ts - *last < self.min_interval_ns => false,
            _ => {
                self.last_sent.insert(series, ts);
                true
            }
        }
    }

    /// Positions the cursor; for `Start::Latest` encodes the latest value of each series.
    pub fn start(&mut self, inner: &HubInner, start: Start) {
        match start {
            Start::Latest => {
                let mut latest: Vec<_> = inner.latest().collect();
                latest.sort_by_key(|e| e.seq);
                for e in latest {
                    if self.selected(inner, e.series) && self.rate_ok(e.series, e.timestamp_ns) {
                        let s = &inner.series[e.series as usize];
                        self.encoder
                            .push(s, e.seq, e.timestamp_ns, &e.numbers, &e.strings);
                    }
                }
                self.next = inner.head();
            }
            Start::From(seq) => self.next = seq.clamp(1, inner.head()),
            Start::OtherEpoch { epoch, from_seq } => {
                self.encoder.gap(
                    from_seq,
                    u64::MAX,
                    0,
                    &format!(
                        "producer restarted (epoch {epoch} -> {}): events of the old run after seq {} are lost",
                        inner.epoch,
                        from_seq.saturating_sub(1)
                    ),
                );
                self.next = 1;
            }
        }
    }

    /// Copies up to `max_batch` matching events into the encoder; reports overwritten ones.
    pub fn fill(&mut self, inner: &HubInner) {
        let oldest = inner.oldest();
        if self.next < oldest {
            let lost = oldest - self.next;
            self.encoder.gap(
                self.next,
                oldest - 1,
                lost,
                "buffer window exceeded (consumer too slow or away too long)",
            );
            self.next = oldest;
        }
        let mut last = None;
        for (scanned, e) in inner.since(self.next).enumerate() {
            if self.encoder.len() >= self.max_batch || scanned >= self.max_batch * 16 {
                break;
            }
            last = Some(e.seq);
            if self.selected(inner, e.series) && self.rate_ok(e.series, e.timestamp_ns) {
                let s = &inner.series[e.series as usize];
                self.encoder
                    .push(s, e.seq, e.timestamp_ns, &e.numbers, &e.strings);
            }
        }
        if let Some(l) = last {
            self.next = l + 1;
        }
    }

    pub fn caught_up(&self, inner: &HubInner) -> bool {
        self.next >= inner.head()
    }
}

/// A cancel flag the stream checks before yielding each message.
#[derive(Default)]
pub struct Cancel {
    flag: AtomicBool,
    notify: Notify,
}

impl Cancel {
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    pub async fn cancelled(&self) {
        loop {
            let n = self.notify.notified();
            if self.is_cancelled() {
                return;
            }
            n.await;
        }
    }
}

struct Entry {
    consumer_id: String,
    cancel: Arc<Cancel>,
}

/// The active subscriptions of a producer, for Unsubscribe one/all.
#[derive(Default)]
pub struct Registry {
    next_id: AtomicU64,
    subs: Mutex<HashMap<u64, Entry>>,
}

impl Registry {
    pub fn add(self: &Arc<Self>, consumer_id: &str) -> (u64, Arc<Cancel>, RegistryGuard) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let cancel = Arc::new(Cancel::default());
        self.subs.lock().insert(
            id,
            Entry {
                consumer_id: consumer_id.to_string(),
                cancel: cancel.clone(),
            },
        );
        metrics::gauge!("gma_producer_subscriptions").increment(1.0);
        (
            id,
            cancel,
            RegistryGuard {
                registry: self.clone(),
                id,
            },
        )
    }

    pub fn len(&self) -> usize {
        self.subs.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cancels one subscription; returns how many were removed (0 or 1).
    pub fn cancel_one(&self, id: u64, consumer_id: &str) -> Result<u32, Status> {
        let subs = self.subs.lock();
        match subs.get(&id) {
            None => Err(Status::not_found(format!(
                "no subscription {id} on this producer"
            ))),
            Some(e) if !e.consumer_id.is_empty() && e.consumer_id != consumer_id => Err(
                Status::permission_denied(format!("subscription {id} belongs to another consumer")),
            ),
            Some(e) => {
                e.cancel.cancel();
                Ok(1)
            }
        }
    }

    /// Cancels every subscription (producer shutdown): each stream ends cleanly.
    pub fn cancel_every(&self) -> u32 {
        let subs = self.subs.lock();
        for e in subs.values() {
            e.cancel.cancel();
        }
        subs.len() as u32
    }

    /// Cancels every subscription of `consumer_id`.
    pub fn cancel_all(&self, consumer_id: &str) -> u32 {
        let subs = self.subs.lock();
        let mut n = 0;
        for e in subs.values().filter(|e| e.consumer_id == consumer_id) {
            e.cancel.cancel();
            n += 1;
        }
        n
    }
}

/// Removes the subscription from the registry when its task ends (consumer gone or cancelled).
pub struct RegistryGuard {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        self.registry.subs.lock().remove(&self.id);
        metrics::gauge!("gma_producer_subscriptions").decrement(1.0);
    }
}

/// Runs one subscription until the consumer leaves or it is cancelled.
pub async fn run(
    hub: Arc<Hub>,
    mut cursor: Cursor,
    start: Start,
    id: u64,
    cancel: Arc<Cancel>,
    _guard: RegistryGuard,
    tx: mpsc::Sender<Result<pb::SubscribeResponse, Status>>,
) {
    let mut head = hub.watch_head();
    let epoch = {
        let inner = hub.lock();
        cursor.start(&inner, start);
        inner.epoch
    };
    let first = pb::SubscribeResponse {
        subscription_id: id,
        batch: None,
    };
    if tx.send(Ok(first)).await.is_err() {
        return;
    }
    loop {
        head.borrow_and_update();
        let (batch, caught_up) = {
            let inner = hub.lock();
            cursor.fill(&inner);
            let batch = if cursor.encoder.is_empty() {
                None
            } else {
                Some(cursor.encoder.finish(epoch))
            };
            (batch, cursor.caught_up(&inner))
        };
        if let Some(batch) = batch {
            metrics::counter!("gma_producer_events_sent_total").increment(batch.series_ids.len() as u64);
            let msg = pb::SubscribeResponse {
                subscription_id: id,
                batch: Some(batch),
            };
            tokio::select! {
                r = tx.send(Ok(msg)) => if r.is_err() { return },
                _ = cancel.cancelled() => return,
            }
            if !caught_up {
                continue;
            }
        }
        tokio::select! {
            r = head.changed() => if r.is_err() { return },
            _ = cancel.cancelled() => return,
            _ = tx.closed() => return,
        }
    }
}

/// Latest cached events for a query.
pub fn query(inner: &HubInner, selector: &Selector, max_age_ns: Option<i64>, now_ns: i64) -> Vec<pb::Event> {
    let mut out: Vec<pb::Event> = Vec::new();
    for e in inner.latest() {
        let s = &inner.series[e.series as usize];
        if !selector.matches(&s.name, &s.source) {
            continue;
        }
        if let Some(age) = max_age_ns {
            if now_ns.saturating_sub(e.timestamp_ns) > age {
                continue;
            }
        }
        out.push(to_wire(
            &s.name,
            &s.source,
            e.timestamp_ns,
            e.seq,
            &s.fields,
            &e.numbers,
            &e.strings,
        ));
    }
    out.sort_by_key(|e| e.seq);
    out
}
