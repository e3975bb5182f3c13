//! The consumer library against a real in-process directory and two producers on 127.0.0.1:0.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber, SubscriberOptions};
use gma_producer::{Producer, ProducerConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

async fn directory(dir: &std::path::Path) -> (String, oneshot::Sender<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = oneshot::channel::<()>();
    let cfg = gma_directory::DirectoryConfig::new(dir);
    tokio::spawn(gma_directory::run(cfg, l, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

async fn sim_producer(
    tmp: &std::path::Path,
    dir: &str,
    host: &str,
) -> (String, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let file = tmp.join(format!("{host}.toml"));
    std::fs::write(
        &file,
        format!("period_ms = 50\n[[host]]\nname = \"{host}\"\ncpus = 4\nmemory_mb = 1024\nload = 1.0\n"),
    )
    .unwrap();
    let p = Producer::new(ProducerConfig {
        registration: gma_core::registration::Registration {
            directory: Some(dir.to_string()),
            lease_ttl_ms: 2000,
            ..Default::default()
        },
        host_sensors: false,
        source: Some(format!("p-{host}")),
        simulate: Some(file),
        ..ProducerConfig::default()
    })
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let id = format!("p-{host}@{}", l.local_addr().unwrap());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        p.run(l, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    (id, tx, task)
}

async fn next(sub: &mut Subscriber) -> Delivery {
    tokio::time::timeout(Duration::from_secs(20), sub.recv())
        .await
        .expect("no delivery within 20 s")
        .expect("subscriber ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_merges_and_follows_producers() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _dir_stop) = directory(&tmp.path().join("dir")).await;
    let (id_a, stop_a, task_a) = sim_producer(tmp.path(), &dir, "hostA").await;
    let (id_b, _stop_b, _task_b) = sim_producer(tmp.path(), &dir, "hostB").await;
    let mut sub = Subscriber::start(
        SubscriberOptions {
            directory: dir.clone(),
            stream: StreamOptions {
                patterns: vec!["host.load".into()],
                ..StreamOptions::default()
            },
            capacity: 16,
            default_resume: None,
        },
        HashMap::new(),
    );
    // Events from both producers arrive on one channel, each stream in seq order.
    let mut sources = HashSet::new();
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    while sources.len() < 2 {
        if let Delivery::Events { producer, events, .. } = next(&mut sub).await {
            for e in events {
                assert_eq!(e.series.name, "host.load");
                let last = last_seq.entry(producer.clone()).or_default();
                assert!(e.seq > *last, "seqs must increase per producer");
                *last = e.seq;
                sources.insert(e.series.source.clone());
            }
        }
    }
    assert_eq!(sources, HashSet::from(["hostA".to_string(), "hostB".to_string()]));
    assert!(sub.resume_points().contains_key(&id_a) && sub.resume_points().contains_key(&id_b));

    // A producer that stops leaves the directory; the subscriber reports it and goes on.
    let _ = stop_a.send(());
    task_a.await.unwrap();
    loop {
        match next(&mut sub).await {
            Delivery::Gone { producer, .. } => {
                assert_eq!(producer, id_a);
                break;
            }
            Delivery::Events { .. } | Delivery::Reconnecting { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut from_b = 0;
    while from_b < 3 {
        if let Delivery::Events { producer, events, .. } = next(&mut sub).await {
            assert_eq!(producer, id_b, "nothing more from the stopped producer");
            from_b += events.len();
        }
    }
}
