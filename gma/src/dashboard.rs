//! `gma dashboard`: the live web dashboard (a real-time consumer; see docs/dashboard.md).

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use gma_dashboard::DashboardConfig;

use crate::roles::{apply_security, bind_checked, shutdown_signal};

#[derive(Args, Debug)]
pub struct DashboardArgs {
    /// HTTP listen address of the page (default 127.0.0.1:7500, or `listen` in --config).
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory address(es), ADDR[,ADDR...].
    #[arg(long)]
    pub directory: Option<String>,
    /// An archiver's address: enables the history panel.
    #[arg(long)]
    pub archiver: Option<String>,
    /// TOML config (listen, directory, archiver, patterns, cluster_poll_ms, history_points,
    /// broadcast_capacity, metrics_listen, [tls], [limits]).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: crate::cli::MetricsArgs,
}

pub async fn run(a: DashboardArgs) -> anyhow::Result<()> {
    let mut cfg: DashboardConfig = match &a.config {
        Some(p) => gma_core::config::load_toml(p)?,
        None => DashboardConfig::default(),
    };
    if let Some(l) = a.listen {
        cfg.listen = l;
    }
    if a.directory.is_some() {
        cfg.directory = a.directory;
    }
    if a.archiver.is_some() {
        cfg.archiver = a.archiver;
    }
    if a.metrics.metrics_listen.is_some() {
        cfg.metrics_listen = a.metrics.metrics_listen;
    }
    let mut no_policy = None;
    apply_security(&mut cfg.tls, &mut no_policy)?;
    cfg.validate().map_err(|e| anyhow!("{e}"))?;
    // The dashboard always serves /metrics on its own port; --metrics-listen adds another.
    let handle = crate::telemetry::recorder()?;
    if let Some(m) = &cfg.metrics_listen {
        crate::telemetry::serve_metrics("dashboard", m, cfg.tls.allow_plaintext).await?;
    }
    let listener = bind_checked(&cfg.listen, &cfg.tls).await?;
    let bound = listener.local_addr()?;
    let scheme = if cfg.tls.cert.is_some() { "https" } else { "http" };
    if scheme == "http" {
        crate::telemetry::check_plain_http("the dashboard", bound, cfg.tls.allow_plaintext)?;
    }
    eprintln!("gma dashboard listening on {bound}");
    eprintln!("gma dashboard url {scheme}://{bound}/");
    gma_dashboard::run(cfg, listener, shutdown_signal(), Some(handle))
        .await
        .map_err(|e| anyhow!("dashboard failed: {e}"))
}
