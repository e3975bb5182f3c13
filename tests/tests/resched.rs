//! The migration loop with real processes: simulated hosts, a sample application reporting to
//! its contract monitor, the rescheduler deciding by predicted gain, stop/resume.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;

struct Loop {
    _tmp: tempfile::TempDir,
    _dir: Proc,
    prod: Proc,
    _resched: Proc,
    dir_addr: String,
}

fn start(cost_s: f64) -> Loop {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n[[host]]\nname = \"hostA\"\ncpus = 8\nmemory_mb = 1024\nload = 0.5\n\
         [[host]]\nname = \"hostB\"\ncpus = 8\nmemory_mb = 1024\nload = 0.5\n",
    )
    .unwrap();
    let prod = Proc::simulated(&dir.addr, &sim, &[]);
    let cfg = tmp.path().join("r.toml");
    std::fs::write(
        &cfg,
        format!("cost_s = {cost_s}\nthreshold = 0.3\nmax_age_ms = 2000\n"),
    )
    .unwrap();
    let resched = Proc::role("rescheduler", &dir.addr, &cfg);
    // The rescheduler follows the simulated hosts before the application starts.
    let dir_addr = dir.addr.clone();
    assert!(wait_until(Duration::from_secs(20), || search_ids(
        &dir_addr,
        "resched.decision"
    )
    .is_some_and(|v| v.len() == 1)));
    Loop {
        _tmp: tmp,
        _dir: dir,
        prod,
        _resched: resched,
        dir_addr,
    }
}

fn app(l: &Loop, phases: &str) -> Proc {
    Proc::start(
        &[
            "app-sim",
            "--app-id",
            "app1",
            "--phases",
            phases,
            "--predicted-s",
            "0.1",
            "--host",
            "hostA",
            "--producer",
            &l.prod.addr,
        ],
        "gma app-sim listening on",
    )
}

/// Phases `app_id` has finished, from its latest `app.state`.
fn phases_of(l: &Loop, app_id: &str) -> u64 {
    let r = gma(
        &[
            "query",
            "app.state",
            "--source",
            app_id,
            "--producer",
            &l.prod.addr,
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    json_lines(&r.stdout)
        .first()
        .and_then(|e| e["values"]["phase"].as_f64())
        .unwrap_or(0.0) as u64
}

fn phases_done(l: &Loop) -> u64 {
    phases_of(l, "app1")
}

fn decisions(l: &Loop) -> Vec<serde_json::Value> {
    let r = gma(
        &[
            "query",
            "resched.decision",
            "--directory",
            &l.dir_addr,
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    json_lines(&r.stdout)
}

fn sim_set(l: &Loop, host: &str, kv: &str) {
    let r = gma(
        &["sim", "set", host, kv, "--producer", &l.prod.addr],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
}

fn finished_on(app: &Proc) -> Option<String> {
    app.stdout_lines()
        .iter()
        .find_map(|l| l.split(" phases on ").nth(1).map(str::to_string))
}

#[test]
fn a_violated_contract_migrates_the_application_which_finishes_on_the_new_host() {
    let l = start(0.5);
    let a = app(&l, "30");
    assert!(wait_until(Duration::from_secs(20), || phases_done(&l) >= 3));
    sim_set(&l, "hostA", "load=40");
    assert!(
        wait_until(Duration::from_secs(60), || finished_on(&a).is_some()),
        "{}",
        a.stderr_text()
    );
    assert_eq!(finished_on(&a).unwrap(), "hostB");
    let err = a.stderr_text();
    assert!(
        err.contains("stopped after phase") && err.contains("resumed on hostB"),
        "{err}"
    );
    let d = decisions(&l);
    assert_eq!(d.len(), 1, "{d:?}");
    let v = &d[0]["values"];
    assert_eq!(v["decision"], "MIGRATE");
    assert_eq!(v["mode"], "ON_REQUEST");
    assert_eq!(v["target_hosts"], "hostB");
    assert!(v["gain"].as_f64().unwrap() > 0.3);
}

#[test]
fn a_too_small_gain_stays_and_the_monitor_stops_asking() {
    let l = start(0.5);
    let a = app(&l, "24");
    assert!(wait_until(Duration::from_secs(20), || phases_done(&l) >= 3));
    // Both hosts equally loaded: moving gains nothing.
    sim_set(&l, "hostB", "load=40");
    sim_set(&l, "hostA", "load=40");
    assert!(
        wait_until(Duration::from_secs(90), || finished_on(&a).is_some()),
        "{}",
        a.stderr_text()
    );
    assert_eq!(finished_on(&a).unwrap(), "hostA");
    let d = decisions(&l);
    assert_eq!(d.len(), 1, "one request, then the raised limits hold: {d:?}");
    assert_eq!(d[0]["values"]["decision"], "STAY");
    assert!(!a.stderr_text().contains("stopped after phase"));
}

#[test]
fn a_short_slowdown_never_asks() {
    let l = start(0.5);
    let a = app(&l, "24");
    assert!(wait_until(Duration::from_secs(20), || phases_done(&l) >= 10));
    // Twice as slow for a phase or two: the ratio leaves the band, the whole-history average
    // does not.
    sim_set(&l, "hostA", "load=16");
    let k = phases_done(&l);
    assert!(wait_until(Duration::from_secs(20), || phases_done(&l) > k));
    sim_set(&l, "hostA", "load=0.5");
    assert!(wait_until(Duration::from_secs(60), || finished_on(&a).is_some()));
    assert_eq!(finished_on(&a).unwrap(), "hostA");
    assert!(decisions(&l).is_empty());
}

#[test]
fn evaluate_exposes_the_rule() {
    let r = gma(
        &[
            "rescheduler",
            "evaluate",
            "--ret-current",
            "3000",
            "--ret-new",
            "1000",
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["decision"], "MIGRATE");
    assert!((v["gain"].as_f64().unwrap() - 1100.0 / 3000.0).abs() < 1e-12);
    // Exactly the threshold stays (strict comparison).
    let r = gma(
        &[
            "rescheduler",
            "evaluate",
            "--ret-current",
            "2000",
            "--ret-new",
            "500",
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["decision"], "STAY");
    assert!((v["gain"].as_f64().unwrap() - 0.30).abs() < 1e-12);
    // A smaller cost flips a STAY.
    let r = gma(
        &[
            "rescheduler",
            "evaluate",
            "--ret-current",
            "2000",
            "--ret-new",
            "500",
            "--cost",
            "420",
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["decision"], "MIGRATE");
    let r = gma(
        &["rescheduler", "evaluate", "--ret-current", "-1", "--ret-new", "5"],
        Duration::from_secs(10),
    );
    assert_ne!(r.code, 0);
}

#[test]
fn a_completed_application_frees_hosts_for_an_opportunistic_migration() {
    let l = start(0.5);
    // app2 runs slowly on a loaded hostA but never asks (its contract band is wide); app1 runs
    // briefly on hostB. When app1 completes, the rescheduler re-evaluates app2 on its own.
    sim_set(&l, "hostA", "load=40");
    let app2 = Proc::start(
        &[
            "app-sim",
            "--app-id",
            "app2",
            "--phases",
            "40",
            "--predicted-s",
            "0.1",
            "--host",
            "hostA",
            "--producer",
            &l.prod.addr,
            "--upper",
            "100",
        ],
        "gma app-sim listening on",
    );
    // The rescheduler must know app2 runs before app1 completes (the completion is what makes
    // it look again): wait until app2 has published a finished phase.
    assert!(
        wait_until(Duration::from_secs(30), || phases_of(&l, "app2") >= 1),
        "app2 never reported a phase: {}",
        app2.stderr_text()
    );
    let r = gma(
        &[
            "app-sim",
            "--app-id",
            "app1",
            "--phases",
            "3",
            "--predicted-s",
            "0.1",
            "--host",
            "hostB",
            "--producer",
            &l.prod.addr,
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        wait_until(Duration::from_secs(60), || finished_on(&app2).is_some()),
        "{}",
        app2.stderr_text()
    );
    assert_eq!(finished_on(&app2).unwrap(), "hostB");
    let d = decisions(&l);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["values"]["mode"], "OPPORTUNISTIC");
    assert_eq!(d[0]["values"]["decision"], "MIGRATE");
    assert_eq!(d[0]["values"]["app_id"], "app2");
}
