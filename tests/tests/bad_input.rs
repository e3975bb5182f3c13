//! Hostile and malformed input against real processes: precise statuses and CLI errors, no
//! panics, and the data intact afterwards.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::io::Write;
use std::time::Duration;

use common::*;
use gma_proto::v1 as pb;
use tonic::Code;

fn one_error_line(r: &Run) -> String {
    assert_ne!(r.code, 0, "expected failure; stdout {}", r.stdout);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one clear line, got: {}", r.stderr);
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    assert!(!r.stderr.contains("panicked"));
    lines[0].to_string()
}

fn garbage(addr: &str) {
    let addr = addr.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut junk = Vec::new();
    let mut x: u32 = 12345;
    for _ in 0..64 * 1024 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        junk.push((x >> 16) as u8);
    }
    let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let _ = s.write_all(&junk);
    drop(s);
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
}

#[test]
fn cli_errors_are_one_clear_line() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("d"), "127.0.0.1:0");
    let l = one_error_line(&gma(
        &["search", "host..cpu", "--directory", &dir.addr],
        Duration::from_secs(10),
    ));
    assert!(
        l.contains("position 5") && l.contains("empty name segment"),
        "{l}"
    );
    let l = one_error_line(&gma(
        &["subscribe", "host cpu", "--directory", &dir.addr, "--count", "1"],
        Duration::from_secs(10),
    ));
    assert!(l.contains("position 4"), "{l}");
    let l = one_error_line(&gma(
        &["query", "host.cpu", "--directory", &dir.addr],
        Duration::from_secs(10),
    ));
    assert!(l.contains("no producer"), "{l}");
    // Nothing listens on port 1.
    let l = one_error_line(&gma(
        &["search", "*", "--directory", "127.0.0.1:1"],
        Duration::from_secs(10),
    ));
    assert!(l.contains("cannot connect"), "{l}");
    // Unknown config keys are rejected with the key named.
    let cfg = tmp.path().join("p.toml");
    std::fs::write(&cfg, "listen = \"127.0.0.1:0\"\nlsten = 3\n").unwrap();
    let l = one_error_line(&gma(
        &["producer", "--config", cfg.to_str().unwrap()],
        Duration::from_secs(10),
    ));
    assert!(l.contains("unknown field `lsten`"), "{l}");
    let dcfg = tmp.path().join("d.toml");
    std::fs::write(&dcfg, "data_dir = \"/tmp/x\"\nttl = 3\n").unwrap();
    let l = one_error_line(&gma(
        &["directory", "--config", dcfg.to_str().unwrap()],
        Duration::from_secs(10),
    ));
    assert!(l.contains("unknown field `ttl`"), "{l}");
    let l = one_error_line(&gma(
        &["directory", "--listen", "127.0.0.1:0"],
        Duration::from_secs(10),
    ));
    assert!(l.contains("--data"), "{l}");
    // A bad simulation file fails at start with the problem named.
    let sim = tmp.path().join("sim.toml");
    std::fs::write(&sim, "[[host]]\nname = \"a\"\ncpus = 0\nmemory_mb = 1024\n").unwrap();
    let l = one_error_line(&gma(
        &[
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--simulate",
            sim.to_str().unwrap(),
        ],
        Duration::from_secs(10),
    ));
    assert!(l.contains("cpus"), "{l}");
}

#[test]
fn simulated_hosts_can_be_changed_and_bad_changes_are_refused() {
    let tmp = tempdir();
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n[[host]]\nname = \"hostA\"\ncpus = 8\nmemory_mb = 1024\nload = 0.5\n",
    )
    .unwrap();
    let prod = Proc::producer(&["--no-host-sensors", "--simulate", sim.to_str().unwrap()]);
    let r = gma(
        &[
            "sim",
            "set",
            "hostA",
            "load=3.5",
            "free_cpus=0",
            "--producer",
            &prod.addr,
        ],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The new values show up in the stream.
    let ok = wait_until(Duration::from_secs(20), || {
        let r = gma(
            &[
                "query",
                "host.load",
                "--producer",
                &prod.addr,
                "--source",
                "hostA",
                "--output",
                "json",
            ],
            Duration::from_secs(10),
        );
        r.code == 0
            && json_lines(&r.stdout)
                .first()
                .is_some_and(|e| e["values"]["load1"] == 3.5 && e["values"]["free_cpus"] == 0.0)
    });
    assert!(ok, "sim set did not take effect");
    let l = one_error_line(&gma(
        &["sim", "set", "nohost", "load=1", "--producer", &prod.addr],
        Duration::from_secs(10),
    ));
    assert!(l.contains("nohost"), "{l}");
    let l = one_error_line(&gma(
        &["sim", "set", "hostA", "colour=1", "--producer", &prod.addr],
        Duration::from_secs(10),
    ));
    assert!(l.contains("colour"), "{l}");
    let l = one_error_line(&gma(
        &["sim", "set", "hostA", "load=abc", "--producer", &prod.addr],
        Duration::from_secs(10),
    ));
    assert!(l.contains("not a number"), "{l}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_rpcs_validate_input() {
    let prod = Proc::producer(&["--period-ms", "100", "--source", "node9"]);
    let ch = gma_consumer::connect(&prod.addr).await.unwrap();
    let mut p = pb::producer_client::ProducerClient::new(ch.clone());
    let mut ingest = pb::ingest_client::IngestClient::new(ch.clone());
    let mut sim = pb::simulator_client::SimulatorClient::new(ch.clone());

    let q = |patterns: Vec<&str>| pb::QueryRequest {
        patterns: patterns.into_iter().map(String::from).collect(),
        ..Default::default()
    };
    let e = p.query(q(vec!["host..cpu"])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("position 5"), "{}", e.message());
    assert_eq!(
        p.query(q(vec![])).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        p.query(q(vec!["no.such.event"])).await.unwrap_err().code(),
        Code::NotFound
    );
    let e = p
        .subscribe(pb::SubscribeRequest {
            patterns: vec!["a b".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = p
        .unsubscribe(pb::UnsubscribeRequest {
            subscription_id: 999,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Ingest: unknown schema, nonconforming values, oversized request.
    let ev = |name: &str, vals: Vec<f64>| pb::Event {
        name: name.into(),
        source: "app1".into(),
        timestamp_ns: 0,
        seq: 0,
        values: vals
            .into_iter()
            .map(|v| pb::Value {
                kind: Some(pb::value::Kind::Number(v)),
            })
            .collect(),
    };
    let e = ingest
        .push(pb::IngestRequest {
            events: vec![ev("app.unknown", vec![1.0])],
            schemas: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("app.unknown") && e.message().contains("no schema"),
        "{}",
        e.message()
    );
    let schema = pb::EventSchema {
        name: "app.progress".into(),
        version: 1,
        fields: vec![
            gma_core::event::dbl("done", "", ""),
            gma_core::event::dbl("total", "", ""),
        ],
        description: String::new(),
    };
    let e = ingest
        .push(pb::IngestRequest {
            events: vec![ev("app.progress", vec![1.0])],
            schemas: vec![schema.clone()],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("1 values for 2 fields"), "{}", e.message());
    let big = pb::IngestRequest {
        events: vec![pb::Event {
            name: "app.progress".into(),
            source: "x".repeat(5 * 1024 * 1024),
            ..Default::default()
        }],
        schemas: vec![],
    };
    let e = ingest.push(big).await.unwrap_err();
    assert!(
        matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{e:?}"
    );
    // A refused request left nothing behind, not even its schema.
    let e = ingest
        .push(pb::IngestRequest {
            events: vec![ev("app.progress", vec![1.0, 2.0])],
            schemas: vec![],
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("no schema"), "{}", e.message());
    let ok = ingest
        .push(pb::IngestRequest {
            events: vec![ev("app.progress", vec![1.0, 2.0])],
            schemas: vec![schema.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.accepted, 1);
    // Timestamps outside the valid range (docs/protocol.md: 1 ..= 2099-12-31T23:59:59.999999999Z,
    // 0 = the producer's clock) are refused, naming the field; the bounds are accepted.
    let at = |ts: i64| pb::IngestRequest {
        events: vec![pb::Event {
            timestamp_ns: ts,
            ..ev("app.progress", vec![3.0, 4.0])
        }],
        schemas: vec![],
    };
    for ts in [-1, i64::MIN, i64::MAX, 4_102_444_800_000_000_000] {
        let e = ingest.push(at(ts)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "timestamp {ts}: {e:?}");
        assert!(
            e.message().contains(&format!("timestamp_ns {ts} is outside")),
            "{}",
            e.message()
        );
    }
    for ts in [1, 4_102_444_799_999_999_999, 0] {
        let ok = ingest.push(at(ts)).await.unwrap().into_inner();
        assert_eq!(ok.accepted, 1, "timestamp {ts}");
    }
    // A producer without simulated hosts says so.
    let e = sim
        .set(pb::SimSetRequest {
            host: "a".into(),
            values: [("load".to_string(), 1.0)].into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);

    // Garbage on the port: the producer keeps serving, its data intact.
    garbage(&prod.addr);
    let r = p.query(q(vec!["app.progress"])).await.unwrap().into_inner();
    assert_eq!(r.events.len(), 1);
    let v = p.version(pb::VersionRequest {}).await.unwrap().into_inner();
    assert_eq!(v.interface, "gma.v1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_rejects_bad_records_and_keeps_its_data() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("d"), "127.0.0.1:0");
    let prod = Proc::producer(&["--directory", &dir.addr, "--source", "node8"]);
    let mut c = gma_consumer::directory::client(&dir.addr).await.unwrap();
    let listed = || async {
        let mut c = gma_consumer::directory::client(&dir.addr).await.unwrap();
        // host.*: the producer's record, not the directory's gma.rpc companion. Until the
        // single node has elected itself the search is UNAVAILABLE: an empty answer, retried.
        gma_consumer::directory::producers(&mut c, "host.*", "")
            .await
            .unwrap_or_default()
    };
    // Wait for the refresh that adds the sources after the first samples.
    let existing = wait_for(
        "the producer's record with its sources",
        Duration::from_secs(10),
        || async {
            let existing = listed().await;
            if existing.len() == 1 && !existing[0].sources.is_empty() {
                Ok(existing)
            } else {
                Err(format!("{} records: {existing:?}", existing.len()))
            }
        },
    )
    .await;
    assert_eq!(existing.len(), 1);
    let rec = existing[0].clone();
    let register = |p: pb::ProducerRecord, schemas: Vec<pb::EventSchema>| pb::RegisterRequest {
        record: Some(pb::Record {
            record: Some(pb::record::Record::Producer(p)),
        }),
        schemas,
        lease_ttl_ms: 0,
    };
    // Duplicate Add.
    let e = c.register(register(rec.clone(), vec![])).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    // Unknown schema.
    let mut other = rec.clone();
    other.id = "other".into();
    other.events = vec!["no.schema".into()];
    let e = c.register(register(other, vec![])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("no.schema"), "{}", e.message());
    // Update / Remove matching nothing.
    let mut ghost = rec.clone();
    ghost.id = "ghost".into();
    let e = c
        .update(pb::UpdateRequest {
            record: Some(pb::Record {
                record: Some(pb::record::Record::Producer(ghost)),
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .remove(pb::RemoveRequest {
            kind: pb::RecordKind::Producer as i32,
            id: "ghost".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // Malformed search pattern, oversized request.
    let e = c
        .search(pb::SearchRequest {
            event_pattern: "host..x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut huge = rec.clone();
    huge.id = "huge".into();
    huge.attributes.insert("blob".into(), "x".repeat(5 * 1024 * 1024));
    let e = c.register(register(huge, vec![])).await.unwrap_err();
    assert!(
        matches!(e.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{e:?}"
    );
    // Garbage bytes on the port.
    garbage(&dir.addr);
    // The directory's data is intact.
    let key = |p: &pb::ProducerRecord| (p.id.clone(), p.address.clone(), p.events.clone());
    let after = listed().await;
    assert_eq!(after.iter().map(key).collect::<Vec<_>>(), vec![key(&rec)]);
    let v = c.version(pb::VersionRequest {}).await.unwrap().into_inner();
    assert_eq!(v.interface, "gma.v1");
    drop(prod);
}

/// A producer whose lease TTL the directory refuses stops at once with the directory's
/// message (it used to keep serving and retry its registration forever), and a plaintext role
/// asked to listen off loopback refuses before it binds anything.
#[test]
fn roles_refuse_bad_settings_at_start() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let r = gma(
        &[
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--no-host-sensors",
            "--directory",
            &dir.addr,
            "--lease-ttl-ms",
            "100",
        ],
        Duration::from_secs(60),
    );
    assert_ne!(r.code, -9, "the producer did not stop within 60 s: {}", r.stderr);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("lease_ttl_ms 100 is outside [500, 3600000]"),
        "{}",
        r.stderr
    );

    // Plaintext on 0.0.0.0 (not loopback) is refused before binding: with the port taken on
    // 127.0.0.1, a role that bound first would fail with "address in use" instead.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let any = format!("0.0.0.0:{port}");
    let d = tmp.path().join("d2");
    for args in [
        vec!["producer", "--listen", &any, "--no-host-sensors"],
        vec!["directory", "--listen", &any, "--data", d.to_str().unwrap()],
        vec![
            "sink",
            "--listen",
            &any,
            "--directory",
            &dir.addr,
            "--accept",
            "*",
        ],
    ] {
        let r = gma(&args, Duration::from_secs(30));
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(&format!("refusing plaintext on {any}")),
            "{args:?}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("listening on"), "{args:?}: {}", r.stderr);
    }
    // The same for a plain-HTTP Prometheus endpoint of a plaintext role.
    let r = gma(
        &[
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--no-host-sensors",
            "--metrics-listen",
            &any,
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "--metrics-listen on {any} would serve plain HTTP off loopback"
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("metrics on"), "{}", r.stderr);
}
