//! The rescheduler acts on a real batch job (issue 21, item 4): a throw-away two-node Slurm
//! cluster (`common::slurm`), simulated load for its two nodes (a producer whose hosts are named
//! as the nodes), the rescheduler with the `slurm` action, and `gma app-sim` submitted with
//! `sbatch` to the first node. When the first node is loaded the application's contract is
//! violated; the rescheduler decides MIGRATE and requeues the job onto the second node
//! (`scontrol requeuehold`: Slurm sends SIGTERM, app-sim checkpoints and exits; `scontrol
//! update NodeList=… StartTime=now`, `scontrol release`); the job runs again there and app-sim
//! resumes from its checkpoint, finishing every phase once on the new node.
//!
//! Without Slurm (not installed, not root) the test prints a skip message; under `CI=true` it
//! fails with the reason.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::slurm::nodes_or_skip;
use common::*;

const APP: &str = "slurmapp";
const PHASES: u32 = 30;

/// `key=value` of `scontrol show job -o` (the job's one line).
fn job_field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(str::to_string))
}

#[test]
fn a_violated_contract_requeues_the_slurm_job_onto_the_other_node_where_it_resumes() {
    let Some(cluster) = nodes_or_skip("resched_slurm", 2) else {
        return;
    };
    let (first, second) = (cluster.nodes[0].clone(), cluster.nodes[1].clone());
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    // The nodes' load, simulated under their Slurm names (the rescheduler's hosts are nodes).
    let sim = tmp.path().join("sim.toml");
    let host = |name: &str| format!("[[host]]\nname = \"{name}\"\ncpus = 8\nmemory_mb = 1024\nload = 0.5\n");
    std::fs::write(
        &sim,
        format!("period_ms = 100\n{}{}", host(&first), host(&second)),
    )
    .unwrap();
    let prod = Proc::simulated(&dir.addr, &sim, &[]);
    let cfg = tmp.path().join("r.toml");
    std::fs::write(
        &cfg,
        format!(
            "cost_s = 0.5\nthreshold = 0.3\nmax_age_ms = 2000\n\
             [action]\nkind = \"slurm\"\nslurm_conf = \"{}\"\nrequeue_timeout_s = 60\n",
            cluster.conf.display()
        ),
    )
    .unwrap();
    let resched = Proc::role("rescheduler", &dir.addr, &cfg);
    let dir_addr = dir.addr.clone();
    assert!(
        wait_until(Duration::from_secs(20), || search_ids(
            &dir_addr,
            "resched.decision"
        )
        .is_some_and(|v| v.len() == 1)),
        "the rescheduler never registered: {}",
        resched.stderr_text()
    );

    // app-sim as a batch job on the first node; its output appended across both runs.
    let jobs = cluster.job_dir();
    let script = jobs.join("app.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {} app-sim --app-id {APP} --phases {PHASES} --predicted-s 0.2 \
             --producer {} --checkpoint-dir {} --resume\n",
            gma_bin().display(),
            prod.addr,
            jobs.display()
        ),
    )
    .unwrap();
    let out = jobs.join("app.out");
    let job = cluster
        .cmd(
            "sbatch",
            &[
                "--parsable",
                "--requeue",
                "--open-mode=append",
                "-w",
                &first,
                "-o",
                out.to_str().unwrap(),
                script.to_str().unwrap(),
            ],
        )
        .unwrap()
        .trim()
        .to_string();
    let output = || std::fs::read_to_string(&out).unwrap_or_default();
    // The application's latest app.state.
    let app_state = || {
        let r = gma(
            &[
                "query",
                "app.state",
                "--source",
                APP,
                "--producer",
                &prod.addr,
                "--output",
                "json",
            ],
            Duration::from_secs(10),
        );
        json_lines(&r.stdout).into_iter().next()
    };
    let phase = || {
        app_state()
            .and_then(|e| e["values"]["phase"].as_f64())
            .unwrap_or(0.0) as u64
    };
    assert!(
        wait_until(Duration::from_secs(60), || phase() >= 3),
        "app-sim never got going under Slurm: {}",
        output()
    );
    // The job says where it runs and as which batch job.
    let state = app_state().into_iter().collect::<Vec<_>>();
    assert_eq!(state[0]["values"]["batch_job"], job.as_str(), "{state:?}");
    assert_eq!(state[0]["values"]["hosts"], first.as_str(), "{state:?}");

    // Load the first node: the contract is violated and the job moves.
    let r = gma(
        &["sim", "set", &first, "load=40", "--producer", &prod.addr],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let done = format!("completed {PHASES} phases on {second}");
    assert!(
        wait_until(Duration::from_secs(180), || output().contains(&done)),
        "the job did not finish on {second}: output {}; rescheduler {}",
        output(),
        resched.stderr_text()
    );

    // One requeue: checkpointed on SIGTERM on the first node, resumed there on the second.
    let text = output();
    let checkpointed: u64 = text
        .lines()
        .find_map(|l| l.split("SIGTERM: checkpointed at phase ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no SIGTERM checkpoint in {text}"));
    assert!(checkpointed >= 3, "{text}");
    assert!(
        text.contains(&format!(
            "resumed from checkpoint at phase {checkpointed} on {second}"
        )),
        "{text}"
    );
    assert_eq!(text.matches("SIGTERM: checkpointed").count(), 1, "{text}");
    // The application has printed its last line; Slurm says COMPLETED once the script has
    // exited and the job step is cleaned up (RUNNING, then COMPLETING until then).
    let mut show = String::new();
    assert!(
        wait_until(Duration::from_secs(60), || {
            show = cluster
                .cmd("scontrol", &["show", "job", "-o", &job])
                .unwrap_or_default();
            // The script may still be exiting (RUNNING) or Slurm cleaning up (COMPLETING).
            !matches!(
                job_field(&show, "JobState").as_deref(),
                Some("RUNNING" | "COMPLETING")
            )
        }),
        "{show}"
    );
    assert_eq!(job_field(&show, "Restarts").as_deref(), Some("1"), "{show}");
    assert_eq!(
        job_field(&show, "NodeList").as_deref(),
        Some(second.as_str()),
        "{show}"
    );
    assert_eq!(
        job_field(&show, "JobState").as_deref(),
        Some("COMPLETED"),
        "{show}"
    );
    // Completed: the checkpoint is gone.
    assert!(!jobs.join(format!("{APP}.checkpoint.json")).exists());

    // The decision on record: MIGRATE to the second node.
    let r = gma(
        &[
            "query",
            "resched.decision",
            "--directory",
            &dir.addr,
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    let d = json_lines(&r.stdout);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["values"]["decision"], "MIGRATE");
    assert_eq!(d[0]["values"]["target_hosts"], second.as_str());
}
