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

/// Anyone may query the archive's `app.*` series; nobody `secret.*`.
const POLICY: &str = r#"default = "deny"

[[rule]]
actions = ["archive.query"]
resources = ["app.*"]
effect = "allow"
"#;

/// A directory, a producer and an archiver of `app.*` (and `extra` flags) serving PromQL:
/// (directory, producer, archiver, the PromQL address).
fn fabric(tmp: &tempfile::TempDir, extra: &[&str]) -> (Proc, Proc, Proc, String) {
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&["--no-host-sensors", "--directory", &dir.addr]);
    let data = tmp.path().join("arch");
    let mut args = vec![
        "archiver",
        "--listen",
        "127.0.0.1:0",
        "--directory",
        &dir.addr,
        "--data",
        data.to_str().unwrap(),
        "--pattern",
        "app.*",
        "--http-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let arch = Proc::start(&args, "gma archiver listening on");
    let http = printed_addr(&arch, "archiver", "promql");
    (dir, prod, arch, http)
}

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
    push_numbers(producer, name, "job1", items)
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
fn promtool_points(out: &str) -> Vec<(String, Samples)> {
    promtool_series(out)
        .into_iter()
        .map(|(m, points)| (m["source"].as_str().unwrap_or("").to_string(), points))
        .collect()
}

#[test]
fn promtool_reads_the_archive_like_gma_archive_query() {
    let Some(promtool) = promtool() else { return };
    let tmp = tempdir();
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let (_dir, prod, arch, http) = fabric(
        &tmp,
        &[
            "--pattern",
            "secret.*",
            "--access-policy",
            policy.to_str().unwrap(),
        ],
    );
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

    // POST with a form body (Grafana's default), the parameters split between the query
    // string and the body as Prometheus merges them.
    let form = format!("query=sum%28app_metric_v%29&time={}", base_s + 305);
    let (status, body) = post_form(&http, "/api/v1/query?timeout=30s", &form);
    assert_eq!(status, 200, "{body}");
    let b: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(b["data"]["resultType"], "vector");
    assert_eq!(b["data"]["result"][0]["value"][1], format!("{s300}"));
    let (status, body) = post_form(&http, "/api/v1/series", "match[]=%7Bsource%3D%22job1%22%7D");
    assert_eq!(status, 200, "{body}");
    let b: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        b["data"],
        serde_json::json!([{"__name__": "app_metric_v", "event": "app.metric", "field": "v", "source": "job1"}])
    );
}

/// `POST path` with an `application/x-www-form-urlencoded` body over plain HTTP: (status, body).
fn post_form(addr: &str, path: &str, form: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
        form.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// The value of the newest sample at or before `t` (unix s).
fn s_at(sent: &[(i64, f64)], t: i64) -> f64 {
    sent.iter()
        .rev()
        .find(|(ts, _)| *ts <= t * 1_000_000_000)
        .unwrap()
        .1
}

/// A remote-write client of Prometheus made of the standard library only (protobuf encoded by
/// hand, a snappy block of literals): reads `[[labels..], [[ts_ms, value], ...]]` series as
/// JSON on stdin and writes them to `http://127.0.0.1:PORT/api/v1/write`.
const REMOTE_WRITE_PY: &str = r#"
import json, struct, sys, urllib.request
def vi(n):
    o = bytearray()
    while True:
        b = n & 0x7f; n >>= 7; o.append(b | (0x80 if n else 0))
        if not n: return bytes(o)
def ld(num, p): return vi(num << 3 | 2) + vi(len(p)) + p
def series(labels, samples):
    ls = b"".join(ld(1, ld(1, k.encode()) + ld(2, v.encode())) for k, v in sorted(labels.items()))
    ss = b"".join(ld(2, vi(1 << 3 | 1) + struct.pack("<d", v) + vi(2 << 3) + vi(t)) for t, v in samples)
    return ld(1, ls + ss)
def snappy(d):
    o = bytearray(vi(len(d)))
    for i in range(0, len(d), 65536):
        c = d[i:i+65536]; n = len(c) - 1
        o += (bytes([n << 2]) if n < 60 else bytes([240, n]) if n < 256 else bytes([244]) + struct.pack("<H", n)) + c
    return bytes(o)
body = snappy(b"".join(series(l, s) for l, s in json.load(sys.stdin)))
req = urllib.request.Request("http://127.0.0.1:%s/api/v1/write" % sys.argv[1], data=body, method="POST",
    headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
             "X-Prometheus-Remote-Write-Version": "0.1.0"})
print(urllib.request.urlopen(req, timeout=10).status)
"#;

/// (time, value) samples.
type Samples = Vec<(i64, f64)>;

/// Every series of a promtool JSON answer (vector or matrix): (labels, (ms, value) points),
/// sorted by labels.
fn promtool_series(out: &str) -> Vec<(serde_json::Value, Samples)> {
    let v: serde_json::Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let pair = |p: &serde_json::Value| {
        (
            (p[0].as_f64().unwrap() * 1000.0).round() as i64,
            p[1].as_str().unwrap().parse::<f64>().unwrap(),
        )
    };
    let mut s: Vec<(serde_json::Value, Samples)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let points = match s.get("values") {
                Some(vs) => vs.as_array().unwrap().iter().map(pair).collect(),
                None => vec![pair(&s["value"])],
            };
            (s["metric"].clone(), points)
        })
        .collect();
    s.sort_by_key(|a| a.0.to_string());
    s
}

/// The evaluator against Prometheus itself: the same samples written to a real `prometheus`
/// (remote-write receiver) and archived give the same `promtool query range` answers for
/// rate, increase, the *_over_time functions, aggregations, topk and arithmetic.
#[test]
fn the_archive_answers_promql_like_prometheus_itself() {
    let Some(promtool) = promtool() else { return };
    let prometheus_ok = Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let python_ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !prometheus_ok || !python_ok {
        assert!(
            !in_ci(),
            "CI=true and prometheus or python3 is missing (scripts/test.sh installs prometheus)"
        );
        eprintln!("SKIPPED: prometheus or python3 is missing; under CI=true this fails");
        return;
    }
    let tmp = tempdir();
    let (_dir, prod, _arch, http) = fabric(&tmp, &[]);
    let ours = format!("http://{http}");

    // A real Prometheus with its remote-write receiver, on a free port.
    let port = reserved_port();
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(&cfg, "global: {scrape_interval: 1h}\n").unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let prom = Command::new("prometheus")
        .args([
            &format!("--config.file={}", cfg.display()),
            &format!("--storage.tsdb.path={}", tmp.path().join("prom").display()),
            &format!("--web.listen-address=127.0.0.1:{port}"),
            "--web.enable-remote-write-receiver",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let prom = Kill(prom);
    let theirs = format!("http://127.0.0.1:{port}");
    assert!(
        wait_until(Duration::from_secs(30), || http_get(
            &format!("127.0.0.1:{port}"),
            "/-/ready"
        )
        .is_ok_and(|r| r.0 == 200)),
        "prometheus did not become ready"
    );

    // Two counters with irregular intervals and resets, and a gauge, 25 minutes ago onwards.
    let base_ms = (gma_core::time::now_ns() / 1_000_000 / 1000 - 1_500) * 1000;
    // (event, source, samples in ms)
    let mut all: Vec<(&str, &str, Samples)> = Vec::new();
    for (source, seed) in [("job1", 3i64), ("job2", 7i64)] {
        let mut v = 0.0;
        let mut t = base_ms;
        let mut counter = Vec::new();
        for i in 0..100i64 {
            t += 3_000 + ((i * seed * 7919) % 9_000);
            v = if (i + seed) % 47 == 0 {
                2.0
            } else {
                v + ((i * seed) % 13) as f64 + 0.5
            };
            counter.push((t, v));
        }
        all.push(("app.counter", source, counter));
        let gauge = (0..120i64)
            .map(|i| {
                (
                    base_ms + i * 10_000 + seed * 100,
                    // Distinct per source: no ties for topk to break differently.
                    ((i * seed * 31) % 97) as f64 / 8.0 + seed as f64 / 1000.0,
                )
            })
            .collect();
        all.push(("app.gauge", source, gauge));
    }
    let mut series_json = Vec::new();
    for (event, source, samples) in &all {
        let events: Vec<(i64, f64)> = samples.iter().map(|(t, v)| (t * 1_000_000, *v)).collect();
        push_numbers(&prod.addr, event, source, &events);
        // The labels of docs/promql.md's mapping, written out here.
        let labels = serde_json::json!({
            "__name__": format!("{}_v", event.replace('.', "_")),
            "event": event,
            "field": "v",
            "source": source,
        });
        series_json.push(serde_json::json!([labels, samples]));
    }
    let mut py = Command::new("python3")
        .args(["-c", REMOTE_WRITE_PY, &port.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = py.stdin.take().unwrap();
        stdin
            .write_all(&serde_json::to_vec(&series_json).unwrap())
            .unwrap();
    }
    let py = py.wait_with_output().unwrap();
    assert!(
        py.status.success(),
        "remote write failed: {}",
        String::from_utf8_lossy(&py.stderr)
    );
    let total: usize = all.iter().map(|s| s.2.len()).sum();
    let count_q = "sum(count_over_time({__name__=~\"app_.*\"}[1h]))";
    let end_s = (base_ms / 1000 + 1_500).to_string();
    let counted = |server: &str| {
        let (code, out, _) = run_promtool(
            &promtool,
            &[
                "query", "instant", "-o", "json", "--time", &end_s, server, count_q,
            ],
        );
        if code != 0 {
            return 0;
        }
        promtool_series(&out)
            .first()
            .map(|s| s.1[0].1 as usize)
            .unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(30), || counted(&ours) == total
            && counted(&theirs) == total),
        "not every sample arrived: ours {}, prometheus {}, want {total}",
        counted(&ours),
        counted(&theirs)
    );

    let (start, end) = (
        (base_ms / 1000 + 60).to_string(),
        (base_ms / 1000 + 1_400).to_string(),
    );
    for q in [
        "app_gauge_v",
        "app_counter_v{source=~\"job.\"}",
        "rate(app_counter_v[1m])",
        "increase(app_counter_v[2m])",
        "rate(app_gauge_v[90s])",
        "avg_over_time(app_gauge_v[3m])",
        "min_over_time(app_gauge_v[1m])",
        "max_over_time(app_counter_v[2m])",
        "sum_over_time(app_gauge_v[1m])",
        "count_over_time(app_counter_v[1m])",
        "quantile_over_time(0.3, app_gauge_v[5m])",
        "sum by (source) (rate(app_counter_v[1m]))",
        "avg without (source) (app_gauge_v)",
        "max(app_gauge_v)",
        "min by (event) (app_gauge_v)",
        "count(app_counter_v)",
        "topk(1, app_gauge_v)",
        "app_gauge_v * 2 - 1",
        "(-app_gauge_v) / 4 + 2 ^ 3",
        "100 % app_gauge_v",
    ] {
        let args = |server: &str| {
            run_promtool(
                &promtool,
                &[
                    "query", "range", "-o", "json", "--start", &start, "--end", &end, "--step", "7s", server,
                    q,
                ],
            )
        };
        let (c1, o1, e1) = args(&ours);
        let (c2, o2, e2) = args(&theirs);
        assert_eq!((c1, c2), (0, 0), "{q}: ours {e1}; prometheus {e2}");
        let (a, b) = (promtool_series(&o1), promtool_series(&o2));
        assert_eq!(
            a.iter().map(|s| &s.0).collect::<Vec<_>>(),
            b.iter().map(|s| &s.0).collect::<Vec<_>>(),
            "{q}: series differ"
        );
        assert!(!a.is_empty(), "{q}: no result");
        for ((l, x), (_, y)) in a.iter().zip(&b) {
            assert_eq!(x.len(), y.len(), "{q} {l}: point counts differ");
            for (p, r) in x.iter().zip(y) {
                assert_eq!(p.0, r.0, "{q} {l}: timestamps differ");
                let close = (p.1 - r.1).abs() <= 1e-9 * p.1.abs().max(r.1.abs()).max(1.0)
                    || (p.1.is_nan() && r.1.is_nan());
                assert!(close, "{q} {l} at {}: ours {}, prometheus {}", p.0, p.1, r.1);
            }
        }
    }
    drop(prom);
}

/// The per-identity request rate of `[limits]` holds on the PromQL listener as on the gRPC
/// doors: with a burst of 2 and a refill of one request per 1,000 s, the third request is 429
/// `unavailable` naming the limit; the archiver's gRPC doors charge the same bucket (one gate,
/// the same anonymous peer), so `gma archive stats` is refused too.
#[test]
fn the_promql_listener_keeps_the_request_rate_of_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("archiver.toml");
    std::fs::write(&cfg, "[limits]\nrequests_per_s = 0.001\nburst = 2\n").unwrap();
    let (_dir, _prod, arch, http) = fabric(&tmp, &["--config", cfg.to_str().unwrap()]);
    let form = "query=1";
    for i in 0..2 {
        let (status, body) = post_form(&http, "/api/v1/query", form);
        assert_eq!(status, 200, "request {i}: {body}");
    }
    let (status, body) = post_form(&http, "/api/v1/query", form);
    assert_eq!(status, 429, "{body}");
    let b: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(b["status"], "error", "{body}");
    assert_eq!(b["errorType"], "unavailable", "{body}");
    assert!(b["error"].as_str().unwrap().contains("rate limit"), "{body}");
    let r = archive(&["stats"], &arch.addr);
    assert_ne!(r.code, 0, "the gRPC door shares the bucket: {}", r.stdout);
    assert!(r.stderr.contains("rate limit"), "{}", r.stderr);
}
