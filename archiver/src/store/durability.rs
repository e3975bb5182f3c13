//! Appends, group-commit flushes and checkpoints (see Durability in the module documentation).

use std::sync::Arc;
use std::time::Instant;

use gma_consumer::stream::ResumePoint;
use gma_core::codec::OwnedEvent;

use super::codec::{encode_checkpoint, encode_record};
use super::layout::*;
use super::{
    corrupt, AppendStats, ChunkKey, Inner, Pending, PendingChunk, Store, StoreError, Stream, SERIES_CACHE_CAP,
};
use crate::chunk::ChunkWriter;

impl Store {
    /// Appends one producer batch: its rows go to the open chunks, its write-ahead record
    /// (with the resume point and new dictionary entries) is queued, and the chunks that
    /// became full are sealed into the pending set. Not durable until [`Store::flush`].
    pub fn append(
        &self,
        producer: &str,
        resume: ResumePoint,
        events: &[OwnedEvent],
    ) -> Result<AppendStats, StoreError> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.check()?;
        let mut defs = Vec::new();
        let mut stats = AppendStats::default();

        // Resolve (and create) the streams, refuse events that do not fit them.
        let mut accepted: Vec<(u32, &OwnedEvent)> = Vec::with_capacity(events.len());
        for e in events {
            let ptr = Arc::as_ptr(&e.series) as usize;
            let found = match inner.series_cache.get(&ptr) {
                Some((_, s)) => {
                    stats.series_cache_hits += 1;
                    *s
                }
                None => {
                    stats.series_cache_misses += 1;
                    let sid = match inner.resolve(&e.series, &mut defs, &mut stats) {
                        Ok(s) => s,
                        Err(err) => return Err(inner.poison(err)),
                    };
                    let s = sid.and_then(|sid| {
                        inner
                            .streams
                            .get(&sid)
                            .map(|st| (sid, st.n_doubles, st.n_strings))
                    });
                    if inner.series_cache.len() >= SERIES_CACHE_CAP {
                        inner.series_cache.clear();
                    }
                    inner.series_cache.insert(ptr, (e.series.clone(), s));
                    s
                }
            };
            match found {
                Some((sid, nd, ns)) if e.numbers.len() == nd && e.strings.len() == ns => {
                    accepted.push((sid, e))
                }
                _ => stats.rejected += 1,
            }
        }
        if stats.rejected > 0 {
            tracing::warn!(
                producer,
                rejected = stats.rejected,
                "events not matching their schema were not stored"
            );
        }

        let rec = encode_record(producer, resume, &defs, &accepted);
        let (seq, segment) = match self.wal.append(&rec) {
            Ok(p) => (p.seq, p.segment),
            Err(e) => return Err(inner.poison(e.into())),
        };
        if seq != inner.next_wal {
            return Err(inner.poison(corrupt(format!(
                "write-ahead record numbered {seq}, expected {}",
                inner.next_wal
            ))));
        }
        stats.wal_bytes = (gma_durable::log::HEADER + rec.len()) as u64;
        inner.next_wal += 1;
        inner.wal_bytes += stats.wal_bytes;
        *inner.wal_segs.entry(segment).or_insert(0) += stats.wal_bytes;
        let chunk_rows = self.opts.chunk_rows;
        let Inner {
            streams,
            next_ctr,
            pending,
            ..
        } = inner;
        let mut strs: Vec<&str> = Vec::new();
        let mut failed = None;
        for (sid, e) in &accepted {
            let Some(st) = streams.get_mut(sid) else {
                failed = Some(corrupt(format!("stream {sid} vanished")));
                break;
            };
            let j = if st.head.0 == seq { st.head.1 + 1 } else { 1 };
            st.head = (seq, j);
            if st.open.is_empty() {
                st.open_from = seq;
            }
            strs.clear();
            strs.extend(e.strings.iter().map(String::as_str));
            if let Err(err) = st.open.push(e.timestamp_ns, &e.numbers, &strs) {
                failed = Some(err.into());
                break;
            }
            stats.events += 1;
            stats.samples += st.values();
            if st.open.rows() >= chunk_rows {
                match seal(st, pending, next_ctr) {
                    Ok(_) => stats.sealed_chunks += 1,
                    Err(err) => {
                        failed = Some(err);
                        break;
                    }
                }
            }
        }
        if let Some(err) = failed {
            return Err(inner.poison(err));
        }
        inner.resume.insert(producer.to_string(), resume);
        if stats.sealed_chunks > 0 {
            metrics::counter!(crate::telemetry::CHUNKS_SEALED).increment(stats.sealed_chunks);
        }
        metrics::counter!(crate::telemetry::SERIES_CACHE_HITS).increment(stats.series_cache_hits);
        metrics::counter!(crate::telemetry::SERIES_CACHE_MISSES).increment(stats.series_cache_misses);
        Ok(stats)
    }

    /// Makes everything appended so far durable: waits until the write-ahead log is
    /// fdatasynced up to the last record appended. Group commit: append several batches, then
    /// flush once (and concurrent flushes share the log's fdatasyncs).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let last = {
            let g = self.inner.lock();
            g.check()?;
            g.next_wal - 1
        };
        match self.wal.sync(last).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.inner.lock().poison(e.into())),
        }
    }

    /// True when the write-ahead log passed `checkpoint_wal_bytes`, or is not empty and
    /// `checkpoint_interval` passed since the last checkpoint.
    pub fn needs_checkpoint(&self) -> bool {
        let g = self.inner.lock();
        g.wal_bytes >= self.opts.checkpoint_wal_bytes
            || (g.wal_bytes > 0 && g.last_checkpoint.elapsed() >= self.opts.checkpoint_interval)
    }

    /// Folds the write-ahead log into the chunk log: seals every open chunk, writes the chunk
    /// operations, the dictionary and the resume points as one chunk-log record, fdatasyncs it,
    /// updates the index, then deletes the write-ahead segments it covers and the chunk
    /// segments no live chunk needs (see Durability for the order).
    pub async fn checkpoint(&self) -> Result<(), StoreError> {
        let _turn = self.flushing.lock().await;
        let r = self.checkpoint_inner(true).await;
        if let Err(e) = &r {
            self.inner.lock().poison(e.clone());
        }
        r
    }

    /// Makes the chunk operations so far durable (chunks sealed when full, retention's
    /// removals and rewrites) without sealing the open chunks or dropping write-ahead
    /// segments: a checkpoint record whose `C` stays the previous one.
    pub async fn commit(&self) -> Result<(), StoreError> {
        let _turn = self.flushing.lock().await;
        let r = self.checkpoint_inner(false).await;
        if let Err(e) = &r {
            self.inner.lock().poison(e.clone());
        }
        r
    }

    async fn checkpoint_inner(&self, seal_all: bool) -> Result<(), StoreError> {
        // 1. Under the lock: seal what the write-ahead budget drops, cut the log, take what
        //    goes out. `cut`: the first record after this checkpoint; `c`: the first record a
        //    replay needs (the oldest open row's, `cut` when none is open).
        let (cut, c, ops, dict, resume) = {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            inner.check()?;
            if !seal_all && inner.pending.ops.is_empty() {
                return Ok(());
            }
            let Inner {
                streams,
                next_ctr,
                pending,
                wal_segs,
                ..
            } = inner;
            let mut sealed = 0u64;
            let (cut, c) = if seal_all {
                let keep = self.opts.wal_keep_bytes;
                if keep == 0 || self.wal.tail_len() >= keep / 16 {
                    self.wal.rotate()?;
                }
                let cut = self.wal.next_seq();
                // Each stream gets a budget between half and all of `keep` (by its id), so
                // streams that started together do not all seal at one checkpoint: one
                // checkpoint record holding every stream's long chunk passed the log's record
                // limit (256 MiB) at 10,000 hosts and stopped the archiver.
                let tail = self.wal.tail_segment();
                let floors: Vec<u64> = (0..KEEP_SHARES)
                    .map(|k| keep_floor(wal_segs, tail, stream_keep(keep, k)))
                    .collect();
                for st in streams.values_mut() {
                    let floor = floors[st.meta.id as usize % KEEP_SHARES as usize];
                    if !st.open.is_empty() && st.open_from < floor && seal(st, pending, next_ctr)? {
                        sealed += 1;
                    }
                }
                let c = streams
                    .values()
                    .filter(|st| !st.open.is_empty())
                    .map(|st| st.open_from)
                    .fold(cut, u64::min);
                inner.covered = c;
                (cut, c)
            } else {
                (self.wal.next_seq(), inner.covered)
            };
            metrics::counter!(crate::telemetry::CHUNKS_SEALED).increment(sealed);
            let ops = std::mem::take(&mut inner.pending.ops);
            inner.pending.in_flight = ops.clone();
            let dict: Vec<StreamMeta> = inner.streams.values().map(|st| st.meta.clone()).collect();
            let resume: Vec<(String, ResumePoint)> =
                inner.resume.iter().map(|(p, r)| (p.clone(), *r)).collect();
            tracing::debug!(
                sealed,
                chunk_ops = ops.len(),
                wal_bytes = inner.wal_bytes,
                replay_from = c,
                "checkpoint"
            );
            if seal_all {
                inner.wal_bytes = 0;
                inner.last_checkpoint = Instant::now();
            }
            (cut, c, ops, dict, resume)
        };
        // 2. The write-ahead records before the cut are durable: the chunks come from them, and
        //    the record's resume points and sealed positions count them (open rows among them
        //    are replayed from the log, which must hold them).
        self.wal.sync(cut - 1).await?;
        // 3. One chunk-log record, fdatasynced. `oldest`: the first segment a live chunk (or
        //    this record) needs once this record is applied.
        if self.chunks.tail_len() >= self.opts.chunk_segment_bytes {
            self.chunks.rotate()?;
        }
        let tail = self.chunks.tail_segment();
        let oldest = self.inner.lock().oldest_seg(tail);
        let mut ops: Vec<(ChunkKey, PendingChunk)> = ops.into_iter().collect();
        ops.sort_by_key(|o| o.0);
        // Each stream entry is encoded once, for the record and for sled (each copy dropped
        // as soon as it is encoded).
        let mut keys = Vec::with_capacity(dict.len());
        let mut entries = Vec::with_capacity(dict.len());
        for m in dict {
            keys.push(stream_key(&m.name, &m.source, m.schema_version));
            entries.push(encode_meta(&m)?);
        }
        let (payload, offsets) = encode_checkpoint(c, oldest, &entries, &resume, &ops);
        let pos = self.chunks.append(&payload)?;
        drop(payload);
        self.chunks.sync(pos.seq).await?;
        // 4. The index: in memory (chunks now read from the file) and in sled.
        let mut index: Vec<(ChunkKey, Option<[u8; 40]>)> = Vec::with_capacity(ops.len());
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            for ((k, op), off) in ops.iter().zip(&offsets) {
                let Some((sid, tk, ctr)) = parse_chunk_key(k) else {
                    continue;
                };
                match (op, off) {
                    (Some(_), Some(off)) => {
                        let loc = (pos.segment, pos.offset + *off);
                        // Still live (not removed again since)? Then it lives in the file now.
                        let live = inner
                            .streams
                            .get_mut(&sid)
                            .is_some_and(|st| st.chunks.locate((tk, ctr), loc));
                        if live {
                            inner.count_seg(loc.0, true);
                        }
                        let bytes = op.as_deref().unwrap_or_default();
                        let m = ChunkMeta {
                            loc: Some(loc),
                            ..figures(bytes)?
                        };
                        index.push((*k, Some(m.encode().unwrap_or([0; 40]))));
                    }
                    _ => index.push((*k, None)),
                }
            }
            inner.pending.in_flight.clear();
        }
        drop(ops);
        // In batches of at most SLED_BATCH_ENTRIES (sled applying one batch of every entry
        // took about 350 MB at 40,000 streams: node splits, page fragments, buffers), the
        // record's position in a last batch of its own: a crash in between leaves sled behind
        // the record, which the next open applies again (its entries replace what they name).
        let mut batch = SledBatches::new(&self.db);
        for (k, v) in index {
            match v {
                Some(v) => batch.insert(&k[..], &v[..])?,
                None => batch.remove(&k[..])?,
            }
        }
        for (k, v) in keys.into_iter().zip(entries) {
            batch.insert(&k, &v)?;
        }
        for (p, rp) in &resume {
            batch.insert(&resume_key(p), &resume_value(*rp))?;
        }
        batch.finish()?;
        batch.insert(META_NEXT_WAL, &c.to_be_bytes())?;
        batch.insert(META_OLDEST, &oldest.to_be_bytes())?;
        batch.insert(META_APPLIED, &pos.seq.to_be_bytes())?;
        batch.finish()?;
        // 5. What no open row needs any more goes.
        let dropped = self.wal.remove_before(c).await?;
        if !dropped.is_empty() {
            let mut g = self.inner.lock();
            for s in &dropped {
                g.wal_segs.remove(s);
            }
        }
        let gone = self.chunks.remove_before(oldest).await?;
        if !gone.is_empty() {
            tracing::info!(
                segments = gone.len(),
                "chunk segments without a live chunk removed"
            );
        }
        Ok(())
    }
}

/// Streams are spread over this many shares of the write-ahead budget.
const KEEP_SHARES: u64 = 8;

/// The budget of the streams of share `k` (< [`KEEP_SHARES`]): `keep × (S + k) / (2S)`, from
/// half of `keep` to just under all of it.
pub(super) fn stream_keep(keep: u64, k: u64) -> u64 {
    (keep / (2 * KEEP_SHARES)).saturating_mul(KEEP_SHARES + k)
}

/// The first write-ahead record a checkpoint may keep for open rows: the first seq of the oldest
/// segment such that it and every newer one (`tail`, the current, included) hold at most
/// `keep` bytes; `tail` when even the next older one does not fit. Open chunks whose first row
/// lies before it are sealed, and the segments before it go.
pub(super) fn keep_floor(segs: &std::collections::BTreeMap<u64, u64>, tail: u64, keep: u64) -> u64 {
    let mut kept = segs.get(&tail).copied().unwrap_or(0);
    let mut floor = tail;
    for (&first, &bytes) in segs.range(..tail).rev() {
        kept += bytes;
        if kept > keep {
            break;
        }
        floor = first;
    }
    floor
}

/// Most entries of one sled batch a checkpoint applies.
pub(super) const SLED_BATCH_ENTRIES: usize = 8192;

/// sled batches of at most [`SLED_BATCH_ENTRIES`], applied as they fill, in order.
struct SledBatches<'a> {
    db: &'a sled::Db,
    batch: sled::Batch,
    n: usize,
}

impl<'a> SledBatches<'a> {
    fn new(db: &'a sled::Db) -> Self {
        SledBatches {
            db,
            batch: sled::Batch::default(),
            n: 0,
        }
    }

    fn insert(&mut self, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        self.batch.insert(k, v);
        self.counted()
    }

    fn remove(&mut self, k: &[u8]) -> Result<(), StoreError> {
        self.batch.remove(k);
        self.counted()
    }

    fn counted(&mut self) -> Result<(), StoreError> {
        self.n += 1;
        if self.n >= SLED_BATCH_ENTRIES {
            self.finish()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), StoreError> {
        if self.n > 0 {
            self.db.apply_batch(std::mem::take(&mut self.batch))?;
            self.n = 0;
        }
        Ok(())
    }
}

/// A counter for a new chunk of `st` starting at `tk`, unused by its chunks and by `taken`.
/// Counters only grow (an open starts above every stored one), so the check is cheap until
/// they wrap around.
pub(super) fn free_counter(st: &Stream, tk: u64, next: &mut u32, taken: &[(u64, u32)]) -> u32 {
    loop {
        let c = *next;
        *next = next.wrapping_add(1);
        if !st.chunks.contains((tk, c)) && !taken.contains(&(tk, c)) {
            return c;
        }
    }
}

/// Seals the open chunk of `st` into the pending set and advances the stream's sealed position
/// (both durable together at the next checkpoint). Returns false when there was nothing to
/// seal.
pub(super) fn seal(st: &mut Stream, pending: &mut Pending, next_ctr: &mut u32) -> Result<bool, StoreError> {
    if st.open.is_empty() {
        return Ok(false);
    }
    let (Some(first), Some(lo), Some(hi)) = (st.open.first_ts(), st.open.min_ts(), st.open.max_ts()) else {
        return Err(corrupt("open chunk with rows but no timestamps"));
    };
    let bytes = st.open.encode();
    let tk = ts_key(first);
    let ctr = free_counter(st, tk, next_ctr, &[]);
    let m = ChunkMeta {
        min_ts: lo,
        max_ts: hi,
        rows: st.open.rows() as u32,
        bytes: bytes.len() as u32,
        loc: None,
    };
    pending.put_chunk(chunk_key(st.meta.id, tk, ctr), bytes);
    st.meta.sealed_wal = st.head.0;
    st.meta.sealed_rows = st.head.1;
    st.add_chunk((tk, ctr), m);
    st.open = ChunkWriter::new(st.n_doubles, st.n_strings);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gma_core::codec::SeriesInfo;
    use std::time::Duration;

    use super::super::{Agg, StoreOptions};

    use super::*;
    use crate::store::testkit::*;

    #[test]
    fn chunks_seal_at_chunk_rows_and_queries_span_sealed_and_open_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(10)).unwrap();
        // Batches of 7 rows: seals happen in the middle of records.
        let reference = fill(&store, 25, 7, 0);
        let s = store.stats();
        assert_eq!((s.streams, s.series, s.chunks, s.open_rows), (2, 6, 4, 10));
        assert_eq!(s.samples, 2 * 25 * 3);
        check_raw(&store, &reference, 0, 25 * SEC);
        check_raw(&store, &reference, 8 * SEC, 22 * SEC);
        check_raw(&store, &reference, 19 * SEC, 21 * SEC);
        // One record of 25 rows per stream: two full chunks and 5 open rows each.
        let dir2 = tempfile::tempdir().unwrap();
        let store2 = Store::open(dir2.path(), opts(10)).unwrap();
        let reference = fill(&store2, 25, 25, 0);
        let s = store2.stats();
        assert_eq!((s.chunks, s.open_rows), (4, 10));
        check_raw(&store2, &reference, 0, 25 * SEC);
        // Aggregate across sealed and open rows.
        let got = run(
            &store2,
            &spec("host.cpu", Some("sys"), 0, 25 * SEC, Some(10 * SEC), Agg::Count),
        );
        assert_eq!(got[0].values, vec![10.0, 10.0, 5.0]);
        assert_eq!(got[0].ts, vec![0, 10 * SEC, 20 * SEC]);
    }

    #[test]
    fn the_series_cache_hits_for_events_sharing_their_series() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(100)).unwrap();
        let (a, b) = (cpu("a"), cpu("b"));
        // Events of one series share its Arc (as the decoder delivers them): one miss per
        // series per append, every other event a hit.
        // Events `seqs` alternating between the two series.
        let alternating = |seqs: std::ops::Range<u64>| -> Vec<_> {
            seqs.map(|i| {
                ev(
                    if i % 2 == 0 { &a } else { &b },
                    i + 1,
                    i as i64,
                    &[1.0, 2.0],
                    &["ok"],
                )
            })
            .collect()
        };
        let st = store.append("p1", rp(1, 11), &alternating(0..10)).unwrap();
        assert_eq!(
            (st.events, st.series_cache_misses, st.series_cache_hits),
            (10, 2, 8)
        );
        // A fresh Arc per event (what the decoder once did) misses every time.
        let events: Vec<_> = (10..20)
            .map(|i| {
                ev(
                    &Arc::new(SeriesInfo::clone(&a)),
                    i + 1,
                    i as i64,
                    &[1.0, 2.0],
                    &["ok"],
                )
            })
            .collect();
        let st = store.append("p1", rp(1, 21), &events).unwrap();
        assert_eq!(
            (st.events, st.series_cache_misses, st.series_cache_hits),
            (10, 10, 0)
        );
        // The cache outlives an append: the next batch of the same decoder only hits, and the
        // events land in the streams resolved before (no new stream).
        let st = store.append("p1", rp(1, 31), &alternating(20..30)).unwrap();
        assert_eq!(
            (
                st.events,
                st.series_cache_misses,
                st.series_cache_hits,
                st.new_streams
            ),
            (10, 0, 10, 0)
        );
        assert_eq!(store.stats().streams, 2);
        // A cached series whose values do not fit its stream is still refused.
        let bad = ev(&a, 31, 31, &[1.0], &["ok"]);
        let st = store.append("p1", rp(1, 32), &[bad]).unwrap();
        assert_eq!((st.events, st.rejected, st.series_cache_hits), (0, 1, 1));
    }

    /// A checkpoint writes sled in several batches, the record's position last: when that last
    /// batch is lost (a crash between the batches; sled's flush is not an fsync either), sled
    /// holds the record's entries under the previous position, and the next open applies the
    /// record again over them: the same archive, nothing twice.
    #[tokio::test]
    async fn a_checkpoint_whose_last_sled_batch_is_lost_reopens_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let mut reference;
        let metas = [META_NEXT_WAL, META_OLDEST, META_APPLIED];
        let before: Vec<Option<sled::IVec>>;
        {
            let store = Store::open(dir.path(), opts(10)).unwrap();
            reference = fill(&store, 25, 7, 0);
            store.flush().await.unwrap();
            store.checkpoint().await.unwrap();
            before = metas.iter().map(|k| store.db.get(k).unwrap()).collect();
            reference.extend(fill(&store, 31, 6, 25));
            store.flush().await.unwrap();
            store.checkpoint().await.unwrap();
            assert_ne!(store.db.get(META_APPLIED).unwrap(), before[2]);
            // The last batch lost: the positions of the first checkpoint again.
            for (k, v) in metas.iter().zip(&before) {
                match v {
                    Some(v) => store.db.insert(k, v.clone()).unwrap(),
                    None => store.db.remove(k).unwrap(),
                };
            }
            store.db.flush().unwrap();
        }
        let store = Store::open(dir.path(), opts(10)).unwrap();
        let s = store.stats();
        assert_eq!((s.open_rows, s.samples), (0, 2 * 56 * 3));
        check_raw(&store, &reference, i64::MIN, i64::MAX);
        assert_eq!(store.resume_points().get("p1"), Some(&rp(7, 57)));
        assert_ne!(store.db.get(META_APPLIED).unwrap(), before[2]);
    }

    #[test]
    fn sled_batches_apply_as_they_fill_and_at_finish() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let mut b = SledBatches::new(&db);
        for i in 0..SLED_BATCH_ENTRIES as u32 {
            b.insert(&i.to_be_bytes(), b"v").unwrap();
        }
        // Full: applied without finish.
        assert_eq!(db.len(), SLED_BATCH_ENTRIES);
        b.insert(b"last", b"v").unwrap();
        b.remove(&0u32.to_be_bytes()).unwrap();
        assert_eq!(db.len(), SLED_BATCH_ENTRIES);
        b.finish().unwrap();
        assert_eq!(db.len(), SLED_BATCH_ENTRIES);
        assert!(db.get(b"last").unwrap().is_some() && db.get(0u32.to_be_bytes()).unwrap().is_none());
    }

    #[tokio::test]
    async fn checkpoint_seals_everything_and_empties_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut reference;
        {
            let store = Store::open(
                dir.path(),
                StoreOptions {
                    chunk_rows: 10,
                    checkpoint_wal_bytes: 1000,
                    checkpoint_interval: Duration::from_secs(3600),
                    wal_keep_bytes: 0,
                    ..StoreOptions::default()
                },
            )
            .unwrap();
            assert!(!store.needs_checkpoint());
            reference = fill(&store, 23, 5, 0);
            assert!(store.needs_checkpoint());
            store.checkpoint().await.unwrap();
            assert!(!store.needs_checkpoint());
            let s = store.stats();
            assert_eq!((s.wal_bytes, s.open_rows, s.chunks), (0, 0, 6));
            check_raw(&store, &reference, i64::MIN, i64::MAX);
        }
        {
            let store = Store::open(dir.path(), opts(10)).unwrap();
            let s = store.stats();
            assert_eq!((s.wal_bytes, s.open_rows, s.chunks), (0, 0, 6));
            check_raw(&store, &reference, i64::MIN, i64::MAX);
            // Records written after the checkpoint must not be taken for sealed ones.
            reference.extend(fill(&store, 4, 2, 23));
            store.flush().await.unwrap();
        }
        let store = Store::open(dir.path(), opts(10)).unwrap();
        assert_eq!(store.stats().open_rows, 8);
        check_raw(&store, &reference, i64::MIN, i64::MAX);
        assert_eq!(store.resume_points().get("p1"), Some(&rp(7, 28)));
    }
    /// Open chunks kept across checkpoints (`wal_keep_bytes` large): their rows are replayed
    /// from the write-ahead segments the checkpoints kept, once, after a stop at any point.
    #[tokio::test]
    async fn rows_kept_open_across_checkpoints_come_back_once_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let keep = StoreOptions {
            chunk_rows: 1000,
            wal_keep_bytes: 1 << 30,
            ..StoreOptions::default()
        };
        let mut reference;
        {
            let store = Store::open(dir.path(), keep.clone()).unwrap();
            reference = fill(&store, 20, 5, 0);
            store.flush().await.unwrap();
            store.checkpoint().await.unwrap();
            let s = store.stats();
            assert_eq!((s.chunks, s.open_rows, s.wal_bytes), (0, 40, 0));
            reference.extend(fill(&store, 13, 4, 20));
            store.flush().await.unwrap();
            store.checkpoint().await.unwrap();
            // Not checkpointed: the crash comes after a flush.
            reference.extend(fill(&store, 3, 3, 33));
            store.flush().await.unwrap();
        }
        {
            let store = Store::open(dir.path(), keep.clone()).unwrap();
            let s = store.stats();
            assert_eq!((s.chunks, s.open_rows, s.samples), (0, 2 * 36, 2 * 36 * 3));
            check_raw(&store, &reference, i64::MIN, i64::MAX);
            assert_eq!(store.resume_points().get("p1"), Some(&rp(7, 37)));
            // A checkpoint right after the replay keeps them open still; a reopen after it
            // (nothing appended) finds the same.
            store.checkpoint().await.unwrap();
        }
        {
            let store = Store::open(dir.path(), keep).unwrap();
            let s = store.stats();
            assert_eq!((s.chunks, s.open_rows, s.samples), (0, 2 * 36, 2 * 36 * 3));
            check_raw(&store, &reference, i64::MIN, i64::MAX);
            // Rows sealed at chunk_rows in a later process must not come back from the log.
        }
        // Reopened with a budget of 0: the next checkpoint seals them all and drops the log.
        {
            let store = Store::open(dir.path(), opts(1000)).unwrap();
            reference.extend(fill(&store, 2, 2, 36));
            store.flush().await.unwrap();
            store.checkpoint().await.unwrap();
            let s = store.stats();
            assert_eq!((s.chunks, s.open_rows), (2, 0));
            assert_eq!(store.wal.segments().len(), 1);
        }
        let store = Store::open(dir.path(), opts(1000)).unwrap();
        let s = store.stats();
        assert_eq!((s.chunks, s.open_rows, s.samples), (2, 0, 2 * 38 * 3));
        check_raw(&store, &reference, i64::MIN, i64::MAX);
    }

    /// One round of the budget tests: `rows` more rows of both streams, flushed, checkpointed.
    async fn round(store: &Store, reference: &mut Vec<(String, i64, f64, String, f64)>, rows: usize) {
        let start = reference.len() / 2;
        reference.extend(fill(store, rows, 50, start));
        store.flush().await.unwrap();
        store.checkpoint().await.unwrap();
    }

    /// A write-ahead segment stays while an open chunk's first row lies in it, and goes at the
    /// first checkpoint after no open row needs it.
    #[tokio::test]
    async fn write_ahead_segments_go_only_once_no_open_row_needs_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            StoreOptions {
                chunk_rows: 1000,
                wal_keep_bytes: 1 << 17,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        let mut reference = Vec::new();
        for r in 1..5 {
            round(&store, &mut reference, 200).await;
            // One segment per round (each passes a sixteenth of the budget), and the current one.
            assert_eq!(store.wal.segments().len(), r + 1, "round {r}");
            assert_eq!(store.stats().chunks, 0);
            assert_eq!(store.inner.lock().covered, 1);
        }
        // Under the budget all along: nothing was sealed for it.
        assert!(store.wal.bytes_on_disk() < 1 << 16);
        // The fifth round fills both chunks (1,000 rows): sealed by the appends, so no open row
        // needs the log, and every segment before the cut goes.
        round(&store, &mut reference, 200).await;
        let s = store.stats();
        assert_eq!((s.chunks, s.open_rows), (2, 0));
        assert_eq!(store.wal.segments().len(), 1);
        assert_eq!(store.inner.lock().covered, store.wal.next_seq());
        check_raw(&store, &reference, i64::MIN, i64::MAX);
    }

    /// Past `wal_keep_bytes` a checkpoint seals the open chunks whose first row lies in the
    /// segments it drops: the log on disk stays within the budget (plus the newest segment),
    /// and the archive holds every row once, before and after a reopen.
    #[tokio::test]
    async fn the_write_ahead_budget_forces_seals() {
        let dir = tempfile::tempdir().unwrap();
        let o = StoreOptions {
            chunk_rows: 100_000,
            wal_keep_bytes: 1 << 16,
            ..StoreOptions::default()
        };
        let mut reference = Vec::new();
        {
            let store = Store::open(dir.path(), o.clone()).unwrap();
            let mut sealed_at = None;
            for r in 1..=20 {
                round(&store, &mut reference, 200).await;
                let segs = store.inner.lock().wal_segs.clone();
                assert!(
                    segs.values().sum::<u64>() <= 1 << 16,
                    "round {r}: {segs:?} kept past the budget"
                );
                assert_eq!(store.wal.bytes_on_disk(), segs.values().sum::<u64>());
                if store.stats().chunks > 0 && sealed_at.is_none() {
                    sealed_at = Some(r);
                }
            }
            // Sealed by the budget long before chunk_rows, more than once, all rows kept.
            let s = store.stats();
            let first = sealed_at.expect("the budget never sealed");
            assert!(
                first > 2 && s.chunks >= 4,
                "first seal at round {first}, {} chunks",
                s.chunks
            );
            assert_eq!(s.samples, 2 * 20 * 200 * 3);
            check_raw(&store, &reference, i64::MIN, i64::MAX);
            // Rows since the last checkpoint, flushed: the crash follows.
            reference.extend(fill(&store, 30, 10, 4000));
            store.flush().await.unwrap();
        }
        let store = Store::open(dir.path(), o).unwrap();
        assert_eq!(store.stats().samples, 2 * 4030 * 3);
        check_raw(&store, &reference, i64::MIN, i64::MAX);
    }

    /// Streams that started together do not all seal at one checkpoint (one record holding a
    /// long chunk of every stream passed the log's record limit at 10,000 hosts).
    #[tokio::test]
    async fn streams_started_together_seal_at_different_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            StoreOptions {
                chunk_rows: 100_000,
                wal_keep_bytes: 1 << 16,
                ..StoreOptions::default()
            },
        )
        .unwrap();
        let hosts: Vec<_> = (0..16).map(|i| cpu(&format!("h{i}"))).collect();
        let mut seq = 0u64;
        let mut sealed = Vec::new();
        for _ in 0..30 {
            for _ in 0..4 {
                let events: Vec<_> = hosts
                    .iter()
                    .flat_map(|h| (0..10).map(move |_| h))
                    .map(|h| {
                        seq += 1;
                        ev(h, seq, seq as i64 * SEC, &[1.0, 2.0], &["ok"])
                    })
                    .collect();
                store.append("p1", rp(1, seq + 1), &events).unwrap();
            }
            store.flush().await.unwrap();
            let before = store.stats().chunks;
            store.checkpoint().await.unwrap();
            sealed.push(store.stats().chunks - before);
        }
        let first = sealed
            .iter()
            .copied()
            .find(|n| *n > 0)
            .expect("the budget never sealed");
        assert!(first < 16, "all 16 streams sealed at one checkpoint: {sealed:?}");
        assert!(sealed.iter().sum::<u64>() >= 16, "{sealed:?}");
        assert_eq!(store.stats().samples, seq * 3);
    }

    #[test]
    fn stream_budgets_spread_from_half_to_all_of_the_budget() {
        let keep = 1 << 30;
        assert_eq!(stream_keep(keep, 0), keep / 2);
        assert_eq!(stream_keep(keep, KEEP_SHARES - 1), keep / 16 * 15);
        assert_eq!(stream_keep(0, 3), 0);
    }

    #[test]
    fn the_keep_floor_counts_whole_segments_from_the_newest() {
        let segs: std::collections::BTreeMap<u64, u64> = [(1, 40), (10, 30), (20, 20), (30, 5)].into();
        assert_eq!(keep_floor(&segs, 30, 0), 30);
        assert_eq!(keep_floor(&segs, 30, 24), 30);
        assert_eq!(keep_floor(&segs, 30, 25), 20);
        assert_eq!(keep_floor(&segs, 30, 55), 10);
        assert_eq!(keep_floor(&segs, 30, 95), 1);
        assert_eq!(keep_floor(&segs, 40, 1000), 1);
    }
}
