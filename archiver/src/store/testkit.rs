//! Helpers of the store's unit tests.

use std::sync::Arc;

use gma_core::codec::{Mark, OwnedEvent, SeriesInfo};
use gma_core::event::{dbl, text};
use gma_core::pattern::Pattern;

use super::*;

pub(crate) const SEC: i64 = 1_000_000_000;

pub(crate) fn series(name: &str, source: &str, version: u32, fields: Vec<pb::FieldSpec>) -> Arc<SeriesInfo> {
    let schema = pb::EventSchema {
        name: name.into(),
        version,
        fields,
        description: String::new(),
    };
    Arc::new(SeriesInfo::new(0, name, source, &schema))
}

pub(crate) fn cpu(source: &str) -> Arc<SeriesInfo> {
    series(
        "host.cpu",
        source,
        1,
        vec![dbl("user", "%", ""), text("state", ""), dbl("sys", "%", "")],
    )
}

pub(crate) fn ev(s: &Arc<SeriesInfo>, seq: u64, ts: i64, numbers: &[f64], strings: &[&str]) -> OwnedEvent {
    OwnedEvent {
        series: s.clone(),
        seq,
        timestamp_ns: ts,
        numbers: numbers.to_vec(),
        strings: strings.iter().map(|s| s.to_string()).collect(),
        mark: Mark::None,
    }
}

/// Options with `chunk_rows`; every checkpoint seals every open chunk (`wal_keep_bytes` 0),
/// which most tests count on.
pub(crate) fn opts(chunk_rows: usize) -> StoreOptions {
    StoreOptions {
        chunk_rows,
        wal_keep_bytes: 0,
        ..StoreOptions::default()
    }
}

pub(crate) fn rp(epoch: u64, next_seq: u64) -> ResumePoint {
    ResumePoint { epoch, next_seq }
}

pub(crate) fn spec(
    name: &str,
    field: Option<&str>,
    from: i64,
    to: i64,
    step: Option<i64>,
    agg: Agg,
) -> QuerySpec {
    QuerySpec {
        name: Pattern::event(name).unwrap(),
        names: None,
        source: None,
        field: field.map(str::to_string),
        from_ns: from,
        to_ns: to,
        step_ns: step,
        agg,
        max_points: 10_000,
    }
}

/// A series' whole result: the pieces of one series joined.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Got {
    pub(crate) key: (String, String, String),
    pub(crate) ts: Vec<i64>,
    pub(crate) values: Vec<f64>,
    pub(crate) texts: Vec<String>,
}

pub(crate) fn run(store: &Store, q: &QuerySpec) -> Vec<Got> {
    let mut out: Vec<Got> = Vec::new();
    store
        .query(q, &mut |p| {
            assert!(p.timestamps.len() <= q.max_points);
            assert!(!p.timestamps.is_empty());
            let key = (p.name, p.source, p.field);
            match out.last_mut() {
                Some(g) if g.key == key => {
                    g.ts.extend(p.timestamps);
                    g.values.extend(p.values);
                    g.texts.extend(p.texts);
                }
                _ => out.push(Got {
                    key,
                    ts: p.timestamps,
                    values: p.values,
                    texts: p.texts,
                }),
            }
            true
        })
        .unwrap();
    out
}

pub(crate) fn key(n: &str, s: &str, f: &str) -> (String, String, String) {
    (n.into(), s.into(), f.into())
}

/// Bit-exact comparison (NaN equals NaN).
pub(crate) fn same_values(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Appends `rows` rows of host.cpu for sources a and b (one event per source per row,
/// timestamps 1 s apart from 0), in batches of `batch` rows. Returns the reference
/// (source, ts, user, state, sys).
pub(crate) fn fill(
    store: &Store,
    rows: usize,
    batch: usize,
    start: usize,
) -> Vec<(String, i64, f64, String, f64)> {
    let (a, b) = (cpu("a"), cpu("b"));
    let mut reference = Vec::new();
    let mut i = start;
    while i < start + rows {
        let mut events = Vec::new();
        for r in i..(i + batch).min(start + rows) {
            let ts = r as i64 * SEC;
            for (s, src) in [(&a, "a"), (&b, "b")] {
                let user = (r as f64 * 0.37).sin() * 40.0 + 50.0 + if src == "b" { 1.0 } else { 0.0 };
                let sys = (r % 7) as f64;
                let state = if r % 10 < 7 { "ok" } else { "busy" };
                events.push(ev(s, r as u64 + 1, ts, &[user, sys], &[state]));
                reference.push((src.to_string(), ts, user, state.to_string(), sys));
            }
        }
        let last = (i + batch).min(start + rows) as u64;
        store.append("p1", rp(7, last + 1), &events).unwrap();
        i += batch;
    }
    reference
}

pub(crate) fn check_raw(store: &Store, reference: &[(String, i64, f64, String, f64)], from: i64, to: i64) {
    let got = run(store, &spec("host.cpu", None, from, to, None, Agg::Raw));
    let mut expected = Vec::new();
    for src in ["a", "b"] {
        let rows: Vec<_> = reference
            .iter()
            .filter(|r| r.0 == src && r.1 >= from && r.1 < to)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let ts: Vec<i64> = rows.iter().map(|r| r.1).collect();
        // Field order: state, sys, user (by name).
        expected.push(Got {
            key: key("host.cpu", src, "state"),
            ts: ts.clone(),
            values: vec![],
            texts: rows.iter().map(|r| r.3.clone()).collect(),
        });
        expected.push(Got {
            key: key("host.cpu", src, "sys"),
            ts: ts.clone(),
            values: rows.iter().map(|r| r.4).collect(),
            texts: vec![],
        });
        expected.push(Got {
            key: key("host.cpu", src, "user"),
            ts,
            values: rows.iter().map(|r| r.2).collect(),
            texts: vec![],
        });
    }
    assert_eq!(got, expected, "range [{from}, {to})");
}
