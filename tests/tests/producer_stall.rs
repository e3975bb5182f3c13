//! Slow-consumer isolation, in-process producer on 127.0.0.1:0, real gRPC: a subscriber that
//! stops reading costs the producer no memory of its own and never delays another subscriber;
//! when it reads again it is told what it lost (drop-oldest: an exact gap; latest: a conflated
//! count and the newest value of each series).
//!
//! One test in this binary: it measures the process's RSS, which tests running alongside would
//! disturb.
//!
//! Seqs are the producer's, not the test's: the producer publishes its own events into the same
//! log (`gma.rpc` every `rpc_events_ms`, here short so that they always land between the test's
//! rounds), which `t.*` does not select. The accounting is therefore over the seqs the test
//! published; a seq it did not publish may be skipped (a subscription only gets what it selects)
//! or counted in a gap.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use gma_core::codec::BatchDecoder;
use gma_core::event::{dbl, EventData};
use gma_producer::{Producer, ProducerConfig};
use gma_proto::v1 as pb;
use pb::producer_client::ProducerClient;
use prost::Message;
use tonic::Streaming;

/// Events the ring keeps.
const RING: usize = 10_000;
/// Published in rounds of `PER_ROUND`, waiting for the fast consumer after each round.
const ROUNDS: usize = 700;
const PER_ROUND: usize = 1000;
const SOURCES: usize = 10;
/// Numeric fields per event: about 100 encoded bytes per event.
const FIELDS: usize = 12;
/// How much the process's RSS may grow while the events pass. A producer that kept each
/// stalled subscriber's backlog (raw or encoded) would exceed it: each backlog alone is larger
/// (checked below).
const RSS_GROWTH_BOUND: u64 = 64 << 20;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// The seqs the test published, in order: one contiguous range per round (one `publish` call
/// holds the hub's lock for the whole round).
#[derive(Default)]
struct Published(Vec<std::ops::RangeInclusive<u64>>);

impl Published {
    /// How many seqs in `from..=to` the test published.
    fn count(&self, from: u64, to: u64) -> u64 {
        self.0
            .iter()
            .map(|r| {
                let (a, b) = ((*r.start()).max(from), (*r.end()).min(to));
                if a <= b {
                    b - a + 1
                } else {
                    0
                }
            })
            .sum()
    }

    fn total(&self) -> u64 {
        self.count(0, u64::MAX)
    }

    fn last(&self) -> u64 {
        self.0.last().map_or(0, |r| *r.end())
    }
}

/// Publishes one round; returns the seqs it got.
fn publish(hub: &gma_producer::Hub, round: usize) -> std::ops::RangeInclusive<u64> {
    let evs: Vec<EventData> = (0..PER_ROUND)
        .map(|i| {
            let k = (round * PER_ROUND + i) as f64;
            EventData {
                name: "t.x".into(),
                source: format!("s{}", i % SOURCES),
                timestamp_ns: gma_core::time::now_ns(),
                numbers: (0..FIELDS).map(|f| k + f as f64 / 16.0).collect(),
                strings: vec![],
            }
        })
        .collect();
    let (last, r) = hub.publish(&evs);
    r.unwrap();
    last + 1 - PER_ROUND as u64..=last
}

async fn subscribe(addr: &str, policy: pb::SlowPolicy) -> Streaming<pb::SubscribeResponse> {
    // Each subscriber on its own connection, as separate consumers would be.
    let mut client = ProducerClient::new(gma_consumer::connect(addr).await.unwrap());
    let mut s = client
        .subscribe(pb::SubscribeRequest {
            patterns: vec!["t.*".into()],
            policy: policy as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(s.message().await.unwrap().unwrap().subscription_id > 0);
    s
}

/// What a woken stalled subscriber received, accounted seq by seq.
#[derive(Default)]
struct Account {
    /// The next seq not yet accounted for (received, in a gap or conflated).
    next: u64,
    received: u64,
    dropped: u64,
    /// Of `dropped`, the seqs the test published.
    ours_dropped: u64,
    gaps: usize,
    conflated: u64,
    /// Newest value (field 0) received per source.
    last_value: HashMap<String, f64>,
}

/// Reads `s` until the test's last event arrived. With `exact`, every seq the test published
/// must be either received in order or inside a reported gap (drop-oldest), and a seq skipped
/// without a gap must be one the test did not publish; otherwise seqs may also be skipped by
/// conflation (latest), and the counts must add up.
async fn wake(s: &mut Streaming<pb::SubscribeResponse>, published: &Published, exact: bool) -> Account {
    let mut a = Account {
        next: 1,
        ..Default::default()
    };
    let mut dec = BatchDecoder::new();
    let mut last = 0;
    while last < published.last() {
        let b = s.message().await.unwrap().unwrap().batch.unwrap();
        for g in &b.gaps {
            assert!(g.from_seq >= a.next, "a gap starts where the stream stopped");
            assert_eq!(
                published.count(a.next, g.from_seq - 1),
                0,
                "seqs {}..{} skipped without a gap",
                a.next,
                g.from_seq
            );
            assert_eq!(g.dropped, g.to_seq - g.from_seq + 1, "{g:?}");
            a.next = g.to_seq + 1;
            a.dropped += g.dropped;
            a.ours_dropped += published.count(g.from_seq, g.to_seq);
            a.gaps += 1;
        }
        a.conflated += b.conflated;
        dec.decode_each(&b, |e| {
            if exact {
                assert!(e.seq >= a.next, "seq {} again", e.seq);
                assert_eq!(
                    published.count(a.next, e.seq - 1),
                    0,
                    "drop-oldest: every seq is delivered or in a gap (seq {} received, {} expected)",
                    e.seq,
                    a.next
                );
            } else {
                assert!(e.seq >= a.next);
            }
            a.next = e.seq + 1;
            a.received += 1;
            last = e.seq;
            a.last_value.insert(e.series.source.clone(), e.numbers[0]);
        })
        .unwrap();
    }
    a
}

#[tokio::test]
async fn a_stalled_subscriber_costs_no_memory_and_never_delays_another() {
    let p = Producer::new(ProducerConfig {
        host_sensors: false,
        buffer_events: RING,
        source: Some("t".into()),
        // The producer's own `gma.rpc` events (10 s by default: they took seqs between the
        // rounds only on a slow machine) every 50 ms: seqs the test did not publish, always.
        endpoint: gma_core::endpoint::Endpoint {
            rpc_events_ms: Some(50),
            ..Default::default()
        },
        ..ProducerConfig::default()
    })
    .unwrap();
    p.hub
        .add_schemas(&[pb::EventSchema {
            name: "t.x".into(),
            version: 1,
            fields: (0..FIELDS).map(|f| dbl(&format!("v{f}"), "", "")).collect(),
            description: String::new(),
        }])
        .unwrap();
    let hub = p.hub.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(p.run(listener, async {
        let _ = rx.await;
    }));

    // Subscribed before the first event, so every stream starts at seq 1. The two stalled
    // subscribers never read until the end.
    let mut stalled_drop = subscribe(&addr, pb::SlowPolicy::DropOldest).await;
    let mut stalled_latest = subscribe(&addr, pb::SlowPolicy::Latest).await;
    let mut fast = subscribe(&addr, pb::SlowPolicy::DropOldest).await;

    let mut dec = BatchDecoder::new();
    let mut next = 1u64;
    let mut wire_bytes = 0u64;
    let mut fast_last: HashMap<String, f64> = HashMap::new();
    let mut rss_start = 0;
    let mut rss_peak = 0;
    let mut published = Published::default();
    for round in 0..ROUNDS {
        let seqs = publish(&hub, round);
        let mine = seqs.clone();
        published.0.push(seqs);
        {
            let inner = hub.lock();
            // No block subscriber: the ring never holds more than its capacity.
            assert!(inner.head() - inner.oldest() <= RING as u64);
        }
        // Wait on the fast consumer's progress: it gets every event the test published, in
        // order, without a gap (seqs the producer gave its own events are not selected).
        while next <= *mine.end() {
            let b = fast.message().await.unwrap().unwrap().batch.unwrap();
            assert!(
                b.gaps.is_empty() && b.dropped == 0,
                "fast consumer lost events: {:?}",
                b.gaps
            );
            assert_eq!(b.conflated, 0);
            wire_bytes += b.encoded_len() as u64;
            dec.decode_each(&b, |e| {
                assert!(e.seq >= next, "seq {} again", e.seq);
                assert_eq!(
                    published.count(next, e.seq - 1),
                    0,
                    "fast consumer: seq {} received, {next} expected (no gap)",
                    e.seq
                );
                next = e.seq + 1;
                fast_last.insert(e.series.source.clone(), e.numbers[0]);
            })
            .unwrap();
        }
        // The baseline is taken once the stalled streams had every chance to fill their
        // flow-control windows and the ring is full.
        if round == RING / PER_ROUND {
            rss_start = rss_bytes();
        }
        if round > RING / PER_ROUND {
            rss_peak = rss_peak.max(rss_bytes());
        }
    }
    let head = hub.lock().head();
    assert_eq!(published.total(), (ROUNDS * PER_ROUND) as u64);
    assert_eq!(next, published.last() + 1);
    // The measurement means something only if one stalled subscriber's backlog alone would
    // exceed the bound: the backlog counted as what the fast consumer received on the wire.
    assert!(
        wire_bytes > RSS_GROWTH_BOUND,
        "test too small: {wire_bytes} bytes passed"
    );
    let growth = rss_peak.saturating_sub(rss_start);
    eprintln!(
        "{} events ({} of them the producer's own), {} MiB on the wire per subscriber; RSS {} MiB at the start, peak growth {} KiB",
        head - 1,
        head - 1 - published.total(),
        wire_bytes >> 20,
        rss_start >> 20,
        growth >> 10
    );
    assert!(
        growth < RSS_GROWTH_BOUND,
        "RSS grew by {} MiB (from {} MiB) while {} MiB of events passed two stalled subscribers",
        growth >> 20,
        rss_start >> 20,
        wire_bytes >> 20
    );

    // Drop-oldest, woken: whatever sat in the pipe, then an exact gap, then the ring.
    let a = wake(&mut stalled_drop, &published, true).await;
    assert_eq!(a.next, published.last() + 1);
    assert!(a.gaps >= 1 && a.dropped > 0, "no gap reported");
    assert_eq!(a.conflated, 0);
    // Every event the test published: received or in a gap, exactly once.
    assert_eq!(a.received + a.ours_dropped, published.total());
    assert!(a.received + a.dropped < head);
    assert!(
        a.received <= (RING + PER_ROUND) as u64 + (16 << 20) / 100,
        "{} events delivered: more than the ring plus what flow control holds",
        a.received
    );

    // Latest, woken: the backlog is conflated to the newest value of each series.
    eprintln!(
        "drop-oldest woken: {} received, {} dropped in {} gap(s)",
        a.received, a.dropped, a.gaps
    );
    let l = wake(&mut stalled_latest, &published, false).await;
    eprintln!(
        "latest woken: {} received, {} dropped in {} gap(s), {} conflated",
        l.received, l.dropped, l.gaps, l.conflated
    );
    assert!(l.conflated > 0, "nothing conflated");
    // Conflation, not a gap, even for the part the ring overwrote: the latest-value cache
    // still has the newest value of every series.
    assert_eq!((l.gaps, l.dropped), (0, 0), "latest reported a gap");
    // Conflation counts what the ring overwrote whether selected or not (an upper bound): at
    // least every event the test published, at most every seq.
    let sum = l.received + l.dropped + l.conflated;
    assert!(
        (published.total()..head).contains(&sum),
        "latest: {sum} received and conflated, {} published, head {head}",
        published.total()
    );
    assert_eq!(l.last_value, fast_last, "latest: the newest value of each series");
    let _ = stop.send(());
}
