//! The compact `EventBatch` encoding.
//!
//! A stream declares each series (name, source, schema fields) once with a [`pb::SeriesDecl`];
//! events then carry the series id, delta-coded seq and timestamp, and their values as packed
//! doubles with strings apart. [`BatchEncoder`] keeps, per stream, which series the peer has
//! already seen; [`BatchDecoder`] keeps the declarations it has received and checks every batch
//! (unknown series, short value arrays, non-increasing seqs are errors, never panics).

use std::sync::Arc;

use gma_proto::v1 as pb;

use crate::event::{to_json, Layout};

/// Most series one decoder remembers; a peer declaring more is refused (bounded memory).
pub const MAX_SERIES_PER_STREAM: usize = 1_000_000;

/// A series: one (event name, source) pair of a producer, with its schema layout.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesInfo {
    pub id: u32,
    pub name: String,
    pub source: String,
    pub schema_version: u32,
    pub fields: Arc<[pb::FieldSpec]>,
    pub layout: Layout,
}

impl SeriesInfo {
    pub fn new(id: u32, name: &str, source: &str, schema: &pb::EventSchema) -> SeriesInfo {
        SeriesInfo {
            id,
            name: name.to_string(),
            source: source.to_string(),
            schema_version: schema.version,
            fields: schema.fields.clone().into(),
            layout: Layout::of(&schema.fields),
        }
    }

    pub fn decl(&self) -> pb::SeriesDecl {
        pb::SeriesDecl {
            id: self.id,
            name: self.name.clone(),
            source: self.source.clone(),
            schema_version: self.schema_version,
            fields: self.fields.to_vec(),
        }
    }
}

/// A threshold-crossing mark on a delivered event (`EventBatch.marks`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mark {
    #[default]
    None,
    /// The subscription's `when` expression became true at this event.
    Enter,
    /// The expression became false at this event.
    Leave,
}

impl Mark {
    pub fn code(self) -> u32 {
        match self {
            Mark::None => 0,
            Mark::Enter => 1,
            Mark::Leave => 2,
        }
    }

    pub fn from_code(code: u32) -> Option<Mark> {
        match code {
            0 => Some(Mark::None),
            1 => Some(Mark::Enter),
            2 => Some(Mark::Leave),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mark::None => "",
            Mark::Enter => "enter",
            Mark::Leave => "leave",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("malformed batch: {0}")]
    Malformed(String),
}

fn malformed(m: impl Into<String>) -> CodecError {
    CodecError::Malformed(m.into())
}

/// Builds batches for one stream.
///
/// Series ids are the producer's own (stable for a producer run), so batches built by
/// different encoders of one producer can be mixed on a stream: a shared encoder
/// ([`BatchEncoder::shared`]) declares nothing and each stream sends the declarations it is
/// missing first ([`BatchEncoder::declare_missing`]).
#[derive(Debug, Default)]
pub struct BatchEncoder {
    declared: Vec<bool>,
    /// Never declare series (batches shared by many streams).
    shared: bool,
    batch: pb::EventBatch,
    last_seq: u64,
    last_ts: i64,
    count: usize,
}

impl BatchEncoder {
    pub fn new() -> BatchEncoder {
        BatchEncoder::default()
    }

    /// An encoder for batches sent on many streams: it declares no series; the sender makes
    /// sure each stream has the declarations first.
    pub fn shared() -> BatchEncoder {
        BatchEncoder {
            shared: true,
            ..BatchEncoder::default()
        }
    }

    /// Marks `series` declared on this stream, returning the declarations not yet sent.
    pub fn declare_missing<'a>(
        &mut self,
        series: impl IntoIterator<Item = &'a SeriesInfo>,
    ) -> Vec<pb::SeriesDecl> {
        let mut out = Vec::new();
        for s in series {
            let idx = s.id as usize;
            if idx >= self.declared.len() {
                self.declared.resize(idx + 1, false);
            }
            if !self.declared[idx] {
                self.declared[idx] = true;
                out.push(s.decl());
            }
        }
        out
    }

    /// Counts events replaced by newer values of their series (latest policy).
    pub fn conflated(&mut self, n: u64) {
        self.batch.conflated += n;
    }

    /// Number of events in the batch being built.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.batch.gaps.is_empty() && self.batch.dropped == 0 && self.batch.conflated == 0
    }

    /// Appends one event. `seq` must be greater than the previous event's.
    pub fn push(&mut self, series: &SeriesInfo, seq: u64, ts: i64, numbers: &[f64], strings: &[String]) {
        self.push_marked(series, seq, ts, numbers, strings, Mark::None)
    }

    /// Appends one event with a threshold-crossing mark.
    pub fn push_marked(
        &mut self,
        series: &SeriesInfo,
        seq: u64,
        ts: i64,
        numbers: &[f64],
        strings: &[String],
        mark: Mark,
    ) {
        if mark != Mark::None && self.batch.marks.len() < self.count {
            // Marks are sent only when some event of the batch has one.
            self.batch.marks.resize(self.count, 0);
        }
        if mark != Mark::None || !self.batch.marks.is_empty() {
            self.batch.marks.push(mark.code());
        }
        if !self.shared {
            let idx = series.id as usize;
            if idx >= self.declared.len() {
                self.declared.resize(idx + 1, false);
            }
            if !self.declared[idx] {
                self.declared[idx] = true;
                self.batch.series.push(series.decl());
            }
        }
        if self.count == 0 {
            self.batch.first_seq = seq;
            self.batch.first_timestamp_ns = ts;
            self.batch.seq_deltas.push(0);
            self.batch.ts_deltas.push(0);
        } else {
            self.batch.seq_deltas.push(seq.saturating_sub(self.last_seq));
            self.batch.ts_deltas.push(ts.wrapping_sub(self.last_ts));
        }
        self.last_seq = seq;
        self.last_ts = ts;
        self.batch.series_ids.push(series.id);
        self.batch.numbers.extend_from_slice(numbers);
        self.batch.strings.extend(strings.iter().cloned());
        self.count += 1;
    }

    /// Records events that will never be delivered on this stream.
    pub fn gap(&mut self, from_seq: u64, to_seq: u64, dropped: u64, reason: &str) {
        self.batch.dropped += dropped;
        self.batch.gaps.push(pb::Gap {
            from_seq,
            to_seq,
            dropped,
            reason: reason.to_string(),
        });
    }

    /// Takes the batch built so far and starts a new one.
    pub fn finish(&mut self, epoch: u64) -> pb::EventBatch {
        self.count = 0;
        let mut b = std::mem::take(&mut self.batch);
        b.epoch = epoch;
        b
    }
}

/// One event of a decoded batch, borrowing its values from the batch.
#[derive(Debug, Clone, Copy)]
pub struct EventRef<'a> {
    /// The series, shared: [`EventRef::to_owned_event`] clones this `Arc` (no allocation), so
    /// every event of one series decoded by one [`BatchDecoder`] points at the same
    /// [`SeriesInfo`].
    pub series: &'a Arc<SeriesInfo>,
    pub seq: u64,
    pub timestamp_ns: i64,
    pub numbers: &'a [f64],
    pub strings: &'a [String],
    pub mark: Mark,
}

impl<'a> EventRef<'a> {
    /// The CLI's JSON line; a marked event gets `"crossing":"enter"|"leave"`.
    pub fn to_json(&self) -> String {
        let mut out = to_json(
            &self.series.name,
            &self.series.source,
            self.timestamp_ns,
            self.seq,
            &self.series.fields,
            self.numbers,
            self.strings,
        );
        if self.mark != Mark::None {
            out.pop();
            out.push_str(",\"crossing\":\"");
            out.push_str(self.mark.as_str());
            out.push_str("\"}");
        }
        out
    }

    /// The value of the double field `field`, if the schema has it.
    pub fn number(&self, field: &str) -> Option<f64> {
        let mut i = 0;
        for f in self.series.fields.iter() {
            if f.r#type() != pb::FieldType::String {
                if f.name == field {
                    return self.numbers.get(i).copied();
                }
                i += 1;
            }
        }
        None
    }

    /// The value of the string field `field`, if the schema has it.
    pub fn text(&self, field: &str) -> Option<&'a str> {
        let mut i = 0;
        for f in self.series.fields.iter() {
            if f.r#type() == pb::FieldType::String {
                if f.name == field {
                    return self.strings.get(i).map(String::as_str);
                }
                i += 1;
            }
        }
        None
    }

    /// The event with its values copied; the series is shared (an `Arc` clone).
    pub fn to_owned_event(&self) -> OwnedEvent {
        OwnedEvent {
            series: Arc::clone(self.series),
            seq: self.seq,
            timestamp_ns: self.timestamp_ns,
            numbers: self.numbers.to_vec(),
            strings: self.strings.to_vec(),
            mark: self.mark,
        }
    }
}

/// An owned decoded event.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedEvent {
    pub series: Arc<SeriesInfo>,
    pub seq: u64,
    pub timestamp_ns: i64,
    pub numbers: Vec<f64>,
    pub strings: Vec<String>,
    pub mark: Mark,
}

impl OwnedEvent {
    pub fn as_ref(&self) -> EventRef<'_> {
        EventRef {
            series: &self.series,
            seq: self.seq,
            timestamp_ns: self.timestamp_ns,
            numbers: &self.numbers,
            strings: &self.strings,
            mark: self.mark,
        }
    }
}

/// Reads an encoded `gma.v1.EventBatch` into `batch`, as `prost::Message::merge` would
/// (cleared first, so it is `decode`; the columns' memory is kept from one batch to the next).
///
/// The event columns (series ids, seq and timestamp deltas, doubles, marks), almost every byte
/// of a batch, are read straight from the slice: one loop per packed column, eight one-byte
/// varints at a time where a word holds them, and the doubles copied as little-endian words,
/// where prost reads them through `Buf` (a bounds check and a buffer advance per value). Every
/// other field (the declarations, gaps, strings, scalars, an unpacked column, unknown fields)
/// goes to prost's own field decoder, so what is accepted and what is refused is prost's (a
/// property test below checks both on arbitrary bytes).
pub fn read_batch(batch: &mut pb::EventBatch, mut bytes: &[u8]) -> Result<(), CodecError> {
    use prost::encoding::{decode_key, decode_varint, DecodeContext, WireType};
    use prost::Message;
    batch.clear();
    let bad = |e: prost::DecodeError| malformed(format!("undecodable EventBatch: {e}"));
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes).map_err(bad)?;
        if wire_type == WireType::LengthDelimited && matches!(tag, 4 | 5 | 6 | 7 | 12) {
            let len = decode_varint(&mut bytes).map_err(bad)?;
            let len = usize::try_from(len)
                .ok()
                .filter(|l| *l <= bytes.len())
                .ok_or_else(|| malformed("undecodable EventBatch: a column runs past the end"))?;
            let (col, rest) = bytes.split_at(len);
            bytes = rest;
            match tag {
                4 => packed_varints(col, &mut batch.series_ids, |v| v as u32)?,
                5 => packed_varints(col, &mut batch.seq_deltas, |v| v)?,
                6 => packed_varints(col, &mut batch.ts_deltas, |v| {
                    ((v >> 1) as i64) ^ -((v & 1) as i64)
                })?,
                7 => packed_doubles(col, &mut batch.numbers)?,
                _ => packed_varints(col, &mut batch.marks, |v| v as u32)?,
            }
            continue;
        }
        // Prost's decoder for this one field (the same call its `merge` makes per field).
        batch
            .merge_field(tag, wire_type, &mut bytes, DecodeContext::default())
            .map_err(bad)?;
    }
    Ok(())
}

/// Appends the varints of a packed column, each converted by `conv` (prost's conversions:
/// `uint32` truncates, `sint64` is zigzag). A varint of more than 10 bytes, one above
/// `u64::MAX` or one cut by the column's end is an error, as in prost.
///
/// Eight bytes with no continuation bit are eight one-byte varints, appended at once: the
/// usual column (series ids below 128, seq deltas of 1, equal timestamps) is read a word at a
/// time. Where a word holds a longer varint, the varints are read one by one to its end.
#[inline]
fn packed_varints<T>(col: &[u8], out: &mut Vec<T>, conv: impl Fn(u64) -> T) -> Result<(), CodecError> {
    // At least one byte per value: reserve for the most the column can hold, at most once.
    out.reserve(col.len());
    let mut i = 0;
    while i < col.len() {
        if let Some(word) = col.get(i..i + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
            if u64::from_le_bytes(word) & 0x8080_8080_8080_8080 == 0 {
                out.extend(word.map(|b| conv(u64::from(b))));
                i += 8;
                continue;
            }
        }
        // Prost's own varint decoder to the word's end.
        let word_end = (i + 8).min(col.len());
        let mut rest = &col[i..];
        while col.len() - rest.len() < word_end {
            let v = prost::encoding::decode_varint(&mut rest)
                .map_err(|e| malformed(format!("undecodable EventBatch: {e}")))?;
            out.push(conv(v));
        }
        i = col.len() - rest.len();
    }
    Ok(())
}

/// Appends a packed column of doubles (little-endian, 8 bytes each).
#[inline]
fn packed_doubles(col: &[u8], out: &mut Vec<f64>) -> Result<(), CodecError> {
    if !col.len().is_multiple_of(8) {
        return Err(malformed(
            "undecodable EventBatch: a column of doubles is not whole",
        ));
    }
    out.extend(col.chunks_exact(8).map(|w| {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        f64::from_le_bytes(b)
    }));
    Ok(())
}

/// Series ids below this are looked up in a plain table ([`BatchDecoder`]), at most 8 bytes
/// each (512 KiB); larger ids in a hash map.
const DENSE_IDS: u32 = 1 << 16;

/// Decodes the batches of one stream.
///
/// Keeps one `Arc` per declared series (at most [`MAX_SERIES_PER_STREAM`]): the events it
/// decodes share it, and a declaration repeated unchanged keeps it.
#[derive(Debug, Default)]
pub struct BatchDecoder {
    /// Every declared series, by id.
    series: foldhash::HashMap<u32, Arc<SeriesInfo>>,
    /// The same `Arc`s of the ids below [`DENSE_IDS`] (producers number their series from 0),
    /// each with its layout beside it: each event's lookup is an index, not a hash, and its
    /// layout is read without following the `Arc` (twice per event, see `decode_each`).
    dense: Vec<Dense>,
    last_seq: Option<u64>,
}

/// A series id's entry in [`BatchDecoder`]'s plain table.
#[derive(Debug, Clone, Default)]
struct Dense {
    layout: Layout,
    series: Option<Arc<SeriesInfo>>,
}

impl BatchDecoder {
    pub fn new() -> BatchDecoder {
        BatchDecoder::default()
    }

    /// The series declared as `id`, with its layout.
    #[inline]
    fn get(&self, id: u32) -> Option<(&Arc<SeriesInfo>, Layout)> {
        if id < DENSE_IDS {
            let d = self.dense.get(id as usize)?;
            Some((d.series.as_ref()?, d.layout))
        } else {
            self.series.get(&id).map(|s| (s, s.layout))
        }
    }

    /// Reads an encoded `EventBatch` into `batch` ([`read_batch`]: its memory reused) and
    /// decodes it ([`BatchDecoder::decode_each`]): what a stream's consumer does per message.
    pub fn decode_bytes<F>(
        &mut self,
        bytes: &[u8],
        batch: &mut pb::EventBatch,
        f: F,
    ) -> Result<usize, CodecError>
    where
        F: FnMut(EventRef<'_>),
    {
        read_batch(batch, bytes)?;
        self.decode_each(batch, f)
    }

    /// Learns the batch's declarations, checks it, and calls `f` for each event in order.
    /// Returns the number of events.
    pub fn decode_each<F>(&mut self, b: &pb::EventBatch, mut f: F) -> Result<usize, CodecError>
    where
        F: FnMut(EventRef<'_>),
    {
        for d in &b.series {
            if self.series.len() >= MAX_SERIES_PER_STREAM && !self.series.contains_key(&d.id) {
                return Err(malformed(format!(
                    "more than {MAX_SERIES_PER_STREAM} series declared"
                )));
            }
            // The same declaration again (a stream declares what it is unsure the peer has):
            // keep the series' Arc, so what holds it (e.g. a cache keyed on it) stays valid.
            let same = self.series.get(&d.id).is_some_and(|s| {
                s.name == d.name
                    && s.source == d.source
                    && s.schema_version == d.schema_version
                    && s.fields[..] == d.fields[..]
            });
            if same {
                continue;
            }
            let info = SeriesInfo {
                id: d.id,
                name: d.name.clone(),
                source: d.source.clone(),
                schema_version: d.schema_version,
                layout: Layout::of(&d.fields),
                fields: d.fields.clone().into(),
            };
            let info = Arc::new(info);
            if d.id < DENSE_IDS {
                let i = d.id as usize;
                if self.dense.len() <= i {
                    self.dense.resize(i + 1, Dense::default());
                }
                self.dense[i] = Dense {
                    layout: info.layout,
                    series: Some(Arc::clone(&info)),
                };
            }
            self.series.insert(d.id, info);
        }
        let n = b.series_ids.len();
        if b.seq_deltas.len() != n || b.ts_deltas.len() != n {
            return Err(malformed(format!(
                "{n} series ids but {} seq deltas and {} timestamp deltas",
                b.seq_deltas.len(),
                b.ts_deltas.len()
            )));
        }
        if !b.marks.is_empty() && b.marks.len() != n {
            return Err(malformed(format!("{n} events but {} marks", b.marks.len())));
        }
        if let Some(bad) = b.marks.iter().find(|m| Mark::from_code(**m).is_none()) {
            return Err(malformed(format!("unknown mark {bad}")));
        }
        // First pass: check everything so a bad batch delivers nothing. Nothing in it branches
        // on an event's values (the usual batch is good); a batch found bad is walked again
        // for its first error ([`BatchDecoder::first_error`]).
        let (mut need_d, mut need_s, mut undeclared) = (0usize, 0usize, false);
        for &id in &b.series_ids {
            match self.get(id) {
                Some((_, l)) => {
                    need_d += l.doubles;
                    need_s += l.strings;
                }
                None => undeclared = true,
            }
        }
        // Every seq after the first increases, and the last fits in a u64.
        let (mut zero, mut sum) = (false, 0u128);
        for &d in b.seq_deltas.get(1..).unwrap_or_default() {
            zero |= d == 0;
            sum += u128::from(d);
        }
        if undeclared || zero || u128::from(b.first_seq) + sum > u128::from(u64::MAX) {
            return Err(self.first_error(b));
        }
        if n > 0 {
            if let Some(last) = self.last_seq {
                if b.first_seq <= last {
                    return Err(malformed(format!(
                        "seq {} does not follow the previous batch's last seq {last}",
                        b.first_seq
                    )));
                }
            }
        }
        if need_d != b.numbers.len() || need_s != b.strings.len() {
            return Err(malformed(format!(
                "schemas need {need_d} doubles and {need_s} strings, batch has {} and {}",
                b.numbers.len(),
                b.strings.len()
            )));
        }
        let (mut di, mut si) = (0usize, 0usize);
        let mut seq = b.first_seq;
        let mut ts = b.first_timestamp_ns;
        let marked = !b.marks.is_empty();
        for i in 0..n {
            if i > 0 {
                seq += b.seq_deltas[i];
                ts = ts.wrapping_add(b.ts_deltas[i]);
            }
            // Checked above: the series exists.
            let Some((s, l)) = self.get(b.series_ids[i]) else {
                continue;
            };
            let mark = if marked {
                b.marks
                    .get(i)
                    .and_then(|m| Mark::from_code(*m))
                    .unwrap_or_default()
            } else {
                Mark::None
            };
            f(EventRef {
                series: s,
                seq,
                timestamp_ns: ts,
                numbers: &b.numbers[di..di + l.doubles],
                strings: &b.strings[si..si + l.strings],
                mark,
            });
            di += l.doubles;
            si += l.strings;
        }
        if n > 0 {
            self.last_seq = Some(seq);
        }
        Ok(n)
    }

    /// The first event of `b` whose series is undeclared or whose seq does not follow, in
    /// event order, as an error (a batch [`BatchDecoder::decode_each`] found bad).
    fn first_error(&self, b: &pb::EventBatch) -> CodecError {
        let mut seq = b.first_seq;
        for (i, (&id, &d)) in b.series_ids.iter().zip(&b.seq_deltas).enumerate() {
            if self.get(id).is_none() {
                return malformed(format!("event {i} refers to undeclared series {id}"));
            }
            if i > 0 {
                if d == 0 {
                    return malformed(format!("event {i}: seq does not increase"));
                }
                match seq.checked_add(d) {
                    Some(next) => seq = next,
                    None => return malformed("seq overflow"),
                }
            }
        }
        malformed("a batch found bad has no bad event")
    }

    /// Decodes a batch into owned events.
    pub fn decode(&mut self, b: &pb::EventBatch) -> Result<Vec<OwnedEvent>, CodecError> {
        let mut out = Vec::with_capacity(b.series_ids.len());
        self.decode_each(b, |e| out.push(e.to_owned_event()))?;
        Ok(out)
    }

    /// Forgets the previous seq (a new subscription on the same decoder, e.g. after resume).
    pub fn reset_seq(&mut self) {
        self.last_seq = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{dbl, text};

    fn series(id: u32, src: &str) -> SeriesInfo {
        let schema = pb::EventSchema {
            name: "host.net".into(),
            version: 1,
            fields: vec![dbl("rx", "", ""), text("iface", ""), dbl("tx", "", "")],
            description: String::new(),
        };
        SeriesInfo::new(id, "host.net", src, &schema)
    }

    #[test]
    fn round_trip_declares_once() {
        let a = series(0, "a");
        let b = series(3, "b");
        let mut enc = BatchEncoder::new();
        enc.push(&a, 10, 1_000, &[1.0, 2.0], &["eth0".into()]);
        enc.push(&b, 12, 900, &[3.0, 4.0], &["lo".into()]);
        let b1 = enc.finish(7);
        assert_eq!(b1.series.len(), 2);
        assert_eq!(b1.epoch, 7);
        enc.push(&a, 13, 2_000, &[5.0, 6.0], &["eth0".into()]);
        let b2 = enc.finish(7);
        assert!(b2.series.is_empty(), "series declared only once per stream");

        let mut dec = BatchDecoder::new();
        let e1 = dec.decode(&b1).unwrap();
        assert_eq!(e1.len(), 2);
        assert_eq!((e1[1].seq, e1[1].timestamp_ns), (12, 900));
        assert_eq!(e1[1].strings, vec!["lo".to_string()]);
        let e2 = dec.decode(&b2).unwrap();
        assert_eq!(e2[0].numbers, vec![5.0, 6.0]);
        assert_eq!(e2[0].as_ref().number("tx"), Some(6.0));
        assert_eq!(e2[0].as_ref().text("iface"), Some("eth0"));
        assert_eq!(e2[0].as_ref().text("rx"), None);
        // Replaying an old batch is a seq error.
        assert!(dec.decode(&b1).is_err());
    }

    #[test]
    fn events_of_one_series_share_one_arc() {
        let (a, b) = (series(0, "a"), series(1, "b"));
        let mut enc = BatchEncoder::new();
        for i in 0..4 {
            enc.push(&a, 2 * i + 1, 10, &[1.0, 2.0], &["x".into()]);
            enc.push(&b, 2 * i + 2, 10, &[1.0, 2.0], &["y".into()]);
        }
        let b1 = enc.finish(1);
        enc.push(&a, 9, 20, &[1.0, 2.0], &["x".into()]);
        let mut b2 = enc.finish(1);
        // A declaration repeated unchanged keeps the series' Arc.
        b2.series = b1.series.clone();
        let mut dec = BatchDecoder::new();
        let e1 = dec.decode(&b1).unwrap();
        let e2 = dec.decode(&b2).unwrap();
        let of = |src: &str| -> Vec<&Arc<SeriesInfo>> {
            e1.iter()
                .chain(&e2)
                .filter(|e| e.series.source == src)
                .map(|e| &e.series)
                .collect()
        };
        let (sa, sb) = (of("a"), of("b"));
        assert_eq!((sa.len(), sb.len()), (5, 4));
        assert!(sa.iter().all(|s| Arc::ptr_eq(s, sa[0])), "one Arc for series a");
        assert!(sb.iter().all(|s| Arc::ptr_eq(s, sb[0])), "one Arc for series b");
        assert!(!Arc::ptr_eq(sa[0], sb[0]));
        // decode_each hands out the same Arc that to_owned_event clones.
        let mut c = BatchEncoder::new();
        c.push(&a, 10, 30, &[1.0, 2.0], &["x".into()]);
        let mut b3 = c.finish(1);
        b3.series.clear();
        dec.decode_each(&b3, |e| assert!(Arc::ptr_eq(&e.to_owned_event().series, sa[0])))
            .unwrap();
        // A changed declaration of the same id is a new series.
        let mut changed = b1.series[0].clone();
        changed.schema_version = 2;
        let b4 = pb::EventBatch {
            series: vec![changed],
            epoch: 1,
            ..Default::default()
        };
        dec.decode(&b4).unwrap();
        let mut c = BatchEncoder::new();
        c.push(&a, 11, 40, &[1.0, 2.0], &["x".into()]);
        let mut b5 = c.finish(1);
        b5.series.clear();
        let e5 = dec.decode(&b5).unwrap();
        assert_eq!(e5[0].series.schema_version, 2);
        assert!(!Arc::ptr_eq(&e5[0].series, sa[0]));
    }

    #[test]
    fn shared_batches_and_marks() {
        let a = series(0, "a");
        let b = series(5, "b");
        let mut shared = BatchEncoder::shared();
        shared.push(&a, 1, 10, &[1.0, 2.0], &["x".into()]);
        shared.push_marked(&b, 2, 20, &[3.0, 4.0], &["y".into()], Mark::Enter);
        let chunk = shared.finish(9);
        assert!(chunk.series.is_empty());
        assert_eq!(chunk.marks, vec![0, 1]);
        // A stream sends its missing declarations first, then the shared batch.
        let mut stream = BatchEncoder::new();
        let decls = stream.declare_missing([&a, &b]);
        assert_eq!(decls.len(), 2);
        assert!(stream.declare_missing([&a]).is_empty());
        let mut dec = BatchDecoder::new();
        assert!(dec.decode(&chunk).is_err(), "undeclared series");
        let mut dec = BatchDecoder::new();
        let first = pb::EventBatch {
            series: decls,
            epoch: 9,
            ..Default::default()
        };
        assert!(dec.decode(&first).unwrap().is_empty());
        let evs = dec.decode(&chunk).unwrap();
        assert_eq!(evs[1].mark, Mark::Enter);
        assert!(evs[1].as_ref().to_json().ends_with(",\"crossing\":\"enter\"}"));
        assert_eq!(evs[0].mark, Mark::None);
        let mut bad = chunk.clone();
        bad.marks = vec![0];
        assert!(BatchDecoder::new().decode(&bad).is_err());
    }

    /// A batch with every field set, the columns' varints of every length (ids up to 2^32-1,
    /// seq deltas up to 2^64-1, negative timestamp deltas).
    fn full_batch() -> pb::EventBatch {
        let a = series(0, "a");
        let b = series(70_000, "b");
        let mut enc = BatchEncoder::new();
        enc.push(&a, 1, -5, &[1.5, f64::NAN], &["eth0".into()]);
        enc.push_marked(
            &b,
            300,
            i64::MIN / 2,
            &[-0.0, f64::INFINITY],
            &["ü".into()],
            Mark::Leave,
        );
        enc.push(&a, u64::MAX - 1, i64::MAX / 2, &[3.0, 4.0], &[String::new()]);
        enc.gap(2, 299, 298, "slow consumer");
        enc.conflated(3);
        let mut b = enc.finish(u64::MAX);
        b.dropped = 17;
        b.series_ids.push(u32::MAX);
        b
    }

    #[test]
    fn read_batch_reads_what_prost_writes() {
        use prost::Message;
        let full = full_batch();
        let bytes = full.encode_to_vec();
        let mut got = pb::EventBatch::default();
        read_batch(&mut got, &bytes).unwrap();
        // NaN != NaN: compare the doubles' bits, then the rest.
        let bits = |b: &pb::EventBatch| b.numbers.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&full));
        let strip = |mut b: pb::EventBatch| {
            b.numbers.clear();
            b
        };
        assert_eq!(strip(got.clone()), strip(full.clone()));
        // The batch is cleared first and its columns' memory kept.
        let cap = got.numbers.capacity();
        read_batch(&mut got, &pb::EventBatch::default().encode_to_vec()).unwrap();
        assert_eq!(got, pb::EventBatch::default());
        assert_eq!(got.numbers.capacity(), cap);
    }

    #[test]
    fn read_batch_takes_unpacked_columns_and_skips_unknown_fields() {
        // series_ids [5, 300] unpacked (field 4, varint), numbers [2.5] unpacked (field 7,
        // fixed64), then an unknown field 99 (varint 1) and an unknown group (field 20).
        let mut bytes = vec![0x20, 5, 0x20, 0xac, 0x02, 0x39];
        bytes.extend(2.5f64.to_le_bytes());
        bytes.extend([0x98, 0x06, 1, 0xa3, 0x01, 0x08, 1, 0xa4, 0x01]);
        let mut got = pb::EventBatch::default();
        read_batch(&mut got, &bytes).unwrap();
        assert_eq!(got.series_ids, vec![5, 300]);
        assert_eq!(got.numbers, vec![2.5]);
    }

    #[test]
    fn read_batch_refuses_what_prost_refuses() {
        let cases: [&[u8]; 6] = [
            // A column of doubles that is not whole.
            &[0x3a, 3, 0, 0, 0],
            // A column longer than the message.
            &[0x22, 5, 1, 2],
            // A varint cut by its column's end.
            &[0x22, 1, 0x80, 0x01],
            // An 11-byte varint, then one above u64::MAX.
            &[
                0x2a, 11, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            &[
                0x2a, 10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
            ],
            // Field 0.
            &[0x02, 0],
        ];
        for bytes in cases {
            use prost::Message;
            assert!(pb::EventBatch::decode(bytes).is_err(), "prost refuses {bytes:x?}");
            let mut got = pb::EventBatch::default();
            assert!(
                read_batch(&mut got, bytes).is_err(),
                "read_batch refuses {bytes:x?}"
            );
        }
        // The largest varint prost accepts (u64::MAX, 10 bytes) is read.
        let max = [
            0x2a, 10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        let mut got = pb::EventBatch::default();
        read_batch(&mut got, &max).unwrap();
        assert_eq!(got.seq_deltas, vec![u64::MAX]);
    }

    #[test]
    fn decode_bytes_finds_small_and_large_series_ids() {
        use prost::Message;
        let (a, b) = (series(3, "a"), series(DENSE_IDS + 5, "b"));
        let mut enc = BatchEncoder::new();
        enc.push(&a, 1, 10, &[1.0, 2.0], &["x".into()]);
        enc.push(&b, 2, 20, &[3.0, 4.0], &["y".into()]);
        let bytes = enc.finish(1).encode_to_vec();
        let (mut dec, mut batch) = (BatchDecoder::new(), pb::EventBatch::default());
        let mut seen = Vec::new();
        let n = dec
            .decode_bytes(&bytes, &mut batch, |e| {
                seen.push((e.series.source.clone(), e.seq, e.numbers.to_vec()))
            })
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            seen,
            vec![
                ("a".to_string(), 1, vec![1.0, 2.0]),
                ("b".to_string(), 2, vec![3.0, 4.0])
            ]
        );
        // An id neither declared small nor large is an error, not a panic.
        enc.push(&series(4, "c"), 3, 30, &[1.0, 2.0], &["z".into()]);
        let mut c = enc.finish(1);
        c.series.clear();
        assert!(dec.decode_bytes(&c.encode_to_vec(), &mut batch, |_| {}).is_err());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;
        use prost::Message;

        fn arb_batch() -> impl Strategy<Value = pb::EventBatch> {
            (
                proptest::collection::vec(any::<u32>(), 0..40),
                proptest::collection::vec(any::<u64>(), 0..40),
                proptest::collection::vec(any::<i64>(), 0..40),
                proptest::collection::vec(any::<f64>(), 0..80),
                proptest::collection::vec(any::<u32>(), 0..40),
                proptest::collection::vec("[a-zé]{0,4}", 0..4),
                (
                    any::<u64>(),
                    any::<i64>(),
                    any::<u64>(),
                    any::<u64>(),
                    any::<u64>(),
                ),
                proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u64>(), "[a-z ]{0,8}"), 0..3),
                proptest::collection::vec((any::<u32>(), "[a-z.]{0,6}", "[a-z0-9]{0,6}", any::<u32>()), 0..3),
            )
                .prop_map(
                    |(
                        ids,
                        seqs,
                        tss,
                        numbers,
                        marks,
                        strings,
                        (fs, ft, dropped, epoch, conflated),
                        gaps,
                        decls,
                    )| {
                        pb::EventBatch {
                            series: decls
                                .into_iter()
                                .map(|(id, name, source, v)| pb::SeriesDecl {
                                    id,
                                    name,
                                    source,
                                    schema_version: v,
                                    fields: vec![crate::event::dbl("x", "", "")],
                                })
                                .collect(),
                            first_seq: fs,
                            first_timestamp_ns: ft,
                            series_ids: ids,
                            seq_deltas: seqs,
                            ts_deltas: tss,
                            numbers,
                            strings,
                            dropped,
                            gaps: gaps
                                .into_iter()
                                .map(|(from_seq, to_seq, dropped, reason)| pb::Gap {
                                    from_seq,
                                    to_seq,
                                    dropped,
                                    reason,
                                })
                                .collect(),
                            epoch,
                            marks,
                            conflated,
                        }
                    },
                )
        }

        /// Equal, with the doubles compared by their bits (NaN).
        fn same(a: &pb::EventBatch, b: &pb::EventBatch) -> bool {
            let bits = |x: &pb::EventBatch| x.numbers.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let (mut a2, mut b2) = (a.clone(), b.clone());
            a2.numbers.clear();
            b2.numbers.clear();
            bits(a) == bits(b) && a2 == b2
        }

        /// read_batch and prost agree on `bytes`: both refuse, or both give the same batch.
        fn agree_with_prost(bytes: &[u8]) -> Result<(), TestCaseError> {
            let theirs = pb::EventBatch::decode(bytes);
            let mut ours = pb::EventBatch::default();
            let r = read_batch(&mut ours, bytes);
            match theirs {
                Ok(t) => {
                    prop_assert!(r.is_ok(), "prost read {bytes:x?}, read_batch refused: {r:?}");
                    prop_assert!(same(&ours, &t));
                }
                Err(_) => prop_assert!(r.is_err(), "prost refused {bytes:x?}, read_batch read {ours:?}"),
            }
            Ok(())
        }

        proptest! {
            /// Whatever prost writes, read_batch reads back, into a batch that held another.
            #[test]
            fn round_trip(b in arb_batch(), before in arb_batch()) {
                let bytes = b.encode_to_vec();
                let mut got = before;
                read_batch(&mut got, &bytes).unwrap();
                prop_assert!(same(&got, &b), "{got:?} != {b:?}");
            }

            /// On any bytes, read_batch and prost agree: both refuse, or both give the same batch.
            #[test]
            fn agrees_with_prost_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
                agree_with_prost(&bytes)?;
            }

            /// Arbitrary bytes after a valid batch's (a damaged tail): the same agreement.
            #[test]
            fn agrees_with_prost_on_damaged_batches(b in arb_batch(), cut in any::<prop::sample::Index>(), tail in proptest::collection::vec(any::<u8>(), 0..12)) {
                let mut bytes = b.encode_to_vec();
                let at = cut.index(bytes.len() + 1);
                bytes.truncate(at);
                bytes.extend(tail);
                agree_with_prost(&bytes)?;
            }
        }
    }

    #[test]
    fn malformed_batches_are_errors() {
        let a = series(0, "a");
        let mut enc = BatchEncoder::new();
        enc.push(&a, 1, 1, &[1.0, 2.0], &["x".into()]);
        let good = enc.finish(1);
        let mut bad = good.clone();
        bad.numbers.pop();
        assert!(BatchDecoder::new().decode(&bad).is_err());
        let mut bad = good.clone();
        bad.series.clear();
        assert!(BatchDecoder::new().decode(&bad).is_err());
        let mut bad = good.clone();
        bad.seq_deltas.push(1);
        assert!(BatchDecoder::new().decode(&bad).is_err());
        let mut bad = good;
        bad.series_ids.push(0);
        bad.seq_deltas.push(0);
        bad.ts_deltas.push(0);
        bad.numbers.extend([1.0, 2.0]);
        bad.strings.push("y".into());
        assert!(BatchDecoder::new()
            .decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("does not increase"));
    }

    /// The first pass checks a whole batch before any event is delivered; a batch it flags is
    /// walked again for its first error's message.
    #[test]
    fn a_bad_batch_delivers_nothing_and_says_what_is_wrong() {
        let (a, b) = (series(0, "a"), series(70_000, "b"));
        let mut enc = BatchEncoder::new();
        for seq in 1..=20 {
            enc.push(
                if seq % 2 == 0 { &a } else { &b },
                seq,
                1,
                &[1.0, 2.0],
                &["x".into()],
            );
        }
        let good = enc.finish(1);
        let error = |batch: &pb::EventBatch| {
            let mut seen = 0;
            let e = BatchDecoder::new().decode_each(batch, |_| seen += 1);
            assert_eq!(seen, 0, "nothing delivered from a bad batch");
            e.unwrap_err().to_string()
        };
        let mut bad = good.clone();
        bad.series_ids[13] = 5;
        assert!(error(&bad).contains("event 13 refers to undeclared series 5"));
        let mut bad = good.clone();
        bad.seq_deltas[17] = 0;
        assert!(error(&bad).contains("event 17: seq does not increase"));
        let mut bad = good.clone();
        bad.seq_deltas[19] = u64::MAX - 18;
        assert!(error(&bad).contains("seq overflow"));
        // The first bad event is named, whatever is wrong with it.
        let mut bad = good.clone();
        bad.seq_deltas[4] = 0;
        bad.series_ids[9] = 5;
        assert!(error(&bad).contains("event 4: seq does not increase"));
        bad.series_ids[3] = 6;
        assert!(error(&bad).contains("event 3 refers to undeclared series 6"));
        // The largest seq there is still decodes.
        let mut edge = good.clone();
        edge.seq_deltas[19] = u64::MAX - 19;
        let events = BatchDecoder::new().decode(&edge).unwrap();
        assert_eq!(events.last().map(|e| e.seq), Some(u64::MAX));
        assert_eq!(BatchDecoder::new().decode(&good).unwrap().len(), 20);
    }
}
