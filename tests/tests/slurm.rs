//! The broker runs jobs under a real Slurm (issue 21, items 2, 3 and 5): a throw-away
//! single-machine cluster (`common::slurm`), the Slurm adapter `gma slurm`, a directory and a
//! broker as real processes. A script runs inside an advance reservation via
//! `gma job submit --broker`; its lifecycle events arrive at a subscriber; a failing script
//! reports its exit code; a claim by another identity is refused; a controller that is down
//! is an explicit failure. After each test Slurm holds no reservation.
//!
//! Without Slurm (not installed, not root) the tests print a skip message; under `CI=true`
//! they fail with the reason.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::slurm::{cluster_or_skip, Cluster};
use common::*;
use gma_consumer::stream::{ResumePoint, StreamOptions};
use gma_consumer::subscriber::{Delivery, Subscriber, SubscriberOptions};
use gma_proto::v1 as pb;

/// A directory, the adapter (registered there) and a broker using it.
struct Fabric {
    _tmp: tempfile::TempDir,
    _dir: Proc,
    adapter: Proc,
    /// The adapter's config (a restart with it is the same adapter: same source).
    adapter_cfg: std::path::PathBuf,
    broker: Proc,
    directory: String,
}

fn fabric(cluster: &Cluster) -> Fabric {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let cfg = cluster
        .adapter_config("software = [\"sh\"]\n")
        .expect("adapter config");
    let adapter = Proc::role("slurm", &dir.addr, &cfg);
    let adapter_cfg = cfg.clone();
    let bcfg = tmp.path().join("broker.toml");
    std::fs::write(
        &bcfg,
        format!("listen = \"127.0.0.1:0\"\ndirectory = \"{}\"\n", dir.addr),
    )
    .unwrap();
    let broker = Proc::start(
        &["broker", "--config", bcfg.to_str().unwrap()],
        "gma broker listening on",
    );
    // The broker finds the adapter in the directory (as the producer of reservation.state).
    let found = wait_until(Duration::from_secs(30), || {
        search_ids(&dir.addr, "job.batch")
            .is_some_and(|ids| ids.iter().any(|(_, a)| a.ends_with(&adapter.addr)))
    });
    assert!(found, "the adapter never registered: {}", adapter.stderr_text());
    let directory = dir.addr.clone();
    Fabric {
        _tmp: tmp,
        _dir: dir,
        adapter,
        adapter_cfg,
        broker,
        directory,
    }
}

/// Every event of `patterns` the fabric's producers hold, from the oldest on.
fn subscribe(directory: &str, patterns: &[&str]) -> Subscriber {
    Subscriber::start(
        SubscriberOptions {
            directory: directory.to_string(),
            stream: StreamOptions {
                patterns: patterns.iter().map(|p| p.to_string()).collect(),
                ..StreamOptions::default()
            },
            capacity: 1024,
            default_resume: Some(ResumePoint {
                epoch: 0,
                next_seq: 1,
            }),
        },
        HashMap::new(),
    )
}

/// One event as (name, text fields by name, number fields by name).
#[derive(Debug, Clone)]
struct Ev {
    name: String,
    text: HashMap<String, String>,
    num: HashMap<String, f64>,
}

/// Collects events into `seen` until `done(seen)` holds (or fails after 60 s naming `what`).
async fn collect_until(sub: &mut Subscriber, seen: &mut Vec<Ev>, what: &str, done: impl Fn(&[Ev]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(seen) {
        let d = tokio::time::timeout_at(deadline, sub.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}; events so far: {seen:#?}"))
            .expect("subscriber ended");
        if let Delivery::Events { events, .. } = d {
            for e in events {
                let mut ev = Ev {
                    name: e.series.name.clone(),
                    text: HashMap::new(),
                    num: HashMap::new(),
                };
                let (mut n, mut s) = (0, 0);
                for f in e.series.fields.iter() {
                    if f.r#type == pb::FieldType::String as i32 {
                        ev.text
                            .insert(f.name.clone(), e.strings.get(s).cloned().unwrap_or_default());
                        s += 1;
                    } else {
                        ev.num
                            .insert(f.name.clone(), e.numbers.get(n).copied().unwrap_or(f64::NAN));
                        n += 1;
                    }
                }
                seen.push(ev);
            }
        }
    }
}

fn job_states(seen: &[Ev], job_name: &str) -> Vec<String> {
    seen.iter()
        .filter(|e| e.name == "job.batch" && e.text["name"] == job_name)
        .map(|e| e.text["state"].clone())
        .collect()
}

fn res_states(seen: &[Ev], id: &str) -> Vec<String> {
    seen.iter()
        .filter(|e| e.name == "reservation.state" && e.text["id"] == id)
        .map(|e| e.text["state"].clone())
        .collect()
}

fn no_reservation_left(cluster: &Cluster) {
    let mut last = Vec::new();
    let clean = wait_until(Duration::from_secs(30), || {
        last = cluster.reservations().unwrap();
        last.is_empty()
    });
    assert!(clean, "Slurm still holds reservations: {last:#?}");
}

fn run_file(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, body).unwrap();
    p.to_str().unwrap().to_string()
}

/// `gma job submit --broker` running in the background.
fn submit(file: &str, broker: &str) -> Proc {
    Proc::start(
        &[
            "job", "submit", "--job", file, "--broker", broker, "--output", "json",
        ],
        "",
    )
}

fn wait_exit(p: &mut Proc) -> i32 {
    let mut code = None;
    let ended = wait_until(Duration::from_secs(120), || {
        code = p.child.try_wait().unwrap().map(|s| s.code().unwrap_or(-1));
        code.is_some()
    });
    assert!(ended, "gma job submit never ended: {}", p.stderr_text());
    // The readers may still hold the last lines.
    wait_until(Duration::from_secs(5), || {
        !p.stdout_lines().is_empty() || !p.stderr_text().is_empty()
    });
    code.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_runs_in_an_advance_reservation_through_the_broker() {
    let Some(cluster) = cluster_or_skip("a_script_runs_in_an_advance_reservation_through_the_broker") else {
        return;
    };
    let f = fabric(&cluster);
    let mut sub = subscribe(&f.directory, &["job.*", "reservation.*", "broker.decision"]);
    let jobs = cluster.job_dir();
    let go = jobs.join("go");
    // The script runs until the test lets it finish, so "running" is seen for sure.
    let script = format!(
        "#!/bin/sh\necho \"hello from job $SLURM_JOB_ID in reservation $SLURM_JOB_RESERVATION\"\n\
         while [ ! -e {go} ]; do sleep 0.1; done\necho done\n",
        go = go.display()
    );
    let file = run_file(
        &jobs,
        "hello",
        &format!(
            "name = \"hello\"\ncpus = 1\nmemory_mb = 100\ndisk_mb = 1\nsoftware = [\"sh\"]\nwalltime_s = 120\nscript = '''{script}'''\n"
        ),
    );
    let mut run = submit(&file, &f.broker.addr);
    let mut seen = Vec::new();
    collect_until(&mut sub, &mut seen, "the job running", |s| {
        job_states(s, "hello").contains(&"running".to_string())
    })
    .await;
    // While it runs: Slurm holds the reservation, and the job runs inside it.
    let res_id = seen
        .iter()
        .find(|e| e.name == "job.batch" && e.text["name"] == "hello")
        .map(|e| e.text["reservation"].clone())
        .unwrap();
    let job_id = seen
        .iter()
        .find(|e| e.name == "job.batch" && e.text["name"] == "hello")
        .map(|e| e.text["job"].clone())
        .unwrap();
    let held = cluster.reservations().unwrap();
    assert!(
        held.iter()
            .any(|l| l.starts_with(&format!("ReservationName={res_id} "))
                && l.contains(&format!("Nodes={}", cluster.node))),
        "{held:#?}"
    );
    let q = cluster
        .cmd("squeue", &["-h", "-j", &job_id, "-o", "%T %v"])
        .unwrap();
    assert_eq!(q.trim(), format!("RUNNING {res_id}"));
    // The CLI follows it too.
    let followed = wait_until(Duration::from_secs(60), || {
        run.stdout_lines()
            .iter()
            .any(|l| l.contains("\"stage\":\"running\""))
    });
    assert!(
        followed,
        "gma job submit never printed the running stage: {:?}",
        run.stdout_lines()
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut run), 0, "{}", run.stderr_text());
    // The CLI printed the stages and the end state.
    let lines: Vec<serde_json::Value> = json_lines(&run.stdout_lines().join("\n"));
    let stages: Vec<&str> = lines.iter().map(|l| l["stage"].as_str().unwrap()).collect();
    assert_eq!(stages.first(), Some(&"reserved"), "{stages:?}");
    assert!(
        stages.contains(&"claimed") && stages.contains(&"running"),
        "{stages:?}"
    );
    let last = lines.last().unwrap();
    assert_eq!(
        (last["stage"].as_str(), last["exit_code"].as_i64()),
        (Some("completed"), Some(0))
    );
    assert_eq!(last["reservation"].as_str(), Some(res_id.as_str()));
    // The script's output, written under Slurm inside the reservation.
    let out = std::fs::read_to_string(last["output"].as_str().unwrap()).unwrap();
    assert_eq!(
        out,
        format!("hello from job {job_id} in reservation {res_id}\ndone\n")
    );
    // The lifecycle events: the reservation requested, granted, confirmed, claimed, released;
    // the job pending, running, completed with exit code 0; the broker's decision.
    collect_until(
        &mut sub,
        &mut seen,
        "the reservation released and the decision",
        |s| {
            res_states(s, &res_id).contains(&"released".to_string())
                && s.iter()
                    .any(|e| e.name == "broker.decision" && e.text["kind"] == "run")
        },
    )
    .await;
    assert!(
        seen.iter().any(|e| e.name == "reservation.state"
            && e.text["state"] == "requested"
            && e.text["resource"] == cluster.node),
        "{seen:#?}"
    );
    assert_eq!(
        res_states(&seen, &res_id),
        ["granted", "confirmed", "claimed", "released"]
    );
    assert_eq!(job_states(&seen, "hello"), ["pending", "running", "completed"]);
    let end = seen.iter().rfind(|e| e.name == "job.batch").unwrap();
    assert_eq!(end.num["exit_code"], 0.0);
    let d = seen.iter().find(|e| e.name == "broker.decision").unwrap();
    assert_eq!(
        (d.text["outcome"].as_str(), d.text["chosen"].as_str()),
        ("completed", cluster.node.as_str())
    );
    no_reservation_left(&cluster);
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_script_reports_its_exit_code_and_leaves_nothing_reserved() {
    let Some(cluster) = cluster_or_skip("a_failing_script_reports_its_exit_code_and_leaves_nothing_reserved")
    else {
        return;
    };
    let f = fabric(&cluster);
    let mut sub = subscribe(&f.directory, &["job.*", "broker.decision"]);
    let file = run_file(
        &cluster.job_dir(),
        "bad",
        "name = \"bad\"\ncpus = 2\nwalltime_s = 60\ncommand = \"echo failing >&2; exit 3\"\n",
    );
    let r = gma(
        &["job", "submit", "--job", &file, "--broker", &f.broker.addr],
        Duration::from_secs(120),
    );
    assert_eq!(r.code, 1, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(": failed, exit code 3"), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("failed with exit code 3 (FAILED (NonZeroExitCode))"),
        "{}",
        r.stderr
    );
    let mut seen = Vec::new();
    collect_until(&mut sub, &mut seen, "the failure events", |s| {
        job_states(s, "bad").contains(&"failed".to_string()) && s.iter().any(|e| e.name == "broker.decision")
    })
    .await;
    let end = seen.iter().rfind(|e| e.name == "job.batch").unwrap();
    assert_eq!(
        (end.num["exit_code"], end.text["reason"].as_str()),
        (3.0, "FAILED (NonZeroExitCode)")
    );
    let d = seen.iter().find(|e| e.name == "broker.decision").unwrap();
    assert_eq!(d.text["outcome"], "failed");
    assert!(d.text["reason"].starts_with("exit code 3"), "{d:?}");
    no_reservation_left(&cluster);
    // A job the resources cannot hold is refused before anything is reserved.
    let big = run_file(
        &cluster.job_dir(),
        "big",
        "name = \"big\"\ncpus = 64\nwalltime_s = 60\ncommand = \"true\"\n",
    );
    let r = gma(
        &["job", "submit", "--job", &big, "--broker", &f.broker.addr],
        Duration::from_secs(60),
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .contains("no resource that runs jobs meets the job's requirements")
            && r.stderr.contains("FailedPrecondition"),
        "{}",
        r.stderr
    );
    no_reservation_left(&cluster);
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_is_down_is_an_explicit_failure() {
    let Some(mut cluster) = cluster_or_skip("a_controller_that_is_down_is_an_explicit_failure") else {
        return;
    };
    let f = fabric(&cluster);
    let mut sub = subscribe(&f.directory, &["broker.decision"]);
    cluster.stop_controller();
    let file = run_file(
        &cluster.job_dir(),
        "late",
        "name = \"late\"\ncpus = 1\nwalltime_s = 60\ncommand = \"true\"\n",
    );
    let r = gma(
        &["job", "submit", "--job", &file, "--broker", &f.broker.addr],
        Duration::from_secs(120),
    );
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stderr.contains("resource manager down")
            && r.stderr.contains("slurm is unreachable")
            && r.stderr.contains("Unavailable"),
        "{}",
        r.stderr
    );
    let mut seen = Vec::new();
    collect_until(&mut sub, &mut seen, "the decision", |s| {
        s.iter().any(|e| e.name == "broker.decision")
    })
    .await;
    assert_eq!(seen[0].text["outcome"], "unavailable", "{seen:?}");
    // The adapter holds nothing.
    let list = gma(
        &["simres", "list", "--manager", &f.adapter.addr, "--output", "json"],
        Duration::from_secs(30),
    );
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert_eq!(list.stdout.trim(), "[]");
    drop(f);
}

/// A gRPC channel to `addr` with `who`'s certificate of `site`.
async fn channel(site: &secure::Secure, addr: &str, who: &str) -> tonic::transport::Channel {
    mtls_channel(&site.dir, addr, who).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_creator_may_claim_or_release_a_reservation() {
    let Some(cluster) = cluster_or_skip("only_the_creator_may_claim_or_release_a_reservation") else {
        return;
    };
    // mTLS: the owner is the caller's certificate. Alice and carol may reserve, neither is
    // an admin (who may act on behalf of another owner, as a broker does).
    let policy =
        "default = \"deny\"\n[[rule]]\norg = \"site1\"\nactions = [\"reservation\"]\neffect = \"allow\"\n";
    let site = secure::Secure::with_policy(policy, &[("ca", "carol", "site1")]);
    let cfg = cluster.adapter_config("").expect("adapter config");
    let adapter = site.start(
        &[
            "slurm",
            "--listen",
            "127.0.0.1:0",
            "--config",
            cfg.to_str().unwrap(),
        ],
        "gma slurm listening on",
    );
    let mut alice =
        pb::reservations_client::ReservationsClient::new(channel(&site, &adapter.addr, "alice").await);
    let mut carol =
        pb::reservations_client::ReservationsClient::new(channel(&site, &adapter.addr, "carol").await);
    let now = gma_core::time::now_ns() / 1_000_000_000;
    let granted = alice
        .reserve(pb::ReserveRequest {
            resource: cluster.node.clone(),
            cpus: 1,
            duration_s: 300,
            earliest_start_s: now,
            latest_start_s: now + 600,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.answer, pb::ReserveAnswer::Granted as i32, "{granted:?}");
    let res = granted.reservation.unwrap();
    assert_eq!(res.owner, "alice");
    let job = pb::BatchJobSpec {
        name: "mine".into(),
        script: "#!/bin/sh\necho mine\n".into(),
        cpus: 1,
        ..Default::default()
    };
    // Carol may neither claim nor release alice's reservation, even naming alice as owner.
    for owner in ["", "alice"] {
        let e = carol
            .claim(pb::ClaimRequest {
                reservation_id: res.id.clone(),
                owner: owner.into(),
                job: Some(job.clone()),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let e = carol
            .release(pb::ReleaseReservationRequest {
                id: res.id.clone(),
                owner: owner.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    }
    assert!(
        cluster.cmd("squeue", &["-h"]).unwrap().trim().is_empty(),
        "carol's claim queued a job"
    );
    // Bad input: precise statuses.
    let e = alice
        .claim(pb::ClaimRequest {
            reservation_id: res.id.clone(),
            job: Some(pb::BatchJobSpec {
                script: "echo no interpreter".into(),
                ..job.clone()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = alice
        .claim(pb::ClaimRequest {
            reservation_id: "gma-nope".into(),
            job: Some(job.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // Alice claims it: the job runs in it; the reservation ends with the job.
    let started = alice
        .claim(pb::ClaimRequest {
            reservation_id: res.id.clone(),
            job: Some(job.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (started.owner.as_str(), started.reservation_id.as_str()),
        ("alice", res.id.as_str())
    );
    let e = carol
        .job_status(pb::BatchJobRequest {
            job_id: started.job_id.clone(),
            owner: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let done = wait_for("alice's job to end", Duration::from_secs(60), || {
        let mut alice = alice.clone();
        let id = started.job_id.clone();
        async move {
            let j = alice
                .job_status(pb::BatchJobRequest {
                    job_id: id,
                    owner: String::new(),
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            if j.done {
                Ok(j)
            } else {
                Err(format!("{j:?}"))
            }
        }
    })
    .await;
    assert_eq!((done.state.as_str(), done.exit_code), ("completed", 0));
    no_reservation_left(&cluster);
    drop(adapter);
}

/// The latest `batch.queue` of `source` and `host.load` of the host, from the producer's cache.
fn batch_figures(producer: &str, source: &str, host: &str) -> Option<(serde_json::Value, f64)> {
    let q = gma(
        &["query", "batch.queue", "--producer", producer, "--output", "json"],
        Duration::from_secs(30),
    );
    let l = gma(
        &["query", "host.load", "--producer", producer, "--output", "json"],
        Duration::from_secs(30),
    );
    let part = json_lines(&q.stdout)
        .into_iter()
        .find(|e| e["source"] == source)?;
    let load = json_lines(&l.stdout).into_iter().find(|e| e["source"] == host)?;
    Some((part["values"].clone(), load["values"]["queue_waiting"].as_f64()?))
}

#[test]
fn the_batch_sensor_reports_pending_and_running_jobs_and_host_load_queue_waiting() {
    let Some(cluster) =
        cluster_or_skip("the_batch_sensor_reports_pending_and_running_jobs_and_host_load_queue_waiting")
    else {
        return;
    };
    let tmp = tempdir();
    let cfg = tmp.path().join("producer.toml");
    std::fs::write(
        &cfg,
        format!(
            "slurm_conf = \"{}\"\nbatch_period_ms = 200\npackages = []\n",
            cluster.conf.display()
        ),
    )
    .unwrap();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&[
        "--source",
        "batchhost",
        "--directory",
        &dir.addr,
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let part = "batchhost/debug";
    // An empty queue first: the idle node, nothing waiting.
    let mut seen = None;
    assert!(
        wait_until(Duration::from_secs(60), || {
            seen = batch_figures(&prod.addr, part, "batchhost");
            seen.as_ref().is_some_and(|(v, q)| {
                v["jobs_pending"] == 0.0
                    && v["jobs_running"] == 0.0
                    && v["nodes_total"] == 1.0
                    && *q == 0.0
                    // Idle CPUs and nothing pending: free for the partition's MaxTime (60 min).
                    && v["backfill_window_s"] == 3600.0
            })
        }),
        "{seen:?}; producer stderr: {}",
        prod.stderr_text()
    );
    // One job running (sleeping) on one of the node's two CPUs, one held: pending.
    let jobs = cluster.job_dir();
    let out = jobs.join("batch-%j.out");
    let common = [
        "--parsable",
        "--chdir",
        jobs.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--cpus-per-task",
        "1",
        "--time",
        "5",
    ];
    let sbatch = |extra: &[&str]| {
        let mut args: Vec<&str> = common.to_vec();
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--wrap", "sleep 600"]);
        cluster.cmd("sbatch", &args).unwrap().trim().to_string()
    };
    let _running = sbatch(&[]);
    let held = sbatch(&["--hold"]);
    assert!(
        wait_until(Duration::from_secs(60), || {
            seen = batch_figures(&prod.addr, part, "batchhost");
            seen.as_ref().is_some_and(|(v, q)| {
                v["jobs_pending"] == 1.0
                    && v["jobs_running"] == 1.0
                    && v["nodes_busy"] == 1.0
                    && v["cpus_idle"] == 1.0
                    && v["cpus_total"] == 2.0
                    && v["system"] == "slurm"
                    && v["state"] == "up"
                    && *q == 1.0
            })
        }),
        "{seen:?}; squeue: {:?}",
        cluster.cmd("squeue", &["-a"])
    );
    // The held job cancelled: nothing waits any more.
    cluster.cmd("scancel", &[&held]).unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || {
            seen = batch_figures(&prod.addr, part, "batchhost");
            seen.as_ref()
                .is_some_and(|(v, q)| v["jobs_pending"] == 0.0 && v["jobs_running"] == 1.0 && *q == 0.0)
        }),
        "{seen:?}"
    );
    // A job that needs both CPUs waits for the running one (5 min limit): Slurm's backfill
    // expects it to start when that ends, so the idle CPU is free until then, not for 60 min.
    let _wide = cluster
        .cmd(
            "sbatch",
            &[
                "--parsable",
                "--chdir",
                jobs.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--cpus-per-task",
                "2",
                "--time",
                "5",
                "--wrap",
                "sleep 600",
            ],
        )
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || {
            seen = batch_figures(&prod.addr, part, "batchhost");
            seen.as_ref().is_some_and(|(v, _)| {
                let w = v["backfill_window_s"].as_f64().unwrap_or(f64::NAN);
                v["jobs_pending"] == 1.0 && v["cpus_idle"] == 1.0 && w > 0.0 && w <= 300.0
            })
        }),
        "{seen:?}; squeue --start: {:?}",
        cluster.cmd("squeue", &["--start", "-a"])
    );

    // The broker ranks the real host by its queue: with two jobs waiting, a job that needs all
    // of its CPUs waits at least two typical jobs (600 s each; without the queue it would wait
    // at most one: typical × (queue + deficit) / slots, deficit ≤ 1, one slot).
    let _held2 = sbatch(&["--hold"]);
    let total = {
        let l = gma(
            &["query", "host.load", "--producer", &prod.addr, "--output", "json"],
            Duration::from_secs(30),
        );
        let load = json_lines(&l.stdout)
            .into_iter()
            .find(|e| e["source"] == "batchhost");
        load.and_then(|e| e["values"]["total_cpus"].as_f64()).unwrap()
    };
    let broker = Proc::start(
        &["broker", "--listen", "127.0.0.1:0", "--directory", &dir.addr],
        "gma broker listening on",
    );
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        format!("name = \"all\"\ncpus = {total}\nreference_time_s = 10\n"),
    )
    .unwrap();
    let mut ranked = Vec::new();
    assert!(
        wait_until(Duration::from_secs(60), || {
            let r = broker_select(&broker.addr, &job);
            ranked = serde_json::from_str::<Vec<serde_json::Value>>(&r.stdout).unwrap_or_default();
            ranked
                .iter()
                .any(|r| r["resource"] == "batchhost" && r["wait_s"].as_f64().is_some_and(|w| w >= 1200.0))
        }),
        "{ranked:?}; batch.queue {:?}; broker stderr: {}",
        batch_figures(&prod.addr, part, "batchhost"),
        broker.stderr_text()
    );
}

/// Starts `gma simres` with `config_text`, registered in `directory`.
fn simres(dir: &Path, name: &str, directory: &str, config_text: &str) -> Proc {
    start_simres(dir, name, config_text, &["--directory", directory])
}

/// The reservations `gma simres list` shows at `manager`, but simres's own background blocks.
fn simres_held(manager: &str) -> Vec<serde_json::Value> {
    simres_reservations(manager, "")
        .into_iter()
        .filter(|r| r["owner"] != "background")
        .collect()
}

/// `gma broker coallocate` of `jobs` (a coallocation file) at `broker`.
fn coallocate(jobs: &str, broker: &str) -> Run {
    gma(
        &[
            "broker",
            "coallocate",
            "--jobs",
            jobs,
            "--broker",
            broker,
            "--output",
            "json",
        ],
        Duration::from_secs(120),
    )
}

/// Coallocation across two resource managers, the Slurm adapter and a `gma simres`: a
/// 2-CPU job only Slurm's node can hold and a 1-CPU job that must start within a minute of
/// it (so not on the same 2-CPU node). When simres refuses (its only resource is busy for the
/// whole window) the coallocation fails and neither manager holds anything; with a free
/// simres resource it succeeds, one reservation on each. Then the adapter is killed (-9)
/// while it holds its reservation: Slurm still has it, and the restarted adapter (same
/// config, same source) deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coallocation_across_slurm_and_simres_leaks_nothing_on_refusal_or_a_killed_adapter() {
    let Some(cluster) =
        cluster_or_skip("coallocation_across_slurm_and_simres_leaks_nothing_on_refusal_or_a_killed_adapter")
    else {
        return;
    };
    let mut f = fabric(&cluster);
    let tmp = tempdir();
    let managers = |n: usize| {
        wait_until(Duration::from_secs(30), || {
            search_ids(&f.directory, "reservation.state").is_some_and(|v| v.len() == n)
        })
    };
    let jobs = run_file(
        tmp.path(),
        "jobs",
        "window_s = 600\nepsilon_s = 60\n\
         [[job]]\nname = \"wide\"\ncpus = 2\nreference_time_s = 120\n\
         [[job]]\nname = \"narrow\"\ncpus = 1\nreference_time_s = 120\n",
    );

    // simres refuses: its one resource is busy for two hours.
    let busy = simres(
        tmp.path(),
        "busy",
        &f.directory,
        "[[resource]]\nname = \"simB\"\ncpus = 1\n[[resource.background]]\nstart_in_s = 0\nduration_s = 7200\n",
    );
    assert!(managers(2), "simres never registered: {}", busy.stderr_text());
    let r = coallocate(&jobs, &f.broker.addr);
    assert_eq!(r.code, 2, "{}\n{}", r.stdout, r.stderr);
    let out: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(out["success"], false, "{out}");
    no_reservation_left(&cluster);
    let left = simres_held(&busy.addr);
    assert!(left.is_empty(), "{left:#?}");
    assert!(simres_held(&f.adapter.addr).is_empty());

    // A free simres resource: one reservation on each manager, starts within epsilon.
    let free = simres(
        tmp.path(),
        "free",
        &f.directory,
        "[[resource]]\nname = \"simA\"\ncpus = 1\n",
    );
    assert!(managers(3), "simres never registered: {}", free.stderr_text());
    let r = coallocate(&jobs, &f.broker.addr);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let out: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(out["success"], true, "{out}");
    let res = out["reservations"].as_array().unwrap();
    let mut used: Vec<&str> = res.iter().map(|x| x["resource"].as_str().unwrap()).collect();
    used.sort();
    let mut want = vec![cluster.node.as_str(), "simA"];
    want.sort();
    assert_eq!(used, want, "{out}");
    let starts: Vec<i64> = res.iter().map(|x| x["start_s"].as_i64().unwrap()).collect();
    assert!(
        starts.iter().max().unwrap() - starts.iter().min().unwrap() <= 60,
        "{starts:?}"
    );
    assert_eq!(simres_held(&free.addr).len(), 1);
    assert!(simres_held(&busy.addr).is_empty());
    let slurm_id = res
        .iter()
        .find(|x| x["resource"] == cluster.node.as_str())
        .and_then(|x| x["id"].as_str())
        .unwrap()
        .to_string();
    let held = cluster.reservations().unwrap();
    assert!(
        held.len() == 1 && held[0].starts_with(&format!("ReservationName={slurm_id} ")),
        "{held:#?}"
    );

    // kill -9: the adapter cannot clean up; Slurm keeps the reservation.
    f.adapter.kill();
    let held = cluster.reservations().unwrap();
    assert_eq!(held.len(), 1, "{held:#?}");
    // The restarted adapter (same source) deletes what its earlier run left.
    f.adapter = Proc::role("slurm", &f.directory, &f.adapter_cfg);
    no_reservation_left(&cluster);
    assert!(simres_held(&f.adapter.addr).is_empty());
    drop(f);
}

/// Whether slurmctld's saved state (`StateSaveLocation/resv_state`) names reservation `id`:
/// a slurmctld killed after this point comes back with the reservation.
fn saved_in_state(cluster: &Cluster, id: &str) -> bool {
    std::fs::read(cluster.dir.path().join("state").join("resv_state"))
        .is_ok_and(|b| b.windows(id.len()).any(|w| w == id.as_bytes()))
}

/// Waits (bounded: the adapter retries with backoff up to 30 s) until Slurm lists no
/// reservation and, when given, no longer queues `job`.
fn nothing_left_after_recovery(cluster: &Cluster, adapter: &Proc, job: Option<&str>) {
    let mut left = Vec::new();
    let clean = wait_until(Duration::from_secs(120), || {
        left = cluster.reservations().unwrap_or_else(|e| vec![e.to_string()]);
        let queued = job.is_some_and(|j| {
            cluster
                .cmd("squeue", &["-h", "-t", "PD,R,CG", "-o", "%i"])
                .map_or(true, |q| q.split_whitespace().any(|id| id == j))
        });
        left.is_empty() && !queued
    });
    assert!(
        clean,
        "Slurm still holds {left:#?} (or queues job {job:?}) after slurmctld came back; adapter: {}",
        adapter.stderr_text()
    );
}

/// `gma simres release` of reservation `id` at `manager` as `owner`.
fn release(manager: &str, id: &str, owner: &str) -> Run {
    gma(
        &["simres", "release", "--manager", manager, id, "--owner", owner],
        Duration::from_secs(120),
    )
}

/// slurmctld killed (-9) while a coallocation across Slurm and simres holds its reservations.
/// Releasing the Slurm member is refused as UNAVAILABLE, saying the release is kept; the
/// adapter publishes `releasing`, retries with backoff, and once slurmctld is back (same state
/// directory, so with the reservation) deletes it and publishes `released`: Slurm lists none
/// of ours. Then both the adapter and slurmctld are killed while a second coallocation holds
/// its reservation; restarted, the adapter releases what its earlier run left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_slurmctld_is_down_is_kept_and_retried_until_slurm_holds_nothing() {
    let Some(mut cluster) =
        cluster_or_skip("a_release_while_slurmctld_is_down_is_kept_and_retried_until_slurm_holds_nothing")
    else {
        return;
    };
    let tmp = tempdir();
    let (mut f, free) = fabric_and_simres(&cluster, tmp.path());
    let jobs = run_file(
        tmp.path(),
        "jobs",
        "window_s = 600\nepsilon_s = 60\n\
         [[job]]\nname = \"wide\"\ncpus = 2\nreference_time_s = 600\n\
         [[job]]\nname = \"narrow\"\ncpus = 1\nreference_time_s = 600\n",
    );
    let (node, broker) = (cluster.node.clone(), f.broker.addr.clone());
    let coallocated = || {
        let r = coallocate(&jobs, &broker);
        assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
        let out: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        let res = out["reservations"].as_array().unwrap().clone();
        assert_eq!(res.len(), 2, "{out}");
        let on = |slurm: bool| {
            res.iter()
                .find(|x| (x["resource"] == node.as_str()) == slurm)
                .cloned()
                .unwrap()
        };
        (on(true), on(false))
    };
    let mut sub = subscribe(&f.directory, &["reservation.state"]);
    let (slurm, sim) = coallocated();
    let (id, owner) = (
        slurm["id"].as_str().unwrap().to_string(),
        slurm["owner"].as_str().unwrap().to_string(),
    );
    assert!(
        wait_until(Duration::from_secs(30), || saved_in_state(&cluster, &id)),
        "slurmctld never saved reservation {id}"
    );

    cluster.kill_controller();
    let r = release(&f.adapter.addr, &id, &owner);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(
        r.stderr.contains("slurm is unreachable") && r.stderr.contains("kept and retried"),
        "{}",
        r.stderr
    );
    // The holder no longer has it (no modify, no claim); asking again says it is pending.
    assert!(simres_held(&f.adapter.addr).is_empty());
    let again = release(&f.adapter.addr, &id, &owner);
    assert!(again.stderr.contains("is pending"), "{}", again.stderr);
    let stranger = release(&f.adapter.addr, &id, "someone-else");
    assert!(
        stranger.stderr.contains("only its creator may release it"),
        "{}",
        stranger.stderr
    );
    // The other member is released as usual.
    let r = release(&free.addr, sim["id"].as_str().unwrap(), &owner);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(simres_held(&free.addr).is_empty());

    cluster.restart_controller().unwrap();
    nothing_left_after_recovery(&cluster, &f.adapter, None);
    let mut seen = Vec::new();
    collect_until(&mut sub, &mut seen, "the release", |s| {
        res_states(s, &id).last().map(String::as_str) == Some("released")
    })
    .await;
    let states = res_states(&seen, &id);
    assert_eq!(
        &states[states.len() - 2..],
        ["releasing", "released"],
        "{states:?}"
    );

    // Adapter and controller both killed while a reservation is held; both restarted.
    let (slurm, sim) = coallocated();
    let id = slurm["id"].as_str().unwrap().to_string();
    assert!(
        wait_until(Duration::from_secs(30), || saved_in_state(&cluster, &id)),
        "slurmctld never saved reservation {id}"
    );
    f.adapter.kill();
    cluster.kill_controller();
    cluster.restart_controller().unwrap();
    assert_eq!(cluster.reservations().unwrap().len(), 1);
    f.adapter = Proc::role("slurm", &f.directory, &f.adapter_cfg);
    no_reservation_left(&cluster);
    let r = release(&free.addr, sim["id"].as_str().unwrap(), &owner);
    assert_eq!(r.code, 0, "{}", r.stderr);
    drop(f);
}

/// `key=value` of `scontrol show job -o` (the job's one line).
fn job_field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// A coallocation file of a 2-CPU job (only Slurm's node can hold it) and a 1-CPU job that
/// must start within epsilon of it (on simres), each with what it runs.
fn set_file(dir: &Path, start_in_s: i64, epsilon_s: i64, out: &Path) -> String {
    run_file(
        dir,
        "set",
        &format!(
            "start_in_s = {start_in_s}\nwindow_s = 600\nepsilon_s = {epsilon_s}\n\
             [[job]]\nname = \"wide\"\ncpus = 2\nreference_time_s = 120\n\
             command = \"date +%s > {}\"\n\
             [[job]]\nname = \"narrow\"\ncpus = 1\nreference_time_s = 120\ncommand = \"true\"\n",
            out.display()
        ),
    )
}

/// The arguments of `gma broker coallocate --submit` of coallocation file `set` at `broker`.
fn submit_args<'a>(set: &'a str, broker: &'a str) -> Vec<&'a str> {
    vec![
        "broker",
        "coallocate",
        "--jobs",
        set,
        "--broker",
        broker,
        "--submit",
    ]
}

/// A directory, the Slurm adapter and a broker (`fabric`) plus a `gma simres` with one free
/// 1-CPU resource, both registered.
fn fabric_and_simres(cluster: &Cluster, tmp: &Path) -> (Fabric, Proc) {
    let f = fabric(cluster);
    let free = simres(
        tmp,
        "free",
        &f.directory,
        "[[resource]]\nname = \"simA\"\ncpus = 1\n",
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            search_ids(&f.directory, "reservation.state").is_some_and(|v| v.len() == 2)
        }),
        "simres never registered: {}",
        free.stderr_text()
    );
    (f, free)
}

/// `gma broker coallocate --submit` across Slurm and simres: both jobs start in their
/// reservations within epsilon; the output gives each job's actual start (Slurm's StartTime
/// for the Slurm job, which really ran) and the spread. After the jobs end nothing is
/// reserved anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coallocate_submit_starts_every_job_of_the_set_within_epsilon() {
    let Some(cluster) = cluster_or_skip("coallocate_submit_starts_every_job_of_the_set_within_epsilon")
    else {
        return;
    };
    let tmp = tempdir();
    let (f, free) = fabric_and_simres(&cluster, tmp.path());
    let mut sub = subscribe(&f.directory, &["job.batch", "broker.decision"]);
    let ran = cluster.job_dir().join("wide.ran");
    let set = set_file(tmp.path(), 0, 60, &ran);
    let mut args = submit_args(&set, &f.broker.addr);
    args.extend(["--output", "json"]);
    let r = gma(&args, Duration::from_secs(300));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    println!("{}", r.stdout);
    let out: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        (out["success"].as_bool(), out["stage"].as_str()),
        (Some(true), Some("started")),
        "{out}"
    );
    let res = out["reservations"].as_array().unwrap();
    let member = |name: &str| res.iter().find(|x| x["job"] == name).cloned().unwrap();
    let (wide, narrow) = (member("wide"), member("narrow"));
    assert_eq!(wide["resource"], cluster.node.as_str(), "{out}");
    assert_eq!(narrow["resource"], "simA", "{out}");
    let start = |m: &serde_json::Value| m["batch"]["start_s"].as_i64().unwrap();
    let (ws, ns) = (start(&wide), start(&narrow));
    assert!(ws > 0 && ns > 0, "{out}");
    let spread = out["spread_s"].as_i64().unwrap();
    assert_eq!(spread, (ws - ns).abs(), "{out}");
    assert!(spread <= 60, "{out}");
    // simres starts its job exactly at the reserved start.
    assert_eq!(ns, narrow["start_s"].as_i64().unwrap(), "{out}");
    // The Slurm job's start is Slurm's StartTime, and the job really ran then.
    let job_id = wide["batch"]["job_id"].as_str().unwrap().to_string();
    let show = cluster.cmd("scontrol", &["show", "job", "-o", &job_id]).unwrap();
    let slurm_start = job_field(&show, "StartTime")
        .and_then(|t| gma_core::time::parse_rfc3339(&format!("{t}Z")))
        .flatten()
        .map(|ns| ns / 1_000_000_000);
    assert_eq!(slurm_start, Some(ws), "{show}");
    assert!(
        wait_until(Duration::from_secs(60), || std::fs::read_to_string(&ran)
            .is_ok_and(|t| t.trim().parse::<i64>().is_ok_and(|s| s >= ws))),
        "the Slurm job never ran: {show}"
    );
    // The lifecycle from both managers, and the decision.
    let mut seen = Vec::new();
    collect_until(&mut sub, &mut seen, "both jobs running and the decision", |s| {
        // A short Slurm job may be read pending, then completed (never seen running).
        job_states(s, "wide")
            .iter()
            .any(|x| x == "running" || x == "completed")
            && job_states(s, "narrow").iter().any(|x| x == "running")
            && s.iter().any(|e| e.name == "broker.decision")
    })
    .await;
    let decision = seen.iter().find(|e| e.name == "broker.decision").unwrap();
    assert_eq!(
        decision.text["outcome"],
        format!("started (spread {spread} s)"),
        "{decision:?}"
    );
    // The Slurm job ends, and its reservation with it; the simres one is released on request.
    no_reservation_left(&cluster);
    let r = release(
        &free.addr,
        narrow["id"].as_str().unwrap(),
        narrow["owner"].as_str().unwrap(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(simres_held(&free.addr).is_empty());

    // Again, as a table: each job's reserved and actual start, its batch job, and the spread.
    let r = gma(&submit_args(&set, &f.broker.addr), Duration::from_secs(300));
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    println!("{}", r.stdout);
    let first = r.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("started 2 jobs, spread ") && first.ends_with(" s (epsilon 60 s):"),
        "{}",
        r.stdout
    );
    for name in ["wide", "narrow"] {
        let line = r
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}: {}", r.stdout));
        assert!(
            line.contains(" reserved 20") && line.contains(" started 20"),
            "{line}"
        );
    }
    no_reservation_left(&cluster);
    for held in simres_held(&free.addr) {
        let r = release(
            &free.addr,
            held["id"].as_str().unwrap(),
            held["owner"].as_str().unwrap(),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    drop(f);
}

/// What dies after the set is reserved and claimed, before it starts.
#[derive(Clone, Copy, PartialEq)]
enum Dies {
    Slurmctld,
    Adapter,
}

/// Starts a Slurm + simres set 20 s ahead (epsilon 5 s), kills `dies` (-9) once Slurm holds
/// the claimed job (pending until the reservation starts), and checks the failure is clear and
/// nothing is left once what died is back.
async fn killed_before_the_set_starts(test: &str, dies: Dies) {
    let Some(mut cluster) = cluster_or_skip(test) else {
        return;
    };
    let tmp = tempdir();
    let (mut f, free) = fabric_and_simres(&cluster, tmp.path());
    let mut sub = subscribe(&f.directory, &["job.batch"]);
    let set = set_file(tmp.path(), 20, 5, &cluster.job_dir().join("wide.ran"));
    let mut co = Proc::start(&submit_args(&set, &f.broker.addr), "");
    // Both claimed (in job order: once simres has the second, the broker has the first's answer).
    let mut seen = Vec::new();
    collect_until(&mut sub, &mut seen, "both jobs pending", |s| {
        job_states(s, "wide").iter().any(|x| x == "pending")
            && job_states(s, "narrow").iter().any(|x| x == "pending")
    })
    .await;
    let job_id = seen
        .iter()
        .find(|e| e.name == "job.batch" && e.text["name"] == "wide")
        .map(|e| e.text["job"].clone())
        .unwrap();
    match dies {
        Dies::Slurmctld => cluster.kill_controller(),
        Dies::Adapter => f.adapter.kill(),
    }
    let mut code = None;
    assert!(
        wait_until(Duration::from_secs(240), || {
            code = co.child.try_wait().unwrap().map(|s| s.code().unwrap_or(-1));
            code.is_some()
        }),
        "gma broker coallocate --submit never ended: {}",
        co.stderr_text()
    );
    wait_until(Duration::from_secs(5), || !co.stdout_lines().is_empty());
    let text = co.stdout_lines().join("\n");
    println!("{text}");
    assert_eq!(code, Some(3), "{text}\n{}", co.stderr_text());
    assert!(
        text.starts_with("not started (start): wide had not started")
            && text.contains("releases not confirmed yet"),
        "{text}"
    );
    assert!(simres_held(&free.addr).is_empty());
    let mut narrow = Vec::new();
    collect_until(&mut sub, &mut narrow, "the simres job cancelled", |s| {
        job_states(s, "narrow").iter().any(|x| x == "cancelled")
    })
    .await;
    assert!(
        job_states(&narrow, "narrow").contains(&"running".to_string()),
        "{narrow:?}"
    );
    // Slurm still holds the reservation (and the pending job) until what died is back.
    match dies {
        Dies::Slurmctld => assert!(cluster.reservations().is_err(), "slurmctld answers"),
        Dies::Adapter => assert_eq!(cluster.reservations().unwrap().len(), 1),
    }
    match dies {
        Dies::Slurmctld => cluster.restart_controller().unwrap(),
        Dies::Adapter => f.adapter = Proc::role("slurm", &f.directory, &f.adapter_cfg),
    }
    nothing_left_after_recovery(&cluster, &f.adapter, Some(&job_id));
    drop(f);
}

/// slurmctld killed (-9) after the set is reserved and claimed, before it starts: the simres
/// job starts at the reserved start, the Slurm job cannot, so the set is reported not started
/// (exit status 3, stage `start`, naming the job that did not start) and everything is
/// released — at simres at once, at Slurm once slurmctld is back on the same state directory
/// (the adapter keeps the release and retries it): Slurm then holds no reservation and no job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slurmctld_killed_before_the_set_starts_is_a_clear_failure_that_leaks_nothing() {
    killed_before_the_set_starts(
        "a_slurmctld_killed_before_the_set_starts_is_a_clear_failure_that_leaks_nothing",
        Dies::Slurmctld,
    )
    .await;
}

/// The Slurm adapter killed (-9) after the set is reserved and claimed, before it starts: the
/// same clear failure; Slurm keeps the reservation and the pending job until the adapter is
/// restarted (same source), which cancels the job that nobody follows any more and deletes the
/// reservation its earlier run left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_killed_before_the_set_starts_is_a_clear_failure_that_leaks_nothing() {
    killed_before_the_set_starts(
        "an_adapter_killed_before_the_set_starts_is_a_clear_failure_that_leaks_nothing",
        Dies::Adapter,
    )
    .await;
}
