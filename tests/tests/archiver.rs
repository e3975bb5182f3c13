//! The archiver with real processes: a producer's events reach `gma archive query` exactly
//! (values and timestamps), aggregates match a reference computation, a kill -9 of the
//! archiver mid-stream loses nothing acknowledged and duplicates nothing, and the archiver's
//! series cache hits on the live path (the decoder shares one series among its events).

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;

/// Pushes `values` as `app.metric` events (field `v`) with the given timestamps.
fn push(producer: &str, items: &[(i64, f64)]) {
    push_numbers(producer, "app.metric", "job1", items)
}

/// The points of a query that may find nothing yet (NOT_FOUND before the first sample).
fn points_so_far(run: &Run) -> Vec<(i64, f64)> {
    if run.code != 0 {
        assert!(run.stderr.contains("NotFound"), "{}", run.stderr);
        return Vec::new();
    }
    points(run)
}

fn points(run: &Run) -> Vec<(i64, f64)> {
    assert_eq!(run.code, 0, "{}", run.stderr);
    json_lines(&run.stdout)
        .iter()
        .map(|v| (v["timestamp_ns"].as_i64().unwrap(), v["value"].as_f64().unwrap()))
        .collect()
}

#[test]
fn archived_samples_come_back_exactly_and_aggregate_like_a_reference() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&["--no-host-sensors", "--directory", &dir.addr]);
    let arch = Proc::archiver(&dir.addr, &tmp.path().join("arch"), &["--pattern", "app.*"]);
    // 600 samples, 1 s apart with nanosecond jitter, an hour ago.
    let base = gma_core::time::now_ns() - 3_600_000_000_000;
    let sent: Vec<(i64, f64)> = (0..600i64)
        .map(|i| {
            let jitter = (i * 7_919) % 1_000_000;
            (base + i * 1_000_000_000 + jitter, ((i * 37) % 101) as f64 / 4.0)
        })
        .collect();
    // Pushed before the archiver follows the producer (it offers nothing yet): the archiver
    // starts a new producer from the oldest event it holds.
    push(&prod.addr, &sent[..300]);
    push(&prod.addr, &sent[300..]);
    let from = (base - 1).to_string();
    let to = (base + 700_000_000_000).to_string();
    let q = |extra: &[&str]| {
        let mut a = vec![
            "query",
            "app.metric",
            "--from",
            &from,
            "--to",
            &to,
            "--output",
            "json",
        ];
        a.extend_from_slice(extra);
        archive(&a, &arch.addr)
    };
    assert!(
        wait_until(Duration::from_secs(20), || points_so_far(&q(&[])).len()
            == sent.len()),
        "{}",
        arch.stderr_text()
    );
    assert_eq!(points(&q(&[])), sent, "raw samples differ from what was sent");

    // Aggregates per 1-minute bucket against a reference computed here.
    let step = 60_000_000_000i64;
    let from_ns = base - 1;
    let mut buckets: std::collections::BTreeMap<i64, Vec<f64>> = Default::default();
    for (ts, v) in &sent {
        buckets
            .entry(from_ns + (ts - from_ns) / step * step)
            .or_default()
            .push(*v);
    }
    for agg in ["mean", "min", "max", "count", "sum", "p50", "p99"] {
        let got = points(&q(&["--step", "1m", "--agg", agg]));
        let want: Vec<(i64, f64)> = buckets
            .iter()
            .map(|(t, vs)| {
                let mut s = vs.clone();
                s.sort_by(f64::total_cmp);
                let v = match agg {
                    "mean" => s.iter().sum::<f64>() / s.len() as f64,
                    "min" => s[0],
                    "max" => s[s.len() - 1],
                    "count" => s.len() as f64,
                    "sum" => s.iter().sum(),
                    "p50" => s[((s.len() as f64 * 0.5).ceil() as usize).max(1) - 1],
                    _ => s[((s.len() as f64 * 0.99).ceil() as usize).max(1) - 1],
                };
                (*t, v)
            })
            .collect();
        assert_eq!(got.len(), want.len(), "{agg}: buckets");
        for ((gt, gv), (wt, wv)) in got.iter().zip(&want) {
            assert_eq!(gt, wt, "{agg}: bucket start");
            // Percentiles come from hdrhistogram (3 significant digits over the bucket's range).
            let tol = if agg.starts_with('p') {
                0.01 * (1.0 + wv.abs())
            } else {
                1e-9
            };
            assert!((gv - wv).abs() <= tol, "{agg} at {gt}: got {gv}, want {wv}");
        }
    }

    // Precise errors.
    let r = archive(
        &["query", "app.metric", "--from", "now", "--to", "-1h"],
        &arch.addr,
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("must be after"), "{}", r.stderr);
    let r = archive(
        &[
            "query",
            "app.metric",
            "--from",
            "-1h",
            "--step",
            "0s",
            "--agg",
            "mean",
        ],
        &arch.addr,
    );
    assert!(r.stderr.contains("--step must be positive"), "{}", r.stderr);
    let r = archive(
        &["query", "app.metric", "--from", "-1h", "--step", "1m"],
        &arch.addr,
    );
    assert!(r.stderr.contains("--step needs --agg"), "{}", r.stderr);
    let r = archive(
        &["query", "app.metric", "--field", "nope", "--from", "-2h"],
        &arch.addr,
    );
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(
        r.stderr
            .contains("no series stored for app.metric with a field \"nope\""),
        "{}",
        r.stderr
    );

    // Found through the directory too, and the series are listed.
    let r = gma(
        &[
            "archive",
            "series",
            "app.*",
            "--directory",
            &dir.addr,
            "--output",
            "json",
        ],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let s = json_lines(&r.stdout);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0]["samples"], 600);
    drop(prod);
}

#[test]
fn kill_9_mid_stream_loses_nothing_acknowledged_and_duplicates_nothing() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 20\n[[host]]\nname = \"h1\"\ncpus = 4\nmemory_mb = 1024\nload = 1.5\n",
    )
    .unwrap();
    let _prod = Proc::producer(&[
        "--no-host-sensors",
        "--simulate",
        sim.to_str().unwrap(),
        "--directory",
        &dir.addr,
    ]);
    let data = tmp.path().join("arch");
    let load1 = |addr: &str| {
        archive(
            &[
                "query",
                "host.load",
                "--field",
                "load1",
                "--from",
                "-1h",
                "--output",
                "json",
            ],
            addr,
        )
    };
    let count = |addr: &str| points_so_far(&load1(addr)).len();
    let mut arch = Proc::archiver(&dir.addr, &data, &["--pattern", "host.load"]);
    assert!(wait_until(Duration::from_secs(20), || count(&arch.addr) > 100));
    arch.kill();
    // Events keep coming while the archiver is down; the producer keeps them for it.
    let arch = Proc::archiver(&dir.addr, &data, &["--pattern", "host.load"]);
    let before = count(&arch.addr);
    assert!(wait_until(Duration::from_secs(20), || count(&arch.addr) > before + 100));
    let got = points(&load1(&arch.addr));
    // Strictly increasing timestamps: no duplicate; no hole bigger than a few periods: nothing
    // lost across the kill (the simulated host publishes every 20 ms).
    for w in got.windows(2) {
        assert!(w[1].0 > w[0].0, "duplicate or out of order at {}", w[1].0);
        assert!(
            w[1].0 - w[0].0 < 200_000_000,
            "a hole of {} ms at {}",
            (w[1].0 - w[0].0) / 1_000_000,
            w[0].0
        );
    }
}

/// The value of the counter `name` in a Prometheus scrape (0 when absent).
fn counter(scrape: &str, name: &str) -> u64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| *k == name || k.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
        .map(|(_, v)| v.trim().parse::<f64>().unwrap() as u64)
        .sum()
}

#[test]
fn the_series_cache_hits_on_the_live_path() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&["--no-host-sensors", "--directory", &dir.addr]);
    let arch = Proc::archiver(
        &dir.addr,
        &tmp.path().join("arch"),
        &["--pattern", "app.*", "--metrics-listen", "127.0.0.1:0"],
    );
    let metrics = printed_addr(&arch, "archiver", "metrics");
    let (hits, misses) = (
        "gma_archiver_series_cache_hits_total",
        "gma_archiver_series_cache_misses_total",
    );
    let mut last = String::new();
    let mut appended = |n: u64| {
        wait_until(Duration::from_secs(30), || {
            if let Ok((200, body)) = http_get(&metrics, "/metrics") {
                last = body;
            }
            counter(&last, hits) + counter(&last, misses) >= n
        })
    };
    // 200 events of one series held by the producer before the archiver follows it, then 200
    // more once it does: all of them reach the store through a real subscription, decoded by
    // the consumer's decoder.
    let base = gma_core::time::now_ns() - 600_000_000_000;
    let items: Vec<(i64, f64)> = (0..400i64).map(|i| (base + i * 1_000_000, i as f64)).collect();
    push(&prod.addr, &items[..200]);
    assert!(
        appended(200),
        "the archiver did not append the first 200 events: {last}\n{}",
        arch.stderr_text()
    );
    push(&prod.addr, &items[200..]);
    assert!(
        appended(400),
        "the archiver did not append the next 200 events: {last}\n{}",
        arch.stderr_text()
    );
    let (h, m) = (counter(&last, hits), counter(&last, misses));
    // Every event went through the cache once; only the first event of the series from each
    // decoder (subscription) missed: the cache outlives a delivery. (A new Arc per decoded
    // event, as before, misses all 400.)
    println!("series cache on the live path: {h} hits, {m} misses for 400 events");
    assert_eq!(h + m, 400, "{last}");
    assert!(
        h > m,
        "the series cache hit {h} times and missed {m} times on the live path"
    );
    drop(prod);
}
