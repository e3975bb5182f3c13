//! `gma archive export --format parquet` with real processes (issue 23, item 3): a producer's
//! events (a numeric and a text field, two sources) are archived, exported to Parquet, and read
//! back by pyarrow and by DuckDB (from the kit's Python venv): every row, its time (ns, UTC),
//! value and text equal what `gma archive query` returns, and the column types are the ones
//! docs/parquet.md promises.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::python::{python, run_py};
use common::*;
use gma_proto::v1 as pb;

/// One row as both sides print it: time ns, name, source, field, value, text.
type Row = (i64, String, String, String, Option<f64>, Option<String>);

/// Pushes `n` `app.job` events per source: field `v` (double) and `state` (string).
fn push(producer: &str, base: i64, n: i64) -> usize {
    let schema = pb::EventSchema {
        name: "app.job".into(),
        version: 1,
        fields: vec![
            gma_core::event::dbl("v", "", ""),
            gma_core::event::text("state", ""),
        ],
        description: String::new(),
    };
    let num = |v: f64| pb::Value {
        kind: Some(pb::value::Kind::Number(v)),
    };
    let txt = |s: String| pb::Value {
        kind: Some(pb::value::Kind::Text(s)),
    };
    let mut events = Vec::new();
    for src in ["job1", "job2"] {
        for i in 0..n {
            events.push(pb::Event {
                name: "app.job".into(),
                source: src.into(),
                // 1 s apart with nanosecond jitter: the ns must survive the round trip.
                timestamp_ns: base + i * 1_000_000_000 + (i * 7_919) % 1_000_000,
                seq: 0,
                values: vec![
                    num(((i * 37) % 101) as f64 / 4.0 - 3.0),
                    txt(format!("s{}", i % 3)),
                ],
            });
        }
    }
    let len = events.len();
    assert_eq!(push_events(producer, schema, events) as usize, len);
    len
}

/// The rows of `gma archive query --output json` (values are numbers, texts strings).
fn query_rows(run: &Run) -> Vec<Row> {
    assert_eq!(run.code, 0, "{}", run.stderr);
    json_lines(&run.stdout)
        .iter()
        .map(|v| {
            let (value, text) = match &v["value"] {
                serde_json::Value::String(s) => (None, Some(s.clone())),
                n => (n.as_f64(), None),
            };
            (
                v["timestamp_ns"].as_i64().unwrap(),
                v["name"].as_str().unwrap().to_string(),
                v["source"].as_str().unwrap().to_string(),
                v["field"].as_str().unwrap().to_string(),
                value,
                text,
            )
        })
        .collect()
}

/// Reads the file with pyarrow and with DuckDB; prints both row lists and the column types.
const READER: &str = r#"
import json, sys
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

path = sys.argv[1]
t = pq.read_table(path)
cols = [t.column(c).to_pylist() for c in ("name", "source", "field", "value", "text")]
times = t.column("time").cast(pa.int64()).to_pylist()
arrow_rows = [[times[i]] + [c[i] for c in cols] for i in range(t.num_rows)]
meta = pq.ParquetFile(path).metadata
encodings = {}
for g in range(meta.num_row_groups):
    for c in range(meta.num_columns):
        col = meta.row_group(g).column(c)
        encodings.setdefault(col.path_in_schema, set()).update(col.encodings)

con = duckdb.connect()
duck_rows = [list(r) for r in con.execute(
    "SELECT epoch_ns(time), name, source, field, value, text FROM read_parquet(?)", [path]).fetchall()]
duck_types = {r[0]: r[1] for r in con.execute(
    "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet(?))", [path]).fetchall()}
# An analyst's pivot: one column per field, as docs/parquet.md shows.
# (PIVOT takes no parameter in its source: the path is quoted as an SQL literal.)
quoted = "'" + path.replace("'", "''") + "'"
pivot = con.execute(
    f"SELECT count(*) FROM (PIVOT read_parquet({quoted}) ON field USING first(value) GROUP BY time, source)"
).fetchone()[0]
print(json.dumps({
    "arrow_types": {f.name: str(f.type) for f in t.schema},
    "arrow_rows": arrow_rows,
    "duck_rows": duck_rows,
    "duck_types": duck_types,
    "pivot_rows": pivot,
    "row_groups": meta.num_row_groups,
    "encodings": {k: sorted(v) for k, v in encodings.items()},
}))
"#;

fn rows_of(v: &serde_json::Value) -> Vec<Row> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap(),
                r[1].as_str().unwrap().to_string(),
                r[2].as_str().unwrap().to_string(),
                r[3].as_str().unwrap().to_string(),
                r[4].as_f64(),
                r[5].as_str().map(str::to_string),
            )
        })
        .collect()
}

#[test]
fn a_parquet_export_read_by_pyarrow_and_duckdb_matches_archive_query() {
    let py = python();
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&["--no-host-sensors", "--directory", &dir.addr]);
    let arch = Proc::archiver(&dir.addr, &tmp.path().join("arch"), &["--pattern", "app.*"]);
    let base = gma_core::time::now_ns() - 3_600_000_000_000;
    let n = 500;
    let events = push(&prod.addr, base, n);
    let from = (base - 1).to_string();
    let to = (base + n * 1_000_000_000 + 1).to_string();
    let q = || {
        archive(
            &[
                "query", "app.job", "--from", &from, "--to", &to, "--output", "json",
            ],
            &arch.addr,
        )
    };
    // Two samples (v and state) per event.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let r = q();
            r.code == 0 && json_lines(&r.stdout).len() == events * 2
        }),
        "the archive never held the {} samples: {}",
        events * 2,
        arch.stderr_text()
    );
    let mut want = query_rows(&q());

    let out = tmp.path().join("app.parquet");
    let r = archive(
        &[
            "export",
            "app.job",
            "--from",
            &from,
            "--to",
            &to,
            "--format",
            "parquet",
            "--out",
            out.to_str().unwrap(),
        ],
        &arch.addr,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("wrote {} samples", events * 2)) && r.stderr.contains("peak RSS"),
        "{}",
        r.stderr
    );

    let got = run_py(
        &py,
        tmp.path(),
        "read_parquet.py",
        READER,
        &[out.to_str().unwrap()],
    );
    let types = &got["arrow_types"];
    assert_eq!(types["time"], "timestamp[ns, tz=UTC]", "{types}");
    assert_eq!(types["value"], "double", "{types}");
    for c in ["name", "source", "field", "text"] {
        assert_eq!(types[c], "string", "{c}: {types}");
    }
    // DuckDB 2 keeps the nanoseconds (TIMESTAMPTZ_NS), not microseconds.
    assert_eq!(
        got["duck_types"]["time"], "TIMESTAMPTZ_NS",
        "{}",
        got["duck_types"]
    );
    // The string columns are dictionary-encoded in the file; time and value are not.
    let enc = &got["encodings"];
    for c in ["name", "source", "field", "text"] {
        let e: BTreeSet<&str> = enc[c]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(e.contains("RLE_DICTIONARY"), "{c}: {enc}");
    }
    // One pivoted row per (time, source): every event.
    assert_eq!(got["pivot_rows"].as_u64(), Some(events as u64));

    want.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    for side in ["arrow_rows", "duck_rows"] {
        let mut rows = rows_of(&got[side]);
        rows.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        assert_eq!(rows.len(), want.len(), "{side}: row count");
        for (g, w) in rows.iter().zip(&want) {
            assert_eq!(g, w, "{side}: a row differs from gma archive query");
        }
    }
    // The jitter made it: not every time is on a whole second.
    assert!(want.iter().any(|r| r.0 % 1_000_000_000 != 0));
}
