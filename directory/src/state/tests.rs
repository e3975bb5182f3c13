use super::*;
use gma_core::event::dbl;
use gma_core::Refuse;

const T0: u64 = 1_000_000;

fn schema(name: &str, version: u32) -> pb::EventSchema {
    pb::EventSchema {
        name: name.into(),
        version,
        fields: vec![dbl("value", "", "")],
        description: String::new(),
    }
}

fn producer_body(id: &str, events: &[&str]) -> pb::ProducerRecord {
    pb::ProducerRecord {
        id: id.into(),
        address: format!("http://127.0.0.1:{}", 7000 + id.len()),
        events: events.iter().map(|e| e.to_string()).collect(),
        ..Default::default()
    }
}

/// A change to a valid producer record that makes it invalid.
type Mutation = dyn Fn(&mut pb::ProducerRecord);

fn producer(id: &str, events: &[&str]) -> pb::Record {
    pb::Record {
        record: Some(Body::Producer(producer_body(id, events))),
    }
}

fn consumer(id: &str, accepts: &[&str]) -> pb::Record {
    pb::Record {
        record: Some(Body::Consumer(pb::ConsumerRecord {
            id: id.into(),
            address: "http://127.0.0.1:9000".into(),
            accepts: accepts.iter().map(|e| e.to_string()).collect(),
            manner: "archive".into(),
            ..Default::default()
        })),
    }
}

fn register(record: pb::Record, schemas: Vec<pb::EventSchema>, ttl_ms: u64, now_ms: u64) -> Command {
    Command::Register {
        record,
        schemas,
        lease_id: 0,
        ttl_ms,
        now_ms,
    }
}

fn update(record: pb::Record, ttl_ms: u64, now_ms: u64) -> Command {
    Command::Update {
        record,
        schemas: vec![],
        ttl_ms,
        now_ms,
    }
}

fn state() -> DirectoryState {
    DirectoryState::new(Limits::default())
}

/// A state with host.cpu/host.mem schemas and producer p1 (host.cpu, lease 1, rev 1).
fn seeded() -> DirectoryState {
    let mut s = state();
    s.apply(register(
        producer("p1", &["host.cpu"]),
        vec![schema("host.cpu", 1), schema("host.mem", 1)],
        1000,
        T0,
    ))
    .unwrap();
    s
}

/// Everything observable, to check a failed command changed nothing.
fn fingerprint(s: &DirectoryState) -> String {
    let all = RecordFilter::default();
    format!(
        "{:?} {} {} {:?} {:?} {:?} {:?}",
        s.records().collect::<Vec<_>>(),
        s.revision(),
        s.next_lease_id(),
        s.counts(),
        s.changes_since(s.compacted() + 1, &all).map(|v| v.len()),
        s.leases,
        s.schemas.keys().collect::<Vec<_>>(),
    )
}

fn search(s: &DirectoryState, req: pb::SearchRequest) -> pb::SearchResponse {
    s.search(&SearchQuery::from_pb(&req).unwrap())
}

fn ids(resp: &pb::SearchResponse) -> Vec<String> {
    resp.entries.iter().filter_map(key_of).map(|(_, id)| id).collect()
}

#[test]
fn register_grants_a_lease_and_a_revision() {
    let mut s = state();
    let a = s
        .apply(register(
            producer("p1", &["host.cpu"]),
            vec![schema("host.cpu", 1)],
            1000,
            T0,
        ))
        .unwrap();
    assert_eq!((a.lease_id, a.ttl_ms, a.revision), (1, 1000, 1));
    assert_eq!(a.changes.len(), 1);
    assert_eq!(a.changes[0].kind, ChangeKind::Put);
    assert_eq!(a.changes[0].entry.create_revision, 1);
    assert_eq!(a.effects.schemas, vec![("host.cpu".to_string(), 1)]);
    assert_eq!(a.effects.leases, vec![1]);
    assert!(a.is_durable());
    let lease = s.lease(1).unwrap();
    assert_eq!(lease.expires_at_ms, T0 + 1000);
    assert_eq!(lease.records.len(), 1);
    assert_eq!(
        s.counts(),
        Counts {
            producers: 1,
            consumers: 0,
            schemas: 1,
            leases: 1
        }
    );

    // A consumer with the same id is a different record.
    let a = s
        .apply(register(consumer("p1", &["host.*"]), vec![], 500, T0))
        .unwrap();
    assert_eq!((a.lease_id, a.revision), (2, 2));
    assert_eq!(s.counts().consumers, 1);
}

#[test]
fn duplicate_register_is_rejected_and_changes_nothing() {
    let mut s = seeded();
    let before = fingerprint(&s);
    let e = s
        .apply(register(producer("p1", &["host.mem"]), vec![], 1000, T0))
        .unwrap_err();
    assert!(
        matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::AlreadyExists),
        "{e:?}"
    );
    assert!(e.to_string().contains("producer p1 is already registered"), "{e}");
    assert_eq!(fingerprint(&s), before);
}

#[test]
fn events_need_a_schema() {
    let mut s = seeded();
    let before = fingerprint(&s);
    let e = s
        .apply(register(
            producer("p2", &["host.cpu", "host.disk"]),
            vec![],
            1000,
            T0,
        ))
        .unwrap_err();
    assert_eq!(
        e,
        DirError::invalid_argument("event host.disk has no schema: send it in schemas")
    );
    assert_eq!(fingerprint(&s), before);
    // Stored schema (host.mem) or one sent along (host.disk) both do.
    s.apply(register(
        producer("p2", &["host.mem", "host.disk"]),
        vec![schema("host.disk", 1)],
        1000,
        T0,
    ))
    .unwrap();
    assert!(s.schema("host.disk", 1).is_some());
}

#[test]
fn schema_versions_cannot_be_redefined() {
    let mut s = seeded();
    let before = fingerprint(&s);
    let mut changed = schema("host.cpu", 1);
    changed.fields.push(dbl("idle", "%", ""));
    let e = s
        .apply(register(
            producer("p2", &["host.cpu"]),
            vec![changed.clone()],
            1000,
            T0,
        ))
        .unwrap_err();
    assert_eq!(
        e,
        DirError::already_exists(
            "schema host.cpu version 1 exists with different fields; register it as version 2"
        )
    );
    assert_eq!(fingerprint(&s), before);
    // Same definition again is fine (description does not count), and version 2 is new.
    let mut same = schema("host.cpu", 1);
    same.description = "cpu".into();
    changed.version = 2;
    let a = s
        .apply(register(
            producer("p2", &["host.cpu"]),
            vec![same, changed],
            1000,
            T0,
        ))
        .unwrap();
    assert_eq!(a.effects.schemas, vec![("host.cpu".to_string(), 2)]);
    assert_eq!(s.get_schema("host.cpu", 0).unwrap().version, 2);
    // An invalid schema is INVALID_ARGUMENT.
    let mut bad = schema("host.net", 1);
    bad.version = 0;
    let e = s
        .apply(register(producer("p3", &["host.net"]), vec![bad], 1000, T0))
        .unwrap_err();
    assert!(
        matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::InvalidArgument),
        "{e:?}"
    );
}

#[test]
fn malformed_records_are_invalid_arguments() {
    let mut s = seeded();
    let before = fingerprint(&s);
    let mut with = |f: &dyn Fn(&mut pb::ProducerRecord)| {
        let mut p = producer_body("p9", &["host.cpu"]);
        f(&mut p);
        let r = pb::Record {
            record: Some(Body::Producer(p)),
        };
        s.apply(register(r, vec![], 1000, T0)).unwrap_err()
    };
    let cases: Vec<(&Mutation, &str)> = vec![
        (
            &|p: &mut pb::ProducerRecord| p.id.clear(),
            "producer id is required",
        ),
        (&|p: &mut pb::ProducerRecord| p.id = "a b".into(), "position 1"),
        (
            &|p: &mut pb::ProducerRecord| p.address = "127.0.0.1:80".into(),
            "invalid address",
        ),
        (
            &|p: &mut pb::ProducerRecord| p.address = "http://h".into(),
            "port required",
        ),
        (&|p: &mut pb::ProducerRecord| p.events.clear(), "offers no events"),
        (
            &|p: &mut pb::ProducerRecord| p.events = vec!["host..cpu".into()],
            "position 5",
        ),
        (
            &|p: &mut pb::ProducerRecord| p.events = vec!["host.cpu".into(), "host.cpu".into()],
            "twice",
        ),
        (
            &|p: &mut pb::ProducerRecord| p.sources = vec!["a b".into()],
            "source",
        ),
        (
            &|p: &mut pb::ProducerRecord| p.services = vec!["q".into(); 65],
            "at most 64",
        ),
        (&|p: &mut pb::ProducerRecord| p.site = "s".repeat(257), "site"),
        (
            &|p: &mut pb::ProducerRecord| {
                p.attributes = (0..65).map(|i| (i.to_string(), String::new())).collect();
            },
            "65 attributes",
        ),
        (
            &|p: &mut pb::ProducerRecord| {
                p.attributes.insert("k".into(), "v".repeat(257));
            },
            "attribute \"k\"",
        ),
    ];
    for (f, want) in cases {
        let e = with(f);
        assert!(
            matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::InvalidArgument),
            "{e:?}"
        );
        assert!(e.to_string().contains(want), "{e} should contain {want}");
    }
    for record in [
        pb::Record::default(),
        consumer("c1", &[]),
        consumer("c1", &["host..*"]),
    ] {
        let e = s.apply(register(record, vec![], 1000, T0)).unwrap_err();
        assert!(
            matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::InvalidArgument),
            "{e:?}"
        );
    }
    let e = s
        .apply(register(producer("p9", &["host.cpu"]), vec![], 0, T0))
        .unwrap_err();
    assert!(
        matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::InvalidArgument),
        "{e:?}"
    );
    assert_eq!(fingerprint(&s), before);
}

#[test]
fn capacity_is_bounded() {
    let mut s = DirectoryState::new(Limits {
        max_records: 1,
        history_limit: 10,
        ..Limits::default()
    });
    s.apply(register(
        producer("p1", &["host.cpu"]),
        vec![schema("host.cpu", 1)],
        1000,
        T0,
    ))
    .unwrap();
    let e = s
        .apply(register(producer("p2", &["host.cpu"]), vec![], 1000, T0))
        .unwrap_err();
    assert!(
        matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::ResourceExhausted),
        "{e:?}"
    );
}

#[test]
fn register_onto_an_existing_lease() {
    let mut s = seeded();
    let a = s
        .apply(Command::Register {
            record: producer("p2", &["host.cpu"]),
            schemas: vec![],
            lease_id: 1,
            ttl_ms: 0,
            now_ms: T0,
        })
        .unwrap();
    assert_eq!((a.lease_id, a.ttl_ms), (1, 1000));
    assert_eq!(s.lease(1).unwrap().records.len(), 2);
    assert!(a.effects.leases.is_empty());
    // Removing one record keeps the shared lease.
    s.apply(Command::Remove {
        kind: Kind::Producer,
        id: "p1".into(),
    })
    .unwrap();
    assert!(s.lease(1).is_some());
    for (lease_id, now_ms) in [(99, T0), (1, T0 + 5000)] {
        let e = s
            .apply(Command::Register {
                record: producer("p3", &["host.cpu"]),
                schemas: vec![],
                lease_id,
                ttl_ms: 0,
                now_ms,
            })
            .unwrap_err();
        assert!(
            matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::NotFound),
            "{e:?}"
        );
    }
}

#[test]
fn update_needs_exactly_one_match() {
    let mut s = seeded();
    let before = fingerprint(&s);
    let e = s.apply(update(producer("p2", &["host.cpu"]), 0, T0)).unwrap_err();
    assert_eq!(e, DirError::not_found("no producer record with id p2"));
    let e = s.apply(update(consumer("p1", &["*"]), 0, T0)).unwrap_err();
    assert_eq!(e, DirError::not_found("no consumer record with id p1"));
    assert_eq!(fingerprint(&s), before);

    // TTL 0 keeps the lease and replaces the values.
    let a = s
        .apply(update(producer("p1", &["host.mem"]), 0, T0 + 10))
        .unwrap();
    assert_eq!((a.lease_id, a.ttl_ms, a.revision), (1, 1000, 2));
    let entry = s.record(Kind::Producer, "p1").unwrap();
    assert_eq!((entry.create_revision, entry.mod_revision), (1, 2));
    let Some(Body::Producer(p)) = body_of(entry) else {
        panic!("not a producer")
    };
    assert_eq!(p.events, vec!["host.mem".to_string()]);
    assert!(a.effects.leases.is_empty());

    // TTL > 0 moves it to a new lease and revokes the old one.
    let a = s
        .apply(update(producer("p1", &["host.mem"]), 5000, T0 + 20))
        .unwrap();
    assert_eq!((a.lease_id, a.ttl_ms), (2, 5000));
    assert!(s.lease(1).is_none());
    assert_eq!(s.lease(2).unwrap().expires_at_ms, T0 + 5020);
    assert_eq!(a.effects.leases, vec![2, 1]);
    assert_eq!(s.record(Kind::Producer, "p1").unwrap().lease_id, 2);

    // Updates check schemas too.
    let e = s.apply(update(producer("p1", &["net.tcp"]), 0, T0)).unwrap_err();
    assert!(e.to_string().contains("event net.tcp has no schema"), "{e}");
}

#[test]
fn remove_needs_exactly_one_match() {
    let mut s = seeded();
    let before = fingerprint(&s);
    let e = s
        .apply(Command::Remove {
            kind: Kind::Consumer,
            id: "p1".into(),
        })
        .unwrap_err();
    assert!(matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::NotFound));
    let e = s
        .apply(Command::Remove {
            kind: Kind::Producer,
            id: String::new(),
        })
        .unwrap_err();
    assert!(matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::InvalidArgument));
    assert_eq!(fingerprint(&s), before);

    let a = s
        .apply(Command::Remove {
            kind: Kind::Producer,
            id: "p1".into(),
        })
        .unwrap();
    assert_eq!(a.revision, 2);
    assert_eq!(a.changes[0].kind, ChangeKind::Delete);
    assert_eq!(a.changes[0].reason, REASON_REMOVED);
    assert_eq!(
        a.changes[0].entry.mod_revision, 1,
        "a DELETE carries the record as it was"
    );
    assert!(s.lease(1).is_none());
    assert_eq!(a.effects.leases, vec![1]);
    assert_eq!(
        s.counts(),
        Counts {
            producers: 0,
            consumers: 0,
            schemas: 2,
            leases: 0
        }
    );
    assert!(search(&s, pb::SearchRequest::default()).entries.is_empty());
}

#[test]
fn a_checked_keepalive_renews_only_when_every_held_record_was_authorized() {
    let mut s = seeded();
    let held = s.lease_record_ids(1);
    assert!(!held.is_empty());
    let e = s
        .apply(Command::KeepAlive {
            lease_id: 1,
            now_ms: T0 + 900,
            checked: Some(Vec::new()),
        })
        .unwrap_err();
    assert!(
        matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::Unavailable),
        "{e:?}"
    );
    assert!(e.to_string().contains("lease 1 holds"), "{e}");
    assert_eq!(s.lease(1).unwrap().expires_at_ms, T0 + 1000);
    let a = s
        .apply(Command::KeepAlive {
            lease_id: 1,
            now_ms: T0 + 900,
            checked: Some(held),
        })
        .unwrap();
    assert_eq!(a.ttl_ms, 1000);
}

#[test]
fn keepalive_renews_live_leases_only() {
    let mut s = seeded();
    let a = s
        .apply(Command::KeepAlive {
            lease_id: 1,
            now_ms: T0 + 900,
            checked: None,
        })
        .unwrap();
    assert_eq!((a.lease_id, a.ttl_ms), (1, 1000));
    assert!(!a.is_durable());
    assert_eq!(s.lease(1).unwrap().expires_at_ms, T0 + 1900);
    assert_eq!(s.next_expiry(), Some(T0 + 1900));
    // Unknown lease: ttl 0.
    assert_eq!(
        s.apply(Command::KeepAlive {
            lease_id: 7,
            now_ms: T0,
            checked: None
        })
        .unwrap()
        .ttl_ms,
        0
    );
    // Expired but not yet reaped: ttl 0 and not renewed.
    let a = s
        .apply(Command::KeepAlive {
            lease_id: 1,
            now_ms: T0 + 1900,
            checked: None,
        })
        .unwrap();
    assert_eq!(a.ttl_ms, 0);
    assert_eq!(s.lease(1).unwrap().expires_at_ms, T0 + 1900);
}

#[test]
fn expiry_removes_due_leases_and_their_records() {
    let mut s = seeded();
    s.apply(register(producer("p2", &["host.cpu"]), vec![], 3000, T0))
        .unwrap();
    s.apply(register(consumer("c1", &["*"]), vec![], 500, T0))
        .unwrap();
    let a = s.apply(Command::Expire { now_ms: T0 + 999 }).unwrap();
    assert_eq!(a.changes.len(), 1, "c1 only");
    assert_eq!(a.changes[0].reason, REASON_EXPIRED);
    assert_eq!(key_of(&a.changes[0].entry), Some((Kind::Consumer, "c1".into())));
    let a = s.apply(Command::Expire { now_ms: T0 + 1000 }).unwrap();
    assert_eq!(a.changes.len(), 1, "p1 expires at exactly its deadline");
    assert_eq!(a.revision, 5);
    assert_eq!(a.effects.leases, vec![1]);
    let a = s.apply(Command::Expire { now_ms: T0 + 1000 }).unwrap();
    assert!(!a.is_durable(), "nothing more is due");
    assert_eq!(
        ids(&search(&s, pb::SearchRequest::default())),
        vec!["p2".to_string()]
    );
    assert_eq!(s.next_expiry(), Some(T0 + 3000));
}

#[test]
fn extend_all_gives_every_lease_a_fresh_ttl() {
    let mut s = seeded();
    s.apply(register(producer("p2", &["host.cpu"]), vec![], 60_000, T0))
        .unwrap();
    // Restart 5 s later: each lease gets a full TTL from the restart (p1's had expired on paper).
    let a = s.apply(Command::ExtendAll { now_ms: T0 + 5000 }).unwrap();
    assert!(!a.is_durable());
    assert_eq!(s.lease(1).unwrap().expires_at_ms, T0 + 6000);
    assert_eq!(s.lease(2).unwrap().expires_at_ms, T0 + 65_000);
    assert!(s
        .apply(Command::Expire { now_ms: T0 + 5999 })
        .unwrap()
        .changes
        .is_empty());
    assert_eq!(
        s.apply(Command::Expire { now_ms: T0 + 6000 })
            .unwrap()
            .changes
            .len(),
        1
    );
}

#[test]
fn history_is_bounded_and_compaction_is_out_of_range() {
    let mut s = DirectoryState::new(Limits {
        max_records: 100,
        history_limit: 3,
        ..Limits::default()
    });
    s.apply(register(
        producer("p0", &["host.cpu"]),
        vec![schema("host.cpu", 1)],
        1000,
        T0,
    ))
    .unwrap();
    for i in 1..5 {
        let a = s
            .apply(register(
                producer(&format!("p{i}"), &["host.cpu"]),
                vec![],
                1000,
                T0,
            ))
            .unwrap();
        if i == 3 {
            assert_eq!(a.effects.compacted, Some(1..=1));
        }
    }
    assert_eq!((s.revision(), s.compacted()), (5, 2));
    let all = RecordFilter::default();
    let revs: Vec<u64> = s
        .changes_since(3, &all)
        .unwrap()
        .iter()
        .map(|e| e.revision)
        .collect();
    assert_eq!(revs, vec![3, 4, 5]);
    assert_eq!(s.changes_since(5, &all).unwrap().len(), 1);
    assert!(s.changes_since(6, &all).unwrap().is_empty());
    assert!(s.changes_since(100, &all).unwrap().is_empty());
    let e = s.changes_since(2, &all).unwrap_err();
    assert_eq!(
        e,
        DirError::out_of_range("revision 2 was compacted; oldest available is 3; watch from 0 to re-list")
    );
    // One command making more changes than the limit compacts its own early ones.
    let a = s.apply(Command::Expire { now_ms: T0 + 1000 }).unwrap();
    assert_eq!(a.changes.len(), 5);
    assert_eq!(a.effects.compacted, Some(3..=7));
    assert_eq!(s.compacted(), 7);
}

#[test]
fn history_is_bounded_by_bytes() {
    // A producer with many sources: each change of it is large.
    let big = |id: &str| {
        let mut b = producer_body(id, &["host.cpu"]);
        b.sources = (0..100).map(|i| format!("node-{i:05}.example.org")).collect();
        pb::Record {
            record: Some(Body::Producer(b)),
        }
    };
    let one = prost::Message::encoded_len(&pb::RecordEntry {
        record: Some(big("p0")),
        lease_id: 1,
        create_revision: 1,
        mod_revision: 1,
    });
    let mut s = DirectoryState::new(Limits {
        max_records: 100,
        history_limit: 1000,
        // Room for two such changes, not three.
        history_bytes: 3 * one - 1,
    });
    s.apply(register(big("p0"), vec![schema("host.cpu", 1)], 1000, T0))
        .unwrap();
    for i in 1..6 {
        s.apply(register(big(&format!("p{i}")), vec![], 1000, T0))
            .unwrap();
        let (n, bytes) = s.history_size();
        assert!(bytes < 3 * one, "{bytes} >= {}", 3 * one);
        assert!(n <= 2, "{n} changes kept");
    }
    assert_eq!((s.revision(), s.compacted()), (6, 4));
    let all = RecordFilter::default();
    assert_eq!(s.changes_since(5, &all).unwrap().len(), 2);
    assert!(s.changes_since(4, &all).is_err());
    // The byte count survives export and restore.
    let r = DirectoryState::restore(s.limits(), s.export()).unwrap();
    assert_eq!(r.history_size(), s.history_size());
    // A change larger than the whole bound is dropped at once (live watchers got it).
    let mut tiny = DirectoryState::new(Limits {
        history_bytes: 10,
        ..Limits::default()
    });
    tiny.apply(register(big("p0"), vec![schema("host.cpu", 1)], 1000, T0))
        .unwrap();
    assert_eq!(tiny.history_size(), (0, 0));
    assert_eq!((tiny.revision(), tiny.compacted()), (1, 1));
    assert!(tiny.changes_since(2, &all).unwrap().is_empty());
}

#[test]
fn watch_filters_and_snapshot() {
    let mut s = seeded();
    s.apply(register(producer("p2", &["host.mem"]), vec![], 1000, T0))
        .unwrap();
    s.apply(register(consumer("c1", &["host.*"]), vec![], 1000, T0))
        .unwrap();
    s.apply(register(consumer("c2", &["net.*"]), vec![], 1000, T0))
        .unwrap();
    s.apply(update(producer("p1", &["host.cpu"]), 0, T0)).unwrap();
    let snap = s.snapshot(&RecordFilter::new(0, "host.cpu").unwrap());
    let got: Vec<(String, u64)> = snap
        .iter()
        .map(|e| (key_of(e.entry.as_ref().unwrap()).unwrap().1, e.revision))
        .collect();
    assert_eq!(got, vec![("p1".to_string(), 5), ("c1".to_string(), 3)]);
    assert!(snap.iter().all(|e| e.r#type() == pb::WatchEventType::Put));
    let consumers = s.snapshot(&RecordFilter::new(pb::RecordKind::Consumer as i32, "").unwrap());
    assert_eq!(consumers.len(), 2);
    let changes = s
        .changes_since(
            2,
            &RecordFilter::new(pb::RecordKind::Producer as i32, "").unwrap(),
        )
        .unwrap();
    assert_eq!(changes.iter().map(|c| c.revision).collect::<Vec<_>>(), vec![2, 5]);
    let e = RecordFilter::new(0, "host..cpu").unwrap_err();
    assert!(e.to_string().contains("position 5"), "{e}");
    assert!(RecordFilter::new(9, "").is_err());
}

fn search_fixture() -> DirectoryState {
    let mut s = seeded();
    let mut p = producer_body("p2", &["host.mem"]);
    p.sources = vec!["hostA".into(), "hostB/eth0".into()];
    p.site = "siteA".into();
    p.attributes.insert("tier".into(), "gold".into());
    p.attributes.insert("zone".into(), "z1".into());
    s.apply(register(
        pb::Record {
            record: Some(Body::Producer(p)),
        },
        vec![],
        1000,
        T0,
    ))
    .unwrap();
    s.apply(register(
        producer("p3", &["host.cpu", "host.mem"]),
        vec![],
        1000,
        T0,
    ))
    .unwrap();
    s.apply(register(consumer("c1", &["host.*"]), vec![], 1000, T0))
        .unwrap();
    s.apply(register(consumer("a0", &["net.tcp"]), vec![], 1000, T0))
        .unwrap();
    s
}

#[test]
fn search_filters() {
    let s = search_fixture();
    let q = |f: &dyn Fn(&mut pb::SearchRequest)| {
        let mut r = pb::SearchRequest::default();
        f(&mut r);
        ids(&search(&s, r))
    };
    assert_eq!(
        q(&|_| {}),
        vec!["p1", "p2", "p3", "a0", "c1"],
        "producers first, then by id"
    );
    assert_eq!(q(&|r| r.kind = pb::RecordKind::Consumer as i32), vec!["a0", "c1"]);
    assert_eq!(
        q(&|r| r.event_pattern = "host.cpu".into()),
        vec!["p1", "p3", "c1"]
    );
    assert_eq!(q(&|r| r.event_pattern = "net.*".into()), vec!["a0"]);
    assert_eq!(
        q(&|r| r.event_pattern = "*".into()),
        vec!["p1", "p2", "p3", "a0", "c1"]
    );
    assert_eq!(
        q(&|r| r.source = "hostB/*".into()),
        vec!["p2"],
        "empty source lists do not match"
    );
    assert_eq!(q(&|r| r.source = "nohost".into()), Vec::<String>::new());
    assert_eq!(q(&|r| r.id = "p3".into()), vec!["p3"]);
    assert_eq!(q(&|r| r.site = "siteA".into()), vec!["p2"]);
    assert_eq!(
        q(&|r| {
            r.attributes.insert("tier".into(), "gold".into());
        }),
        vec!["p2"]
    );
    assert_eq!(
        q(&|r| {
            r.attributes.insert("tier".into(), "gold".into());
            r.attributes.insert("zone".into(), "z2".into());
        }),
        Vec::<String>::new()
    );
    let resp = search(
        &s,
        pb::SearchRequest {
            id: "zz".into(),
            ..Default::default()
        },
    );
    assert!(resp.entries.is_empty() && resp.next_page_token.is_empty());
    assert_eq!(resp.revision, s.revision());
    assert_eq!(resp.revision, 5);
}

#[test]
fn search_pages_single_and_bad_tokens() {
    let s = search_fixture();
    let single = search(
        &s,
        pb::SearchRequest {
            single: true,
            ..Default::default()
        },
    );
    assert_eq!(ids(&single), vec!["p1"]);
    assert!(single.next_page_token.is_empty());

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let resp = search(
            &s,
            pb::SearchRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            },
        );
        pages += 1;
        assert!(resp.entries.len() <= 2);
        seen.extend(ids(&resp));
        if resp.next_page_token.is_empty() {
            break;
        }
        token = resp.next_page_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, vec!["p1", "p2", "p3", "a0", "c1"]);

    // Exactly a full last page: no token pointing at an empty page.
    let resp = search(
        &s,
        pb::SearchRequest {
            page_size: 5,
            ..Default::default()
        },
    );
    assert_eq!(resp.entries.len(), 5);
    assert!(resp.next_page_token.is_empty());
    // Paging composes with the id shortcut.
    let resp = search(
        &s,
        pb::SearchRequest {
            id: "p1".into(),
            page_size: 1,
            ..Default::default()
        },
    );
    assert_eq!(ids(&resp), vec!["p1"]);
    assert!(resp.next_page_token.is_empty());

    for bad in ["zz", "0", "03aa", "01ff", "01+a", "x".repeat(2000).as_str()] {
        let e = SearchQuery::from_pb(&pb::SearchRequest {
            page_token: bad.into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("invalid page_token"), "{bad}: {e}");
    }
    let e = SearchQuery::from_pb(&pb::SearchRequest {
        event_pattern: "host cpu".into(),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("at position 4"), "{e}");
    assert!(SearchQuery::from_pb(&pb::SearchRequest {
        source: "a b".into(),
        ..Default::default()
    })
    .is_err());
    let big = SearchQuery::from_pb(&pb::SearchRequest {
        page_size: 1_000_000,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(big.page_size, MAX_PAGE_SIZE);
    let dflt = SearchQuery::from_pb(&pb::SearchRequest::default()).unwrap();
    assert_eq!(dflt.page_size, DEFAULT_PAGE_SIZE);
}

#[test]
fn get_schema_versions() {
    let mut s = seeded();
    let mut v3 = schema("host.cpu", 3);
    v3.fields.push(dbl("idle", "", ""));
    s.apply(register(
        producer("p2", &["host.cpu"]),
        vec![v3.clone()],
        1000,
        T0,
    ))
    .unwrap();
    assert_eq!(s.get_schema("host.cpu", 0).unwrap(), v3);
    assert_eq!(s.get_schema("host.cpu", 1).unwrap(), schema("host.cpu", 1));
    let e = s.get_schema("host.cpu", 2).unwrap_err();
    assert_eq!(
        e,
        DirError::not_found("schema host.cpu has no version 2; the latest is 3")
    );
    assert!(
        matches!(s.get_schema("host.nope", 0), Err(DirError::Refused(ref r)) if r.code() == tonic::Code::NotFound)
    );
    assert!(matches!(
        s.get_schema("bad name", 0),
        Err(DirError::Refused(ref r)) if r.code() == tonic::Code::InvalidArgument
    ));
    // "host" is a prefix of "host.cpu" but a different name.
    assert!(
        matches!(s.get_schema("host", 0), Err(DirError::Refused(ref r)) if r.code() == tonic::Code::NotFound)
    );
}

#[test]
fn commands_round_trip_through_serde_and_replay_deterministically() {
    let cmds = vec![
        register(
            producer("p1", &["host.cpu"]),
            vec![schema("host.cpu", 1)],
            1000,
            T0,
        ),
        register(consumer("c1", &["host.*"]), vec![], 2000, T0 + 1),
        update(producer("p1", &["host.cpu"]), 4000, T0 + 2),
        Command::KeepAlive {
            lease_id: 2,
            now_ms: T0 + 3,
            checked: None,
        },
        Command::Remove {
            kind: Kind::Consumer,
            id: "c1".into(),
        },
        Command::ExtendAll { now_ms: T0 + 10 },
        Command::Expire { now_ms: T0 + 10_000 },
    ];
    let json = serde_json::to_string(&cmds).unwrap();
    let back: Vec<Command> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, cmds);

    let run = |cmds: Vec<Command>| {
        let mut s = state();
        let results: Vec<Applied> = cmds.into_iter().map(|c| s.apply(c).unwrap()).collect();
        (results, fingerprint(&s))
    };
    assert_eq!(run(cmds), run(back));
}

#[test]
fn restore_rebuilds_the_same_state() {
    let mut s = search_fixture();
    s.apply(Command::Remove {
        kind: Kind::Producer,
        id: "p3".into(),
    })
    .unwrap();
    let all = RecordFilter::default();
    let p = Persisted {
        records: s.records().cloned().collect(),
        schemas: s.schemas.values().cloned().collect(),
        leases: s
            .leases
            .iter()
            .map(|(id, l)| (*id, l.ttl_ms, l.expires_at_ms))
            .collect(),
        history: s.history.iter().rev().cloned().collect(),
        revision: s.revision(),
        next_lease_id: s.next_lease_id(),
        compacted: s.compacted(),
    };
    let r = DirectoryState::restore(s.limits(), p.clone()).unwrap();
    assert_eq!(fingerprint(&r), fingerprint(&s));
    assert_eq!(
        r.changes_since(1, &all).unwrap(),
        s.changes_since(1, &all).unwrap()
    );

    // A hole in the stored history: only the contiguous tail survives.
    let mut holey = p.clone();
    holey.history.retain(|c| c.revision != 3);
    let r = DirectoryState::restore(s.limits(), holey).unwrap();
    assert_eq!(r.compacted(), 3);
    assert!(r.changes_since(3, &all).is_err());
    assert_eq!(r.changes_since(4, &all).unwrap().len(), 3);

    // A record whose lease is missing is reported, not silently dropped.
    let mut broken = p;
    broken.leases.clear();
    assert!(matches!(
        DirectoryState::restore(s.limits(), broken),
        Err(DirError::Storage(_))
    ));
}

#[test]
fn export_is_the_inverse_of_restore() {
    let all = RecordFilter::default();
    let same = |a: &DirectoryState, b: &DirectoryState| {
        assert_eq!(fingerprint(a), fingerprint(b));
        assert_eq!(a.compacted(), b.compacted());
        assert_eq!(a.next_expiry(), b.next_expiry());
        assert_eq!(a.expiry, b.expiry);
        assert_eq!(a.schemas, b.schemas);
        assert_eq!(
            a.changes_since(a.compacted() + 1, &all).unwrap(),
            b.changes_since(b.compacted() + 1, &all).unwrap()
        );
    };
    // A renewed lease (expiry moved), a removed record, a lease on two records.
    let mut s = search_fixture();
    s.apply(Command::KeepAlive {
        lease_id: 2,
        now_ms: T0 + 500,
        checked: None,
    })
    .unwrap();
    s.apply(Command::Remove {
        kind: Kind::Producer,
        id: "p3".into(),
    })
    .unwrap();
    s.apply(Command::Register {
        record: consumer("c2", &["host.cpu"]),
        schemas: vec![],
        lease_id: 1,
        ttl_ms: 0,
        now_ms: T0 + 600,
    })
    .unwrap();
    let r = DirectoryState::restore(s.limits(), s.export()).unwrap();
    same(&s, &r);

    // Both evolve identically afterwards.
    let next = vec![
        register(producer("p9", &["host.cpu"]), vec![], 700, T0 + 700),
        Command::KeepAlive {
            lease_id: 1,
            now_ms: T0 + 800,
            checked: None,
        },
        Command::Expire { now_ms: T0 + 1500 },
    ];
    let (mut s2, mut r2) = (s.clone(), r);
    for cmd in next {
        assert_eq!(s2.apply(cmd.clone()), r2.apply(cmd));
    }
    same(&s2, &r2);

    // Compacted history, and an empty directory whose history is all compacted.
    let limits = Limits {
        max_records: 100,
        history_limit: 2,
        ..Limits::default()
    };
    let mut c = DirectoryState::new(limits);
    for i in 0..4 {
        c.apply(register(
            producer(&format!("p{i}"), &["host.cpu"]),
            vec![schema("host.cpu", 1)],
            1000,
            T0,
        ))
        .unwrap();
    }
    assert_eq!(c.compacted(), 2);
    same(&c, &DirectoryState::restore(limits, c.export()).unwrap());
    c.apply(Command::Expire { now_ms: T0 + 5000 }).unwrap();
    assert_eq!(c.counts().leases, 0);
    let r = DirectoryState::restore(limits, c.export()).unwrap();
    same(&c, &r);
    assert_eq!(r.next_lease_id(), c.next_lease_id());
    same(
        &DirectoryState::new(limits),
        &DirectoryState::restore(limits, state().export()).unwrap(),
    );
}

#[test]
fn pattern_intersection() {
    for (a, b, want) in [
        ("host.*", "host.cpu", true),
        ("host.*", "net.*", false),
        ("host.*", "h*", true),
        ("*", "anything", true),
        ("host.cpu", "host.cpu", true),
        ("host.cpu", "host.mem", false),
        ("*.avg?m", "host.*", true),
        ("*.avg?m", "*.avg10m", false),
        ("a?c", "ab*", true),
        ("a?c", "abd", false),
        ("*x", "*y", false),
        ("*x*", "*y*", true),
    ] {
        assert_eq!(patterns_intersect(a, b), want, "{a} vs {b}");
        assert_eq!(patterns_intersect(b, a), want, "{b} vs {a}");
    }
}
