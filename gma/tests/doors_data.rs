//! Summary-only means summaries at every door (issue 26): with the README's secured set-up (a
//! CA, an inside user `alice` of org `site1`, an outside user `bob` of org `partner` granted
//! `effect = "summary"` on `host.*`), real processes over mTLS:
//!
//! - the archiver answers bob with the archived summary series only (`host.load.avg1m`, ...),
//!   or `PERMISSION_DENIED` naming the rule when only raw data could answer (query, export,
//!   series listing, stats); alice gets everything;
//! - the broker's view (raw host values) is refused to bob and served to alice.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::secure::*;
use common::*;

/// Waits until `alice` reads rows of `pattern` from the archiver at `addr`.
fn wait_archived(site: &Secure, addr: &str, pattern: &str) {
    let mut last = String::new();
    let ok = wait_until(Duration::from_secs(60), || {
        let r = site.run_as(
            "alice",
            &[
                "archive",
                "query",
                pattern,
                "--archiver",
                addr,
                "--from",
                "-5m",
                "--output",
                "json",
            ],
        );
        last = r.stderr.clone();
        r.code == 0 && !r.stdout.trim().is_empty()
    });
    assert!(ok, "the archiver never held {pattern}: {last}");
}

fn names(rows: &[serde_json::Value]) -> std::collections::BTreeSet<String> {
    rows.iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_archiver_serves_a_summary_only_identity_summaries_only() {
    let site = Secure::new("");
    let dir = site.directory();
    let _prod = site.producer(&dir.addr, &[]);
    let data = site.path("archive");
    let arch = site.start(
        &[
            "archiver",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--data",
            &data,
        ],
        "gma archiver listening on",
    );
    let a = arch.addr.as_str();
    wait_archived(&site, a, "host.load");
    wait_archived(&site, a, "host.load.avg1m");

    // alice (inside) reads raw rows.
    let r = site.run_as(
        "alice",
        &[
            "archive",
            "query",
            "host.*",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let got = names(&json_lines(&r.stdout));
    assert!(
        got.contains("host.load") && got.contains("host.load.avg1m"),
        "{got:?}"
    );

    // bob (summary-only): a raw series is refused, naming the rule and the way out.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.load",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_ne!(r.code, 0, "bob was served raw host.load: {}", r.stdout);
    assert!(r.stdout.trim().is_empty(), "bob got rows: {}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    assert!(
        r.stderr.contains("may read only summaries of \"host.load\"")
            && r.stderr.contains("host.load.avg1m")
            && r.stderr.contains("policy.toml line 8"),
        "{}",
        r.stderr
    );
    // ... an aggregate over raw samples is raw data too.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.load",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--step",
            "1s",
            "--agg",
            "max",
        ],
    );
    assert_ne!(
        r.code, 0,
        "bob was served an aggregate of raw host.load: {}",
        r.stdout
    );

    // bob may read the summaries by name ...
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.load.avg1m",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        names(&json_lines(&r.stdout)),
        ["host.load.avg1m".to_string()].into()
    );
    // ... and a pattern gets him the summary series among its matches, nothing raw.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.*",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let got = names(&json_lines(&r.stdout));
    assert!(!got.is_empty(), "bob got nothing of host.*");
    assert!(
        got.iter().all(|n| gma_core::authz::is_summary_name(n)),
        "bob got raw series: {got:?}"
    );

    // Export: only summary samples reach the file.
    let out = site.path("bob.csv");
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "export",
            "host.*",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--format",
            "csv",
            "--out",
            &out,
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let csv = std::fs::read_to_string(&out).unwrap();
    let exported: std::collections::BTreeSet<&str> =
        csv.lines().skip(1).filter_map(|l| l.split(',').next()).collect();
    assert!(!exported.is_empty(), "bob exported nothing");
    assert!(
        exported.iter().all(|n| gma_core::authz::is_summary_name(n)),
        "bob exported raw series: {exported:?}"
    );
    // An export of a raw series alone is refused.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "export",
            "host.load",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--out",
            &out,
        ],
    );
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);

    // Series listing: summaries only.
    let r = site.run_as(
        "bob",
        &["archive", "series", "host.*", "--archiver", a, "--output", "json"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let listed = names(&json_lines(&r.stdout));
    assert!(
        !listed.is_empty() && listed.iter().all(|n| gma_core::authz::is_summary_name(n)),
        "{listed:?}"
    );
    let r = site.run_as(
        "alice",
        &["archive", "series", "host.*", "--archiver", a, "--output", "json"],
    );
    assert!(names(&json_lines(&r.stdout)).contains("host.cpu"), "{}", r.stdout);

    // Stats cover every series: not for a summary-only identity.
    let r = site.run_as("bob", &["archive", "stats", "--archiver", a]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    let r = site.run_as("alice", &["archive", "stats", "--archiver", a]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn the_broker_view_is_raw_data_for_identities_allowed_raw_only() {
    let site = Secure::new("");
    let dir = site.directory();
    let _prod = site.producer(&dir.addr, &[]);
    let broker = site.start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    let view = |who: &str| {
        site.run_as(
            who,
            &["broker", "view", "--broker", &broker.addr, "--output", "json"],
        )
    };
    // alice sees the hosts with their raw values once the broker follows the producer.
    let mut last = String::new();
    let ok = wait_until(Duration::from_secs(60), || {
        let r = view("alice");
        last = format!("{}{}", r.stdout, r.stderr);
        r.code == 0
            && serde_json::from_str::<serde_json::Value>(&r.stdout)
                .ok()
                .and_then(|v| {
                    v.as_array()
                        .map(|a| a.iter().any(|h| h["resource"] == "h1" && h["load1"].is_number()))
                })
                .unwrap_or(false)
    });
    assert!(ok, "alice never saw h1 in the view: {last}");
    // bob may ask for placements but not read the raw view.
    let r = view("bob");
    assert_ne!(r.code, 0, "bob got the raw view: {}", r.stdout);
    assert!(!r.stdout.contains("h1"), "{}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    assert!(
        r.stderr.contains("may read only summaries of \"host.")
            && r.stderr.contains("--summary 1m")
            && r.stderr.contains("policy.toml line 8"),
        "{}",
        r.stderr
    );
}
