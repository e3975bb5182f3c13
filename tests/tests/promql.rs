//! PromQL over the archive with a client nobody here wrote: Prometheus' own `promtool query
//! instant|range` against the archiver's `--http-listen`, with real processes (a directory, a
//! producer fed known values, the archiver with a policy). What promtool returns is compared
//! with what `gma archive query` returns for the same series and range; an unsupported
//! construct comes back as promtool's `bad_data` error carrying our message; a reader the
//! policy denies gets 403.
//!
//! promtool comes from Debian's `prometheus` package (scripts/test.sh installs it); under
//! `CI=true` a missing promtool fails the test, elsewhere it is skipped with a note.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::process::Command;
use std::time::Duration;

use common::netns::in_ci;
use common::*;
use gma_proto::v1 as pb;

/// Anyone may query the archive's `app.*` series; nobody `secret.*`.
const POLICY: &str = r#"default = "deny"

[[rule]]
actions = ["archive.query"]
resources = ["app.*"]
effect = "allow"
"#;

/// `promtool`, or None (skip) outside CI.
fn promtool() -> Option<String> {
    let ok = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some("promtool".into());
    }
    if in_ci() {
        panic!("CI=true and promtool is missing: install Debian's prometheus package (scripts/test.sh does)");
    }
    eprintln!("SKIPPED: promtool is missing (apt-get install prometheus); under CI=true this fails");
    None
}

/// Pushes `items` as events `name` (one double field `v`) from source `job1`.
fn push(producer: &str, name: &str, items: &[(i64, f64)]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ch = gma_consumer::connect(producer).await.unwrap();
        let mut c = pb::ingest_client::IngestClient::new(ch);
        let schema = pb::EventSchema {
            name: name.into(),
            version: 1,
            fields: vec![gma_core::event::dbl("v", "", "")],
            description: String::new(),
        };
        let events = items
            .iter()
            .map(|(ts, v)| pb::Event {
                name: name.into(),
                source: "job1".into(),
                timestamp_ns: *ts,
                seq: 0,
                values: vec![pb::Value {
                    kind: Some(pb::value::Kind::Number(*v)),
                }],
            })
            .collect();
        c.push(pb::IngestRequest {
            events,
            schemas: vec![schema],
        })
        .await
        .unwrap();
    });
}

/// `gma archive query NAME --from --to --output json`: (timestamp ns, value) per sample.
fn archive_points(archiver: &str, name: &str, from_ns: i64, to_ns: i64) -> Vec<(i64, f64)> {
    let (from, to) = (from_ns.to_string(), to_ns.to_string());
    let run = gma(
        &[
            "archive",
            "query",
            name,
            "--from",
            &from,
            "--to",
            &to,
            "--output",
            "json",
            "--archiver",
            archiver,
        ],
        Duration::from_secs(20),
    );
    if run.code != 0 {
        assert!(run.stderr.contains("NotFound"), "{}", run.stderr);
        return Vec::new();
    }
    json_lines(&run.stdout)
        .iter()
        .map(|v| (v["timestamp_ns"].as_i64().unwrap(), v["value"].as_f64().unwrap()))
        .collect()
}

/// Runs promtool; (exit code, stdout, stderr).
fn run_promtool(bin: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(bin).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

/// promtool's JSON answer as (unix ms, value) per series, series by their `source` label.
fn promtool_points(out: &str) -> Vec<(String, Vec<(i64, f64)>)> {
    let v: serde_json::Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let pair = |p: &serde_json::Value| {
        (
            (p[0].as_f64().unwrap() * 1000.0).round() as i64,
            p[1].as_str().unwrap().parse::<f64>().unwrap(),
        )
    };
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let points = match s.get("values") {
                Some(vs) => vs.as_array().unwrap().iter().map(pair).collect(),
                None => vec![pair(&s["value"])],
            };
            (s["metric"]["source"].as_str().unwrap_or("").to_string(), points)
        })
        .collect()
}

#[test]
fn promtool_reads_the_archive_like_gma_archive_query() {
    let Some(promtool) = promtool() else { return };
    let tmp = tempdir();
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&["--no-host-sensors", "--directory", &dir.addr]);
    let data = tmp.path().join("arch");
    let arch = Proc::start(
        &[
            "archiver",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--data",
            data.to_str().unwrap(),
            "--pattern",
            "app.*",
            "--pattern",
            "secret.*",
            "--http-listen",
            "127.0.0.1:0",
            "--access-policy",
            policy.to_str().unwrap(),
        ],
        "gma archiver listening on",
    );
    let http = printed_addr(&arch, "archiver", "promql");
    let server = format!("http://{http}");

    // 120 samples 10 s apart, on whole seconds (Prometheus works in milliseconds), an hour ago:
    // a counter that resets once, so rate() has something to do.
    let base_s = gma_core::time::now_ns() / 1_000_000_000 - 3_600;
    let sent: Vec<(i64, f64)> = (0..120i64)
        .map(|i| {
            let v = if i < 70 {
                (i * 3) as f64 + 0.25
            } else {
                ((i - 70) * 2) as f64
            };
            ((base_s + i * 10) * 1_000_000_000, v)
        })
        .collect();
    push(&prod.addr, "app.metric", &sent);
    push(&prod.addr, "secret.thing", &sent[..10]);
    let (from_ns, to_ns) = (base_s * 1_000_000_000, (base_s + 1_200) * 1_000_000_000);
    assert!(
        wait_until(Duration::from_secs(30), || archive_points(
            &arch.addr,
            "app.metric",
            from_ns,
            to_ns
        )
        .len()
            == sent.len()),
        "{}",
        arch.stderr_text()
    );
    let archived = archive_points(&arch.addr, "app.metric", from_ns, to_ns);
    assert_eq!(archived, sent);

    // query range, step = the sample interval: each step's newest sample is the one at it.
    let (start, end) = ((base_s + 100).to_string(), (base_s + 900).to_string());
    let (code, out, err) = run_promtool(
        &promtool,
        &[
            "query",
            "range",
            "-o",
            "json",
            "--start",
            &start,
            "--end",
            &end,
            "--step",
            "10s",
            &server,
            "app_metric_v",
        ],
    );
    assert_eq!(code, 0, "promtool query range: {err}");
    let got = promtool_points(&out);
    let want: Vec<(i64, f64)> = archive_points(
        &arch.addr,
        "app.metric",
        (base_s + 100) * 1_000_000_000,
        (base_s + 900) * 1_000_000_000 + 1,
    )
    .into_iter()
    .map(|(ts, v)| (ts / 1_000_000, v))
    .collect();
    assert_eq!(want.len(), 81);
    assert_eq!(
        got,
        vec![("job1".to_string(), want)],
        "promtool query range vs gma archive query"
    );

    // query instant: between samples, the newest one before (lookback).
    let at = (base_s + 305).to_string();
    let (code, out, err) = run_promtool(
        &promtool,
        &[
            "query",
            "instant",
            "-o",
            "json",
            "--time",
            &at,
            &server,
            "app_metric_v{source=\"job1\"}",
        ],
    );
    assert_eq!(code, 0, "promtool query instant: {err}");
    let s300 = sent
        .iter()
        .find(|(t, _)| *t == (base_s + 300) * 1_000_000_000)
        .unwrap()
        .1;
    assert_eq!(
        promtool_points(&out),
        vec![("job1".to_string(), vec![((base_s + 305) * 1000, s300)])]
    );

    // Aggregates over a window against gma archive query's aggregates of the same samples
    // (the window (t-100s, t] holds no sample on its left edge: ours is closed, the CLI's
    // half-open the other way; both see the same 10 samples).
    let t = base_s + 505;
    let (wf, wt) = ((t - 100) * 1_000_000_000, t * 1_000_000_000 + 1);
    let window: Vec<f64> = archive_points(&arch.addr, "app.metric", wf, wt)
        .into_iter()
        .map(|p| p.1)
        .collect();
    assert_eq!(window.len(), 10);
    let tt = t.to_string();
    for (q, want) in [
        (
            "max_over_time(app_metric_v[100s])",
            window.iter().cloned().fold(f64::MIN, f64::max),
        ),
        ("sum_over_time(app_metric_v[100s])", window.iter().sum::<f64>()),
        ("count_over_time(app_metric_v[100s])", 10.0),
        ("sum by (source) (app_metric_v) * 2", s_at(&sent, t) * 2.0),
    ] {
        let (code, out, err) = run_promtool(
            &promtool,
            &["query", "instant", "-o", "json", "--time", &tt, &server, q],
        );
        assert_eq!(code, 0, "{q}: {err}");
        let got = promtool_points(&out);
        assert_eq!(got.len(), 1, "{q}: {out}");
        assert!(
            (got[0].1[0].1 - want).abs() < 1e-9,
            "{q}: got {}, want {want}",
            got[0].1[0].1
        );
    }

    // An unsupported construct: promtool prints Prometheus' bad_data error with our message.
    let (code, _, err) = run_promtool(
        &promtool,
        &["query", "instant", &server, "irate(app_metric_v[1m])"],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("bad_data") && err.contains("unsupported by the gma archiver: the function irate()"),
        "{err}"
    );

    // A denied reader: promtool reports the 403, and the body names the rule.
    let (code, _, err) = run_promtool(&promtool, &["query", "instant", &server, "secret_thing_v"]);
    assert_ne!(code, 0);
    assert!(err.contains("403"), "{err}");
    let (status, body) = http_get(&http, "/api/v1/query?query=secret_thing_v").unwrap();
    assert_eq!(status, 403, "{body}");
    let b: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(b["status"], "error");
    assert_eq!(b["errorType"], "forbidden");
    assert!(
        b["error"].as_str().unwrap().contains("may not archive.query"),
        "{body}"
    );
    // The metadata doors show the readable series only.
    let (status, body) = http_get(&http, "/api/v1/label/__name__/values").unwrap();
    assert_eq!(status, 200, "{body}");
    let b: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(b["data"], serde_json::json!(["app_metric_v"]));
}

/// The value of the newest sample at or before `t` (unix s).
fn s_at(sent: &[(i64, f64)], t: i64) -> f64 {
    sent.iter()
        .rev()
        .find(|(ts, _)| *ts <= t * 1_000_000_000)
        .unwrap()
        .1
}
