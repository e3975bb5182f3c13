//! Producer services with real processes: producer-initiated streams to a registered sink,
//! and every subscription filter kind (when, delta, summaries, forecasts, policies) through
//! `gma subscribe`.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;

fn sim_file(dir: &std::path::Path, period_ms: u64, hosts: &[(&str, f64)]) -> String {
    let mut text = format!("period_ms = {period_ms}\n");
    for (name, load) in hosts {
        text.push_str(&format!(
            "[[host]]\nname = \"{name}\"\ncpus = 8\nmemory_mb = 4096\nload = {load}\n"
        ));
    }
    let p = dir.join("sim.toml");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn sim_producer(dir: &Proc, sim: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--directory", &dir.addr, "--no-host-sensors", "--simulate", sim];
    args.extend_from_slice(extra);
    Proc::producer(&args)
}

fn events_named(lines: &[String], name: &str) -> Vec<serde_json::Value> {
    json_lines(&lines.join("\n"))
        .into_iter()
        .filter(|v| v["name"] == name)
        .collect()
}

#[test]
fn producer_pushes_to_a_registered_sink_and_either_side_can_end_it() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = sim_file(tmp.path(), 50, &[("h1", 1.0), ("h2", 2.0)]);
    // Sink first: the producer finds it in the directory as soon as it starts.
    let mut sink = Proc::start(
        &[
            "sink",
            "--directory",
            &dir.addr,
            "--accept",
            "host.load",
            "--id",
            "archive-1",
            "--manner",
            "archive",
        ],
        "gma sink listening on",
    );
    let mut prod = sim_producer(&dir, &sim, &["--id", "p1"]);
    assert!(
        wait_until(Duration::from_secs(20), || events_named(
            &sink.stdout_lines(),
            "host.load"
        )
        .len()
            >= 10),
        "no pushed events; sink stderr: {}\nproducer stderr: {}",
        sink.stderr_text(),
        prod.stderr_text()
    );
    let got = events_named(&sink.stdout_lines(), "host.load");
    // Only what the sink accepts, from both hosts, in seq order.
    assert!(sink.stdout_lines().iter().all(|l| l.contains("\"host.load\"")));
    let seqs: Vec<u64> = got.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for h in ["h1", "h2"] {
        assert!(got.iter().any(|v| v["source"] == h));
    }
    assert!(sink.stderr_text().contains("stream from p1"));
    // The producer ends it: its stream closes at the sink.
    prod.terminate();
    assert!(
        wait_until(Duration::from_secs(10), || sink
            .stderr_text()
            .contains("stream from p1")
            && sink.stderr_text().contains("closed")),
        "{}",
        sink.stderr_text()
    );
    sink.terminate();

    // The consumer ends it: after --end-after events the stream closes and the producer does
    // not come back while the consumer's record is unchanged.
    let sink2 = Proc::start(
        &[
            "sink",
            "--directory",
            &dir.addr,
            "--accept",
            "host.*",
            "--end-after",
            "3",
        ],
        "gma sink listening on",
    );
    let _prod2 = sim_producer(&dir, &sim, &["--id", "p2"]);
    assert!(
        wait_until(Duration::from_secs(20), || sink2
            .stderr_text()
            .contains("stream from p2 closed: received 3 events")),
        "{}",
        sink2.stderr_text()
    );
    let n = sink2.stdout_lines().len();
    // The producer publishes every 50 ms; a stream still running would add lines. Wait for the
    // producer's own later events to exist (via Query) before counting again.
    let prod_addr = _prod2.addr.clone();
    let first = gma(
        &["query", "host.load", "--producer", &prod_addr, "--output", "json"],
        Duration::from_secs(10),
    );
    let seq0 = json_lines(&first.stdout)
        .iter()
        .map(|v| v["seq"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        let r = gma(
            &["query", "host.load", "--producer", &prod_addr, "--output", "json"],
            Duration::from_secs(10),
        );
        json_lines(&r.stdout)
            .iter()
            .filter_map(|v| v["seq"].as_u64())
            .max()
            .unwrap_or(0)
            > seq0 + 40
    }));
    assert_eq!(
        sink2.stdout_lines().len(),
        n,
        "the producer kept pushing after the consumer ended"
    );
    assert_eq!(
        sink2.stderr_text().matches("stream from p2 (").count(),
        1,
        "{}",
        sink2.stderr_text()
    );
}

#[test]
fn when_delta_summary_and_forecast_filters_through_gma_subscribe() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = sim_file(tmp.path(), 50, &[("h1", 1.0)]);
    let prod = sim_producer(&dir, &sim, &[]);
    let paddr = prod.addr.clone();
    let set = |load: &str| {
        let r = gma(
            &["sim", "set", "h1", &format!("load={load}"), "--producer", &paddr],
            Duration::from_secs(10),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
    };

    // Threshold crossing: start outside (load 1), enter at 5, leave at 2.
    let mut when = Proc::start(
        &[
            "subscribe",
            "host.load",
            "--producer",
            &paddr,
            "--when",
            "host.load.load1 > 4",
            "--output",
            "json",
        ],
        "",
    );
    // Change filter on the same stream: only moves beyond 50 %.
    let mut delta = Proc::start(
        &[
            "subscribe",
            "host.load",
            "--producer",
            &paddr,
            "--delta-pct",
            "50",
            "--output",
            "json",
        ],
        "",
    );
    let mut summary = Proc::start(
        &[
            "subscribe",
            "host.load",
            "--producer",
            &paddr,
            "--summary",
            "1m",
            "--output",
            "json",
        ],
        "",
    );
    let mut forecast = Proc::start(
        &[
            "subscribe",
            "host.load",
            "--producer",
            &paddr,
            "--forecast",
            "--output",
            "json",
        ],
        "",
    );
    // Everyone has seen the start value before we change it.
    assert!(wait_until(Duration::from_secs(15), || !delta
        .stdout_lines()
        .is_empty()
        && !summary.stdout_lines().is_empty()
        && !forecast.stdout_lines().is_empty()));
    set("5");
    assert!(wait_until(Duration::from_secs(10), || !when
        .stdout_lines()
        .is_empty()));
    set("2");
    assert!(
        wait_until(Duration::from_secs(10), || when.stdout_lines().len() >= 2),
        "{:?}",
        when.stdout_lines()
    );
    let w = json_lines(&when.stdout_lines().join("\n"));
    assert_eq!(w[0]["crossing"], "enter");
    assert_eq!(w[0]["values"]["load1"], 5.0);
    assert_eq!(w[1]["crossing"], "leave");
    assert_eq!(w[1]["values"]["load1"], 2.0);

    // delta: 1 (first), 5 (+400 %), 2 (-60 %) — and nothing for the unchanged samples between.
    assert!(wait_until(Duration::from_secs(10), || delta.stdout_lines().len() >= 3));
    let d: Vec<f64> = json_lines(&delta.stdout_lines().join("\n"))
        .iter()
        .map(|v| v["values"]["load1"].as_f64().unwrap())
        .collect();
    assert_eq!(d, vec![1.0, 5.0, 2.0]);

    // summaries: host.load.avg1m with mean/min/max over what the host published.
    // (published at most once a second for the 1-minute window)
    assert!(
        wait_until(Duration::from_secs(10), || json_lines(
            &summary.stdout_lines().join("\n")
        )
        .last()
        .is_some_and(|v| v["values"]["load1_max"].as_f64() == Some(5.0))),
        "{:?}",
        summary.stdout_lines()
    );
    let s = json_lines(&summary.stdout_lines().join("\n"));
    assert!(s.iter().all(|v| v["name"] == "host.load.avg1m"), "{s:?}");
    let last = s.last().unwrap();
    assert_eq!(last["values"]["load1_min"].as_f64().unwrap(), 1.0);
    let mean = last["values"]["load1"].as_f64().unwrap();
    assert!(mean > 1.0 && mean < 5.0, "{last}");
    assert!(last["values"]["samples"].as_f64().unwrap() >= 3.0);
    // ... registered in the directory like any schema.
    assert!(wait_until(Duration::from_secs(15), || search_ids(
        &dir.addr,
        "host.load.avg1m"
    )
    .unwrap_or_default()
    .len()
        == 1));

    // forecasts: host.load.forecast follows the (now constant) load with its error and method.
    assert!(wait_until(Duration::from_secs(10), || {
        json_lines(&forecast.stdout_lines().join("\n"))
            .last()
            .is_some_and(|v| (v["values"]["load1"].as_f64().unwrap_or(0.0) - 2.0).abs() < 1e-9)
    }));
    let f = json_lines(&forecast.stdout_lines().join("\n"));
    assert!(f.iter().all(|v| v["name"] == "host.load.forecast"));
    assert!(f.last().unwrap()["values"]["load1_method"].as_str().is_some());

    for p in [&mut when, &mut delta, &mut summary, &mut forecast] {
        p.terminate();
    }
}

#[test]
fn bad_filters_get_a_precise_invalid_argument() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = sim_file(tmp.path(), 100, &[("h1", 1.0)]);
    let prod = sim_producer(&dir, &sim, &[]);
    let cases: [(&[&str], &str); 5] = [
        (&["--when", "load1 > "], "when: at column 9"),
        (&["--when", "host.load.nosuch > 1"], "when: at column 1"),
        (&["--delta-pct=-3"], "delta_pct -3 must be a positive number"),
        (
            &["--summary", "5m"],
            "summary window \"5m\" is unknown: use 1m, 10m or 60m",
        ),
        (&["--when", "arch > 3"], "when: at column 1"),
    ];
    for (extra, want) in cases {
        for via in [
            ["--producer", prod.addr.as_str()],
            ["--directory", dir.addr.as_str()],
        ] {
            let mut args = vec!["subscribe", "host.load", via[0], via[1]];
            args.extend_from_slice(extra);
            let r = gma(&args, Duration::from_secs(15));
            assert_ne!(r.code, 0, "{args:?} should fail");
            assert!(r.stderr.contains(want), "{args:?}: {}", r.stderr);
            assert!(
                r.stderr.contains("InvalidArgument") || r.stderr.contains("invalid"),
                "{}",
                r.stderr
            );
        }
    }
}

/// Regression: closing an HTTP/2 connection gracefully waits for the peer's answer to a PING,
/// so a producer told to stop (SIGTERM) while one of its consumers was stopped (SIGSTOP) used
/// to wait for its keep-alive timeout (~30 s, seen in `gma bench scale`). It now drains its
/// streams, gives the connections a bounded time to close and exits.
#[test]
fn a_producer_stops_while_a_consumer_is_frozen() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = sim_file(tmp.path(), 100, &[("h1", 1.0), ("h2", 2.0)]);
    let mut p = sim_producer(&dir, &sim, &[]);
    let mut sub = Proc::start(
        &["subscribe", "host.*", "--producer", &p.addr, "--output", "json"],
        "",
    );
    assert!(
        wait_until(Duration::from_secs(30), || !sub.stdout_lines().is_empty()),
        "the consumer printed nothing: {}",
        sub.stderr_text()
    );
    let pid = sub.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let stopped = p.terminate();
    let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
    sub.kill();
    assert!(
        stopped.is_some(),
        "the producer did not exit within 10 s of SIGTERM while a consumer was stopped: {}",
        p.stderr_text()
    );
    assert!(
        p.stderr_text().contains("gma producer stopped: epoch "),
        "{}",
        p.stderr_text()
    );
}

/// Recent history from the producer (issue 24, item 5): `gma query --since` returns every event
/// of the window still in the resume buffer, in seq order, not only the latest; `--limit`
/// keeps the most recent and says what it left out; bad windows and limits are refused.
#[test]
fn query_since_returns_the_windows_events_from_the_resume_buffer() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = sim_file(tmp.path(), 50, &[("h1", 1.0), ("h2", 2.0)]);
    let prod = sim_producer(&dir, &sim, &[]);
    let query = |extra: &[&str]| {
        let mut args = vec![
            "query",
            "host.load",
            "--producer",
            prod.addr.as_str(),
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        gma(&args, Duration::from_secs(15))
    };
    // The latest query: one event per host.
    let mut latest = Vec::new();
    assert!(wait_until(Duration::from_secs(20), || {
        latest = json_lines(&query(&[]).stdout);
        latest.len() == 2
    }));
    // A window of a minute: several events of each host, in seq order, none older.
    let mut hist = Vec::new();
    assert!(
        wait_until(Duration::from_secs(20), || {
            hist = json_lines(&query(&["--since", "1m"]).stdout);
            ["h1", "h2"]
                .iter()
                .all(|h| hist.iter().filter(|e| e["source"] == *h).count() >= 5)
        }),
        "{hist:?}"
    );
    let seqs: Vec<u64> = hist.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // The three most recent of that window; a later query's three are as new or newer.
    let third_newest = seqs[seqs.len() - 3];
    // The limit keeps the most recent and warns about the rest.
    let r = query(&["--since", "1m", "--limit", "3"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let last3 = json_lines(&r.stdout);
    assert_eq!(last3.len(), 3, "{}", r.stdout);
    let seq3: Vec<u64> = last3.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seq3[0] >= third_newest && seq3.windows(2).all(|w| w[0] < w[1]),
        "{seq3:?}"
    );
    assert!(
        r.stderr.contains("older events of the window left out"),
        "{}",
        r.stderr
    );
    // Refused: a limit without a window, a window of nothing, a window too long (INVALID_ARGUMENT).
    for (extra, want) in [
        (&["--limit", "3"][..], "--since"),
        (&["--since", "0s"][..], "at least 1ms"),
        (&["--since", "8d"][..], "since_ms: at most"),
        (
            &["--since", "1m", "--limit", "100001"][..],
            "limit: at most 100000",
        ),
    ] {
        let r = query(extra);
        assert_ne!(r.code, 0, "{extra:?}");
        assert!(r.stderr.contains(want), "{extra:?}: {}", r.stderr);
    }
}
