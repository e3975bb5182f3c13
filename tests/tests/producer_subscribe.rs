//! In-process producer on 127.0.0.1:0, real gRPC: subscriptions, gaps, resume, unsubscribe.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use gma_core::codec::BatchDecoder;
use gma_core::event::{dbl, EventData};
use gma_producer::{Producer, ProducerConfig};
use gma_proto::v1 as pb;
use gma_tests::wait_for;
use pb::producer_client::ProducerClient;
use tonic::transport::Channel;

struct Fixture {
    hub: Arc<gma_producer::Hub>,
    registry: Arc<gma_producer::Registry>,
    client: ProducerClient<Channel>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(buffer: usize) -> Fixture {
    let p = Producer::new(ProducerConfig {
        host_sensors: false,
        buffer_events: buffer,
        source: Some("t".into()),
        ..ProducerConfig::default()
    })
    .unwrap();
    p.hub
        .add_schemas(&[pb::EventSchema {
            name: "t.x".into(),
            version: 1,
            fields: vec![dbl("v", "", "")],
            description: String::new(),
        }])
        .unwrap();
    let hub = p.hub.clone();
    let registry = p.registry.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(p.run(listener, async {
        let _ = rx.await;
    }));
    let client = ProducerClient::new(gma_consumer::connect(&addr.to_string()).await.unwrap());
    Fixture {
        hub,
        registry,
        client,
        _stop: tx,
    }
}

fn publish(hub: &gma_producer::Hub, n: usize, source: &str) {
    let evs: Vec<EventData> = (0..n)
        .map(|i| EventData {
            name: "t.x".into(),
            source: source.into(),
            timestamp_ns: gma_core::time::now_ns(),
            numbers: vec![i as f64],
            strings: vec![],
        })
        .collect();
    hub.publish(&evs).1.unwrap();
}

fn req(resume: u64, epoch: u64) -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        patterns: vec!["t.*".into()],
        resume_from_seq: resume,
        epoch,
        consumer_id: "c1".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn resume_inside_the_window_loses_nothing_and_outside_reports_the_gap() {
    let mut f = start(100).await;
    publish(&f.hub, 50, "a");
    let epoch = f.hub.epoch();
    // Resume from seq 10: exactly 10..=50.
    let mut s = f.client.subscribe(req(10, epoch)).await.unwrap().into_inner();
    assert!(s.message().await.unwrap().unwrap().subscription_id > 0);
    let mut dec = BatchDecoder::new();
    let mut seqs = Vec::new();
    while seqs.len() < 41 {
        let b = s.message().await.unwrap().unwrap().batch.unwrap();
        assert!(b.gaps.is_empty());
        dec.decode_each(&b, |e| seqs.push(e.seq)).unwrap();
    }
    assert_eq!(seqs, (10..=50).collect::<Vec<_>>());
    drop(s);
    // 200 more: the ring (100) no longer holds seqs 51..=150.
    publish(&f.hub, 200, "a");
    let mut s = f.client.subscribe(req(51, epoch)).await.unwrap().into_inner();
    s.message().await.unwrap().unwrap();
    let b = s.message().await.unwrap().unwrap().batch.unwrap();
    assert_eq!(b.dropped, 100);
    assert_eq!((b.gaps[0].from_seq, b.gaps[0].to_seq), (51, 150));
    let mut first = 0;
    BatchDecoder::new()
        .decode_each(&b, |e| {
            if first == 0 {
                first = e.seq
            }
        })
        .unwrap();
    assert_eq!(first, 151);
    // A consumer from another run of the producer is told its old seqs are gone.
    let mut s = f.client.subscribe(req(5, epoch + 1)).await.unwrap().into_inner();
    s.message().await.unwrap().unwrap();
    let b = s.message().await.unwrap().unwrap().batch.unwrap();
    assert!(b.gaps[0].reason.contains("producer restarted"), "{:?}", b.gaps);
}

#[tokio::test]
async fn subscribe_starts_with_the_latest_value_of_each_series() {
    let mut f = start(1000).await;
    publish(&f.hub, 3, "a");
    publish(&f.hub, 2, "b");
    let mut s = f.client.subscribe(req(0, 0)).await.unwrap().into_inner();
    s.message().await.unwrap().unwrap();
    let b = s.message().await.unwrap().unwrap().batch.unwrap();
    let mut got = Vec::new();
    BatchDecoder::new()
        .decode_each(&b, |e| got.push((e.series.source.clone(), e.seq, e.numbers[0])))
        .unwrap();
    assert_eq!(got, vec![("a".into(), 3, 2.0), ("b".into(), 5, 1.0)]);
    // Then new events only.
    publish(&f.hub, 1, "a");
    let b = s.message().await.unwrap().unwrap().batch.unwrap();
    assert_eq!(b.first_seq, 6);
}

#[tokio::test]
async fn unsubscribe_and_disconnect_end_subscriptions() {
    let mut f = start(1000).await;
    let mut s1 = f.client.subscribe(req(0, 0)).await.unwrap().into_inner();
    let id1 = s1.message().await.unwrap().unwrap().subscription_id;
    let mut s2 = f.client.subscribe(req(0, 0)).await.unwrap().into_inner();
    s2.message().await.unwrap().unwrap();
    let mut other = req(0, 0);
    other.consumer_id = "c2".into();
    let mut s3 = f.client.subscribe(other).await.unwrap().into_inner();
    s3.message().await.unwrap().unwrap();
    assert_eq!(f.registry.len(), 3);

    // Someone else cannot end c1's subscription.
    let e = f
        .client
        .unsubscribe(pb::UnsubscribeRequest {
            subscription_id: id1,
            consumer_id: "c2".into(),
            all: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let r = f
        .client
        .unsubscribe(pb::UnsubscribeRequest {
            subscription_id: id1,
            consumer_id: "c1".into(),
            all: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.removed, 1);
    // After the confirmation nothing more arrives: the stream ends.
    publish(&f.hub, 5, "a");
    assert!(s1.message().await.unwrap().is_none());
    // Unsubscribe-all for c1 leaves c2 alone.
    let r = f
        .client
        .unsubscribe(pb::UnsubscribeRequest {
            subscription_id: 0,
            consumer_id: "c1".into(),
            all: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.removed, 1);
    // Events published after the confirmation never reach c1; what was in flight before may.
    let confirmed_head = f.hub.lock().head();
    publish(&f.hub, 5, "a");
    let mut dec = BatchDecoder::new();
    while let Some(m) = s2.message().await.unwrap() {
        if let Some(b) = m.batch {
            dec.decode_each(&b, |e| {
                assert!(e.seq < confirmed_head, "seq {} after unsubscribe", e.seq)
            })
            .unwrap();
        }
    }
    let reg = f.registry.clone();
    wait_for("one registered subscription", Duration::from_secs(5), || {
        let n = reg.len();
        async move {
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} subscriptions"))
            }
        }
    })
    .await;
    assert!(s3.message().await.unwrap().unwrap().batch.is_some());
    // A consumer that just goes away is unsubscribed.
    drop(s3);
    publish(&f.hub, 1, "a");
    wait_for("no registered subscription", Duration::from_secs(5), || {
        let n = reg.len();
        async move {
            if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} subscriptions"))
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_slow_consumer_never_blocks_the_sensor() {
    let mut f = start(1000).await;
    let mut s = f.client.subscribe(req(0, 0)).await.unwrap().into_inner();
    s.message().await.unwrap().unwrap();
    // The consumer reads nothing while 200,000 events are published: publish never waits.
    for _ in 0..200 {
        publish(&f.hub, 1000, "a");
    }
    assert_eq!(f.hub.lock().head(), 200_001);
    // When it reads again it learns exactly how much it lost, and the stream goes on.
    let mut dropped = 0;
    let mut last = 0;
    let mut dec = BatchDecoder::new();
    while last < 200_000 {
        let b = s.message().await.unwrap().unwrap().batch.unwrap();
        dropped += b.dropped;
        dec.decode_each(&b, |e| last = e.seq).unwrap();
    }
    assert!(dropped > 0);
    assert_eq!(last, 200_000);
}
