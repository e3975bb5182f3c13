//! Command-line definitions (clap). Every role is a subcommand; tools talk to running roles.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
    pub tls: TlsArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// TLS for every endpoint this process serves and every connection it makes.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// CA certificate (PEM) servers are verified against; turns TLS on for connections.
    #[arg(long, global = true, env = "GMA_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate chain (PEM): served by roles, presented as a client.
    #[arg(long, global = true, env = "GMA_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, global = true, env = "GMA_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mTLS) on served endpoints.
    #[arg(long, global = true, env = "GMA_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback address (refused otherwise).
    #[arg(long, global = true)]
    pub allow_plaintext: bool,
    /// Authorization policy (TOML) for the roles this process serves; deny by default when
    /// given. Without one every identity may do everything.
    #[arg(long, global = true, env = "GMA_ACCESS_POLICY")]
    pub access_policy: Option<PathBuf>,
    /// Serve the Prometheus endpoints (--metrics-listen, --prometheus) in plain HTTP without
    /// authorization even next to a TLS role (refused otherwise).
    #[arg(long, global = true)]
    pub metrics_insecure: bool,
}

impl TlsArgs {
    pub fn client(&self) -> gma_core::tls::ClientTls {
        gma_core::tls::ClientTls {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone().filter(|_| self.tls_ca.is_some()),
            key: self.tls_key.clone().filter(|_| self.tls_ca.is_some()),
        }
    }

    /// The server settings, or `None` when no TLS flag was given (the config file decides).
    pub fn server(&self) -> Option<gma_core::tls::ServerTls> {
        let any = self.tls_cert.is_some() || self.tls_key.is_some() || self.tls_client_ca.is_some();
        (any || self.allow_plaintext).then(|| gma_core::tls::ServerTls {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            client_ca: self.tls_client_ca.clone(),
            allow_plaintext: self.allow_plaintext,
            ca: self.tls_ca.clone(),
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a directory node (single node; metadata only, leases, watch).
    Directory(DirectoryArgs),
    /// Run a producer: host sensors and/or simulated hosts, served to consumers.
    Producer(ProducerArgs),
    /// Search the directory for producers (and consumers) by event pattern.
    Search(SearchArgs),
    /// Subscribe to every producer of a pattern and print events as they arrive.
    Subscribe(SubscribeArgs),
    /// Ask producers for their latest cached events.
    Query(QueryArgs),
    /// Push application events into a producer (fields by name; the schema is inferred when
    /// the producer has none), from the arguments or from standard input.
    Emit(crate::emit::EmitArgs),
    /// Control simulated hosts of a running producer.
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
    /// The job-migration rescheduler (a consumer of contract and load streams), or
    /// `gma rescheduler evaluate` for the pure decision rule.
    Rescheduler(ReschedulerArgs),
    /// A sample application that reports phases to a contract monitor and obeys stop/resume.
    AppSim(AppSimArgs),
    /// Inspect and change the membership of a replicated directory.
    Cluster(ClusterArgs),
    /// Everything on this machine: directory, host producer, simulated hosts, rescheduler;
    /// until Ctrl-C.
    Demo(DemoArgs),
    /// Benchmarks that print figures (throughput, latency percentiles, agent cost).
    Bench(BenchArgs),
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

/// Coallocation replay scenarios (the paper's Tables I and II).
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum CoallocScenario {
    /// Every job can use every machine.
    Homogeneous,
    /// The last job can use only one machine.
    Heterogeneous,
    Both,
}

#[derive(Args, Debug)]
pub struct DirectoryArgs {
    /// Listen address, e.g. 127.0.0.1:7000.
    #[arg(long)]
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
    pub metrics: MetricsArgs,
    /// Period of the gma.rpc events about this member's RPCs, published by a companion
    /// producer (0 = none; default 10000).
    #[arg(long)]
    pub rpc_events_ms: Option<u64>,
}

/// Prometheus exposition of a role's own metrics.
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsArgs {
    /// Serve Prometheus /metrics (the role's counters and latency histograms) on this address,
    /// e.g. 127.0.0.1:9100 (overrides `metrics_listen` in --config).
    #[arg(long)]
    pub metrics_listen: Option<String>,
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Members, leader, term and applied index, as each listed member sees them.
    Status {
        /// One or more members: ADDR[,ADDR...].
        #[arg(long)]
        directory: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Add a new member as a learner (it replicates but does not vote yet).
    AddLearner {
        #[arg(long)]
        directory: String,
        /// The new member's node id.
        #[arg(long)]
        id: u64,
        /// The new member's HOST:PORT.
        #[arg(long)]
        address: String,
    },
    /// Make a learner a voter.
    Promote {
        #[arg(long)]
        directory: String,
        #[arg(long)]
        id: u64,
    },
    /// Remove a member from the voters (and from the cluster).
    Remove {
        #[arg(long)]
        directory: String,
        #[arg(long)]
        id: u64,
    },
}

#[derive(Args, Debug)]
pub struct ProducerArgs {
    /// Listen address, e.g. 127.0.0.1:7001.
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory address(es) to register with, ADDR[,ADDR...] (omit to run standalone).
    #[arg(long)]
    pub directory: Option<String>,
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
    /// Simulated hosts, from a TOML file (see docs/simulation.md).
    #[arg(long)]
    pub simulate: Option<PathBuf>,
    /// Do not run the real host sensors (e.g. a simulation-only producer).
    #[arg(long)]
    pub no_host_sensors: bool,
    /// Record id in the directory (default: <source>@<address>).
    #[arg(long)]
    pub id: Option<String>,
    /// TOML config file (keys as in ProducerConfig: listen, directory, period_ms, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Serve the latest sensor values as Prometheus gauges at /metrics on this address
    /// (gma_host_cpu_user{source="hostA"}, ...; see docs/dashboard.md).
    #[arg(long)]
    pub prometheus: Option<String>,
    /// Period of the gma.rpc events about this producer's RPCs (0 = none; default 10000).
    #[arg(long)]
    pub rpc_events_ms: Option<u64>,
}

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// Event-name pattern, e.g. 'host.*' (default: all).
    #[arg(default_value = "*")]
    pub pattern: String,
    #[arg(long)]
    pub directory: String,
    /// Only producers serving this source (pattern).
    #[arg(long)]
    pub source: Option<String>,
    /// Search consumer records instead of producers.
    #[arg(long)]
    pub consumers: bool,
    /// Answer from the member asked, without confirming with the leader (may be slightly
    /// stale; scales reads across members).
    #[arg(long)]
    pub stale_ok: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct SubscribeArgs {
    /// Event-name pattern, e.g. host.cpu or 'host.*'.
    pub pattern: String,
    /// Directory address (discover producers); or use --producer.
    #[arg(long, required_unless_present = "producer")]
    pub directory: Option<String>,
    /// Subscribe to this producer directly, bypassing the directory.
    #[arg(long)]
    pub producer: Option<String>,
    /// Only events from this source (pattern).
    #[arg(long)]
    pub source: Option<String>,
    /// Exit after this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// At most one event per series per interval.
    #[arg(long)]
    pub min_interval_ms: Option<u64>,
    /// Resume state file: read at start, rewritten after every batch, so a restarted
    /// subscriber resumes where it stopped.
    #[arg(long)]
    pub state: Option<PathBuf>,
    #[command(flatten)]
    pub filters: FilterArgs,
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

/// What the producer does when a subscriber falls behind.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Conflate to the newest value per series.
    Latest,
    /// Skip the oldest events, reported as a gap.
    DropOldest,
    /// Hold events for this subscriber (archivers), within the producer's block reserve.
    Block,
}

/// Subscription parameters evaluated by the producer.
#[derive(Args, Debug, Default, Clone)]
pub struct FilterArgs {
    /// Threshold crossing: only events where this expression changes value, marked enter or
    /// leave, e.g. 'host.cpu.user > 50' or 'load1 > 4 and free_cpus < 1'.
    #[arg(long)]
    pub when: Option<String>,
    /// Change filter: only events where a numeric field moved by more than this percent since
    /// the last event delivered for its series.
    #[arg(long)]
    pub delta_pct: Option<f64>,
    /// Rolling summaries instead of raw events (1m, 10m, 60m; repeatable): <name>.avg1m ...
    #[arg(long = "summary")]
    pub summaries: Vec<String>,
    /// Adaptive forecasts instead of raw events: <name>.forecast.
    #[arg(long)]
    pub forecast: bool,
    /// Slow-consumer policy (default: latest for *.load patterns, else drop-oldest).
    #[arg(long, value_enum)]
    pub policy: Option<PolicyArg>,
    /// How far behind (producer events) before the policy acts.
    #[arg(long)]
    pub queue_events: Option<u32>,
}

#[derive(Args, Debug)]
pub struct QueryArgs {
    /// Event-name pattern.
    pub pattern: String,
    #[arg(long, required_unless_present = "producer")]
    pub directory: Option<String>,
    /// Query this producer directly.
    #[arg(long)]
    pub producer: Option<String>,
    #[arg(long)]
    pub source: Option<String>,
    /// Only events at most this old.
    #[arg(long)]
    pub max_age_ms: Option<u64>,
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Subcommand, Debug)]
pub enum SimCommand {
    /// Set values of a simulated host: gma sim set hostA load=3.5 free_cpus=0 --producer ADDR
    Set {
        host: String,
        /// key=value pairs (load, free_cpus, queue_waiting, cpus, memory_mb, bench_<name>).
        #[arg(required = true)]
        values: Vec<String>,
        #[arg(long)]
        producer: String,
    },
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

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: BenchScenario,
}

#[derive(Subcommand, Debug)]
pub enum BenchScenario {
    /// One producer -> one consumer over loopback gRPC: max events/s, then latency at a fixed rate.
    Stream {
        /// Seconds per phase.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Events per second for the latency phase.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Over mTLS, with throwaway certificates made for the run.
        #[arg(long)]
        tls: bool,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The directory, 1 and 3 nodes (real processes): registrations/s at 1 and 64 clients,
    /// Search and Watch latency percentiles, leader failover time.
    Directory {
        /// Seconds per throughput phase.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Leader failover trials (3 nodes).
        #[arg(long, default_value_t = 10)]
        trials: u32,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The directory and etcd side by side (real processes, both fsync every acked write, the
    /// same client harness): lease + write and plain writes at 1 and 64 clients, linearizable
    /// reads; 1 and 3 nodes. Needs `etcd` on the PATH (Debian's etcd-server).
    Etcd {
        /// Seconds per throughput phase.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The rescheduler: violation -> published decision latency (real gRPC, in one process)
    /// and the cost of one decision over 1,000 candidate hosts.
    Resched {
        #[arg(long, default_value_t = 200)]
        trials: u32,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The archiver's store: ingest samples/s with group commit, bytes/sample on disk, query
    /// time over 1,000,000 samples (raw and 1m p99), RSS.
    Archive {
        /// Samples ingested (1,000 hosts x 3 fields, 1 s gauges).
        #[arg(long, default_value_t = 3_000_000)]
        samples: u64,
        /// Stop the ingest after this many seconds if --samples is not reached by then.
        #[arg(long)]
        duration: Option<u64>,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The host agent (a real `gma producer` process at 1 s sampling): CPU% and RSS.
    Agent {
        #[arg(long, default_value_t = 60)]
        duration: u64,
        /// Sample period of the agent under test.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// One producer -> N consumers of the same pattern (encode-once fan-out), loopback gRPC:
    /// events/s per consumer and per core, encodings per published event, then latency
    /// percentiles across all consumers at a fixed rate.
    Fanout {
        /// Seconds per phase.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Consumer counts to measure, e.g. 1,10,100.
        #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
        consumers: Vec<usize>,
        /// Events per second for the latency phase.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Give each consumer its own filter (encode-once off), for comparison.
        #[arg(long)]
        distinct: bool,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Slow-consumer isolation: a fast consumer at a fixed rate alone, then next to a stalled
    /// drop-oldest consumer, then next to a stalled latest consumer (throughput, latency, RSS).
    Stall {
        /// Seconds per phase.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Events per second published.
        #[arg(long, default_value_t = 20_000)]
        rate: u64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Cost per event of subscription filters (none, when, delta_pct, min_interval_ms),
    /// reading a hub through a cursor without gRPC.
    Filter {
        /// Events in the hub (1,000 sources, 3 fields).
        #[arg(long, default_value_t = 1_000_000)]
        events: usize,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Every scenario of the suite in turn (stream, fanout, directory, archive, broker, agent,
    /// scale), each in its own process: one JSON object per line with --output json.
    All {
        /// Seconds per phase (agent and scale run 6x this).
        #[arg(long, default_value_t = 5)]
        duration: u64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The fabric at grid scale: simulated hosts in several producer processes, a 3-node
    /// directory, an archiver, a broker and dashboard-style consumers; loss by seq accounting
    /// (producer -> archiver, read back from the archive), latency, CPU and RSS of every
    /// process; with churn (the archiver, a producer and the directory leader killed with
    /// SIGKILL, a producer restarted, a consumer stopped with SIGSTOP).
    Scale {
        #[arg(long, default_value_t = 1000)]
        hosts: u32,
        #[arg(long, default_value_t = 4)]
        producers: u32,
        #[arg(long, default_value_t = 100)]
        consumers: u32,
        /// Seconds of measurement (after setup).
        #[arg(long, default_value_t = 300)]
        duration: u64,
        /// No faults at all (none of those below).
        #[arg(long)]
        no_churn: bool,
        /// Churn without killing the archiver (SIGKILL and restart at 0.10 and 0.85 of the run).
        #[arg(long)]
        no_archiver_kill: bool,
        /// Churn without stopping the consumer process (SIGSTOP at 0.15 of the run).
        #[arg(long)]
        no_consumer_stop: bool,
        /// Churn without restarting producer 0 (SIGTERM at 1/3 of the run).
        #[arg(long)]
        no_producer_restart: bool,
        /// Churn without killing the directory leader (SIGKILL at half the run).
        #[arg(long)]
        no_leader_kill: bool,
        /// Churn without killing producer 1 (SIGKILL at 0.70 of the run).
        #[arg(long)]
        no_producer_kill: bool,
        /// Seconds the consumer process stays stopped (default: a sixth of the run, at most 40).
        #[arg(long)]
        consumer_stop_s: Option<f64>,
        /// Shows that the per-seq check finds loss: the archiver keeps one host.cpu event in N
        /// (a keep rule), so the others are reported missing.
        #[arg(long)]
        lossy_keep: Option<u64>,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The broker: Select decisions/s and latency through gRPC with N live resources.
    Broker {
        #[arg(long, default_value_t = 1000)]
        resources: u32,
        /// Seconds of load.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Concurrent clients (one connection each).
        #[arg(long, default_value_t = 8)]
        clients: usize,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The paper's randomized coallocation experiment against a gma simres over gRPC (one is
    /// started in this process unless --simres is given): success rates and iteration counts.
    Coalloc {
        #[arg(long, default_value_t = 1000)]
        trials: u32,
        #[arg(long, value_enum, default_value = "both")]
        scenario: CoallocScenario,
        /// Use this running gma simres (it must offer machines m0..m3 with 1 CPU each).
        #[arg(long)]
        simres: Option<String>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Placement quality: mean job completion time under ttd vs random and round-robin in a
    /// discrete-event simulation of heterogeneous hosts.
    Placement {
        #[arg(long, default_value_t = 50)]
        hosts: usize,
        #[arg(long, default_value_t = 5000)]
        jobs: usize,
        /// Offered load (fraction of all CPUs at reference speed).
        #[arg(long, default_value_t = 0.7)]
        utilization: f64,
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The dashboard (real processes): its CPU% and RSS with no browser and with N SSE clients
    /// over H simulated hosts (3 live series each), and the fan-out latency of chart points
    /// (event timestamp -> client receipt).
    Dashboard {
        /// Seconds per phase.
        #[arg(long, default_value_t = 30)]
        duration: u64,
        /// Simulated hosts (3 live series each: host.load, host.cpu, host.mem).
        #[arg(long, default_value_t = 34)]
        hosts: usize,
        /// SSE clients ("browsers") in the second phase.
        #[arg(long, default_value_t = 10)]
        clients: usize,
        /// Sample period of the simulated hosts.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Federation: mean job completion with federation vs local-only (3 simulated sites of 64
    /// CPUs, imbalanced and balanced load, the real route() and job manager), summary size,
    /// route() latency with 100 peers, summary propagation latency over real gRPC.
    Federation {
        /// Jobs submitted per site in each simulated run.
        #[arg(long, default_value_t = 3000)]
        jobs: usize,
        /// Seeds (runs) per load pattern.
        #[arg(long, default_value_t = 3)]
        seeds: u64,
        /// Hosts per site.
        #[arg(long, default_value_t = 16)]
        hosts: u32,
        /// CPUs per host.
        #[arg(long, default_value_t = 4)]
        cpus_per_host: u32,
        /// Job sizes in CPUs, drawn uniformly (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,4")]
        shapes: Vec<u32>,
        /// Summary changes timed for the propagation latency.
        #[arg(long, default_value_t = 300)]
        changes: usize,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Forecast accuracy: MAE of the served forecast next to every fixed predictor on
    /// synthetic load traces and, optionally, a recorded trace.
    Forecast {
        /// Recorded trace: one number per line, or JSON lines of `gma subscribe host.load
        /// --output json` (their load1 values).
        #[arg(long)]
        trace: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ReschedulerArgs {
    #[command(subcommand)]
    pub command: Option<ReschedulerCommand>,
    /// Listen address of the rescheduler's own producer (its decision events).
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory address(es).
    #[arg(long)]
    pub directory: Option<String>,
    /// TOML config (cost_s, threshold, max_age_ms, opportunistic, action, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

#[derive(Subcommand, Debug)]
pub enum ReschedulerCommand {
    /// The decision rule alone: gain = (ret_current - (ret_new + cost)) / ret_current.
    Evaluate {
        #[arg(long)]
        ret_current: f64,
        #[arg(long)]
        ret_new: f64,
        /// Worst-case rescheduling cost C in seconds.
        #[arg(long, default_value_t = 900.0)]
        cost: f64,
        /// Migrate only if gain > threshold.
        #[arg(long, default_value_t = 0.30)]
        threshold: f64,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

#[derive(Args, Debug)]
pub struct AppSimArgs {
    #[arg(long, default_value = "app1")]
    pub app_id: String,
    #[arg(long, default_value_t = 20)]
    pub phases: u32,
    /// Predicted time of each phase on an unloaded host, in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub predicted_s: f64,
    /// The (simulated) host it starts on.
    #[arg(long)]
    pub host: String,
    /// Producer to publish through (Ingest) and to read host load from.
    #[arg(long)]
    pub producer: String,
    /// Listen address of its AppControl service.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Contract tolerance band on actual/predicted.
    #[arg(long, default_value_t = 1.5)]
    pub upper: f64,
    #[arg(long, default_value_t = 0.5)]
    pub lower: f64,
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
}
