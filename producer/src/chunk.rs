//! A fan-out group's shared chunk, encoded in one pass straight to `EventBatch` bytes.
//!
//! [`gma_core::codec::BatchEncoder`] builds a `pb::EventBatch` (one `Vec` per column) that
//! prost then measures and encodes: every varint is written three times (pushed, sized,
//! encoded) and every value copied twice. A shared chunk declares no series, carries no marks,
//! gaps or conflation, so its bytes can be written as the events are read: each packed column
//! goes into its own buffer as varints (or little-endian doubles) once, and [`ChunkWriter::finish`]
//! joins them behind their tags and lengths. The bytes are exactly prost's encoding of the
//! `EventBatch` a shared `BatchEncoder` would build (fields in tag order, packed repeated
//! scalars, zero values left out): the wire does not change, a test checks byte equality.

use prost::bytes::{BufMut, Bytes};
use prost::encoding::{encode_varint, encoded_len_varint};

/// `EventBatch` field tags with their wire types, as prost writes them.
const FIRST_SEQ: u8 = 2 << 3;
const FIRST_TIMESTAMP: u8 = 3 << 3;
const SERIES_IDS: u8 = (4 << 3) | 2;
const SEQ_DELTAS: u8 = (5 << 3) | 2;
const TS_DELTAS: u8 = (6 << 3) | 2;
const NUMBERS: u8 = (7 << 3) | 2;
const STRINGS: u8 = (8 << 3) | 2;
const EPOCH: u8 = 11 << 3;

/// The columns of one chunk being written.
#[derive(Debug, Default)]
pub struct ChunkWriter {
    count: usize,
    first_seq: u64,
    first_ts: i64,
    last_seq: u64,
    last_ts: i64,
    ids: Vec<u8>,
    seq_deltas: Vec<u8>,
    ts_deltas: Vec<u8>,
    numbers: Vec<u8>,
    /// Field 8 entries, tag and length included (one per string value).
    strings: Vec<u8>,
}

/// A varint onto `buf`; most of a chunk's are one byte (small series ids, seq deltas of 1,
/// equal timestamps), written without prost's byte-by-byte loop.
#[inline]
fn put_varint(v: u64, buf: &mut Vec<u8>) {
    if v < 0x80 {
        buf.push(v as u8);
    } else {
        encode_varint(v, buf);
    }
}

impl ChunkWriter {
    /// A writer sized for about `events` events of `doubles` numbers each.
    pub fn with_capacity(events: usize, doubles: usize) -> ChunkWriter {
        ChunkWriter {
            ids: Vec::with_capacity(events * 2),
            seq_deltas: Vec::with_capacity(events),
            ts_deltas: Vec::with_capacity(events * 2),
            numbers: Vec::with_capacity(events * doubles * 8),
            ..ChunkWriter::default()
        }
    }

    /// Events written so far.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends one event of series `id`; `seq` must be greater than the previous event's.
    pub fn push(&mut self, id: u32, seq: u64, ts: i64, numbers: &[f64], strings: &[String]) {
        let (dseq, dts) = if self.count == 0 {
            self.first_seq = seq;
            self.first_ts = ts;
            (0, 0)
        } else {
            (seq.saturating_sub(self.last_seq), ts.wrapping_sub(self.last_ts))
        };
        self.last_seq = seq;
        self.last_ts = ts;
        put_varint(u64::from(id), &mut self.ids);
        put_varint(dseq, &mut self.seq_deltas);
        // sint64: zigzag.
        put_varint(((dts << 1) ^ (dts >> 63)) as u64, &mut self.ts_deltas);
        self.numbers.reserve(numbers.len() * 8);
        for n in numbers {
            self.numbers.extend_from_slice(&n.to_le_bytes());
        }
        for s in strings {
            self.strings.push(STRINGS);
            encode_varint(s.len() as u64, &mut self.strings);
            self.strings.extend_from_slice(s.as_bytes());
        }
        self.count += 1;
    }

    /// The encoded `EventBatch` of the events written (empty bytes when there are none); the
    /// writer is then empty again, its buffers kept for the next chunk.
    pub fn finish(&mut self, epoch: u64) -> Bytes {
        if self.count == 0 {
            return Bytes::new();
        }
        let packed = |v: &Vec<u8>| {
            if v.is_empty() {
                0
            } else {
                1 + encoded_len_varint(v.len() as u64) + v.len()
            }
        };
        let scalar = |v: u64| {
            if v == 0 {
                0
            } else {
                1 + encoded_len_varint(v)
            }
        };
        let len = scalar(self.first_seq)
            + scalar(self.first_ts as u64)
            + packed(&self.ids)
            + packed(&self.seq_deltas)
            + packed(&self.ts_deltas)
            + packed(&self.numbers)
            + self.strings.len()
            + scalar(epoch);
        let mut out = Vec::with_capacity(len);
        let put_scalar = |out: &mut Vec<u8>, tag: u8, v: u64| {
            if v != 0 {
                out.put_u8(tag);
                encode_varint(v, out);
            }
        };
        let put_packed = |out: &mut Vec<u8>, tag: u8, v: &[u8]| {
            if !v.is_empty() {
                out.put_u8(tag);
                encode_varint(v.len() as u64, out);
                out.extend_from_slice(v);
            }
        };
        put_scalar(&mut out, FIRST_SEQ, self.first_seq);
        // int64 (not sint64): the two's complement bits as a varint.
        put_scalar(&mut out, FIRST_TIMESTAMP, self.first_ts as u64);
        put_packed(&mut out, SERIES_IDS, &self.ids);
        put_packed(&mut out, SEQ_DELTAS, &self.seq_deltas);
        put_packed(&mut out, TS_DELTAS, &self.ts_deltas);
        put_packed(&mut out, NUMBERS, &self.numbers);
        out.extend_from_slice(&self.strings);
        put_scalar(&mut out, EPOCH, epoch);
        debug_assert_eq!(out.len(), len);
        self.count = 0;
        for v in [
            &mut self.ids,
            &mut self.seq_deltas,
            &mut self.ts_deltas,
            &mut self.numbers,
            &mut self.strings,
        ] {
            v.clear();
        }
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::codec::{BatchDecoder, BatchEncoder, SeriesInfo};
    use gma_core::event::dbl;
    use gma_proto::v1 as pb;
    use prost::Message;

    fn schema(name: &str, doubles: usize, strings: usize) -> pb::EventSchema {
        let mut fields: Vec<pb::FieldSpec> = (0..doubles).map(|i| dbl(&format!("d{i}"), "", "")).collect();
        for i in 0..strings {
            fields.push(pb::FieldSpec {
                name: format!("s{i}"),
                r#type: pb::FieldType::String as i32,
                ..Default::default()
            });
        }
        pb::EventSchema {
            name: name.into(),
            version: 1,
            fields,
            description: String::new(),
        }
    }

    /// A small deterministic generator (xorshift): the cases differ, the test repeats.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn a_chunk_is_byte_for_byte_what_a_shared_batch_encoder_and_prost_write() {
        let series = [
            SeriesInfo::new(0, "a.x", "s0", &schema("a.x", 3, 0)),
            SeriesInfo::new(7, "b.x", "s1", &schema("b.x", 1, 2)),
            SeriesInfo::new(300, "c.x", "s2", &schema("c.x", 0, 1)),
            SeriesInfo::new(70_000, "d.x", "s3", &schema("d.x", 2, 0)),
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // One writer for every case: each chunk starts clean after the previous finish.
        let mut w = ChunkWriter::with_capacity(8, 3);
        for case in 0..300 {
            let events = (rng.next() % 40) as usize;
            let epoch = if case % 5 == 0 {
                0
            } else {
                rng.next() >> (rng.next() % 64)
            };
            let mut seq = if case % 7 == 0 { 0 } else { rng.next() >> 20 };
            let mut ts: i64 = match case % 3 {
                0 => 0,
                1 => -(rng.next() as i64 >> 3),
                _ => (rng.next() >> 2) as i64,
            };
            let mut enc = BatchEncoder::shared();
            for _ in 0..events {
                seq += 1 + rng.next() % if case % 2 == 0 { 3 } else { 1 << 40 };
                ts = ts.wrapping_add((rng.next() as i64) >> (rng.next() % 64));
                let s = &series[(rng.next() % 4) as usize];
                let numbers: Vec<f64> = (0..s.layout.doubles)
                    .map(|_| match rng.next() % 4 {
                        0 => 0.0,
                        1 => -1.5,
                        2 => f64::NAN,
                        _ => rng.next() as f64 / 3.0,
                    })
                    .collect();
                let strings: Vec<String> = (0..s.layout.strings)
                    .map(|_| "é".repeat((rng.next() % 200) as usize))
                    .collect();
                w.push(s.id, seq, ts, &numbers, &strings);
                enc.push(s, seq, ts, &numbers, &strings);
            }
            assert_eq!(w.len(), events);
            let want = if events == 0 {
                Vec::new()
            } else {
                enc.finish(epoch).encode_to_vec()
            };
            let got = w.finish(epoch);
            assert_eq!(&got[..], &want[..], "case {case}: {events} events");
            if events > 0 {
                // And a consumer that has the declarations decodes it.
                let mut d = BatchDecoder::new();
                let decls = pb::EventBatch {
                    series: series.iter().map(SeriesInfo::decl).collect(),
                    ..Default::default()
                };
                d.decode_each(&decls, |_| {}).expect("declarations");
                let batch = pb::EventBatch::decode(got).expect("decodes");
                assert_eq!(d.decode_each(&batch, |_| {}), Ok(events));
            }
        }
    }
}
