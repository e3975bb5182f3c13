//! gma-bench: the benchmarks of `gma bench` — scenarios that print figures (throughput, latency
//! percentiles, CPU and RSS), never pass/fail thresholds. A library the `gma` command calls
//! ([`run`] with its [`BenchArgs`]); the scenarios that start processes start the running
//! executable (`std::env::current_exe()`, the `gma` binary or the tests' `gma-e2e`) with its
//! role subcommands. How to run them and the figures: docs/PERFORMANCE.md.
//!
//! - [`stream`]: `stream --in-process` (one producer -> one consumer, optionally over mTLS).
//! - [`agent`]: `agent` (a real agent process with a subscriber of every event attached).
//! - [`wire`]: `stream` across processes (the default): a `gma producer`, consumer processes,
//!   a counting proxy on the consumers' sockets, per-seq books.
//! - [`nats`]: `nats`, NATS beside the cross-process stream (a nats-server process).
//! - [`fanout`]: `fanout`, `stall`, `filter`, `forecast`.
//! - [`dir`]: `directory` (1 and 3 real nodes); [`etcd`]: the directory and etcd side by side.
//! - [`archive`], [`broker`] (`broker`, `coalloc`, `placement`), [`resched`], [`dashboard`],
//!   [`federation`], [`grid`] (query latency through a hierarchy), [`scale`] (the fabric at
//!   grid scale, with churn), [`slurm`] (submit to job start through the broker next to a
//!   plain `sbatch`).
//! - [`provision`]: the synthetic-slot MOGA experiment of Singh, Kesselman and Deelman.
//! - [`utility`]: Vasques' decentralized utility scheduling against local-only and TTD
//!   forwarding (simulated VOs).
//! - [`report`]: cores, CPU and RSS from /proc, the JSON line every scenario prints.
//! - [`child`]: the `gma` child processes (started, found ready by their stderr line, killed on
//!   drop).
//! - [`args`]: the command-line arguments.

pub mod agent;
pub mod archive;
pub mod args;
pub mod broker;
pub mod child;
pub mod dashboard;
pub mod dir;
pub mod etcd;
pub mod fanout;
pub mod federation;
pub mod grid;
pub mod nats;
pub mod plot;
pub mod provision;
pub mod report;
pub mod resched;
pub mod scale;
pub mod slurm;
pub mod stream;
pub mod utility;
pub mod wire;

use anyhow::{bail, Context};

pub use args::{BenchArgs, BenchScenario, CoallocArgs, CoallocScenario, Output};

/// `gma bench <scenario>`: runs one scenario (or `all`) and prints its figures.
pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
    match a.scenario {
        BenchScenario::Stream {
            duration,
            rate,
            tls,
            in_process: true,
            output,
            ..
        } => stream::stream(duration, rate, tls, output).await,
        BenchScenario::Stream { tls: true, .. } => {
            bail!("--tls is for the in-process run: add --in-process")
        }
        BenchScenario::Stream {
            duration,
            procs,
            output,
            ..
        } => wire::run(duration, procs, output).await,
        BenchScenario::Nats {
            duration,
            subscribers,
            payload,
            output,
        } => crate::nats::run(duration, subscribers, payload, output).await,
        BenchScenario::NatsSub { port, subscribers } => crate::nats::sub(port, subscribers).await,
        BenchScenario::StreamProducer {
            publish_rate,
            batch,
            buffer_events,
            by_name,
            events,
            wait_subscribers,
        } => {
            wire::producer(
                publish_rate,
                batch,
                buffer_events,
                by_name,
                events,
                wait_subscribers,
            )
            .await
        }
        BenchScenario::StreamConsumer {
            addr,
            subscribers,
            policy,
            max_batch,
        } => wire::consumer(addr, subscribers, policy, max_batch).await,
        BenchScenario::Directory {
            duration,
            trials,
            output,
        } => crate::dir::run(duration, trials, output).await,
        BenchScenario::Etcd { duration, output } => crate::etcd::run(duration, output).await,
        BenchScenario::Resched { trials, output } => crate::resched::run(trials, output).await,
        BenchScenario::Slurm {
            jobs,
            gap_ms,
            slurm_conf,
            output,
        } => crate::slurm::run(jobs, gap_ms, slurm_conf, output).await,
        BenchScenario::Archive {
            samples,
            export_parquet: true,
            output,
            ..
        } => crate::archive::export_parquet(samples, output).await,
        BenchScenario::Archive {
            samples,
            live: true,
            output,
            ..
        } => crate::archive::live(samples, output).await,
        BenchScenario::Archive {
            samples,
            duration,
            output,
            ..
        } => crate::archive::run(samples, duration, output).await,
        BenchScenario::Agent {
            duration,
            period_ms,
            no_subscriber,
            agent_args,
            agent_bin,
            output,
        } => {
            let run = agent::AgentRun {
                duration,
                period_ms,
                subscriber: !no_subscriber,
                agent_args,
                agent_bin,
            };
            agent::agent(run, output).await
        }
        BenchScenario::Fanout {
            duration,
            consumers,
            rate,
            distinct,
            output,
        } => crate::fanout::fanout(duration, consumers, rate, distinct, output).await,
        BenchScenario::Stall {
            duration,
            rate,
            output,
        } => crate::fanout::stall(duration, rate, output).await,
        BenchScenario::Federation {
            jobs,
            seeds,
            hosts,
            cpus_per_host,
            shapes,
            changes,
            output,
        } => crate::federation::run(jobs, seeds, (hosts, cpus_per_host, shapes), changes, output).await,
        BenchScenario::Grid {
            shapes,
            queries,
            sites,
            fanout,
            output,
        } => {
            let shapes = shapes
                .iter()
                .map(|s| crate::grid::parse_shape(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            crate::grid::run(shapes, queries, &sites, fanout, output).await
        }
        BenchScenario::Filter { events, output } => crate::fanout::filter(events, output),
        BenchScenario::Forecast { trace, output } => crate::fanout::forecast(trace, output),
        BenchScenario::All { duration, output } => all(duration, output).await,
        BenchScenario::Scale {
            hosts,
            producers,
            consumers,
            duration,
            no_churn,
            no_archiver_kill,
            no_consumer_stop,
            no_producer_restart,
            no_leader_kill,
            no_producer_kill,
            consumer_stop_s,
            lossy_keep,
            sample_every,
            plot,
            resume_window,
            output,
        } => {
            let faults = if no_churn {
                crate::scale::Faults::NONE
            } else {
                crate::scale::Faults {
                    archiver_kill: !no_archiver_kill,
                    consumer_stop: !no_consumer_stop,
                    producer_restart: !no_producer_restart,
                    leader_kill: !no_leader_kill,
                    producer_kill: !no_producer_kill,
                }
            };
            let o = crate::scale::ScaleOptions {
                hosts: 0,
                producers,
                consumers,
                duration,
                faults,
                consumer_stop_s,
                lossy_keep,
                sample_every,
                plot,
                resume_window_s: resume_window,
                output,
            };
            crate::scale::scale_steps(o, &hosts).await
        }
        BenchScenario::Broker {
            resources,
            duration,
            clients,
            output,
        } => crate::broker::broker(resources, duration, clients, output).await,
        BenchScenario::Coalloc(a) => crate::broker::coalloc(a).await,
        BenchScenario::Placement {
            hosts,
            jobs,
            utilization,
            seeds,
            output,
        } => crate::broker::placement(hosts, jobs, utilization, seeds, output),
        BenchScenario::Utility {
            hours,
            seeds,
            loads,
            output,
        } => crate::utility::utility(hours, seeds, loads, output),
        BenchScenario::Provision {
            part,
            utilization,
            seeds,
            population,
            generations,
            output,
        } => crate::provision::provision(part, utilization, seeds, population, generations, output),
        BenchScenario::Dashboard {
            duration,
            hosts,
            clients,
            period_ms,
            output,
        } => crate::dashboard::run(duration, hosts, clients, period_ms, output).await,
    }
}

/// `gma bench all`: every scenario of the suite in turn, each in its own process, one JSON
/// object per line (or its table).
async fn all(duration: u64, output: Output) -> anyhow::Result<()> {
    let d = duration.max(1).to_string();
    let out = match output {
        Output::Json => "json",
        Output::Table => "table",
    };
    let scale_d = (duration * 6).max(10).to_string();
    let runs: Vec<Vec<&str>> = vec![
        vec!["stream", "--duration", &d],
        vec!["fanout", "--duration", &d],
        vec!["directory", "--duration", &d, "--trials", "3"],
        vec!["archive", "--duration", &d],
        vec!["broker", "--duration", &d],
        vec!["agent", "--duration", &scale_d],
        vec!["scale", "--duration", &scale_d],
    ];
    let exe = std::env::current_exe().context("cannot find the gma binary")?;
    for r in runs {
        let status = tokio::process::Command::new(&exe)
            .arg("bench")
            .args(&r)
            .args(["--output", out])
            .status()
            .await
            .with_context(|| format!("gma bench {}", r[0]))?;
        if !status.success() {
            bail!("gma bench {} failed ({status})", r[0]);
        }
    }
    Ok(())
}
