//! `gma broker select --batch`: Min-min, Max-min and Sufferage over the broker's predicted
//! completion times, with real processes (a directory, simulated hosts with scripted load, the
//! broker).

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(20);

/// Two idle hosts: fast (specint 2000) and slow (1000); predictions are exact (no stage-in,
/// no wait): a job of reference time R runs R/2 on fast and R on slow.
const HOSTS: &str = "period_ms = 100\n\
[[host]]\nname = \"fast\"\ncpus = 8\nmemory_mb = 16384\nload = 0\nfree_cpus = 8\nbenchmarks = { specint = 2000 }\n\
[[host]]\nname = \"slow\"\ncpus = 8\nmemory_mb = 16384\nload = 0\nfree_cpus = 8\nbenchmarks = { specint = 1000 }\n";

fn job(name: &str, cpus: u32, secs: u32) -> String {
    format!("[[job]]\nname = \"{name}\"\ncpus = {cpus}\nreference_time_s = {secs}\nreference = {{ specint = 1000 }}\n")
}

/// (job, resource, completion) in mapping order, and the makespan.
fn batch(broker: &str, file: &str, heuristic: &str) -> (Vec<(String, String, f64)>, f64) {
    let r = gma(
        &[
            "broker",
            "select",
            "--batch",
            file,
            "--heuristic",
            heuristic,
            "--broker",
            broker,
            "--output",
            "json",
        ],
        T,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["heuristic"], heuristic);
    let a = v["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["job"].as_str().unwrap().to_string(),
                a["resource"].as_str().unwrap().to_string(),
                a["completion_s"].as_f64().unwrap(),
            )
        })
        .collect();
    (a, v["makespan_s"].as_f64().unwrap())
}

fn s(job: &str, res: &str, t: f64) -> (String, String, f64) {
    (job.to_string(), res.to_string(), t)
}

#[test]
fn batch_heuristics_map_the_jobs_on_the_broker_s_predictions() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim_file = tmp.path().join("sim.toml");
    std::fs::write(&sim_file, HOSTS).unwrap();
    let _sim = Proc::simulated(&dir.addr, &sim_file, &["--lease-ttl-ms", "1000"]);
    let broker = Proc::start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    // Wait until the broker's view holds both hosts with their load.
    assert!(
        wait_until(T, || {
            let r = gma(
                &["broker", "view", "--broker", &broker.addr, "--output", "json"],
                T,
            );
            serde_json::from_str::<serde_json::Value>(&r.stdout).is_ok_and(|v| {
                v.as_array()
                    .is_some_and(|a| a.iter().filter(|r| r["free_cpus"].as_f64() == Some(8.0)).count() == 2)
            })
        }),
        "the broker never saw the 2 hosts"
    );
    let file = tmp.path().join("batch.toml");
    std::fs::write(
        &file,
        [job("j1", 4, 3600), job("j2", 4, 600), job("j3", 4, 1200)].concat(),
    )
    .unwrap();
    let file = file.to_str().unwrap();

    // Min-min: j2 (300 on fast), j3 (900 on fast), j1 (2700 on fast; 3600 on slow).
    // Max-min: j1 (1800 on fast), then j3 on slow (1200 < 2400), j2 on slow (1800 < 2100).
    // Sufferage: j1 suffers 1800 → fast; then j2 (suffers 2100 − 600) → slow; j3 → slow (1800).
    let expected = [
        (
            "min-min",
            [
                ("j2", "fast", 300.0),
                ("j3", "fast", 900.0),
                ("j1", "fast", 2700.0),
            ],
            2700.0,
        ),
        (
            "max-min",
            [
                ("j1", "fast", 1800.0),
                ("j3", "slow", 1200.0),
                ("j2", "slow", 1800.0),
            ],
            1800.0,
        ),
        (
            "sufferage",
            [
                ("j1", "fast", 1800.0),
                ("j2", "slow", 600.0),
                ("j3", "slow", 1800.0),
            ],
            1800.0,
        ),
    ];
    for (h, mapping, want_makespan) in expected {
        let (a, makespan) = batch(&broker.addr, file, h);
        let want: Vec<_> = mapping.iter().map(|(j, r, t)| s(j, r, *t)).collect();
        assert_eq!(a, want, "{h}");
        assert_eq!(makespan, want_makespan, "{h}");
    }

    // The table prints the mapping and the makespan.
    let r = gma(
        &["broker", "select", "--batch", file, "--broker", &broker.addr],
        T,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("heuristic min-min, policy ttd: 3 jobs on 2 resources, predicted makespan 2700.0 s"),
        "{}",
        r.stdout
    );

    // A job no host can hold: the others are mapped, it is named, exit 2.
    let big = tmp.path().join("big.toml");
    std::fs::write(&big, [job("j1", 4, 3600), job("huge", 64, 60)].concat()).unwrap();
    let r = gma(
        &[
            "broker",
            "select",
            "--batch",
            big.to_str().unwrap(),
            "--broker",
            &broker.addr,
        ],
        T,
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("unplaceable huge: no candidate resource"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.contains("j1"), "{}", r.stdout);

    // A bad batch file: an error naming the field, exit 1; --job and --batch exclude each other.
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, [job("a", 1, 60), job("b", 0, 60)].concat()).unwrap();
    let r = gma(
        &[
            "broker",
            "select",
            "--batch",
            bad.to_str().unwrap(),
            "--broker",
            &broker.addr,
        ],
        T,
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("job[1].cpus: must be at least 1"),
        "{}",
        r.stderr
    );
    let r = gma(
        &[
            "broker",
            "select",
            "--batch",
            file,
            "--job",
            file,
            "--broker",
            &broker.addr,
        ],
        T,
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("cannot be used with"), "{}", r.stderr);
}
