//! The agent-only executable `gma-agent` (producer crate), real processes on 127.0.0.1: it
//! takes `gma producer`'s flags, registers in a real directory, serves its host sensors' events
//! (query, subscribe, and resume from its ring), obeys the control service, stops cleanly on
//! SIGTERM with the same lines as `gma producer`, and refuses the Prometheus endpoints it does
//! not serve with a clear error.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;
use gma_core::codec::BatchDecoder;
use gma_proto::v1 as pb;
use pb::producer_client::ProducerClient;

/// The `gma producer run: epoch E` line of a producer.
fn epoch_of(p: &Proc) -> u64 {
    let text = p.stderr_text();
    text.lines()
        .find_map(|l| l.strip_prefix("gma producer run: epoch "))
        .unwrap_or_else(|| panic!("no epoch line: {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// A subscription to every event of the agent from seq 1 of run `epoch`, past its first
/// message (the subscription id).
async fn resume_from_one(
    client: &mut ProducerClient<tonic::transport::Channel>,
    epoch: u64,
    consumer_id: &str,
) -> tonic::Streaming<pb::SubscribeResponse> {
    let mut s = client
        .subscribe(pb::SubscribeRequest {
            patterns: vec!["*".into()],
            resume_from_seq: 1,
            epoch,
            consumer_id: consumer_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(s.message().await.unwrap().unwrap().subscription_id > 0);
    s
}

/// The next batch of `s`, within 30 s.
async fn next_batch(s: &mut tonic::Streaming<pb::SubscribeResponse>) -> pb::EventBatch {
    tokio::time::timeout(Duration::from_secs(30), s.message())
        .await
        .expect("events from the agent within 30 s")
        .unwrap()
        .expect("the stream goes on")
        .batch
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn gma_agent_registers_serves_resumes_and_obeys_control() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let state = tmp.path().join("state");
    let mut agent = Proc::agent(&[
        "--directory",
        &dir.addr,
        "--source",
        "agent-only",
        "--period-ms",
        "200",
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    let addr = agent.addr.clone();

    // Registered in the directory with its host sensors' events.
    let mut found = None;
    let registered = wait_until(Duration::from_secs(30), || {
        found = search_ids(&dir.addr, "host.cpu");
        found
            .as_ref()
            .is_some_and(|ids| ids.iter().any(|(_, a)| a.trim_start_matches("http://") == addr))
    });
    assert!(registered, "gma-agent at {addr} not found by host.cpu: {found:?}");

    // Serves the latest values.
    let mut client = ProducerClient::new(connected(&addr).await);
    let r = wait_for("host.cpu from the agent", Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            let r = client
                .query(pb::QueryRequest {
                    patterns: vec!["host.cpu".into()],
                    ..Default::default()
                })
                .await
                .map_err(|s| s.to_string())?
                .into_inner();
            if r.events.is_empty() {
                return Err("no host.cpu event yet".to_string());
            }
            Ok(r)
        }
    })
    .await;
    assert!(
        r.events.iter().all(|e| e.source == "agent-only"),
        "{:?}",
        r.events
    );

    // Resumes a consumer from seq 1 of this run: its ring holds every event since the start,
    // in order and without a gap.
    let epoch = epoch_of(&agent);
    let mut s = resume_from_one(&mut client, epoch, "agent-only-test").await;
    let mut dec = BatchDecoder::new();
    let mut seqs = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    while seqs.len() < 50 {
        let b = next_batch(&mut s).await;
        assert!(b.gaps.is_empty(), "{:?}", b.gaps);
        dec.decode_each(&b, |e| {
            seqs.push(e.seq);
            names.insert(e.series.name.to_string());
        })
        .unwrap();
    }
    assert_eq!(seqs[0], 1, "resumed from seq 1");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "seqs in order: {seqs:?}"
    );
    for n in ["host.cpu", "host.mem", "gma.agent"] {
        assert!(names.contains(n), "{n} missing from {names:?}");
    }
    drop(s);

    // The control service: a period set at run time is listed and kept in the state dir.
    let r = gma(
        &["agent", "set", "host.mem", "5000", "--producer", &addr],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "gma agent set: {}", r.stderr);
    let r = gma(
        &["agent", "sensors", "--producer", &addr, "--output", "json"],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "gma agent sensors: {}", r.stderr);
    assert!(
        r.stdout.contains("host.mem") && r.stdout.contains("5000"),
        "{}",
        r.stdout
    );
    assert!(
        state.join("control.json").is_file(),
        "control.json kept in --state-dir"
    );

    // SIGTERM: a clean stop with the line tools read.
    let status = agent.terminate().expect("gma-agent stops on SIGTERM");
    assert!(status.success(), "exit {status:?}: {}", agent.stderr_text());
    let text = agent.stderr_text();
    assert!(
        text.contains(&format!("gma producer stopped: epoch {epoch} last seq ")),
        "{text}"
    );
}

#[test]
fn gma_agent_refuses_the_prometheus_endpoints_it_does_not_serve() {
    for (flag, value) in [
        ("--prometheus", "127.0.0.1:0"),
        ("--metrics-listen", "127.0.0.1:0"),
    ] {
        let out = std::process::Command::new(agent_bin())
            .args(["--listen", "127.0.0.1:0", flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {err}");
        assert!(
            err.contains("gma-agent serves no Prometheus") && err.contains("gma producer"),
            "{flag}: {err}"
        );
    }
    // And an unknown flag is clap's usage error, as with `gma producer`.
    let out = std::process::Command::new(agent_bin())
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `--buffer-bytes` bounds the agent's ring in bytes: with 16 KiB and a fast period the ring
/// drops its oldest events within seconds, a consumer resuming from seq 1 is told exactly
/// which it lost (a `Gap` from seq 1) and then gets every later event in order; a bound
/// below one page is refused, naming the key.
#[tokio::test(flavor = "multi_thread")]
async fn gma_agent_ring_bounded_in_bytes_drops_the_oldest_with_a_gap() {
    let out = std::process::Command::new(agent_bin())
        .args(["--listen", "127.0.0.1:0", "--buffer-bytes", "100"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("buffer_bytes 100 must be within 4096"), "{err}");

    let agent = Proc::agent(&[
        "--source",
        "agent-bytes",
        "--period-ms",
        "100",
        "--buffer-bytes",
        "16384",
    ]);
    let epoch = epoch_of(&agent);
    let mut client = ProducerClient::new(connected(&agent.addr).await);
    // Far more events than 16 KiB holds (each takes a 56-byte slot and its values).
    wait_for("the agent past seq 500", Duration::from_secs(60), || {
        let mut client = client.clone();
        async move {
            let r = client
                .query(pb::QueryRequest {
                    patterns: vec!["*".into()],
                    ..Default::default()
                })
                .await
                .map_err(|s| s.to_string())?
                .into_inner();
            let head = r.events.iter().map(|e| e.seq).max().unwrap_or(0);
            if head < 500 {
                return Err(format!("head seq {head}"));
            }
            Ok(())
        }
    })
    .await;
    let mut s = resume_from_one(&mut client, epoch, "agent-bytes-test").await;
    let mut dec = BatchDecoder::new();
    let mut gaps = Vec::new();
    let mut seqs = Vec::new();
    while seqs.len() < 200 {
        let b = next_batch(&mut s).await;
        gaps.extend(b.gaps.iter().map(|g| (g.from_seq, g.to_seq)));
        dec.decode_each(&b, |e| seqs.push(e.seq)).unwrap();
    }
    assert!(
        !gaps.is_empty(),
        "no gap, yet seq 1 left the ring long ago: {seqs:?}"
    );
    let (from, to) = gaps[0];
    assert_eq!(from, 1, "{gaps:?}");
    assert!(
        to >= 300,
        "16 KiB holds far fewer than the 500 published: {gaps:?}"
    );
    assert_eq!(seqs[0], to + 1, "events go on right after the gap");
    // In order; a later loss (this test's reader slowed down on a busy host) only with its
    // exact gap.
    for w in seqs.windows(2) {
        let told = gaps.iter().any(|&(f, t)| f == w[0] + 1 && t + 1 == w[1]);
        assert!(
            w[1] == w[0] + 1 || told,
            "{} -> {} without a gap: {gaps:?}",
            w[0],
            w[1]
        );
    }
}
