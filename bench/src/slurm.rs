//! `gma bench slurm`: time from submit to job start, through the broker and with a plain
//! `sbatch`, on the same Slurm cluster in the same run.
//!
//! The cluster is a throw-away single-machine one ([`gma_broker::slurm::cluster::Cluster`]),
//! or an existing one (`--slurm-conf`). The same job (`date +%s.%N` into a file of its own)
//! runs N times one after the other each way: (a) `sbatch` of a script, (b) `RunJob` at a
//! broker (a directory, the Slurm adapter and the broker, each a `gma` process: rank, reserve,
//! `sbatch --reservation`, follow to the end). Submit time is the wall clock just before the
//! `sbatch` call or the `RunJob` call; start time is the job's own timestamp (Slurm's
//! SubmitTime/StartTime have 1 s resolution). Each job ends before the next is submitted, and
//! the i-th submission of either path waits `--gap-ms` (default 1 s) plus a phase that spreads
//! the submissions evenly over one second (the same phases in both paths): on the throw-away
//! cluster a job starts at Slurm's next once-a-second pass, so a submission at a fixed phase
//! of that pass (e.g. the moment the previous job left the queue) would measure the phase, not
//! the path. Slurm's scheduler parameters set how soon it looks at a
//! new job, so the report states them (`scontrol show config`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_proto::v1 as pb;

use crate::args::Output;
use crate::child::spawn;

/// A job must start and end within this.
const JOB_DEADLINE: Duration = Duration::from_secs(120);

fn now_s() -> f64 {
    gma_core::time::now_ns() as f64 / 1e9
}

/// Where the bench runs its jobs: a started cluster (kept alive by `_cluster`) or an existing one.
struct Target {
    conf: PathBuf,
    _cluster: Option<gma_broker::slurm::cluster::Cluster>,
}

fn slurm(conf: &Path, prog: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(prog)
        .args(args)
        .env("SLURM_CONF", conf)
        .output()
        .with_context(|| format!("cannot run {prog}"))?;
    if !out.status.success() {
        bail!(
            "{prog} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `SchedulerType` and `SchedulerParameters` of the cluster (`scontrol show config`).
fn scheduler(conf: &Path) -> anyhow::Result<(String, String)> {
    let text = slurm(conf, "scontrol", &["show", "config"])?;
    let get = |k: &str| {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(key, _)| key.trim() == k)
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    Ok((get("SchedulerType"), get("SchedulerParameters")))
}

/// Waits for the job's timestamp file; the start time in it.
async fn started(file: &Path) -> anyhow::Result<f64> {
    let deadline = Instant::now() + JOB_DEADLINE;
    loop {
        if let Ok(t) = std::fs::read_to_string(file) {
            if let Ok(v) = t.trim().parse::<f64>() {
                return Ok(v);
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "the job writing {} did not start within {JOB_DEADLINE:?}",
                file.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One plain `sbatch` job: (job id, submit-to-start seconds); returns once the job has left
/// the queue.
async fn plain_job(conf: &Path, dir: &Path, i: usize) -> anyhow::Result<(String, f64)> {
    let stamp = dir.join(format!("plain-{i}.start"));
    let script = dir.join(format!("plain-{i}.sh"));
    std::fs::write(&script, format!("#!/bin/sh\ndate +%s.%N > {}\n", stamp.display()))?;
    let t0 = now_s();
    let out = slurm(
        conf,
        "sbatch",
        &[
            "--parsable",
            "--output=/dev/null",
            "--time=1",
            "--job-name=gma-bench-plain",
            &script.display().to_string(),
        ],
    )?;
    let id = out.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() {
        bail!("sbatch printed no job id");
    }
    let start = started(&stamp).await?;
    let deadline = Instant::now() + JOB_DEADLINE;
    while !slurm(conf, "squeue", &["-h", "-j", &id, "-o", "%i"])?
        .trim()
        .is_empty()
    {
        if Instant::now() >= deadline {
            bail!("job {id} did not leave the queue within {JOB_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((id, start - t0))
}

/// One job through the broker: (job id, submit-to-start seconds); returns once the broker
/// reports it done (completed, exit 0, or an error).
async fn broker_job(
    client: &mut pb::broker_client::BrokerClient<tonic::transport::Channel>,
    dir: &Path,
    i: usize,
) -> anyhow::Result<(String, f64)> {
    let stamp = dir.join(format!("broker-{i}.start"));
    let text = format!(
        "name = \"bench-{i}\"\ncpus = 1\nmemory_mb = 100\nwalltime_s = 60\ncommand = \"date +%s.%N > {}\"\n",
        stamp.display()
    );
    let req = gma_broker::jobrun::parse_run_file(&text, "bench", None).map_err(|e| anyhow!("{e}"))?;
    let t0 = now_s();
    let mut stream = client
        .run_job(req)
        .await
        .map_err(|s| anyhow!("RunJob: {}", s.message()))?
        .into_inner();
    let mut last = None;
    while let Some(u) = stream
        .message()
        .await
        .map_err(|s| anyhow!("RunJob job {i}: {}", s.message()))?
    {
        last = Some(u);
    }
    let job = last.and_then(|u| u.job).unwrap_or_default();
    if !job.done || job.state != "completed" || job.exit_code != 0 {
        bail!(
            "broker job {i} ended {} with exit code {} ({})",
            job.state,
            job.exit_code,
            job.reason
        );
    }
    let start = started(&stamp).await?;
    Ok((job.job_id, start - t0))
}

/// p50 / p99 / max / mean of submit-to-start, milliseconds.
fn summary(ids: &[String], secs: &[f64]) -> serde_json::Value {
    // Microseconds, 1 us .. 1 h.
    let mut h =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
    for s in secs {
        h.saturating_record(((s * 1e6) as u64).max(1));
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    serde_json::json!({
        "jobs": secs.len(),
        "job_ids": ids,
        "p50_ms": ms(0.5),
        "p99_ms": ms(0.99),
        "max_ms": h.max() as f64 / 1e3,
        "mean_ms": h.mean() / 1e3,
    })
}

/// Starts a directory, the adapter of the cluster at `conf` and a broker; waits until the
/// adapter is registered. The processes live as long as the returned children.
async fn fabric(
    conf: &Path,
    tmp: &Path,
    job_dir: &Path,
) -> anyhow::Result<(Vec<crate::child::Child>, String)> {
    let data = tmp.join("dir").display().to_string();
    let dir = spawn(
        &["directory", "--listen", "127.0.0.1:0", "--data", &data],
        "gma directory listening on",
    )
    .await?;
    let acfg = tmp.join("adapter.toml");
    std::fs::write(
        &acfg,
        format!(
            "slurm_conf = \"{}\"\njob_dir = \"{}\"\npoll_ms = 100\n",
            conf.display(),
            job_dir.display()
        ),
    )?;
    let adapter = spawn(
        &[
            "slurm",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            &dir.addr,
            "--config",
            &acfg.display().to_string(),
        ],
        "gma slurm listening on",
    )
    .await?;
    let bcfg = tmp.join("broker.toml");
    std::fs::write(
        &bcfg,
        format!("listen = \"127.0.0.1:0\"\ndirectory = \"{}\"\n", dir.addr),
    )?;
    let broker = spawn(
        &["broker", "--config", &bcfg.display().to_string()],
        "gma broker listening on",
    )
    .await?;
    // The broker finds the adapter in the directory: wait for its registration.
    let exe = std::env::current_exe().context("cannot find the gma binary")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last: String;
    loop {
        let out = tokio::process::Command::new(&exe)
            .args([
                "search",
                "job.batch",
                "--directory",
                &dir.addr,
                "--output",
                "json",
            ])
            .output()
            .await?;
        let found = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| {
                v.as_array().map(|a| {
                    a.iter()
                        .any(|p| p["address"].as_str().is_some_and(|x| x.ends_with(&adapter.addr)))
                })
            })
            .unwrap_or(false);
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        if found {
            break;
        }
        if Instant::now() >= deadline {
            bail!("the Slurm adapter at {} did not register in the directory within 30 s (gma search job.batch: {last})", adapter.addr);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let addr = broker.addr.clone();
    Ok((vec![dir, adapter, broker], addr))
}

pub async fn run(
    jobs: usize,
    gap_ms: u64,
    slurm_conf: Option<PathBuf>,
    output: Output,
) -> anyhow::Result<()> {
    if jobs == 0 {
        bail!("--jobs must be positive");
    }
    if gap_ms > 600_000 {
        bail!("--gap-ms must be at most 600000");
    }
    // The i-th submission of either path waits gap + phase(i): the phases spread evenly over a
    // second (golden-ratio steps), the same in both paths, so neither meets Slurm's
    // once-a-second pass at a fixed phase.
    let gap = |i: usize| {
        Duration::from_millis(gap_ms) + Duration::from_secs_f64((i as f64 * 0.618_033_988_749_895).fract())
    };
    let target = match slurm_conf {
        Some(conf) => Target { conf, _cluster: None },
        None => {
            let c = tokio::task::spawn_blocking(gma_broker::slurm::cluster::Cluster::start)
                .await?
                .map_err(|e| anyhow!("cannot start a throw-away Slurm cluster: {e}"))?;
            Target {
                conf: c.conf.clone(),
                _cluster: Some(c),
            }
        }
    };
    let conf = target.conf.clone();
    let (sched_type, sched_params) = scheduler(&conf)?;
    let tmp = tempfile::Builder::new().prefix("gma-bench-slurm-").tempdir()?;
    let job_dir = tmp.path().join("jobs");
    std::fs::create_dir_all(&job_dir)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&job_dir, std::fs::Permissions::from_mode(0o777))?;
    }

    let (mut plain_ids, mut plain) = (Vec::new(), Vec::new());
    for i in 0..jobs {
        tokio::time::sleep(gap(i)).await;
        let (id, s) = plain_job(&conf, &job_dir, i).await?;
        plain_ids.push(id);
        plain.push(s);
    }
    let (_procs, baddr) = fabric(&conf, tmp.path(), &job_dir).await?;
    let mut client = pb::broker_client::BrokerClient::new(gma_consumer::connect(&baddr).await?);
    let (mut broker_ids, mut broker) = (Vec::new(), Vec::new());
    for i in 0..jobs {
        tokio::time::sleep(gap(i)).await;
        let (id, s) = broker_job(&mut client, &job_dir, i).await?;
        broker_ids.push(id);
        broker.push(s);
    }
    let (p, b) = (summary(&plain_ids, &plain), summary(&broker_ids, &broker));
    let diff = |k: &str| b[k].as_f64().unwrap_or(f64::NAN) - p[k].as_f64().unwrap_or(f64::NAN);
    let v = serde_json::json!({
        "scenario": "slurm",
        "jobs": jobs,
        "gap_ms": gap_ms,
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "cluster": if target._cluster.is_some() { "throw-away (started by the bench)" } else { "existing (--slurm-conf)" },
        "scheduler_type": sched_type,
        "scheduler_parameters": sched_params,
        "plain_sbatch": p,
        "broker": b,
        "broker_minus_plain_p50_ms": diff("p50_ms"),
        "broker_minus_plain_p99_ms": diff("p99_ms"),
        "broker_minus_plain_max_ms": diff("max_ms"),
    });
    match output {
        Output::Json => crate::report::emit(v),
        Output::Table => {
            println!(
                "submit -> job start, {jobs} jobs each way, one after the other, {gap_ms} ms + a phase spread over 1 s before each submission ({} build; {sched_type}, SchedulerParameters={sched_params})",
                v["build"].as_str().unwrap_or("")
            );
            println!(
                "{:<14} {:>10} {:>10} {:>10} {:>10}",
                "path", "p50 ms", "p99 ms", "max ms", "mean ms"
            );
            for (name, s) in [("plain sbatch", &p), ("broker", &b)] {
                println!(
                    "{:<14} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                    name,
                    s["p50_ms"].as_f64().unwrap_or(f64::NAN),
                    s["p99_ms"].as_f64().unwrap_or(f64::NAN),
                    s["max_ms"].as_f64().unwrap_or(f64::NAN),
                    s["mean_ms"].as_f64().unwrap_or(f64::NAN)
                );
            }
            println!(
                "broker - plain: p50 {:+.1} ms, p99 {:+.1} ms, max {:+.1} ms",
                diff("p50_ms"),
                diff("p99_ms"),
                diff("max_ms")
            );
        }
    }
    Ok(())
}
