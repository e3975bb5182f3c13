//! The `gma` command line as a library: every subcommand, and [`main`], which the `gma` binary
//! (src/main.rs) calls. A library so that the end-to-end tests (`tests/`) build the same
//! command as their own binary and run it as real processes.

mod agentctl;
mod appsim;
mod archive;
mod args;
mod broker;
mod certs;
mod cli;
mod cluster;
mod dashboard;
mod doors;
mod emit;
mod federation;
mod fedtree;
mod grid;
mod heap;
mod monitor;
mod netprobe;
mod parquet;
mod provision;
mod relay;
mod resched;
mod roles;
mod runtime;
mod serve;
mod sink;
mod slurm;
mod telemetry;
mod tools;

use clap::Parser;

/// Parses the command line, sets up logging and runs the subcommand; exits 1 with the error
/// chain on failure.
pub fn main() {
    let cli = cli::Cli::parse();
    gma_producer::cli::init_logging(&cli.log);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = gma_core::tls::install_client_if_unset(&cli.tls.client()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    // Roles drain on SIGTERM / Ctrl-C: catch them from the start (app-sim ends by itself and
    // client commands stop at the default action).
    if cli.command.drains() {
        let _entered = rt.enter();
        if let Err(e) = serve::catch_shutdown_signals() {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
    let endpoint = cli.command.endpoint().cloned().unwrap_or_default();
    serve::set_security(cli.tls.server(&endpoint), endpoint.access_policy.clone());
    telemetry::set_insecure(endpoint.metrics_insecure);
    let result = rt.block_on(run(cli.command));
    // Streams and watchers may still be parked; do not wait for them.
    rt.shutdown_background();
    if let Err(e) = result {
        gma_core::cli::exit_with(&e);
    }
}

async fn run(cmd: cli::Command) -> anyhow::Result<()> {
    use cli::Command::*;
    match cmd {
        Directory(a) => roles::directory(a).await,
        Producer(a) => roles::producer(a).await,
        Demo(a) => roles::demo(a).await,
        Search(a) => tools::search(a).await,
        Subscribe(a) => tools::subscribe(a).await,
        Query(a) => tools::query(a).await,
        Emit(a) => emit::run(a).await,
        Sim { command } => tools::sim(command).await,
        Agent { command } => agentctl::run(command).await,
        Cluster(a) => cluster::run(a.command).await,
        AppSim(a) => appsim::run(a).await,
        Rescheduler(a) => resched::run(a).await,
        Bench(a) => gma_bench::run(a).await,
        Monitor(a) => monitor::run(a).await,
        Sink(a) => sink::run(a).await,
        Archiver(a) => archive::archiver(a).await,
        Archive(a) => archive::run(a).await,
        Relay(a) => relay::run(a).await,
        Certs(a) => certs::run(a).await,
        Broker(a) => broker::run(a).await,
        Simres(a) => broker::simres(a).await,
        Slurm(a) => slurm::run(a).await,
        Dashboard(a) => dashboard::run(a).await,
        Netprobe(a) => netprobe::netprobe(a).await,
        Net(a) => netprobe::net(a).await,
        Federation(a) => federation::run(a).await,
        Job(a) => federation::job(a).await,
        Grid(a) => grid::run(a).await,
        Doors(a) => doors::run(a),
    }
}
