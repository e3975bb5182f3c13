//! Queries: the series list and aggregating scans (see Queries in the module documentation).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use gma_core::pattern::Pattern;
use hdrhistogram::Histogram;

use super::layout::{chunk_key, describe_chunk_key, parse_chunk_key, FieldKind};
use super::{corrupt, invalid, ChunkKey, Inner, Store, StoreError, Stream};
use crate::chunk::{ChunkError, ChunkReader};

/// Most buckets one query may ask for.
pub const MAX_BUCKETS: i128 = 10_000_000;
/// Percentiles: a bucket's value range is scaled onto `0..=HDR_RANGE`, recorded exactly.
const HDR_RANGE: u64 = 2000;
const HDR_DIGITS: u8 = 3;

/// Aggregates of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Agg {
    Raw,
    Mean,
    Min,
    Max,
    Sum,
    Count,
    P50,
    P90,
    P99,
}

impl Agg {
    pub const ALL: [Agg; 9] = [
        Agg::Raw,
        Agg::Mean,
        Agg::Min,
        Agg::Max,
        Agg::Sum,
        Agg::Count,
        Agg::P50,
        Agg::P90,
        Agg::P99,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Agg::Raw => "raw",
            Agg::Mean => "mean",
            Agg::Min => "min",
            Agg::Max => "max",
            Agg::Sum => "sum",
            Agg::Count => "count",
            Agg::P50 => "p50",
            Agg::P90 => "p90",
            Agg::P99 => "p99",
        }
    }

    /// The quantile of a percentile aggregate.
    pub fn quantile(self) -> Option<f64> {
        match self {
            Agg::P50 => Some(0.5),
            Agg::P90 => Some(0.9),
            Agg::P99 => Some(0.99),
            _ => None,
        }
    }

    /// True for the aggregates that text fields allow (raw values, count).
    pub fn allows_text(self) -> bool {
        matches!(self, Agg::Raw | Agg::Count)
    }
}

impl fmt::Display for Agg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Agg {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Agg, StoreError> {
        Agg::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                invalid(format!(
                    "unknown aggregate {s:?} (raw, mean, min, max, sum, count, p50, p90, p99)"
                ))
            })
    }
}

/// A query.
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySpec {
    pub name: Pattern,
    /// Only these event names among the matches (`None`: every match). What a summary-only
    /// reader may see: its summary series.
    pub names: Option<std::collections::BTreeSet<String>>,
    pub source: Option<Pattern>,
    /// One field, or every field of the matching streams.
    pub field: Option<String>,
    pub from_ns: i64,
    /// Exclusive.
    pub to_ns: i64,
    /// Bucket width; `None` = one bucket over `[from, to)` (aggregates only).
    pub step_ns: Option<i64>,
    pub agg: Agg,
    /// Points per emitted [`Points`] (at least 1).
    pub max_points: usize,
}

/// A piece of one series' result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Points {
    pub name: String,
    pub source: String,
    pub field: String,
    pub timestamps: Vec<i64>,
    /// Numeric values (raw doubles or aggregates); empty for raw text fields.
    pub values: Vec<f64>,
    /// Raw values of a text field.
    pub texts: Vec<String>,
}

/// What a query did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueryStats {
    pub series: u64,
    pub points: u64,
    pub chunks_read: u64,
    pub rows_scanned: u64,
    /// The consumer asked to stop.
    pub stopped: bool,
}

/// One series held (see [`Store::series`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedSeries {
    pub name: String,
    pub source: String,
    pub field: String,
    pub unit: String,
    pub is_string: bool,
    pub samples: u64,
    pub first_ts: i64,
    pub last_ts: i64,
}

impl Store {
    /// The series whose event name matches `name` (and source `source`), in (name, source,
    /// field) order, with their samples (sealed and open) and time range. A field present in
    /// several schema versions is one series (unit of the newest version).
    pub fn series(&self, name: &Pattern, source: Option<&Pattern>) -> Vec<ArchivedSeries> {
        let g = self.inner.lock();
        let mut matching: Vec<&Stream> = g
            .streams
            .values()
            .filter(|st| matches(st, name, source))
            .collect();
        matching.sort_by_key(|st| st.meta.schema_version);
        let mut out: BTreeMap<SeriesKey, ArchivedSeries> = BTreeMap::new();
        for st in matching {
            let rows = st.rows();
            let Some((lo, hi)) = st.time_range() else {
                continue;
            };
            for f in &st.meta.fields {
                let is_string = f.kind == FieldKind::String;
                let e = out
                    .entry((
                        st.meta.name.clone(),
                        st.meta.source.clone(),
                        f.name.clone(),
                        is_string,
                    ))
                    .or_insert_with(|| ArchivedSeries {
                        name: st.meta.name.clone(),
                        source: st.meta.source.clone(),
                        field: f.name.clone(),
                        unit: String::new(),
                        is_string,
                        samples: 0,
                        first_ts: lo,
                        last_ts: hi,
                    });
                e.unit = f.unit.clone();
                e.samples += rows;
                e.first_ts = e.first_ts.min(lo);
                e.last_ts = e.last_ts.max(hi);
            }
        }
        out.into_values().collect()
    }

    /// Runs a query, handing the result to `emit` in pieces of at most `max_points` points
    /// (`emit` returns false to stop). See the module documentation for the semantics.
    pub fn query(
        &self,
        spec: &QuerySpec,
        emit: &mut dyn FnMut(Points) -> bool,
    ) -> Result<QueryStats, StoreError> {
        let (from, to) = (spec.from_ns, spec.to_ns);
        if to <= from {
            return Err(invalid(format!(
                "inverted or empty range: to ({to}) must be after from ({from})"
            )));
        }
        let span = to as i128 - from as i128;
        let step = match spec.step_ns {
            Some(s) if s <= 0 => {
                return Err(invalid(format!("step {s} ns must be positive")));
            }
            Some(_) if spec.agg == Agg::Raw => {
                return Err(invalid(
                    "a step needs an aggregate (mean, min, max, sum, count, p50, p90, p99)",
                ));
            }
            Some(s) => {
                let n = (span + s as i128 - 1) / s as i128;
                if n > MAX_BUCKETS {
                    return Err(invalid(format!(
                        "the range holds {n} buckets of {s} ns, at most {MAX_BUCKETS} are allowed: \
                         use a larger step or a shorter range"
                    )));
                }
                s as i128
            }
            None => span,
        };
        let max_points = spec.max_points.max(1);
        let plan = self.plan(spec)?;
        let mut hist = match spec.agg.quantile() {
            Some(_) => Some(
                Histogram::<u32>::new_with_bounds(1, HDR_RANGE, HDR_DIGITS)
                    .map_err(|e| StoreError::Storage(format!("histogram: {e}")))?,
            ),
            None => None,
        };
        let mut stats = QueryStats::default();
        let mut buf_d: Vec<(i64, f64)> = Vec::new();
        let mut buf_s: Vec<(i64, String)> = Vec::new();
        let mut buf_t: Vec<(i64, ())> = Vec::new();
        for sp in plan {
            stats.series += 1;
            let srcs = self.sources(&sp.parts, from, to);
            let mut out = Out::new(&sp, max_points, &mut *emit);
            let go = match (spec.agg, sp.is_string) {
                (Agg::Raw, false) => self.scan(srcs, from, to, &mut stats, &mut buf_d, &mut |ts, v| {
                    out.value(ts, v)
                })?,
                (Agg::Raw, true) => self.scan(srcs, from, to, &mut stats, &mut buf_s, &mut |ts, s| {
                    out.text(ts, s)
                })?,
                (agg, is_string) => {
                    let mut acc = Acc::new(agg, from, step);
                    let go = if is_string {
                        self.scan(srcs, from, to, &mut stats, &mut buf_t, &mut |ts, ()| {
                            acc.add(ts, 0.0, &mut out, &mut hist)
                        })?
                    } else {
                        self.scan(srcs, from, to, &mut stats, &mut buf_d, &mut |ts, v| {
                            acc.add(ts, v, &mut out, &mut hist)
                        })?
                    };
                    go && acc.close(&mut out, &mut hist)
                }
            };
            let go = go && out.finish();
            stats.points += out.points;
            if !go {
                stats.stopped = true;
                break;
            }
        }
        Ok(stats)
    }

    /// The series a query reads, with their parts (stream, column) oldest schema first.
    fn plan(&self, spec: &QuerySpec) -> Result<Vec<SeriesPlan>, StoreError> {
        let g = self.inner.lock();
        let mut map: BTreeMap<SeriesKey, Vec<(u32, u32, usize)>> = BTreeMap::new();
        let mut any_stream = false;
        for st in g.streams.values() {
            if !matches(st, &spec.name, spec.source.as_ref())
                || spec.names.as_ref().is_some_and(|n| !n.contains(&st.meta.name))
            {
                continue;
            }
            any_stream = true;
            for (i, f) in st.meta.fields.iter().enumerate() {
                if spec.field.as_ref().is_some_and(|want| *want != f.name) {
                    continue;
                }
                map.entry((
                    st.meta.name.clone(),
                    st.meta.source.clone(),
                    f.name.clone(),
                    f.kind == FieldKind::String,
                ))
                .or_default()
                .push((st.meta.schema_version, st.meta.id, st.cols[i]));
            }
        }
        if let Some(field) = &spec.field {
            if map.is_empty() && any_stream {
                return Err(invalid(format!(
                    "unknown field {field:?}: no stream of {} has it",
                    spec.name
                )));
            }
            if !spec.agg.allows_text() && map.keys().any(|k| k.3) {
                return Err(invalid(format!(
                    "aggregate {} needs a numeric field; {field:?} is text (raw and count work on text)",
                    spec.agg
                )));
            }
        }
        Ok(map
            .into_iter()
            // Without a named field, numeric aggregates skip the text fields.
            .filter(|(k, _)| spec.agg.allows_text() || !k.3)
            .map(|((name, source, field, is_string), mut parts)| {
                parts.sort_unstable();
                SeriesPlan {
                    name,
                    source,
                    field,
                    is_string,
                    parts: parts.into_iter().map(|(_, sid, col)| (sid, col)).collect(),
                }
            })
            .collect())
    }

    /// The chunks (keys) and open rows (a snapshot) of a series overlapping `[from, to)`,
    /// taken together under the lock so that a concurrent seal neither hides nor doubles rows.
    fn sources(&self, parts: &[(u32, usize)], from: i64, to: i64) -> Vec<Src> {
        let g = self.inner.lock();
        let mut out = Vec::new();
        for &(sid, col) in parts {
            let Some(st) = g.streams.get(&sid) else {
                continue;
            };
            // In key order (storage order among equal timestamps).
            let mut hits: Vec<_> = st
                .chunks
                .iter()
                .filter(|(_, m)| m.min_ts < to && m.max_ts >= from)
                .collect();
            hits.sort_unstable_by_key(|(k, _)| *k);
            for ((tk, ctr), m) in hits {
                out.push(Src {
                    min: m.min_ts,
                    max: m.max_ts,
                    order: out.len(),
                    col,
                    data: SrcData::Key(
                        chunk_key(sid, tk, ctr),
                        m.loc.map(|(seg, off)| (seg, off, m.bytes as usize)),
                    ),
                });
            }
            if let (Some(lo), Some(hi)) = (st.open.min_ts(), st.open.max_ts()) {
                if lo < to && hi >= from {
                    out.push(Src {
                        min: lo,
                        max: hi,
                        order: out.len(),
                        col,
                        data: SrcData::Open(st.open.encode()),
                    });
                }
            }
        }
        out
    }

    /// A chunk's bytes (pending, in flight or from the chunk log at `at`, where the plan saw
    /// it); `None` once removed.
    fn chunk(&self, k: &ChunkKey, at: Option<(u64, u64, usize)>) -> Result<Option<Arc<[u8]>>, StoreError> {
        let (seg, off, len) = match lookup(&self.inner.lock(), k, at) {
            Found::Bytes(b) => return Ok(Some(b)),
            Found::Gone => return Ok(None),
            Found::At(seg, off, len) => (seg, off, len),
        };
        match self.chunks.read_at(seg, off, len) {
            Ok(b) => Ok(Some(b.into())),
            // Removed, and its segment deleted, since it was looked up?
            Err(e) => match lookup(&self.inner.lock(), k, None) {
                Found::At(..) => Err(e.into()),
                _ => Ok(None),
            },
        }
    }

    /// Feeds the samples of `srcs` in `[from, to)` to `f` in timestamp order. Sources whose
    /// time ranges overlap are read together and sorted (stable: storage order among equal
    /// timestamps). Returns false when `f` asked to stop.
    fn scan<T: Sample>(
        &self,
        mut srcs: Vec<Src>,
        from: i64,
        to: i64,
        stats: &mut QueryStats,
        buf: &mut Vec<(i64, T)>,
        f: &mut dyn FnMut(i64, T) -> bool,
    ) -> Result<bool, StoreError> {
        srcs.sort_by_key(|s| (s.min, s.order));
        let mut i = 0;
        while i < srcs.len() {
            let mut j = i + 1;
            let mut group_max = srcs[i].max;
            while j < srcs.len() && srcs[j].min < group_max {
                group_max = group_max.max(srcs[j].max);
                j += 1;
            }
            let group = &mut srcs[i..j];
            group.sort_by_key(|s| s.order);
            buf.clear();
            for s in group.iter() {
                let stored;
                let bytes: &[u8] = match &s.data {
                    SrcData::Key(k, at) => match self.chunk(k, *at)? {
                        Some(v) => {
                            stored = v;
                            &stored[..]
                        }
                        // Deleted by retention since the plan was made.
                        None => continue,
                    },
                    SrcData::Open(b) => b,
                };
                let r = ChunkReader::new(bytes).map_err(|e| match &s.data {
                    SrcData::Key(k, _) => corrupt(format!("chunk {}: {e}", describe_chunk_key(k))),
                    SrcData::Open(_) => corrupt(format!("open chunk: {e}")),
                })?;
                stats.chunks_read += 1;
                stats.rows_scanned += r.rows() as u64;
                T::read(&r, s.col, from, to, buf)?;
            }
            if !buf.is_sorted_by_key(|x| x.0) {
                buf.sort_by_key(|x| x.0);
            }
            for (ts, v) in buf.drain(..) {
                if !f(ts, v) {
                    return Ok(false);
                }
            }
            i = j;
        }
        Ok(true)
    }
}

fn matches(st: &Stream, name: &Pattern, source: Option<&Pattern>) -> bool {
    name.matches(&st.meta.name) && source.is_none_or(|p| p.matches(&st.meta.source))
}

/// Where a chunk's bytes are.
enum Found {
    Bytes(Arc<[u8]>),
    /// (chunk-log segment, offset, length).
    At(u64, u64, usize),
    Gone,
}

/// Where the chunk `k` is: pending bytes, removed, or in the chunk log (at `at` when the caller
/// knows, else as the time index says).
fn lookup(inner: &Inner, k: &ChunkKey, at: Option<(u64, u64, usize)>) -> Found {
    let (streams, pending) = (&inner.streams, &inner.pending);
    match pending.get(k) {
        Some(Some(b)) => return Found::Bytes(b),
        Some(None) => return Found::Gone,
        None => {}
    }
    if let Some((seg, off, len)) = at {
        return Found::At(seg, off, len);
    }
    let Some((sid, tk, ctr)) = parse_chunk_key(k) else {
        return Found::Gone;
    };
    match streams
        .get(&sid)
        .and_then(|st| st.chunks.get((tk, ctr)))
        .and_then(|m| m.loc.map(|(seg, off)| (seg, off, m.bytes as usize)))
    {
        Some((seg, off, len)) => Found::At(seg, off, len),
        None => Found::Gone,
    }
}

// ---- queries ----

/// A series: (name, source, field, is text).
type SeriesKey = (String, String, String, bool);

struct SeriesPlan {
    name: String,
    source: String,
    field: String,
    is_string: bool,
    /// (stream id, column) per schema version, oldest first.
    parts: Vec<(u32, usize)>,
}

enum SrcData {
    /// A sealed chunk: its key, and where it lay in the chunk log when the plan was made.
    Key([u8; 17], Option<(u64, u64, usize)>),
    Open(Vec<u8>),
}

/// A chunk (or the open rows) to read for a series.
struct Src {
    min: i64,
    max: i64,
    /// Storage order within the series.
    order: usize,
    col: usize,
    data: SrcData,
}

/// What a scan reads of a column.
trait Sample: Sized {
    fn read(
        r: &ChunkReader<'_>,
        col: usize,
        from: i64,
        to: i64,
        out: &mut Vec<(i64, Self)>,
    ) -> Result<(), ChunkError>;
}

impl Sample for f64 {
    fn read(
        r: &ChunkReader<'_>,
        col: usize,
        from: i64,
        to: i64,
        out: &mut Vec<(i64, f64)>,
    ) -> Result<(), ChunkError> {
        r.for_each_double(col, |ts, v| {
            if ts >= from && ts < to {
                out.push((ts, v));
            }
        })
    }
}

impl Sample for String {
    fn read(
        r: &ChunkReader<'_>,
        col: usize,
        from: i64,
        to: i64,
        out: &mut Vec<(i64, String)>,
    ) -> Result<(), ChunkError> {
        r.for_each_string(col, |ts, s| {
            if ts >= from && ts < to {
                out.push((ts, s.to_string()));
            }
        })
    }
}

/// Timestamps only (counting a text field).
impl Sample for () {
    fn read(
        r: &ChunkReader<'_>,
        _col: usize,
        from: i64,
        to: i64,
        out: &mut Vec<(i64, ())>,
    ) -> Result<(), ChunkError> {
        out.extend(
            r.timestamps()?
                .into_iter()
                .filter(|ts| *ts >= from && *ts < to)
                .map(|ts| (ts, ())),
        );
        Ok(())
    }
}

/// Collects a series' points into pieces of at most `max` and hands them over.
struct Out<'a> {
    name: &'a str,
    source: &'a str,
    field: &'a str,
    max: usize,
    cur: Points,
    emit: &'a mut dyn FnMut(Points) -> bool,
    points: u64,
}

impl<'a> Out<'a> {
    fn new(sp: &'a SeriesPlan, max: usize, emit: &'a mut dyn FnMut(Points) -> bool) -> Out<'a> {
        let mut o = Out {
            name: &sp.name,
            source: &sp.source,
            field: &sp.field,
            max,
            cur: Points::default(),
            emit,
            points: 0,
        };
        o.cur = o.fresh();
        o
    }

    fn fresh(&self) -> Points {
        Points {
            name: self.name.to_string(),
            source: self.source.to_string(),
            field: self.field.to_string(),
            ..Points::default()
        }
    }

    fn value(&mut self, ts: i64, v: f64) -> bool {
        self.cur.timestamps.push(ts);
        self.cur.values.push(v);
        self.pushed()
    }

    fn text(&mut self, ts: i64, s: String) -> bool {
        self.cur.timestamps.push(ts);
        self.cur.texts.push(s);
        self.pushed()
    }

    fn pushed(&mut self) -> bool {
        self.points += 1;
        if self.cur.timestamps.len() >= self.max {
            let fresh = self.fresh();
            let p = std::mem::replace(&mut self.cur, fresh);
            return (self.emit)(p);
        }
        true
    }

    fn finish(&mut self) -> bool {
        if self.cur.timestamps.is_empty() {
            return true;
        }
        let p = std::mem::take(&mut self.cur);
        (self.emit)(p)
    }
}

/// The running aggregate of the current bucket.
struct Acc {
    agg: Agg,
    from: i64,
    step: i128,
    cur: Option<i128>,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    vals: Vec<f64>,
}

impl Acc {
    fn new(agg: Agg, from: i64, step: i128) -> Acc {
        Acc {
            agg,
            from,
            step,
            cur: None,
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            vals: Vec::new(),
        }
    }

    /// Adds a sample (timestamps come in order); closes the previous bucket when this one is
    /// in a new bucket. Returns false when the consumer asked to stop.
    fn add(&mut self, ts: i64, v: f64, out: &mut Out<'_>, hist: &mut Option<Histogram<u32>>) -> bool {
        let k = (ts as i128 - self.from as i128) / self.step;
        let mut go = true;
        if self.cur != Some(k) {
            go = self.close(out, hist);
            self.cur = Some(k);
        }
        if !v.is_nan() {
            self.count += 1;
            self.sum += v;
            if v < self.min {
                self.min = v;
            }
            if v > self.max {
                self.max = v;
            }
            if self.agg.quantile().is_some() {
                self.vals.push(v);
            }
        }
        go
    }

    /// Emits the current bucket's point (if it has values) and resets.
    fn close(&mut self, out: &mut Out<'_>, hist: &mut Option<Histogram<u32>>) -> bool {
        let Some(k) = self.cur.take() else {
            return true;
        };
        if self.count == 0 {
            return true;
        }
        let ts = (self.from as i128 + k * self.step) as i64;
        let v = match self.agg {
            Agg::Mean => self.sum / self.count as f64,
            Agg::Min => self.min,
            Agg::Max => self.max,
            Agg::Sum => self.sum,
            Agg::Count => self.count as f64,
            Agg::P50 | Agg::P90 | Agg::P99 | Agg::Raw => {
                percentile(&mut self.vals, self.agg.quantile().unwrap_or(0.5), hist)
            }
        };
        self.count = 0;
        self.sum = 0.0;
        self.min = f64::INFINITY;
        self.max = f64::NEG_INFINITY;
        self.vals.clear();
        out.value(ts, v)
    }
}

/// The nearest-rank `q` percentile (the `ceil(q·n)`-th smallest value) of `vals` (not empty,
/// no NaN), through hdrhistogram: within 0.025% of `max - min` (see the module documentation).
/// Falls back to exact selection when the range is not finite.
fn percentile(vals: &mut [f64], q: f64, hist: &mut Option<Histogram<u32>>) -> f64 {
    let n = vals.len();
    if n == 0 {
        return f64::NAN;
    }
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for &v in vals.iter() {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo == hi {
        return lo;
    }
    let range = hi - lo;
    match hist {
        Some(h) if range.is_finite() && n <= u32::MAX as usize => {
            let scale = HDR_RANGE as f64 / range;
            h.reset();
            for &v in vals.iter() {
                h.saturating_record(((v - lo) * scale).round() as u64);
            }
            let r = h.median_equivalent(h.value_at_quantile(q)).min(HDR_RANGE);
            (lo + r as f64 / scale).clamp(lo, hi)
        }
        _ => {
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
            let (_, v, _) = vals.select_nth_unstable_by(rank - 1, |a, b| a.total_cmp(b));
            *v
        }
    }
}

#[cfg(test)]
mod tests {
    use gma_core::event::{dbl, text};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::store::testkit::*;

    #[test]
    fn raw_queries_return_exactly_what_was_appended() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(16)).unwrap();
        let reference = fill(&store, 100, 9, 0);
        let net = series("host.net", "a", 1, vec![dbl("rx", "B/s", "")]);
        let events: Vec<_> = (0..5)
            .map(|i| ev(&net, i + 1, i as i64 * SEC, &[i as f64], &[]))
            .collect();
        let st = store.append("p2", rp(1, 6), &events).unwrap();
        assert_eq!((st.events, st.samples, st.new_streams), (5, 5, 1));

        check_raw(&store, &reference, i64::MIN, i64::MAX);
        check_raw(&store, &reference, 0, 100 * SEC);
        check_raw(&store, &reference, 17 * SEC, 53 * SEC);
        check_raw(&store, &reference, 95 * SEC, 96 * SEC + 1);
        check_raw(&store, &reference, 200 * SEC, 300 * SEC);

        // One field, one source.
        let mut q = spec("host.*", Some("rx"), 0, 10 * SEC, None, Agg::Raw);
        q.source = Some(Pattern::source("a").unwrap());
        let got = run(&store, &q);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key, key("host.net", "a", "rx"));
        assert_eq!(got[0].values, vec![0.0, 1.0, 2.0, 3.0, 4.0]);

        let series = store.series(&Pattern::any(), None);
        let names: Vec<_> = series
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.source.as_str(),
                    s.field.as_str(),
                    s.is_string,
                    s.samples,
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("host.cpu", "a", "state", true, 100),
                ("host.cpu", "a", "sys", false, 100),
                ("host.cpu", "a", "user", false, 100),
                ("host.cpu", "b", "state", true, 100),
                ("host.cpu", "b", "sys", false, 100),
                ("host.cpu", "b", "user", false, 100),
                ("host.net", "a", "rx", false, 5),
            ]
        );
        assert_eq!((series[0].first_ts, series[0].last_ts), (0, 99 * SEC));
        assert_eq!(series[2].unit, "%");
        let only_b = store.series(
            &Pattern::event("host.cpu").unwrap(),
            Some(&Pattern::source("b").unwrap()),
        );
        assert_eq!(only_b.len(), 3);
        assert_eq!(store.resume_points().get("p1"), Some(&rp(7, 101)));
    }

    #[test]
    fn results_come_in_pieces_and_stop_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(10)).unwrap();
        fill(&store, 25, 25, 0);
        let mut q = spec("host.cpu", Some("user"), 0, i64::MAX, None, Agg::Raw);
        q.source = Some(Pattern::source("a").unwrap());
        q.max_points = 7;
        let mut sizes = Vec::new();
        let st = store
            .query(&q, &mut |p| {
                sizes.push(p.timestamps.len());
                true
            })
            .unwrap();
        assert_eq!(sizes, vec![7, 7, 7, 4]);
        assert_eq!((st.points, st.stopped), (25, false));
        let mut pieces = 0;
        q.source = None;
        let st = store
            .query(&q, &mut |_| {
                pieces += 1;
                false
            })
            .unwrap();
        assert_eq!(pieces, 1);
        assert!(st.stopped);
    }

    /// Naive aggregate of `vals` (NaN already removed).
    fn naive(agg: Agg, vals: &[f64]) -> f64 {
        let mut s = vals.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        match agg {
            Agg::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
            Agg::Min => s[0],
            Agg::Max => s[s.len() - 1],
            Agg::Sum => vals.iter().sum(),
            Agg::Count => vals.len() as f64,
            _ => {
                let q = agg.quantile().unwrap();
                let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
                s[rank - 1]
            }
        }
    }

    #[test]
    fn aggregates_match_a_naive_computation() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(50)).unwrap();
        let s = series("job.lat", "x", 1, vec![dbl("ms", "ms", ""), text("phase", "")]);
        let mut rng = StdRng::seed_from_u64(42);
        let mut reference: Vec<(i64, f64)> = Vec::new();
        let mut seq = 0;
        for _batch in 0..20 {
            let mut events = Vec::new();
            for _ in 0..37 {
                seq += 1;
                // Mostly increasing timestamps with jitter; some late ones (out of order).
                let mut ts = seq as i64 * 700_000_000 + rng.random_range(0..300_000_000);
                if rng.random_range(0..20) == 0 {
                    ts -= 30 * SEC;
                }
                let v = if rng.random_range(0..50) == 0 {
                    f64::NAN
                } else {
                    rng.random_range(0.0..1000.0) * rng.random_range(0.0..1.0)
                };
                events.push(ev(&s, seq, ts, &[v], &["run"]));
                reference.push((ts, v));
            }
            store.append("p", rp(1, seq + 1), &events).unwrap();
        }
        let (from, to) = (3 * SEC, 500 * SEC);
        for step in [Some(7 * SEC), Some(60 * SEC), None] {
            for agg in [
                Agg::Mean,
                Agg::Min,
                Agg::Max,
                Agg::Sum,
                Agg::Count,
                Agg::P50,
                Agg::P90,
                Agg::P99,
            ] {
                let got = run(&store, &spec("job.lat", Some("ms"), from, to, step, agg));
                let width = step.unwrap_or(to - from);
                let mut buckets: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
                for &(ts, v) in &reference {
                    if ts >= from && ts < to && !v.is_nan() {
                        buckets
                            .entry(from + (ts - from) / width * width)
                            .or_default()
                            .push(v);
                    }
                }
                assert_eq!(got.len(), 1, "{agg} {step:?}");
                let g = &got[0];
                assert_eq!(
                    g.ts,
                    buckets.keys().copied().collect::<Vec<_>>(),
                    "{agg} {step:?}"
                );
                for (i, vals) in buckets.values().enumerate() {
                    let want = naive(agg, vals);
                    let range = naive(Agg::Max, vals) - naive(Agg::Min, vals);
                    let tol = match agg {
                        Agg::Min | Agg::Max | Agg::Count => 0.0,
                        Agg::Mean | Agg::Sum => 1e-9 * want.abs().max(1.0),
                        _ => 2.5e-4 * range + 1e-9,
                    };
                    assert!(
                        (g.values[i] - want).abs() <= tol,
                        "{agg} step {step:?} bucket {}: got {} want {want} (tol {tol})",
                        g.ts[i],
                        g.values[i]
                    );
                }
            }
        }
        // Count works on a text field; raw text comes back as texts.
        let got = run(
            &store,
            &spec("job.lat", Some("phase"), from, to, None, Agg::Count),
        );
        let n = reference.iter().filter(|r| r.0 >= from && r.0 < to).count();
        assert_eq!(got[0].values, vec![n as f64]);
        let got = run(&store, &spec("job.lat", Some("phase"), from, to, None, Agg::Raw));
        assert_eq!(got[0].texts.len(), n);
        // Raw comes in timestamp order, NaN included, late rows merged in.
        let got = run(
            &store,
            &spec("job.lat", Some("ms"), i64::MIN, i64::MAX, None, Agg::Raw),
        );
        let mut want = reference.clone();
        want.sort_by_key(|r| r.0);
        assert_eq!(got[0].ts, want.iter().map(|r| r.0).collect::<Vec<_>>());
        assert!(same_values(
            &got[0].values,
            &want.iter().map(|r| r.1).collect::<Vec<_>>()
        ));
        // Without a field, numeric aggregates skip the text field.
        let got = run(&store, &spec("job.lat", None, from, to, None, Agg::Max));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key.2, "ms");
    }

    #[test]
    fn percentiles_handle_constant_and_infinite_values() {
        let mut h = Some(Histogram::<u32>::new_with_bounds(1, HDR_RANGE, HDR_DIGITS).unwrap());
        assert_eq!(percentile(&mut [3.0, 3.0, 3.0], 0.99, &mut h), 3.0);
        assert_eq!(percentile(&mut [1.0, f64::INFINITY, 2.0], 0.5, &mut h), 2.0);
        assert_eq!(percentile(&mut [1.0, 2.0, 3.0, 4.0], 0.5, &mut None), 2.0);
        let mut v: Vec<f64> = (0..1000).map(|i| i as f64 * 1e-6 + 1e6).collect();
        let p = percentile(&mut v, 0.9, &mut h);
        assert!((p - (1e6 + 899e-6)).abs() <= 2.5e-4 * 999e-6, "{p}");
    }

    #[test]
    fn schema_versions_form_one_series_and_misfits_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(4)).unwrap();
        let v1 = series("app.q", "s", 1, vec![dbl("len", "", "")]);
        let v2 = series("app.q", "s", 2, vec![text("who", ""), dbl("len", "items", "")]);
        let ev1: Vec<_> = (0..6)
            .map(|i| ev(&v1, i + 1, i as i64 * SEC, &[i as f64], &[]))
            .collect();
        store.append("p", rp(1, 7), &ev1).unwrap();
        let ev2: Vec<_> = (6..9)
            .map(|i| ev(&v2, i + 1, i as i64 * SEC, &[i as f64], &["me"]))
            .collect();
        store.append("p", rp(1, 10), &ev2).unwrap();
        let got = run(&store, &spec("app.q", Some("len"), 0, i64::MAX, None, Agg::Raw));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].values, (0..9).map(|i| i as f64).collect::<Vec<_>>());
        let s = store.series(&Pattern::event("app.q").unwrap(), None);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].field.as_str(), s[0].samples, s[0].unit.as_str()),
            ("len", 9, "items")
        );
        // Same (name, source, version) with other fields, or values that do not fit: refused.
        let other = series("app.q", "s", 1, vec![text("len", "")]);
        let bad = vec![
            ev(&other, 20, 20 * SEC, &[], &["x"]),
            ev(&v1, 21, 21 * SEC, &[1.0, 2.0], &[]),
            ev(&v1, 22, 22 * SEC, &[22.0], &[]),
        ];
        let st = store.append("p", rp(1, 23), &bad).unwrap();
        assert_eq!((st.events, st.rejected), (1, 2));
        assert_eq!(store.resume_points()["p"], rp(1, 23));
    }

    #[test]
    fn bad_queries_are_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(10)).unwrap();
        fill(&store, 5, 5, 0);
        let is_invalid = |q: QuerySpec| {
            let r = store.query(&q, &mut |_| true);
            assert!(matches!(r, Err(StoreError::Invalid(_))), "{q:?}: {r:?}");
            r.unwrap_err().to_string()
        };
        is_invalid(spec("host.cpu", None, 10, 10, None, Agg::Raw));
        is_invalid(spec("host.cpu", None, 10, 5, None, Agg::Mean));
        is_invalid(spec("host.cpu", None, 0, 10, Some(0), Agg::Mean));
        is_invalid(spec("host.cpu", None, 0, 10, Some(-1), Agg::Mean));
        is_invalid(spec("host.cpu", None, 0, 10, Some(1), Agg::Raw));
        let m = is_invalid(spec("host.cpu", None, 0, i64::MAX, Some(1000), Agg::Mean));
        assert!(m.contains("buckets"), "{m}");
        let m = is_invalid(spec("host.cpu", Some("nope"), 0, 10, None, Agg::Raw));
        assert!(m.contains("unknown field"), "{m}");
        let m = is_invalid(spec("host.cpu", Some("state"), 0, 10, None, Agg::P99));
        assert!(m.contains("text"), "{m}");
        // Nothing archived under that name: an empty result, not an error.
        assert_eq!(
            run(&store, &spec("nothing.here", Some("x"), 0, 10, None, Agg::Raw)),
            vec![]
        );
        assert!(matches!("median".parse::<Agg>(), Err(StoreError::Invalid(_))));
        for a in Agg::ALL {
            assert_eq!(a.to_string().parse::<Agg>().unwrap(), a);
        }
        assert_eq!("P99".parse::<Agg>().unwrap(), Agg::P99);
    }
}
