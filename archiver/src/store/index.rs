//! A stream's in-memory time index: its sealed chunks, by (first timestamp key, counter).
//!
//! It grows by one entry per sealed chunk for as long as the archive keeps the chunk (only
//! `[[retention]]` removes entries), so an entry must be small: a chunk not yet in the chunk log
//! (no location) sits in a small map until its checkpoint gives it one; then it is appended to
//! a packed byte string, each field a varint delta from the entry before (about 20 bytes per
//! entry at 10,000 simulated hosts, against about 75 for a `BTreeMap` entry of a 48-byte
//! [`ChunkMeta`]). Packed entries are read in the order they were appended (their seal order);
//! removing one rewrites the stream's packed string (retention only).

use std::collections::BTreeMap;

use super::layout::{ts_of_key, ChunkMeta};

/// A chunk's key within its stream: (first timestamp key, counter).
pub(super) type Key = (u64, u32);

#[derive(Debug, Default)]
pub(super) struct ChunkIndex {
    /// Chunks without a location yet (pending in memory).
    pending: BTreeMap<Key, ChunkMeta>,
    /// Located chunks, packed (see the module documentation).
    packed: Vec<u8>,
    /// Entries in `packed`.
    n_packed: usize,
    /// The last packed entry (the base of the next one's deltas).
    last: Last,
    /// The highest counter in `packed`: a counter above it names no packed chunk.
    max_ctr: Option<u32>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Last {
    tk: u64,
    ctr: u32,
    seg: u64,
    off: u64,
}

impl ChunkIndex {
    pub(super) fn len(&self) -> usize {
        self.pending.len() + self.n_packed
    }

    /// Adds a chunk (packed when it has a location). The caller keeps keys unique.
    pub(super) fn insert(&mut self, k: Key, m: ChunkMeta) {
        match m.loc {
            Some(_) => self.push_packed(k, m),
            None => {
                self.pending.insert(k, m);
            }
        }
    }

    /// Gives the pending chunk `k` its location (it moves to the packed entries). False when
    /// `k` is not pending (removed since, or located already).
    pub(super) fn locate(&mut self, k: Key, loc: (u64, u64)) -> bool {
        match self.pending.remove(&k) {
            Some(m) => {
                self.push_packed(k, ChunkMeta { loc: Some(loc), ..m });
                true
            }
            None => false,
        }
    }

    /// Whether `k` names a chunk. Cheap for a counter above every packed one (new counters
    /// only grow, see `free_counter`); otherwise reads the packed entries.
    pub(super) fn contains(&self, k: Key) -> bool {
        if self.pending.contains_key(&k) {
            return true;
        }
        match self.max_ctr {
            Some(max) if k.1 <= max => self.packed_iter().any(|(pk, _)| pk == k),
            _ => false,
        }
    }

    /// The chunk `k` (reads the packed entries when it is not pending).
    pub(super) fn get(&self, k: Key) -> Option<ChunkMeta> {
        if let Some(m) = self.pending.get(&k) {
            return Some(*m);
        }
        self.packed_iter().find(|(pk, _)| *pk == k).map(|(_, m)| m)
    }

    /// Every chunk: the packed ones in seal order, then the pending ones by key.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Key, ChunkMeta)> + '_ {
        self.packed_iter()
            .chain(self.pending.iter().map(|(k, m)| (*k, *m)))
    }

    /// Removes the chunks of `keys` (those it holds); returns what they were.
    pub(super) fn remove_all(&mut self, keys: &[Key]) -> Vec<(Key, ChunkMeta)> {
        let mut gone = Vec::new();
        for k in keys {
            if let Some(m) = self.pending.remove(k) {
                gone.push((*k, m));
            }
        }
        if gone.len() == keys.len() || self.n_packed == 0 {
            return gone;
        }
        let old = std::mem::take(&mut self.packed);
        let mut rest = ChunkIndex::default();
        for (k, m) in PackedIter::new(&old, self.n_packed) {
            if keys.contains(&k) {
                gone.push((k, m));
            } else {
                rest.push_packed(k, m);
            }
        }
        rest.packed.shrink_to_fit();
        self.packed = rest.packed;
        self.n_packed = rest.n_packed;
        self.last = rest.last;
        self.max_ctr = rest.max_ctr;
        gone
    }

    fn push_packed(&mut self, k: Key, m: ChunkMeta) {
        let (seg, off) = m.loc.unwrap_or_default();
        let b = &mut self.packed;
        put_i(b, k.0.wrapping_sub(self.last.tk) as i64);
        put_i(b, i64::from(k.1.wrapping_sub(self.last.ctr) as i32));
        put_i(b, m.min_ts.wrapping_sub(ts_of_key(k.0)));
        put_i(b, m.max_ts.wrapping_sub(m.min_ts));
        put_u(b, u64::from(m.rows));
        put_u(b, u64::from(m.bytes));
        put_i(b, seg.wrapping_sub(self.last.seg) as i64);
        put_i(b, off.wrapping_sub(self.last.off) as i64);
        self.last = Last {
            tk: k.0,
            ctr: k.1,
            seg,
            off,
        };
        self.n_packed += 1;
        self.max_ctr = Some(self.max_ctr.map_or(k.1, |c| c.max(k.1)));
    }

    fn packed_iter(&self) -> PackedIter<'_> {
        PackedIter::new(&self.packed, self.n_packed)
    }
}

struct PackedIter<'a> {
    b: &'a [u8],
    left: usize,
    last: Last,
}

impl<'a> PackedIter<'a> {
    fn new(b: &'a [u8], n: usize) -> Self {
        PackedIter {
            b,
            left: n,
            last: Last::default(),
        }
    }

    fn next_entry(&mut self) -> Option<(Key, ChunkMeta)> {
        let tk = self.last.tk.wrapping_add(get_i(&mut self.b)? as u64);
        let ctr = self.last.ctr.wrapping_add(get_i(&mut self.b)? as i32 as u32);
        let min_ts = ts_of_key(tk).wrapping_add(get_i(&mut self.b)?);
        let max_ts = min_ts.wrapping_add(get_i(&mut self.b)?);
        let rows = u32::try_from(get_u(&mut self.b)?).ok()?;
        let bytes = u32::try_from(get_u(&mut self.b)?).ok()?;
        let seg = self.last.seg.wrapping_add(get_i(&mut self.b)? as u64);
        let off = self.last.off.wrapping_add(get_i(&mut self.b)? as u64);
        self.last = Last { tk, ctr, seg, off };
        Some((
            (tk, ctr),
            ChunkMeta {
                min_ts,
                max_ts,
                rows,
                bytes,
                loc: Some((seg, off)),
            },
        ))
    }
}

impl Iterator for PackedIter<'_> {
    type Item = (Key, ChunkMeta);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Written by `push_packed` only: an entry that does not decode ends the iteration.
        let e = self.next_entry();
        if e.is_none() {
            self.left = 0;
        }
        e
    }
}

fn put_u(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn put_i(b: &mut Vec<u8>, v: i64) {
    put_u(b, ((v << 1) ^ (v >> 63)) as u64);
}

fn get_u(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&x, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(x & 0x7f) << shift;
        if x < 0x80 {
            return Some(v);
        }
    }
    None
}

fn get_i(b: &mut &[u8]) -> Option<i64> {
    let u = get_u(b)?;
    Some(((u >> 1) as i64) ^ -((u & 1) as i64))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::layout::ts_key;
    use super::*;

    fn meta(min_ts: i64, max_ts: i64, rows: u32, bytes: u32, loc: Option<(u64, u64)>) -> ChunkMeta {
        ChunkMeta {
            min_ts,
            max_ts,
            rows,
            bytes,
            loc,
        }
    }

    proptest! {
        /// Whatever goes in (extreme values included) comes out, pending or packed, and
        /// removing any subset leaves exactly the rest.
        #[test]
        fn entries_round_trip(
            entries in proptest::collection::vec(
                (any::<i64>(), any::<u32>(), any::<i64>(), any::<i64>(), any::<u32>(), any::<u32>(),
                 proptest::option::of((any::<u64>(), any::<u64>()))),
                0..40,
            ),
            drop_mask in any::<u64>(),
        ) {
            let mut idx = ChunkIndex::default();
            let mut want = BTreeMap::new();
            for (i, (first, ctr, lo, hi, rows, bytes, loc)) in entries.into_iter().enumerate() {
                // Unique keys, as the store keeps them.
                let k = (ts_key(first), ctr.wrapping_add(i as u32 * 1_000_003));
                if want.contains_key(&k) {
                    continue;
                }
                let m = meta(lo, hi, rows, bytes, loc);
                idx.insert(k, m);
                want.insert(k, m);
            }
            let got: BTreeMap<_, _> = idx.iter().collect();
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(idx.len(), want.len());
            for (k, m) in &want {
                prop_assert_eq!(idx.get(*k), Some(*m));
                prop_assert!(idx.contains(*k));
            }
            let drop: Vec<Key> = want.keys().enumerate().filter(|(i, _)| drop_mask >> (i % 64) & 1 == 1).map(|(_, k)| *k).collect();
            let gone = idx.remove_all(&drop);
            prop_assert_eq!(gone.len(), drop.len());
            for k in &drop {
                want.remove(k);
            }
            let got: BTreeMap<_, _> = idx.iter().collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_located_chunk_moves_to_the_packed_entries() {
        let mut idx = ChunkIndex::default();
        let k = (ts_key(1_000), 7);
        idx.insert(k, meta(1_000, 2_000, 10, 300, None));
        assert!(idx.locate(k, (3, 4_096)));
        assert!(!idx.locate(k, (3, 4_096)), "located once");
        assert_eq!(idx.get(k), Some(meta(1_000, 2_000, 10, 300, Some((3, 4_096)))));
        assert!(
            !idx.contains((ts_key(1_000), 8)),
            "a counter above every packed one"
        );
    }

    /// What bounds the index's growth per checkpoint: a stream's located entry, as the
    /// simulated hosts make them (a chunk every 20 s of 20 rows, 12 doubles, a few hundred bytes,
    /// in a 64 MiB segment), costs at most 24 bytes.
    #[test]
    fn a_located_entry_is_small() {
        let mut idx = ChunkIndex::default();
        let n = 1_000u32;
        for i in 0..n {
            let t0 = 1_800_000_000_000_000_000i64 + i64::from(i) * 20_000_000_000;
            let k = (ts_key(t0), 40_010 * i + 17);
            idx.insert(
                k,
                meta(
                    t0,
                    t0 + 19_000_000_000,
                    20,
                    900,
                    Some((u64::from(i / 70), u64::from(i % 70) * 950_000)),
                ),
            );
        }
        let per = idx.packed.len() as f64 / f64::from(n);
        assert!(per <= 24.0, "{per} bytes per packed entry");
    }
}
