//! Subscriptions: a cursor over the hub's log per consumer stream.
//!
//! Every subscription reads the one shared log (the hub's ring) with its own position, so a
//! consumer's backlog costs no memory of its own: a stalled consumer holds at most the two
//! encoded batches in its channel plus what HTTP/2 flow control lets into the socket, and it
//! never delays a sensor or another subscriber. What happens when it falls behind is its
//! [`Policy`]: `drop-oldest` skips ahead with an exact `Gap`, `latest` conflates the backlog to
//! the newest value per series, `block` pins the log (bounded; see [`crate::hub`]).
//!
//! Fan-out encodes once: subscriptions with the same selection and no per-subscription filter
//! share a [`Group`] whose chunks (encoded `EventBatch` bytes over a contiguous seq range) are
//! built by whichever member reaches the end first and then sent as-is to every member. A
//! member sends the series declarations it is missing before a chunk. Anything that does not
//! fit the shared path (start from the latest values, resume, a gap, a filter, a policy jump)
//! takes the private path: its own encoder, then back onto the group at the next chunk border.

use gma_core::Refuse;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use gma_core::codec::{BatchEncoder, Mark, SeriesInfo};
use gma_core::event::to_wire;
use gma_core::filter::{Bound, Filter};
use gma_core::pattern::{any_match, Pattern};
use gma_proto::v1 as pb;
use parking_lot::Mutex;
use prost::bytes::Bytes;
use prost::Message;
use tokio::sync::{mpsc, Notify};

use crate::chunk::ChunkWriter;
use crate::error::Error;
use crate::hub::{Hub, HubInner, Stored};

pub const DEFAULT_MAX_BATCH: usize = 1000;
pub const MAX_MAX_BATCH: usize = 10_000;
/// Chunks a fan-out group keeps for members that are behind (members drift apart under
/// saturation; a short window sends laggards down the costlier private path).
const GROUP_CHUNKS: usize = 4096;
/// Encoded bytes a fan-out group keeps at most. Under the block policy the members spread over
/// up to the ring's window (the source waits for the slowest, the fastest reads at the head):
/// a member the cache no longer covers encodes every batch of its own, which costs the producer
/// more than the members' sending (at 1 -> 100 with a 1 M-event ring and 16 MiB, ≈ 40 % of
/// its CPU samples). 64 MiB covers a 1 M-event ring of small events (27 bytes each); the ring's window
/// bounds the cache as well, and a lone member keeps none.
const GROUP_BYTES: usize = 64 << 20;

/// Encodings since the process started: shared chunks of fan-out groups (as the
/// `gma_producer_chunks_encoded_total` metric) and private batches (a stream's own encoder).
static SHARED_ENCODED: AtomicU64 = AtomicU64::new(0);
static PRIVATE_ENCODED: AtomicU64 = AtomicU64::new(0);

/// (shared chunks, private batches) encoded so far in this process, readable without a metrics
/// recorder: `gma bench fanout` shows encode-once with it (N members, one encoding per chunk).
pub fn encode_counts() -> (u64, u64) {
    (
        SHARED_ENCODED.load(Ordering::Relaxed),
        PRIVATE_ENCODED.load(Ordering::Relaxed),
    )
}

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

    pub(crate) fn key(&self) -> String {
        let p: Vec<&str> = self.patterns.iter().map(Pattern::as_str).collect();
        let s: Vec<&str> = self.sources.iter().map(Pattern::as_str).collect();
        format!("{}|{}", p.join(","), s.join(","))
    }
}

/// What a subscription does when it falls behind by more than its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Conflate the backlog to the newest value of each series.
    Latest,
    /// Skip the oldest events; the consumer gets a `Gap` with the exact seqs.
    DropOldest,
    /// Keep events for this consumer: the log may grow by `block_reserve` events for it.
    Block,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Latest => "latest",
            Policy::DropOldest => "drop-oldest",
            Policy::Block => "block",
        }
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

/// Everything a subscription asked for, validated.
#[derive(Debug, Clone)]
pub struct Spec {
    pub selector: Selector,
    pub max_batch: usize,
    pub min_interval_ms: u64,
    pub policy: Policy,
    /// How far (in producer events) the subscription may fall behind before its policy acts.
    pub queue_events: u64,
    pub when: Option<Filter>,
    pub delta_pct: Option<f64>,
}

impl Spec {
    /// A plain subscription: everything selected, drop-oldest over the whole resume window.
    pub fn plain(selector: Selector) -> Spec {
        Spec {
            selector,
            max_batch: DEFAULT_MAX_BATCH,
            min_interval_ms: 0,
            policy: Policy::DropOldest,
            queue_events: u64::MAX,
            when: None,
            delta_pct: None,
        }
    }

    /// Without per-subscription state the batches are the same for every such subscriber.
    fn shareable(&self) -> bool {
        self.when.is_none() && self.delta_pct.is_none() && self.min_interval_ms == 0
    }

    fn group_key(&self) -> String {
        format!("{}|{}", self.selector.key(), self.max_batch)
    }
}

/// Per-series state of the `when` filter.
#[derive(Debug, Default)]
struct WhenState {
    bound: Option<Bound>,
    inside: Option<bool>,
}

/// Per-subscription read state: position, filters and the stream's own encoder.
pub struct Cursor {
    spec: Spec,
    next: u64,
    min_interval_ns: i64,
    /// Per series id: 0 = not yet classified, 1 = selected, 2 = not selected.
    class: Vec<u8>,
    last_sent: HashMap<u32, i64>,
    when: HashMap<u32, WhenState>,
    delta_last: HashMap<u32, crate::hub::Numbers>,
    /// Private batches; also the record of which series this stream has declared.
    pub encoder: BatchEncoder,
    /// Latest values still to send, in seq order, all below `next`: a start from the latest
    /// values (or a `latest` conflation) is a snapshot sent `max_batch` events at a time, so
    /// that one message never holds every series of a producer (25,000 simulated hosts are
    /// 100,000 series, tens of MB, beyond any consumer's message limit). The whole snapshot is
    /// sent before the log is read again (seqs keep increasing, and every series gets its value
    /// even when new ones keep coming); at most one entry per series.
    pending: VecDeque<Stored>,
}

impl Cursor {
    pub fn new(spec: Spec) -> Cursor {
        let spec = Spec {
            max_batch: spec.max_batch.clamp(1, MAX_MAX_BATCH),
            ..spec
        };
        Cursor {
            min_interval_ns: (spec.min_interval_ms.min(86_400_000) as i64) * 1_000_000,
            spec,
            next: 0,
            class: Vec::new(),
            last_sent: HashMap::new(),
            when: HashMap::new(),
            delta_last: HashMap::new(),
            encoder: BatchEncoder::new(),
            pending: VecDeque::new(),
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next
    }

    fn selected(&mut self, inner: &HubInner, series: u32) -> bool {
        select(&mut self.class, &self.spec.selector, inner, series)
    }

    /// Runs the per-subscription filters; `Some(mark)` = deliver. State is committed only for
    /// delivered events (the crossing state follows every evaluated value).
    fn admit(&mut self, info: &SeriesInfo, e: &Stored) -> Option<Mark> {
        let mut mark = Mark::None;
        if let Some(filter) = &self.spec.when {
            let st = self.when.entry(e.series).or_insert_with(|| WhenState {
                // Validated at subscribe time; a schema that does not bind never matches.
                bound: filter.bind(&info.name, &info.fields).ok().flatten(),
                inside: None,
            });
            let now = st.bound.as_ref()?.eval(&e.numbers, &e.strings)?;
            let before = st.inside.replace(now);
            mark = match (before, now) {
                (Some(b), n) if b == n => return None,
                (None, false) => return None,
                (_, true) => Mark::Enter,
                (_, false) => Mark::Leave,
            };
        }
        if let Some(pct) = self.spec.delta_pct {
            if let Some(last) = self.delta_last.get(&e.series) {
                if !moved(last, &e.numbers, pct) {
                    return None;
                }
            }
        }
        if self.min_interval_ns > 0 {
            if let Some(last) = self.last_sent.get(&e.series) {
                if e.timestamp_ns - *last < self.min_interval_ns {
                    return None;
                }
            }
            self.last_sent.insert(e.series, e.timestamp_ns);
        }
        if self.spec.delta_pct.is_some() {
            self.delta_last.insert(e.series, e.numbers.clone());
        }
        Some(mark)
    }

    fn offer(&mut self, inner: &HubInner, e: &Stored) {
        if !self.selected(inner, e.series) {
            return;
        }
        let s = &inner.series[e.series as usize];
        if let Some(mark) = self.admit(s, e) {
            self.encoder
                .push_marked(s, e.seq, e.timestamp_ns, &e.numbers, &e.strings, mark);
        }
    }

    /// Positions the cursor; for `Start::Latest` encodes the latest value of each series.
    pub fn start(&mut self, inner: &HubInner, start: Start) {
        match start {
            Start::Latest => {
                self.latest_values(inner, 0);
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

    /// Queues the newest value of each selected series with seq >= `from` (sent `max_batch`
    /// at a time by [`Cursor::fill`]); returns how many.
    fn latest_values(&mut self, inner: &HubInner, from: u64) -> u64 {
        let mut latest: Vec<Stored> = Vec::new();
        for e in inner.latest() {
            if e.seq >= from && select(&mut self.class, &self.spec.selector, inner, e.series) {
                latest.push(e.clone());
            }
        }
        latest.sort_unstable_by_key(|e| e.seq);
        let n = latest.len() as u64;
        self.pending.extend(latest);
        n
    }

    /// Encodes up to `max_batch` queued latest values.
    fn drain_latest(&mut self, inner: &HubInner) {
        while self.encoder.len() < self.spec.max_batch {
            let Some(e) = self.pending.pop_front() else {
                break;
            };
            self.offer(inner, &e);
        }
    }

    /// Applies the overrun rules: events overwritten in the ring, and the policy when the
    /// subscription is further behind than its queue. Returns true if it moved the cursor.
    fn overrun(&mut self, inner: &HubInner) -> bool {
        let oldest = inner.oldest();
        let head = inner.head();
        let lag = head.saturating_sub(self.next);
        if self.spec.policy == Policy::Latest && (self.next < oldest || lag > self.spec.queue_events) {
            // The latest-value cache still holds the newest value of every series, even when the
            // ring has overwritten the cursor's position: conflate, never gap. Events the ring
            // overwrote are counted whether selected or not (an upper bound, like a Gap's).
            let overwritten = oldest.saturating_sub(self.next);
            let mut selected = 0u64;
            for e in inner.since(self.next.max(oldest)) {
                if select(&mut self.class, &self.spec.selector, inner, e.series) {
                    selected += 1;
                }
            }
            let sent = self.latest_values(inner, self.next);
            let conflated = (overwritten + selected).saturating_sub(sent);
            metrics::counter!(crate::telemetry::CONFLATED_EVENTS).increment(conflated);
            self.encoder.conflated(conflated);
            self.next = head;
            return true;
        }
        if self.next < oldest {
            let lost = oldest - self.next;
            metrics::counter!(crate::telemetry::GAP_EVENTS).increment(lost);
            let reason = match self.spec.policy {
                Policy::Block => {
                    "block policy: the consumer fell behind by more than the log and its block reserve"
                }
                _ => "buffer window exceeded (slow consumer)",
            };
            self.encoder.gap(self.next, oldest - 1, lost, reason);
            self.next = oldest;
        }
        let lag = head.saturating_sub(self.next);
        if lag <= self.spec.queue_events || self.spec.policy != Policy::DropOldest {
            return false;
        }
        let to = head - self.spec.queue_events;
        metrics::counter!(crate::telemetry::GAP_EVENTS).increment(to - self.next);
        self.encoder.gap(
            self.next,
            to - 1,
            to - self.next,
            "slow consumer: drop-oldest policy skipped the oldest events",
        );
        self.next = to;
        true
    }

    /// Copies up to `max_batch` admitted events (scanning at most 16 × that) into the encoder,
    /// never reading at or past `limit`.
    pub fn fill(&mut self, inner: &HubInner, limit: u64) {
        // A snapshot of latest values being sent goes out whole first (its seqs lie below
        // `next`); the log, and its overrun rules, come after it.
        if !self.pending.is_empty() || self.overrun(inner) {
            self.drain_latest(inner);
            return;
        }
        let mut last = None;
        let max = self.spec.max_batch;
        for (scanned, e) in inner.since(self.next).enumerate() {
            if self.encoder.len() >= max || scanned >= max * 16 || e.seq >= limit {
                break;
            }
            last = Some(e.seq);
            self.offer(inner, e);
        }
        if let Some(l) = last {
            self.next = l + 1;
        }
    }

    pub fn caught_up(&self, inner: &HubInner) -> bool {
        self.next >= inner.head() && self.pending.is_empty()
    }
}

fn select(class: &mut Vec<u8>, selector: &Selector, inner: &HubInner, series: u32) -> bool {
    let i = series as usize;
    if i >= class.len() {
        class.resize(inner.series.len().max(i + 1), 0);
    }
    if class[i] == 0 {
        let s = &inner.series[i];
        class[i] = if selector.matches(&s.name, &s.source) {
            1
        } else {
            2
        };
    }
    class[i] == 1
}

/// True when some numeric field moved by more than `pct` percent of its previous value (any
/// change counts when the previous value was zero; NaN to a number and back counts too).
fn moved(last: &[f64], now: &[f64], pct: f64) -> bool {
    last.iter().zip(now).any(|(a, b)| {
        if a.is_nan() || b.is_nan() {
            return a.is_nan() != b.is_nan();
        }
        if *a == 0.0 {
            return *b != 0.0;
        }
        ((b - a) / a).abs() * 100.0 > pct
    })
}

/// One shared, encoded batch: the selected events of seqs `from..to`.
struct Chunk {
    from: u64,
    to: u64,
    events: usize,
    /// Distinct series the chunk refers to (declared by each stream before sending it).
    series: Vec<u32>,
    bytes: Bytes,
}

/// Subscriptions that share encoded chunks (same selection, no per-subscription filter).
pub struct Group {
    selector: Selector,
    max_batch: usize,
    class: Vec<u8>,
    /// Contiguous: `chunks[i].to == chunks[i + 1].from`.
    chunks: VecDeque<Arc<Chunk>>,
    bytes: usize,
    /// Writes the chunks (its buffers reused from one chunk to the next).
    writer: ChunkWriter,
    /// Per series id: the number of the last chunk that referred to it (a chunk's distinct
    /// series found by an index, not a hash per event).
    seen: Vec<u32>,
    /// The number of the chunk being written (never 0 while writing: 0 is "never seen").
    round: u32,
}

impl Group {
    fn new(spec: &Spec) -> Group {
        Group {
            selector: spec.selector.clone(),
            max_batch: spec.max_batch.clamp(1, MAX_MAX_BATCH),
            class: Vec::new(),
            chunks: VecDeque::new(),
            bytes: 0,
            writer: ChunkWriter::default(),
            seen: Vec::new(),
            round: 0,
        }
    }

    /// Drops the chunks that end at or before `next` (a lone member past them).
    fn drop_passed(&mut self, next: u64) {
        while self.chunks.front().is_some_and(|c| c.to <= next) {
            if let Some(old) = self.chunks.pop_front() {
                self.bytes -= old.bytes.len();
            }
        }
    }

    /// The chunk starting at `next`, encoding it from the log when `next` is the group's end.
    /// `Err(to)`: `next` is inside the chunk ending at `to` (read privately up to there).
    /// `Ok(None)`: nothing shared to offer.
    fn chunk_at(&mut self, inner: &HubInner, next: u64, epoch: u64) -> Result<Option<Arc<Chunk>>, u64> {
        if let (Some(first), Some(last)) = (self.chunks.front(), self.chunks.back()) {
            if next >= first.from && next < last.to {
                let i = self.chunks.partition_point(|c| c.to <= next);
                let c = &self.chunks[i];
                return if c.from == next {
                    Ok(Some(c.clone()))
                } else {
                    Err(c.to)
                };
            }
            if next < first.from {
                return Ok(None);
            }
            if next > last.to {
                // Everyone who used the old chunks has moved on or left.
                self.chunks.clear();
                self.bytes = 0;
            }
        }
        if next >= inner.head() || next < inner.oldest() {
            return Ok(None);
        }
        // Straight to bytes (the same bytes a shared `BatchEncoder` and prost would write).
        let enc = &mut self.writer;
        self.round = self.round.wrapping_add(1);
        if self.round == 0 {
            self.seen.fill(0);
            self.round = 1;
        }
        let (round, seen) = (self.round, &mut self.seen);
        let mut series = Vec::new();
        let mut last = next;
        for (scanned, e) in inner.since(next).enumerate() {
            if enc.len() >= self.max_batch || scanned >= self.max_batch * 16 {
                break;
            }
            if select(&mut self.class, &self.selector, inner, e.series) {
                let i = e.series as usize;
                if i >= seen.len() {
                    seen.resize(inner.series.len().max(i + 1), 0);
                }
                if seen[i] != round {
                    if series.len() >= self.max_batch {
                        break;
                    }
                    seen[i] = round;
                    series.push(e.series);
                }
                enc.push(e.series, e.seq, e.timestamp_ns, &e.numbers, &e.strings);
            }
            last = e.seq;
        }
        let events = enc.len();
        let bytes = enc.finish(epoch);
        let chunk = Arc::new(Chunk {
            from: next,
            to: last + 1,
            events,
            series,
            bytes,
        });
        self.bytes += chunk.bytes.len();
        self.chunks.push_back(chunk.clone());
        // Chunks of events the ring no longer holds serve no one (a member that far behind
        // overruns, never reads a chunk): the cache holds at most the ring's window, besides
        // its caps (otherwise each group filled its 16 MiB over minutes, a simulating producer
        // growing by that much per group long after its ring was full).
        let oldest = inner.oldest();
        while self.chunks.len() > GROUP_CHUNKS
            || (self.bytes > GROUP_BYTES && self.chunks.len() > 1)
            || self.chunks.front().is_some_and(|c| c.to <= oldest)
        {
            if let Some(old) = self.chunks.pop_front() {
                self.bytes -= old.bytes.len();
            }
        }
        metrics::counter!(crate::telemetry::CHUNKS_ENCODED).increment(1);
        SHARED_ENCODED.fetch_add(1, Ordering::Relaxed);
        Ok(Some(chunk))
    }
}

/// Fan-out groups by selection, dropped when their last member leaves.
#[derive(Default)]
pub struct Groups {
    groups: Mutex<HashMap<String, Weak<Mutex<Group>>>>,
}

impl Groups {
    fn join(&self, spec: &Spec) -> Arc<Mutex<Group>> {
        let key = spec.group_key();
        let mut groups = self.groups.lock();
        if let Some(g) = groups.get(&key).and_then(Weak::upgrade) {
            return g;
        }
        groups.retain(|_, g| g.strong_count() > 0);
        let g = Arc::new(Mutex::new(Group::new(spec)));
        groups.insert(key, Arc::downgrade(&g));
        g
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
    /// Who opened it: only the same identity may unsubscribe it.
    owner: gma_core::authz::Identity,
    cancel: Arc<Cancel>,
}

/// The active subscriptions of a producer, for Unsubscribe one/all, and their fan-out groups.
#[derive(Default)]
pub struct Registry {
    next_id: AtomicU64,
    subs: Mutex<HashMap<u64, Entry>>,
    pub groups: Groups,
    /// Set when the producer stops: every stream sends what it has not sent yet, then ends.
    draining: Cancel,
}

impl Registry {
    /// Asks every stream to end once it has sent every event published so far (producer
    /// shutdown, after the sensors stopped): consumers get the tail instead of losing it.
    pub fn drain(&self) {
        self.draining.cancel();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Registers a subscription of `consumer_id` opened by `owner`.
    pub fn add(self: &Arc<Self>, consumer_id: &str, owner: &gma_core::authz::Identity) -> SubHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let cancel = Arc::new(Cancel::default());
        self.subs.lock().insert(
            id,
            Entry {
                consumer_id: consumer_id.to_string(),
                owner: owner.clone(),
                cancel: cancel.clone(),
            },
        );
        metrics::gauge!(crate::telemetry::SUBSCRIPTIONS).increment(1.0);
        SubHandle {
            id,
            cancel,
            guard: RegistryGuard {
                registry: self.clone(),
                id,
            },
        }
    }

    pub fn len(&self) -> usize {
        self.subs.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cancels one subscription; returns how many were removed (0 or 1).
    pub fn cancel_one(
        &self,
        id: u64,
        consumer_id: &str,
        who: &gma_core::authz::Identity,
    ) -> Result<u32, Error> {
        let subs = self.subs.lock();
        match subs.get(&id) {
            None => Err(Error::not_found(format!("no subscription {id} on this producer"))),
            Some(e) if !e.consumer_id.is_empty() && e.consumer_id != consumer_id => Err(
                Error::permission_denied(format!("subscription {id} belongs to another consumer")),
            ),
            Some(e) if e.owner != *who => Err(Error::permission_denied(format!(
                "subscription {id} was opened by another identity; {who} may not end it"
            ))),
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

    /// Cancels every subscription of `consumer_id` that `who` opened.
    pub fn cancel_all(&self, consumer_id: &str, who: &gma_core::authz::Identity) -> u32 {
        let subs = self.subs.lock();
        let mut n = 0;
        for e in subs
            .values()
            .filter(|e| e.consumer_id == consumer_id && e.owner == *who)
        {
            e.cancel.cancel();
            n += 1;
        }
        n
    }
}

/// A registered subscription: its id, its cancel flag, and its place in the registry (given
/// back when the handle is dropped).
pub struct SubHandle {
    pub id: u64,
    pub cancel: Arc<Cancel>,
    pub guard: RegistryGuard,
}

/// Removes the subscription from the registry when its task ends (consumer gone or cancelled).
pub struct RegistryGuard {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        self.registry.subs.lock().remove(&self.id);
        metrics::gauge!(crate::telemetry::SUBSCRIPTIONS).decrement(1.0);
    }
}

/// Unpins a block subscription when it ends.
struct PinGuard<'a> {
    hub: &'a Hub,
    id: u64,
}

impl Drop for PinGuard<'_> {
    fn drop(&mut self) {
        self.hub.unpin(self.id);
    }
}

fn encode(batch: &pb::EventBatch) -> Bytes {
    Bytes::from(batch.encode_to_vec())
}

/// The next messages of a stream (encoded `EventBatch`es) and whether it is caught up. A
/// block-policy stream's pin (`pin`: its id) moves past what was read under the same lock.
fn next_messages(
    hub: &Hub,
    group: Option<&Mutex<Group>>,
    cursor: &mut Cursor,
    epoch: u64,
    pin: Option<u64>,
    out: &mut Vec<Bytes>,
) -> bool {
    // Returns whether the stream is caught up, moving its pin first and releasing the lock.
    let done = |mut inner: parking_lot::MutexGuard<'_, HubInner>, cursor: &Cursor| {
        let caught_up = cursor.caught_up(&inner);
        let wake = pin.is_some_and(|id| inner.move_pin(id, cursor.next));
        drop(inner);
        if wake {
            hub.wake_writers();
        }
        caught_up
    };
    let mut limit = u64::MAX;
    if let Some(group) = group {
        let mut g = group.lock();
        let inner = hub.lock();
        let lag = inner.head().saturating_sub(cursor.next);
        let plain = cursor.next >= inner.oldest()
            && lag <= cursor.spec.queue_events
            && cursor.encoder.is_empty()
            && cursor.pending.is_empty();
        if plain {
            match g.chunk_at(&inner, cursor.next, epoch) {
                Ok(Some(chunk)) => {
                    let decls = cursor
                        .encoder
                        .declare_missing(chunk.series.iter().map(|id| &*inner.series[*id as usize]));
                    if !decls.is_empty() {
                        out.push(encode(&pb::EventBatch {
                            series: decls,
                            epoch,
                            ..Default::default()
                        }));
                    }
                    if chunk.events > 0 {
                        metrics::counter!(crate::telemetry::EVENTS_SENT).increment(chunk.events as u64);
                        out.push(chunk.bytes.clone());
                    }
                    cursor.next = chunk.to;
                    drop(g);
                    return done(inner, cursor);
                }
                Ok(None) => {}
                Err(to) => limit = to,
            }
        }
    }
    let inner = hub.lock();
    cursor.fill(&inner, limit);
    if !cursor.encoder.is_empty() {
        metrics::counter!(crate::telemetry::EVENTS_SENT).increment(cursor.encoder.len() as u64);
        out.push(encode(&cursor.encoder.finish(epoch)));
        PRIVATE_ENCODED.fetch_add(1, Ordering::Relaxed);
    }
    done(inner, cursor)
}

/// Benchmark hook (`gma bench filter`): reads `hub` from seq 1 to its head through a private
/// cursor with `spec`, exactly as a stream's task does (filters, encoding into `EventBatch`
/// bytes) but without gRPC. Returns the encoded messages and the time the reading took.
pub fn drain_for_bench(hub: &Hub, spec: Spec) -> (Vec<Bytes>, std::time::Duration) {
    let mut cursor = Cursor::new(spec);
    let epoch = {
        let inner = hub.lock();
        cursor.start(&inner, Start::From(1));
        inner.epoch
    };
    let mut out = Vec::new();
    let t0 = std::time::Instant::now();
    while !next_messages(hub, None, &mut cursor, epoch, None, &mut out) {}
    (out, t0.elapsed())
}

/// Runs one subscription until the consumer leaves or it is cancelled, sending encoded
/// `EventBatch`es on `tx`.
pub async fn run(
    hub: Arc<Hub>,
    registry: Arc<Registry>,
    mut cursor: Cursor,
    start: Start,
    handle: SubHandle,
    tx: mpsc::Sender<Bytes>,
) {
    let SubHandle {
        id,
        cancel,
        guard: _guard,
    } = handle;
    let group = cursor
        .spec
        .shareable()
        .then(|| registry.groups.join(&cursor.spec));
    let block = cursor.spec.policy == Policy::Block;
    let _pin = block.then(|| PinGuard { hub: &hub, id });
    let mut head = hub.watch_head();
    let epoch = {
        let mut inner = hub.lock();
        cursor.start(&inner, start);
        if block {
            // Under the same lock as the start: a writer publishing between the two could
            // otherwise overwrite the events from the start on before the pin held them (a
            // gap under block, seen with a 2,000-event ring and a back-to-back source).
            inner.pin(id, cursor.next);
        }
        inner.epoch
    };
    let mut out = Vec::with_capacity(2);
    loop {
        head.borrow_and_update();
        let caught_up = next_messages(
            &hub,
            group.as_deref(),
            &mut cursor,
            epoch,
            block.then_some(id),
            &mut out,
        );
        // A group whose one member is this stream keeps no chunk the stream has passed: no one
        // reads it again (a stream joining later at an older seq reads privately). Otherwise an
        // agent's one subscriber keeps the ring's whole window a second time, encoded.
        if let Some(g) = &group {
            if Arc::strong_count(g) == 1 {
                g.lock().drop_passed(cursor.next);
            }
        }
        let sent_any = !out.is_empty();
        for msg in out.drain(..) {
            tokio::select! {
                r = tx.send(msg) => if r.is_err() { return },
                _ = cancel.cancelled() => return,
            }
        }
        if sent_any && !caught_up {
            continue;
        }
        if !caught_up {
            // Scanned without finding anything to send: keep reading.
            tokio::task::yield_now().await;
            continue;
        }
        if registry.is_draining() {
            // Everything published has been sent: end the stream (the consumer reads the rest
            // of the channel, then a clean end).
            return;
        }
        tokio::select! {
            r = head.changed() => if r.is_err() { return },
            _ = cancel.cancelled() => return,
            _ = tx.closed() => return,
            _ = registry.draining.cancelled() => {}
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
        out.push(stored_to_wire(inner, e));
    }
    out.sort_by_key(|e| e.seq);
    out
}

/// A held event on the wire, with its series' name, source and fields.
fn stored_to_wire(inner: &HubInner, e: &Stored) -> pb::Event {
    let s = &inner.series[e.series as usize];
    to_wire(
        &s.name,
        &s.source,
        e.timestamp_ns,
        e.seq,
        &s.fields,
        &e.numbers,
        &e.strings,
    )
}

/// What [`query_window`] found.
#[derive(Debug, Default)]
pub struct Window {
    /// In seq order, the most recent `limit`.
    pub events: Vec<pb::Event>,
    /// Older events of the window left out by the limit.
    pub omitted: u64,
    /// The oldest event time the ring still holds (0 = it holds none).
    pub held_since_ns: i64,
}

/// Every event held in the ring with a timestamp in the last `window_ns` before `now_ns` that
/// `selector` matches — at most one per series per `min_interval_ns` when that is > 0 (a
/// grant's rate class, as a subscription gets) — keeping the most recent `limit`.
pub fn query_window(
    inner: &HubInner,
    selector: &Selector,
    window_ns: i64,
    now_ns: i64,
    limit: usize,
    min_interval_ns: i64,
) -> Window {
    let from_ns = now_ns.saturating_sub(window_ns);
    let mut kept: VecDeque<&Stored> = VecDeque::with_capacity(limit.min(4096));
    let mut last_per_series: HashMap<u32, i64> = HashMap::new();
    let mut omitted = 0u64;
    let mut held_since_ns = 0;
    for e in inner.since(inner.oldest()) {
        if held_since_ns == 0 {
            held_since_ns = e.timestamp_ns;
        }
        if e.timestamp_ns < from_ns {
            continue;
        }
        let s = &inner.series[e.series as usize];
        if !selector.matches(&s.name, &s.source) {
            continue;
        }
        if min_interval_ns > 0 {
            match last_per_series.get(&e.series) {
                Some(&t) if e.timestamp_ns.saturating_sub(t) < min_interval_ns => continue,
                _ => {
                    last_per_series.insert(e.series, e.timestamp_ns);
                }
            }
        }
        if kept.len() == limit {
            kept.pop_front();
            omitted += 1;
        }
        if limit > 0 {
            kept.push_back(e);
        }
    }
    let events = kept.into_iter().map(|e| stored_to_wire(inner, e)).collect();
    Window {
        events,
        omitted,
        held_since_ns,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_identity_that_subscribed_may_unsubscribe() {
        use gma_core::authz::Identity;
        let reg = Arc::new(Registry::default());
        let (alice, bob) = (Identity::new("alice", "site1"), Identity::new("bob", "site2"));
        let a = reg.add("c1", &alice);
        let _b = reg.add("c1", &bob);
        let e = reg.cancel_one(a.id, "c1", &bob).unwrap_err();
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::PermissionDenied);
        assert!(!a.cancel.is_cancelled());
        assert_eq!(reg.cancel_all("c1", &Identity::anonymous()), 0);
        assert_eq!(reg.cancel_all("c1", &bob), 1);
        assert!(!a.cancel.is_cancelled());
        assert_eq!(reg.cancel_one(a.id, "c1", &alice).unwrap(), 1);
        assert!(a.cancel.is_cancelled());
    }

    use super::*;
    use gma_core::codec::BatchDecoder;
    use gma_core::event::{dbl, EventData};

    fn with_schema(hub: Arc<Hub>) -> Arc<Hub> {
        hub.add_schemas(&[pb::EventSchema {
            name: "t.x".into(),
            version: 1,
            fields: vec![dbl("v", "", "")],
            description: String::new(),
        }])
        .unwrap();
        hub
    }

    fn hub(cap: usize) -> Arc<Hub> {
        with_schema(Hub::new(7, cap))
    }

    fn publish(hub: &Hub, src: &str, values: &[f64]) {
        let evs: Vec<EventData> = values
            .iter()
            .enumerate()
            .map(|(i, v)| EventData {
                name: "t.x".into(),
                source: src.into(),
                timestamp_ns: 1_000 + i as i64,
                numbers: vec![*v],
                strings: vec![],
            })
            .collect();
        hub.publish(&evs).1.unwrap();
    }

    fn spec() -> Spec {
        Spec::plain(Selector {
            patterns: vec![Pattern::event("t.*").unwrap()],
            sources: vec![],
        })
    }

    /// Drains a cursor (shared or private) into decoded (source, value, mark) triples.
    fn drain(
        hub: &Hub,
        group: Option<&Mutex<Group>>,
        c: &mut Cursor,
        dec: &mut BatchDecoder,
    ) -> Vec<(String, f64, Mark)> {
        let mut out = Vec::new();
        let mut msgs = Vec::new();
        loop {
            let done = next_messages(hub, group, c, 7, None, &mut msgs);
            for m in msgs.drain(..) {
                let b = pb::EventBatch::decode(m).unwrap();
                dec.decode_each(&b, |e| out.push((e.series.source.clone(), e.numbers[0], e.mark)))
                    .unwrap();
            }
            if done {
                return out;
            }
        }
    }

    #[test]
    fn a_window_holds_every_event_in_it_the_most_recent_first_kept() {
        // Timestamps 1000.. (publish): 5 events of "a", 3 of "b"; the ring keeps 6.
        let hub = hub(6);
        publish(&hub, "a", &[1.0, 2.0, 3.0, 4.0, 5.0]);
        publish(&hub, "b", &[10.0, 11.0, 12.0]);
        let inner = hub.lock();
        let sel = spec().selector;
        let vals = |w: &Window| -> Vec<(String, f64)> {
            w.events
                .iter()
                .map(|e| match e.values[0].kind {
                    Some(pb::value::Kind::Number(n)) => (e.source.clone(), n),
                    _ => (e.source.clone(), f64::NAN),
                })
                .collect()
        };
        // The ring lost a1 and a2; everything since t=1000 still held, in seq order.
        let w = query_window(&inner, &sel, 1_000, 1_010, 100, 0);
        assert_eq!(
            vals(&w),
            [
                ("a", 3.0),
                ("a", 4.0),
                ("a", 5.0),
                ("b", 10.0),
                ("b", 11.0),
                ("b", 12.0)
            ]
            .map(|(s, v)| (s.to_string(), v))
        );
        assert_eq!((w.omitted, w.held_since_ns), (0, 1_002));
        // A window's start: only t >= 1010 - 9 = 1001 (b's 10 at t=1000 is out).
        let w = query_window(&inner, &sel, 9, 1_010, 100, 0);
        assert_eq!(w.events.len(), 5);
        // The limit keeps the most recent and counts the rest.
        let w = query_window(&inner, &sel, 1_000, 1_010, 2, 0);
        assert_eq!(vals(&w), [("b".to_string(), 11.0), ("b".to_string(), 12.0)]);
        assert_eq!(w.omitted, 4);
        // A rate class thins each series: at most one event per 2 ns.
        let w = query_window(&inner, &sel, 1_000, 1_010, 100, 2);
        assert_eq!(
            vals(&w),
            [("a", 3.0), ("a", 5.0), ("b", 10.0), ("b", 12.0)].map(|(s, v)| (s.to_string(), v))
        );
        // A selector that matches nothing: nothing, and what the ring holds.
        let none = Selector {
            patterns: vec![Pattern::event("u.*").unwrap()],
            sources: vec![],
        };
        let w = query_window(&inner, &none, 1_000, 1_010, 100, 0);
        assert!(w.events.is_empty());
        assert_eq!(w.held_since_ns, 1_002);
    }

    #[test]
    fn members_of_a_group_share_chunks_and_get_declarations() {
        let hub = hub(1000);
        let group = Mutex::new(Group::new(&spec()));
        publish(&hub, "a", &[1.0, 2.0]);
        let mut c1 = Cursor::new(spec());
        let mut c2 = Cursor::new(spec());
        c1.start(&hub.lock(), Start::From(1));
        c2.start(&hub.lock(), Start::From(1));
        let (mut d1, mut d2) = (BatchDecoder::new(), BatchDecoder::new());
        assert_eq!(drain(&hub, Some(&group), &mut c1, &mut d1).len(), 2);
        publish(&hub, "b", &[3.0]);
        assert_eq!(drain(&hub, Some(&group), &mut c1, &mut d1).len(), 1);
        // c2 reads the two chunks c1 built (one encoding each) and still decodes everything.
        let got = drain(&hub, Some(&group), &mut c2, &mut d2);
        assert_eq!(got.iter().map(|e| e.1).collect::<Vec<_>>(), vec![1.0, 2.0, 3.0]);
        assert_eq!(group.lock().chunks.len(), 2);
    }

    /// A lone member's group drops the chunks it has passed and still serves it every event.
    #[test]
    fn a_lone_members_group_keeps_no_chunk_it_has_passed() {
        let hub = hub(1000);
        let s = spec();
        let group = Mutex::new(Group::new(&s));
        let mut c = Cursor::new(s);
        c.start(&hub.lock(), Start::From(1));
        let mut dec = BatchDecoder::new();
        let mut got = Vec::new();
        for round in 0..5 {
            publish(&hub, "a", &[f64::from(round), 0.5]);
            got.extend(
                drain(&hub, Some(&group), &mut c, &mut dec)
                    .into_iter()
                    .map(|e| e.1),
            );
            let mut g = group.lock();
            assert!(!g.chunks.is_empty(), "the round's chunk was shared");
            g.drop_passed(c.next);
            assert!(
                g.chunks.is_empty() && g.bytes == 0,
                "round {round}: a passed chunk kept"
            );
        }
        let want: Vec<f64> = (0..5).flat_map(|r| [f64::from(r), 0.5]).collect();
        assert_eq!(got, want, "every event, in order");
    }

    /// A group keeps no chunk of events its ring has overwritten.
    #[test]
    fn a_group_drops_the_chunks_the_ring_no_longer_holds() {
        let hub = hub(10);
        let mut s = spec();
        s.max_batch = 2;
        let group = Mutex::new(Group::new(&s));
        let mut c = Cursor::new(s);
        c.start(&hub.lock(), Start::From(1));
        let mut dec = BatchDecoder::new();
        let mut got = 0;
        for round in 0..20 {
            publish(&hub, "a", &[f64::from(round), 0.5]);
            got += drain(&hub, Some(&group), &mut c, &mut dec).len();
        }
        assert_eq!(got, 40);
        let oldest = hub.lock().oldest();
        let g = group.lock();
        assert!(oldest > 20, "the ring moved on: oldest {oldest}");
        assert!(
            g.chunks.iter().all(|ch| ch.to > oldest),
            "a chunk of overwritten events"
        );
        assert_eq!(g.bytes, g.chunks.iter().map(|ch| ch.bytes.len()).sum::<usize>());
        assert!(
            g.chunks.len() <= 5,
            "{} chunks for a 10-event ring",
            g.chunks.len()
        );
    }

    #[test]
    fn a_private_reader_rejoins_at_a_chunk_border() {
        let hub = hub(1000);
        let mut s = spec();
        s.max_batch = 2;
        let group = Mutex::new(Group::new(&s));
        publish(&hub, "a", &[1.0, 2.0, 3.0, 4.0, 5.0]);
        let mut c1 = Cursor::new(s.clone());
        c1.start(&hub.lock(), Start::From(1));
        drain(&hub, Some(&group), &mut c1, &mut BatchDecoder::new());
        // Starts in the middle of the first chunk: private up to its end, then shared.
        let mut c2 = Cursor::new(s);
        c2.start(&hub.lock(), Start::From(2));
        let got = drain(&hub, Some(&group), &mut c2, &mut BatchDecoder::new());
        assert_eq!(
            got.iter().map(|e| e.1).collect::<Vec<_>>(),
            vec![2.0, 3.0, 4.0, 5.0]
        );
    }

    #[test]
    fn when_marks_crossings_only() {
        let hub = hub(1000);
        let mut s = spec();
        s.when = Some(Filter::parse("v > 50").unwrap());
        let mut c = Cursor::new(s);
        c.start(&hub.lock(), Start::From(1));
        publish(&hub, "a", &[10.0, 60.0, 70.0, 40.0, 30.0, 55.0]);
        let got = drain(&hub, None, &mut c, &mut BatchDecoder::new());
        assert_eq!(
            got.iter().map(|e| (e.1, e.2)).collect::<Vec<_>>(),
            vec![(60.0, Mark::Enter), (40.0, Mark::Leave), (55.0, Mark::Enter)]
        );
    }

    #[test]
    fn delta_filter_delivers_moves_beyond_the_percentage() {
        let hub = hub(1000);
        let mut s = spec();
        s.delta_pct = Some(20.0);
        let mut c = Cursor::new(s);
        c.start(&hub.lock(), Start::From(1));
        publish(
            &hub,
            "a",
            &[100.0, 110.0, 119.0, 121.0, 100.0, 96.0, 0.0, 0.0, 1.0],
        );
        let got = drain(&hub, None, &mut c, &mut BatchDecoder::new());
        assert_eq!(
            got.iter().map(|e| e.1).collect::<Vec<_>>(),
            vec![100.0, 121.0, 96.0, 0.0, 1.0]
        );
    }

    #[test]
    fn policies_when_behind() {
        let hub = hub(1000);
        // drop-oldest with a queue of 3: the 7 oldest of 10 are skipped with an exact gap.
        let mut s = spec();
        s.queue_events = 3;
        let mut c = Cursor::new(s.clone());
        c.start(&hub.lock(), Start::From(1));
        publish(&hub, "a", &(0..10).map(f64::from).collect::<Vec<_>>());
        let mut msgs = Vec::new();
        next_messages(&hub, None, &mut c, 7, None, &mut msgs);
        let b = pb::EventBatch::decode(msgs[0].clone()).unwrap();
        assert_eq!((b.gaps[0].from_seq, b.gaps[0].to_seq, b.dropped), (1, 7, 7));
        let got = drain(&hub, None, &mut c, &mut BatchDecoder::new());
        assert_eq!(got.iter().map(|e| e.1).collect::<Vec<_>>(), vec![7.0, 8.0, 9.0]);
        // latest: the backlog collapses to the newest value per series.
        s.policy = Policy::Latest;
        let mut c = Cursor::new(s);
        let head = hub.lock().head();
        c.start(&hub.lock(), Start::From(head));
        publish(&hub, "a", &[1.0, 2.0, 3.0, 4.0]);
        publish(&hub, "b", &[5.0, 6.0]);
        let mut msgs = Vec::new();
        next_messages(&hub, None, &mut c, 7, None, &mut msgs);
        let b = pb::EventBatch::decode(msgs[0].clone()).unwrap();
        assert_eq!(b.conflated, 4);
        assert!(b.gaps.is_empty());
        let mut got = Vec::new();
        BatchDecoder::new()
            .decode_each(&b, |e| got.push((e.series.source.clone(), e.numbers[0])))
            .unwrap();
        assert_eq!(got, vec![("a".into(), 4.0), ("b".into(), 6.0)]);
    }

    /// Every message of `c` until it is caught up, decoded: (source, value, seq) and the
    /// number of events of each message.
    fn messages(hub: &Hub, c: &mut Cursor, dec: &mut BatchDecoder) -> (Vec<(String, f64, u64)>, Vec<usize>) {
        let (mut got, mut sizes, mut msgs) = (Vec::new(), Vec::new(), Vec::new());
        loop {
            let done = next_messages(hub, None, c, 7, None, &mut msgs);
            for m in msgs.drain(..) {
                let before = got.len();
                dec.decode_each(&pb::EventBatch::decode(m).unwrap(), |e| {
                    got.push((e.series.source.clone(), e.numbers[0], e.seq))
                })
                .unwrap();
                sizes.push(got.len() - before);
            }
            if done {
                return (got, sizes);
            }
        }
    }

    fn latest_spec(max_batch: usize) -> Spec {
        let mut s = spec();
        s.max_batch = max_batch;
        s.policy = Policy::Latest;
        s
    }

    /// A start from the latest values of many series goes out `max_batch` at a time, every
    /// series once and in seq order, then what was published meanwhile.
    #[test]
    fn a_latest_start_over_many_series_is_sent_in_bounded_batches() {
        let hub = hub(100_000);
        for i in 0..2_500 {
            publish(&hub, &format!("h{i:04}"), &[f64::from(i)]);
        }
        let mut c = Cursor::new(latest_spec(100));
        c.start(&hub.lock(), Start::Latest);
        publish(&hub, "h0000", &[-1.0]);
        let (got, sizes) = messages(&hub, &mut c, &mut BatchDecoder::new());
        assert!(sizes.iter().all(|n| *n <= 100), "{sizes:?}");
        assert!(sizes.len() >= 25, "{} messages", sizes.len());
        assert_eq!(got.len(), 2_501);
        assert!(got.windows(2).all(|w| w[0].2 < w[1].2), "seq order");
        assert_eq!(got[0], ("h0000".to_string(), 0.0, 1));
        assert_eq!(got[2_500], ("h0000".to_string(), -1.0, 2_501));
        assert!(c.caught_up(&hub.lock()));
    }

    /// A `latest` subscription that cannot keep up with 2,500 series all moving every round
    /// still gets a value of every one of them: a snapshot is sent whole before the next (a
    /// snapshot taken anew at each overrun, sent from its oldest seq, reached only the first
    /// hosts of each round).
    #[test]
    fn a_latest_subscription_behind_reaches_every_series() {
        let hub = hub(100_000);
        let round = |hub: &Hub, r: u32| {
            for i in 0..2_500 {
                publish(hub, &format!("h{i:04}"), &[f64::from(r)]);
            }
        };
        round(&hub, 0);
        let mut s = latest_spec(100);
        s.queue_events = 100;
        let mut c = Cursor::new(s);
        c.start(&hub.lock(), Start::Latest);
        let mut dec = BatchDecoder::new();
        let mut seen = std::collections::HashSet::new();
        let mut last_seq = 0;
        let mut msgs = Vec::new();
        // One message per round: far slower than the producer.
        for r in 1..=30 {
            round(&hub, r);
            next_messages(&hub, None, &mut c, 7, None, &mut msgs);
            for m in msgs.drain(..) {
                dec.decode_each(&pb::EventBatch::decode(m).unwrap(), |e| {
                    assert!(e.seq > last_seq, "seq {} after {last_seq}", e.seq);
                    last_seq = e.seq;
                    seen.insert(e.series.source.clone());
                })
                .unwrap();
            }
        }
        assert_eq!(seen.len(), 2_500);
    }

    #[test]
    fn block_policy_holds_the_log_within_its_reserve() {
        let hub = with_schema(Hub::with_block_reserve(7, 4, 4));
        hub.pin(1, 1);
        publish(&hub, "a", &(0..6).map(f64::from).collect::<Vec<_>>());
        assert_eq!(
            hub.lock().oldest(),
            1,
            "pinned: nothing overwritten within the reserve"
        );
        publish(&hub, "a", &(0..6).map(f64::from).collect::<Vec<_>>());
        assert_eq!(hub.lock().oldest(), 5, "beyond capacity + reserve the oldest go");
        hub.unpin(1);
        publish(&hub, "a", &[1.0]);
        assert_eq!(hub.lock().oldest(), 10, "unpinned: back to the capacity");
    }
}

#[cfg(test)]
mod interleavings {
    //! Members of one fan-out group with different policies (the stalled drop-oldest, latest
    //! and fast drop-oldest subscribers of tests/tests/producer_stall.rs), read in arbitrary
    //! interleavings with publishes, ring eviction and events the group does not select (as
    //! the producer's own `gma.rpc`): a drop-oldest member accounts for every selected seq
    //! exactly, delivered in order or inside a reported gap; only unselected seqs are skipped
    //! without one.

    use super::*;
    use gma_core::codec::BatchDecoder;
    use gma_core::event::{dbl, EventData};
    use proptest::prelude::*;

    /// What one member has accounted for so far.
    struct Member {
        cursor: Cursor,
        dec: BatchDecoder,
        /// The next seq not yet delivered, in a gap or conflated.
        next: u64,
    }

    impl Member {
        fn new(hub: &Hub, policy: Policy, queue_events: u64, max_batch: usize) -> Member {
            let mut s = spec(max_batch);
            s.policy = policy;
            s.queue_events = queue_events;
            let mut cursor = Cursor::new(s);
            cursor.start(&hub.lock(), Start::From(1));
            Member {
                cursor,
                dec: BatchDecoder::new(),
                next: 1,
            }
        }

        /// One call of the stream's loop; checks what it sent against `selected` (by seq).
        /// Returns whether caught up.
        fn step(
            &mut self,
            hub: &Hub,
            group: &Mutex<Group>,
            selected: &[bool],
            exact: bool,
        ) -> Result<bool, String> {
            let skipped = |from: u64, to: u64| (from..to).find(|s| selected[*s as usize]);
            let mut msgs = Vec::new();
            let done = next_messages(hub, Some(group), &mut self.cursor, 7, None, &mut msgs);
            for m in msgs {
                let b = pb::EventBatch::decode(m).map_err(|e| e.to_string())?;
                for g in &b.gaps {
                    if g.from_seq < self.next {
                        return Err(format!("gap {g:?} but the stream stopped before {}", self.next));
                    }
                    if let Some(s) = skipped(self.next, g.from_seq) {
                        return Err(format!("selected seq {s} skipped before the gap {g:?}"));
                    }
                    self.next = g.to_seq + 1;
                }
                let mut bad = None;
                let next = &mut self.next;
                self.dec
                    .decode_each(&b, |e| {
                        if e.seq < *next && bad.is_none() {
                            bad = Some(format!("seq {} delivered again", e.seq));
                        }
                        if let Some(s) = skipped(*next, e.seq).filter(|_| exact && bad.is_none()) {
                            bad = Some(format!("seq {} delivered, selected {s} skipped (no gap)", e.seq));
                        }
                        *next = e.seq + 1;
                    })
                    .map_err(|e| e.to_string())?;
                if let Some(bad) = bad {
                    return Err(bad);
                }
            }
            Ok(done)
        }
    }

    fn spec(max_batch: usize) -> Spec {
        let mut s = Spec::plain(Selector {
            patterns: vec![Pattern::event("t.*").unwrap()],
            sources: vec![],
        });
        s.max_batch = max_batch;
        s
    }

    fn hub(ring: usize) -> Arc<Hub> {
        let hub = Hub::new(7, ring);
        hub.add_schemas(&["t.x", "u.x"].map(|name| pb::EventSchema {
            name: name.into(),
            version: 1,
            fields: vec![dbl("v", "", "")],
            description: String::new(),
        }))
        .unwrap();
        hub
    }

    /// Publishes `n` events of `name`; records by seq whether the group selects them.
    fn publish(hub: &Hub, name: &str, n: usize, sources: usize, selected: &mut Vec<bool>) {
        selected.resize(selected.len() + n, name == "t.x");
        let evs: Vec<EventData> = (0..n)
            .map(|i| EventData {
                name: name.into(),
                source: format!("s{}", i % sources),
                timestamp_ns: 1_000 + i as i64,
                numbers: vec![i as f64],
                strings: vec![],
            })
            .collect();
        hub.publish(&evs).1.unwrap();
    }

    /// 0 = publish a round, 1..=3 = one step of the stalled drop-oldest, the latest, the fast
    /// drop-oldest member, 4 = publish one event the group does not select.
    fn run(ring: usize, round: usize, max_batch: usize, steps: &[u8]) -> Result<(), String> {
        let hub = hub(ring);
        let group = Mutex::new(Group::new(&spec(max_batch)));
        let mut members = [
            Member::new(&hub, Policy::DropOldest, u64::MAX, max_batch),
            Member::new(&hub, Policy::Latest, max_batch as u64, max_batch),
            Member::new(&hub, Policy::DropOldest, u64::MAX, max_batch),
        ];
        // Indexed by seq (seq 0 is none).
        let mut selected = vec![false];
        for &s in steps {
            match s {
                0 => publish(&hub, "t.x", round, 3, &mut selected),
                4 => publish(&hub, "u.x", 1, 1, &mut selected),
                i => {
                    let i = usize::from(i - 1);
                    members[i]
                        .step(&hub, &group, &selected, i != 1)
                        .map_err(|e| format!("member {i}: {e}"))?;
                }
            }
        }
        // Everyone reads to the end: the drop-oldest members accounted for every selected seq.
        let head = hub.lock().head();
        for (i, m) in members.iter_mut().enumerate() {
            while !m
                .step(&hub, &group, &selected, i != 1)
                .map_err(|e| format!("member {i} at the end: {e}"))?
            {}
            if let Some(s) = (m.next..head).find(|s| selected[*s as usize]).filter(|_| i != 1) {
                return Err(format!(
                    "member {i} ended at {}: selected seq {s} never came",
                    m.next
                ));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        #[test]
        fn drop_oldest_members_account_for_every_seq_next_to_a_latest_member(
            ring in 2usize..12,
            round in 1usize..6,
            max_batch in 1usize..5,
            steps in proptest::collection::vec(0u8..5, 0..80),
        ) {
            if let Err(e) = run(ring, round, max_batch, &steps) {
                return Err(TestCaseError::fail(e));
            }
        }
    }
}
