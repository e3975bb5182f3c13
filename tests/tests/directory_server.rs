//! The directory over real gRPC: `gma_directory::run` on a port-0 listener, the generated
//! `DirectoryClient`, a temporary data directory.
#![allow(clippy::unwrap_used)]

use gma_tests::directory as common;

use std::io::Write;
use std::time::Duration;

use common::*;
use gma_proto::v1::{self as pb, record::Record as Body};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const ADDR: &str = "http://127.0.0.1:7001";

#[tokio::test]
async fn register_then_search_finds_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;

    let r = register(
        &mut c,
        producer("host-a/producer", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        0,
    )
    .await;
    assert_eq!(r.lease_ttl_ms, 10_000, "0 asks for the default TTL");
    assert_eq!(r.revision, 1);
    assert!(r.lease_id > 0);

    let resp = c
        .search(pb::SearchRequest {
            event_pattern: "host.cpu".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.revision, 1);
    assert_eq!(resp.entries.len(), 1);
    let entry = &resp.entries[0];
    assert_eq!(entry.lease_id, r.lease_id);
    let Some(Body::Producer(p)) = entry.record.as_ref().and_then(|r| r.record.as_ref()) else {
        panic!("expected a producer: {entry:?}");
    };
    assert_eq!(p.address, ADDR);
    assert_eq!(p.services, vec!["query".to_string(), "subscribe".to_string()]);

    // A consumer accepting host.* is found by a producer looking for consumers of host.cpu.
    register(&mut c, consumer("archiver", &["host.*"]), vec![], 0).await;
    let resp = c
        .search(pb::SearchRequest {
            kind: pb::RecordKind::Consumer as i32,
            event_pattern: "host.cpu".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&resp), vec!["archiver"]);

    // Nothing matched: OK with no entries, not an error.
    let resp = c
        .search(pb::SearchRequest {
            event_pattern: "net.*".into(),
            kind: pb::RecordKind::Producer as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.entries.is_empty());
    assert_eq!(resp.revision, 2);

    let schema_resp = c
        .get_schema(pb::GetSchemaRequest {
            name: "host.cpu".into(),
            version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(schema_resp.schema, Some(schema("host.cpu")));
    let e = c
        .get_schema(pb::GetSchemaRequest {
            name: "host.nope".into(),
            version: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let v = c.version(pb::VersionRequest {}).await.unwrap().into_inner();
    assert_eq!(v.interface, "gma.v1");
    assert_eq!(v.role, "directory");
    assert_eq!(v.server, gma_core::SERVER_VERSION);
    let cs = c
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cs.leader_id, 1);
    assert_eq!(cs.members.len(), 1);
    assert_eq!(cs.members[0].address, server.url());
    assert!(cs.members[0].leader);
    assert_eq!(
        (cs.revision, cs.producers, cs.consumers, cs.schemas, cs.leases),
        (2, 1, 1, 1, 2)
    );

    server.stop().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_precise_codes_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;
    register(
        &mut c,
        producer("p1", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        0,
    )
    .await;
    let before = c
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();

    let req = |record, schemas, lease_ttl_ms| pb::RegisterRequest {
        record: Some(record),
        schemas,
        lease_ttl_ms,
    };
    // Duplicate.
    let e = c
        .register(req(producer("p1", ADDR, &["host.cpu"]), vec![], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    // Event without a schema.
    let e = c
        .register(req(producer("p2", ADDR, &["host.disk"]), vec![], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "event host.disk has no schema: send it in schemas");
    // A schema redefined under an existing version.
    let mut changed = schema("host.cpu");
    changed.fields.push(gma_core::event::dbl("idle", "%", ""));
    let e = c
        .register(req(producer("p2", ADDR, &["host.cpu"]), vec![changed], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    assert!(
        e.message().contains("register it as version 2"),
        "{}",
        e.message()
    );
    // A record missing its address (non-conforming).
    let e = c
        .register(req(producer("p2", "", &["host.cpu"]), vec![], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // No record at all.
    let e = c.register(pb::RegisterRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // TTL out of range.
    let e = c
        .register(req(producer("p2", ADDR, &["host.cpu"]), vec![], 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("lease_ttl_ms 1 is outside [500, 3600000]"),
        "{}",
        e.message()
    );

    // Update / Remove of a missing id.
    let e = c
        .update(pb::UpdateRequest {
            record: Some(producer("nope", ADDR, &["host.cpu"])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "no producer record with id nope");
    let e = c
        .remove(pb::RemoveRequest {
            kind: pb::RecordKind::Producer as i32,
            id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .remove(pb::RemoveRequest {
            kind: pb::RecordKind::Unspecified as i32,
            id: "p1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Malformed pattern: the message names the position.
    let e = c
        .search(pb::SearchRequest {
            event_pattern: "host..cpu".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("at position 5"), "{}", e.message());
    let e = c
        .search(pb::SearchRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c
        .watch(pb::WatchRequest {
            event_pattern: "a b".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    let after = c
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    // Rejected commands may still occupy log entries; the directory's content is unchanged.
    let content = |s: &pb::ClusterStatusResponse| (s.revision, s.producers, s.consumers, s.schemas, s.leases);
    assert_eq!(content(&after), content(&before), "the directory is unchanged");

    // Remove then search: the well-defined empty answer.
    let r = c
        .remove(pb::RemoveRequest {
            kind: pb::RecordKind::Producer as i32,
            id: "p1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.revision, before.revision + 1);
    assert!(search_id(&mut c, "p1").await.entries.is_empty());
    server.stop().await.unwrap();
}

#[tokio::test]
async fn update_replaces_values_and_search_pages() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;
    let first = register(
        &mut c,
        producer("p1", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        0,
    )
    .await;
    let u = c
        .update(pb::UpdateRequest {
            record: Some(producer("p1", "http://127.0.0.1:7002", &["host.cpu", "host.mem"])),
            schemas: vec![schema("host.mem")],
            lease_ttl_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(u.lease_id, first.lease_id, "ttl 0 keeps the lease");
    assert_eq!(u.revision, 2);
    let resp = search_id(&mut c, "p1").await;
    assert_eq!(resp.entries.len(), 1, "no copy of the old values");
    let Some(Body::Producer(p)) = resp.entries[0].record.as_ref().and_then(|r| r.record.as_ref()) else {
        panic!("expected a producer");
    };
    assert_eq!(p.address, "http://127.0.0.1:7002");
    assert_eq!(
        (resp.entries[0].create_revision, resp.entries[0].mod_revision),
        (1, 2)
    );

    for i in 2..=7 {
        register(&mut c, producer(&format!("p{i}"), ADDR, &["host.cpu"]), vec![], 0).await;
    }
    let single = c
        .search(pb::SearchRequest {
            single: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(single.entries.len(), 1);
    assert!(single.next_page_token.is_empty());
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let resp = c
            .search(pb::SearchRequest {
                page_size: 3,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        seen.extend(ids(&resp));
        if resp.next_page_token.is_empty() {
            break;
        }
        token = resp.next_page_token;
    }
    assert_eq!(
        seen,
        (1..=7).map(|i| format!("p{i}")).collect::<Vec<_>>(),
        "each exactly once"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_requests_and_garbage_do_not_hurt_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;

    let mut big = producer("big", ADDR, &["host.cpu"]);
    if let Some(Body::Producer(p)) = big.record.as_mut() {
        p.attributes.insert("blob".into(), "x".repeat(5 << 20));
    }
    let e = c
        .register(pb::RegisterRequest {
            record: Some(big),
            schemas: vec![schema("host.cpu")],
            lease_ttl_ms: 0,
        })
        .await
        .unwrap_err();
    // tonic answers OUT_OF_RANGE (the gRPC spec would say RESOURCE_EXHAUSTED).
    assert!(
        matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{e:?}"
    );

    for (i, len) in [(1u64, 1usize), (2, 100), (3, 10_000), (4, 1 << 20)].into_iter() {
        let mut s = std::net::TcpStream::connect(server.addr).unwrap();
        // The peer may reset the connection once it sees garbage; that is fine.
        let _ = s.write_all(&garbage(i, len));
        drop(s);
    }
    // An HTTP/2 preface followed by nonsense frames.
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(garbage(9, 4096));
    let _ = s.write_all(&bytes);
    drop(s);

    // Still serving, on the old connection and on a new one.
    c.version(pb::VersionRequest {}).await.unwrap();
    let mut fresh = server.client().await;
    register(
        &mut fresh,
        producer("p1", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        0,
    )
    .await;
    assert!(search_id(&mut c, "big").await.entries.is_empty());
    server.stop().await.unwrap();
}

#[tokio::test]
async fn an_unrenewed_lease_expires_and_watchers_see_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;
    let r = register(
        &mut c,
        producer("dying", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        600,
    )
    .await;
    assert_eq!(r.lease_ttl_ms, 600);

    let mut watch = c
        .watch(pb::WatchRequest {
            from_revision: r.revision,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (replayed, _) = until_synced(&mut watch).await;
    assert_eq!(replayed.len(), 1);
    // No keepalive: the next event is the expiry.
    let ev = next(&mut watch).await.unwrap().unwrap();
    assert_eq!(ev.r#type(), pb::WatchEventType::Delete);
    assert_eq!(ev.reason, "lease expired");
    assert_eq!(ev.revision, r.revision + 1);
    assert_eq!(ev.entry.as_ref().map(|e| e.lease_id), Some(r.lease_id));
    assert!(search_id(&mut c, "dying").await.entries.is_empty());

    // A keepalive for the dead lease answers ttl 0 and the stream stays open.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = c.keep_alive(ReceiverStream::new(rx)).await.unwrap().into_inner();
    tx.send(pb::KeepAliveRequest { lease_id: r.lease_id })
        .await
        .unwrap();
    let reply = next(&mut replies).await.unwrap().unwrap();
    assert_eq!((reply.lease_id, reply.ttl_ms), (r.lease_id, 0));
    tx.send(pb::KeepAliveRequest { lease_id: 424242 }).await.unwrap();
    assert_eq!(next(&mut replies).await.unwrap().unwrap().ttl_ms, 0);
    drop(tx);
    assert!(
        next(&mut replies).await.unwrap().is_none(),
        "closing the requests ends the stream"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn keepalive_keeps_a_record_past_several_ttls() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;
    let ttl = 600;
    let r = register(
        &mut c,
        producer("alive", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        ttl,
    )
    .await;

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = c.keep_alive(ReceiverStream::new(rx)).await.unwrap().into_inner();
    // Beat every ttl/6 until four TTLs have passed since registration; every beat must find
    // the lease alive.
    let started = std::time::Instant::now();
    let mut beat = tokio::time::interval(Duration::from_millis(ttl / 6));
    let mut beats = 0;
    while started.elapsed() < Duration::from_millis(4 * ttl) {
        beat.tick().await;
        tx.send(pb::KeepAliveRequest { lease_id: r.lease_id })
            .await
            .unwrap();
        let reply = next(&mut replies).await.unwrap().unwrap();
        assert_eq!((reply.lease_id, reply.ttl_ms), (r.lease_id, ttl), "beat {beats}");
        beats += 1;
    }
    assert_eq!(search_id(&mut c, "alive").await.entries.len(), 1);
    // Nothing happened since the registration.
    let mut watch = c
        .watch(pb::WatchRequest {
            from_revision: r.revision + 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (events, synced) = until_synced(&mut watch).await;
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(synced, r.revision);

    // Stop beating: it goes.
    drop(tx);
    let ev = next(&mut watch).await.unwrap().unwrap();
    assert_eq!(ev.r#type(), pb::WatchEventType::Delete);
    assert_eq!(ev.reason, "lease expired");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn watch_from_zero_gives_snapshot_synced_then_live() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;
    register(
        &mut c,
        producer("p1", ADDR, &["host.cpu"]),
        vec![schema("host.cpu"), schema("net.tcp")],
        0,
    )
    .await;
    register(&mut c, producer("p2", ADDR, &["net.tcp"]), vec![], 0).await;
    c.update(pb::UpdateRequest {
        record: Some(producer("p1", ADDR, &["host.cpu"])),
        ..Default::default()
    })
    .await
    .unwrap();

    let mut all = c.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    let mut host = c
        .watch(pb::WatchRequest {
            event_pattern: "host.*".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (snapshot, synced) = until_synced(&mut all).await;
    assert_eq!(synced, 3);
    let got: Vec<(i32, u64)> = snapshot.iter().map(|e| (e.r#type, e.revision)).collect();
    let put = pb::WatchEventType::Put as i32;
    assert_eq!(got, vec![(put, 3), (put, 2)], "p1 at its mod revision, then p2");
    let (snapshot, _) = until_synced(&mut host).await;
    assert_eq!(snapshot.len(), 1);

    register(&mut c, producer("p3", ADDR, &["net.tcp"]), vec![], 0).await;
    register(&mut c, producer("p4", ADDR, &["host.cpu"]), vec![], 0).await;
    let ev = next(&mut all).await.unwrap().unwrap();
    assert_eq!((ev.r#type(), ev.revision), (pb::WatchEventType::Put, 4));
    let ev = next(&mut all).await.unwrap().unwrap();
    assert_eq!(ev.revision, 5);
    let ev = next(&mut host).await.unwrap().unwrap();
    assert_eq!(ev.revision, 5, "the filtered watch skips net.tcp");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn watch_resumes_with_exactly_the_missed_changes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(gma_directory::DirectoryConfig {
        history_limit: 5,
        ..config(dir.path())
    })
    .await;
    let mut c = server.client().await;
    register(
        &mut c,
        producer("a", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        0,
    )
    .await;
    register(&mut c, producer("b", ADDR, &["host.cpu"]), vec![], 0).await;
    let mut watch = c.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    let (_, seen) = until_synced(&mut watch).await;
    assert_eq!(seen, 2);
    drop(watch);

    // Missed while disconnected.
    c.update(pb::UpdateRequest {
        record: Some(producer("a", "http://127.0.0.1:7009", &["host.cpu"])),
        ..Default::default()
    })
    .await
    .unwrap();
    c.remove(pb::RemoveRequest {
        kind: pb::RecordKind::Producer as i32,
        id: "b".into(),
    })
    .await
    .unwrap();
    register(&mut c, producer("c", ADDR, &["host.cpu"]), vec![], 0).await;

    let mut watch = c
        .watch(pb::WatchRequest {
            from_revision: seen + 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (missed, synced) = until_synced(&mut watch).await;
    let got: Vec<(pb::WatchEventType, u64, String)> = missed
        .iter()
        .map(|e| (e.r#type(), e.revision, e.reason.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (pb::WatchEventType::Put, 3, String::new()),
            (pb::WatchEventType::Delete, 4, "removed".to_string()),
            (pb::WatchEventType::Put, 5, String::new()),
        ]
    );
    assert_eq!(synced, 5);

    // A revision in the future just waits for it.
    let mut future = c
        .watch(pb::WatchRequest {
            from_revision: 7,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (none, _) = until_synced(&mut future).await;
    assert!(none.is_empty());
    register(&mut c, producer("d", ADDR, &["host.cpu"]), vec![], 0).await; // 6: skipped
    register(&mut c, producer("e", ADDR, &["host.cpu"]), vec![], 0).await; // 7
    assert_eq!(next(&mut future).await.unwrap().unwrap().revision, 7);

    // History keeps 5 changes (3..=7): revision 2 was compacted.
    let e = c
        .watch(pb::WatchRequest {
            from_revision: 2,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);
    assert_eq!(
        e.message(),
        "revision 2 was compacted; oldest available is 3; watch from 0 to re-list"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_restart_keeps_records_schemas_leases_and_revision() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path())).await;
    let mut c = server.client().await;
    let p = register(
        &mut c,
        producer("p1", ADDR, &["host.cpu"]),
        vec![schema("host.cpu")],
        60_000,
    )
    .await;
    register(&mut c, consumer("c1", &["host.*"]), vec![], 0).await;
    register(&mut c, producer("gone", ADDR, &["host.cpu"]), vec![], 0).await;
    c.remove(pb::RemoveRequest {
        kind: pb::RecordKind::Producer as i32,
        id: "gone".into(),
    })
    .await
    .unwrap();
    let before = c
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let search_before = c.search(pb::SearchRequest::default()).await.unwrap().into_inner();
    // A watch open at shutdown ends instead of holding the server up.
    let mut watch = c.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    until_synced(&mut watch).await;
    // So does an open KeepAlive stream whose client keeps its request side open.
    let (beats, rx) = tokio::sync::mpsc::channel(1);
    let mut renewals = c.keep_alive(ReceiverStream::new(rx)).await.unwrap().into_inner();
    beats
        .send(pb::KeepAliveRequest { lease_id: p.lease_id })
        .await
        .unwrap();
    assert_eq!(next(&mut renewals).await.unwrap().unwrap().ttl_ms, 60_000);
    drop(c);
    server.stop().await.unwrap();
    assert!(
        !matches!(next(&mut watch).await, Ok(Some(_))),
        "watch ended by shutdown"
    );
    assert!(
        !matches!(next(&mut renewals).await, Ok(Some(_))),
        "keepalive ended by shutdown"
    );
    drop(beats);

    let server = start(config(dir.path())).await;
    let mut c = server.client().await;
    let after = c
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            after.revision,
            after.producers,
            after.consumers,
            after.schemas,
            after.leases
        ),
        (
            before.revision,
            before.producers,
            before.consumers,
            before.schemas,
            before.leases
        )
    );
    assert_eq!(after.revision, 4);
    let search_after = c.search(pb::SearchRequest::default()).await.unwrap().into_inner();
    assert_eq!(search_after, search_before);
    // History survived: a resume from revision 1 replays all four changes.
    let mut w = c
        .watch(pb::WatchRequest {
            from_revision: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (replayed, synced) = until_synced(&mut w).await;
    assert_eq!(
        replayed.iter().map(|e| e.revision).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert_eq!(synced, 4);
    // The lease is alive and renewable; new writes continue the revision and lease counters.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut replies = c.keep_alive(ReceiverStream::new(rx)).await.unwrap().into_inner();
    tx.send(pb::KeepAliveRequest { lease_id: p.lease_id })
        .await
        .unwrap();
    assert_eq!(next(&mut replies).await.unwrap().unwrap().ttl_ms, 60_000);
    let r = register(&mut c, producer("p2", ADDR, &["host.cpu"]), vec![], 0).await;
    assert_eq!(r.revision, 5);
    assert!(r.lease_id > p.lease_id + 2, "lease ids are never reused");
    let e = c.register(pb::RegisterRequest {
        record: Some(producer("p1", ADDR, &["host.cpu"])),
        ..Default::default()
    });
    assert_eq!(e.await.unwrap_err().code(), Code::AlreadyExists);
    drop(tx);
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_bad_config_is_an_error_not_a_panic() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = gma_directory::run(gma_directory::DirectoryConfig::default(), listener, async {})
        .await
        .unwrap_err();
    assert!(e.to_string().contains("data_dir is required"), "{e}");
}
