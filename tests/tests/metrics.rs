//! Prometheus exposition: every role serves `/metrics` (`--metrics-listen`), each scrape parses
//! with a Prometheus text-format parser without a single line it does not understand, and holds
//! the role's own metric names; the producer's `--prometheus` endpoint serves its sensor values.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use prometheus_parse::{LineInfo, Scrape};

/// Parses a scrape strictly: every line must be a comment, a TYPE/HELP line or a sample with a
/// number, and the parser must accept the whole text. Returns the metric names.
fn parse_strict(text: &str) -> Result<BTreeSet<String>, String> {
    for (i, line) in text.lines().enumerate() {
        match LineInfo::parse(line) {
            LineInfo::Ignored if !line.trim_start().starts_with('#') => {
                return Err(format!("line {}: not understood: {line:?}", i + 1));
            }
            LineInfo::Sample { value, .. } => {
                let ok = value.parse::<f64>().is_ok() || ["NaN", "+Inf", "-Inf"].contains(&value);
                if !ok {
                    return Err(format!("line {}: bad value: {line:?}", i + 1));
                }
            }
            _ => {}
        }
    }
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).map_err(|e| e.to_string())?;
    Ok(scrape.samples.into_iter().map(|s| s.metric).collect())
}

/// Scrapes `addr` until every name in `want` is there (or 30 s pass); the last scrape must
/// parse strictly.
fn scrape_until(role: &str, addr: &str, path: &str, want: &[&str]) -> String {
    let mut last = String::new();
    let mut missing: Vec<String> = Vec::new();
    let ok = wait_until(Duration::from_secs(30), || {
        let Ok((200, body)) = http_get(addr, path) else {
            return false;
        };
        let names = match parse_strict(&body) {
            Ok(n) => n,
            Err(e) => panic!("{role}: the scrape of {addr}{path} does not parse: {e}\n{body}"),
        };
        missing = want
            .iter()
            .filter(|w| !names.contains(**w))
            .map(|w| w.to_string())
            .collect();
        last = body;
        missing.is_empty()
    });
    assert!(
        ok,
        "{role}: missing {missing:?} in the scrape of {addr}{path}:\n{last}"
    );
    last
}

fn start(args: &[&str], role: &str) -> Proc {
    Proc::start(args, &format!("gma {role} listening on"))
}

#[test]
fn every_role_serves_parseable_prometheus_metrics() {
    let tmp = tempdir();
    let d = |p: &str| tmp.path().join(p).to_str().unwrap().to_string();
    let m = "--metrics-listen";
    let any = "127.0.0.1:0";
    let dir = start(
        &[
            "directory",
            "--listen",
            any,
            "--data",
            &d("dir"),
            m,
            any,
            "--rpc-events-ms",
            "300",
        ],
        "directory",
    );
    let sim = sim_file(tmp.path(), "mhost", 2, 200);
    let prod = start(
        &[
            "producer",
            "--listen",
            any,
            "--directory",
            &dir.addr,
            "--no-host-sensors",
            "--simulate",
            sim.to_str().unwrap(),
            m,
            any,
            "--prometheus",
            any,
            "--rpc-events-ms",
            "300",
        ],
        "producer",
    );
    let arch = start(
        &[
            "archiver",
            "--listen",
            any,
            "--directory",
            &dir.addr,
            "--data",
            &d("arch"),
            m,
            any,
        ],
        "archiver",
    );
    let resched = start(
        &["rescheduler", "--listen", any, "--directory", &dir.addr, m, any],
        "rescheduler",
    );
    std::fs::write(tmp.path().join("relay.toml"), "site = \"s1\"\nperiod_ms = 200\n").unwrap();
    let relay = start(
        &[
            "relay",
            "--listen",
            any,
            "--directory",
            &dir.addr,
            "--config",
            &d("relay.toml"),
            m,
            any,
        ],
        "relay",
    );
    std::fs::write(
        tmp.path().join("monitor.toml"),
        "[[rule]]\nname = \"hot\"\nevents = [\"host.load\"]\nwhen = \"load1 > 1000\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let monitor = start(
        &[
            "monitor",
            "--listen",
            any,
            "--directory",
            &dir.addr,
            "--config",
            &d("monitor.toml"),
            m,
            any,
        ],
        "monitor",
    );
    let sink = start(
        &["sink", "--directory", &dir.addr, "--accept", "host.load", m, any],
        "sink",
    );
    let dash = start(
        &[
            "dashboard",
            "--listen",
            any,
            "--directory",
            &dir.addr,
            "--archiver",
            &arch.addr,
            m,
            any,
        ],
        "dashboard",
    );

    let broker = start(
        &["broker", "--listen", any, "--directory", &dir.addr, m, any],
        "broker",
    );
    std::fs::write(
        tmp.path().join("simres.toml"),
        "[[resource]]\nname = \"mhost00\"\ncpus = 4\n",
    )
    .unwrap();
    let simres = start(
        &["simres", "--config", &d("simres.toml"), "--listen", any, m, any],
        "simres",
    );
    std::fs::write(
        tmp.path().join("job.toml"),
        "name = \"j\"\ncpus = 1\nreference_time_s = 60\n",
    )
    .unwrap();
    let r = gma(
        &[
            "broker",
            "select",
            "--job",
            &d("job.toml"),
            "--broker",
            &broker.addr,
        ],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = gma(
        &["simres", "list", "--manager", &simres.addr],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);

    // Some traffic for the RPC counters of the roles nobody else calls.
    // (An answer with no events exits 1: the call was served all the same.)
    for p in [&resched, &relay, &monitor] {
        let r = gma(&["query", "*", "--producer", &p.addr], Duration::from_secs(20));
        assert!(r.code == 0 || r.stderr.contains("no event"), "{}", r.stderr);
    }
    assert!(wait_until(Duration::from_secs(30), || {
        gma(
            &["archive", "stats", "--archiver", &arch.addr],
            Duration::from_secs(20),
        )
        .code
            == 0
    }));
    assert!(wait_until(Duration::from_secs(20), || http_get(
        &dash.addr,
        "/api/snapshot"
    )
    .is_ok_and(|(s, _)| s == 200)));

    let rpc = |role: &str| -> [String; 2] {
        [
            format!("gma_{role}_rpc_requests_total"),
            format!("gma_{role}_rpc_duration_seconds"),
        ]
    };
    let cases: Vec<(&str, &Proc, Vec<String>)> = vec![
        (
            "directory",
            &dir,
            [
                rpc("directory").to_vec(),
                vec!["gma_directory_is_leader".into(), "gma_directory_watchers".into()],
            ]
            .concat(),
        ),
        (
            "producer",
            &prod,
            [
                rpc("producer").to_vec(),
                vec![
                    "gma_producer_events_published_total".into(),
                    "gma_producer_series".into(),
                ],
            ]
            .concat(),
        ),
        (
            "archiver",
            &arch,
            [
                rpc("archiver").to_vec(),
                vec![
                    "gma_archiver_samples_total".into(),
                    "gma_consumer_events_received_total".into(),
                ],
            ]
            .concat(),
        ),
        (
            "rescheduler",
            &resched,
            [
                rpc("rescheduler").to_vec(),
                vec!["gma_consumer_events_received_total".into()],
            ]
            .concat(),
        ),
        (
            "relay",
            &relay,
            [
                rpc("relay").to_vec(),
                vec![
                    "gma_relay_site_load_published_total".into(),
                    "gma_consumer_events_received_total".into(),
                ],
            ]
            .concat(),
        ),
        (
            "monitor",
            &monitor,
            [
                rpc("monitor").to_vec(),
                vec!["gma_consumer_registrations_total".into()],
            ]
            .concat(),
        ),
        (
            "sink",
            &sink,
            [rpc("sink").to_vec(), vec!["gma_sink_events_total".into()]].concat(),
        ),
        (
            "broker",
            &broker,
            [
                rpc("broker").to_vec(),
                vec![
                    "gma_broker_decisions_total".into(),
                    "gma_broker_decide_seconds".into(),
                ],
            ]
            .concat(),
        ),
        ("simres", &simres, rpc("simres").to_vec()),
        (
            "dashboard",
            &dash,
            vec![
                "gma_dashboard_events_total".into(),
                "gma_dashboard_messages_total".into(),
                "gma_dashboard_http_requests_total".into(),
                "gma_dashboard_hosts".into(),
            ],
        ),
    ];
    for (role, p, want) in &cases {
        let addr = printed_addr(p, role, "metrics");
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        scrape_until(role, &addr, "/metrics", &want);
    }
    // The dashboard also serves /metrics on its own port.
    scrape_until(
        "dashboard",
        &dash.addr,
        "/metrics",
        &["gma_dashboard_http_requests_total"],
    );

    // The producer's sensor values, as Prometheus gauges.
    let values = printed_addr(&prod, "producer", "prometheus");
    let text = scrape_until(
        "producer --prometheus",
        &values,
        "/metrics",
        &[
            "gma_host_cpu_user",
            "gma_host_load_load1",
            "gma_host_mem_used_pct",
            "gma_event_timestamp_seconds",
            "gma_rpc_requests",
        ],
    );
    assert!(
        text.contains("gma_host_load_load1{source=\"mhost00\"} "),
        "{text}"
    );
    assert!(text.contains("# TYPE gma_host_cpu_user gauge"), "{text}");
}
