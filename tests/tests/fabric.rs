//! End-to-end: real `gma` processes on loopback — directory, producers, subscribers.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::{Duration, Instant};

use common::*;

fn ids(v: &Option<Vec<(String, String)>>) -> Vec<String> {
    v.clone().unwrap_or_default().into_iter().map(|p| p.0).collect()
}

#[test]
fn subscriber_sees_host_cpu_events_in_seq_order() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&[
        "--directory",
        &dir.addr,
        "--period-ms",
        "100",
        "--source",
        "node1",
    ]);
    // Wait until the producer is registered, then subscribe through the directory.
    assert!(wait_until(Duration::from_secs(20), || ids(&search_ids(
        &dir.addr, "host.*"
    ))
    .len()
        == 1));
    let before = gma_core::time::now_ns();
    let r = gma(
        &[
            "subscribe",
            "host.cpu",
            "--directory",
            &dir.addr,
            "--count",
            "4",
            "--output",
            "json",
        ],
        Duration::from_secs(30),
    );
    let after = gma_core::time::now_ns();
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    let events = json_lines(&r.stdout);
    assert!(events.len() >= 3, "{events:?}");
    let mut last_seq = 0;
    let mut last_ts = 0;
    for e in &events {
        assert_eq!(e["name"], "host.cpu");
        assert_eq!(e["source"], "node1");
        let seq = e["seq"].as_u64().unwrap();
        let ts = e["timestamp_ns"].as_i64().unwrap();
        assert!(seq > last_seq, "seqs must increase strictly: {events:?}");
        assert!(ts >= last_ts, "timestamps must not go back: {events:?}");
        // Sane: UTC now-ish (the first event may be the cached latest, up to a period old).
        assert!(
            ts > before - 5_000_000_000 && ts <= after,
            "timestamp {ts} not within the run"
        );
        let v = &e["values"];
        let total: f64 = [
            "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
        ]
        .iter()
        .map(|k| v[*k].as_f64().unwrap_or(0.0))
        .sum();
        assert!(
            total == 0.0 || (total - 100.0).abs() < 1.0,
            "cpu states sum to {total}: {v}"
        );
        assert!(v["load1"].as_f64().is_some());
        last_seq = seq;
        last_ts = ts;
    }
    drop(prod);
}

#[test]
fn search_lists_the_producer_and_a_killed_producer_expires() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let ttl_ms = 1500u64;
    let mut prod = Proc::producer(&[
        "--directory",
        &dir.addr,
        "--lease-ttl-ms",
        &ttl_ms.to_string(),
        "--source",
        "node2",
    ]);
    let mut found = None;
    assert!(wait_until(Duration::from_secs(20), || {
        found = search_ids(&dir.addr, "host.*");
        found.as_ref().is_some_and(|v| v.len() == 1)
    }));
    let (id, address) = found.unwrap()[0].clone();
    assert!(id.starts_with("node2@"), "{id}");
    assert_eq!(address, format!("http://{}", prod.addr));
    // The table output names it too.
    let r = gma(
        &["search", "host.cpu", "--directory", &dir.addr],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains(&id), "{}", r.stdout);
    // A pattern nothing matches is a well-defined empty answer, not an error.
    let none = search_ids(&dir.addr, "nothing.here").unwrap();
    assert!(none.is_empty());

    // Watch the directory from now on, then kill -9 the producer.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir_addr = dir.addr.clone();
    let watched_id = id.clone();
    let watcher = rt.spawn(async move {
        let mut c = gma_consumer::directory::client(&dir_addr).await.unwrap();
        let mut s = c
            .watch(gma_proto::v1::WatchRequest {
                from_revision: 0,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        while let Some(ev) = s.message().await.unwrap() {
            if ev.r#type == gma_proto::v1::WatchEventType::Delete as i32 {
                let e = ev.entry.unwrap();
                if let Some(gma_proto::v1::record::Record::Producer(p)) = e.record.and_then(|r| r.record) {
                    if p.id == watched_id {
                        return ev.reason;
                    }
                }
            }
        }
        String::new()
    });
    prod.kill();
    let killed = Instant::now();
    // Gone from search within TTL + 1 s of the kill.
    assert!(
        wait_until(Duration::from_millis(ttl_ms + 1000), || search_ids(
            &dir.addr, "host.*"
        )
        .is_some_and(|v| v.is_empty())),
        "producer still listed {:?} after the kill",
        killed.elapsed()
    );
    let reason = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), watcher).await });
    let reason = reason.expect("watch saw no DELETE").unwrap();
    assert_eq!(reason, "lease expired");
}

#[test]
fn restarted_consumer_resumes_from_its_state_with_nothing_lost() {
    let tmp = tempdir();
    let state = tmp.path().join("sub.state");
    let prod = Proc::producer(&["--period-ms", "50", "--source", "node3"]);
    let st = state.to_str().unwrap().to_string();
    let args = [
        "subscribe",
        "*",
        "--producer",
        &prod.addr,
        "--state",
        &st,
        "--output",
        "json",
    ];
    let mut sub = Proc::start(&args, "");
    assert!(wait_until(Duration::from_secs(20), || sub.stdout_lines().len() >= 40));
    sub.kill();
    let printed = json_lines(&sub.stdout_lines().join("\n"));
    let last_printed = printed.iter().map(|e| e["seq"].as_u64().unwrap()).max().unwrap();
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    let point = saved["producers"][&prod.addr].clone();
    let next = point["next_seq"].as_u64().unwrap();
    assert!(
        next >= 1 && next <= last_printed + 1,
        "state {point} vs printed {last_printed}"
    );
    // While the consumer is away, the producer goes on: wait until 100 more events exist.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = prod.addr.clone();
    let head = move || {
        let addr = addr.clone();
        rt.block_on(async move {
            let ch = gma_consumer::connect(&addr).await.unwrap();
            let mut c = gma_proto::v1::producer_client::ProducerClient::new(ch);
            let r = c
                .query(gma_proto::v1::QueryRequest {
                    patterns: vec!["*".into()],
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            r.events.iter().map(|e| e.seq).max().unwrap_or(0)
        })
    };
    assert!(wait_until(Duration::from_secs(30), || head() > next + 100));
    // Restart with the same state: every event from `next` on arrives, contiguous.
    let r = gma(
        &[
            "subscribe",
            "*",
            "--producer",
            &prod.addr,
            "--state",
            &st,
            "--output",
            "json",
            "--count",
            "150",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let seqs: Vec<u64> = json_lines(&r.stdout)
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 150);
    assert_eq!(seqs[0], next, "resume must start exactly at the saved seq");
    for w in seqs.windows(2) {
        assert_eq!(w[1], w[0] + 1, "an event was lost between {} and {}", w[0], w[1]);
    }
    assert!(
        !r.stderr.contains("gap"),
        "no gap expected inside the window: {}",
        r.stderr
    );
}

#[test]
fn producer_streams_while_the_directory_is_down_and_re_registers() {
    let tmp = tempdir();
    let mut dir = Proc::directory(&tmp.path().join("dir1"), "127.0.0.1:0");
    let dir_addr = dir.addr.clone();
    let prod = Proc::producer(&[
        "--directory",
        &dir_addr,
        "--period-ms",
        "100",
        "--lease-ttl-ms",
        "1500",
    ]);
    assert!(wait_until(Duration::from_secs(20), || ids(&search_ids(
        &dir_addr, "host.*"
    ))
    .len()
        == 1));
    let sub = Proc::start(
        &[
            "subscribe",
            "host.cpu",
            "--producer",
            &prod.addr,
            "--output",
            "json",
        ],
        "",
    );
    assert!(wait_until(Duration::from_secs(20), || sub.stdout_lines().len() >= 2));
    dir.kill();
    // Streaming goes on without the directory.
    let n = sub.stdout_lines().len();
    assert!(
        wait_until(Duration::from_secs(20), || sub.stdout_lines().len() >= n + 5),
        "stream stalled while the directory was down"
    );
    // A new, empty directory on the same address: the producer registers again by itself.
    let dir2 = Proc::directory(&tmp.path().join("dir2"), &dir_addr);
    assert_eq!(dir2.addr, dir_addr);
    assert!(
        wait_until(Duration::from_secs(30), || ids(&search_ids(&dir_addr, "host.*"))
            .len()
            == 1),
        "producer did not re-register; producer stderr:\n{}",
        prod.stderr_text()
    );
    let n = sub.stdout_lines().len();
    assert!(wait_until(Duration::from_secs(20), || sub.stdout_lines().len() >= n + 3));
}

#[test]
fn demo_runs_and_prints_next_commands() {
    let demo = Proc::start(&["demo", "--duration-s", "60", "--sim-hosts", "20"], "");
    assert!(wait_until(Duration::from_secs(30), || demo
        .stdout_lines()
        .iter()
        .any(|l| l.contains("Press Ctrl-C"))));
    let lines = demo.stdout_lines();
    let dir = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("directory"))
        .map(|s| s.trim().to_string())
        .expect("directory address printed");
    assert!(lines.iter().any(|l| l.contains("gma subscribe")));
    // Both producers register; the simulated hosts publish host.load.
    assert!(wait_until(Duration::from_secs(20), || ids(&search_ids(
        &dir,
        "host.load"
    ))
    .len()
        == 2));
    let r = gma(
        &[
            "subscribe",
            "host.load",
            "--directory",
            &dir,
            "--source",
            "hostA",
            "--count",
            "1",
            "--output",
            "json",
        ],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(json_lines(&r.stdout)[0]["source"], "hostA");
    // The broker commands it prints work as printed: a ranking, then a coallocation.
    let printed = |prefix: &str| -> Vec<String> {
        let line = lines
            .iter()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("{prefix:?} printed: {lines:#?}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    let select = printed("gma broker select");
    let mut args: Vec<&str> = vec!["broker", "select"];
    args.extend(select.iter().map(String::as_str));
    args.extend(["--output", "json"]);
    assert!(
        wait_until(Duration::from_secs(20), || {
            let r = gma(&args, Duration::from_secs(20));
            r.code == 0
                && serde_json::from_str::<serde_json::Value>(&r.stdout)
                    .ok()
                    .and_then(|v| v.as_array().map(|a| a.iter().any(|x| x["resource"] == "hostB")))
                    .unwrap_or(false)
        }),
        "the demo's broker never ranked hostB"
    );
    let co = printed("gma broker coallocate");
    let mut args: Vec<&str> = vec!["broker", "coallocate"];
    args.extend(co.iter().map(String::as_str));
    let r = gma(&args, Duration::from_secs(60));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("coallocated 3 jobs"), "{}", r.stdout);
}

#[test]
fn sigterm_ends_streams_and_removes_the_record_at_once() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    // A long lease: the record can only vanish quickly if the producer removes it itself.
    let mut prod = Proc::producer(&[
        "--directory",
        &dir.addr,
        "--period-ms",
        "100",
        "--lease-ttl-ms",
        "600000",
    ]);
    assert!(wait_until(Duration::from_secs(20), || ids(&search_ids(
        &dir.addr, "host.*"
    ))
    .len()
        == 1));
    let sub = Proc::start(
        &[
            "subscribe",
            "host.cpu",
            "--producer",
            &prod.addr,
            "--output",
            "json",
        ],
        "",
    );
    assert!(wait_until(Duration::from_secs(20), || !sub
        .stdout_lines()
        .is_empty()));
    let status = prod
        .terminate()
        .expect("producer did not exit on SIGTERM with a subscriber attached");
    assert!(status.success(), "{status:?}: {}", prod.stderr_text());
    assert!(
        ids(&search_ids(&dir.addr, "host.*")).is_empty(),
        "record still listed after a clean stop"
    );
}

#[test]
fn a_thousand_simulated_hosts_in_one_producer() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 200\n[[generate]]\ncount = 1000\nprefix = \"sim\"\nseed = 7\n",
    )
    .unwrap();
    let prod = Proc::simulated(&dir.addr, &sim, &[]);
    // Every host's latest host.load is in the cache, and the record lists all 1,000 sources.
    let mut n = 0;
    assert!(
        wait_until(Duration::from_secs(30), || {
            let r = gma(
                &["query", "host.load", "--producer", &prod.addr, "--output", "json"],
                Duration::from_secs(10),
            );
            n = json_lines(&r.stdout).len();
            n == 1000
        }),
        "{n} hosts"
    );
    assert!(wait_until(Duration::from_secs(20), || {
        let r = gma(
            &[
                "search",
                "host.load",
                "--directory",
                &dir.addr,
                "--source",
                "sim-0999",
                "--output",
                "json",
            ],
            Duration::from_secs(10),
        );
        r.code == 0 && r.stdout.contains("sim-0999")
    }));
    let r = gma(
        &[
            "subscribe",
            "host.load",
            "--directory",
            &dir.addr,
            "--source",
            "sim-0500",
            "--count",
            "2",
            "--output",
            "json",
        ],
        Duration::from_secs(20),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(json_lines(&r.stdout).iter().all(|e| e["source"] == "sim-0500"));
}
