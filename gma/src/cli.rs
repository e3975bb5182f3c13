//! The `gma` command line (clap): [`Cli`] and the [`Command`] enum of every subcommand. Each
//! subcommand's arguments live in its own module; shared flags in [`crate::args`].

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "gma",
    // The same usage lines whatever the executable is called (the tests run it as gma-e2e).
    bin_name = "gma",
    version,
    about = "GMA fabric: grid monitoring producers, consumers and a replicated directory"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "gma_producer=debug".
    #[arg(long, global = true, env = "GMA_LOG", default_value = "warn")]
    pub log: String,
    #[command(flatten)]
    pub tls: crate::args::TlsArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a directory node (single node; metadata only, leases, watch).
    Directory(crate::roles::DirectoryArgs),
    /// Run a producer: host sensors and/or simulated hosts, served to consumers.
    Producer(crate::roles::ProducerArgs),
    /// Search the directory for producers (and consumers) by event pattern.
    Search(crate::tools::SearchArgs),
    /// Subscribe to every producer of a pattern and print events as they arrive.
    Subscribe(crate::tools::SubscribeArgs),
    /// Ask producers for their latest cached events.
    Query(crate::tools::QueryArgs),
    /// Push application events into a producer (fields by name; the schema is inferred when
    /// the producer has none), from the arguments or from standard input.
    Emit(crate::emit::EmitArgs),
    /// Control simulated hosts of a running producer.
    Sim {
        #[command(subcommand)]
        command: crate::tools::SimCommand,
    },
    /// The job-migration rescheduler (a consumer of contract and load streams), or
    /// `gma rescheduler evaluate` for the pure decision rule.
    Rescheduler(crate::resched::ReschedulerArgs),
    /// A sample application that reports phases to a contract monitor and obeys stop/resume.
    AppSim(crate::appsim::AppSimArgs),
    /// Inspect and change the membership of a replicated directory.
    Cluster(crate::cluster::ClusterArgs),
    /// Everything on this machine: directory, host producer, simulated hosts, rescheduler;
    /// until Ctrl-C.
    Demo(crate::roles::DemoArgs),
    /// Benchmarks that print figures (throughput, latency percentiles, agent cost).
    Bench(gma_bench::BenchArgs),
    /// Action monitor: run rules over event streams and run a command when one holds
    /// (restart a dead process, page when every listed host is down); see docs/monitor.md.
    Monitor(crate::monitor::MonitorArgs),
    /// A consumer that accepts streams pushed by producers (registered in the directory) and
    /// prints them as JSON lines.
    Sink(crate::sink::SinkArgs),
    /// Run an archiver: durable, compressed history of the events it subscribes to.
    Archiver(crate::archive::ArchiverArgs),
    /// Query an archiver: query, series, export, stats.
    Archive(crate::archive::ArchiveArgs),
    /// Relay: subscribe to a site's producers, publish a site.load summary and republish
    /// chosen events under one record (a compound consumer/producer).
    Relay(crate::relay::RelayArgs),
    /// Development certificates: a CA and node/user certificates (rcgen).
    Certs(crate::certs::CertsArgs),
    /// The resource broker (ranks resources for jobs from the live load streams, coallocates
    /// with advance reservations), or `select` / `coallocate` / `view` against a running one.
    Broker(crate::broker::BrokerArgs),
    /// The federation endpoint of a site (summaries to linked sites, jobs placed locally or
    /// forwarded with route()), or `add` / `remove` / `status` of its links.
    Federation(crate::federation::FederationArgs),
    /// Jobs at a site's federation endpoint: submit, status, list, cancel.
    Job(crate::federation::JobArgs),
    /// A simulated resource manager: per-resource reservation calendars behind the
    /// Reservations interface (create / modify / release with granted / never / retry-from).
    Simres(crate::broker::SimresArgs),
    /// The live web dashboard: producers and consumers, per-host charts, cluster, decisions,
    /// gma.rpc, archived history (a real-time consumer; docs/dashboard.md).
    Dashboard(crate::dashboard::DashboardArgs),
    /// The network sensor: latency and bandwidth probes to the other netprobes of its site,
    /// one at a time (a token circulates), published as net.rtt / net.bw with forecasts.
    Netprobe(crate::netprobe::NetprobeArgs),
    /// Read the network sensors: `matrix` (every pair, with forecasts), `status` (the cliques).
    Net(crate::netprobe::NetArgs),
    /// Every door of every role (each RPC and HTTP route), who may knock, the actions the
    /// policy is asked and what a summary-only identity gets (docs/security.md).
    Doors(crate::doors::DoorsArgs),
}
