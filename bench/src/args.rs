//! The arguments of `gma bench` (the `gma` command line flattens [`BenchArgs`] in).

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

/// How a scenario prints its figures.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
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

/// The arguments of `gma bench coalloc`.
#[derive(Args, Debug)]
pub struct CoallocArgs {
    #[arg(long, default_value_t = 1000)]
    pub trials: u32,
    #[arg(long, value_enum, default_value = "both")]
    pub scenario: CoallocScenario,
    /// Use this running gma simres (it must offer machines m0..m3 of --machine-cpus CPUs each).
    #[arg(long)]
    pub simres: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Probability that another job takes capacity the coallocator releases, at once (the
    /// runs marked "competing"); the other runs have no competition, as in the paper.
    #[arg(long, default_value_t = 0.5)]
    pub compete: f64,
    /// Print the step-by-step trace of this trial (0-based) for the runs "ours", "ours,
    /// competing" and "as written, competing" of each experiment.
    #[arg(long)]
    pub trace_trial: Option<u32>,
    /// CPUs per machine: 1 is the paper's set-up as written (one job per machine); more lets
    /// jobs share a machine (a background reservation still takes the whole machine).
    #[arg(long, default_value_t = 1)]
    pub machine_cpus: u32,
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
}

/// Where the events of the cross-process `stream` come from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Source {
    /// A bench-only source inside the producer process publishes into its hub
    /// (`gma bench stream-producer`: the stream path alone).
    Generator,
    /// The bench process pushes them into a `gma producer` through its `Ingest` service (the
    /// producer's CPU includes decoding them).
    Ingest,
}

/// The slow-consumer policy the cross-process `stream`'s subscriptions ask the producer for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum StreamPolicy {
    /// The producer keeps what the subscription has not read, and a source that can wait (the
    /// generator) waits for it: flow control from the consumer's socket back to the source.
    Block,
    /// The producer skips ahead with an exact `Gap` when the subscription falls behind the ring.
    DropOldest,
}

impl StreamPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamPolicy::Block => "block",
            StreamPolicy::DropOldest => "drop-oldest",
        }
    }
}

/// The cross-process `stream`'s own arguments.
#[derive(Args, Debug, Clone)]
pub struct StreamProcs {
    /// Subscriptions (each its own connection), spread over --consumer-procs processes.
    #[arg(long, default_value_t = 1)]
    pub subscribers: usize,
    #[arg(long, default_value_t = 1)]
    pub consumer_procs: usize,
    /// Events/s the source offers (0: back to back).
    #[arg(long, default_value_t = 0)]
    pub publish_rate: u64,
    /// Events per published batch (per Ingest push with --source ingest).
    #[arg(long, default_value_t = 5000)]
    pub batch: usize,
    /// Ingest pushes the publisher keeps in flight (--source ingest).
    #[arg(long, default_value_t = 4)]
    pub publish_lanes: usize,
    /// Where the events come from: a bench source inside the producer process, or pushed
    /// into a `gma producer` through Ingest.
    #[arg(long, value_enum, default_value = "generator")]
    pub source: Source,
    /// The producer's ring (resume buffer), in events; the producer's own default unless
    /// given. Under block it is also how far the slowest subscription may lag: a larger ring
    /// lets the subscriptions drift further apart (higher latency, and at 1 -> 100 the members
    /// read chunks that fell out of the cache).
    #[arg(long, default_value_t = gma_producer::DEFAULT_BUFFER_EVENTS)]
    pub buffer_events: usize,
    /// The subscriptions' slow-consumer policy. `block` (default): the figure is what the
    /// stream sustains with nothing dropped (the generator waits for the slowest subscription);
    /// `drop-oldest`: the source runs free and what the subscriptions miss shows as gaps.
    #[arg(long, value_enum, default_value = "block")]
    pub policy: StreamPolicy,
    /// Events per batch the subscriptions ask for (`SubscribeRequest.max_batch`, 1..=10000;
    /// a subscriber that asks nothing gets the producer's 1,000). A batch holds at most what
    /// the ring has when it is read, so a larger cap adds no wait: under load it means fewer
    /// messages, frames, write calls and wake-ups per event, and a batch of 32 KiB or more
    /// is sent without a copy (`gma_producer::send`).
    #[arg(long, default_value_t = gma_producer::subscription::MAX_MAX_BATCH as u32)]
    pub max_batch: u32,
    /// The generator publishes whole events looked up by name and source (`Hub::publish`)
    /// instead of through series handles resolved once (for before/after comparisons).
    #[arg(long)]
    pub by_name: bool,
    /// The consumers connect through a counting TCP proxy in the bench process (the older way
    /// of counting socket bytes: a hop with CPU of its own) instead of straight to the
    /// producer; their own transport counts the same bytes either way.
    #[arg(long)]
    pub proxy: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: BenchScenario,
}

#[derive(Subcommand, Debug)]
pub enum BenchScenario {
    /// A producer process (its own bench source, or `gma producer` fed through Ingest with
    /// --source ingest) -> subscriptions in consumer processes, bytes counted on the consumers'
    /// sockets, drops from the protocol's gaps; with --in-process: one producer -> one consumer
    /// in this process, max events/s, then latency at a fixed rate.
    Stream {
        /// Seconds per phase (across processes: of the measured window).
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Events per second for the latency phase (--in-process).
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Over mTLS, with throwaway certificates made for the run (--in-process).
        #[arg(long)]
        tls: bool,
        /// The older run: producer, publisher and consumer in this one process.
        #[arg(long)]
        in_process: bool,
        #[command(flatten)]
        procs: StreamProcs,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// One consumer process of the cross-process `stream` (started by it): N subscriptions,
    /// counted between `start` and `stop` lines on stdin, the books printed as JSON.
    #[command(hide = true)]
    StreamConsumer {
        #[arg(long)]
        addr: String,
        #[arg(long, default_value_t = 1)]
        subscribers: usize,
        #[arg(long, value_enum, default_value = "block")]
        policy: StreamPolicy,
        #[arg(long, default_value_t = 1000)]
        max_batch: u32,
    },
    /// NATS beside `stream`: a nats-server process, N subscriptions in another process, a
    /// publisher back to back (Debian's nats-server on the PATH).
    Nats {
        #[arg(long, default_value_t = 5)]
        duration: u64,
        #[arg(long, default_value_t = 1)]
        subscribers: usize,
        /// Bytes per message (the first 8 a sequence number); 27 = what one 3-value event of
        /// `stream` costs on the consumer's socket.
        #[arg(long, default_value_t = 27)]
        payload: usize,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The subscriber process of `nats` (started by it).
    #[command(hide = true)]
    NatsSub {
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 1)]
        subscribers: usize,
    },
    /// The producer process of the cross-process `stream` (started by it): the producer with a
    /// bench source publishing into its hub.
    #[command(hide = true)]
    StreamProducer {
        #[arg(long, default_value_t = 0)]
        publish_rate: u64,
        #[arg(long, default_value_t = 5000)]
        batch: usize,
        #[arg(long, default_value_t = gma_producer::DEFAULT_BUFFER_EVENTS)]
        buffer_events: usize,
        /// Publish whole events looked up by name and source (`Hub::publish`) instead of
        /// through series handles resolved once: the publish path before the handles.
        #[arg(long)]
        by_name: bool,
        /// Publish this many events, then exit (0: run until killed). With nothing
        /// subscribed it measures the publish path alone, e.g. under callgrind.
        #[arg(long, default_value_t = 0)]
        events: u64,
        /// With --events: publish nothing until this many block-policy subscriptions are
        /// live, and exit only once they have read every event (a fixed count of events
        /// streamed, for callgrind on the whole producer).
        #[arg(long, default_value_t = 0)]
        wait_subscribers: usize,
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
    /// Submit -> job start on Slurm, through the broker (rank, reserve, `sbatch --reservation`)
    /// next to a plain `sbatch`, N jobs each way (p50/p99/max); starts a throw-away cluster
    /// unless --slurm-conf names one.
    Slurm {
        #[arg(long, default_value_t = 50)]
        jobs: usize,
        /// Pause before each submission (both paths), to which a phase spread evenly over one
        /// second is added (the same phases in both paths).
        #[arg(long, default_value_t = 1000)]
        gap_ms: u64,
        /// The slurm.conf of an existing cluster to use instead of starting one.
        #[arg(long)]
        slurm_conf: Option<std::path::PathBuf>,
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
        /// Instead: ingest --samples into a store, serve it with an archiver, and export it all
        /// with `gma archive export --format parquet` (a child process): its time, file size
        /// and peak RSS (docs/parquet.md).
        #[arg(long)]
        export_parquet: bool,
        /// Instead: the live path — a `gma archiver` process (and a directory process)
        /// drains --samples held by a producer in this process through a real subscription;
        /// its samples/s and CPU-seconds per million samples (/proc), beside the store alone.
        #[arg(long, conflicts_with = "export_parquet")]
        live: bool,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The host agent (a real agent process at 1 s sampling: `gma-agent`, or `gma producer`)
    /// with a subscriber of every event attached: CPU% and µs per value sampled and delivered,
    /// VmRSS and VmHWM.
    Agent {
        #[arg(long, default_value_t = 60)]
        duration: u64,
        /// Sample period of the agent under test.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        /// Measure the agent alone, without the subscriber.
        #[arg(long)]
        no_subscriber: bool,
        /// An option passed to the agent (`gma producer`), e.g. `--agent-arg=--buffer-events=1000`;
        /// repeatable.
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// The agent executable: `gma-agent` (the agent alone), or a `gma` executable, run as
        /// `gma producer`. Default: the `gma-agent` next to this executable when there is one,
        /// else this executable's `producer` command.
        #[arg(long)]
        agent_bin: Option<std::path::PathBuf>,
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
        /// Simulated hosts; several (`1000,10000`) run one after the other, and `--plot` then
        /// also draws CPU and RSS against host count and latency against rate.
        #[arg(long, value_delimiter = ',', default_value = "1000")]
        hosts: Vec<u32>,
        #[arg(long, default_value_t = 4)]
        producers: u32,
        #[arg(long, default_value_t = 100)]
        consumers: u32,
        /// Measurement time after setup: seconds, or with a unit (`90s`, `30m`, `1h`).
        #[arg(long, default_value = "300", value_parser = parse_seconds)]
        duration: u64,
        /// Sample every process's RSS and CPU at this interval (`10s`, `1m`; default D/100,
        /// 1 to 10 s); the report gives each one's RSS growth over the last half of the run.
        #[arg(long, value_parser = parse_seconds)]
        sample_every: Option<u64>,
        /// Write SVG figures into this folder: RSS over time per process (one per host count),
        /// and with several `--hosts`, CPU/RSS against host count and latency against rate.
        #[arg(long)]
        plot: Option<std::path::PathBuf>,
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
        /// Each producer's resume ring (`--buffer-events`) holds this much of its simulated
        /// events (3 + 1/60 per host per second), at least 100,000 events: seconds or with a
        /// unit (`2m`).
        #[arg(long, default_value = "30", value_parser = parse_seconds)]
        resume_window: u64,
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
    Coalloc(CoallocArgs),
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
    /// Vasques' decentralized utility scheduling (simulated 3 VOs, the real job manager and
    /// route()): mean user utility (per user class), makespan and utilization of local-only,
    /// TTD forwarding and utility forwarding on the same workload, mean ± sd over seeds.
    Utility {
        /// Hours of arrivals (the same window at every VO).
        #[arg(long, default_value_t = 24.0)]
        hours: f64,
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        /// Offered load of each VO (s0,s1,s2), a fraction of its CPUs at reference speed.
        #[arg(long, value_delimiter = ',', default_value = "0.9,0.4,0.3")]
        loads: Vec<f64>,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Singh, Kesselman and Deelman: (a) the synthetic-slot MOGA experiment (§3): slots
    /// offered, plans evaluated, feasible, Pareto-optimal per seed, and the α sweep; (b)
    /// provisioned vs best-effort execution of the Montage-shaped workflows on a batch site
    /// with background load, across α (§5–6).
    Provision {
        /// a, b or both.
        #[arg(long, value_enum, default_value = "both")]
        part: crate::provision::Part,
        /// Part (b): the site's background utilization.
        #[arg(long, default_value_t = 0.85)]
        utilization: f64,
        #[arg(long, default_value_t = 3)]
        seeds: u64,
        #[arg(long, default_value_t = 60)]
        population: usize,
        #[arg(long, default_value_t = 40)]
        generations: usize,
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
    /// Grid: query latency p50/p99 at the root of a hierarchy of real federation endpoints
    /// (in-process, 127.0.0.1) against its depth and fan-out; every manager searches.
    Grid {
        /// Trees as DEPTHxFANOUT (levels below the root, children per manager), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1x2,2x2,3x2,1x4,2x4,1x8")]
        shapes: Vec<String>,
        /// Timed queries per tree (after 5 untimed ones).
        #[arg(long, default_value_t = 200)]
        queries: usize,
        /// Simulated sites for the summary comparison (flat peer mesh against a hierarchy).
        #[arg(long, value_delimiter = ',', default_value = "3,30,300")]
        sites: Vec<usize>,
        /// Children per manager in the simulated hierarchy.
        #[arg(long, default_value_t = 4)]
        fanout: usize,
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

/// A duration in whole seconds: `300`, `300s`, `30m`, `1h` (a clap value parser).
pub(crate) fn parse_seconds(v: &str) -> Result<u64, gma_core::Error> {
    let v = v.trim();
    let bad = || {
        gma_core::Error::Value(format!(
            "{v:?}: give seconds, or a number followed by s, m or h (e.g. 30m)"
        ))
    };
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(bad()),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(bad)
}

#[cfg(test)]
mod seconds_tests {
    use super::parse_seconds;

    #[test]
    fn durations_take_seconds_or_a_unit() {
        assert_eq!(parse_seconds("300"), Ok(300));
        assert_eq!(parse_seconds("90s"), Ok(90));
        assert_eq!(parse_seconds("30m"), Ok(1800));
        assert_eq!(parse_seconds("1h"), Ok(3600));
        for bad in ["", "m", "5x", "1.5m", "-3", "99999999999999999999h"] {
            assert!(parse_seconds(bad).is_err(), "{bad:?}");
        }
    }
}
