//! The record codecs: write-ahead records and chunk-log (checkpoint) records.

use gma_consumer::stream::ResumePoint;
use gma_core::codec::OwnedEvent;

use super::layout::{figures, ChunkMeta, StreamMeta};
use super::{corrupt, ChunkKey, PendingChunk, StoreError};
use crate::chunk::varint_len;

/// Format byte of a write-ahead record.
pub(super) const WAL_FORMAT: u8 = 2;
/// Format byte of a chunk-log (checkpoint) record.
pub(super) const CHECKPOINT_FORMAT: u8 = 1;

// ---- chunk-log records ----

/// A decoded chunk-log (checkpoint) record.
pub(super) struct Checkpoint {
    pub(super) next_wal: u64,
    pub(super) oldest: u64,
    pub(super) streams: Vec<StreamMeta>,
    pub(super) resume: Vec<(String, ResumePoint)>,
    /// Put (with figures and location) or removed.
    pub(super) chunks: Vec<(ChunkKey, Option<ChunkMeta>)>,
}

/// One checkpoint: `format u8 | next_wal u64 | oldest segment u64 | n varint, (len varint,
/// stream entry JSON)* | n varint, (len varint, producer, epoch u64, next seq u64)* | n varint,
/// (chunk key 17 bytes, 1 + len varint + chunk bytes | 0)*` (integers LE). `dict` holds each
/// stream entry already encoded ([`encode_meta`]: the checkpoint writes the same bytes into
/// sled). Returns the payload, allocated once at its exact size (at 40,000 streams it is tens
/// of MB: growing it by doubling held up to twice that), and, per operation, the offset of its
/// chunk bytes in it.
pub(super) fn encode_checkpoint(
    next_wal: u64,
    oldest: u64,
    dict: &[Vec<u8>],
    resume: &[(String, ResumePoint)],
    ops: &[(ChunkKey, PendingChunk)],
) -> (Vec<u8>, Vec<Option<u64>>) {
    let count = |n: usize| varint_len(n as u64);
    let counted = |n: usize| count(n) + n;
    let size = 1
        + 16
        + count(dict.len())
        + dict.iter().map(|m| counted(m.len())).sum::<usize>()
        + count(resume.len())
        + resume.iter().map(|(p, _)| counted(p.len()) + 16).sum::<usize>()
        + count(ops.len())
        + ops
            .iter()
            .map(|(k, b)| k.len() + 1 + b.as_ref().map_or(0, |b| counted(b.len())))
            .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(CHECKPOINT_FORMAT);
    out.extend_from_slice(&next_wal.to_le_bytes());
    out.extend_from_slice(&oldest.to_le_bytes());
    put_varint(&mut out, dict.len() as u64);
    for m in dict {
        put_bytes(&mut out, m);
    }
    put_varint(&mut out, resume.len() as u64);
    for (p, rp) in resume {
        put_bytes(&mut out, p.as_bytes());
        out.extend_from_slice(&rp.epoch.to_le_bytes());
        out.extend_from_slice(&rp.next_seq.to_le_bytes());
    }
    put_varint(&mut out, ops.len() as u64);
    let mut offsets = Vec::with_capacity(ops.len());
    for (k, op) in ops {
        out.extend_from_slice(k);
        match op {
            Some(b) => {
                out.push(1);
                put_varint(&mut out, b.len() as u64);
                offsets.push(Some(out.len() as u64));
                out.extend_from_slice(b);
            }
            None => {
                out.push(0);
                offsets.push(None);
            }
        }
    }
    debug_assert_eq!(out.len(), size, "checkpoint record size");
    (out, offsets)
}

pub(super) fn decode_checkpoint(b: &[u8], pos: gma_durable::Pos) -> Result<Checkpoint, StoreError> {
    let mut c = Cursor { b, at: 0 };
    let format = c.take(1)?[0];
    if format != CHECKPOINT_FORMAT {
        return Err(corrupt(format!("unknown checkpoint format {format}")));
    }
    let le = |c: &mut Cursor<'_>| -> Result<u64, StoreError> {
        let a: [u8; 8] = c.take(8)?.try_into().map_err(|_| corrupt("short number"))?;
        Ok(u64::from_le_bytes(a))
    };
    let next_wal = le(&mut c)?;
    let oldest = le(&mut c)?;
    let n = c.varint()?;
    let mut streams = Vec::new();
    for _ in 0..n {
        let len = usize::try_from(c.varint()?).map_err(|_| corrupt("entry length"))?;
        let m: StreamMeta =
            serde_json::from_slice(c.take(len)?).map_err(|e| corrupt(format!("stream entry: {e}")))?;
        streams.push(m);
    }
    let n = c.varint()?;
    let mut resume = Vec::new();
    for _ in 0..n {
        let len = usize::try_from(c.varint()?).map_err(|_| corrupt("producer length"))?;
        let p = std::str::from_utf8(c.take(len)?)
            .map_err(|_| corrupt("producer id not UTF-8"))?
            .to_string();
        let (epoch, next_seq) = (le(&mut c)?, le(&mut c)?);
        resume.push((p, ResumePoint { epoch, next_seq }));
    }
    let n = c.varint()?;
    let mut chunks = Vec::new();
    for _ in 0..n {
        let k: ChunkKey = c.take(17)?.try_into().map_err(|_| corrupt("chunk key"))?;
        match c.take(1)?[0] {
            1 => {
                let len = usize::try_from(c.varint()?).map_err(|_| corrupt("chunk length"))?;
                let off = c.at as u64;
                let m = ChunkMeta {
                    loc: Some((pos.segment, pos.offset + off)),
                    ..figures(c.take(len)?)?
                };
                chunks.push((k, Some(m)));
            }
            0 => chunks.push((k, None)),
            t => return Err(corrupt(format!("unknown chunk operation {t}"))),
        }
    }
    if c.at != b.len() {
        return Err(corrupt(format!("{} trailing bytes", b.len() - c.at)));
    }
    Ok(Checkpoint {
        next_wal,
        oldest,
        streams,
        resume,
        chunks,
    })
}

// ---- write-ahead records ----

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub(super) fn encode_record(
    producer: &str,
    resume: ResumePoint,
    defs: &[Vec<u8>],
    events: &[(u32, &OwnedEvent)],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + producer.len() + events.len() * 24);
    out.push(WAL_FORMAT);
    put_bytes(&mut out, producer.as_bytes());
    out.extend_from_slice(&resume.epoch.to_le_bytes());
    out.extend_from_slice(&resume.next_seq.to_le_bytes());
    put_varint(&mut out, defs.len() as u64);
    for d in defs {
        put_bytes(&mut out, d);
    }
    put_varint(&mut out, events.len() as u64);
    let mut prev = 0i64;
    for (sid, e) in events {
        put_varint(&mut out, *sid as u64);
        put_varint(&mut out, zigzag(e.timestamp_ns.wrapping_sub(prev)));
        prev = e.timestamp_ns;
        for v in &e.numbers {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for s in &e.strings {
            put_bytes(&mut out, s.as_bytes());
        }
    }
    out
}

pub(super) struct Cursor<'a> {
    pub(super) b: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| corrupt("write-ahead record truncated"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(super) fn varint(&mut self) -> Result<u64, StoreError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("write-ahead record: varint too long"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use gma_core::event::{dbl, text};

    use super::super::layout::{encode_meta, ts_key, ts_of_key, FieldKind, FieldMeta};
    use super::super::recover::replay_record;
    use super::super::Stream;
    use crate::chunk::ChunkReader;

    use super::*;
    use crate::store::testkit::*;

    #[test]
    fn wal_records_round_trip() {
        let s = series(
            "a.b",
            "x",
            1,
            vec![dbl("d", "", ""), text("t", ""), dbl("e", "", "")],
        );
        let events = [
            ev(&s, 1, -5, &[1.5, f64::NAN], &["héllo"]),
            ev(&s, 2, i64::MAX, &[-0.0, f64::INFINITY], &[""]),
            ev(&s, 3, i64::MIN, &[2.0, 3.0], &["x"]),
        ];
        let meta = StreamMeta {
            id: 0,
            name: "a.b".into(),
            source: "x".into(),
            schema_version: 1,
            fields: vec![
                FieldMeta {
                    name: "d".into(),
                    kind: FieldKind::Double,
                    unit: String::new(),
                },
                FieldMeta {
                    name: "t".into(),
                    kind: FieldKind::String,
                    unit: String::new(),
                },
                FieldMeta {
                    name: "e".into(),
                    kind: FieldKind::Double,
                    unit: String::new(),
                },
            ],
            sealed_wal: 0,
            sealed_rows: 0,
        };
        let rec = encode_record(
            "prod-1",
            rp(3, 10),
            &[encode_meta(&meta).unwrap()],
            &events.iter().map(|e| (0u32, e)).collect::<Vec<_>>(),
        );
        // The stream is defined by the record itself (its dictionary entry may not have
        // reached sled before a crash).
        let mut streams = BTreeMap::new();
        let mut pos = HashMap::new();
        let out = replay_record(1, &rec, &mut streams, &mut pos, None).unwrap();
        assert_eq!(
            (out.producer.as_str(), out.resume, out.pushed),
            ("prod-1", rp(3, 10), 3)
        );
        assert_eq!(out.created, vec![meta.clone()]);
        // Known streams are not redefined.
        let mut again = BTreeMap::from([(0, Stream::new(meta.clone()))]);
        assert!(replay_record(1, &rec, &mut again, &mut HashMap::new(), None)
            .unwrap()
            .created
            .is_empty());
        let bytes = streams[&0].open.encode();
        let r = ChunkReader::new(&bytes).unwrap();
        let mut rows = Vec::new();
        r.for_each_row(|ts, d, s| rows.push((ts, d.to_vec(), s.to_vec())))
            .unwrap();
        assert_eq!(rows[0].0, -5);
        assert_eq!(rows[1].0, i64::MAX);
        assert_eq!(rows[2].0, i64::MIN);
        assert_eq!(rows[0].2, vec!["héllo".to_string()]);
        assert!(rows[0].1[1].is_nan());
        assert_eq!(rows[1].1[1], f64::INFINITY);
        // Truncated or padded records are corrupt, never a panic.
        for cut in 0..rec.len() {
            let mut streams = BTreeMap::from([(0, Stream::new(meta.clone()))]);
            assert!(replay_record(1, &rec[..cut], &mut streams, &mut HashMap::new(), None).is_err());
        }
        let mut padded = rec.clone();
        padded.push(0);
        let mut streams = BTreeMap::from([(0, Stream::new(meta.clone()))]);
        assert!(replay_record(1, &padded, &mut streams, &mut HashMap::new(), None).is_err());
        assert_eq!(ts_of_key(ts_key(-3)), -3);
        assert!(ts_key(-1) < ts_key(0) && ts_key(i64::MIN) < ts_key(i64::MAX));
    }
}
