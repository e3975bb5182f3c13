//! `gma broker` (run the broker; `select`, `coallocate`, `view` against a running one) and
//! `gma simres` (a simulated resource manager).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use gma_broker::batch::{BatchFile, Heuristic};
use gma_broker::job::{CoallocFile, Job};
use gma_broker::rank::Policy;
use gma_broker::service::{policy_to_proto, BrokerConfig};
use gma_broker::simres::SimresConfig;
use gma_core::time::{format_rfc3339, now_ns};
use gma_proto::v1::{self as pb, broker_client::BrokerClient, reservations_client::ReservationsClient};
use serde_json::json;

use crate::args::{require_directory, Output, RoleArgs};
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
#[command(mut_arg("listen", |a| a.help("Listen address of the broker: its Broker service and its decision events (overrides `listen` in --config; default 127.0.0.1:0, any free port)")))]
#[command(mut_arg("config", |a| a.help("TOML config (rank, resources annotations, reservations, follow, ...; docs/broker.md)")))]
pub struct BrokerArgs {
    #[command(subcommand)]
    pub command: Option<BrokerCommand>,
    #[command(flatten)]
    pub role: RoleArgs,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Earliest completion (total time to delivery).
    Ttd,
    /// Earliest start (total time to start).
    Tts,
    /// Highest partial utility for the job's user class.
    Utility,
    /// Cheapest meeting the deadline, with the job's trade-off factor.
    Cost,
}

impl PolicyArg {
    fn policy(self) -> Policy {
        match self {
            PolicyArg::Ttd => Policy::Ttd,
            PolicyArg::Tts => Policy::Tts,
            PolicyArg::Utility => Policy::Utility,
            PolicyArg::Cost => Policy::Cost,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum HeuristicArg {
    /// Map first the job with the smallest earliest completion.
    MinMin,
    /// Map first the job with the largest earliest completion.
    MaxMin,
    /// Map first the job that loses most if denied its best resource.
    Sufferage,
}

impl HeuristicArg {
    fn heuristic(self) -> Heuristic {
        match self {
            HeuristicArg::MinMin => Heuristic::MinMin,
            HeuristicArg::MaxMin => Heuristic::MaxMin,
            HeuristicArg::Sufferage => Heuristic::Sufferage,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum BrokerCommand {
    /// Rank the resources for a job: best first, with the predicted times that ordered them;
    /// or, with --batch, map a set of jobs by a batch heuristic over those predictions.
    Select {
        /// Job file (TOML; docs/broker.md).
        #[arg(long, required_unless_present = "batch", conflicts_with = "batch")]
        job: Option<PathBuf>,
        /// Batch file: [[job]] tables (docs/broker.md); prints the assignment and the predicted
        /// makespan (exit status 2 when a job has no candidate resource).
        #[arg(long)]
        batch: Option<PathBuf>,
        /// Batch heuristic over the predicted completion times.
        #[arg(long, value_enum, default_value = "min-min", requires = "batch")]
        heuristic: HeuristicArg,
        #[arg(long)]
        broker: String,
        #[arg(long, value_enum, default_value = "ttd")]
        policy: PolicyArg,
        /// Most resources listed (0 = all).
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Also list (on stderr) the resources filtered out, with the reason.
        #[arg(long)]
        rejected: bool,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Reserve resources for jobs that must start together (exit status 2 when no common start
    /// exists in the window).
    Coallocate {
        /// Coallocation file (TOML: window and [[job]] tables; docs/broker.md).
        #[arg(long)]
        jobs: PathBuf,
        #[arg(long)]
        broker: String,
        /// Orders each job's candidate resources.
        #[arg(long, value_enum, default_value = "ttd")]
        policy: PolicyArg,
        /// Start the set: each [[job]] carries what it runs (script, script_file or command, as
        /// in `gma job submit`); once all are reserved each is submitted into its reservation
        /// and the command waits until all started (exit status 3 when the set did not start
        /// within epsilon; everything is then cancelled and released).
        #[arg(long)]
        submit: bool,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Plan a workflow onto offered slots (Singh et al.): the Pareto set over allocation cost
    /// and makespan, the plan chosen by --alpha; --reserve reserves it (docs/provisioning.md).
    Provision(crate::provision::ProvisionArgs),
    /// The broker's live resource table.
    View {
        #[arg(long)]
        broker: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
#[command(mut_arg("listen", |a| a.help("Listen address of the Reservations service (overrides `listen` in --config; default 127.0.0.1:7400)")))]
#[command(mut_arg("directory", |a| a.help("Register in this directory, ADDR[,ADDR...], as a producer of reservation.state (overrides `directory` in --config)")))]
#[command(mut_arg("config", |a| a.help("TOML config: resources, background reservations, horizon (docs/broker.md)")))]
pub struct SimresArgs {
    #[command(subcommand)]
    pub command: Option<SimresCommand>,
    #[command(flatten)]
    pub role: RoleArgs,
}

#[derive(Subcommand, Debug)]
pub enum SimresCommand {
    /// The reservations a resource manager holds.
    List {
        /// The manager's address (gma simres).
        #[arg(long)]
        manager: String,
        /// Only this resource.
        #[arg(long, default_value = "")]
        resource: String,
        /// Only this owner's.
        #[arg(long, default_value = "")]
        owner: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Release a reservation (as its owner).
    Release {
        #[arg(long)]
        manager: String,
        id: String,
        #[arg(long, default_value = "")]
        owner: String,
    },
}

pub async fn run(a: BrokerArgs) -> anyhow::Result<()> {
    match a.command {
        Some(BrokerCommand::Select {
            batch: Some(batch),
            heuristic,
            broker,
            policy,
            output,
            ..
        }) => select_batch(&batch, &broker, policy, heuristic.heuristic(), output).await,
        Some(BrokerCommand::Select {
            job,
            broker,
            policy,
            limit,
            rejected,
            output,
            ..
        }) => {
            let job = job.ok_or_else(|| anyhow!("give --job FILE or --batch FILE"))?;
            select(&job, &broker, policy, limit, rejected, output).await
        }
        Some(BrokerCommand::Coallocate {
            jobs,
            broker,
            policy,
            submit,
            output,
        }) => coallocate(&jobs, &broker, policy, submit, output).await,
        Some(BrokerCommand::View { broker, output }) => view(&broker, output).await,
        Some(BrokerCommand::Provision(p)) => crate::provision::run(p).await,
        None => serve(a.role).await,
    }
}

async fn serve(role: RoleArgs) -> anyhow::Result<()> {
    let mut cfg: BrokerConfig = role.load()?;
    role.apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    require_directory(&cfg.registration.directory)?;
    let listener = open_endpoint("broker", &cfg.listen, &cfg.endpoint).await?;
    gma_broker::service::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("{e}"))
}

async fn manager(addr: &str) -> anyhow::Result<ReservationsClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(ReservationsClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

pub async fn simres(a: SimresArgs) -> anyhow::Result<()> {
    match a.command {
        Some(SimresCommand::List {
            manager: addr,
            resource,
            owner,
            output,
        }) => {
            let mut c = manager(&addr).await?;
            let req = pb::ListReservationsRequest {
                resource,
                owner,
                ..Default::default()
            };
            let r = call(&addr, c.list(req), Duration::from_secs(30)).await?;
            output.print_list(
                &r.reservations,
                "reservations",
                |x| {
                    json!({
                        "id": x.id, "resource": x.resource, "cpus": x.cpus, "start_s": x.start_s,
                        "end_s": x.end_s, "owner": x.owner,
                    })
                },
                |x| {
                    format!(
                        "{:<20} {:<16} cpus {:<4} {} .. {}  {}",
                        x.id,
                        x.resource,
                        x.cpus,
                        format_rfc3339(x.start_s * 1_000_000_000),
                        format_rfc3339(x.end_s * 1_000_000_000),
                        x.owner
                    )
                },
            );
            return Ok(());
        }
        Some(SimresCommand::Release {
            manager: addr,
            id,
            owner,
        }) => {
            let mut c = manager(&addr).await?;
            call(
                &addr,
                c.release(pb::ReleaseReservationRequest {
                    id: id.clone(),
                    owner,
                }),
                Duration::from_secs(30),
            )
            .await?;
            println!("released {id}");
            return Ok(());
        }
        None => {}
    }
    let path = a.role.config_file("the resources", "docs/broker.md")?;
    let mut cfg: SimresConfig = gma_core::config::load_toml(path)?;
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    cfg.validate()
        .map_err(|e| anyhow!("invalid config file {}: {e}", path.display()))?;
    let listen = cfg.listen.as_deref().unwrap_or("127.0.0.1:7400");
    let listener = open_endpoint("simres", listen, &cfg.endpoint).await?;
    gma_broker::simres::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("simres failed: {e}"))
}

pub async fn client(addr: &str) -> anyhow::Result<BrokerClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(BrokerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

/// Bounds one RPC and names the broker in the error.
async fn call<T>(
    addr: &str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    timeout: Duration,
) -> anyhow::Result<T> {
    match tokio::time::timeout(timeout, f).await {
        Err(_) => bail!("broker {addr} did not answer within {timeout:?}"),
        Ok(Err(s)) => bail!("broker {addr}: {} ({:?})", s.message(), s.code()),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

/// A number for JSON: `null` when not finite.
fn num(v: f64) -> serde_json::Value {
    if v.is_finite() {
        json!(v)
    } else {
        serde_json::Value::Null
    }
}

fn ranked_json(r: &pb::RankedResource) -> serde_json::Value {
    json!({
        "resource": r.resource,
        "rank": r.rank,
        "predicted_start_s": num(r.predicted_start_s),
        "predicted_completion_s": num(r.predicted_completion_s),
        "exec_s": num(r.exec_s),
        "wait_s": num(r.wait_s),
        "stage_in_s": num(r.stage_in_s),
        "stage_out_s": num(r.stage_out_s),
        "utility": num(r.utility),
        "cost": num(r.cost),
        "score": num(r.score),
        "stale": r.stale,
        "age_ms": r.age_ms,
        "site": r.site,
    })
}

async fn select(
    job: &std::path::Path,
    broker: &str,
    policy: PolicyArg,
    limit: u32,
    rejected: bool,
    output: Output,
) -> anyhow::Result<()> {
    let job = Job::load(job).map_err(|e| anyhow!("{e}"))?;
    let mut c = client(broker).await?;
    let req = pb::SelectRequest {
        job: Some(job.to_proto()),
        policy: policy_to_proto(policy.policy()) as i32,
        limit,
        include_rejected: rejected,
    };
    let r = call(broker, c.select(req), Duration::from_secs(30)).await?;
    match output {
        Output::Json => println!(
            "{}",
            serde_json::Value::Array(r.ranked.iter().map(ranked_json).collect())
        ),
        Output::Table => {
            let cost = policy == PolicyArg::Cost;
            let util = policy == PolicyArg::Utility;
            println!(
                "{:>4}  {:<24} {:>10} {:>13} {:>10} {:>10} {:>9} {:>9}{}{} {:>7}",
                "rank",
                "resource",
                "start_s",
                "completion_s",
                "exec_s",
                "wait_s",
                "stage_in",
                "stage_out",
                if util { "   utility" } else { "" },
                if cost { "       cost" } else { "" },
                "age_ms"
            );
            for x in &r.ranked {
                println!(
                    "{:>4}  {:<24} {:>10.1} {:>13.1} {:>10.1} {:>10.1} {:>9.1} {:>9.1}{}{} {:>7}{}",
                    x.rank,
                    x.resource,
                    x.predicted_start_s,
                    x.predicted_completion_s,
                    x.exec_s,
                    x.wait_s,
                    x.stage_in_s,
                    x.stage_out_s,
                    if util {
                        format!(" {:>9.3}", x.utility)
                    } else {
                        String::new()
                    },
                    if cost {
                        format!(" {:>10.4}", x.cost)
                    } else {
                        String::new()
                    },
                    x.age_ms,
                    if x.stale { "  (stale: conservative)" } else { "" },
                );
            }
            println!(
                "policy {}, decision {}, {} ranked of {} resources in view ({} stale), {:.0} us",
                r.policy,
                r.decision_id,
                r.ranked.len(),
                r.view_resources,
                r.view_stale,
                r.decide_us
            );
        }
    }
    if rejected {
        for x in &r.rejected {
            eprintln!("rejected {}: {}", x.resource, x.reason);
        }
    }
    Ok(())
}

/// `select --batch`: one Select per job (the policy's candidates and their predicted start and
/// completion), then the heuristic over those predictions (gma_broker::batch).
async fn select_batch(
    path: &std::path::Path,
    broker: &str,
    policy: PolicyArg,
    heuristic: Heuristic,
    output: Output,
) -> anyhow::Result<()> {
    let file = BatchFile::load(path).map_err(|e| anyhow!("{e}"))?;
    let mut c = client(broker).await?;
    let mut per_job = Vec::with_capacity(file.job.len());
    for job in &file.job {
        let req = pb::SelectRequest {
            job: Some(job.to_proto()),
            policy: policy_to_proto(policy.policy()) as i32,
            limit: 0,
            include_rejected: false,
        };
        let r = call(broker, c.select(req), Duration::from_secs(30)).await?;
        per_job.push(
            r.ranked
                .iter()
                .map(|x| (x.resource.clone(), x.predicted_start_s, x.predicted_completion_s))
                .collect::<Vec<_>>(),
        );
    }
    let (names, cells) = gma_broker::batch::matrix(&per_job);
    let s = gma_broker::batch::schedule(&cells, heuristic);
    match output {
        Output::Json => println!(
            "{}",
            json!({
                "heuristic": heuristic.as_str(),
                "policy": policy.policy().as_str(),
                "makespan_s": s.makespan_s,
                "assignments": s.assignments.iter().enumerate().map(|(i, a)| json!({
                    "order": i + 1,
                    "job": file.job[a.job].name,
                    "resource": names[a.resource],
                    "start_s": a.start_s,
                    "completion_s": a.completion_s,
                })).collect::<Vec<_>>(),
                "unplaceable": s.unplaceable.iter().map(|j| file.job[*j].name.clone()).collect::<Vec<_>>(),
            })
        ),
        Output::Table => {
            println!(
                "{:>5}  {:<24} {:<24} {:>10} {:>13}",
                "order", "job", "resource", "start_s", "completion_s"
            );
            for (i, a) in s.assignments.iter().enumerate() {
                println!(
                    "{:>5}  {:<24} {:<24} {:>10.1} {:>13.1}",
                    i + 1,
                    file.job[a.job].name,
                    names[a.resource],
                    a.start_s,
                    a.completion_s
                );
            }
            println!(
                "heuristic {}, policy {}: {} jobs on {} resources, predicted makespan {:.1} s",
                heuristic.as_str(),
                policy.policy().as_str(),
                s.assignments.len(),
                names.len(),
                s.makespan_s
            );
        }
    }
    if !s.unplaceable.is_empty() {
        for j in &s.unplaceable {
            eprintln!("unplaceable {}: no candidate resource", file.job[*j].name);
        }
        std::process::exit(2);
    }
    Ok(())
}

async fn coallocate(
    path: &std::path::Path,
    broker: &str,
    policy: PolicyArg,
    submit: bool,
    output: Output,
) -> anyhow::Result<()> {
    let (file, runs) = if submit {
        gma_broker::costart::load_with_runs(path).map_err(|e| anyhow!("{e}"))?
    } else {
        (CoallocFile::load(path).map_err(|e| anyhow!("{e}"))?, Vec::new())
    };
    let now_s = now_ns() / 1_000_000_000;
    let mut req = file.to_request(now_s, policy_to_proto(policy.policy()));
    req.runs = runs;
    let (start, end, eps) = (req.window_start_s, req.window_end_s, req.epsilon_s);
    let mut c = client(broker).await?;
    // Each reservation operation is bounded by the broker; a long window takes many. A set
    // being started is followed until its latest possible start (plus epsilon and the grace).
    let wait_s = if req.runs.is_empty() {
        600
    } else {
        (end - now_s).max(0) + eps + gma_broker::costart::START_GRACE_S + 600
    };
    let r = call(
        broker,
        c.coallocate(req),
        Duration::from_secs(wait_s.unsigned_abs()),
    )
    .await?;
    let stats = r.stats.unwrap_or_default();
    match output {
        Output::Json => println!(
            "{}",
            json!({
                "success": r.success,
                "reason": r.reason,
                "window_start_s": start,
                "window_end_s": end,
                "epsilon_s": eps,
                "stage": r.stage,
                "spread_s": r.spread_s,
                "reservations": r.reservations.iter().map(|j| {
                    let res = j.reservation.clone().unwrap_or_default();
                    let batch = j.batch.as_ref().map(|b| json!({
                        "job_id": b.job_id, "state": b.state, "start_s": b.start_s,
                        "submit_s": b.submit_s, "reason": b.reason, "output": b.output,
                    }));
                    json!({
                        "job": j.job, "resource": res.resource, "id": res.id, "cpus": res.cpus,
                        "start_s": res.start_s, "end_s": res.end_s, "owner": res.owner, "manager": j.manager,
                        "batch": batch,
                    })
                }).collect::<Vec<_>>(),
                "stats": {
                    "iterations": stats.iterations, "creates": stats.creates,
                    "failed_creates": stats.failed_creates, "modifies": stats.modifies,
                    "failed_modifies": stats.failed_modifies, "augmentations": stats.augmentations,
                    "failed_augmentations": stats.failed_augmentations, "releases": stats.releases,
                },
                "elapsed_ms": r.elapsed_ms,
                "decision_id": r.decision_id,
            })
        ),
        Output::Table => {
            if !r.stage.is_empty() && r.stage != "reserve" {
                print_started(&r, eps);
            } else if r.success {
                println!(
                    "coallocated {} jobs (window {} .. {}, epsilon {} s):",
                    r.reservations.len(),
                    format_rfc3339(start * 1_000_000_000),
                    format_rfc3339(end * 1_000_000_000),
                    eps
                );
                for j in &r.reservations {
                    let res = j.reservation.clone().unwrap_or_default();
                    println!(
                        "  {:<16} -> {:<16} {} .. {}  cpus {:<4} id {}  at {}",
                        j.job,
                        res.resource,
                        format_rfc3339(res.start_s * 1_000_000_000),
                        format_rfc3339(res.end_s * 1_000_000_000),
                        res.cpus,
                        res.id,
                        j.manager
                    );
                }
            } else {
                println!("no coallocation: {}", r.reason);
            }
            println!(
                "{} iterations, {} reservations created ({} refused), {} modified ({} refused), {} augmenting paths ({} failed), {} released, {:.1} ms",
                stats.iterations,
                stats.creates,
                stats.failed_creates,
                stats.modifies,
                stats.failed_modifies,
                stats.augmentations,
                stats.failed_augmentations,
                stats.releases,
                r.elapsed_ms
            );
        }
    }
    if !r.success {
        std::process::exit(if r.stage.is_empty() || r.stage == "reserve" {
            2
        } else {
            3
        });
    }
    Ok(())
}

/// The table of a submitted set: each job's reservation, batch job and actual start.
fn print_started(r: &pb::CoallocateResponse, eps: i64) {
    if r.success {
        println!(
            "started {} jobs, spread {} s (epsilon {eps} s):",
            r.reservations.len(),
            r.spread_s
        );
    } else {
        println!("not started ({}): {}", r.stage, r.reason);
    }
    let time = |s: i64| {
        if s > 0 {
            format_rfc3339(s * 1_000_000_000)
        } else {
            "-".to_string()
        }
    };
    for j in &r.reservations {
        let res = j.reservation.clone().unwrap_or_default();
        let b = j.batch.clone().unwrap_or_default();
        println!(
            "  {:<16} -> {:<16} reserved {}  started {}  job {:<10} {:<10} id {}  at {}",
            j.job,
            res.resource,
            time(res.start_s),
            time(b.start_s),
            if b.job_id.is_empty() { "-" } else { &b.job_id },
            if b.state.is_empty() { "unclaimed" } else { &b.state },
            res.id,
            j.manager
        );
    }
}

async fn view(broker: &str, output: Output) -> anyhow::Result<()> {
    let mut c = client(broker).await?;
    let r = call(broker, c.view(pb::BrokerViewRequest {}), Duration::from_secs(30)).await?;
    match output {
        Output::Json => println!(
            "{}",
            serde_json::Value::Array(
                r.resources
                    .iter()
                    .map(|x| json!({
                        "resource": x.resource, "producer": x.producer, "total_cpus": num(x.total_cpus),
                        "free_cpus": num(x.free_cpus), "load1": num(x.load1), "queue_waiting": num(x.queue_waiting),
                        "memory_mb": num(x.memory_mb), "arch": x.arch, "os": x.os,
                        "benchmarks": x.benchmarks, "bandwidth_mbps": num(x.bandwidth_mbps),
                        "cost_per_cpu_hour": num(x.cost_per_cpu_hour), "age_ms": x.age_ms, "stale": x.stale,
                        "site": x.site,
                    }))
                    .collect()
            )
        ),
        Output::Table => {
            println!(
                "{:<24} {:>6} {:>6} {:>6} {:>6} {:>9} {:<8} {:>8} {:>7}",
                "resource", "cpus", "free", "load1", "queue", "memory", "arch", "specint", "age_ms"
            );
            for x in &r.resources {
                println!(
                    "{:<24} {:>6} {:>6} {:>6.2} {:>6} {:>9} {:<8} {:>8} {:>7}{}",
                    x.resource,
                    x.total_cpus,
                    x.free_cpus,
                    x.load1,
                    x.queue_waiting,
                    x.memory_mb,
                    x.arch,
                    x.benchmarks.get("specint").map_or("-".into(), |v| format!("{v:.0}")),
                    x.age_ms,
                    if x.stale { "  stale" } else { "" }
                );
            }
            println!("{} resources (stale after {} ms)", r.resources.len(), r.max_age_ms);
        }
    }
    Ok(())
}
