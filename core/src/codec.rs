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

/// Decodes the batches of one stream.
///
/// Keeps one `Arc` per declared series (at most [`MAX_SERIES_PER_STREAM`]): the events it
/// decodes share it, and a declaration repeated unchanged keeps it.
#[derive(Debug, Default)]
pub struct BatchDecoder {
    series: foldhash::HashMap<u32, Arc<SeriesInfo>>,
    last_seq: Option<u64>,
}

impl BatchDecoder {
    pub fn new() -> BatchDecoder {
        BatchDecoder::default()
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
            self.series.insert(d.id, Arc::new(info));
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
        // First pass: check everything so a bad batch delivers nothing.
        let (mut need_d, mut need_s) = (0usize, 0usize);
        let mut seq = b.first_seq;
        for i in 0..n {
            let s = self.series.get(&b.series_ids[i]).ok_or_else(|| {
                malformed(format!(
                    "event {i} refers to undeclared series {}",
                    b.series_ids[i]
                ))
            })?;
            need_d += s.layout.doubles;
            need_s += s.layout.strings;
            if i > 0 {
                if b.seq_deltas[i] == 0 {
                    return Err(malformed(format!("event {i}: seq does not increase")));
                }
                seq = seq
                    .checked_add(b.seq_deltas[i])
                    .ok_or_else(|| malformed("seq overflow"))?;
            }
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
        for i in 0..n {
            if i > 0 {
                seq += b.seq_deltas[i];
                ts = ts.wrapping_add(b.ts_deltas[i]);
            }
            // Checked above: the series exists.
            let Some(s) = self.series.get(&b.series_ids[i]) else {
                continue;
            };
            let (nd, ns) = (s.layout.doubles, s.layout.strings);
            f(EventRef {
                series: s,
                seq,
                timestamp_ns: ts,
                numbers: &b.numbers[di..di + nd],
                strings: &b.strings[si..si + ns],
                mark: b
                    .marks
                    .get(i)
                    .and_then(|m| Mark::from_code(*m))
                    .unwrap_or_default(),
            });
            di += nd;
            si += ns;
        }
        if n > 0 {
            self.last_seq = Some(seq);
        }
        Ok(n)
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
}
