//! Per-identity limits of a producer, in-process on 127.0.0.1:0 over real gRPC: open
//! subscriptions per connection (claimed by Subscribe, freed when the stream closes) and the
//! request rate (a token bucket per identity; anonymous peers are counted per IP address).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use gma_core::event::{dbl, EventData};
use gma_core::guard::Limits;
use gma_producer::{Producer, ProducerConfig, ProducerError};
use gma_proto::v1 as pb;
use pb::producer_client::ProducerClient;
use tonic::transport::Channel;
use tonic::Code;

struct Fixture {
    addr: String,
    hub: Arc<gma_producer::Hub>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(limits: Limits) -> Fixture {
    let p = Producer::new(ProducerConfig {
        host_sensors: false,
        source: Some("t".into()),
        endpoint: gma_core::endpoint::Endpoint {
            limits,
            ..Default::default()
        },
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(p.run(listener, async {
        let _ = rx.await;
    }));
    Fixture { addr, hub, _stop: tx }
}

/// A new client on its own connection (one tonic Channel = one HTTP/2 connection).
async fn client(addr: &str) -> ProducerClient<Channel> {
    ProducerClient::new(gma_consumer::connect(addr).await.unwrap())
}

fn publish(hub: &gma_producer::Hub, v: f64) {
    hub.publish(&[EventData {
        name: "t.x".into(),
        source: "a".into(),
        timestamp_ns: gma_core::time::now_ns(),
        numbers: vec![v],
        strings: vec![],
    }])
    .1
    .unwrap();
}

fn sub_req() -> pb::SubscribeRequest {
    pb::SubscribeRequest {
        patterns: vec!["t.*".into()],
        consumer_id: "limits-test".into(),
        ..Default::default()
    }
}

type Stream = tonic::Streaming<pb::SubscribeResponse>;

/// Subscribes and reads the first message (the subscription id): the stream is open.
async fn open(c: &mut ProducerClient<Channel>) -> Result<Stream, tonic::Status> {
    let mut s = c.subscribe(sub_req()).await?.into_inner();
    let first = s.message().await?.expect("first message");
    assert!(first.subscription_id > 0);
    Ok(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_per_connection_are_limited_and_freed_when_a_stream_closes() {
    let f = start(Limits {
        subscriptions_per_connection: 4,
        ..Limits::default()
    })
    .await;
    publish(&f.hub, 1.0);
    let mut c = client(&f.addr).await;
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(open(&mut c).await.unwrap());
    }
    let e = open(&mut c).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("too many subscriptions") && e.message().contains("limit 4"),
        "{}",
        e.message()
    );

    // The four keep being served.
    publish(&f.hub, 2.0);
    for s in &mut streams {
        let m = tokio::time::timeout(Duration::from_secs(10), s.message())
            .await
            .expect("an open stream is served")
            .unwrap()
            .unwrap();
        assert!(m.batch.is_some());
    }

    // Another connection has its own slots.
    let mut other = client(&f.addr).await;
    let _elsewhere = open(&mut other).await.unwrap();

    // Closing one stream frees its slot (the server notices the reset stream): poll.
    drop(streams.pop());
    let reopened = gma_tests::wait_for(
        "the closed stream's slot to be freed",
        Duration::from_secs(10),
        || {
            let mut c = c.clone();
            async move {
                match open(&mut c).await {
                    Err(e) if e.code() != Code::ResourceExhausted => panic!("{e:?}"),
                    r => r,
                }
            }
        },
    )
    .await;
    streams.push(reopened);
    // ... and only that one.
    assert_eq!(open(&mut c).await.unwrap_err().code(), Code::ResourceExhausted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_rate_is_limited_and_the_producer_serves_again_after_refill() {
    let f = start(Limits {
        requests_per_s: 1.0,
        burst: 3.0,
        ..Limits::default()
    })
    .await;
    publish(&f.hub, 1.0);
    let mut c = client(&f.addr).await;
    let q = || pb::QueryRequest {
        patterns: vec!["t.x".into()],
        ..Default::default()
    };
    for i in 0..3 {
        let r = c.query(q()).await.unwrap_or_else(|e| panic!("query {i}: {e:?}"));
        assert_eq!(r.into_inner().events.len(), 1);
    }
    let e = c.query(q()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("rate limit") && e.message().contains("127.0.0.1"),
        "{}",
        e.message()
    );
    // A subscription is a request too.
    let e = c.subscribe(sub_req()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // Version is exempt.
    c.version(pb::VersionRequest {}).await.unwrap();

    // The bucket refills (one token a second): served again, the data intact.
    let r = gma_tests::wait_for("the bucket to refill", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            match c.query(q()).await {
                Err(e) if e.code() != Code::ResourceExhausted => panic!("{e:?}"),
                r => r,
            }
        }
    })
    .await;
    assert_eq!(r.into_inner().events[0].seq, 1);
}

#[test]
fn a_bad_package_list_is_a_config_error() {
    let cfg = |packages: &[&str]| ProducerConfig {
        source: Some("t".into()),
        packages: Some(packages.iter().map(|p| p.to_string()).collect()),
        ..ProducerConfig::default()
    };
    for bad in [&["--admindir=/tmp"][..], &["Python3"], &["ok", "a b"]] {
        match Producer::new(cfg(bad)) {
            Err(ProducerError::Config(m)) => assert!(m.contains("not a Debian package name"), "{m}"),
            Err(e) => panic!("not a config error: {e}"),
            Ok(_) => panic!("{bad:?} accepted"),
        }
    }
    assert!(Producer::new(cfg(&["python3", "g++", "libc6"])).is_ok());
}

#[test]
fn invalid_limits_and_policy_files_are_config_errors() {
    let cfg = |limits: Limits, policy: Option<std::path::PathBuf>| ProducerConfig {
        host_sensors: false,
        source: Some("t".into()),
        endpoint: gma_core::endpoint::Endpoint {
            limits,
            access_policy: policy,
            ..Default::default()
        },
        ..ProducerConfig::default()
    };
    let err = |c: ProducerConfig| match Producer::new(c) {
        Err(ProducerError::Config(m)) => m,
        Err(e) => panic!("not a config error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    let m = err(cfg(
        Limits {
            subscriptions_per_connection: 0,
            ..Limits::default()
        },
        None,
    ));
    assert!(m.contains("subscriptions_per_connection"), "{m}");
    let m = err(cfg(
        Limits {
            requests_per_s: f64::NAN,
            ..Limits::default()
        },
        None,
    ));
    assert!(m.contains("requests_per_s"), "{m}");

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nosuch.toml");
    let m = err(cfg(Limits::default(), Some(missing.clone())));
    assert!(m.contains(missing.to_str().unwrap()), "{m}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[rule]]\nactions = [\"producer.subscribe\"]\neffect = \"maybe\"\n",
    )
    .unwrap();
    let m = err(cfg(Limits::default(), Some(bad.clone())));
    assert!(m.contains(bad.to_str().unwrap()) && m.contains("line 3"), "{m}");
}
