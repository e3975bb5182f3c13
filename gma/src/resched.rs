//! `gma rescheduler`: run the rescheduler, or evaluate the decision rule alone.

use anyhow::{anyhow, bail};
use gma_rescheduler::service::{decision_str, ReschedulerConfig};
use gma_rescheduler::{decide, Policy};

use clap::{Args, Subcommand};
use std::path::PathBuf;

use crate::args::{MetricsArgs, Output};
use crate::serve::{apply_endpoint, bind_checked, shutdown_signal};

pub async fn run(a: ReschedulerArgs) -> anyhow::Result<()> {
    if let Some(ReschedulerCommand::Evaluate {
        ret_current,
        ret_new,
        cost,
        threshold,
        output,
    }) = a.command
    {
        let policy = Policy {
            cost_s: cost,
            threshold,
            ..Policy::default()
        };
        policy.validate().map_err(|e| anyhow!("{e}"))?;
        if !ret_current.is_finite() || !ret_new.is_finite() || ret_current < 0.0 || ret_new < 0.0 {
            bail!("--ret-current and --ret-new must be finite, non-negative seconds");
        }
        let (gain, decision) = decide(ret_current, ret_new, &policy);
        let g = if gain.is_finite() { Some(gain) } else { None };
        match output {
            Output::Json => println!(
                "{}",
                serde_json::json!({
                    "ret_current_s": ret_current, "ret_new_s": ret_new, "cost_s": cost,
                    "threshold": threshold, "gain": g, "decision": decision_str(decision),
                })
            ),
            Output::Table => println!(
                "gain = ({ret_current} - ({ret_new} + {cost})) / {ret_current} = {}  ->  {} (threshold {threshold}, strict)",
                g.map(|g| format!("{g:.4}")).unwrap_or_else(|| "-inf".into()),
                decision_str(decision)
            ),
        }
        return Ok(());
    }
    let mut cfg: ReschedulerConfig = match &a.config {
        Some(p) => gma_core::config::load_toml(p)?,
        None => ReschedulerConfig::default(),
    };
    if let Some(l) = a.listen {
        cfg.listen = l;
    }
    if a.directory.is_some() {
        cfg.directory = a.directory;
    }
    if cfg.directory.is_none() {
        bail!("give the directory with --directory ADDR (or directory in --config)");
    }
    // --tls-*/--access-policy override [tls]/access_policy; [tls] ca turns on TLS for the directory, the
    // producers followed and the applications' AppControl.
    apply_endpoint(&mut cfg.endpoint, a.metrics.metrics_listen.clone())?;
    crate::telemetry::serve_endpoint_metrics("rescheduler", &cfg.endpoint).await?;
    let listener = bind_checked(&cfg.listen, &cfg.endpoint.tls).await?;
    eprintln!("gma rescheduler listening on {}", listener.local_addr()?);
    gma_rescheduler::service::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("{e}"))
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ReschedulerArgs {
    #[command(subcommand)]
    pub command: Option<ReschedulerCommand>,
    /// Listen address of the rescheduler's own producer (its decision events).
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory address(es).
    #[arg(long)]
    pub directory: Option<String>,
    /// TOML config (cost_s, threshold, max_age_ms, opportunistic, action, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub server: crate::args::ServerArgs,
}

#[derive(Subcommand, Debug)]
pub enum ReschedulerCommand {
    /// The decision rule alone: gain = (ret_current - (ret_new + cost)) / ret_current.
    Evaluate {
        #[arg(long)]
        ret_current: f64,
        #[arg(long)]
        ret_new: f64,
        /// Worst-case rescheduling cost C in seconds.
        #[arg(long, default_value_t = 900.0)]
        cost: f64,
        /// Migrate only if gain > threshold.
        #[arg(long, default_value_t = 0.30)]
        threshold: f64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}
