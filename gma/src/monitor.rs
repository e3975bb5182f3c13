//! `gma monitor`: the arguments of the action monitor and the call of the role (the
//! gma-monitor crate; semantics in docs/monitor.md).

use anyhow::anyhow;
use clap::Args;
use gma_monitor::MonitorConfig;

use crate::args::{require_directory, RoleArgs};
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

/// `gma monitor --config FILE [--directory ADDR] [--listen ADDR]`.
#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("Listen address of the monitor's own producer, which serves its monitor.firing events (overrides `listen` in --config; default 127.0.0.1:0, any free port)")))]
#[command(mut_arg("config", |a| a.required(true).help("TOML config: directory, listen, id, source, policy, [tls], [limits] and [[rule]] tables (see docs/monitor.md)")))]
pub struct MonitorArgs {
    #[command(flatten)]
    pub role: RoleArgs,
}

/// `gma monitor`.
pub async fn run(a: MonitorArgs) -> anyhow::Result<()> {
    let path = a.role.config_file("the rules", "docs/monitor.md")?;
    let mut cfg: MonitorConfig = gma_core::config::load_toml(path)?;
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    gma_monitor::validate(&cfg).map_err(|e| anyhow!("invalid config file {}: {e}", path.display()))?;
    require_directory(&cfg.registration.directory)?;
    let listen = cfg.listen.clone().unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = open_endpoint("monitor", &listen, &cfg.endpoint).await?;
    Ok(gma_monitor::run(cfg, listener, shutdown_signal()).await?)
}
