//! `host.info` of a real host agent (free disk per mount, installed package versions) and the
//! broker matching a job's `software` on it; the agent's benchmark (`host.bench`) in
//! `host.load` and the broker's execution-time prediction by it: a real directory, producer
//! and broker.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(30);

/// The version of an installed package as dpkg reports it, or None without dpkg.
fn dpkg_version(package: &str) -> Option<String> {
    let out = std::process::Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", package])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn host_info_reports_disk_and_packages_and_the_broker_matches_them() {
    // dpkg and coreutils are Essential on every Debian system: their versions are known here.
    let (Some(dpkg), Some(coreutils)) = (dpkg_version("dpkg"), dpkg_version("coreutils")) else {
        assert!(
            !common::netns::in_ci(),
            "CI=true and dpkg-query is missing: this test reads package versions with it; run on Debian or install dpkg"
        );
        eprintln!("SKIPPED: no dpkg-query here (under CI=true this fails)");
        return;
    };
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let cfg = tmp.path().join("producer.toml");
    std::fs::write(
        &cfg,
        "packages = [\"dpkg\", \"coreutils\", \"gma-no-such-package\"]\ncommand_timeout_ms = 20000\n",
    )
    .unwrap();
    let prod = Proc::producer(&[
        "--directory",
        &dir.addr,
        "--source",
        "realhost",
        "--config",
        cfg.to_str().unwrap(),
    ]);

    let mut info = serde_json::Value::Null;
    assert!(
        wait_until(T, || {
            let r = gma(
                &["query", "host.info", "--producer", &prod.addr, "--output", "json"],
                T,
            );
            match json_lines(&r.stdout).pop() {
                Some(e) => {
                    info = e;
                    true
                }
                None => false,
            }
        }),
        "no host.info from the producer; stderr: {}",
        prod.stderr_text()
    );
    let v = &info["values"];
    assert_eq!(
        v["software"],
        format!("coreutils={coreutils},dpkg={dpkg}"),
        "{info}"
    );
    // The root filesystem's free space is what df says (the same unit, give or take what was
    // written meanwhile: compared with the size, which does not move).
    let free = v["disk_free_mb"].as_f64().unwrap_or_else(|| panic!("{info}"));
    let mounts = v["mounts"].as_str().unwrap();
    let root = mounts
        .split(',')
        .find_map(|m| m.strip_prefix("/="))
        .unwrap_or_else(|| panic!("no / in mounts: {mounts}"));
    let (avail, size) = root.split_once('/').unwrap();
    assert_eq!(avail.parse::<f64>().unwrap(), free.floor(), "{info}");
    let size: f64 = size.parse().unwrap();
    assert!(free > 0.0 && free <= size, "{info}");
    let df = std::process::Command::new("df")
        .args(["-P", "-k", "/"])
        .output()
        .unwrap();
    let df = String::from_utf8_lossy(&df.stdout).to_string();
    let df_size_kib: f64 = df
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(size, (df_size_kib / 1024.0).floor(), "{df}");
    assert!(!v["os_id"].as_str().unwrap().is_empty(), "{info}");

    // The broker offers the packages as software entries: name and name=version.
    let broker = Proc::start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    let select = |software: &str| {
        let job = tmp.path().join("job.toml");
        std::fs::write(
            &job,
            format!("name = \"j\"\ncpus = 1\nreference_time_s = 60\nsoftware = [{software}]\n"),
        )
        .unwrap();
        let r = broker_select(&broker.addr, &job);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let ranked: Vec<serde_json::Value> = serde_json::from_str(&r.stdout).unwrap();
        ranked
            .iter()
            .map(|r| r["resource"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let wanted = format!("\"coreutils\", \"dpkg={dpkg}\"");
    let mut got = Vec::new();
    assert!(
        wait_until(T, || {
            got = select(&wanted);
            got == ["realhost"]
        }),
        "{got:?}; broker stderr: {}",
        broker.stderr_text()
    );
    assert!(select("\"gma-no-such-package\"").is_empty());
    assert!(select("\"dpkg=0.0-not-this-version\"").is_empty());
}

#[test]
fn the_benchmark_fills_host_load_and_the_broker_predicts_by_it() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let cfg = tmp.path().join("producer.toml");
    std::fs::write(&cfg, "packages = []\nbench_ms = 50\n").unwrap();
    let prod = Proc::producer(&[
        "--directory",
        &dir.addr,
        "--source",
        "benchhost",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let latest = |name: &str| {
        let r = gma(&["query", name, "--producer", &prod.addr, "--output", "json"], T);
        json_lines(&r.stdout).pop()
    };
    // The run at start: host.bench, and its scores in every host.load after it.
    let mut seen = (None, None);
    assert!(
        wait_until(T, || {
            seen = (latest("host.bench"), latest("host.load"));
            match &seen {
                (Some(b), Some(l)) => l["values"]["bench_specint"] == b["values"]["specint"],
                _ => false,
            }
        }),
        "{seen:?}; stderr: {}",
        prod.stderr_text()
    );
    let (Some(b), Some(l)) = seen else { unreachable!() };
    let v = &b["values"];
    for f in ["specint", "specfp", "mem_mbps", "duration_s"] {
        assert!(v[f].as_f64().is_some_and(|x| x > 0.0), "{b}");
    }
    assert_eq!(l["values"]["bench_specfp"], v["specfp"], "{l}");
    let specint = v["specint"].as_f64().unwrap();

    // The broker predicts the execution time by it: T_ref × P_ref / P_r.
    let broker = Proc::start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        "name = \"j\"\ncpus = 1\nreference_time_s = 1000\nreference = { specint = 1000 }\n",
    )
    .unwrap();
    let mut ranked = Vec::new();
    assert!(
        wait_until(T, || {
            let r = broker_select(&broker.addr, &job);
            ranked = serde_json::from_str::<Vec<serde_json::Value>>(&r.stdout).unwrap_or_default();
            ranked.iter().any(|r| r["resource"] == "benchhost")
        }),
        "{ranked:?}; broker stderr: {}",
        broker.stderr_text()
    );
    let exec = ranked[0]["exec_s"].as_f64().unwrap();
    let want = 1000.0 * 1000.0 / specint;
    assert!(
        (exec - want).abs() <= want * 1e-9,
        "exec_s {exec}, want {want}: {ranked:?}"
    );
}
