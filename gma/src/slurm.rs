//! `gma slurm` (the Slurm adapter role: the `Reservations` interface over a real Slurm
//! controller, docs/slurm.md) and `gma job submit --broker` (the broker runs a job: rank,
//! reserve, claim, follow to its end).

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use clap::Args;
use gma_broker::slurm::SlurmConfig;
use gma_proto::v1 as pb;
use serde_json::json;

use crate::args::{Output, RoleArgs};
use crate::serve::{bind_checked, shutdown_signal};

#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("Listen address of the adapter's Reservations service (overrides `listen` in --config; default 127.0.0.1:7410)")))]
#[command(mut_arg("directory", |a| a.help("Register in this directory, ADDR[,ADDR...], as a producer of reservation.state and job.batch (overrides `directory` in --config)")))]
#[command(mut_arg("config", |a| a.help("TOML config: slurm_conf, nodes, user, software, job_dir ... (docs/slurm.md); without one the defaults apply (Slurm's own slurm.conf, every node)")))]
pub struct SlurmArgs {
    /// The slurm.conf of the cluster (overrides the config; default: Slurm's own).
    #[arg(long)]
    pub slurm_conf: Option<PathBuf>,
    #[command(flatten)]
    pub role: RoleArgs,
}

pub async fn run(a: SlurmArgs) -> anyhow::Result<()> {
    let mut cfg: SlurmConfig = a.role.load()?;
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    if a.slurm_conf.is_some() {
        cfg.slurm_conf = a.slurm_conf;
    }
    cfg.validate().map_err(|e| anyhow!("invalid slurm config: {e}"))?;
    crate::telemetry::serve_endpoint_metrics("slurm", &cfg.endpoint).await?;
    let listener = bind_checked(
        cfg.listen.as_deref().unwrap_or("127.0.0.1:7410"),
        &cfg.endpoint.tls,
    )
    .await?;
    let addr = listener.local_addr()?;
    // Printed once the adapter has read Slurm's nodes (it fails before that if it cannot).
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        if ready_rx.await.is_ok() {
            eprintln!("gma slurm listening on {addr}");
        }
    });
    gma_broker::slurm::run_notify(cfg, listener, shutdown_signal(), ready_tx)
        .await
        .map_err(|e| anyhow!("slurm adapter failed: {e}"))
}

fn update_json(u: &pb::RunJobUpdate) -> serde_json::Value {
    let job = u.job.clone().unwrap_or_default();
    let res = u.reservation.clone().unwrap_or_default();
    json!({
        "stage": u.stage, "resource": u.resource, "manager": u.manager, "message": u.message,
        "reservation": res.id, "start_s": res.start_s, "end_s": res.end_s,
        "job_id": job.job_id, "state": job.state, "exit_code": job.exit_code, "signal": job.signal,
        "reason": job.reason, "output": job.output, "decision_id": u.decision_id,
    })
}

/// `gma job submit --job FILE --broker ADDR`: runs the job through the broker and follows it
/// to its end; fails (exit 1) unless it completed with exit code 0.
pub async fn submit_via_broker(job: &std::path::Path, broker: &str, output: Output) -> anyhow::Result<()> {
    let req = gma_broker::jobrun::load_run_file(job).map_err(|e| anyhow!("{e}"))?;
    let mut c = crate::broker::client(broker).await?;
    let explain =
        |s: tonic::Status| anyhow!("broker {broker}: {} ({:?})", gma_core::tls::explain(&s), s.code());
    let mut stream = c.run_job(req).await.map_err(explain)?.into_inner();
    let mut last: Option<pb::RunJobUpdate> = None;
    loop {
        match stream.message().await {
            Ok(Some(u)) => {
                match output {
                    Output::Json => println!("{}", update_json(&u)),
                    Output::Table => {
                        let job = u
                            .job
                            .as_ref()
                            .map_or(String::new(), |j| format!(" job {}", j.job_id));
                        println!("{:<10} {}{} {}", u.stage, u.resource, job, u.message);
                    }
                }
                last = Some(u);
            }
            Ok(None) => break,
            Err(s) => return Err(explain(s)),
        }
    }
    let Some(u) = last else {
        bail!("broker {broker} ended the run without a word");
    };
    let job = u.job.unwrap_or_default();
    if !job.done {
        bail!(
            "broker {broker} ended the run before the job did (last stage {})",
            u.stage
        );
    }
    if output == Output::Table {
        println!(
            "job {} on {}: {}, exit code {}{}",
            job.job_id,
            u.resource,
            job.state,
            job.exit_code,
            if job.output.is_empty() {
                String::new()
            } else {
                format!(" (output {})", job.output)
            }
        );
    }
    if job.state != "completed" || job.exit_code != 0 {
        bail!(
            "job {} {} with exit code {} ({})",
            job.job_id,
            job.state,
            job.exit_code,
            job.reason
        );
    }
    Ok(())
}
