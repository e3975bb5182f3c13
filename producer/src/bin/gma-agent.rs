//! `gma-agent`: the host agent alone — `gma producer` without the other roles in the same
//! executable (no archiver, Arrow/Parquet, broker, dashboard, directory or openraft code), for a
//! smaller resident set on every host. Same flags, config, start-up and behaviour as `gma
//! producer` (registers, serves, sensors, control, resume ring; gma_producer::cli), on a
//! current-thread runtime (an agent's load is a few events per second), with one default of its
//! own: the resume ring is bounded to 512 KiB (`buffer_bytes`, gma_producer::cli::
//! AGENT_BUFFER_BYTES) unless configured. The Prometheus endpoints (`--metrics-listen`,
//! `--prometheus`) are served by `gma producer` only: they are refused here. The Debian package
//! ships it as /usr/bin/gma-agent, run by gma-agent.service (docs/packaging.md).

use anyhow::bail;
use clap::Parser;
use gma_core::cli::{catch_shutdown_signals, set_security, ClientTlsArgs, GLOBAL_HEADING};
use gma_producer::cli::{agent_config, open, serve, ProducerArgs};

/// The GMA host agent: a producer with this host's sensors (the flags of `gma producer`).
#[derive(Parser, Debug)]
#[command(name = "gma-agent", version)]
struct Cli {
    /// Log filter: a level and levels per target, e.g. "info" or "warn,gma_producer=debug".
    #[arg(long, env = "GMA_LOG", default_value = "warn", help_heading = GLOBAL_HEADING)]
    log: String,
    #[command(flatten)]
    tls: ClientTlsArgs,
    #[command(flatten)]
    producer: ProducerArgs,
}

fn main() {
    let cli = Cli::parse();
    gma_producer::cli::init_logging(&cli.log);
    if let Err(e) = run(cli) {
        gma_core::cli::exit_with(&e);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    gma_core::tls::install_client_if_unset(&cli.tls.client())?;
    {
        let _entered = rt.enter();
        catch_shutdown_signals()?;
    }
    let endpoint = &cli.producer.role.endpoint;
    set_security(cli.tls.server(endpoint), endpoint.access_policy.clone());
    // The ring bounded in bytes by default (AGENT_BUFFER_BYTES): the agent's memory at steady
    // state is its base plus that bound.
    let cfg = agent_config(&cli.producer)?;
    if let Some(m) = &cfg.endpoint.metrics_listen {
        bail!("gma-agent serves no Prometheus metrics ({m}): leave out --metrics-listen (and metrics_listen in --config), or run `gma producer`");
    }
    if let Some(p) = &cfg.prometheus {
        bail!("gma-agent serves no Prometheus endpoint ({p}): leave out --prometheus (and prometheus in --config), or run `gma producer`");
    }
    let result = rt.block_on(async { serve(open(cfg).await?).await });
    // Streams may still be parked; do not wait for them.
    rt.shutdown_background();
    result
}
