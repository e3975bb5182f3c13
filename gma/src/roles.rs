//! Role subcommands: directory, producer, demo.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use gma_directory::DirectoryConfig;
use gma_producer::ProducerConfig;

use clap::Args;

use crate::args::EndpointArgs;
use crate::runtime::{open_endpoint, with_companion};
use crate::serve::{bind, shutdown_signal};

/// Reads a directory config file: `listen` plus the keys of [`DirectoryConfig`].
fn directory_file(path: &Path) -> anyhow::Result<(Option<String>, DirectoryConfig)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let mut table: toml::Table = toml::from_str(&text)
        .map_err(|e| anyhow!("invalid config file {}: {}", path.display(), e.message()))?;
    let listen = match table.remove("listen") {
        Some(toml::Value::String(s)) => Some(s),
        Some(_) => bail!("invalid config file {}: listen must be a string", path.display()),
        None => None,
    };
    let cfg: DirectoryConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| anyhow!("invalid config file {}: {}", path.display(), e.message()))?;
    Ok((listen, cfg))
}

pub async fn directory(a: DirectoryArgs) -> anyhow::Result<()> {
    let (file_listen, mut cfg) = match &a.config {
        Some(p) => {
            let (l, c) = directory_file(p)?;
            (l, Some(c))
        }
        None => (None, None),
    };
    let data = a
        .data
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.data_dir.clone()))
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| anyhow!("give a data directory with --data DIR (or data_dir in --config)"))?;
    let mut config = cfg.take().unwrap_or_else(|| DirectoryConfig::new(data.clone()));
    config.data_dir = data;
    if let Some(id) = a.id {
        config.node_id = id;
    }
    if let Some(p) = &a.peers {
        config.peers = p.clone();
    }
    if a.init {
        config.init = true;
    }
    a.endpoint.apply(&mut config.endpoint)?;
    let listen = a
        .listen
        .or(file_listen)
        .unwrap_or_else(|| "127.0.0.1:7000".into());
    config.validate().map_err(|e| anyhow!("{e}"))?;
    gma_core::guard::load_policy(config.endpoint.access_policy.as_ref()).map_err(|e| anyhow!("{e}"))?;
    let listener = open_endpoint("directory", &listen, &config.endpoint).await?;
    let bound = listener.local_addr()?;
    // gma.rpc: a companion producer publishes this member's RPC figures, registered in this
    // member itself.
    let rpc = gma_core::rpc::RpcStats::new("directory");
    let here = Some(gma_core::addr::advertised(bound));
    let shutdown = with_companion("directory", rpc.clone(), here, bound, &config.endpoint).await?;
    gma_directory::run_with_rpc(config, listener, shutdown, rpc)
        .await
        .map_err(|e| anyhow!("directory failed: {e}"))
}

pub use gma_producer::cli::ProducerArgs;

/// `gma producer`: the start-up of `gma-agent` (gma_producer::cli) plus the Prometheus
/// endpoints (`--metrics-listen`, `--prometheus`).
pub async fn producer(a: ProducerArgs) -> anyhow::Result<()> {
    let cfg = gma_producer::cli::producer_config(&a)?;
    let door = crate::telemetry::MetricsDoor::new(&cfg.endpoint.tls, cfg.endpoint.access_policy.as_ref());
    if let Some(m) = &cfg.endpoint.metrics_listen {
        crate::telemetry::serve_metrics("producer", m, &door).await?;
    }
    let prometheus = cfg.prometheus.clone();
    let opened = gma_producer::cli::open(cfg).await?;
    if let Some(addr) = &prometheus {
        crate::telemetry::serve_producer_values(addr, opened.hub(), &door).await?;
    }
    gma_producer::cli::serve(opened).await
}

/// Waits for one of the demo's roles to stop and says so when it failed.
async fn stopped<E: std::fmt::Display>(what: &str, task: tokio::task::JoinHandle<Result<(), E>>) {
    match task.await {
        Ok(Err(e)) => eprintln!("{what} stopped with an error: {e}"),
        Err(e) => eprintln!("{what} task failed: {e}"),
        Ok(Ok(())) => {}
    }
}

const DEMO_SIM_HEADER: &str = "# Simulated hosts of `gma demo`.\n";

/// Writes the demo's simulation file: a few named hosts with scripted values plus generated ones.
fn demo_sim_file(dir: &Path, hosts: u32) -> anyhow::Result<PathBuf> {
    let path = dir.join("demo-sim.toml");
    let mut text = String::from(DEMO_SIM_HEADER);
    text.push_str(include_str!("../../config/demo-sim.toml"));
    if hosts > 0 {
        text.push_str(&format!(
            "\n[[generate]]\ncount = {hosts}\nprefix = \"sim\"\nseed = 7\ncpus = 8\nmemory_mb = 16384\n"
        ));
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

pub async fn demo(a: DemoArgs) -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("gma-demo-")
        .tempdir()
        .context("cannot create a temp dir")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };

    let dir_listener = bind("127.0.0.1:0").await?;
    let dir_addr = dir_listener.local_addr()?;
    let dir_cfg = DirectoryConfig::new(tmp.path().join("directory"));
    let dir_rpc = gma_core::rpc::RpcStats::new("directory"); // issue 9: gma.rpc
    let dir_task = tokio::spawn(gma_directory::run_with_rpc(
        dir_cfg,
        dir_listener,
        stop(),
        dir_rpc.clone(),
    ));

    let host_listener = bind("127.0.0.1:0").await?;
    let host_addr = host_listener.local_addr()?;
    let host = gma_producer::Producer::new(ProducerConfig {
        registration: gma_core::registration::Registration::new(Some(dir_addr.to_string())),
        ..ProducerConfig::default()
    })
    .map_err(|e| anyhow!("{e}"))?;
    let host_name = host.config.source.clone().unwrap_or_default();
    let host_task = tokio::spawn(host.run(host_listener, stop()));

    let sim_listener = bind("127.0.0.1:0").await?;
    let sim_addr = sim_listener.local_addr()?;
    let sim = gma_producer::Producer::new(ProducerConfig {
        registration: gma_core::registration::Registration::new(Some(dir_addr.to_string())),
        host_sensors: false,
        source: Some("simulator".into()),
        simulate: Some(demo_sim_file(tmp.path(), a.sim_hosts)?),
        ..ProducerConfig::default()
    })
    .map_err(|e| anyhow!("{e}"))?;
    let sim_task = tokio::spawn(sim.run(sim_listener, stop()));

    let resched_listener = bind("127.0.0.1:0").await?;
    let resched_addr = resched_listener.local_addr()?;
    let resched_task = tokio::spawn(gma_rescheduler::service::run(
        gma_rescheduler::service::ReschedulerConfig {
            registration: gma_core::registration::Registration::new(Some(dir_addr.to_string())),
            // The demo's applications run for seconds, not hours: a small assumed cost.
            cost_s: 1.0,
            ..Default::default()
        },
        resched_listener,
        stop(),
    ));

    let broker_listener = bind("127.0.0.1:0").await?;
    let broker_addr = broker_listener.local_addr()?;
    let broker_task = tokio::spawn(gma_broker::service::run(
        gma_broker::service::BrokerConfig {
            registration: gma_core::registration::Registration::new(Some(dir_addr.to_string())),
            ..Default::default()
        },
        broker_listener,
        stop(),
    ));

    // A simulated resource manager for the named hosts and the first generated ones.
    let mut simres_cfg: gma_broker::simres::SimresConfig =
        gma_core::config::parse_toml(include_str!("../../config/demo-simres.toml"), "demo-simres.toml")?;
    for i in 0..a.sim_hosts.min(4) {
        simres_cfg.resources.push(gma_broker::simres::ResourceSpec {
            name: format!("sim-{i:04}"),
            cpus: 8,
            memory_mb: 16384.0,
            arch: "x86_64".into(),
            background: Vec::new(),
        });
    }
    simres_cfg.registration.directory = Some(dir_addr.to_string());
    let simres_listener = bind("127.0.0.1:0").await?;
    let simres_addr = simres_listener.local_addr()?;
    let simres_task = tokio::spawn(gma_broker::simres::run(simres_cfg, simres_listener, stop()));
    let job_file = tmp.path().join("broker-job.toml");
    std::fs::write(&job_file, include_str!("../../config/broker-job.toml"))?;
    let jobs_file = tmp.path().join("coalloc-jobs.toml");
    std::fs::write(&jobs_file, include_str!("../../config/coalloc-jobs.toml"))?;
    // ---- issue 9: archiver and live dashboard (kept in one block for easy merging) ----
    let metrics = crate::telemetry::recorder()?;
    let archive_listener = bind("127.0.0.1:0").await?;
    let archive_addr = archive_listener.local_addr()?;
    let archive_rpc = gma_core::rpc::RpcStats::new("archiver");
    let archive_task = tokio::spawn(gma_archiver::run_with_rpc(
        gma_archiver::ArchiverConfig {
            registration: gma_core::registration::Registration::new(Some(dir_addr.to_string())),
            data_dir: tmp.path().join("archive"),
            ..Default::default()
        },
        archive_listener,
        stop(),
        archive_rpc.clone(),
    ));
    // gma.rpc of the directory and the archiver, through companion producers.
    for (role, rpc, near) in [
        ("directory", dir_rpc, dir_addr),
        ("archiver", archive_rpc, archive_addr),
    ] {
        let c = crate::telemetry::Companion {
            role,
            rpc,
            directory: dir_addr.to_string(),
            near,
            endpoint: Default::default(),
        };
        crate::telemetry::companion(c, stop()).await?;
    }
    let dash_listener = match bind(&a.dashboard_listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("note: {e:#}; the dashboard takes any free port instead");
            bind("127.0.0.1:0").await?
        }
    };
    let dash_addr = dash_listener.local_addr()?;
    let dash_task = tokio::spawn(gma_dashboard::run(
        gma_dashboard::DashboardConfig {
            directory: Some(dir_addr.to_string()),
            archiver: Some(archive_addr.to_string()),
            ..Default::default()
        },
        dash_listener,
        stop(),
        Some(metrics),
    ));
    // ---- end issue 9 ----

    println!("GMA demo is running (data in {}).", tmp.path().display());
    println!();
    println!("  directory            {dir_addr}");
    println!("  producer (this host) {host_addr}   source {host_name}");
    println!("  producer (simulated) {sim_addr}   hosts hostA, hostB, sim-0000..");
    println!("  rescheduler          {resched_addr}   decisions as resched.decision events");
    println!("  broker               {broker_addr}   decisions as broker.decision events");
    println!("  resource manager     {simres_addr}   (gma simres) reservations as reservation.state events");
    println!("  archiver             {archive_addr}   history of every event");
    println!("  dashboard            http://{dash_addr}/   (live page; Prometheus text at /metrics)");
    println!();
    println!("Try, in another terminal:");
    println!("  gma search 'host.*' --directory {dir_addr}");
    println!("  gma subscribe host.cpu --directory {dir_addr} --source {host_name} --count 5");
    println!("  gma query host.load --directory {dir_addr} --output json");
    println!("  gma sim set hostA load=3.5 free_cpus=0 --producer {sim_addr}");
    println!("  gma subscribe host.load --directory {dir_addr} --source hostA");
    println!("  gma app-sim --app-id app1 --phases 60 --predicted-s 0.5 --host hostA --producer {sim_addr}");
    println!(
        "    then: gma sim set hostA load=40 --producer {sim_addr}   (watch it migrate to a faster host)"
    );
    println!("  gma subscribe resched.decision --directory {dir_addr} --output json");
    println!(
        "  gma broker select --job {} --broker {broker_addr}",
        job_file.display()
    );
    println!(
        "  gma broker coallocate --jobs {} --broker {broker_addr}",
        jobs_file.display()
    );
    println!("  gma simres list --manager {simres_addr}");
    println!("(with cargo: cargo run --release -p gma -- <command>)");
    println!();
    println!("Press Ctrl-C to stop.");

    match a.duration_s {
        Some(s) => {
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(s)) => {}
                _ = shutdown_signal() => {}
            }
        }
        None => shutdown_signal().await,
    }
    let _ = stop_tx.send(true);
    // The producers first, the directory last (the others deregister from it as they stop).
    stopped("producer", host_task).await;
    stopped("producer", sim_task).await;
    stopped("archiver", archive_task).await;
    stopped("dashboard", dash_task).await;
    stopped("rescheduler", resched_task).await;
    stopped("broker", broker_task).await;
    stopped("resource manager", simres_task).await;
    stopped("directory", dir_task).await;
    println!("GMA demo stopped.");
    Ok(())
}

#[derive(Args, Debug)]
pub struct DirectoryArgs {
    /// Listen address, e.g. 127.0.0.1:7000 (overrides `listen` in --config; default
    /// 127.0.0.1:7000).
    #[arg(long, help_heading = crate::args::SERVING_HEADING)]
    pub listen: Option<String>,
    /// Data directory (created if missing).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// This member's node id (>= 1; default 1). Never reuse the id of a wiped node.
    #[arg(long)]
    pub id: Option<u64>,
    /// Initial members: ID=HOST:PORT,... (omit for a single-node directory).
    #[arg(long)]
    pub peers: Option<String>,
    /// Initialize a new cluster from --peers (give it on one member only, once).
    #[arg(long)]
    pub init: bool,
    /// TOML config file (keys: listen, data_dir, node_id, peers, init, default_ttl_ms, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub endpoint: EndpointArgs,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Exit after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Number of simulated hosts.
    #[arg(long, default_value_t = 8)]
    pub sim_hosts: u32,
    /// Where the demo's dashboard listens (any free port if this one is taken).
    #[arg(long, default_value = "127.0.0.1:7500")]
    pub dashboard_listen: String,
}
