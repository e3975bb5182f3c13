//! Summary-only means summaries at every door (issue 26): with the README's secured set-up (a
//! CA, an inside user `alice` of org `site1`, an outside user `bob` of org `partner` granted
//! `effect = "summary"` on `host.*`), real processes over mTLS:
//!
//! - the archiver answers bob with the archived summary series only (`host.load.avg1m`, ...),
//!   or `PERMISSION_DENIED` naming the rule when only raw data could answer (query, export,
//!   series listing, stats); alice gets everything;
//! - the broker's view (raw host values) is refused to bob and served to alice;
//! - the dashboard identifies browsers (client certificate, a trusted proxy's header, a bearer
//!   token) and applies the policy to every data route: no identity gets 401, bob gets the page
//!   without raw host data, alice everything;
//! - the Prometheus endpoints take the role's TLS, client CA and policy: plain HTTP next to an
//!   mTLS producer is refused at start without `--metrics-insecure`; a scrape without a
//!   certificate fails, bob gets no raw gauge, alice gets them.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::secure::*;
use common::*;

/// Waits until `alice` reads rows of `pattern` from the archiver at `addr`.
fn wait_archived(site: &Secure, addr: &str, pattern: &str) {
    let mut last = String::new();
    let ok = wait_until(Duration::from_secs(60), || {
        let r = site.run_as(
            "alice",
            &[
                "archive",
                "query",
                pattern,
                "--archiver",
                addr,
                "--from",
                "-5m",
                "--output",
                "json",
            ],
        );
        last = r.stderr.clone();
        r.code == 0 && !r.stdout.trim().is_empty()
    });
    assert!(ok, "the archiver never held {pattern}: {last}");
}

fn names(rows: &[serde_json::Value]) -> std::collections::BTreeSet<String> {
    rows.iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_archiver_serves_a_summary_only_identity_summaries_only() {
    let site = Secure::new("");
    let dir = site.directory();
    let _prod = site.producer(&dir.addr, &[]);
    let data = site.path("archive");
    let arch = site.start(
        &[
            "archiver",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--data",
            &data,
        ],
        "gma archiver listening on",
    );
    let a = arch.addr.as_str();
    wait_archived(&site, a, "host.load");
    wait_archived(&site, a, "host.load.avg1m");

    // alice (inside) reads raw rows.
    let r = site.run_as(
        "alice",
        &[
            "archive",
            "query",
            "host.*",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let got = names(&json_lines(&r.stdout));
    assert!(
        got.contains("host.load") && got.contains("host.load.avg1m"),
        "{got:?}"
    );

    // bob (summary-only): a raw series is refused, naming the rule and the way out.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.load",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_ne!(r.code, 0, "bob was served raw host.load: {}", r.stdout);
    assert!(r.stdout.trim().is_empty(), "bob got rows: {}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    assert!(
        r.stderr.contains("may read only summaries of \"host.load\"")
            && r.stderr.contains("host.load.avg1m")
            && r.stderr.contains("policy.toml line 8"),
        "{}",
        r.stderr
    );
    // ... an aggregate over raw samples is raw data too.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.load",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--step",
            "1s",
            "--agg",
            "max",
        ],
    );
    assert_ne!(
        r.code, 0,
        "bob was served an aggregate of raw host.load: {}",
        r.stdout
    );

    // bob may read the summaries by name ...
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.load.avg1m",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        names(&json_lines(&r.stdout)),
        ["host.load.avg1m".to_string()].into()
    );
    // ... and a pattern gets him the summary series among its matches, nothing raw.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "query",
            "host.*",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--output",
            "json",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let got = names(&json_lines(&r.stdout));
    assert!(!got.is_empty(), "bob got nothing of host.*");
    assert!(
        got.iter().all(|n| gma_core::authz::is_summary_name(n)),
        "bob got raw series: {got:?}"
    );

    // Export: only summary samples reach the file.
    let out = site.path("bob.csv");
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "export",
            "host.*",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--format",
            "csv",
            "--out",
            &out,
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let csv = std::fs::read_to_string(&out).unwrap();
    let exported: std::collections::BTreeSet<&str> =
        csv.lines().skip(1).filter_map(|l| l.split(',').next()).collect();
    assert!(!exported.is_empty(), "bob exported nothing");
    assert!(
        exported.iter().all(|n| gma_core::authz::is_summary_name(n)),
        "bob exported raw series: {exported:?}"
    );
    // An export of a raw series alone is refused.
    let r = site.run_as(
        "bob",
        &[
            "archive",
            "export",
            "host.load",
            "--archiver",
            a,
            "--from",
            "-5m",
            "--out",
            &out,
        ],
    );
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);

    // Series listing: summaries only.
    let r = site.run_as(
        "bob",
        &["archive", "series", "host.*", "--archiver", a, "--output", "json"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let listed = names(&json_lines(&r.stdout));
    assert!(
        !listed.is_empty() && listed.iter().all(|n| gma_core::authz::is_summary_name(n)),
        "{listed:?}"
    );
    let r = site.run_as(
        "alice",
        &["archive", "series", "host.*", "--archiver", a, "--output", "json"],
    );
    assert!(names(&json_lines(&r.stdout)).contains("host.cpu"), "{}", r.stdout);

    // Stats cover every series: not for a summary-only identity.
    let r = site.run_as("bob", &["archive", "stats", "--archiver", a]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    let r = site.run_as("alice", &["archive", "stats", "--archiver", a]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn the_broker_view_is_raw_data_for_identities_allowed_raw_only() {
    let site = Secure::new("");
    let dir = site.directory();
    let _prod = site.producer(&dir.addr, &[]);
    let broker = site.start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    let view = |who: &str| {
        site.run_as(
            who,
            &["broker", "view", "--broker", &broker.addr, "--output", "json"],
        )
    };
    // alice sees the hosts with their raw values once the broker follows the producer.
    let mut last = String::new();
    let ok = wait_until(Duration::from_secs(60), || {
        let r = view("alice");
        last = format!("{}{}", r.stdout, r.stderr);
        r.code == 0
            && serde_json::from_str::<serde_json::Value>(&r.stdout)
                .ok()
                .and_then(|v| {
                    v.as_array()
                        .map(|a| a.iter().any(|h| h["resource"] == "h1" && h["load1"].is_number()))
                })
                .unwrap_or(false)
    });
    assert!(ok, "alice never saw h1 in the view: {last}");
    // bob may ask for placements but not read the raw view.
    let r = view("bob");
    assert_ne!(r.code, 0, "bob got the raw view: {}", r.stdout);
    assert!(!r.stdout.contains("h1"), "{}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    assert!(
        r.stderr.contains("may read only summaries of \"host.")
            && r.stderr.contains("--summary 1m")
            && r.stderr.contains("policy.toml line 8"),
        "{}",
        r.stderr
    );
}

/// The host chart points of a dashboard snapshot (JSON): how many points in all.
fn chart_points(snapshot: &serde_json::Value) -> usize {
    snapshot["hosts"]
        .as_array()
        .map(|hosts| {
            hosts
                .iter()
                .flat_map(|h| h["series"].as_object().into_iter().flat_map(|s| s.values()))
                .map(|pts| pts.as_array().map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Waits until `get` returns a snapshot with host chart points (the dashboard follows the
/// producer), and returns it.
fn snapshot_with_points(mut get: impl FnMut() -> Result<(u16, String), String>) -> serde_json::Value {
    let mut last = String::new();
    let mut snap = serde_json::Value::Null;
    let ok = wait_until(Duration::from_secs(60), || match get() {
        Ok((200, body)) => {
            snap = json(&body);
            last = body;
            chart_points(&snap) > 0
        }
        other => {
            last = format!("{other:?}");
            false
        }
    });
    assert!(ok, "no host points in the snapshot: {last}");
    snap
}

#[test]
fn the_dashboard_authenticates_browsers_and_serves_raw_host_data_only_to_identities_allowed_raw() {
    let site = Secure::new(POLICY_HTTP);
    let dir = site.directory();
    let _prod = site.producer(&dir.addr, &[]);
    let data = site.path("archive");
    let arch = site.start(
        &[
            "archiver",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--data",
            &data,
        ],
        "gma archiver listening on",
    );
    wait_archived(&site, &arch.addr, "host.load.avg1m");
    let (ca, cert, key, policy) = (
        site.path("ca/ca.pem"),
        site.path("certs/node1.pem"),
        site.path("certs/node1.key"),
        site.path("policy.toml"),
    );
    let base = [
        "dashboard",
        "--listen",
        "127.0.0.1:0",
        "--directory",
        &dir.addr,
        "--archiver",
        &arch.addr,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--access-policy",
        &policy,
    ];

    // HTTPS with a policy but no authentication configured: a browser without a certificate
    // is anonymous, and the policy denies anonymous peers everything.
    let dash = Proc::start(&base, "gma dashboard listening on");
    // (Served at all, the snapshot would soon hold the hosts' raw values: wait for either.)
    let mut r = (0, String::new());
    wait_until(Duration::from_secs(60), || {
        r = site.get(&dash.addr, "/api/snapshot", None, &[]).unwrap();
        r.0 != 200 || chart_points(&json(&r.1)) > 0
    });
    assert_eq!(r.0, 401, "an anonymous browser was served the snapshot: {}", r.1);
    for path in [
        "/api/events",
        "/api/history?name=host.load",
        "/api/archive/series?pattern=host.*",
        "/metrics",
    ] {
        let r = https(&site, &dash.addr, path, None, &[], |t| t.contains("\r\n\r\n")).unwrap();
        assert_eq!(r.0, 401, "{path} served to an anonymous browser: {}", r.1);
    }
    // The page itself carries no data.
    assert_eq!(site.get(&dash.addr, "/", None, &[]).unwrap().0, 200);
    assert_eq!(site.get(&dash.addr, "/healthz", None, &[]).unwrap().0, 200);
    drop(dash);

    // Mode 1: client certificates (mTLS).
    let mut args = base.to_vec();
    args.extend_from_slice(&["--tls-client-ca", &ca]);
    let dash = Proc::start(&args, "gma dashboard listening on");
    let d = dash.addr.as_str();
    let no_cert = site.get(d, "/api/snapshot", None, &[]);
    assert!(
        no_cert.is_err(),
        "served without a client certificate: {no_cert:?}"
    );
    let other_ca = site.get(d, "/api/snapshot", Some("eve"), &[]);
    assert!(
        other_ca.is_err(),
        "served a certificate of another CA: {other_ca:?}"
    );
    // alice (inside) gets the hosts' raw charts.
    let snap = snapshot_with_points(|| site.get(d, "/api/snapshot", Some("alice"), &[]));
    assert!(!snap["records"].as_array().unwrap().is_empty(), "{snap}");
    // bob (summaries only) gets the page without any raw host value ...
    let (code, body) = site.get(d, "/api/snapshot", Some("bob"), &[]).unwrap();
    assert_eq!(code, 200, "{body}");
    let bob = json(&body);
    assert_eq!(chart_points(&bob), 0, "bob got raw host points: {body}");
    assert!(
        bob["records"].as_array().unwrap().is_empty(),
        "bob may not search the directory: {body}"
    );
    // ... also on the live stream, which still carries what he may see (gma.rpc rows).
    let rpc_twice = |t: &str| t.matches("\"type\":\"rpc\"").count() >= 2;
    let (code, stream) = https(&site, d, "/api/events", Some("bob"), &[], rpc_twice).unwrap();
    assert_eq!(code, 200, "{stream}");
    assert!(rpc_twice(&stream), "{stream}");
    assert!(
        !stream.contains("\"type\":\"points\""),
        "bob got raw points: {stream}"
    );
    assert!(
        !stream.contains("\"load\":[["),
        "bob got raw chart points: {stream}"
    );
    let has_points = |t: &str| t.contains("\"type\":\"points\"");
    let (_, alice_stream) = https(&site, d, "/api/events", Some("alice"), &[], has_points).unwrap();
    assert!(has_points(&alice_stream), "{alice_stream}");
    // History: raw series refused to bob, naming the rule; summaries served.
    let (code, body) = site
        .get(d, "/api/history?name=host.load&range_s=300", Some("bob"), &[])
        .unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("may read only summaries of \\\"host.load\\\"") && body.contains("policy.toml line 8"),
        "{body}"
    );
    let (code, body) = site
        .get(
            d,
            "/api/history?name=host.load.avg1m&range_s=300",
            Some("bob"),
            &[],
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(!json(&body)["series"].as_array().unwrap().is_empty(), "{body}");
    let (code, body) = site
        .get(d, "/api/history?name=host.*&range_s=300", Some("bob"), &[])
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let names: Vec<String> = json(&body)["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !names.is_empty() && names.iter().all(|n| gma_core::authz::is_summary_name(n)),
        "{names:?}"
    );
    let (code, body) = site
        .get(d, "/api/archive/series?pattern=host.*", Some("bob"), &[])
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("host.load.avg1m") && !body.contains("\"name\":\"host.load\""),
        "{body}"
    );
    let (code, body) = site
        .get(d, "/api/history?name=host.load&range_s=300", Some("alice"), &[])
        .unwrap();
    assert_eq!(code, 200, "{body}");
    drop(dash);

    // Modes 2 and 3 on plain HTTP (loopback): a trusted proxy's headers, bearer tokens.
    let tokens = site.dir.join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[token]]\ntoken = \"alice-token-0123456789abcdef0123456789\"\ncn = \"alice\"\norg = \"site1\"\n\n\
         [[token]]\ntoken = \"bob-token-0123456789abcdef0123456789abc\"\ncn = \"bob\"\norg = \"partner\"\n",
    )
    .unwrap();
    let tokens = tokens.to_str().unwrap().to_string();
    let plain = [
        "dashboard",
        "--listen",
        "127.0.0.1:0",
        "--directory",
        &dir.addr,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--access-policy",
        &policy,
        "--plain-http",
        "--auth-proxy-user-header",
        "X-Forwarded-User",
        "--auth-proxy-org-header",
        "X-Forwarded-Groups",
        "--auth-trusted-proxy",
        "127.0.0.1",
        "--auth-tokens",
        &tokens,
    ];
    let dash = Proc::start(&plain, "gma dashboard listening on");
    let d = dash.addr.as_str();
    let get = |headers: &[(&str, &str)]| http(d, "/api/snapshot", headers, |_| false);
    assert_eq!(get(&[]).unwrap().0, 401);
    let alice = [("X-Forwarded-User", "alice"), ("X-Forwarded-Groups", "site1,ops")];
    let snap = snapshot_with_points(|| get(&alice));
    assert!(chart_points(&snap) > 0);
    let (code, body) = get(&[("X-Forwarded-User", "bob"), ("X-Forwarded-Groups", "partner")]).unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(chart_points(&json(&body)), 0, "{body}");
    // The headers count only from the proxy's address.
    let (code, body) = http_from("127.0.0.2", d, "/api/snapshot", &alice, |_| false).unwrap();
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("trusted"), "{body}");
    // Tokens, compared in constant time; a wrong one is 401.
    let (code, body) = get(&[("Authorization", "Bearer alice-token-0123456789abcdef0123456789")]).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(chart_points(&json(&body)) > 0, "{body}");
    let (code, body) = get(&[("Authorization", "Bearer bob-token-0123456789abcdef0123456789abc")]).unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(chart_points(&json(&body)), 0, "{body}");
    let (code, _) = get(&[("Authorization", "Bearer alice-token-0123456789abcdef012345678X")]).unwrap();
    assert_eq!(code, 401);
}

#[test]
fn prometheus_endpoints_take_the_roles_tls_client_ca_and_policy() {
    let site = Secure::new(POLICY_HTTP);
    let dir = site.directory();
    let role = site.role_flags();
    let with = |extra: &[&str]| -> Vec<String> {
        let mut a = site.producer_cmd(&dir.addr);
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend(role.iter().cloned());
        a
    };
    let run = |args: &[String]| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        gma(&a, Duration::from_secs(30))
    };

    // Plain HTTP next to an mTLS producer is refused at start ...
    for (flag, addr) in [
        ("--prometheus", "http://127.0.0.1:0"),
        ("--metrics-listen", "http://127.0.0.1:0"),
    ] {
        let r = run(&with(&[flag, addr]));
        assert_eq!(r.code, 1, "{flag} {addr} started: {}", r.stderr);
        assert!(
            r.stderr.contains("plain HTTP next to its mTLS endpoint")
                && r.stderr.contains("--metrics-insecure"),
            "{}",
            r.stderr
        );
    }
    // ... unless told explicitly: then it is open.
    let args = with(&["--prometheus", "127.0.0.1:0", "--metrics-insecure"]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let insecure = Proc::start(&a, "gma producer listening on");
    let plain = printed_addr(&insecure, "producer", "prometheus");
    let ok = wait_until(Duration::from_secs(30), || {
        http(&plain, "/metrics", &[], |_| false)
            .is_ok_and(|(c, b)| c == 200 && b.contains("gma_host_load_load1"))
    });
    assert!(ok, "the insecure endpoint did not serve the gauges");
    drop(insecure);

    // By default they take the producer's TLS, client CA and policy.
    let args = with(&["--prometheus", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let prod = Proc::start(&a, "gma producer listening on");
    let values = printed_addr(&prod, "producer", "prometheus");
    let metrics = printed_addr(&prod, "producer", "metrics");
    for addr in [&values, &metrics] {
        let r = http(addr, "/metrics", &[], |_| false);
        assert!(!matches!(r, Ok((200, _))), "plain HTTP scrape served: {r:?}");
        let r = site.get(addr, "/metrics", None, &[]);
        assert!(
            r.is_err(),
            "a scrape without a client certificate was served: {r:?}"
        );
        let r = site.get(addr, "/metrics", Some("eve"), &[]);
        assert!(r.is_err(), "a certificate of another CA was served: {r:?}");
    }
    // alice (inside) gets the raw gauges, and (once derived) the summaries.
    let mut alice = String::new();
    let ok = wait_until(Duration::from_secs(60), || {
        alice = site
            .get(&values, "/metrics", Some("alice"), &[])
            .map(|r| r.1)
            .unwrap_or_default();
        alice.contains("gma_host_load_load1{") && alice.contains("gma_host_load_avg1m_load1{")
    });
    assert!(ok, "alice: {alice}");
    assert!(alice.contains("gma_host_cpu_"), "{alice}");
    // bob (summaries only) gets the summary gauges and no raw one.
    let (code, bob) = site.get(&values, "/metrics", Some("bob"), &[]).unwrap();
    assert_eq!(code, 200, "{bob}");
    assert!(bob.contains("gma_host_load_avg1m_load1{"), "{bob}");
    for raw in [
        "gma_host_load_load1{",
        "gma_host_cpu_",
        "gma_host_mem_",
        "name=\"host.load\"",
    ] {
        assert!(!bob.contains(raw), "bob got {raw}: {bob}");
    }
    // The role's own metrics: metrics.read on "producer".
    let (code, text) = site.get(&metrics, "/metrics", Some("bob"), &[]).unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("gma_producer_"), "{text}");
}
