//! The archive store: sealed chunks in an append-only chunk log that the store fsyncs itself,
//! a sled tree as their index (plus the stream dictionary and the producers' resume points), a
//! write-ahead log, and queries that aggregate during the scan. Both logs are
//! [`gma_durable::Log`]s: segment files with a CRC per record, torn-tail repair and group
//! commit, behind the [`gma_durable::Fs`] trait (the tests crash them with the simulator).
//!
//! # Layout
//!
//! `DIR/wal/*.wal` holds the write-ahead records, numbered by a sequence that never restarts.
//! One record per [`Store::append`]: the producer and its resume point, the dictionary entries
//! of streams created by this append, then the events in a compact binary form (per event:
//! stream id varint, timestamp as a zigzag varint delta from the previous event's, the doubles
//! as raw little-endian 8 bytes, the strings as varint length + bytes).
//!
//! `DIR/chunks/*.chunks` holds one record per checkpoint ([`codec::encode_checkpoint`]): the first
//! write-ahead seq a replay needs, the oldest chunk segment still needed, the whole stream dictionary, every
//! resume point, and the chunk operations since the previous checkpoint — sealed chunks with
//! their bytes ([`crate::chunk`]) and removed ones. One record is one atomic step.
//!
//! `DIR/sled` is the index, a cache of the chunk log; keys start with a kind byte:
//!
//! - `S` + name + `\0` + source + `\0` + schema version (be u32) → the stream's dictionary entry
//!   (JSON): its id, name, source, version, fields (name, type, unit) and its *sealed position*
//!   `(sealed_wal, sealed_rows)`: every row of this stream in the write-ahead records up to and
//!   including record `sealed_wal` is inside a sealed chunk — of record `sealed_wal` itself only
//!   the first `sealed_rows` rows of the stream (a record can fill a chunk half-way through).
//!   A *stream* is (event name, source, schema version); a *series*, what users query, is
//!   (name, source, field) and may span several schema versions.
//! - `C` + a counter (be u32) + stream id (be u32) + first timestamp (order-preserving be u64:
//!   the i64 with its sign bit flipped) → where the chunk lies in the chunk log and its figures
//!   ([`layout::ChunkMeta`]). The per-stream time index is kept in memory, rebuilt from these at open
//!   without reading a chunk.
//! - `R` + producer id → resume point: epoch (be u64) + next seq (be u64).
//! - `M` meta: `Mformat`, `Mnext_wal`, `Mapplied` (the last chunk-log record the index
//!   reflects) and `Moldest` (the oldest chunk segment still needed).
//!
//! Each stream's newest rows sit in memory in an open [`ChunkWriter`]. Invariant: the open rows
//! of a stream are exactly its rows in the write-ahead records after its sealed position. An
//! open chunk stays open across checkpoints (it is sealed at `chunk_rows`, or when the
//! write-ahead budget drops the segment of its first row), so the write-ahead log is kept from
//! the oldest open row on: `Mnext_wal` is that record, not the last checkpoint's cut.
//!
//! # Durability
//!
//! [`Store::append`] queues its write-ahead record; chunks it fills are sealed into a *pending*
//! set (readable by queries from memory). [`Store::flush`] waits until the write-ahead log is
//! fdatasynced up to the last record (group commit: many appends, one fdatasync); then every
//! row and resume point appended before it survives power loss. Nothing acknowledged depends on
//! sled, whose flush is not an fsync.
//!
//! [`Store::checkpoint`] folds the write-ahead log into chunks, in this order:
//! 1. under the store lock: start a new write-ahead segment when the current one holds a
//!    sixteenth of [`StoreOptions::wal_keep_bytes`] (always when it is 0); note the *cut* = the
//!    next write-ahead seq; the *floor* = the first seq of the oldest segment such that it and
//!    the newer ones hold at most the stream's share of `wal_keep_bytes` (between half and all
//!    of it, by stream id: streams started together then do not all seal at one checkpoint,
//!    whose one record must stay under the log's 256 MiB); seal every open chunk whose first
//!    row lies before its stream's floor; note `C` = the record of the oldest open row left (the cut when none
//!    is open); take the pending chunk operations, the dictionary (with the sealed positions)
//!    and the resume points;
//! 2. wait until the write-ahead records before the cut are durable (the resume points count
//!    them, and the open rows among them are replayed from them);
//! 3. append them as one chunk-log record and fdatasync it (a new chunk segment, and the folder
//!    fsync, when the current one is full);
//! 4. apply them to the sled index (batches of at most 8,192 entries, the record's position
//!    `Mapplied` in a last one of its own; not flushed: the chunk log is the truth);
//! 5. delete the write-ahead segments whose records all lie before `C` (no open row needs
//!    them: every row of theirs is in a chunk of this record or an earlier one) and the chunk
//!    segments before the oldest one that still holds a live chunk (each followed by a folder
//!    fsync).
//!
//! With `wal_keep_bytes` 0 every checkpoint seals every open chunk and `C` is the cut. With a
//! budget, a stream's chunk holds about `wal_keep_bytes / (write-ahead bytes per row of all
//! streams)` of its rows; the price is a longer replay at open (at most `wal_keep_bytes` plus
//! the newest segment).
//!
//! [`Store::open`] reads the index from sled, replays the chunk-log records after `Mapplied`
//! (sled may have lost its last batches, or be gone: it is rebuilt), drops index entries that
//! point before the oldest needed segment, then replays the write-ahead records from `Mnext_wal`
//! on: a stream unknown to the index is created from its entry in the record, the resume points
//! are those of the newest records, and a row goes into its stream's open chunk only when its
//! position (record seq, row number of the stream within the record) lies after the stream's
//! sealed position — which rebuilds exactly the rows that are not in durable chunks: no
//! duplicate, no loss. A torn tail of either log (a crash mid-write, never acknowledged) is cut.
//!
//! If a write fails after the in-memory state was changed, the store refuses further writes
//! (reopen it: the disk is the truth). Queries keep working.
//!
//! # Queries
//!
//! Every series matching the name, source and field, in (name, source, field) order; within a
//! series, samples with `from <= t < to` in timestamp order (equal timestamps are all kept, in
//! storage order). Chunks are selected by their `[min_ts, max_ts]` (kept in memory for every
//! chunk), then the open rows. Chunks whose time ranges overlap (out-of-order timestamps) are
//! merged; the memory a scan holds is one such group of chunks (normally one chunk), plus, for
//! percentiles, the values of one bucket. Results are handed over in [`Points`] pieces of at
//! most `max_points`.
//!
//! With a step, buckets are `[from + k·step, from + (k+1)·step)`; one point per non-empty
//! bucket, at the bucket start; without a step one bucket covers `[from, to)`. NaN ("not
//! available") values are skipped by every aggregate (also `count`), returned by raw queries.
//! Percentiles use the nearest rank (`ceil(q·n)`-th smallest value) computed with hdrhistogram:
//! values are recorded as `round((v - min)·scale)` with `scale = 2000 / (max - min)` of the
//! bucket. Below 2048 a 3-digit histogram counts every integer exactly, so the histogram is
//! 2048 counters (8 KiB, cheap to reset for every bucket of a step query) and a percentile is
//! within 0.025% of the bucket's value range (`max - min`) of the exact value.
//!
//! # Retention
//!
//! [`Store::delete_older_than`] deletes the chunks whose `max_ts` is before the cutoff and
//! rewrites those straddling it without the old rows. Open rows older than the cutoff are first
//! sealed (an early, short chunk) and then cut the same way, so retention is exact at once.
//!
//! # Modules
//!
//! This module holds the store's types and its in-memory state; the code is split by concern:
//! `layout` (sled keys, dictionary entries, the chunk index value), `codec` (write-ahead and
//! chunk-log records), `durability` (append, flush, checkpoint, sealing), `recover` (open:
//! index catch-up and write-ahead replay), `query` and `retention`.

mod codec;
mod durability;
mod index;
mod layout;
mod query;
mod recover;
mod retention;
#[cfg(test)]
pub(crate) mod testkit;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_consumer::stream::ResumePoint;
use gma_core::codec::SeriesInfo;
use gma_durable::{Log, LogError, LogOptions};
use gma_proto::v1 as pb;
use parking_lot::Mutex;

use crate::chunk::{ChunkError, ChunkWriter};
use index::ChunkIndex;
use layout::{encode_meta, stream_key, ChunkMeta, FieldKind, FieldMeta, StreamMeta};

pub use query::{Agg, ArchivedSeries, Points, QuerySpec, QueryStats, MAX_BUCKETS};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// sled or the file system failed.
    #[error("storage: {0}")]
    Storage(String),
    /// Stored data cannot be decoded.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// A bad request (query, aggregate name).
    #[error("{0}")]
    Invalid(String),
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Storage(e.to_string())
    }
}

impl From<LogError> for StoreError {
    fn from(e: LogError) -> Self {
        StoreError::Storage(e.to_string())
    }
}

impl From<ChunkError> for StoreError {
    fn from(e: ChunkError) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

fn corrupt(m: impl Into<String>) -> StoreError {
    StoreError::Corrupt(m.into())
}

fn invalid(m: impl Into<String>) -> StoreError {
    StoreError::Invalid(m.into())
}

/// Tuning of a [`Store`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// A stream's open chunk is sealed when it reaches this many rows.
    pub chunk_rows: usize,
    /// [`Store::needs_checkpoint`] once the write-ahead log holds this many bytes ...
    pub checkpoint_wal_bytes: u64,
    /// ... or this long after the last checkpoint (when the log is not empty).
    pub checkpoint_interval: Duration,
    /// The most bytes of write-ahead segments a checkpoint keeps for open rows (see
    /// Durability): a stream's open chunk stays open across checkpoints while the segment
    /// holding its first row is within this budget (counted from the newest segment); past
    /// it, the checkpoint seals it and the segment goes (each stream gets between half and
    /// all of the budget, by its id, so that they do not all seal at one checkpoint). 0: every
    /// checkpoint seals every open chunk. A checkpoint starts a new segment once the current one holds a sixteenth of it.
    pub wal_keep_bytes: u64,
    /// A chunk-log segment is closed once it holds this many bytes (whole segments are deleted
    /// once retention removed every chunk in them).
    pub chunk_segment_bytes: u64,
    /// The most bytes sled may keep in its page cache (the `C` chunk index and the `S`
    /// dictionary pages read or written). sled's own default is 1 GiB, which an archiver
    /// writing one index entry per sealed chunk fills over hours: its RSS then grows for as long.
    pub index_cache_bytes: u64,
    /// TEST ONLY: the logs acknowledge before fdatasync (the bug the simulator must catch).
    #[cfg(test)]
    pub(crate) ack_before_sync: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            chunk_rows: 1024,
            checkpoint_wal_bytes: 64 << 20,
            checkpoint_interval: Duration::from_secs(300),
            wal_keep_bytes: 512 << 20,
            chunk_segment_bytes: 64 << 20,
            index_cache_bytes: 64 << 20,
            #[cfg(test)]
            ack_before_sync: false,
        }
    }
}

impl StoreOptions {
    fn log(&self, ext: &str, first_seq: u64, read_from: u64) -> LogOptions {
        #[allow(unused_mut)]
        let mut o = LogOptions::new(ext);
        o.first_seq = first_seq.max(1);
        o.read_from = read_from;
        #[cfg(test)]
        {
            o.ack_before_sync = self.ack_before_sync;
        }
        o
    }
}

/// What one [`Store::append`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AppendStats {
    /// Events stored.
    pub events: u64,
    /// Events refused: their values do not fit their stream's schema (a producer changed the
    /// fields without changing the schema version). Logged; their resume point still advances.
    pub rejected: u64,
    /// Values stored (events × fields).
    pub samples: u64,
    /// Streams seen for the first time.
    pub new_streams: u64,
    /// Chunks sealed by this append.
    pub sealed_chunks: u64,
    /// Bytes of the write-ahead record.
    pub wal_bytes: u64,
    /// Events whose stream was found in the store's series cache (keyed on the event's
    /// `Arc<SeriesInfo>`: the events of one series decoded by one stream share it; kept across
    /// appends) ...
    pub series_cache_hits: u64,
    /// ... and events whose stream had to be resolved (the first of each series the store sees
    /// from one decoder, and again after the cache was full).
    pub series_cache_misses: u64,
}

/// Figures of the store.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StoreStats {
    pub streams: u64,
    /// Distinct (name, source, field).
    pub series: u64,
    /// Values held (rows × fields), sealed and open.
    pub samples: u64,
    pub chunks: u64,
    pub open_rows: u64,
    /// Bytes of the sealed chunks.
    pub sealed_bytes: u64,
    /// Bytes of the write-ahead records since the last checkpoint.
    pub wal_bytes: u64,
    /// sled's `size_on_disk` plus the write-ahead segment files.
    pub bytes_on_disk: u64,
    /// `bytes_on_disk / samples` (0 without samples).
    pub bytes_per_sample: f64,
}

struct Stream {
    meta: StreamMeta,
    /// Its `S` key.
    key: Vec<u8>,
    n_doubles: usize,
    n_strings: usize,
    /// Per field, its column among the fields of its kind.
    cols: Vec<usize>,
    /// Sealed chunks by (first timestamp key, counter): the time index ([`index`]).
    chunks: ChunkIndex,
    sealed_rows: u64,
    sealed_bytes: u64,
    /// The time range of the sealed chunks (widened as they come; recomputed by retention).
    sealed_range: Option<(i64, i64)>,
    open: ChunkWriter,
    /// WAL position (record seq, row of this stream within it, from 1) of the newest row
    /// pushed into `open` (or the sealed position).
    head: (u64, u32),
    /// The write-ahead record of the first row in `open` (meaningless while it is empty): a
    /// checkpoint keeps the log from there on (or seals the chunk).
    open_from: u64,
}

impl Stream {
    fn new(meta: StreamMeta) -> Stream {
        let mut cols = Vec::with_capacity(meta.fields.len());
        let (mut nd, mut ns) = (0, 0);
        for f in &meta.fields {
            match f.kind {
                FieldKind::Double => {
                    cols.push(nd);
                    nd += 1;
                }
                FieldKind::String => {
                    cols.push(ns);
                    ns += 1;
                }
            }
        }
        Stream {
            key: stream_key(&meta.name, &meta.source, meta.schema_version),
            head: (meta.sealed_wal, meta.sealed_rows),
            meta,
            n_doubles: nd,
            n_strings: ns,
            cols,
            chunks: ChunkIndex::default(),
            sealed_rows: 0,
            sealed_bytes: 0,
            sealed_range: None,
            open: ChunkWriter::new(nd, ns),
            open_from: 0,
        }
    }

    fn values(&self) -> u64 {
        (self.n_doubles + self.n_strings) as u64
    }

    fn rows(&self) -> u64 {
        self.sealed_rows + self.open.rows() as u64
    }

    fn time_range(&self) -> Option<(i64, i64)> {
        match (self.sealed_range, self.open.min_ts(), self.open.max_ts()) {
            (r, Some(lo), Some(hi)) => Some(widen(r, lo, hi)),
            (r, _, _) => r,
        }
    }

    fn add_chunk(&mut self, k: (u64, u32), m: ChunkMeta) {
        self.sealed_rows += m.rows as u64;
        self.sealed_bytes += m.bytes as u64;
        self.sealed_range = Some(widen(self.sealed_range, m.min_ts, m.max_ts));
        self.chunks.insert(k, m);
    }

    /// Removes the chunks of `keys`; returns those it held.
    fn remove_chunks(&mut self, keys: &[(u64, u32)]) -> Vec<((u64, u32), ChunkMeta)> {
        let gone = self.chunks.remove_all(keys);
        for (_, m) in &gone {
            self.sealed_rows -= m.rows as u64;
            self.sealed_bytes -= m.bytes as u64;
        }
        if !gone.is_empty() {
            self.sealed_range = self
                .chunks
                .iter()
                .fold(None, |r, (_, m)| Some(widen(r, m.min_ts, m.max_ts)));
        }
        gone
    }
}

/// `r` widened to cover `[lo, hi]`.
fn widen(r: Option<(i64, i64)>, lo: i64, hi: i64) -> (i64, i64) {
    match r {
        None => (lo, hi),
        Some((a, b)) => (a.min(lo), b.max(hi)),
    }
}

struct Inner {
    streams: BTreeMap<u32, Stream>,
    by_key: HashMap<(String, String, u32), u32>,
    /// The series appends resolved, across appends, keyed on the address of the event's
    /// `Arc<SeriesInfo>` (the decoder shares one per series of a stream; the entry holds a
    /// clone, so the address is not reused while cached). Streams are never removed, so an
    /// entry stays true; at most [`SERIES_CACHE_CAP`] entries (then it starts afresh).
    series_cache: SeriesCache,
    next_sid: u32,
    next_wal: u64,
    next_ctr: u32,
    wal_bytes: u64,
    resume: HashMap<String, ResumePoint>,
    /// Live located chunks per chunk-log segment (segments without any may go once no
    /// older one is needed): kept as chunks are located and removed, instead of a walk over
    /// every chunk at each checkpoint.
    segs: BTreeMap<u64, u64>,
    pending: Pending,
    /// Write-ahead records before this one are not needed any more (the last checkpoint's
    /// `C`: the first record of an open row, or the checkpoint's cut when none is open): the
    /// first record a replay reads.
    covered: u64,
    /// Bytes of each write-ahead segment (by its first seq) still on disk: what the
    /// `wal_keep_bytes` budget counts.
    wal_segs: BTreeMap<u64, u64>,
    last_checkpoint: Instant,
    /// Set when a write failed after the in-memory state changed.
    poisoned: Option<String>,
}

impl Inner {
    fn check(&self) -> Result<(), StoreError> {
        match &self.poisoned {
            Some(m) => Err(StoreError::Storage(format!(
                "the store refuses writes after an earlier failure ({m}); reopen it"
            ))),
            None => Ok(()),
        }
    }

    /// A located chunk of segment `seg` came (`live`) or went.
    fn count_seg(&mut self, seg: u64, live: bool) {
        let n = self.segs.entry(seg).or_insert(0);
        if live {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.segs.remove(&seg);
            }
        }
    }

    /// The first chunk-log segment a live chunk lies in, or `tail` when none is older.
    fn oldest_seg(&self, tail: u64) -> u64 {
        self.segs.keys().next().map_or(tail, |&s| s.min(tail))
    }

    fn poison(&mut self, e: StoreError) -> StoreError {
        tracing::error!(error = %e, "archive store write failed; refusing further writes");
        self.poisoned = Some(e.to_string());
        e
    }

    /// The stream of `s`, created when new (its `S` entry pending, and also pushed to `defs`
    /// for the write-ahead record); `None` when the stored stream of that (name, source,
    /// version) has other fields.
    fn resolve(
        &mut self,
        s: &SeriesInfo,
        defs: &mut Vec<Vec<u8>>,
        stats: &mut AppendStats,
    ) -> Result<Option<u32>, StoreError> {
        let fields: Vec<FieldMeta> = s
            .fields
            .iter()
            .map(|f| FieldMeta {
                name: f.name.clone(),
                kind: if f.r#type() == pb::FieldType::String {
                    FieldKind::String
                } else {
                    FieldKind::Double
                },
                unit: f.unit.clone(),
            })
            .collect();
        let key = (s.name.clone(), s.source.clone(), s.schema_version);
        if let Some(&sid) = self.by_key.get(&key) {
            let same = self.streams.get(&sid).is_some_and(|st| {
                st.meta.fields.len() == fields.len()
                    && st
                        .meta
                        .fields
                        .iter()
                        .zip(&fields)
                        .all(|(a, b)| a.name == b.name && a.kind == b.kind)
            });
            if !same {
                tracing::warn!(
                    name = %s.name, source = %s.source, version = s.schema_version,
                    "events whose fields differ from the stored schema of the same version are refused"
                );
            }
            return Ok(same.then_some(sid));
        }
        let sid = self.next_sid;
        self.next_sid = sid
            .checked_add(1)
            .ok_or_else(|| StoreError::Storage("too many streams".into()))?;
        let meta = StreamMeta {
            id: sid,
            name: s.name.clone(),
            source: s.source.clone(),
            schema_version: s.schema_version,
            fields,
            sealed_wal: 0,
            sealed_rows: 0,
        };
        let st = Stream::new(meta);
        defs.push(encode_meta(&st.meta)?);
        self.streams.insert(sid, st);
        self.by_key.insert(key, sid);
        stats.new_streams += 1;
        Ok(Some(sid))
    }
}

/// Most entries of the append's series cache (one per series of every followed stream; about
/// 60 bytes each plus the `SeriesInfo` it keeps alive): past it, the cache starts afresh.
pub const SERIES_CACHE_CAP: usize = 65_536;

/// A cached resolution: the series (held so its address stays unique), and its stream's id with
/// its doubles and strings per row, or `None` when the stored stream has other fields.
type SeriesCache = foldhash::HashMap<usize, (Arc<SeriesInfo>, Option<(u32, usize, usize)>)>;

type ChunkKey = [u8; 17];
/// A pending chunk's bytes; `None` when it is removed.
type PendingChunk = Option<Arc<[u8]>>;

/// Chunk operations not yet in the chunk log (see Durability), readable meanwhile.
#[derive(Default)]
struct Pending {
    /// Since the last checkpoint: put (bytes) or removed (`None`), the last one per key.
    ops: HashMap<ChunkKey, PendingChunk>,
    /// What the running checkpoint took, until the index has it.
    in_flight: HashMap<ChunkKey, PendingChunk>,
}

impl Pending {
    fn put_chunk(&mut self, k: ChunkKey, v: Vec<u8>) {
        self.ops.insert(k, Some(v.into()));
    }

    fn remove_chunk(&mut self, k: ChunkKey) {
        self.ops.insert(k, None);
    }

    /// `Some(bytes)`, `Some(None)` when removed, `None` when not pending.
    fn get(&self, k: &ChunkKey) -> Option<PendingChunk> {
        self.ops.get(k).or_else(|| self.in_flight.get(k)).cloned()
    }
}

/// The archive store. `Send + Sync`; writes are serialized by an internal lock, queries read
/// sled without holding it.
pub struct Store {
    db: sled::Db,
    /// The write-ahead log.
    wal: Log,
    /// The chunk log.
    chunks: Log,
    opts: StoreOptions,
    inner: Mutex<Inner>,
    /// One checkpoint at a time.
    flushing: tokio::sync::Mutex<()>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl Store {
    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    /// The stored resume point of every producer.
    pub fn resume_points(&self) -> HashMap<String, ResumePoint> {
        self.inner.lock().resume.clone()
    }

    /// Figures of the store.
    pub fn stats(&self) -> StoreStats {
        let mut s = {
            // Under the lock appends need: one entry per (name, source), not per field (a
            // set of every series took seconds at 480,000 series and stalled ingest).
            let g = self.inner.lock();
            let mut by_name: HashMap<(&String, &String), Vec<&StreamMeta>> = HashMap::new();
            let mut s = StoreStats {
                streams: g.streams.len() as u64,
                wal_bytes: g.wal_bytes,
                ..StoreStats::default()
            };
            for st in g.streams.values() {
                s.samples += st.rows() * st.values();
                s.chunks += st.chunks.len() as u64;
                s.open_rows += st.open.rows() as u64;
                s.sealed_bytes += st.sealed_bytes;
                by_name
                    .entry((&st.meta.name, &st.meta.source))
                    .or_default()
                    .push(&st.meta);
            }
            s.series = by_name
                .values()
                .map(|versions| match versions.as_slice() {
                    [one] => one.fields.len(),
                    many => many
                        .iter()
                        .flat_map(|m| m.fields.iter().map(|f| &f.name))
                        .collect::<HashSet<_>>()
                        .len(),
                } as u64)
                .sum();
            s
        };
        s.bytes_on_disk =
            self.db.size_on_disk().unwrap_or(0) + self.wal.bytes_on_disk() + self.chunks.bytes_on_disk();
        if s.samples > 0 {
            s.bytes_per_sample = s.bytes_on_disk as f64 / s.samples as f64;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use gma_core::event::dbl;
    use gma_core::pattern::Pattern;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::store::testkit::*;

    #[test]
    fn series_are_counted_once_across_schema_versions() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(16)).unwrap();
        // host.cpu of a: version 1 (user, state, sys) and version 2 (user, idle): 4 series;
        // host.cpu of b: version 1 only: 3 series.
        let v2 = series(
            "host.cpu",
            "a",
            2,
            vec![dbl("user", "%", ""), dbl("idle", "%", "")],
        );
        let evs = vec![
            ev(&cpu("a"), 1, SEC, &[1.0, 2.0], &["x"]),
            ev(&v2, 2, 2 * SEC, &[3.0, 4.0], &[]),
            ev(&cpu("b"), 3, 3 * SEC, &[5.0, 6.0], &["y"]),
        ];
        store.append("p", rp(1, 4), &evs).unwrap();
        let st = store.stats();
        assert_eq!((st.streams, st.series), (3, 7));
    }

    /// The fixed parts of a stream in memory (docs/archiver.md, "Memory, term by term"):
    /// its entry in the stream map, inline (the open chunk's heap is ChunkWriter::heap_bytes).
    #[test]
    fn a_streams_fixed_memory() {
        let inline = std::mem::size_of::<Stream>();
        println!(
            "Stream {inline} B inline, ChunkWriter {} B, StreamMeta {} B, ChunkMeta {} B",
            std::mem::size_of::<ChunkWriter>(),
            std::mem::size_of::<StreamMeta>(),
            std::mem::size_of::<ChunkMeta>()
        );
        assert!(inline <= 640, "{inline}");
    }

    #[tokio::test]
    async fn stats_are_sensible() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(64)).unwrap();
        fill(&store, 500, 50, 0);
        store.checkpoint().await.unwrap();
        let s = store.stats();
        assert_eq!(s.samples, 500 * 2 * 3);
        assert!(s.sealed_bytes > 0 && s.bytes_on_disk > 0);
        assert!((s.bytes_per_sample - s.bytes_on_disk as f64 / s.samples as f64).abs() < 1e-9);
        assert_eq!(s.wal_bytes, 0);
    }

    /// `cargo test --release -p gma-archiver --lib store -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn perf() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut rng = StdRng::seed_from_u64(1);

        // 1000 streams × 3 doubles, batches of 1000 events, a flush per batch.
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let streams: Vec<_> = (0..1000)
            .map(|i| {
                series(
                    "host.load",
                    &format!("host{i:04}"),
                    1,
                    vec![dbl("load1", "", ""), dbl("load5", "", ""), dbl("load15", "", "")],
                )
            })
            .collect();
        let mut level: Vec<f64> = (0..1000).map(|_| rng.random_range(0.0..4.0)).collect();
        let rows = 1_000_000 / 3 + 1;
        let batches = rows / 1000;
        let (mut appending, mut flushing) = (Duration::ZERO, Duration::ZERO);
        let mut samples = 0u64;
        for b in 0..batches {
            let events: Vec<_> = (0..1000)
                .map(|i| {
                    level[i] = (level[i] + rng.random_range(-0.05..0.05)).max(0.0);
                    let l = (level[i] * 100.0).round() / 100.0;
                    let ts = 1_700_000_000 * SEC + b as i64 * 10 * SEC + rng.random_range(0..1_000_000);
                    ev(
                        &streams[i],
                        b as u64 + 1,
                        ts,
                        &[l, (l * 0.9 * 100.0).round() / 100.0, 1.0],
                        &[],
                    )
                })
                .collect();
            let t = Instant::now();
            samples += store
                .append(&format!("p{}", b % 4), rp(1, b as u64), &events)
                .unwrap()
                .samples;
            appending += t.elapsed();
            let t = Instant::now();
            rt.block_on(store.flush()).unwrap();
            flushing += t.elapsed();
        }
        let total = appending + flushing;
        println!(
            "append: {samples} samples in {:.2?} ({:.0} samples/s; append {:.2?}, flush {:.2?} over {batches} flushes)",
            total,
            samples as f64 / total.as_secs_f64(),
            appending,
            flushing
        );
        let before = store.stats();
        let t = Instant::now();
        rt.block_on(store.checkpoint()).unwrap();
        let s = store.stats();
        println!(
            "before checkpoint: wal {} B, on disk {} B; checkpoint {:.2?}; after: chunks {}, sealed {} B = {:.2} B/sample, \
             on disk {} B = {:.2} B/sample",
            before.wal_bytes,
            before.bytes_on_disk,
            t.elapsed(),
            s.chunks,
            s.sealed_bytes,
            s.sealed_bytes as f64 / s.samples as f64,
            s.bytes_on_disk,
            s.bytes_per_sample
        );
        drop(store);
        let t = Instant::now();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let s = store.stats();
        println!(
            "reopen {:.2?}: on disk {} B = {:.2} B/sample",
            t.elapsed(),
            s.bytes_on_disk,
            s.bytes_per_sample
        );
        drop(store);

        // One series of 1,000,000 samples (1 s apart), queried raw and p99 per minute.
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let one = series("host.temp", "h", 1, vec![dbl("celsius", "C", "")]);
        let mut x = 40.0f64;
        let t0 = 1_700_000_000 * SEC;
        let t = Instant::now();
        for b in 0..1000 {
            let events: Vec<_> = (0..1000)
                .map(|i| {
                    x = (x + rng.random_range(-0.1..0.1)).clamp(20.0, 90.0);
                    let n = b * 1000 + i;
                    ev(
                        &one,
                        n as u64 + 1,
                        t0 + n as i64 * SEC,
                        &[(x * 10.0).round() / 10.0],
                        &[],
                    )
                })
                .collect();
            store.append("p", rp(1, b as u64), &events).unwrap();
            rt.block_on(store.flush()).unwrap();
        }
        println!(
            "one series: 1000000 samples appended+flushed in {:.2?}",
            t.elapsed()
        );
        rt.block_on(store.checkpoint()).unwrap();
        let s = store.stats();
        println!(
            "one series after checkpoint: chunks {}, sealed {:.2} B/sample, on disk {:.2} B/sample",
            s.chunks,
            s.sealed_bytes as f64 / s.samples as f64,
            s.bytes_per_sample
        );
        for (label, step, agg) in [
            ("raw", None, Agg::Raw),
            ("step 60 s p99", Some(60 * SEC), Agg::P99),
            ("step 60 s mean", Some(60 * SEC), Agg::Mean),
            ("p99 no step", None, Agg::P99),
        ] {
            let q = QuerySpec {
                name: Pattern::event("host.temp").unwrap(),
                names: None,
                source: None,
                field: Some("celsius".into()),
                from_ns: t0,
                to_ns: t0 + 1_000_000 * SEC,
                step_ns: step,
                agg,
                max_points: 10_000,
            };
            let t = Instant::now();
            let mut points = 0;
            let st = store
                .query(&q, &mut |p| {
                    points += p.timestamps.len();
                    true
                })
                .unwrap();
            println!(
                "query {label}: {points} points from {} rows ({} chunks) in {:.2?}",
                st.rows_scanned,
                st.chunks_read,
                t.elapsed()
            );
        }
    }
}
