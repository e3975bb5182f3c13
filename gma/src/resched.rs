//! `gma rescheduler`: run the rescheduler, or evaluate the decision rule alone.

use anyhow::{anyhow, bail};
use gma_rescheduler::service::{decision_str, ReschedulerConfig};
use gma_rescheduler::{decide, Policy};

use clap::{Args, Subcommand};

use crate::args::{require_directory, Output, RoleArgs};
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

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
    let mut cfg: ReschedulerConfig = a.role.load()?;
    // --tls-*/--access-policy override [tls]/access_policy; [tls] ca turns on TLS for the
    // directory, the producers followed and the applications' AppControl.
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    require_directory(&cfg.registration.directory)?;
    let listener = open_endpoint("rescheduler", &cfg.listen, &cfg.endpoint).await?;
    gma_rescheduler::service::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("{e}"))
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
#[command(mut_arg("listen", |a| a.help("Listen address of the rescheduler's own producer: its decision events (overrides `listen` in --config; default 127.0.0.1:0, any free port)")))]
#[command(mut_arg("config", |a| a.help("TOML config (cost_s, threshold, max_age_ms, opportunistic, action, ...)")))]
pub struct ReschedulerArgs {
    #[command(subcommand)]
    pub command: Option<ReschedulerCommand>,
    #[command(flatten)]
    pub role: RoleArgs,
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
