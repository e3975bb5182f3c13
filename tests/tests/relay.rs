//! End-to-end: `gma relay` (real processes) — the site.load summary follows simulated hosts
//! exactly, and relayed events reach consumers of the relay unchanged.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A simulation file: (name, cpus, memory_mb, load, free_cpus) per host, 200 ms period.
fn sim_file(dir: &Path, file: &str, hosts: &[(&str, u32, u32, f64, u32)]) -> PathBuf {
    let mut text = String::from("period_ms = 200\n");
    for (name, cpus, mem, load, free) in hosts {
        text.push_str(&format!(
            "\n[[host]]\nname = \"{name}\"\ncpus = {cpus}\nmemory_mb = {mem}\nload = {load}\nfree_cpus = {free}\n"
        ));
    }
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path
}

fn sim_producer(dir: &str, sim: &Path, source: &str) -> Proc {
    Proc::producer(&[
        "--directory",
        dir,
        "--simulate",
        sim.to_str().unwrap(),
        "--no-host-sensors",
        "--source",
        source,
    ])
}

fn relay(dir: &str, tmp: &Path, config: &str) -> Proc {
    let path = tmp.join("relay.toml");
    std::fs::write(&path, config).unwrap();
    Proc::start(
        &[
            "relay",
            "--directory",
            dir,
            "--listen",
            "127.0.0.1:0",
            "--config",
            path.to_str().unwrap(),
        ],
        "gma relay listening on",
    )
}

/// Four hosts on two producers: (name, cpus, memory_mb, load, free_cpus).
const P1_HOSTS: [(&str, u32, u32, f64, u32); 2] = [("h1", 8, 1000, 1.5, 6), ("h2", 4, 2000, 3.0, 1)];
const P2_HOSTS: [(&str, u32, u32, f64, u32); 2] = [("h3", 16, 4000, 0.5, 15), ("h4", 2, 500, 2.0, 0)];

/// The values of the newest `site.load` line printed so far.
fn latest_summary(sub: &Proc) -> Option<Value> {
    let lines = sub.stdout_lines();
    let last = lines.iter().rev().find(|l| !l.trim().is_empty())?;
    let v: Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["name"], "site.load", "{v}");
    assert_eq!(v["source"], "s1", "{v}");
    Some(v["values"].clone())
}

/// Expected summary: [hosts_up, hosts_known, free_sum, free_max, total_sum, load_mean,
/// load_max, memory_sum]; None = NaN (printed as null).
fn matches(v: &Value, want: [Option<f64>; 8]) -> bool {
    let keys = [
        "hosts_up",
        "hosts_known",
        "free_cpus_sum",
        "free_cpus_max",
        "total_cpus_sum",
        "load_mean",
        "load_max",
        "memory_mb_sum",
    ];
    keys.iter().zip(want).all(|(k, w)| match w {
        Some(x) => v[*k].as_f64() == Some(x),
        None => v[*k].is_null(),
    })
}

fn wait_summary(sub: &Proc, timeout: Duration, want: [Option<f64>; 8]) {
    let ok = wait_until(timeout, || latest_summary(sub).is_some_and(|v| matches(&v, want)));
    assert!(
        ok,
        "site.load never became {want:?}; latest: {:?}; stderr: {}",
        latest_summary(sub),
        sub.stderr_text()
    );
}

#[test]
fn site_load_summary_matches_hosts_follows_changes_and_drops_stale_hosts() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let mut p1 = sim_producer(&dir.addr, &sim_file(tmp.path(), "p1.toml", &P1_HOSTS), "p1");
    let mut p2 = sim_producer(&dir.addr, &sim_file(tmp.path(), "p2.toml", &P2_HOSTS), "p2");
    let _relay = relay(
        &dir.addr,
        tmp.path(),
        "site = \"s1\"\nperiod_ms = 100\nstale_ms = 1000\nrelay = [\"host.cpu\"]\n",
    );
    let sub = Proc::start(
        &[
            "subscribe",
            "site.load",
            "--directory",
            &dir.addr,
            "--output",
            "json",
        ],
        "",
    );

    // All four hosts up: sums, maxima and the mean of exactly the pinned values.
    let t = Duration::from_secs(10);
    wait_summary(
        &sub,
        t,
        [
            Some(4.0),
            Some(4.0),
            Some(6.0 + 1.0 + 15.0),
            Some(15.0),
            Some(8.0 + 4.0 + 16.0 + 2.0),
            Some((1.5 + 3.0 + 0.5 + 2.0) / 4.0),
            Some(3.0),
            Some(7500.0),
        ],
    );

    // Change one host: the summary follows.
    let r = gma(
        &[
            "sim",
            "set",
            "h3",
            "load=5",
            "free_cpus=2",
            "--producer",
            &p2.addr,
        ],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    wait_summary(
        &sub,
        t,
        [
            Some(4.0),
            Some(4.0),
            Some(6.0 + 1.0 + 2.0),
            Some(6.0),
            Some(30.0),
            Some((1.5 + 3.0 + 5.0 + 2.0) / 4.0),
            Some(5.0),
            Some(7500.0),
        ],
    );

    // Stop one producer: its hosts stay known but are no longer up once their latest
    // host.load is stale_ms (1 s) old — not before.
    let stopped = Instant::now();
    assert!(p1.terminate().is_some_and(|s| s.success()));
    let h34 = [
        Some(2.0),
        Some(4.0),
        Some(2.0),
        Some(2.0),
        Some(18.0),
        Some((5.0 + 2.0) / 2.0),
        Some(5.0),
        Some(4500.0),
    ];
    wait_summary(&sub, t, h34);
    let took = stopped.elapsed();
    assert!(
        took >= Duration::from_millis(700),
        "hosts dropped {took:?} after the stop, before they were stale"
    );

    // No host up: hosts_up 0, sums 0, mean and maxima undefined (NaN, printed as null).
    assert!(p2.terminate().is_some_and(|s| s.success()));
    wait_summary(
        &sub,
        t,
        [
            Some(0.0),
            Some(4.0),
            Some(0.0),
            None,
            Some(0.0),
            None,
            None,
            Some(0.0),
        ],
    );
}

#[test]
fn relayed_events_reach_consumers_of_the_relay_unchanged() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let p1 = sim_producer(&dir.addr, &sim_file(tmp.path(), "p1.toml", &P1_HOSTS), "p1");
    let _p2 = sim_producer(&dir.addr, &sim_file(tmp.path(), "p2.toml", &P2_HOSTS), "p2");
    let relay = relay(
        &dir.addr,
        tmp.path(),
        "site = \"s1\"\nperiod_ms = 200\nrelay = [\"host.cpu\"]\n",
    );
    let sub = Proc::start(
        &["subscribe", "*", "--producer", &relay.addr, "--output", "json"],
        "",
    );
    let events = || json_lines(&sub.stdout_lines().join("\n"));
    let t = Duration::from_secs(10);

    // host.cpu of all four hosts, from both upstream producers, through the one relay.
    let want: BTreeSet<String> = ["h1", "h2", "h3", "h4"].iter().map(|s| s.to_string()).collect();
    let ok = wait_until(t, || {
        let seen: BTreeSet<String> = events()
            .iter()
            .filter(|e| e["name"] == "host.cpu")
            .map(|e| e["source"].as_str().unwrap().to_string())
            .collect();
        seen == want
    });
    assert!(ok, "relay stream: {:?}; relay: {}", events(), relay.stderr_text());

    // Exactly what the upstream producer published: name, source, timestamp and values.
    let r = gma(
        &[
            "subscribe",
            "host.cpu",
            "--producer",
            &p1.addr,
            "--count",
            "6",
            "--output",
            "json",
        ],
        t,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let upstream = json_lines(&r.stdout);
    assert_eq!(upstream.len(), 6);
    for u in &upstream {
        let found = wait_until(t, || {
            events().iter().any(|e| {
                e["name"] == u["name"]
                    && e["source"] == u["source"]
                    && e["timestamp_ns"] == u["timestamp_ns"]
                    && e["values"] == u["values"]
            })
        });
        assert!(found, "upstream event {u} never came through the relay");
    }

    // Only host.cpu and the relay's own site.load; the relay's own seqs; every upstream event
    // once (the relay does not follow itself).
    let all = events();
    let mut last_seq = 0;
    let mut once: HashMap<(String, i64), u32> = HashMap::new();
    for e in &all {
        let name = e["name"].as_str().unwrap();
        assert!(name == "host.cpu" || name == "site.load", "{e}");
        let seq = e["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "seqs must increase: {all:?}");
        last_seq = seq;
        if name == "host.cpu" {
            let key = (
                e["source"].as_str().unwrap().to_string(),
                e["timestamp_ns"].as_i64().unwrap(),
            );
            *once.entry(key).or_default() += 1;
        }
    }
    assert!(once.values().all(|n| *n == 1), "duplicates: {once:?}");

    // The relay is in the directory under its default id, offering both names.
    let ok = wait_until(t, || {
        search_ids(&dir.addr, "host.cpu")
            .unwrap_or_default()
            .iter()
            .any(|(id, addr)| id.starts_with("relay-s1@") && *addr == format!("http://{}", relay.addr))
    });
    assert!(ok, "the relay never offered host.cpu in the directory");
}

#[test]
fn relay_config_errors_name_the_line() {
    let tmp = tempdir();
    let path = tmp.path().join("bad.toml");
    std::fs::write(&path, "site = \"s1\"\nperod_ms = 100\n").unwrap();
    let run = || {
        gma(
            &[
                "relay",
                "--directory",
                "127.0.0.1:1",
                "--config",
                path.to_str().unwrap(),
            ],
            Duration::from_secs(10),
        )
    };
    let r = run();
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("unknown field `perod_ms`"), "{}", r.stderr);
    assert!(r.stderr.contains("line 2, column 1"), "{}", r.stderr);

    std::fs::write(&path, "period_ms = 100\n").unwrap();
    let r = run();
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("missing field `site`"), "{}", r.stderr);

    // The example config is valid: the relay gets as far as binding its listener.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/relay.toml");
    let r = gma(
        &[
            "relay",
            "--directory",
            "127.0.0.1:1",
            "--listen",
            "256.0.0.1:1",
            "--config",
            example.to_str().unwrap(),
        ],
        Duration::from_secs(10),
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("cannot listen on 256.0.0.1:1"), "{}", r.stderr);
}
