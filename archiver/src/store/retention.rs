//! Retention: deleting the samples older than a cutoff (see Retention in the module documentation).

use std::sync::Arc;

use gma_core::pattern::Pattern;

use super::durability::{free_counter, seal};
use super::layout::{chunk_key, describe_chunk_key, ts_key, ChunkMeta};
use super::{corrupt, Inner, Store, StoreError};
use crate::chunk::{ChunkReader, ChunkWriter};

impl Store {
    /// Retention: deletes the samples older than `cutoff_ns` of every stream whose event name
    /// matches `name` (whole chunks when they are entirely older, straddling chunks rewritten,
    /// open rows sealed first). Durable, atomically, with the next checkpoint.
    /// Returns the samples (rows × fields) deleted.
    pub fn delete_older_than(&self, name: &Pattern, cutoff_ns: i64) -> Result<u64, StoreError> {
        let sids: Vec<u32> = {
            let g = self.inner.lock();
            g.streams
                .values()
                .filter(|st| name.matches(&st.meta.name))
                .map(|st| st.meta.id)
                .collect()
        };
        let mut deleted = 0u64;
        for sid in sids {
            deleted += self.delete_stream_older_than(sid, cutoff_ns)?;
        }
        if deleted > 0 {
            tracing::debug!(pattern = %name, cutoff_ns, deleted, "retention");
        }
        Ok(deleted)
    }

    pub(super) fn delete_stream_older_than(&self, sid: u32, cutoff: i64) -> Result<u64, StoreError> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.check()?;
        let Inner {
            streams,
            next_ctr,
            pending,
            ..
        } = inner;
        let Some(st) = streams.get_mut(&sid) else {
            return Ok(0);
        };
        // Open rows older than the cutoff: seal them first to cut them below.
        if st.open.min_ts().is_some_and(|m| m < cutoff) {
            if let Err(e) = seal(st, pending, next_ctr) {
                return Err(inner.poison(e));
            }
        }
        let victims: Vec<((u64, u32), ChunkMeta)> =
            st.chunks.iter().filter(|(_, m)| m.min_ts < cutoff).collect();
        if victims.is_empty() {
            return Ok(0);
        }
        let values = st.values();
        let (nd, ns) = (st.n_doubles, st.n_strings);
        let mut removed_keys = Vec::new();
        let mut added = Vec::new();
        let mut deleted_rows = 0u64;
        for (k, m) in victims {
            let key = chunk_key(sid, k.0, k.1);
            removed_keys.push(k);
            if m.max_ts < cutoff {
                deleted_rows += m.rows as u64;
                continue;
            }
            let bytes: Arc<[u8]> = match pending.get(&key) {
                Some(Some(b)) => b,
                Some(None) => continue,
                None => match m.loc {
                    Some((seg, off)) => Arc::from(self.chunks.read_at(seg, off, m.bytes as usize)?),
                    None => continue,
                },
            };
            let r = ChunkReader::new(&bytes)
                .map_err(|e| corrupt(format!("chunk {}: {e}", describe_chunk_key(&key))))?;
            let mut w = ChunkWriter::new(nd, ns);
            let mut err = None;
            r.for_each_row(|ts, d, s| {
                if ts >= cutoff && err.is_none() {
                    let strs: Vec<&str> = s.iter().map(String::as_str).collect();
                    if let Err(e) = w.push(ts, d, &strs) {
                        err = Some(e);
                    }
                }
            })?;
            if let Some(e) = err {
                return Err(e.into());
            }
            deleted_rows += (r.rows() - w.rows()) as u64;
            if let (Some(first), Some(lo), Some(hi)) = (w.first_ts(), w.min_ts(), w.max_ts()) {
                let tk = ts_key(first);
                let taken: Vec<(u64, u32)> = added
                    .iter()
                    .map(|a: &((u64, u32), ChunkMeta, Vec<u8>)| a.0)
                    .collect();
                let ctr = free_counter(st, tk, next_ctr, &taken);
                let enc = w.encode();
                let nm = ChunkMeta {
                    min_ts: lo,
                    max_ts: hi,
                    rows: w.rows() as u32,
                    bytes: enc.len() as u32,
                    loc: None,
                };
                added.push(((tk, ctr), nm, enc));
            }
        }
        for k in &removed_keys {
            pending.remove_chunk(chunk_key(sid, k.0, k.1));
        }
        let gone = st.remove_chunks(&removed_keys);
        for (k, m, enc) in added {
            pending.put_chunk(chunk_key(sid, k.0, k.1), enc);
            st.add_chunk(k, m);
        }
        for (_, m) in gone {
            if let Some((seg, _)) = m.loc {
                inner.count_seg(seg, false);
            }
        }
        Ok(deleted_rows * values)
    }
}

#[cfg(test)]
mod tests {
    use gma_core::event::dbl;

    use super::super::Agg;
    use super::*;
    use crate::store::testkit::*;

    #[tokio::test]
    async fn retention_deletes_exactly_the_old_rows() {
        let dir = tempfile::tempdir().unwrap();
        let reference;
        {
            let store = Store::open(dir.path(), opts(10)).unwrap();
            reference = fill(&store, 35, 35, 0);
            let net = series("net.rx", "a", 1, vec![dbl("b", "", "")]);
            let events: Vec<_> = (0..3)
                .map(|i| ev(&net, i + 1, i as i64 * SEC, &[1.0], &[]))
                .collect();
            store.append("p2", rp(1, 4), &events).unwrap();
            // Cutoff inside a sealed chunk: 13 rows × 3 fields × 2 sources.
            let n = store
                .delete_older_than(&Pattern::event("host.*").unwrap(), 13 * SEC)
                .unwrap();
            assert_eq!(n, 13 * 3 * 2);
            let kept: Vec<_> = reference.iter().filter(|r| r.1 >= 13 * SEC).cloned().collect();
            check_raw(&store, &kept, i64::MIN, i64::MAX);
            assert_eq!(
                store
                    .delete_older_than(&Pattern::event("host.*").unwrap(), 13 * SEC)
                    .unwrap(),
                0
            );
            // Cutoff inside the open rows (30..35): they are sealed, then cut.
            let n = store
                .delete_older_than(&Pattern::event("host.cpu").unwrap(), 32 * SEC)
                .unwrap();
            assert_eq!(n, (32 - 13) * 3 * 2);
            let s = store.stats();
            // The open rows left are net.rx's.
            assert_eq!(s.open_rows, 3);
            assert_eq!(s.samples, 3 * 3 * 2 + 3);
            // Other events untouched.
            assert_eq!(
                run(&store, &spec("net.rx", None, i64::MIN, i64::MAX, None, Agg::Raw))[0]
                    .ts
                    .len(),
                3
            );
            store.commit().await.unwrap();
        }
        let store = Store::open(dir.path(), opts(10)).unwrap();
        let kept: Vec<_> = reference.iter().filter(|r| r.1 >= 32 * SEC).cloned().collect();
        check_raw(&store, &kept, i64::MIN, i64::MAX);
        assert_eq!(store.stats().samples, 3 * 3 * 2 + 3);
        let all = store.series(&Pattern::event("host.cpu").unwrap(), None);
        assert!(all.iter().all(|s| s.samples == 3 && s.first_ts == 32 * SEC));
    }
}
