//! The live dashboard in a real browser (headless Chromium over the DevTools protocol), against
//! real processes as `gma demo` runs them: a directory, two producers of simulated hosts, the
//! dashboard. The page must list the producers, move a chart as events arrive, and drop a killed
//! producer (and its hosts) without a reload. It measures the browser update latency (event
//! timestamp to on-page update) and saves a screenshot under target/test-artifacts/.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::path::PathBuf;
use std::time::Duration;

use common::cdp::Chrome;
use common::*;
use serde_json::Value;

const PRODUCER_IDS: &str =
    "JSON.stringify([...document.querySelectorAll('#producers tbody tr')].map(r => r.dataset.id))";

fn producer_ids(c: &mut Chrome) -> Vec<String> {
    c.eval(PRODUCER_IDS)
        .and_then(|v| v.as_str().map(str::to_string))
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default()
}

/// `value@timestamp` of a host's chart, if drawn.
fn chart(c: &mut Chrome, host: &str, metric: &str) -> Option<(String, String)> {
    let expr = format!(
        "(() => {{ const e = document.querySelector('.host[data-host=\"{host}\"] .metric[data-metric=\"{metric}\"]'); \
         return e && e.dataset.v !== undefined ? e.dataset.v + '@' + e.dataset.t : null; }})()"
    );
    let v = c.eval(&expr)?;
    let s = v.as_str()?;
    let (v, t) = s.split_once('@')?;
    Some((v.to_string(), t.to_string()))
}

fn host_cards(c: &mut Chrome, prefix: &str) -> usize {
    let expr = format!("document.querySelectorAll('.host[data-host^=\"{prefix}\"]').length");
    c.eval(&expr).and_then(|v| v.as_u64()).unwrap_or(0) as usize
}

fn artifacts() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp.
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-artifacts")
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn the_dashboard_lists_producers_moves_charts_and_drops_a_killed_producer_in_a_real_browser() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let alpha = sim_file(tmp.path(), "alpha", 3, 250);
    let beta = sim_file(tmp.path(), "beta", 2, 250);
    let sim_args = |file: &PathBuf, id: &'static str| -> Vec<String> {
        [
            "--directory",
            &dir.addr,
            "--no-host-sensors",
            "--simulate",
            file.to_str().unwrap(),
            "--lease-ttl-ms",
            "1000",
            "--id",
            id,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let a_args = sim_args(&alpha, "alpha-producer");
    let _p_alpha = Proc::producer(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    let b_args = sim_args(&beta, "beta-producer");
    let mut p_beta = Proc::producer(&b_args.iter().map(String::as_str).collect::<Vec<_>>());
    let dash = Proc::start(
        &["dashboard", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma dashboard listening on",
    );

    let mut c = Chrome::launch();
    c.navigate(&format!("http://{}/", dash.addr));

    // 1. The producer list.
    let mut ids = Vec::new();
    let listed = wait_until(Duration::from_secs(30), || {
        ids = producer_ids(&mut c);
        ids.iter().any(|i| i == "alpha-producer") && ids.iter().any(|i| i == "beta-producer")
    });
    assert!(
        listed,
        "producers on the page: {ids:?}; dashboard: {}",
        dash.stderr_text()
    );
    // Nothing below reloads the page: this marker must survive to the end.
    c.eval("window.__sameDocument = 42").unwrap();

    // 2. A chart's value changes as events arrive.
    let mut first = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            first = chart(&mut c, "alpha00", "load");
            first.is_some()
        }),
        "no load chart for alpha00"
    );
    let (v0, t0) = first.unwrap();
    let mut now = None;
    let moved = wait_until(Duration::from_secs(30), || {
        now = chart(&mut c, "alpha00", "load");
        now.as_ref().is_some_and(|(v, t)| *v != v0 && *t != t0)
    });
    assert!(
        moved,
        "the load chart of alpha00 stayed at {v0} (t {t0}); now {now:?}"
    );
    assert!(wait_until(Duration::from_secs(30), || host_cards(&mut c, "beta") == 2));

    // Latency samples accumulate while the page runs (no timing threshold: reported only).
    assert!(wait_until(Duration::from_secs(30), || {
        c.eval("window.gmaLatency.length")
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
            >= 300
    }));

    // 3. A killed producer leaves the page when its lease expires, without a reload.
    p_beta.kill();
    let gone = wait_until(Duration::from_secs(30), || {
        ids = producer_ids(&mut c);
        !ids.iter().any(|i| i == "beta-producer")
    });
    assert!(gone, "beta-producer still listed: {ids:?}");
    assert!(ids.iter().any(|i| i == "alpha-producer"), "{ids:?}");
    assert!(
        wait_until(Duration::from_secs(30), || host_cards(&mut c, "beta") == 0),
        "the killed producer's hosts are still charted"
    );
    assert_eq!(
        c.eval("window.__sameDocument").unwrap(),
        Value::from(42),
        "the page was reloaded"
    );

    // Browser update latency: event timestamp (producer clock) to the DOM and canvas updated.
    let lat: Vec<f64> = c
        .eval("JSON.stringify(window.gmaLatency)")
        .and_then(|v| v.as_str().map(str::to_string))
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    assert!(!lat.is_empty());
    let mut sorted = lat.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    eprintln!(
        "browser update latency (event timestamp -> on-page update), {} samples: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        sorted.len(),
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.9),
        percentile(&sorted, 0.99),
        sorted[sorted.len() - 1]
    );

    let shot = artifacts().join("dashboard.png");
    c.screenshot(&shot);
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);
    eprintln!("screenshot: {}", shot.display());
}

/// `[site, link, subtree free CPUs]` of every manager in the hierarchy panel, page order.
fn hierarchy(c: &mut Chrome) -> Vec<(String, String, String)> {
    c.eval(
        "JSON.stringify([...document.querySelectorAll('#hierarchy li')]\
         .map(l => [l.dataset.site, l.dataset.link || 'superior', l.dataset.subtreeFree || '']))",
    )
    .and_then(|v| v.as_str().map(str::to_string))
    .and_then(|s| serde_json::from_str(&s).ok())
    .unwrap_or_default()
}

/// The hierarchy panel against a real tree of three federation endpoints over two levels (R
/// with inferiors A and B, each site its own directory and simulated hosts), the dashboard
/// walking R: each manager with its inferiors, link health and free CPUs per subtree; a killed
/// inferior turns its link down on the page, without a reload.
#[test]
fn the_dashboard_shows_the_hierarchy_of_federation_endpoints_in_a_real_browser() {
    use common::fedsite::{link, start_site, wait_live};
    let t = Duration::from_secs(30);
    let tmp = tempdir();
    let r = start_site(tmp.path(), "R", &[("r-x", "x86_64", 4)]);
    let a = start_site(tmp.path(), "A", &[("a-x", "x86_64", 3)]);
    let mut b = start_site(tmp.path(), "B", &[("b-x", "x86_64", 2)]);
    link(&r, &a);
    link(&r, &b);
    wait_live(&r, &["A", "B"]);
    let dash = Proc::start(
        &[
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &r.dir.addr,
            "--federation",
            &r.fed.addr,
        ],
        "gma dashboard listening on",
    );
    let mut c = Chrome::launch();
    c.navigate(&format!("http://{}/", dash.addr));
    let want = |s: &str, l: &str, f: &str| (s.to_string(), l.to_string(), f.to_string());
    let full = vec![want("R", "root", "9"), want("A", "up", "3"), want("B", "up", "2")];
    let mut seen = Vec::new();
    assert!(
        wait_until(t, || {
            seen = hierarchy(&mut c);
            seen == full
        }),
        "the hierarchy panel never showed {full:?}: {seen:?}; dashboard: {}",
        dash.stderr_text()
    );
    c.eval("window.__sameDocument = 7").unwrap();
    let text = c
        .eval("document.querySelector('#hierarchy').innerText")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    assert!(text.contains("last reply"), "{text}");

    // B stops: R's link to it goes down and B shows as unreachable with what it last advertised.
    b.fed.kill();
    assert!(
        wait_until(t, || {
            seen = hierarchy(&mut c);
            seen.iter().any(|(s, l, _)| s == "B" && l == "down")
        }),
        "B's link never went down on the page: {seen:?}"
    );
    let text = c
        .eval("document.querySelector('#hierarchy li[data-site=\"B\"]').innerText")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    assert!(text.contains("unreachable"), "{text}");
    assert_eq!(
        c.eval("window.__sameDocument").unwrap(),
        Value::from(7),
        "the page was reloaded"
    );
    drop(a);
}
