//! The broker with real processes: a directory, simulated hosts with scripted load, the broker,
//! a simulated resource manager; `gma broker select|coallocate|view` and `gma bench coalloc`.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(20);

/// The worked example of the notes (§4.A point 4): A fast but busy, B slow and idle, C between.
const HOSTS: &str = "period_ms = 100\n\
[[host]]\nname = \"hostA\"\ncpus = 8\nmemory_mb = 16384\nload = 8\nfree_cpus = 0\nqueue_waiting = 10\nbenchmarks = { specint = 2000 }\n\
[[host]]\nname = \"hostB\"\ncpus = 8\nmemory_mb = 16384\nload = 0\nfree_cpus = 8\nbenchmarks = { specint = 1000 }\n\
[[host]]\nname = \"hostC\"\ncpus = 8\nmemory_mb = 16384\nload = 4\nfree_cpus = 4\nbenchmarks = { specint = 1500 }\n\
[[host]]\nname = \"tiny\"\ncpus = 2\nmemory_mb = 512\nload = 0\nbenchmarks = { specint = 9000 }\n";

const JOB: &str = "name = \"job1\"\ncpus = 4\nmemory_mb = 1024\nreference_time_s = 3600\n\
reference = { specint = 1000 }\nstage_in_s = 60\nstage_out_s = 30\n";

struct Grid {
    tmp: tempfile::TempDir,
    dir: Proc,
    sim: Proc,
    broker: Proc,
}

fn start(hosts: &str, extra_broker: &[&str]) -> Grid {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim_file = tmp.path().join("sim.toml");
    std::fs::write(&sim_file, hosts).unwrap();
    let sim = Proc::simulated(&dir.addr, &sim_file, &["--lease-ttl-ms", "1000"]);
    let mut args = vec!["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr];
    args.extend_from_slice(extra_broker);
    let broker = Proc::start(&args, "gma broker listening on");
    Grid {
        tmp,
        dir,
        sim,
        broker,
    }
}

fn write(g: &Grid, name: &str, text: &str) -> String {
    let p = g.tmp.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn view(g: &Grid) -> Vec<serde_json::Value> {
    let r = gma(
        &["broker", "view", "--broker", &g.broker.addr, "--output", "json"],
        T,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    serde_json::from_str::<serde_json::Value>(&r.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn free_cpus(g: &Grid, host: &str) -> Option<f64> {
    view(g)
        .iter()
        .find(|r| r["resource"] == host)
        .and_then(|r| r["free_cpus"].as_f64())
}

fn select(g: &Grid, job: &str, policy: &str) -> Vec<serde_json::Value> {
    let r = gma(
        &[
            "broker",
            "select",
            "--job",
            job,
            "--broker",
            &g.broker.addr,
            "--policy",
            policy,
            "--output",
            "json",
        ],
        T,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    serde_json::from_str::<serde_json::Value>(&r.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn order(ranked: &[serde_json::Value]) -> Vec<String> {
    ranked
        .iter()
        .map(|r| r["resource"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn select_ranks_as_predicted_and_the_next_decision_follows_the_stream() {
    let g = start(HOSTS, &[]);
    assert!(
        wait_until(T, || view(&g).len() == 4),
        "the broker never saw the 4 hosts"
    );
    let job = write(&g, "job.toml", JOB);
    let ranked = select(&g, &job, "ttd");
    assert_eq!(
        order(&ranked),
        ["hostC", "hostB", "hostA"],
        "tiny has 2 CPUs: filtered"
    );
    let completion = |r: &serde_json::Value| r["predicted_completion_s"].as_f64().unwrap();
    assert!((completion(&ranked[0]) - 2490.0).abs() < 1e-6, "{:?}", ranked[0]);
    assert!((completion(&ranked[1]) - 3690.0).abs() < 1e-6, "{:?}", ranked[1]);
    assert!(completion(&ranked[2]) > 1890.0 + 600.0);
    assert!((ranked[0]["predicted_start_s"].as_f64().unwrap() - 60.0).abs() < 1e-6);
    // TTS: B and C can start after the stage-in; A waits.
    assert_eq!(order(&select(&g, &job, "tts"))[2], "hostA");

    // hostC fills up: once the stream has delivered it, the next decision puts C last.
    let r = gma(
        &[
            "sim",
            "set",
            "hostC",
            "free_cpus=0",
            "queue_waiting=20",
            "--producer",
            &g.sim.addr,
        ],
        T,
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(wait_until(T, || free_cpus(&g, "hostC") == Some(0.0)));
    assert_eq!(order(&select(&g, &job, "ttd")), ["hostB", "hostA", "hostC"]);

    // Every decision is an event: the latest one chose hostB.
    assert!(wait_until(T, || {
        let r = gma(
            &[
                "query",
                "broker.decision",
                "--directory",
                &g.dir.addr,
                "--output",
                "json",
            ],
            T,
        );
        json_lines(&r.stdout)
            .last()
            .is_some_and(|e| e["values"]["chosen"] == "hostB" && e["values"]["kind"] == "select")
    }));

    // A bad job file: an error naming the field, exit 1.
    let bad = write(&g, "bad.toml", "name = \"j\"\ncpus = 0\nreference_time_s = 10\n");
    let r = gma(
        &["broker", "select", "--job", &bad, "--broker", &g.broker.addr],
        T,
    );
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("cpus: must be at least 1"), "{}", r.stderr);
    let bad = write(
        &g,
        "bad2.toml",
        "name = \"j\"\ncpus = 1\nreference_time_s = 10\ncolour = 1\n",
    );
    let r = gma(
        &["broker", "select", "--job", &bad, "--broker", &g.broker.addr],
        T,
    );
    assert!(r.stderr.contains("unknown field `colour`"), "{}", r.stderr);
}

#[test]
fn a_dead_producer_s_hosts_are_never_ranked_again() {
    let mut g = start(HOSTS, &[]);
    assert!(wait_until(T, || view(&g).len() == 4));
    let job = write(&g, "job.toml", JOB);
    assert_eq!(select(&g, &job, "ttd").len(), 3);
    g.sim.kill();
    // Lease 1 s: the directory removes the record, the broker drops its hosts.
    assert!(wait_until(T, || view(&g).is_empty()), "{:?}", view(&g));
    assert!(select(&g, &job, "ttd").is_empty());
}

#[test]
fn stale_hosts_are_excluded_by_default() {
    // A producer stopped with SIGSTOP keeps its lease only until TTL; use a long lease and a
    // short staleness bound so the data goes stale while the record stays.
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim_file = tmp.path().join("sim.toml");
    std::fs::write(&sim_file, HOSTS).unwrap();
    let sim = Proc::simulated(&dir.addr, &sim_file, &[]);
    let cfg = tmp.path().join("broker.toml");
    std::fs::write(&cfg, "[rank]\nmax_age_ms = 500\n").unwrap();
    let broker = Proc::role("broker", &dir.addr, &cfg);
    let g = Grid {
        tmp,
        dir,
        sim,
        broker,
    };
    assert!(wait_until(T, || view(&g).len() == 4));
    let job = write(&g, "job.toml", JOB);
    assert_eq!(select(&g, &job, "ttd").len(), 3);
    let pid = g.sim.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    // No new samples: after the bound the hosts are stale, and excluded, not used as fresh.
    assert!(wait_until(T, || view(&g).iter().all(|r| r["stale"] == true)));
    let ranked = select(&g, &job, "ttd");
    let _ = std::process::Command::new("kill").args(["-CONT", &pid]).status();
    assert!(ranked.is_empty(), "{ranked:?}");
}

const SIMRES: &str = "[[resource]]\nname = \"hostA\"\ncpus = 1\n\
[[resource]]\nname = \"hostB\"\ncpus = 1\n[[resource.background]]\nstart_in_s = 600\nduration_s = 1200\n\
[[resource]]\nname = \"hostC\"\ncpus = 1\n\
[[resource]]\nname = \"hostD\"\ncpus = 1\n[[resource.background]]\nstart_in_s = 0\nduration_s = 7200\n";

fn reservations(manager: &str, owner: &str) -> Vec<serde_json::Value> {
    simres_reservations(manager, owner)
}

#[test]
fn coallocation_reserves_a_common_start_and_leaks_nothing_on_failure() {
    let hosts = "period_ms = 100\n[[host]]\nname = \"hostA\"\ncpus = 1\nmemory_mb = 1024\n\
                 [[host]]\nname = \"hostB\"\ncpus = 1\nmemory_mb = 1024\n[[host]]\nname = \"hostC\"\ncpus = 1\nmemory_mb = 1024\n";
    let g = start(hosts, &[]);
    let cfg = write(&g, "simres.toml", SIMRES);
    let simres = Proc::start(
        &[
            "simres",
            "--config",
            &cfg,
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &g.dir.addr,
        ],
        "gma simres listening on",
    );
    // The broker finds the manager as the producer of reservation.state.
    assert!(wait_until(T, || search_ids(&g.dir.addr, "reservation.state")
        .is_some_and(|v| v.len() == 1)));
    assert!(wait_until(T, || view(&g).len() == 3));
    // Three 30-minute jobs that must start within 5 minutes of each other in the next 2 hours.
    let jobs = write(
        &g,
        "jobs.toml",
        "window_s = 7200\nepsilon_s = 300\n\
         [[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 1800\n\
         [[job]]\nname = \"b\"\ncpus = 1\nreference_time_s = 1800\n\
         [[job]]\nname = \"c\"\ncpus = 1\nreference_time_s = 1800\n",
    );
    let r = gma(
        &[
            "broker",
            "coallocate",
            "--jobs",
            &jobs,
            "--broker",
            &g.broker.addr,
            "--output",
            "json",
        ],
        T,
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let out: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(out["success"], true);
    let res = out["reservations"].as_array().unwrap();
    assert_eq!(res.len(), 3);
    let starts: Vec<i64> = res.iter().map(|x| x["start_s"].as_i64().unwrap()).collect();
    let (lo, hi) = (starts.iter().min().unwrap(), starts.iter().max().unwrap());
    assert!(hi - lo <= 300, "{starts:?}");
    // hostD is blocked for two hours and hostB from minute 10: the three must share A, B, C
    // with B's 30 minutes before its block, or wait until B is free again.
    let mut used: Vec<&str> = res.iter().map(|x| x["resource"].as_str().unwrap()).collect();
    used.sort();
    assert_eq!(used, ["hostA", "hostB", "hostC"]);
    assert!(*lo >= out["window_start_s"].as_i64().unwrap());
    // Exactly these are held at the manager, by the broker.
    let held = reservations(&simres.addr, "broker");
    assert_eq!(held.len(), 3, "{held:?}");
    for x in res {
        assert!(held.iter().any(|h| h["id"] == x["id"]));
    }
    // The decision was published.
    assert!(wait_until(T, || {
        let r = gma(
            &[
                "query",
                "broker.decision",
                "--directory",
                &g.dir.addr,
                "--output",
                "json",
            ],
            T,
        );
        json_lines(&r.stdout)
            .last()
            .is_some_and(|e| e["values"]["kind"] == "coallocate" && e["values"]["outcome"] == "success")
    }));
    // Four jobs on three usable machines in a window hostD never frees: no coallocation
    // (exit 2), and nothing new left held.
    let jobs4 = write(
        &g,
        "jobs4.toml",
        "window_s = 1800\nepsilon_s = 60\n\
         [[job]]\nname = \"w\"\ncpus = 1\nreference_time_s = 600\n[[job]]\nname = \"x\"\ncpus = 1\nreference_time_s = 600\n\
         [[job]]\nname = \"y\"\ncpus = 1\nreference_time_s = 600\n[[job]]\nname = \"z\"\ncpus = 1\nreference_time_s = 600\n",
    );
    let r = gma(
        &[
            "broker",
            "coallocate",
            "--jobs",
            &jobs4,
            "--broker",
            &g.broker.addr,
        ],
        T,
    );
    assert_eq!(r.code, 2, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("no coallocation"), "{}", r.stdout);
    assert_eq!(
        reservations(&simres.addr, "broker").len(),
        3,
        "the failed attempt leaked"
    );
    // Bad input: a precise error.
    let bad = write(&g, "bad.toml", "[[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 1\n[[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 1\n");
    let r = gma(
        &["broker", "coallocate", "--jobs", &bad, "--broker", &g.broker.addr],
        T,
    );
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("job[1].name"), "{}", r.stderr);
}

#[test]
fn the_coallocation_replay_runs_against_a_simres_process_without_leaks() {
    let tmp = tempdir();
    let cfg = tmp.path().join("m.toml");
    let machines: String = (0..4)
        .map(|i| format!("[[resource]]\nname = \"m{i}\"\ncpus = 1\n"))
        .collect();
    std::fs::write(&cfg, machines).unwrap();
    let simres = Proc::start(
        &[
            "simres",
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        "gma simres listening on",
    );
    let r = gma(
        &[
            "bench",
            "coalloc",
            "--trials",
            "40",
            "--simres",
            &simres.addr,
            "--output",
            "json",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    let mut papers = Vec::new();
    for s in results {
        assert_eq!(s["trials"], 40, "{s}");
        assert_eq!(s["errors"], 0, "{s}");
        assert_eq!(s["leaked"], 0, "{s}");
        assert!(s["successes"].as_u64().unwrap() <= s["feasible"].as_u64().unwrap());
        papers.push(s["paper"]["success_pct"].as_f64().unwrap());
        // The three-way comparison: ours, the paper's algorithm as written (release then
        // create), with and without other jobs competing for released capacity.
        let runs = s["runs"].as_array().unwrap();
        let names: Vec<&str> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "ours",
                "as written",
                "ours, competing",
                "as written, competing",
                "ours, jobs not flexible"
            ]
        );
        for r in runs {
            assert_eq!(
                (r["trials"].as_u64(), r["errors"].as_u64(), r["leaked"].as_u64()),
                (Some(40), Some(0), Some(0)),
                "{r}"
            );
            assert!(
                r["successes"].as_u64().unwrap() <= r["feasible"].as_u64().unwrap(),
                "{r}"
            );
        }
        assert!(
            runs[3]["taken"].as_u64().unwrap() > 0,
            "other jobs competed: {}",
            runs[3]
        );
    }
    assert_eq!(papers, [86.0, 66.3]);
    // In the homogeneous experiment an exchange never succeeds (every job can use every machine).
    assert_eq!(
        results[0]["success"]["augmentations"]["max"], 0.0,
        "{}",
        results[0]
    );
    // Nothing is left at the manager.
    assert!(reservations(&simres.addr, "").is_empty());
}
