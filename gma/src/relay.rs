//! `gma relay`: the arguments of the relay and the call of the role (the gma-relay crate;
//! docs/relay.md).

use anyhow::Context;
use clap::Args;
use gma_relay::RelayConfig;

use crate::args::{require_directory, RoleArgs};
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("Listen address of the relay's own producer (overrides `listen` in --config; default 127.0.0.1:0, any free port)")))]
#[command(mut_arg("directory", |a| a.help("Directory address(es) to discover producers and register with, ADDR[,ADDR...] (overrides `directory` in --config)")))]
#[command(mut_arg("config", |a| a.required(true).help("TOML config: site (required), period_ms, stale_ms, relay, sources, id, buffer_events, lease_ttl_ms, listen, directory, policy, [tls], [limits] (see config/relay.toml)")))]
pub struct RelayArgs {
    #[command(flatten)]
    pub role: RoleArgs,
}

/// `gma relay`.
pub async fn run(a: RelayArgs) -> anyhow::Result<()> {
    let path = a
        .role
        .config_file("the site and the sources", "config/relay.toml")?;
    let mut cfg: RelayConfig = gma_core::config::load_toml(path)?;
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    cfg.validate()
        .with_context(|| format!("invalid config file {}", path.display()))?;
    require_directory(&cfg.registration.directory)?;
    let listen = cfg.listen.clone().unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = open_endpoint("relay", &listen, &cfg.endpoint).await?;
    Ok(gma_relay::run(cfg, listener, shutdown_signal()).await?)
}
