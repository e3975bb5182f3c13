//! What one request carries, read from the store: per archived numeric series, the samples
//! after its resume point, in timestamp order, at most one per millisecond.

use std::collections::BTreeSet;

use gma_core::pattern::Pattern;

use crate::store::{Agg, ArchivedSeries, QuerySpec, Store, StoreError};

/// Nanoseconds per millisecond (the archive keeps nanoseconds, Prometheus milliseconds).
pub const NS_PER_MS: i64 = 1_000_000;

/// An archived series (the key of the mapping in [`crate::promlabels`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct SeriesKey {
    pub event: String,
    pub source: String,
    pub field: String,
}

impl SeriesKey {
    pub fn of(s: &ArchivedSeries) -> SeriesKey {
        SeriesKey {
            event: s.name.clone(),
            source: s.source.clone(),
            field: s.field.clone(),
        }
    }
}

/// The samples of one series in a request: (milliseconds, value), strictly increasing times.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesBatch {
    pub key: SeriesKey,
    pub samples: Vec<(i64, f64)>,
}

/// One request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub series: Vec<SeriesBatch>,
}

impl Batch {
    pub fn samples(&self) -> usize {
        self.series.iter().map(|s| s.samples.len()).sum()
    }

    /// Per series, the first and last millisecond sent (what the resume state records).
    pub fn bounds(&self) -> Vec<(SeriesKey, i64, i64)> {
        self.series
            .iter()
            .filter_map(|s| Some((s.key.clone(), s.samples.first()?.0, s.samples.last()?.0)))
            .collect()
    }
}

fn ms(ts_ns: i64) -> i64 {
    ts_ns.div_euclid(NS_PER_MS)
}

/// Feeds `f` the raw samples of `key` with `from_ms <= t <= to_ms` (milliseconds), in
/// timestamp order, the first of each millisecond only (Prometheus refuses a second value at a
/// timestamp it holds); stops when `f` returns false. Returns the samples dropped as
/// same-millisecond repeats.
pub fn scan_series(
    store: &Store,
    key: &SeriesKey,
    from_ms: i64,
    to_ms: i64,
    f: &mut dyn FnMut(i64, f64) -> bool,
) -> Result<u64, StoreError> {
    if to_ms < from_ms {
        return Ok(0);
    }
    let spec = QuerySpec {
        name: Pattern::event(&key.event).unwrap_or_else(|_| Pattern::any()),
        names: Some(BTreeSet::from([key.event.clone()])),
        // A stored source with pattern characters would match others: filtered below.
        source: Pattern::source(&key.source).ok(),
        field: Some(key.field.clone()),
        from_ns: from_ms.saturating_mul(NS_PER_MS),
        to_ns: to_ms.saturating_add(1).saturating_mul(NS_PER_MS),
        step_ns: None,
        agg: Agg::Raw,
        max_points: 4096,
    };
    let mut last: Option<i64> = None;
    let mut repeats = 0u64;
    store.query(&spec, &mut |p| {
        if p.source != key.source || p.name != key.event || p.field != key.field {
            return true;
        }
        for (&ts, &v) in p.timestamps.iter().zip(&p.values) {
            let t = ms(ts);
            if last.is_some_and(|l| t <= l) {
                repeats += 1;
                continue;
            }
            last = Some(t);
            if !f(t, v) {
                return false;
            }
        }
        true
    })?;
    Ok(repeats)
}

/// Where a series stands: the last millisecond acknowledged (`None`: never sent).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub series: ArchivedSeries,
    pub acked: Option<i64>,
}

/// What [`build`] read.
#[derive(Debug, Default)]
pub struct Built {
    pub batch: Batch,
    /// Series whose samples before `floor_ms` were skipped (older than the backlog bound):
    /// (series, the new resume point `floor_ms - 1`, samples skipped).
    pub skipped: Vec<(SeriesKey, i64, u64)>,
    /// Same-millisecond repeats not sent.
    pub repeats: u64,
    /// The batch holds `budget` samples: more are waiting.
    pub full: bool,
}

/// A batch of at most `budget` samples from `candidates` (taken in order; the caller rotates
/// them for fairness): for each, the samples after its resume point (and not before `floor_ms`)
/// up to its newest sample when the candidates were listed.
pub fn build(
    store: &Store,
    candidates: &[Candidate],
    budget: usize,
    floor_ms: Option<i64>,
) -> Result<Built, StoreError> {
    let mut out = Built::default();
    let mut left = budget;
    for c in candidates {
        if left == 0 {
            out.full = true;
            break;
        }
        let key = SeriesKey::of(&c.series);
        let last_ms = ms(c.series.last_ts);
        let mut from = c.acked.map_or(ms(c.series.first_ts), |a| a + 1);
        if let Some(floor) = floor_ms.filter(|f| from < *f) {
            let mut n = 0u64;
            out.repeats += scan_series(store, &key, from, floor - 1, &mut |_, _| {
                n += 1;
                true
            })?;
            out.skipped.push((key.clone(), floor - 1, n));
            from = floor;
        }
        let mut samples = Vec::new();
        out.repeats += scan_series(store, &key, from, last_ms, &mut |t, v| {
            samples.push((t, v));
            samples.len() < left
        })?;
        left -= samples.len();
        if !samples.is_empty() {
            out.batch.series.push(SeriesBatch { key, samples });
        }
    }
    out.full |= left == 0;
    Ok(out)
}

/// The batch of an earlier attempt, read again exactly: per series, its samples within the
/// recorded first and last millisecond.
pub fn rebuild(store: &Store, bounds: &[(SeriesKey, i64, i64)]) -> Result<Batch, StoreError> {
    let mut batch = Batch::default();
    for (key, first, last) in bounds {
        let mut samples = Vec::new();
        scan_series(store, key, *first, *last, &mut |t, v| {
            samples.push((t, v));
            true
        })?;
        batch.series.push(SeriesBatch {
            key: key.clone(),
            samples,
        });
    }
    Ok(batch)
}

/// Samples waiting in `candidates` (after each resume point, up to the listed newest sample).
pub fn pending(store: &Store, candidates: &[Candidate]) -> Result<u64, StoreError> {
    let mut n = 0u64;
    for c in candidates {
        let from = c.acked.map_or(ms(c.series.first_ts), |a| a + 1);
        scan_series(
            store,
            &SeriesKey::of(&c.series),
            from,
            ms(c.series.last_ts),
            &mut |_, _| {
                n += 1;
                true
            },
        )?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use gma_core::event::dbl;
    use gma_core::pattern::Pattern;

    use super::*;
    use crate::store::testkit::{cpu, ev, opts, rp, series};

    const MS: i64 = NS_PER_MS;

    fn candidates(store: &Store, acked: &[(&str, &str, i64)]) -> Vec<Candidate> {
        store
            .series(&Pattern::any(), None)
            .into_iter()
            .filter(|s| !s.is_string)
            .map(|s| Candidate {
                acked: acked
                    .iter()
                    .find(|(src, f, _)| *src == s.source && *f == s.field)
                    .map(|a| a.2),
                series: s,
            })
            .collect()
    }

    #[test]
    fn batches_follow_resume_points_one_sample_per_millisecond_text_fields_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(4)).unwrap();
        let a = cpu("a");
        // 10 ms apart, plus a second value inside millisecond 3 (not sent: Prometheus holds
        // one value per millisecond) and an out-of-order one at 5.5 ms.
        let mut events: Vec<_> = (1..=10)
            .map(|i| ev(&a, i as u64, i * 10 * MS, &[i as f64, -(i as f64)], &["x"]))
            .collect();
        events.push(ev(&a, 11, 30 * MS + 400_000, &[99.0, 99.0], &["x"]));
        events.push(ev(&a, 12, 55 * MS, &[5.5, -5.5], &["x"]));
        store.append("p", rp(1, 12), &events).unwrap();

        let c = candidates(&store, &[]);
        assert_eq!(c.len(), 2, "the text field is not a candidate");
        let built = build(&store, &c, 1000, None).unwrap();
        assert!(!built.full);
        assert_eq!(built.repeats, 2, "one repeat per numeric series");
        let sys = &built.batch.series[0];
        assert_eq!(sys.key.field, "sys");
        let times: Vec<i64> = sys.samples.iter().map(|s| s.0).collect();
        assert_eq!(times, [10, 20, 30, 40, 50, 55, 60, 70, 80, 90, 100]);
        assert_eq!(
            sys.samples[2],
            (30, -3.0),
            "the first value of a millisecond is sent"
        );

        // A budget cuts the batch; the next one starts after the resume point.
        let built = build(&store, &c, 7, None).unwrap();
        assert!(built.full);
        assert_eq!(built.batch.samples(), 7);
        let bounds = built.batch.bounds();
        assert_eq!(bounds, [(sys.key.clone(), 10, 60)]);
        assert_eq!(
            rebuild(&store, &bounds).unwrap(),
            built.batch,
            "a rebuild is exact"
        );
        let c = candidates(&store, &[("a", "sys", 60)]);
        let built = build(&store, &c, 7, None).unwrap();
        let first = &built.batch.series[0];
        assert_eq!(
            first.samples.iter().map(|s| s.0).collect::<Vec<_>>(),
            [70, 80, 90, 100]
        );
        assert_eq!(built.batch.series[1].key.field, "user");
        assert_eq!(built.batch.series[1].samples.len(), 3);
        assert_eq!(pending(&store, &c).unwrap(), 4 + 11);

        // A floor skips (and counts) what lies before it.
        let c = candidates(&store, &[("a", "sys", 100)]);
        let built = build(&store, &c, 1000, Some(45)).unwrap();
        assert_eq!(built.skipped.len(), 1);
        assert_eq!(built.skipped[0].1, 44);
        assert_eq!(
            built.skipped[0].2, 4,
            "10, 20, 30, 40 (the repeat in 30 is a repeat)"
        );
        let user = &built.batch.series[0];
        assert_eq!(user.samples.first().map(|s| s.0), Some(50));
    }

    #[test]
    fn a_source_with_pattern_characters_reads_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), opts(64)).unwrap();
        let fields = || vec![dbl("v", "", "")];
        let star = series("app.m", "h*", 1, fields());
        let other = series("app.m", "h1", 1, fields());
        store
            .append(
                "p",
                rp(1, 2),
                &[ev(&star, 1, MS, &[1.0], &[]), ev(&other, 2, 2 * MS, &[2.0], &[])],
            )
            .unwrap();
        let key = SeriesKey {
            event: "app.m".into(),
            source: "h*".into(),
            field: "v".into(),
        };
        let mut got = Vec::new();
        scan_series(&store, &key, 0, 10, &mut |t, v| {
            got.push((t, v));
            true
        })
        .unwrap();
        assert_eq!(got, [(1, 1.0)]);
    }
}
