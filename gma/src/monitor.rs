//! `gma monitor`: the arguments of the action monitor and the call of the role (the
//! gma-monitor crate; semantics in docs/monitor.md).

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use clap::Args;
use gma_monitor::MonitorConfig;

use crate::serve::{apply_endpoint, bind, shutdown_signal};

/// `gma monitor --config FILE [--directory ADDR] [--listen ADDR]`.
#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// TOML config: directory, listen, id, source, policy, [tls], [limits] and [[rule]] tables
    /// (see docs/monitor.md).
    #[arg(long)]
    pub config: PathBuf,
    /// Directory address(es), ADDR[,ADDR...] (overrides `directory` in the config).
    #[arg(long)]
    pub directory: Option<String>,
    /// Listen address of the monitor's own producer, which serves its monitor.firing events
    /// (overrides `listen`; default 127.0.0.1:0).
    #[arg(long)]
    pub listen: Option<String>,
    #[command(flatten)]
    pub metrics: crate::args::MetricsArgs,
    #[command(flatten)]
    pub server: crate::args::ServerArgs,
}

/// `gma monitor`.
pub async fn run(a: MonitorArgs) -> anyhow::Result<()> {
    let mut cfg: MonitorConfig = gma_core::config::load_toml(&a.config)?;
    if a.directory.is_some() {
        cfg.directory = a.directory.clone();
    }
    if a.listen.is_some() {
        cfg.listen = a.listen.clone();
    }
    gma_monitor::validate(&cfg).map_err(|e| anyhow!("invalid config file {}: {e}", a.config.display()))?;
    apply_endpoint(&mut cfg.endpoint, a.metrics.metrics_listen.clone())?;
    if cfg.directory.as_deref().is_none_or(|d| d.trim().is_empty()) {
        bail!("give the directory with --directory ADDR (or directory in --config)");
    }
    crate::telemetry::serve_endpoint_metrics("monitor", &cfg.endpoint).await?;
    let listener = bind(cfg.listen.as_deref().unwrap_or("127.0.0.1:0")).await?;
    eprintln!("gma monitor listening on {}", listener.local_addr()?);
    Ok(gma_monitor::run(cfg, listener, shutdown_signal()).await?)
}
