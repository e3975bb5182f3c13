//! The hub: the producer's in-memory event log, latest-value cache and schema registry.
//!
//! Sensors publish into the hub; each subscription reads the log with its own cursor. The log
//! is a bounded ring of the most recent events (the resume window): a sensor never waits for a
//! consumer, a slow subscription simply falls behind and, if the ring overwrote events it had
//! not read, is told exactly which seqs it lost. Seqs are assigned here, strictly increasing per
//! producer run (epoch). The ring is bounded in events (`buffer_events`) and, when asked, in
//! bytes (`buffer_bytes`: the events' slots and their values' allocations, [`stored_bytes`]), so
//! that a slow agent's ring does not grow its memory past a configured size.
//!
//! Two ways in: [`Hub::publish`] takes whole [`EventData`] (name and source strings looked up
//! per event), for pushed events and sensors' batches; a publisher that publishes the same
//! series again and again resolves each once ([`Hub::series`] -> [`SeriesHandle`], as a
//! Prometheus client keeps a child of a metric) and then writes events with no lookup and no
//! intermediate event ([`Hub::publisher`] for a batch under one lock, [`Hub::publish_series`]
//! for one event). Both assign seqs and fill the ring and the latest-value table the same way.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

use gma_core::codec::SeriesInfo;
use gma_core::event::{same_definition, validate_schema, EventData, Layout, SchemaError};
use gma_core::pattern::{validate_event_name, validate_source, PatternError};
use gma_proto::v1 as pb;
use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

/// Most distinct (name, source) series one producer keeps.
pub const MAX_SERIES: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("event {0:?} has no schema: register its schema first")]
    UnknownSchema(String),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error(transparent)]
    Name(#[from] PatternError),
    #[error("event {name:?} from {origin:?}: schema version {version} wants {want_d} numbers and {want_s} strings, got {got_d} and {got_s}")]
    Layout {
        name: String,
        origin: String,
        version: u32,
        want_d: usize,
        want_s: usize,
        got_d: usize,
        got_s: usize,
    },
    #[error("too many series (limit {MAX_SERIES})")]
    TooManySeries,
    #[error("series handle of another hub: resolve it with this hub's `series`")]
    ForeignSeries,
}

/// A series resolved once with [`Hub::series`]: publishing through it skips the lookup by name
/// and source. Valid for the life of the hub that made it (series are never removed; a newer
/// schema version applies to new series only, so its layout holds); another hub refuses it
/// ([`PublishError::ForeignSeries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesHandle {
    hub: u64,
    id: u32,
    layout: Layout,
}

impl SeriesHandle {
    /// The series' id in its hub (the id subscriptions declare it under).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The numbers and strings each of its events carries.
    pub fn layout(&self) -> Layout {
        self.layout
    }
}

/// Tells hubs apart, so that a handle is only used with the hub that made it.
static NEXT_HUB_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Numbers an event keeps in its ring slot; more go to the heap.
pub const INLINE_NUMBERS: usize = 3;

/// An event's numbers: up to [`INLINE_NUMBERS`] in the slot itself, so writing an event into
/// the ring and encoding it for a subscription touch the slot alone (the ring is read and
/// written in order; a separate allocation per event was a second, scattered place to load).
pub type Numbers = smallvec::SmallVec<[f64; INLINE_NUMBERS]>;

/// One event in the log.
#[derive(Debug, Clone)]
pub struct Stored {
    pub seq: u64,
    pub timestamp_ns: i64,
    pub series: u32,
    pub numbers: Numbers,
    pub strings: Box<[String]>,
}

impl Stored {
    /// Whether this event's boxes hold values of `layout` (so they can take a new event's).
    fn fits(&self, layout: Layout) -> bool {
        self.numbers.len() == layout.doubles && self.strings.len() == layout.strings
    }

    /// Makes this event (whose boxes [`Stored::fits`] the values) the given one, in place.
    /// Each string is held at its length, as a new event's are: `String::clone_from` keeps the
    /// old capacity, so a string of another length is cloned afresh (a ring slot must take
    /// what its byte bound was checked against, [`stored_bytes`]).
    fn rewrite(&mut self, seq: u64, timestamp_ns: i64, series: u32, numbers: &[f64], strings: &[String]) {
        self.seq = seq;
        self.timestamp_ns = timestamp_ns;
        self.series = series;
        self.numbers.copy_from_slice(numbers);
        for (old, new) in self.strings.iter_mut().zip(strings) {
            if old.capacity() == new.len() {
                old.clone_from(new);
            } else {
                *old = new.clone();
            }
        }
    }
}

/// Bytes one ring slot takes (the [`Stored`] itself).
pub const SLOT_BYTES: usize = std::mem::size_of::<Stored>();

/// The heap memory of an allocation of `n` bytes: glibc's chunk on a 64-bit host (8 bytes of
/// header, rounded up to 16, at least 32); 0 for none.
fn heap_bytes(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        n.saturating_add(8 + 15).max(32) & !15
    }
}

/// The heap memory of an event's values (its slot not included): the numbers' allocation
/// (none when they fit in the slot), the strings' array and each string's own. An estimate of
/// the allocator's chunks, counted against `buffer_bytes`.
pub fn stored_bytes(e: &Stored) -> usize {
    let strings = if e.strings.is_empty() {
        0
    } else {
        heap_bytes(std::mem::size_of_val(&*e.strings))
            + e.strings.iter().map(|s| heap_bytes(s.capacity())).sum::<usize>()
    };
    numbers_heap_bytes(e.numbers.capacity()) + strings
}

/// The heap memory of `n` numbers as a slot keeps them.
fn numbers_heap_bytes(n: usize) -> usize {
    if n <= INLINE_NUMBERS {
        0
    } else {
        heap_bytes(n * std::mem::size_of::<f64>())
    }
}

/// What bounds the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLimits {
    /// Events kept (the resume window), at least 1.
    pub events: usize,
    /// Bytes the kept events may take, slots ([`SLOT_BYTES`] each, the ring's allocated
    /// capacity) plus their values ([`stored_bytes`]); `None`: bounded in events only.
    pub bytes: Option<usize>,
    /// Extra events the ring may hold while a block-policy subscription has not read them
    /// (and, under a byte bound, the same share of bytes again).
    pub block_reserve: usize,
}

pub struct HubInner {
    pub epoch: u64,
    /// This hub's identity in [`SeriesHandle`]s.
    hub_id: u64,
    next_seq: u64,
    ring: VecDeque<Stored>,
    capacity: usize,
    /// Extra events the ring may hold while a block-policy subscription has not read them.
    block_reserve: usize,
    /// The byte bound and its block reserve (see [`RingLimits`]).
    byte_capacity: Option<usize>,
    byte_reserve: usize,
    /// [`stored_bytes`] of the events in the ring.
    value_bytes: usize,
    /// Block-policy subscriptions: id -> the next seq each still needs.
    pins: HashMap<u64, u64>,
    schemas: HashMap<String, pb::EventSchema>,
    by_name: HashMap<String, HashMap<String, u32>>,
    /// The field list of each event name's schema, shared by all its series: one copy per
    /// schema, not per series (a copy was ~1.4 KB per series, 135 MB at 25,000 simulated hosts
    /// of 4 events each).
    fields: HashMap<String, Arc<[pb::FieldSpec]>>,
    pub series: Vec<Arc<SeriesInfo>>,
    latest: Vec<Option<Stored>>,
    /// Bumped whenever the set of schemas or sources changes (the registrar re-publishes).
    pub catalog_version: u64,
}

impl HubInner {
    /// Seq the next published event gets.
    pub fn head(&self) -> u64 {
        self.next_seq
    }

    /// A block-policy subscription still needs every event from `next` on, set while the
    /// caller holds the lock (e.g. together with its start). A new pin only takes room away,
    /// so no waiting writer needs waking; [`Hub::pin`] moves a pin later on.
    pub fn pin(&mut self, id: u64, next: u64) {
        self.pins.insert(id, next);
    }

    /// Moves the pin of block-policy subscription `id` to `next`; returns whether a writer
    /// waiting for room should be woken ([`Hub::wake_writers`], once the lock is released).
    /// Room follows the slowest pin only: a waiting writer is woken when the slowest moves on
    /// (or a new pin comes), not by every member of a fan-out passing every chunk (100
    /// wake-ups per chunk at 1 -> 100, each for nothing but one).
    pub fn move_pin(&mut self, id: u64, next: u64) -> bool {
        match self.pins.insert(id, next) {
            Some(old) => old < next && self.pins.iter().all(|(k, &p)| *k == id || p > old),
            None => true,
        }
    }

    /// Block-policy subscriptions pinning the ring.
    pub fn pinned(&self) -> usize {
        self.pins.len()
    }

    /// Events published that the slowest block-policy subscription has not read yet (0 with
    /// none): a bench waits on it for its subscribers to catch up.
    pub fn unread(&self) -> u64 {
        self.pins
            .values()
            .min()
            .map_or(0, |&pin| self.next_seq.saturating_sub(pin))
    }

    /// Oldest seq still in the ring (== head when empty).
    pub fn oldest(&self) -> u64 {
        self.ring.front().map(|e| e.seq).unwrap_or(self.next_seq)
    }

    /// Events a writer that can wait may publish now without overwriting one a block-policy
    /// subscription has not read, the ring staying within its capacity (the block reserve is
    /// left to writers that cannot wait, the sensors). Unbounded without block subscriptions.
    pub fn room(&self) -> usize {
        match self.pins.values().min() {
            None => usize::MAX,
            Some(&pin) => {
                let from = pin.max(self.oldest());
                let held = self.next_seq.saturating_sub(from);
                let events = self
                    .capacity
                    .saturating_sub(usize::try_from(held).unwrap_or(usize::MAX));
                match self.byte_capacity {
                    None => events,
                    Some(cap) => {
                        // Under a byte bound: as many more events as fit, at the ring's
                        // average size.
                        let held: usize = self.since(from).map(|e| SLOT_BYTES + stored_bytes(e)).sum();
                        let avg = (self.value_bytes / self.ring.len().max(1)) + SLOT_BYTES;
                        events.min(cap.saturating_sub(held) / avg)
                    }
                }
            }
        }
    }

    /// Events in the ring.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether the ring is empty.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Bytes the ring takes: its slots (allocated capacity) and its events' values, as counted
    /// against `buffer_bytes`.
    pub fn ring_bytes(&self) -> usize {
        self.ring.capacity() * SLOT_BYTES + self.value_bytes
    }

    /// Events with seq >= `from`, in order.
    pub fn since(&self, from: u64) -> impl Iterator<Item = &Stored> {
        let skip = from.saturating_sub(self.oldest()) as usize;
        self.ring.iter().skip(skip)
    }

    pub fn latest(&self) -> impl Iterator<Item = &Stored> {
        self.latest.iter().flatten()
    }

    /// The newest event of series `id`, if it has one.
    pub fn latest_of(&self, id: u32) -> Option<&Stored> {
        self.latest.get(id as usize)?.as_ref()
    }

    /// The value layout of an existing series.
    pub fn series_layout(&self, name: &str, source: &str) -> Option<Layout> {
        let id = self.by_name.get(name)?.get(source)?;
        Some(self.series[*id as usize].layout)
    }

    pub fn schema(&self, name: &str) -> Option<&pb::EventSchema> {
        self.schemas.get(name)
    }

    pub fn schemas(&self) -> impl Iterator<Item = &pb::EventSchema> {
        self.schemas.values()
    }

    pub fn sources(&self) -> impl Iterator<Item = &str> {
        let mut seen = std::collections::BTreeSet::new();
        for s in &self.series {
            seen.insert(s.source.as_str());
        }
        seen.into_iter()
    }

    /// The ring's bytes (see [`HubInner::ring_bytes`]) once an event whose values take
    /// `incoming` is in: the slots grow when every one is taken.
    fn bytes_with(&self, incoming: usize, spare: bool) -> usize {
        // A spare slot at the back (an evicted event, see `append`) takes the incoming one.
        let len = self.ring.len() - usize::from(spare);
        let slots = if len < self.ring.capacity() {
            self.ring.capacity()
        } else {
            grown(self.ring.capacity())
        };
        slots * SLOT_BYTES + self.value_bytes + incoming
    }

    fn series_id(&mut self, name: &str, source: &str) -> Result<u32, PublishError> {
        if let Some(id) = self.by_name.get(name).and_then(|m| m.get(source)) {
            return Ok(*id);
        }
        let schema = self
            .schemas
            .get(name)
            .ok_or_else(|| PublishError::UnknownSchema(name.to_string()))?;
        validate_source(source)?;
        if self.series.len() >= MAX_SERIES {
            return Err(PublishError::TooManySeries);
        }
        let id = self.series.len() as u32;
        let fields = match self.fields.get(name) {
            Some(f) if **f == *schema.fields => f.clone(),
            _ => {
                let f: Arc<[pb::FieldSpec]> = schema.fields.clone().into();
                self.fields.insert(name.to_string(), f.clone());
                f
            }
        };
        self.series.push(Arc::new(SeriesInfo {
            id,
            name: name.to_string(),
            source: source.to_string(),
            schema_version: schema.version,
            layout: Layout::of(&schema.fields),
            fields,
        }));
        self.latest.push(None);
        self.by_name
            .entry(name.to_string())
            .or_default()
            .insert(source.to_string(), id);
        self.catalog_version += 1;
        metrics::gauge!(crate::telemetry::SERIES).set(self.series.len() as f64);
        Ok(id)
    }
}

/// Shared handle to the hub.
pub struct Hub {
    inner: Mutex<HubInner>,
    head_tx: watch::Sender<u64>,
    /// Signalled when a block-policy subscription moves or leaves (room for waiting writers).
    room: Condvar,
}

impl Hub {
    /// A hub whose ring keeps the last `capacity` events (and as many again for block-policy
    /// subscriptions that have not read them yet).
    pub fn new(epoch: u64, capacity: usize) -> Arc<Hub> {
        Hub::with_block_reserve(epoch, capacity, capacity)
    }

    /// A hub whose ring keeps the last `capacity` events and up to `block_reserve` more for
    /// block-policy subscriptions.
    pub fn with_block_reserve(epoch: u64, capacity: usize, block_reserve: usize) -> Arc<Hub> {
        Hub::with_limits(
            epoch,
            RingLimits {
                events: capacity,
                bytes: None,
                block_reserve,
            },
        )
    }

    /// A hub whose ring is bounded as `limits` say.
    pub fn with_limits(epoch: u64, limits: RingLimits) -> Arc<Hub> {
        let capacity = limits.events.max(1);
        let (head_tx, _) = watch::channel(1);
        // Bounded in bytes, the ring's slots grow as events come (their capacity counts);
        // otherwise they are allocated at once (pages are touched as the ring fills).
        let ring = match limits.bytes {
            Some(_) => VecDeque::new(),
            None => VecDeque::with_capacity(capacity.min(1 << 20)),
        };
        let byte_reserve = limits.bytes.map_or(0, |b| {
            let r = b as u128 * limits.block_reserve as u128 / capacity as u128;
            usize::try_from(r).unwrap_or(usize::MAX)
        });
        Arc::new(Hub {
            inner: Mutex::new(HubInner {
                epoch,
                hub_id: NEXT_HUB_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                next_seq: 1,
                ring,
                capacity,
                block_reserve: limits.block_reserve,
                byte_capacity: limits.bytes,
                byte_reserve,
                value_bytes: 0,
                pins: HashMap::new(),
                schemas: HashMap::new(),
                by_name: HashMap::new(),
                fields: HashMap::new(),
                series: Vec::new(),
                latest: Vec::new(),
                catalog_version: 0,
            }),
            head_tx,
            room: Condvar::new(),
        })
    }

    pub fn lock(&self) -> parking_lot::MutexGuard<'_, HubInner> {
        self.inner.lock()
    }

    /// A block-policy subscription still needs every event from `next` on.
    pub fn pin(&self, id: u64, next: u64) {
        let wake = self.inner.lock().move_pin(id, next);
        if wake {
            self.wake_writers();
        }
    }

    /// Wakes writers waiting for room (see [`HubInner::move_pin`]).
    pub fn wake_writers(&self) {
        self.room.notify_all();
    }

    pub fn unpin(&self, id: u64) {
        self.inner.lock().pins.remove(&id);
        self.room.notify_all();
    }

    /// Waits (blocking the thread) until `n` events fit without overwriting any a block-policy
    /// subscription has not read ([`HubInner::room`]), at most until `deadline`; returns a
    /// [`Publisher`] (the lock still held from the check) when they fit. For a source that can
    /// wait (a bench generator): the block policy then holds the writer back instead of costing
    /// the reserve and, past it, a gap. `n` above the ring's capacity never fits while a block
    /// subscription exists.
    pub fn publisher_with_room(&self, n: usize, deadline: std::time::Instant) -> Option<Publisher<'_>> {
        let mut inner = self.inner.lock();
        while inner.room() < n {
            if self.room.wait_until(&mut inner, deadline).timed_out() && inner.room() < n {
                return None;
            }
        }
        Some(self.publisher_locked(inner))
    }

    /// Receives the head seq after every publish.
    pub fn watch_head(&self) -> watch::Receiver<u64> {
        self.head_tx.subscribe()
    }

    pub fn epoch(&self) -> u64 {
        self.inner.lock().epoch
    }

    /// Adds schemas. A schema with the name of a known one must have the same definition or a
    /// higher version (the new version replaces the old for new series).
    pub fn add_schemas(&self, schemas: &[pb::EventSchema]) -> Result<(), PublishError> {
        for s in schemas {
            validate_schema(s)?;
        }
        let mut inner = self.inner.lock();
        for s in schemas {
            if let Some(old) = inner.schemas.get(&s.name) {
                if same_definition(old, s) {
                    continue;
                }
                if s.version <= old.version {
                    return Err(SchemaError::Invalid {
                        name: s.name.clone(),
                        message: format!(
                            "version {} differs from the registered version {}; use a higher version",
                            s.version, old.version
                        ),
                    }
                    .into());
                }
            }
            inner.schemas.insert(s.name.clone(), s.clone());
            inner.catalog_version += 1;
        }
        Ok(())
    }

    /// Publishes events, assigning seqs. Events that fail validation are skipped and the first
    /// error is returned after the valid ones are published. Returns the last seq assigned.
    pub fn publish(&self, events: &[EventData]) -> (u64, Result<(), PublishError>) {
        let mut first_err = None;
        let mut rejected = 0u64;
        let mut inner = self.inner.lock();
        let start = inner.next_seq;
        // The pins cannot move while the lock is held: their minimum once per publish.
        let pin = inner.pins.values().min().copied();
        for e in events {
            match publish_one(&mut inner, e, pin) {
                Ok(()) => {}
                Err(err) => {
                    rejected += 1;
                    if first_err.is_none() {
                        first_err = Some(err);
                    }
                }
            }
        }
        let head = inner.next_seq;
        drop(inner);
        metrics::counter!(crate::telemetry::EVENTS_PUBLISHED).increment(head - start);
        if rejected > 0 {
            metrics::counter!(crate::telemetry::PUBLISH_REJECTED).increment(rejected);
        }
        self.head_tx.send_replace(head);
        (head - 1, first_err.map_or(Ok(()), Err))
    }

    /// Resolves series (`name`, `source`) once, creating it (its event's schema must be
    /// registered) if it is new, for publishing through [`Hub::publisher`] or
    /// [`Hub::publish_series`] without a lookup per event.
    pub fn series(&self, name: &str, source: &str) -> Result<SeriesHandle, PublishError> {
        let mut inner = self.inner.lock();
        let id = match inner.by_name.get(name).and_then(|m| m.get(source)) {
            Some(id) => *id,
            None => {
                validate_event_name(name)?;
                inner.series_id(name, source)?
            }
        };
        Ok(SeriesHandle {
            hub: inner.hub_id,
            id,
            layout: inner.series[id as usize].layout,
        })
    }

    /// Publishes one event of a resolved series; returns its seq. For many events at once,
    /// [`Hub::publisher`] takes the lock once for all of them.
    pub fn publish_series(
        &self,
        series: &SeriesHandle,
        timestamp_ns: i64,
        numbers: &[f64],
        strings: &[String],
    ) -> Result<u64, PublishError> {
        let mut p = self.publisher();
        p.publish(series, timestamp_ns, numbers, strings)
    }

    /// Holds the hub's lock to publish a batch of events of resolved series, each written
    /// straight into its ring slot. The subscriptions see the batch when the [`Publisher`] is
    /// dropped (one wake-up per batch). Nothing else of the hub can be used meanwhile (its
    /// lock is held): keep the batch short and do not call the hub from inside it.
    pub fn publisher(&self) -> Publisher<'_> {
        self.publisher_locked(self.inner.lock())
    }

    fn publisher_locked<'a>(&'a self, inner: parking_lot::MutexGuard<'a, HubInner>) -> Publisher<'a> {
        let start = inner.next_seq;
        // The pins cannot move while the lock is held: their minimum once per batch.
        let pin = inner.pins.values().min().copied();
        Publisher {
            hub: self,
            inner: Some(inner),
            pin,
            start,
            rejected: 0,
        }
    }
}

/// A batch being published into the hub (see [`Hub::publisher`]); ends when dropped.
pub struct Publisher<'a> {
    hub: &'a Hub,
    /// `Some` until dropped.
    inner: Option<parking_lot::MutexGuard<'a, HubInner>>,
    pin: Option<u64>,
    start: u64,
    rejected: u64,
}

impl Publisher<'_> {
    /// Publishes one event of `series` (a handle of this hub) with these values, which must
    /// match its layout; returns its seq. A refused event takes no seq.
    pub fn publish(
        &mut self,
        series: &SeriesHandle,
        timestamp_ns: i64,
        numbers: &[f64],
        strings: &[String],
    ) -> Result<u64, PublishError> {
        let Some(inner) = self.inner.as_deref_mut() else {
            unreachable!("the lock is held until the publisher is dropped");
        };
        let r = if series.hub != inner.hub_id {
            Err(PublishError::ForeignSeries)
        } else {
            check_layout(inner, series.id, series.layout, numbers.len(), strings.len())
        };
        match r {
            Ok(()) => Ok(append(
                inner,
                series.id,
                series.layout,
                timestamp_ns,
                numbers,
                strings,
                self.pin,
            )),
            Err(e) => {
                self.rejected += 1;
                Err(e)
            }
        }
    }

    /// Seq the next published event gets.
    pub fn head(&self) -> u64 {
        self.inner.as_ref().map_or(self.start, |i| i.next_seq)
    }
}

impl Drop for Publisher<'_> {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let head = inner.next_seq;
        drop(inner);
        metrics::counter!(crate::telemetry::EVENTS_PUBLISHED).increment(head - self.start);
        if self.rejected > 0 {
            metrics::counter!(crate::telemetry::PUBLISH_REJECTED).increment(self.rejected);
        }
        if head != self.start {
            self.hub.head_tx.send_replace(head);
        }
    }
}

/// An event of series `id` (layout `layout`) must carry `doubles` numbers and `strings` strings.
fn check_layout(
    inner: &HubInner,
    id: u32,
    layout: Layout,
    doubles: usize,
    strings: usize,
) -> Result<(), PublishError> {
    if doubles == layout.doubles && strings == layout.strings {
        return Ok(());
    }
    let info = &inner.series[id as usize];
    Err(PublishError::Layout {
        name: info.name.clone(),
        origin: info.source.clone(),
        version: info.schema_version,
        want_d: layout.doubles,
        want_s: layout.strings,
        got_d: doubles,
        got_s: strings,
    })
}

fn publish_one(inner: &mut HubInner, e: &EventData, pin: Option<u64>) -> Result<(), PublishError> {
    let id = match inner
        .by_name
        .get(e.name.as_str())
        .and_then(|m| m.get(e.source.as_str()))
    {
        Some(id) => *id,
        None => {
            validate_event_name(&e.name)?;
            inner.series_id(&e.name, &e.source)?
        }
    };
    let layout = inner.series[id as usize].layout;
    check_layout(inner, id, layout, e.numbers.len(), e.strings.len())?;
    append(inner, id, layout, e.timestamp_ns, &e.numbers, &e.strings, pin);
    Ok(())
}

/// Appends an event of series `id` whose values match its `layout` (checked by the caller):
/// assigns its seq (returned), evicts what the ring's bounds say, writes the values into the
/// evicted event's boxes when their layout matches (no allocation per event once the ring is
/// full), and updates the latest-value table in place.
fn append(
    inner: &mut HubInner,
    id: u32,
    layout: Layout,
    timestamp_ns: i64,
    numbers: &[f64],
    strings: &[String],
    pin: Option<u64>,
) -> u64 {
    let seq = inner.next_seq;
    inner.next_seq += 1;
    // What the event will take under a byte bound: its values (as copied, at their lengths).
    let incoming = match inner.byte_capacity {
        None => 0,
        Some(_) => {
            let strings_bytes = if strings.is_empty() {
                0
            } else {
                heap_bytes(std::mem::size_of_val(strings))
                    + strings.iter().map(|s| heap_bytes(s.len())).sum::<usize>()
            };
            numbers_heap_bytes(numbers.len()) + strings_bytes
        }
    };
    // An evicted event is turned round to the back of the ring (`rotate_left`: in place when
    // the ring's buffer is full) as the spare slot the new event is written into, reusing its
    // boxes; the slot is not moved through the stack. A second eviction drops the spare first.
    let mut spare = false;
    loop {
        let len = inner.ring.len() - usize::from(spare);
        let over_bytes = match inner.byte_capacity {
            None => false,
            Some(cap) => inner.bytes_with(incoming, spare) > cap && len > 0,
        };
        if len < inner.capacity && !over_bytes {
            break;
        }
        // A block subscription that has not read the oldest event keeps it, within the reserve.
        let held = len < inner.capacity.saturating_add(inner.block_reserve)
            && inner.byte_capacity.is_none_or(|cap| {
                inner.bytes_with(incoming, spare) <= cap.saturating_add(inner.byte_reserve)
            })
            && match (inner.ring.front(), pin) {
                (Some(front), Some(pin)) if len > 0 => front.seq >= pin,
                _ => false,
            };
        if held || len == 0 {
            break;
        }
        if spare {
            inner.ring.pop_back();
        }
        if inner.byte_capacity.is_some() {
            if let Some(old) = inner.ring.front() {
                let b = stored_bytes(old);
                inner.value_bytes = inner.value_bytes.saturating_sub(b);
            }
        }
        inner.ring.rotate_left(1);
        spare = true;
    }
    let reuse = spare && inner.ring.back().is_some_and(|old| old.fits(layout));
    if reuse {
        if let Some(slot) = inner.ring.back_mut() {
            slot.rewrite(seq, timestamp_ns, id, numbers, strings);
        }
    } else {
        if spare {
            inner.ring.pop_back();
        }
        if inner.byte_capacity.is_some() {
            let len = inner.ring.len();
            if len == inner.ring.capacity() {
                // Grown in steps of a quarter (not doubled): the slots are counted in the bound.
                let target = grown(inner.ring.capacity());
                inner.ring.reserve_exact(target - len);
            }
        }
        inner.ring.push_back(Stored {
            seq,
            timestamp_ns,
            series: id,
            numbers: Numbers::from_slice(numbers),
            strings: strings.into(),
        });
    }
    let HubInner {
        ring,
        latest,
        byte_capacity,
        value_bytes,
        ..
    } = inner;
    let Some(stored) = ring.back() else {
        unreachable!("the event was just written");
    };
    if byte_capacity.is_some() {
        *value_bytes += stored_bytes(stored);
    }
    match &mut latest[id as usize] {
        Some(l) if l.fits(layout) => l.rewrite(seq, timestamp_ns, id, numbers, strings),
        l => *l = Some(stored.clone()),
    }
    seq
}

/// The slots of a ring bounded in bytes after it grows from `capacity`.
fn grown(capacity: usize) -> usize {
    capacity.saturating_add(capacity / 4).max(16)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gma_core::event::dbl;

    /// Event `t.x`: one double, `v` (also the sampling tests' event).
    pub(crate) fn schema() -> pb::EventSchema {
        pb::EventSchema {
            name: "t.x".into(),
            version: 1,
            fields: vec![dbl("v", "", "")],
            description: String::new(),
        }
    }

    fn ev(src: &str, v: f64) -> EventData {
        EventData {
            name: "t.x".into(),
            source: src.into(),
            timestamp_ns: 1,
            numbers: vec![v],
            strings: vec![],
        }
    }

    #[test]
    fn the_series_of_an_event_share_its_field_list() {
        let hub = Hub::new(1, 10);
        hub.add_schemas(&[schema()]).unwrap();
        hub.publish(&[ev("a", 1.0), ev("b", 2.0)]).1.unwrap();
        let inner = hub.lock();
        assert!(Arc::ptr_eq(&inner.series[0].fields, &inner.series[1].fields));
        assert_eq!(*inner.series[1].fields, *schema().fields);
    }

    #[test]
    fn seqs_increase_and_ring_is_bounded() {
        let hub = Hub::new(1, 3);
        hub.add_schemas(&[schema()]).unwrap();
        let (last, r) = hub.publish(&[ev("a", 1.0), ev("b", 2.0), ev("a", 3.0), ev("a", 4.0)]);
        r.unwrap();
        assert_eq!(last, 4);
        let inner = hub.lock();
        assert_eq!(inner.oldest(), 2);
        assert_eq!(inner.since(3).map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4]);
        // Evicted events' boxes are reused: the values are the new ones.
        let held: Vec<_> = inner.since(2).map(|e| (e.seq, e.series, e.numbers[0])).collect();
        assert_eq!(held, vec![(2, 1, 2.0), (3, 0, 3.0), (4, 0, 4.0)]);
        let latest: Vec<_> = inner.latest().map(|e| (e.series, e.numbers[0])).collect();
        assert_eq!(latest, vec![(0, 4.0), (1, 2.0)]);
    }

    fn bytes_bound(bytes: usize, block_reserve: usize) -> Arc<Hub> {
        let hub = Hub::with_limits(
            1,
            RingLimits {
                events: 1_000_000,
                bytes: Some(bytes),
                block_reserve,
            },
        );
        let mut s = schema();
        s.fields.push(gma_core::event::text("name", ""));
        hub.add_schemas(&[s]).unwrap();
        hub
    }

    fn named(v: f64, name: &str) -> EventData {
        EventData {
            strings: vec![name.into()],
            ..ev("a", v)
        }
    }

    #[test]
    fn a_ring_bounded_in_bytes_keeps_within_them_and_drops_the_oldest() {
        assert_eq!(heap_bytes(0), 0);
        assert_eq!(heap_bytes(8), 32);
        assert_eq!(heap_bytes(24), 32);
        assert_eq!(heap_bytes(25), 48);
        assert_eq!(heap_bytes(104), 112);
        const CAP: usize = 16 * 1024;
        let hub = bytes_bound(CAP, 0);
        let per_event = SLOT_BYTES + numbers_heap_bytes(1) + heap_bytes(24) + heap_bytes(5);
        for i in 0..2_000u32 {
            let (_, r) = hub.publish(&[named(f64::from(i), "eth-0")]);
            r.unwrap();
            let inner = hub.lock();
            assert!(
                inner.ring_bytes() <= CAP,
                "{} > {CAP} after {i}",
                inner.ring_bytes()
            );
            assert_eq!(
                inner.oldest() + inner.len() as u64,
                inner.head(),
                "seqs stay contiguous"
            );
        }
        let inner = hub.lock();
        let kept = inner.len();
        // Filled to within one growth step of the slots and one event.
        assert!(
            kept * per_event > CAP * 3 / 4,
            "{kept} events of {per_event} bytes in {CAP}"
        );
        assert_eq!(inner.head(), 2_001);
        assert_eq!(inner.oldest(), 2_001 - kept as u64);
        let values: Vec<f64> = inner.since(0).map(|e| e.numbers[0]).collect();
        assert_eq!(values.len(), kept);
        assert_eq!(values[kept - 1], 1999.0);
        assert_eq!(inner.since(0).map(stored_bytes).sum::<usize>(), inner.value_bytes);
        // Larger events: fewer of them, still within the bound.
        drop(inner);
        let long = "x".repeat(1000);
        for i in 0..100 {
            hub.publish(&[named(f64::from(i), &long)]).1.unwrap();
            assert!(hub.lock().ring_bytes() <= CAP);
        }
        assert!(hub.lock().len() < kept / 4);
    }

    proptest::proptest! {
        /// Events of three layouts (numbers inline, numbers on the heap, a string), in any
        /// order, through a ring bounded in events or in bytes: the ring holds exactly the last
        /// ones published, in order, whatever slot each was written into, and the counted bytes
        /// are the sum of its events'.
        #[test]
        fn a_ring_holds_the_last_events_published_whatever_their_layouts(
            kinds in proptest::collection::vec(0usize..3, 1..300),
            by_bytes in proptest::bool::ANY,
        ) {
            let limits = RingLimits {
                events: 16,
                bytes: by_bytes.then_some(2048),
                block_reserve: 0,
            };
            let hub = Hub::with_limits(1, limits);
            let field = |n: &str| dbl(n, "", "");
            hub.add_schemas(&[
                pb::EventSchema { name: "t.one".into(), version: 1, fields: vec![field("a")], description: String::new() },
                pb::EventSchema {
                    name: "t.five".into(),
                    version: 1,
                    fields: ["a", "b", "c", "d", "e"].map(field).to_vec(),
                    description: String::new(),
                },
                pb::EventSchema {
                    name: "t.named".into(),
                    version: 1,
                    fields: vec![field("a"), field("b"), gma_core::event::text("name", "")],
                    description: String::new(),
                },
            ])
            .unwrap();
            let mut published = Vec::new();
            for (i, k) in kinds.iter().enumerate() {
                let v = i as f64;
                let (name, numbers, strings) = match k {
                    0 => ("t.one", vec![v], vec![]),
                    1 => ("t.five", vec![v, 1.0, 2.0, 3.0, 4.0], vec![]),
                    _ => ("t.named", vec![v, -1.0], vec!["x".repeat(i % 40)]),
                };
                let e = EventData { name: name.into(), source: "s".into(), timestamp_ns: i as i64, numbers, strings };
                hub.publish(std::slice::from_ref(&e)).1.unwrap();
                published.push(e);
            }
            let inner = hub.lock();
            proptest::prop_assert_eq!(inner.head(), published.len() as u64 + 1);
            let held: Vec<_> = inner.since(0).collect();
            proptest::prop_assert!(!held.is_empty() && held.len() <= 16);
            let tail = &published[published.len() - held.len()..];
            for (i, (e, p)) in held.iter().zip(tail).enumerate() {
                proptest::prop_assert_eq!(e.seq, inner.oldest() + i as u64);
                proptest::prop_assert_eq!(&inner.series[e.series as usize].name, &p.name);
                proptest::prop_assert_eq!(e.timestamp_ns, p.timestamp_ns);
                proptest::prop_assert_eq!(&e.numbers[..], &p.numbers[..]);
                proptest::prop_assert_eq!(&e.strings[..], &p.strings[..]);
            }
            if by_bytes {
                proptest::prop_assert!(inner.ring_bytes() <= 2048);
                proptest::prop_assert_eq!(held.iter().map(|e| stored_bytes(e)).sum::<usize>(), inner.value_bytes);
            }
            for l in inner.latest() {
                let name = &inner.series[l.series as usize].name;
                let last = published.iter().rev().find(|p| &p.name == name).unwrap();
                proptest::prop_assert_eq!(&l.numbers[..], &last.numbers[..]);
                proptest::prop_assert_eq!(&l.strings[..], &last.strings[..]);
            }
        }
    }

    #[test]
    fn a_block_subscription_holds_events_within_the_byte_reserve() {
        const CAP: usize = 8 * 1024;
        let hub = bytes_bound(CAP, 1_000_000);
        hub.pin(7, 1);
        for i in 0..1_000u32 {
            hub.publish(&[named(f64::from(i), "sda")]).1.unwrap();
            assert!(hub.lock().ring_bytes() <= 2 * CAP);
        }
        let inner = hub.lock();
        assert!(inner.ring_bytes() > CAP, "held past the bound for the reader");
        assert!(inner.oldest() > 1, "and dropped past the reserve");
        assert_eq!(inner.room(), 0, "no room for a writer that can wait");
        drop(inner);
        let head = hub.lock().head();
        hub.pin(7, head);
        assert!(hub.lock().room() > 0, "everything read");
        hub.unpin(7);
        assert_eq!(hub.lock().room(), usize::MAX);
    }

    #[test]
    fn a_writer_that_waits_is_held_back_by_a_block_subscription() {
        use std::time::{Duration, Instant};
        let hub = Hub::new(1, 4);
        hub.add_schemas(&[schema()]).unwrap();
        assert_eq!(hub.lock().room(), usize::MAX, "no block subscription: no limit");
        hub.pin(9, 1);
        hub.publish(&[ev("a", 1.0), ev("a", 2.0), ev("a", 3.0)])
            .1
            .unwrap();
        assert_eq!(hub.lock().room(), 1, "3 of 4 unread");
        let soon = Instant::now() + Duration::from_millis(1);
        assert!(hub.publisher_with_room(2, soon).is_none());
        assert!(hub.publisher_with_room(1, soon).is_some());
        // The subscription reads two: a writer waiting for room for 3 goes on.
        let h = hub.clone();
        let waiter = std::thread::spawn(move || {
            h.publisher_with_room(3, Instant::now() + Duration::from_secs(60))
                .is_some()
        });
        hub.pin(9, 3);
        assert!(waiter.join().unwrap());
        assert_eq!(hub.lock().room(), 3);
        hub.unpin(9);
        assert_eq!(hub.lock().room(), usize::MAX);
    }

    #[test]
    fn a_pin_set_under_the_lock_holds_the_ring_for_the_reader() {
        let hub = Hub::with_block_reserve(1, 2, 2);
        hub.add_schemas(&[schema()]).unwrap();
        let a = hub.series("t.x", "a").unwrap();
        hub.lock().pin(3, 1);
        assert_eq!(hub.lock().room(), 2);
        for i in 0..4 {
            hub.publish_series(&a, 1, &[f64::from(i)], &[]).unwrap();
        }
        assert_eq!(hub.lock().oldest(), 1, "capacity plus reserve kept for the pin");
        hub.unpin(3);
    }

    #[test]
    fn a_series_handle_publishes_like_an_event_with_its_name_and_source() {
        // The same events through both paths give the same ring, seqs and latest values.
        let by_name = Hub::new(1, 3);
        let by_handle = Hub::new(1, 3);
        for h in [&by_name, &by_handle] {
            h.add_schemas(&[schema()]).unwrap();
        }
        let a = by_handle.series("t.x", "a").unwrap();
        let b = by_handle.series("t.x", "b").unwrap();
        assert_eq!((a.id(), b.id()), (0, 1));
        assert_eq!(
            by_handle.series("t.x", "a").unwrap(),
            a,
            "resolved once, found again"
        );
        assert_eq!(
            a.layout(),
            Layout {
                doubles: 1,
                strings: 0
            }
        );
        let evs = [ev("a", 1.0), ev("b", 2.0), ev("a", 3.0), ev("a", 4.0)];
        let (last, r) = by_name.publish(&evs);
        r.unwrap();
        {
            let mut p = by_handle.publisher();
            for (e, h) in evs.iter().zip([a, b, a, a]) {
                let seq = p.publish(&h, e.timestamp_ns, &e.numbers, &e.strings).unwrap();
                assert_eq!(seq + 1, p.head());
            }
        }
        assert_eq!(last, 4);
        let view = |h: &Hub| {
            let inner = h.lock();
            let ring: Vec<_> = inner
                .since(0)
                .map(|e| (e.seq, e.series, e.timestamp_ns, e.numbers.to_vec()))
                .collect();
            let latest: Vec<_> = inner
                .latest()
                .map(|e| (e.seq, e.series, e.numbers.to_vec()))
                .collect();
            (inner.head(), inner.oldest(), ring, latest)
        };
        assert_eq!(view(&by_name), view(&by_handle));
        assert_eq!(*by_handle.watch_head().borrow(), 5, "subscriptions told the head");
        assert_eq!(by_handle.publish_series(&b, 7, &[9.0], &[]).unwrap(), 5);
        assert_eq!(
            by_handle.lock().latest_of(1).map(|e| (e.seq, e.numbers[0])),
            Some((5, 9.0))
        );
        assert_eq!(*by_handle.watch_head().borrow(), 6);
    }

    #[test]
    fn a_series_handle_is_checked_against_its_hub_and_layout() {
        let hub = Hub::new(1, 10);
        let other = Hub::new(1, 10);
        for h in [&hub, &other] {
            h.add_schemas(&[schema()]).unwrap();
        }
        assert!(matches!(
            hub.series("t.y", "a"),
            Err(PublishError::UnknownSchema(_))
        ));
        assert!(matches!(
            hub.series("t.x", "bad source\n"),
            Err(PublishError::Name(_))
        ));
        let a = hub.series("t.x", "a").unwrap();
        let theirs = other.series("t.x", "a").unwrap();
        {
            let mut p = hub.publisher();
            assert!(matches!(
                p.publish(&theirs, 1, &[1.0], &[]),
                Err(PublishError::ForeignSeries)
            ));
            let wrong = p.publish(&a, 1, &[1.0, 2.0], &[]);
            assert!(
                matches!(&wrong, Err(PublishError::Layout { name, origin, want_d: 1, got_d: 2, .. }) if name == "t.x" && origin == "a"),
                "{wrong:?}"
            );
            assert_eq!(p.head(), 1, "refused events take no seq");
            assert_eq!(p.publish(&a, 1, &[1.0], &[]).unwrap(), 1);
        }
        assert_eq!(hub.lock().head(), 2);
        // A newer schema version applies to new series: the handle's layout still holds.
        let mut v2 = schema();
        v2.version = 2;
        v2.fields.push(dbl("w", "", ""));
        hub.add_schemas(&[v2]).unwrap();
        assert_eq!(hub.publish_series(&a, 2, &[2.0], &[]).unwrap(), 2);
        let b = hub.series("t.x", "b").unwrap();
        assert_eq!(
            b.layout(),
            Layout {
                doubles: 2,
                strings: 0
            }
        );
        assert_eq!(hub.publish_series(&b, 2, &[1.0, 2.0], &[]).unwrap(), 3);
    }

    #[test]
    fn a_publisher_under_a_byte_bound_and_a_block_pin_keeps_the_bounds() {
        const CAP: usize = 8 * 1024;
        let hub = bytes_bound(CAP, 1_000_000);
        let a = hub.series("t.x", "a").unwrap();
        hub.pin(7, 1);
        let names = ["sda".to_string()];
        for i in 0..1_000u32 {
            hub.publisher().publish(&a, 1, &[f64::from(i)], &names).unwrap();
            assert!(hub.lock().ring_bytes() <= 2 * CAP);
        }
        let inner = hub.lock();
        assert!(inner.ring_bytes() > CAP, "held past the bound for the reader");
        assert!(inner.oldest() > 1, "and dropped past the reserve");
        assert_eq!(inner.since(0).map(stored_bytes).sum::<usize>(), inner.value_bytes);
        assert_eq!(inner.oldest() + inner.len() as u64, inner.head());
    }

    #[test]
    fn bad_events_are_rejected_and_the_rest_published() {
        let hub = Hub::new(1, 10);
        hub.add_schemas(&[schema()]).unwrap();
        let mut wrong = ev("a", 1.0);
        wrong.numbers.push(2.0);
        let mut unknown = ev("a", 1.0);
        unknown.name = "t.y".into();
        let (last, r) = hub.publish(&[wrong, unknown, ev("a", 1.0)]);
        assert!(matches!(r, Err(PublishError::Layout { .. })));
        assert_eq!(last, 1);
        let mut changed = schema();
        changed.fields.push(dbl("w", "", ""));
        assert!(hub.add_schemas(&[changed.clone()]).is_err());
        changed.version = 2;
        hub.add_schemas(&[changed]).unwrap();
    }
}
