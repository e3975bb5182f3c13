//! A CI-sized smoke run of every benchmark scenario: each finishes, prints JSON with the fields
//! every scenario has (scenario, machine_cores, processes with CPU and RSS), and the scale run
//! loses nothing. No timing thresholds: the figures are for docs/PERFORMANCE.md, not tests.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

/// Runs `gma bench ARGS --output json` and returns its JSON objects (one per line).
fn bench(args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["bench"];
    a.extend_from_slice(args);
    a.extend(["--output", "json"]);
    let r = gma(&a, Duration::from_secs(240));
    assert_eq!(r.code, 0, "gma {a:?}: {}", r.stderr);
    let objs = json_lines(&r.stdout);
    assert!(!objs.is_empty(), "gma {a:?} printed no JSON");
    for o in &objs {
        assert_eq!(o["scenario"].as_str(), Some(args[0]), "{o}");
        assert!(o["machine_cores"].as_u64().unwrap_or(0) >= 1, "{o}");
        let procs = o["processes"]
            .as_array()
            .unwrap_or_else(|| panic!("no processes: {o}"));
        assert!(!procs.is_empty(), "{o}");
        for p in procs {
            assert!(p["name"].is_string(), "{p}");
            assert!(p.get("cpu_seconds").is_some(), "{p}");
        }
    }
    objs
}

#[test]
fn stream() {
    let o = &bench(&["stream", "--duration", "1", "--rate", "1000"])[0];
    assert!(o["events_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(o["dropped"], 0);
    assert!(o["latency_ms"]["p99"].is_number());
}

#[test]
fn fanout_and_stall() {
    let o = &bench(&[
        "fanout",
        "--duration",
        "1",
        "--consumers",
        "1,3",
        "--rate",
        "1000",
    ])[0];
    assert_eq!(o["rows"].as_array().unwrap().len(), 2);
    bench(&["stall", "--duration", "1", "--rate", "1000"]);
}

#[test]
fn directory() {
    let objs = bench(&["directory", "--duration", "1", "--trials", "1"]);
    assert_eq!(objs.len(), 2, "1 and 3 nodes");
}

#[test]
fn archive() {
    bench(&["archive", "--samples", "30000", "--duration", "60"]);
}

#[test]
fn broker_coalloc_placement() {
    let o = &bench(&["broker", "--resources", "50", "--duration", "1", "--clients", "2"])[0];
    assert!(o["decisions"].as_u64().unwrap() > 0);
    let o = &bench(&["coalloc", "--trials", "10"])[0];
    for r in o["results"].as_array().unwrap() {
        assert_eq!(r["leaked"], 0);
        assert_eq!(r["errors"], 0);
    }
    bench(&["placement", "--hosts", "5", "--jobs", "200", "--seeds", "1"]);
}

#[test]
fn agent_resched_filter_forecast() {
    let o = &bench(&["agent", "--duration", "2"])[0];
    assert!(
        o["processes"][0]["rss_mib_peak"].as_f64().unwrap_or(0.0) > 0.0,
        "{o}"
    );
    bench(&["resched", "--trials", "5"]);
    bench(&["filter", "--events", "10000"]);
    bench(&["forecast"]);
}

#[test]
fn scale_with_churn_loses_nothing() {
    let o = &bench(&[
        "scale",
        "--hosts",
        "40",
        "--producers",
        "2",
        "--consumers",
        "4",
        "--duration",
        "6",
    ])[0];
    let loss = &o["loss"];
    assert!(loss["published"].as_u64().unwrap() > 0, "{o}");
    assert_eq!(loss["missing_at_archiver"], 0, "{o}");
    assert_eq!(loss["archiver_gap_events"], 0, "{o}");
    assert_eq!(loss["consumer_gap_events"], 0, "{o}");
    // Producer 0 restarted: three runs in all (its two and producer 1's).
    assert_eq!(loss["runs"].as_array().unwrap().len(), 3, "{o}");
    assert_eq!(o["consumer_recovery_ms"]["consumers"], 4, "{o}");
    let names: Vec<&str> = o["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for n in [
        "scale-p0",
        "scale-p1",
        "archiver",
        "broker",
        "directory-1",
        "directory-2",
        "directory-3",
    ] {
        assert!(names.contains(&n), "{names:?}");
    }
}
