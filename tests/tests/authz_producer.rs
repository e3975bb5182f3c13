//! A producer with mTLS and a policy, real processes and generated certificates: an allowed
//! identity (alice) gets raw events; a denied one (carol) gets PERMISSION_DENIED for query and
//! subscribe; a summary-only one (bob) is refused raw events with a hint, and gets only
//! summaries — at his rate class — when he asks for them, whatever else the request carries.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use gma_core::codec::BatchDecoder;
use gma_proto::v1 as pb;
use pb::producer_client::ProducerClient;
use tonic::transport::Channel;
use tonic::Code;

/// Bob's rate class: at most one event per series every 2 s.
const BOB_INTERVAL_MS: i64 = 2000;

const POLICY: &str = r#"default = "deny"

# carol belongs to site1 but is refused everything (the first matching rule decides).
[[rule]]
cn = "carol"
actions = ["*"]
effect = "deny"

[[rule]]
org = "site1"
actions = ["*"]
effect = "allow"

# bob, from outside, sees host summaries only, at most one event per series every 2 s.
[[rule]]
cn = "bob"
org = "outside"
actions = ["producer.subscribe", "producer.query"]
resources = ["host.*"]
effect = "summary"
min_interval_ms = 2000
"#;

struct Site {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    prod: Proc,
}

impl Site {
    /// `gma ARGS --producer ADDR` as `who`.
    fn run(&self, who: &str, args: &[&str], timeout: Duration) -> Run {
        let d = self.dir.to_str().unwrap();
        let (ca, cert, key) = (
            format!("{d}/ca/ca.pem"),
            format!("{d}/certs/{who}.pem"),
            format!("{d}/certs/{who}.key"),
        );
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&[
            "--producer",
            &self.prod.addr,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ]);
        gma(&all, timeout)
    }

    /// A gRPC channel presenting `who`'s certificate.
    async fn channel(&self, who: &str) -> Channel {
        mtls_channel(&self.dir, &self.prod.addr, who).await
    }
}

fn site() -> Site {
    let tmp = tempdir();
    let dir = tmp.path().to_path_buf();
    let d = dir.to_str().unwrap().to_string();
    make_certs(
        &dir,
        &["ca"],
        &[
            ("ca", "node1", "site1"),
            ("ca", "alice", "site1"),
            ("ca", "carol", "site1"),
            ("ca", "bob", "outside"),
        ],
    );
    std::fs::write(dir.join("policy.toml"), POLICY).unwrap();
    // A short period: the 1m summaries are published once a second of event time.
    let sim = dir.join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n\
         [[host]]\nname = \"h1\"\ncpus = 4\nmemory_mb = 1024\nload = 1.5\n\
         [[host]]\nname = \"h2\"\ncpus = 8\nmemory_mb = 2048\nwalk = { min = 0.0, max = 4.0, step = 0.1, seed = 3 }\n",
    )
    .unwrap();
    let prod = Proc::producer(&[
        "--no-host-sensors",
        "--simulate",
        sim.to_str().unwrap(),
        "--access-policy",
        &format!("{d}/policy.toml"),
        "--tls-cert",
        &format!("{d}/certs/node1.pem"),
        "--tls-key",
        &format!("{d}/certs/node1.key"),
        "--tls-client-ca",
        &format!("{d}/ca/ca.pem"),
    ]);
    Site { _tmp: tmp, dir, prod }
}

fn denied(r: &Run, who: &str) {
    assert_ne!(r.code, 0, "{who} was served: {}", r.stdout);
    assert!(r.stdout.is_empty(), "{who} got events: {}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
}

fn names(r: &Run) -> Vec<String> {
    json_lines(&r.stdout)
        .iter()
        .map(|v| v["name"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn the_producer_enforces_its_policy_per_identity() {
    let s = site();
    let secs = Duration::from_secs;

    // alice (site1) is served raw events.
    assert!(
        wait_until(secs(20), || {
            let r = s.run("alice", &["query", "host.load", "--output", "json"], secs(20));
            r.code == 0 && json_lines(&r.stdout).iter().any(|v| v["values"]["load1"] == 1.5)
        }),
        "{}",
        s.prod.stderr_text()
    );
    let r = s.run(
        "alice",
        &["subscribe", "host.load", "--count", "4", "--output", "json"],
        secs(30),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(names(&r), vec!["host.load"; 4], "{}", r.stdout);

    // carol (site1, denied): query and subscribe are PERMISSION_DENIED naming her and the rule.
    let r = s.run("carol", &["query", "host.load", "--output", "json"], secs(20));
    denied(&r, "carol");
    assert!(
        r.stderr.contains("CN=carol, O=site1 may not producer.query"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("policy.toml line 4"), "{}", r.stderr);
    let r = s.run(
        "carol",
        &["subscribe", "host.load", "--count", "1", "--output", "json"],
        secs(20),
    );
    denied(&r, "carol");
    assert!(r.stderr.contains("may not producer.subscribe"), "{}", r.stderr);
    // ... and so is anything else she tries.
    let r = s.run("carol", &["sim", "set", "h1", "load=9"], secs(20));
    denied(&r, "carol");

    // bob (outside, summary-only): raw events are refused with the way to ask for summaries.
    let r = s.run(
        "bob",
        &["subscribe", "host.load", "--count", "1", "--output", "json"],
        secs(20),
    );
    denied(&r, "bob");
    assert!(
        r.stderr.contains(
            "CN=bob, O=outside may receive only summaries of \"host.load\": subscribe with --summary 1m \
             (or to host.load.avg1m)"
        ),
        "{}",
        r.stderr
    );
    let r = s.run("bob", &["query", "host.load", "--output", "json"], secs(20));
    denied(&r, "bob");
    assert!(
        r.stderr.contains("may receive only summaries of \"host.load\""),
        "{}",
        r.stderr
    );
    // Forecasts are not summaries.
    let r = s.run(
        "bob",
        &[
            "subscribe",
            "host.load",
            "--summary",
            "1m",
            "--forecast",
            "--count",
            "1",
        ],
        secs(20),
    );
    denied(&r, "bob");
    // Beyond host.*, the default denies (even for summaries).
    let r = s.run(
        "bob",
        &["subscribe", "*", "--summary", "1m", "--count", "1"],
        secs(20),
    );
    denied(&r, "bob");
    // No admin.
    let r = s.run("bob", &["sim", "set", "h1", "load=9"], secs(20));
    denied(&r, "bob");

    // Asking for summaries: only host.load.avg1m, at bob's rate class even though he asks for
    // more (min interval 100 ms).
    let r = s.run(
        "bob",
        &[
            "subscribe",
            "host.load",
            "--summary",
            "1m",
            "--min-interval-ms",
            "100",
            "--count",
            "6",
            "--output",
            "json",
        ],
        secs(60),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let events = json_lines(&r.stdout);
    assert_eq!(events.len(), 6);
    assert!(
        events.iter().all(|v| v["name"] == "host.load.avg1m"),
        "bob got a raw event: {}",
        r.stdout
    );
    let mut last: HashMap<String, i64> = HashMap::new();
    for v in &events {
        let src = v["source"].as_str().unwrap().to_string();
        let ts = v["timestamp_ns"].as_i64().unwrap();
        if let Some(prev) = last.insert(src.clone(), ts) {
            assert!(
                ts - prev >= BOB_INTERVAL_MS * 1_000_000,
                "{src}: {} ms between events, rate class is {BOB_INTERVAL_MS} ms: {}",
                (ts - prev) / 1_000_000,
                r.stdout
            );
        }
    }
    // A `when` filter still sees and delivers summaries only.
    let r = s.run(
        "bob",
        &[
            "subscribe",
            "host.load",
            "--summary",
            "1m",
            "--when",
            "load1 >= 0",
            "--count",
            "2",
            "--output",
            "json",
        ],
        secs(60),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(names(&r), vec!["host.load.avg1m"; 2], "{}", r.stdout);
    // A summary asked for by name is allowed and derived on demand (nothing else derives
    // host.cpu summaries on this producer).
    let r = s.run(
        "bob",
        &["subscribe", "host.cpu.avg1m", "--count", "2", "--output", "json"],
        secs(60),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(names(&r), vec!["host.cpu.avg1m"; 2], "{}", r.stdout);
    // ... and so is a query of summaries.
    let r = s.run("bob", &["query", "host.load.avg1m", "--output", "json"], secs(20));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let n = names(&r);
    assert!(
        !n.is_empty() && n.iter().all(|n| n == "host.load.avg1m"),
        "{}",
        r.stdout
    );

    // Raw gRPC, requests the CLI cannot make: bob never receives a raw event.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut bob = ProducerClient::new(s.channel("bob").await);
        let sub = |patterns: &[&str], summaries: &[&str], forecast: bool| pb::SubscribeRequest {
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            summaries: summaries.iter().map(|p| p.to_string()).collect(),
            forecast,
            consumer_id: "bob".into(),
            ..Default::default()
        };
        // A summary next to a raw pattern: refused as a whole.
        for req in [
            sub(&["host.load.avg1m", "host.load"], &[], false),
            sub(&["host.load.avg1m", "host.cpu"], &[], false),
            sub(&["host.load"], &["1m"], true),
            sub(&["host.*"], &["10m"], true),
        ] {
            let e = bob.subscribe(req.clone()).await.map(|_| ()).unwrap_err();
            assert_eq!(e.code(), Code::PermissionDenied, "{req:?}: {e:?}");
        }
        let q = pb::QueryRequest {
            patterns: vec!["host.load.avg1m".into(), "host.cpu".into()],
            ..Default::default()
        };
        let e = bob.query(q).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message().contains("summaries of \"host.cpu\""),
            "{}",
            e.message()
        );
        // Recent history is a subscription's: raw events refused, summaries served.
        let hist = |p: &str| pb::QueryRequest {
            patterns: vec![p.into()],
            since_ms: 600_000,
            ..Default::default()
        };
        let e = bob.query(hist("host.load")).await.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("--since"), "{}", e.message());
        let r = bob.query(hist("host.load.avg1m")).await.unwrap().into_inner();
        assert!(
            !r.events.is_empty() && r.events.iter().all(|e| e.name == "host.load.avg1m"),
            "{r:?}"
        );

        // Several patterns and windows with summaries: every series delivered is a summary.
        let mut stream = bob
            .subscribe(sub(&["host.load", "host.cpu"], &["1m", "10m"], false))
            .await
            .unwrap()
            .into_inner();
        let mut dec = BatchDecoder::new();
        let mut seen = 0;
        while seen < 8 {
            let m = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await
                .expect("summaries within 30 s")
                .unwrap()
                .expect("stream open");
            if let Some(b) = m.batch {
                dec.decode_each(&b, |e| {
                    let name = &e.series.name;
                    assert!(
                        name.ends_with(".avg1m") || name.ends_with(".avg10m"),
                        "bob received {name}"
                    );
                    seen += 1;
                })
                .unwrap();
            }
        }
    });
}
