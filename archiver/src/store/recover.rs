//! Opening a store: loading the index, catching it up with the chunk log, replaying the
//! write-ahead log.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_consumer::stream::ResumePoint;
use gma_durable::{Fs, Log, OsFs};
use parking_lot::Mutex;

use super::codec::{decode_checkpoint, unzigzag, Cursor, WAL_FORMAT};
use super::durability::seal;
use super::layout::*;
use super::{corrupt, ChunkKey, Inner, Pending, Store, StoreError, StoreOptions, Stream};

/// How long `open` retries while sled's file lock is still held by a store of this process.
const SLED_LOCK_WAIT: Duration = Duration::from_secs(5);
/// sled's log segment size.
const SLED_SEGMENT_BYTES: usize = 64 << 10;

impl Store {
    /// Opens (or creates) the store in `dir` on the real file system. See [`Store::open_on`].
    pub fn open(dir: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        Store::open_on(OsFs::new(), dir, opts)
    }

    /// Opens (or creates) the store in `dir`, its logs on `fs` (sled always on the real file
    /// system): loads the index, catches it up with the chunk log, and replays the write-ahead
    /// log into the open chunks (rows already in durable chunks are skipped). Reads no chunk.
    pub fn open_on(fs: Arc<dyn Fs>, dir: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        let opts = StoreOptions {
            chunk_rows: opts.chunk_rows.max(1),
            ..opts
        };
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Storage(format!("cannot create {}: {e}", dir.display())))?;
        let config = sled_config(dir, &opts);
        let deadline = Instant::now() + SLED_LOCK_WAIT;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                // sled holds a file lock per open database; a store closed a moment ago in this
                // process may still be releasing it (a restart inside one process, as tests do).
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        };
        match db.get(META_FORMAT)? {
            Some(v) => {
                let f = be_u64(&v).ok_or_else(|| corrupt("bad format marker"))?;
                if f == 2 {
                    return Err(StoreError::Storage(format!(
                        "{} is an archive of format 2 (chunks inside sled, not fsynced): this build keeps chunks in \
                         fsynced files and does not convert it; export it with the previous gma \
                         (`gma archive export`), then move the folder aside (docs/archiver.md, Storage)",
                        dir.display()
                    )));
                }
                if f != FORMAT {
                    return Err(corrupt(format!(
                        "store format {f}, this build reads format {FORMAT}"
                    )));
                }
            }
            None if db.is_empty() => {
                db.insert(META_FORMAT, &FORMAT.to_be_bytes()[..])?;
            }
            None => return Err(corrupt(format!("{} is not an archive store", dir.display()))),
        }

        // The index as sled has it (some prefix of the applied checkpoints).
        let mut streams = BTreeMap::new();
        for item in db.scan_prefix([K_STREAM]) {
            let (_, v) = item?;
            let meta: StreamMeta =
                serde_json::from_slice(&v).map_err(|e| corrupt(format!("stream dictionary entry: {e}")))?;
            streams.insert(meta.id, Stream::new(meta));
        }
        let mut index: BTreeMap<ChunkKey, ChunkMeta> = BTreeMap::new();
        for item in db.scan_prefix([K_CHUNK]) {
            let (k, v) = item?;
            let key: ChunkKey = k[..].try_into().map_err(|_| corrupt("malformed chunk key"))?;
            let m = ChunkMeta::decode(&v).ok_or_else(|| corrupt("malformed chunk index entry"))?;
            index.insert(key, m);
        }
        let mut resume = HashMap::new();
        for item in db.scan_prefix([K_RESUME]) {
            let (k, v) = item?;
            let producer =
                String::from_utf8(k[1..].to_vec()).map_err(|_| corrupt("resume point key is not UTF-8"))?;
            let (Some(epoch), Some(next_seq)) = (
                v.get(..8).and_then(be_u64),
                v.get(8..).filter(|b| b.len() == 8).and_then(be_u64),
            ) else {
                return Err(corrupt(format!("resume point of {producer}")));
            };
            resume.insert(producer, ResumePoint { epoch, next_seq });
        }
        let meta_u64 = |k: &[u8]| -> Result<u64, StoreError> {
            match db.get(k)? {
                Some(v) => be_u64(&v).ok_or_else(|| corrupt("bad meta value")),
                None => Ok(0),
            }
        };
        let applied = meta_u64(META_APPLIED)?;
        let mut next_wal = meta_u64(META_NEXT_WAL)?.max(1);
        let mut oldest = meta_u64(META_OLDEST)?;

        // Catch the index up with the chunk log.
        let (chunks, found) = Log::open(
            fs.clone(),
            &dir.join("chunks"),
            opts.log("chunks", 1, applied + 1),
        )?;
        let mut catch_up = sled::Batch::default();
        let mut caught = 0u64;
        for r in &found.records {
            let cp = decode_checkpoint(&r.payload, r.pos)
                .map_err(|e| corrupt(format!("chunk-log record {}: {e}", r.pos.seq)))?;
            // The record's dictionary and resume points are complete: they replace sled's.
            for (_, st) in std::mem::take(&mut streams) {
                catch_up.remove(st.key);
            }
            for m in cp.streams {
                let st = Stream::new(m);
                catch_up.insert(st.key.clone(), encode_meta(&st.meta)?);
                streams.insert(st.meta.id, st);
            }
            for p in resume.keys() {
                catch_up.remove(resume_key(p));
            }
            resume = cp.resume.into_iter().collect();
            for (p, rp) in &resume {
                catch_up.insert(resume_key(p), resume_value(*rp).to_vec());
            }
            for (k, m) in cp.chunks {
                match m {
                    Some(m) => {
                        catch_up.insert(&k[..], &m.encode().unwrap_or([0; 40])[..]);
                        index.insert(k, m);
                    }
                    None => {
                        catch_up.remove(&k[..]);
                        index.remove(&k);
                    }
                }
            }
            next_wal = cp.next_wal.max(1);
            oldest = cp.oldest;
            caught = r.pos.seq;
        }
        if caught > 0 {
            catch_up.insert(META_APPLIED, &caught.to_be_bytes()[..]);
            catch_up.insert(META_NEXT_WAL, &next_wal.to_be_bytes()[..]);
            catch_up.insert(META_OLDEST, &oldest.to_be_bytes()[..]);
            db.apply_batch(catch_up)?;
            tracing::info!(
                records = found.records.len(),
                "archive index caught up with the chunk log"
            );
        }
        // Segments before the oldest needed one hold no live chunk: entries pointing there are
        // stale (an index older than the removal).
        let before = index.len();
        index.retain(|_, m| m.loc.is_some_and(|(seg, _)| seg >= oldest));
        if index.len() < before {
            tracing::warn!(
                dropped = before - index.len(),
                "stale archive index entries dropped"
            );
        }
        chunks.remove_before_blocking(oldest)?;

        let mut next_ctr = 0u32;
        let mut segs = BTreeMap::new();
        for (k, m) in index {
            let (sid, tk, ctr) = parse_chunk_key(&k).ok_or_else(|| corrupt("malformed chunk key"))?;
            let st = streams
                .get_mut(&sid)
                .ok_or_else(|| corrupt(format!("chunk of unknown stream {sid}")))?;
            if let Some((seg, _)) = m.loc {
                *segs.entry(seg).or_insert(0u64) += 1;
            }
            st.add_chunk((tk, ctr), m);
            next_ctr = next_ctr.max(ctr.wrapping_add(1));
        }
        let mut by_key = HashMap::new();
        for st in streams.values() {
            by_key.insert(
                (
                    st.meta.name.clone(),
                    st.meta.source.clone(),
                    st.meta.schema_version,
                ),
                st.meta.id,
            );
        }
        // Replay from the last checkpoint's `C`; chunks committed since (sealed positions past
        // it) only make the replay skip their rows.
        let checkpointed = next_wal;
        let sealed_to = streams
            .values()
            .map(|s| s.meta.sealed_wal + 1)
            .fold(next_wal, u64::max);

        // Replay the write-ahead log (from the first record no checkpoint covers).
        let (wal, found) = Log::open(fs.clone(), &dir.join("wal"), opts.log("wal", next_wal, next_wal))?;
        let mut replayed = 0u64;
        let mut pos: HashMap<u32, (u64, u32)> = HashMap::new();
        let records = found.records.len();
        let mut wal_bytes = 0u64;
        let mut pending = Pending::default();
        let mut sealer = Sealer {
            chunk_rows: opts.chunk_rows,
            pending: &mut pending,
            next_ctr: &mut next_ctr,
        };
        for r in found.records {
            wal_bytes += (gma_durable::log::HEADER + r.payload.len()) as u64;
            let out = replay_record(r.pos.seq, &r.payload, &mut streams, &mut pos, Some(&mut sealer))?;
            for m in out.created {
                by_key.insert((m.name.clone(), m.source.clone(), m.schema_version), m.id);
            }
            resume.insert(out.producer, out.resume);
            replayed += out.pushed;
        }
        if wal.next_seq() < sealed_to {
            return Err(corrupt(format!(
                "the write-ahead log ends at record {} but the chunk log covers up to {}: records are missing",
                wal.next_seq().saturating_sub(1),
                sealed_to - 1
            )));
        }
        let next_wal = wal.next_seq();
        // The budget counts whole segment files (the replay read only from `checkpointed`).
        let wal_dir = dir.join("wal");
        let mut wal_segs = BTreeMap::new();
        for s in wal.segments() {
            let len = fs
                .len(&Log::segment_path(&wal_dir, "wal", s))
                .map_err(|e| StoreError::Storage(format!("write-ahead segment {s}: {e}")))?
                .unwrap_or(0);
            wal_segs.insert(s, len);
        }
        let next_sid = streams.keys().next_back().map_or(0, |s| s + 1);
        tracing::info!(streams = streams.len(), records, replayed, "archive store opened");
        Ok(Store {
            db,
            wal,
            chunks,
            opts,
            inner: Mutex::new(Inner {
                streams,
                by_key,
                series_cache: Default::default(),
                next_sid,
                next_wal,
                next_ctr,
                wal_bytes,
                resume,
                segs,
                pending,
                covered: checkpointed,
                wal_segs,
                last_checkpoint: Instant::now(),
                poisoned: None,
            }),
            flushing: tokio::sync::Mutex::new(()),
        })
    }
}

/// What one write-ahead record held besides its rows.
#[derive(Debug)]
pub(super) struct Replayed {
    pub(super) producer: String,
    pub(super) resume: ResumePoint,
    /// Streams the record defined that were not known yet.
    pub(super) created: Vec<StreamMeta>,
    /// Rows pushed into open chunks.
    pub(super) pushed: u64,
}

/// Replays record `seq`: creates the streams it defines that `streams` lacks, and pushes its
/// rows that lie after their stream's sealed position into the open chunks. `pos` counts, per
/// stream, its rows within the current record.
/// Seals open chunks during a replay as appends do (at `chunk_rows`).
pub(super) struct Sealer<'a> {
    pub(super) chunk_rows: usize,
    pub(super) pending: &'a mut Pending,
    pub(super) next_ctr: &'a mut u32,
}

pub(super) fn replay_record(
    seq: u64,
    bytes: &[u8],
    streams: &mut BTreeMap<u32, Stream>,
    pos: &mut HashMap<u32, (u64, u32)>,
    mut sealer: Option<&mut Sealer<'_>>,
) -> Result<Replayed, StoreError> {
    let bad = |m: String| corrupt(format!("write-ahead record {seq}: {m}"));
    let mut c = Cursor { b: bytes, at: 0 };
    let format = c.take(1)?[0];
    if format != WAL_FORMAT {
        return Err(bad(format!("unknown format {format}")));
    }
    let plen = usize::try_from(c.varint()?).map_err(|_| bad("producer length".into()))?;
    let producer = std::str::from_utf8(c.take(plen)?)
        .map_err(|_| bad("producer id not UTF-8".into()))?
        .to_string();
    let mut le = || -> Result<u64, StoreError> {
        let b: [u8; 8] = c
            .take(8)?
            .try_into()
            .map_err(|_| bad("short resume point".into()))?;
        Ok(u64::from_le_bytes(b))
    };
    let resume = ResumePoint {
        epoch: le()?,
        next_seq: le()?,
    };
    let mut created = Vec::new();
    for _ in 0..c.varint()? {
        let len = usize::try_from(c.varint()?).map_err(|_| bad("definition length".into()))?;
        let meta: StreamMeta =
            serde_json::from_slice(c.take(len)?).map_err(|e| bad(format!("stream definition: {e}")))?;
        if let std::collections::btree_map::Entry::Vacant(v) = streams.entry(meta.id) {
            v.insert(Stream::new(meta.clone()));
            created.push(meta);
        }
    }
    let n = c.varint()?;
    if n > bytes.len() as u64 {
        return Err(bad(format!("{n} events in {} bytes", bytes.len())));
    }
    let mut prev = 0i64;
    let mut doubles = Vec::new();
    let mut strings: Vec<&str> = Vec::new();
    let mut pushed = 0;
    for _ in 0..n {
        let sid = u32::try_from(c.varint()?).map_err(|_| bad("stream id out of range".into()))?;
        let ts = prev.wrapping_add(unzigzag(c.varint()?));
        prev = ts;
        let st = streams
            .get_mut(&sid)
            .ok_or_else(|| bad(format!("unknown stream {sid}")))?;
        doubles.clear();
        for _ in 0..st.n_doubles {
            let b: [u8; 8] = c.take(8)?.try_into().map_err(|_| bad("short double".into()))?;
            doubles.push(f64::from_le_bytes(b));
        }
        strings.clear();
        for _ in 0..st.n_strings {
            let len = usize::try_from(c.varint()?).map_err(|_| bad("string length".into()))?;
            let s = std::str::from_utf8(c.take(len)?).map_err(|_| bad("string not UTF-8".into()))?;
            strings.push(s);
        }
        let p = pos.entry(sid).or_insert((0, 0));
        if p.0 == seq {
            p.1 += 1;
        } else {
            *p = (seq, 1);
        }
        if *p > (st.meta.sealed_wal, st.meta.sealed_rows) {
            if st.open.is_empty() {
                st.open_from = seq;
            }
            st.open.push(ts, &doubles, &strings)?;
            st.head = *p;
            pushed += 1;
            if let Some(s) = sealer.as_deref_mut() {
                if st.open.rows() >= s.chunk_rows {
                    seal(st, s.pending, s.next_ctr)?;
                }
            }
        }
    }
    if c.at != bytes.len() {
        return Err(bad(format!("{} trailing bytes", bytes.len() - c.at)));
    }
    Ok(Replayed {
        producer,
        resume,
        created,
        pushed,
    })
}

/// sled's configuration for the index under `dir`. Small log segments: sled keeps superseded
/// page versions until its cleaner frees their segment, and smaller segments are freed sooner.
/// Its page cache is capped at [`StoreOptions::index_cache_bytes`] (sled's default, 1 GiB,
/// would let the archiver's RSS grow for hours).
fn sled_config(dir: &Path, opts: &StoreOptions) -> sled::Config {
    sled::Config::new()
        .path(dir.join("sled"))
        .segment_size(SLED_SEGMENT_BYTES)
        .cache_capacity(opts.index_cache_bytes)
        // Nothing depends on sled's flushes (the chunk log is the truth), but a periodic one
        // keeps the catch-up replay at open short. Unit tests: none (sled opens and closes
        // faster, and the crash tests replay more of the chunk log).
        .flush_every_ms(if cfg!(test) { None } else { Some(1000) })
}

#[cfg(test)]
mod tests {
    use gma_core::event::dbl;
    use gma_core::pattern::Pattern;
    use rand::{Rng, SeedableRng};

    use super::super::Agg;

    use super::*;
    use crate::store::testkit::*;

    #[test]
    fn the_index_cache_is_capped_by_the_options_not_sleds_gigabyte() {
        let dir = std::path::Path::new("/nonexistent");
        let d = sled_config(dir, &StoreOptions::default());
        assert_eq!(d.cache_capacity, 64 << 20);
        let small = sled_config(
            dir,
            &StoreOptions {
                index_cache_bytes: 3 << 20,
                ..StoreOptions::default()
            },
        );
        assert_eq!(small.cache_capacity, 3 << 20);
        assert!(sled::Config::new().cache_capacity > d.cache_capacity);
    }

    #[tokio::test]
    async fn reopening_after_flush_replays_the_log_without_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let mut reference;
        {
            let store = Store::open(dir.path(), opts(10)).unwrap();
            reference = fill(&store, 33, 7, 0);
            store.append("p9", rp(3, 44), &[]).unwrap();
            store.flush().await.unwrap();
            assert!(store.stats().wal_bytes > 0);
        }
        {
            let store = Store::open(dir.path(), opts(10)).unwrap();
            let s = store.stats();
            assert_eq!((s.chunks, s.open_rows, s.samples), (6, 6, 2 * 33 * 3));
            check_raw(&store, &reference, i64::MIN, i64::MAX);
            let rps = store.resume_points();
            assert_eq!(rps.get("p1"), Some(&rp(7, 34)));
            assert_eq!(rps.get("p9"), Some(&rp(3, 44)));
            // More rows after a reopen, another reopen.
            reference.extend(fill(&store, 20, 6, 33));
            store.flush().await.unwrap();
        }
        let store = Store::open(dir.path(), opts(10)).unwrap();
        assert_eq!(store.stats().samples, 2 * 53 * 3);
        check_raw(&store, &reference, i64::MIN, i64::MAX);
        check_raw(&store, &reference, 30 * SEC, 41 * SEC);
        assert_eq!(store.resume_points().get("p1"), Some(&rp(7, 54)));
    }

    /// A stop after the write-ahead records were fsynced but before a checkpoint wrote the
    /// sealed chunks, new streams and resume points to the chunk log.

    #[tokio::test]
    async fn a_stop_before_the_checkpoint_loses_and_duplicates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut reference;
        {
            let store = Store::open(dir.path(), opts(10)).unwrap();
            reference = fill(&store, 12, 5, 0);
            store.flush().await.unwrap();
            // Sealed chunks and a stream the sled tree has never seen, then the crash.
            reference.extend(fill(&store, 15, 4, 12));
            let extra = series("other.ev", "h", 1, vec![dbl("x", "", "")]);
            store
                .append("p2", rp(1, 2), &[ev(&extra, 1, 5, &[42.0], &[])])
                .unwrap();
            store.flush().await.unwrap();
            assert!(store.inner.lock().pending.ops.values().any(|c| c.is_some()));
        }
        let store = Store::open(dir.path(), opts(10)).unwrap();
        check_raw(&store, &reference, i64::MIN, i64::MAX);
        let s = store.stats();
        assert_eq!(s.samples, 2 * 27 * 3 + 1);
        assert_eq!(store.resume_points().get("p1"), Some(&rp(7, 28)));
        assert_eq!(store.resume_points().get("p2"), Some(&rp(1, 2)));
        let got = run(&store, &spec("other.ev", None, 0, 10, None, Agg::Raw));
        assert_eq!(got[0].values, vec![42.0]);
        // The replayed state goes on: more rows, a checkpoint, a reopen.
        reference.extend(fill(&store, 9, 4, 27));
        store.flush().await.unwrap();
        store.checkpoint().await.unwrap();
        drop(store);
        let store = Store::open(dir.path(), opts(10)).unwrap();
        check_raw(&store, &reference, i64::MIN, i64::MAX);
        assert_eq!(store.stats().wal_bytes, 0);
    }

    // ---- storage-fault simulation ----------------------------------------------------------

    /// Seqs stored for producer `p` (its stream's `seq` field), in order.
    fn stored_seqs(store: &Store, p: &str) -> Result<Vec<u64>, StoreError> {
        let mut q = spec("sim.ev", Some("seq"), i64::MIN, i64::MAX, None, Agg::Raw);
        q.source = Some(Pattern::source(p).unwrap());
        let mut out = Vec::new();
        store.query(&q, &mut |pts| {
            out.extend(pts.values.iter().map(|v| *v as u64));
            true
        })?;
        out.sort_unstable();
        Ok(out)
    }

    /// One simulated run: rounds of appends, flushes, checkpoints, commits and retention until
    /// the power fails at a random file-system operation, then a crash of a random kind (and,
    /// sometimes, the sled index thrown away), and a reopen. Every producer resumes at its
    /// stored resume point `N`; what is stored must be exactly its seqs `[a, N)`: every flushed
    /// batch (`N` past it), nothing twice, and `a` within the retention cutoffs asked for.
    fn sim_run(seed: u64, ack_before_sync: bool) -> anyhow::Result<u64> {
        use gma_durable::sim::{Crash, SimFs};
        use rand_chacha::ChaCha8Rng;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let fs = SimFs::new();
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let opts = StoreOptions {
            chunk_rows: rng.random_range(3..12),
            chunk_segment_bytes: rng.random_range(200..3000),
            // Every open chunk sealed at each checkpoint; open chunks kept across checkpoints
            // until a small budget seals them; kept until full.
            wal_keep_bytes: match rng.random_range(0..3) {
                0 => 0,
                1 => rng.random_range(100..4000),
                _ => 1 << 30,
            },
            ack_before_sync,
            ..StoreOptions::default()
        };
        let producers = ["p0", "p1"];
        let streams: Vec<_> = producers
            .iter()
            .map(|p| series("sim.ev", p, 1, vec![dbl("seq", "", "")]))
            .collect();
        // Per producer: highest seq acknowledged (flushed); retention cutoffs (in seqs)
        // committed and asked for.
        let mut acked = [0u64; 2];
        let mut cut_done = [1u64; 2];
        let mut cut_asked = [1u64; 2];
        let mut crashes = 0;
        for round in 0..8 {
            let store = Store::open_on(Arc::new(fs.handle()), tmp.path(), opts.clone())
                .map_err(|e| anyhow::anyhow!("round {round}: recovery failed: {e}"))?;
            let rps = store.resume_points();
            let mut next = [1u64; 2];
            for (i, p) in producers.iter().enumerate() {
                let n = rps.get(*p).map_or(1, |r| r.next_seq);
                let got = stored_seqs(&store, p).map_err(|e| anyhow::anyhow!("round {round}: {p}: {e}"))?;
                let a = got.first().copied().unwrap_or(n);
                if got != (a..n).collect::<Vec<_>>() {
                    return Err(anyhow::anyhow!(
                        "round {round}: {p} resumes at {n} but holds {} seqs from {a}: lost or doubled ({:?})",
                        got.len(),
                        &got[..got.len().min(40)]
                    ));
                }
                if n <= acked[i] {
                    return Err(anyhow::anyhow!(
                        "round {round}: {p} acknowledged up to {} but resumes at {n}",
                        acked[i]
                    ));
                }
                if a < cut_done[i].min(n) || a > cut_asked[i].max(cut_done[i]).max(1) {
                    return Err(anyhow::anyhow!(
                        "round {round}: {p} holds from {a}, retention asked {} (done {})",
                        cut_asked[i],
                        cut_done[i]
                    ));
                }
                cut_done[i] = a.max(cut_done[i].min(n));
                cut_asked[i] = cut_done[i];
                next[i] = n;
            }
            fs.arm(rng.random_range(1..150));
            let mut appended = [0u64; 2];
            for _ in 0..60 {
                let r: Result<(), StoreError> = match rng.random_range(0..20) {
                    0..=9 => {
                        let i = rng.random_range(0..2);
                        let k = rng.random_range(1..6);
                        let events: Vec<_> = (next[i]..next[i] + k)
                            .map(|q| ev(&streams[i], q, q as i64 * SEC, &[q as f64], &[]))
                            .collect();
                        next[i] += k;
                        appended[i] = next[i] - 1;
                        store.append(producers[i], rp(1, next[i]), &events).map(|_| ())
                    }
                    10..=14 => rt.block_on(store.flush()).map(|()| {
                        acked = [acked[0].max(appended[0]), acked[1].max(appended[1])];
                    }),
                    15..=16 => rt.block_on(store.checkpoint()).map(|()| {
                        // A checkpoint waits for the write-ahead log too.
                        acked = [acked[0].max(appended[0]), acked[1].max(appended[1])];
                    }),
                    17 => rt.block_on(store.commit()).map(|()| cut_done = cut_asked),
                    _ => {
                        let i = rng.random_range(0..2);
                        let cut = rng.random_range(cut_asked[i]..=next[i]);
                        cut_asked[i] = cut;
                        // Retention of one producer's stream: cut below `cut`.
                        let sid = store
                            .inner
                            .lock()
                            .by_key
                            .get(&("sim.ev".to_string(), producers[i].to_string(), 1))
                            .copied();
                        match sid {
                            Some(sid) => store.delete_stream_older_than(sid, cut as i64 * SEC).map(|_| ()),
                            None => Ok(()),
                        }
                    }
                };
                if r.is_err() {
                    break;
                }
            }
            fs.power_off();
            drop(store);
            let mode = Crash::ALL[rng.random_range(0..3)];
            fs.crash(mode, &mut rng);
            if rng.random_bool(0.25) {
                // The index is a cache: lose it entirely.
                std::fs::remove_dir_all(tmp.path().join("sled")).unwrap();
            }
            crashes += 1;
        }
        Ok(crashes)
    }

    #[test]
    fn acknowledged_batches_survive_simulated_power_loss_once() {
        let base = gma_durable::sim::seed_from_env(0x5eed_a000);
        let single = std::env::var("GMA_FAULT_SEED").is_ok();
        let runs = if single { 1 } else { 300 };
        let mut crashes = 0;
        for i in 0..runs {
            let seed = base.wrapping_add(i);
            match sim_run(seed, false) {
                Ok(n) => crashes += n,
                Err(e) => panic!("GMA_FAULT_SEED={seed}: {e}"),
            }
        }
        println!("{crashes} simulated power losses: every flushed batch back, once");
        assert!(single || crashes >= 2000);
    }

    #[test]
    fn archiver_ack_before_sync_is_caught() {
        let caught = (0..150u64).find_map(|s| sim_run(0xbad0_a000 + s, true).err().map(|e| e.to_string()));
        println!("found: {caught:?}");
        assert!(
            // Lost or doubled seqs, seqs gone from the front that no retention asked to cut, an
            // index pointing at chunk bytes the disk never kept, or a reopen refusing a log that
            // lost records a synced checkpoint already covers. Which of them is found first
            // varies from run to run with the same seeds (seen in CI).
            caught.as_deref().is_some_and(|e| {
                e.contains("acknowledged up to")
                    || e.contains("lost or doubled")
                    || e.contains("retention asked")
                    || e.contains("read past the end")
                    || e.contains("records are missing")
            }),
            "a store acknowledging before fdatasync lost nothing in 150 simulated runs: the simulator is blind"
        );
    }
}
