//! `gma relay`: the arguments of the relay and the call of the role (the gma-relay crate;
//! docs/relay.md).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use gma_relay::RelayConfig;

use crate::serve::{apply_endpoint, bind_checked, shutdown_signal};

#[derive(Args, Debug)]
pub struct RelayArgs {
    /// Directory address(es) to discover producers and register with, ADDR[,ADDR...].
    #[arg(long)]
    pub directory: Option<String>,
    /// Listen address of the relay's own producer (default 127.0.0.1:0: any free port).
    #[arg(long)]
    pub listen: Option<String>,
    /// TOML config: site (required), period_ms, stale_ms, relay, sources, id, buffer_events,
    /// lease_ttl_ms, listen, directory, policy, [tls], [limits] (see config/relay.toml).
    #[arg(long)]
    pub config: PathBuf,
    #[command(flatten)]
    pub metrics: crate::args::MetricsArgs,
    #[command(flatten)]
    pub server: crate::args::ServerArgs,
}

fn load_config(a: &RelayArgs) -> anyhow::Result<RelayConfig> {
    let mut cfg: RelayConfig = gma_core::config::load_toml(&a.config)?;
    if a.listen.is_some() {
        cfg.listen = a.listen.clone();
    }
    if a.directory.is_some() {
        cfg.directory = a.directory.clone();
    }
    cfg.validate()
        .with_context(|| format!("invalid config file {}", a.config.display()))?;
    Ok(cfg)
}

/// `gma relay`.
pub async fn run(a: RelayArgs) -> anyhow::Result<()> {
    let mut cfg = load_config(&a)?;
    apply_endpoint(&mut cfg.endpoint, a.metrics.metrics_listen.clone())?;
    if cfg.directory.is_none() {
        bail!("give the directory with --directory ADDR (or directory in --config)");
    }
    crate::telemetry::serve_endpoint_metrics("relay", &cfg.endpoint).await?;
    let listen = cfg.listen.clone().unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = bind_checked(&listen, &cfg.endpoint.tls).await?;
    eprintln!("gma relay listening on {}", listener.local_addr()?);
    Ok(gma_relay::run(cfg, listener, shutdown_signal()).await?)
}
