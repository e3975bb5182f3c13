//! The agent's command line and start-up, shared by `gma producer` and the agent-only
//! executable `gma-agent` (src/bin/gma-agent.rs): the same flags ([`ProducerArgs`], with the
//! serving flags of `gma_core::cli`), the same config ([`producer_config`]) and the same start
//! ([`open`], then [`serve`]: bind, build the producer, say where it listens, run until SIGTERM
//! or Ctrl-C, say what it published).

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use gma_core::cli::{bind_checked, shutdown_signal, RoleArgs};

use crate::{Producer, ProducerConfig};

#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("Listen address (overrides `listen` in --config; default 127.0.0.1:7001 without --config)")))]
#[command(mut_arg("directory", |a| a.help("Directory address(es) to register with, ADDR[,ADDR...] (overrides `directory` in --config; omit to run standalone)")))]
#[command(mut_arg("config", |a| a.help("TOML config file (keys as in ProducerConfig: listen, directory, period_ms, ...)")))]
pub struct ProducerArgs {
    /// Source name for this host's events (default: host name).
    #[arg(long)]
    pub source: Option<String>,
    /// Host sensor sample period in milliseconds (default 1000).
    #[arg(long)]
    pub period_ms: Option<u64>,
    /// Directory lease TTL in milliseconds (default 10000).
    #[arg(long)]
    pub lease_ttl_ms: Option<u64>,
    /// Events kept for resuming consumers (default 100000).
    #[arg(long)]
    pub buffer_events: Option<usize>,
    /// Bytes those events may take at most, slots and values (`buffer_bytes` in --config;
    /// default: bounded by --buffer-events only, in gma-agent 512 KiB; docs/producer.md).
    #[arg(long)]
    pub buffer_bytes: Option<usize>,
    /// Simulated hosts, from a TOML file (see docs/simulation.md).
    #[arg(long)]
    pub simulate: Option<PathBuf>,
    /// Do not run the real host sensors (e.g. a simulation-only producer).
    #[arg(long)]
    pub no_host_sensors: bool,
    /// Record id in the directory (default: <source>@<address>).
    #[arg(long)]
    pub id: Option<String>,
    /// Keep the control changes (`gma agent set|enable|disable|watch`) in DIR/control.json
    /// across restarts (docs/control.md).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Keep the agent's own CPU within this percent of one CPU by slowing its costliest
    /// sensors (gma.budget events; docs/control.md).
    #[arg(long)]
    pub cpu_budget_pct: Option<f64>,
    /// How often the CPU budget is checked, ms (default 10000).
    #[arg(long)]
    pub budget_check_ms: Option<u64>,
    /// Serve the latest sensor values as Prometheus gauges at /metrics on this address
    /// (gma_host_cpu_user{source="hostA"}, ...; see docs/dashboard.md).
    #[arg(long)]
    pub prometheus: Option<String>,
    /// Accept OpenTelemetry metrics (OTLP/gRPC) on this address, behind the producer's TLS and
    /// access policy (`otlp_listen` in --config; docs/otlp.md).
    #[arg(long)]
    pub otlp_listen: Option<String>,
    #[command(flatten)]
    pub role: RoleArgs,
}

/// The config of a producer started with these flags: the --config file (or the defaults with
/// `listen` 127.0.0.1:7001), the flags laid over it.
pub fn producer_config(a: &ProducerArgs) -> anyhow::Result<ProducerConfig> {
    let mut cfg: ProducerConfig = a.role.load()?;
    if a.role.config.is_none() {
        cfg.listen = "127.0.0.1:7001".into();
    }
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    if a.source.is_some() {
        cfg.source = a.source.clone();
    }
    if let Some(v) = a.period_ms {
        cfg.period_ms = v;
    }
    if let Some(v) = a.lease_ttl_ms {
        cfg.registration.lease_ttl_ms = v;
    }
    if let Some(v) = a.buffer_events {
        cfg.buffer_events = v;
    }
    if a.buffer_bytes.is_some() {
        cfg.buffer_bytes = a.buffer_bytes;
    }
    if a.simulate.is_some() {
        cfg.simulate = a.simulate.clone();
    }
    if a.no_host_sensors {
        cfg.host_sensors = false;
    }
    if a.id.is_some() {
        cfg.registration.id = a.id.clone();
    }
    if a.prometheus.is_some() {
        cfg.prometheus = a.prometheus.clone();
    }
    if a.otlp_listen.is_some() {
        cfg.otlp_listen = a.otlp_listen.clone();
    }
    if a.state_dir.is_some() {
        cfg.state_dir = a.state_dir.clone();
    }
    if a.cpu_budget_pct.is_some() {
        cfg.cpu_budget_pct = a.cpu_budget_pct;
    }
    if let Some(v) = a.budget_check_ms {
        cfg.budget_check_ms = v;
    }
    Ok(cfg)
}

/// The ring's byte bound of the agent-only executable `gma-agent` when neither `buffer_bytes`
/// nor `--buffer-bytes` sets one: 512 KiB held 2,955 host-sensor events when measured, about
/// 4.4 minutes of resume at an agent's 11 events per second, and keeps the agent within 8 MiB
/// resident at steady state with a subscriber (1 MiB did not: docs/PERFORMANCE.md, "The agent
/// at steady state"). `gma producer` keeps no byte bound by default: it also serves
/// simulations and relays sized in events.
pub const AGENT_BUFFER_BYTES: usize = 512 << 10;

/// The config of `gma-agent` started with these flags: [`producer_config`], its ring bounded
/// by [`AGENT_BUFFER_BYTES`] unless the config or the flags give `buffer_bytes`.
pub fn agent_config(a: &ProducerArgs) -> anyhow::Result<ProducerConfig> {
    let mut cfg = producer_config(a)?;
    cfg.buffer_bytes.get_or_insert(AGENT_BUFFER_BYTES);
    Ok(cfg)
}

/// A producer bound and built, not yet serving: the caller may serve more beside it (`gma
/// producer`'s Prometheus endpoints, from [`Opened::hub`]) before [`serve`].
pub struct Opened {
    pub producer: Producer,
    pub listener: tokio::net::TcpListener,
}

/// Binds the producer's listener (and `otlp_listen`'s; plaintext refused off loopback without
/// `allow_plaintext`) and builds the producer of `cfg`.
pub async fn open(cfg: ProducerConfig) -> anyhow::Result<Opened> {
    let listener = bind_checked(&cfg.listen, &cfg.endpoint.tls).await?;
    let otlp = match &cfg.otlp_listen {
        Some(addr) => Some(bind_checked(addr, &cfg.endpoint.tls).await?),
        None => None,
    };
    let mut producer = Producer::new(cfg).map_err(|e| anyhow!("{e}"))?;
    if let Some(l) = otlp {
        eprintln!("gma producer otlp on {}", l.local_addr()?);
        producer = producer.with_otlp(l);
    }
    Ok(Opened { producer, listener })
}

impl Opened {
    pub fn hub(&self) -> std::sync::Arc<crate::Hub> {
        self.producer.hub.clone()
    }
}

/// Runs the producer until SIGTERM or Ctrl-C ([`shutdown_signal`]), with the lines on stderr
/// that tools read (`gma bench`, the tests): `gma producer run: epoch E`, `gma producer
/// listening on ADDR`, and at the end `gma producer stopped: epoch E last seq N`.
pub async fn serve(o: Opened) -> anyhow::Result<()> {
    let Opened {
        producer: p,
        listener,
    } = o;
    // The run (epoch) this process publishes, for whoever accounts for it by seq (gma bench
    // scale): a run killed with SIGKILL never prints its stop line.
    eprintln!("gma producer run: epoch {}", p.hub.epoch());
    eprintln!("gma producer listening on {}", listener.local_addr()?);
    let hub = p.hub.clone();
    p.run(listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("producer failed: {e}"))?;
    // What this run published, for whoever accounts for it (gma bench scale).
    eprintln!(
        "gma producer stopped: epoch {} last seq {}",
        hub.epoch(),
        hub.lock().head().saturating_sub(1)
    );
    Ok(())
}

/// Logs to stderr with `filter` (a level, and levels per target: `info`,
/// `warn,gma_producer=debug`; tracing-subscriber's `Targets` syntax; when it does not parse,
/// says so on stderr and logs at `warn`): the logging of `gma` and `gma-agent`. Not `EnvFilter`: its span and field
/// directives bring the regex engines, 180 KB of code in every agent (docs/PERFORMANCE.md).
pub fn init_logging(filter: &str) {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let targets: Targets = filter.parse().unwrap_or_else(|e| {
        eprintln!(
            "--log {filter:?} is not a log filter ({e}): logging at warn; give a level (error, warn, info, debug, trace) and target=level pairs, e.g. warn,gma_producer=debug"
        );
        Targets::new().with_default(tracing::Level::WARN)
    });
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(targets)
        .init();
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        producer: ProducerArgs,
    }

    fn flags(args: &[&str]) -> ProducerArgs {
        let argv = std::iter::once("gma-agent").chain(args.iter().copied());
        Flags::try_parse_from(argv)
            .map(|f| f.producer)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_agent_bounds_its_ring_in_bytes_unless_told_otherwise() {
        let none = flags(&[]);
        assert_eq!(
            agent_config(&none).map(|c| c.buffer_bytes).ok(),
            Some(Some(AGENT_BUFFER_BYTES))
        );
        // `gma producer` keeps the events-only bound.
        assert_eq!(producer_config(&none).map(|c| c.buffer_bytes).ok(), Some(None));
        let given = flags(&["--buffer-bytes", "65536"]);
        assert_eq!(
            agent_config(&given).map(|c| c.buffer_bytes).ok(),
            Some(Some(65536))
        );
    }
}
