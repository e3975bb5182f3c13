//! `gma federation` (run a site's federation endpoint; `add`, `remove`, `status` of its links),
//! and `gma job` (submit, status, list, cancel at an endpoint).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use gma_broker::job::Job;
use gma_federation::config::FederationConfig;
use gma_federation::site::{Link, Role};
use gma_federation::summary::Summary;
use gma_proto::v1::{self as pb, site_scheduler_client::SiteSchedulerClient};
use serde_json::json;

use crate::args::{Output, RoleArgs};
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
#[command(mut_arg("directory", |a| a.help("The site's directory, ADDR[,ADDR...] (overrides `directory` in --config)")))]
#[command(mut_arg("config", |a| a.help("TOML config: site, directory, peers, rank, route, leases ... (docs/federation.md)")))]
pub struct FederationArgs {
    #[command(subcommand)]
    pub command: Option<FederationCommand>,
    #[command(flatten)]
    pub role: RoleArgs,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    Peer,
    Parent,
    Child,
}

#[derive(Subcommand, Debug)]
pub enum FederationCommand {
    /// Link this site (its directory) to another site's federation endpoint.
    Add {
        /// This site's directory.
        #[arg(long)]
        directory: String,
        /// The other site's id.
        #[arg(long)]
        site: String,
        /// The other site's federation endpoint, HOST:PORT.
        #[arg(long)]
        endpoint: String,
        #[arg(long, value_enum, default_value = "peer")]
        role: RoleArg,
        /// Hops a job sent there may still make (0: 1 for peers, 2 for parent/child).
        #[arg(long, default_value_t = 0)]
        hops: u32,
    },
    /// Remove the link to a site.
    Remove {
        #[arg(long)]
        directory: String,
        #[arg(long)]
        site: String,
    },
    /// Sessions, summary ages and jobs forwarded in and out (from a running endpoint), or the
    /// link records (from a directory).
    Status {
        /// The site's federation endpoint.
        #[arg(long, conflicts_with = "directory")]
        federation: Option<String>,
        /// The site's directory: list its link records.
        #[arg(long)]
        directory: Option<String>,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The hierarchy around a running endpoint: its superior chain above it, then each manager
    /// below it with its inferiors, link health (session, last reply age) and free CPUs per
    /// subtree (walked with FederationStatus at every endpoint).
    Tree {
        /// The federation endpoint to start from.
        #[arg(long)]
        federation: String,
        /// Levels below it to walk (at most 32).
        #[arg(long, default_value_t = 16)]
        depth: u32,
        /// `table` (also `text`) or `json`.
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

#[derive(Args, Debug)]
pub struct JobArgs {
    #[command(subcommand)]
    pub command: JobCommand,
}

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Submit a job (the broker's job file) to a federation endpoint: prints its global id
    /// `<site>/<uuid>`. With --broker instead: the broker ranks, reserves and starts it in a
    /// batch system's reservation (a run file with a script, docs/slurm.md), follows it and
    /// prints its end state and exit code (exit 1 unless it completed with 0).
    Submit {
        #[arg(long)]
        job: PathBuf,
        /// The site's federation endpoint.
        #[arg(long, required_unless_present = "broker", conflicts_with = "broker")]
        federation: Option<String>,
        /// A broker that runs the job (gma broker with a gma slurm resource manager).
        #[arg(long)]
        broker: Option<String>,
        /// Send it to this linked site instead of letting route() decide.
        #[arg(long)]
        site: Option<String>,
        /// Submit this many copies (names get -0, -1, ...).
        #[arg(long, default_value_t = 1)]
        count: u32,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The state of a job at the site it was submitted to.
    Status {
        id: String,
        #[arg(long)]
        federation: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The jobs a site knows (its own and those forwarded to it).
    List {
        #[arg(long)]
        federation: String,
        /// Only jobs in this state (queued, forwarded, running, finished, ...).
        #[arg(long, default_value = "")]
        state: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Cancel a job that has not started.
    Cancel {
        id: String,
        #[arg(long)]
        federation: String,
    },
}

pub async fn run(a: FederationArgs) -> anyhow::Result<()> {
    match a.command {
        Some(FederationCommand::Add {
            directory,
            site,
            endpoint,
            role,
            hops,
        }) => {
            gma_federation::config::validate_site(&site).map_err(|e| anyhow!("--site: {e}"))?;
            let role = match role {
                RoleArg::Peer => Role::Peer,
                RoleArg::Parent => Role::Parent,
                RoleArg::Child => Role::Child,
            };
            let link = Link {
                site: site.clone(),
                endpoint,
                role,
                hops,
            };
            gma_federation::links::add(&directory, &link)
                .await
                .map_err(|e| anyhow!("directory {directory}: {e}"))?;
            println!("linked {site} ({}, {} hops)", role.as_str(), link.hops());
            Ok(())
        }
        Some(FederationCommand::Remove { directory, site }) => {
            gma_federation::links::remove(&directory, &site)
                .await
                .map_err(|e| anyhow!("directory {directory}: {e}"))?;
            println!("removed the link to {site}");
            Ok(())
        }
        Some(FederationCommand::Status {
            federation,
            directory,
            output,
        }) => match (federation, directory) {
            (Some(f), _) => status(&f, output).await,
            (None, Some(d)) => {
                let links = gma_federation::links::list(&d)
                    .await
                    .map_err(|e| anyhow!("{e}"))?;
                output.print_list(
                    &links,
                    "links",
                    |l| json!({"site": l.site, "endpoint": l.endpoint, "role": l.role.as_str(), "hops": l.hops()}),
                    |l| format!("{:<20} {:<24} {:<7} hops {}", l.site, l.endpoint, l.role.as_str(), l.hops()),
                );
                Ok(())
            }
            (None, None) => {
                bail!("give --federation ADDR (a running endpoint) or --directory ADDR (its link records)")
            }
        },
        Some(FederationCommand::Tree {
            federation,
            depth,
            output,
        }) => crate::fedtree::run(&federation, depth, output).await,
        None => serve(a.role).await,
    }
}

async fn serve(role: RoleArgs) -> anyhow::Result<()> {
    let path = role.config_file(
        "the endpoint's config",
        "site = \"...\" at least; docs/federation.md",
    )?;
    let mut cfg: FederationConfig = gma_core::config::load_toml(path)?;
    role.apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    cfg.validate()
        .map_err(|e| anyhow!("invalid config file {}: {e}", path.display()))?;
    let listener = open_endpoint("federation", &cfg.listen, &cfg.endpoint).await?;
    gma_federation::service::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("{e}"))
}

pub(crate) async fn scheduler(addr: &str) -> anyhow::Result<SiteSchedulerClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(SiteSchedulerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

pub(crate) async fn call<T>(
    addr: &str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> anyhow::Result<T> {
    let timeout = Duration::from_secs(30);
    match tokio::time::timeout(timeout, f).await {
        Err(_) => bail!("federation endpoint {addr} did not answer within {timeout:?}"),
        Ok(Err(s)) => bail!(
            "federation endpoint {addr}: {} ({:?})",
            gma_core::tls::explain(&s),
            s.code()
        ),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

async fn status(addr: &str, output: Output) -> anyhow::Result<()> {
    let mut c = scheduler(addr).await?;
    let r = call(addr, c.federation_status(pb::FederationStatusRequest {})).await?;
    match output {
        Output::Json => {
            let peers: Vec<serde_json::Value> = r
                .peers
                .iter()
                .map(|p| {
                    json!({
                        "site": p.site, "endpoint": p.endpoint, "role": p.role, "session": p.session,
                        "live": p.live, "eligible": p.eligible,
                        "summary_age_ms": (p.summary_age_ms >= 0).then_some(p.summary_age_ms),
                        "summary_seq": p.summary_seq, "forwarded_out": p.forwarded_out,
                        "forwarded_in": p.forwarded_in, "in_flight_cpus": p.in_flight_cpus,
                        "cpus_free_sum": p.cpus_free_sum, "last_error": p.last_error,
                        "heard_ms_ago": (p.heard_ms_ago >= 0).then_some(p.heard_ms_ago),
                    })
                })
                .collect();
            let own = r.summary.as_ref().and_then(|s| Summary::from_proto(s).ok());
            println!(
                "{}",
                json!({
                    "site": r.site, "epoch": r.epoch, "jobs_queued": r.jobs_queued,
                    "jobs_running": r.jobs_running, "jobs_total": r.jobs_total,
                    "summary_bytes": r.summary_bytes,
                    "summary": own.map(|s| json!({
                        "seq": s.seq, "nodes_up": s.nodes_up(), "cpus_total": s.cpus_total(),
                        "cpus_free_sum": s.cpus_free_sum(), "cpus_free_max_node": s.cpus_free_max_node(),
                        "classes": s.classes.len(),
                    })),
                    "peers": peers,
                    "chain": r.chain.iter().map(|c| json!({
                        "site": c.site, "endpoint": c.endpoint, "directory": c.directory,
                    })).collect::<Vec<_>>(),
                })
            );
        }
        Output::Table => {
            println!(
                "site {} (epoch {}): {} queued, {} running, {} jobs known; summary {} bytes",
                r.site, r.epoch, r.jobs_queued, r.jobs_running, r.jobs_total, r.summary_bytes
            );
            println!(
                "{:<16} {:<7} {:<10} {:<5} {:>10} {:>9} {:>5} {:>5} {:>9}  last error",
                "peer", "role", "session", "elig", "summ age", "free cpu", "out", "in", "heard"
            );
            for p in &r.peers {
                println!(
                    "{:<16} {:<7} {:<10} {:<5} {:>10} {:>9} {:>5} {:>5} {:>9}  {}",
                    p.site,
                    p.role,
                    p.session,
                    if p.eligible { "yes" } else { "no" },
                    crate::fedtree::ms_ago(p.summary_age_ms),
                    p.cpus_free_sum,
                    p.forwarded_out,
                    p.forwarded_in,
                    crate::fedtree::ms_ago(p.heard_ms_ago),
                    p.last_error
                );
            }
            let chain: Vec<&str> = r.chain.iter().map(|c| c.site.as_str()).collect();
            println!(
                "re-attaches to (in order, when every parent is silent): {}",
                if chain.is_empty() {
                    "nobody".to_string()
                } else {
                    chain.join(", ")
                }
            );
        }
    }
    Ok(())
}

fn job_json(j: &pb::JobInfo) -> serde_json::Value {
    json!({
        "id": j.global_job_id, "name": j.name, "origin": j.origin_site, "state": j.state,
        "site": j.current_site, "host": j.host, "hops": j.hops, "visited": j.visited_sites,
        "submitted_ns": j.submitted_ns, "started_ns": j.started_ns, "finished_ns": j.finished_ns,
        "reason": j.reason, "granted": j.granted, "cpus": j.cpus, "from": j.from_site,
    })
}

fn job_line(j: &pb::JobInfo) -> String {
    format!(
        "{:<52} {:<16} {:<10} {:<14} {:<16} {}",
        j.global_job_id, j.name, j.state, j.current_site, j.host, j.reason
    )
}

pub async fn job(a: JobArgs) -> anyhow::Result<()> {
    match a.command {
        JobCommand::Submit {
            job,
            federation,
            broker,
            site,
            count,
            output,
        } => {
            let Some(federation) = federation else {
                let broker = broker.unwrap_or_default();
                if site.is_some() || count != 1 {
                    bail!("--site and --count apply to --federation, not --broker");
                }
                return crate::slurm::submit_via_broker(&job, &broker, output).await;
            };
            let spec = Job::load(&job).map_err(|e| anyhow!("{e}"))?;
            let mut c = scheduler(&federation).await?;
            let mut out = Vec::new();
            for k in 0..count.max(1) {
                let mut j = spec.clone();
                if count > 1 {
                    j.name = format!("{}-{k}", spec.name);
                }
                let r = call(
                    &federation,
                    c.submit(pb::SubmitJobRequest {
                        job: Some(j.to_proto()),
                        site: site.clone().unwrap_or_default(),
                    }),
                )
                .await?;
                match output {
                    Output::Table => println!("{}", r.global_job_id),
                    Output::Json => out.push(json!({"id": r.global_job_id, "state": r.state})),
                }
            }
            if output == Output::Json {
                println!("{}", serde_json::Value::Array(out));
            }
            Ok(())
        }
        JobCommand::Status {
            id,
            federation,
            output,
        } => {
            let mut c = scheduler(&federation).await?;
            let j = call(&federation, c.status(pb::JobStatusRequest { global_job_id: id })).await?;
            match output {
                Output::Json => println!("{}", job_json(&j)),
                Output::Table => println!("{}", job_line(&j)),
            }
            Ok(())
        }
        JobCommand::List {
            federation,
            state,
            output,
        } => {
            let mut c = scheduler(&federation).await?;
            let r = call(&federation, c.list(pb::ListJobsRequest { state })).await?;
            output.print_list(&r.jobs, "jobs", job_json, job_line);
            Ok(())
        }
        JobCommand::Cancel { id, federation } => {
            let mut c = scheduler(&federation).await?;
            let r = call(
                &federation,
                c.cancel(pb::CancelJobRequest {
                    global_job_id: id.clone(),
                    reason: String::new(),
                }),
            )
            .await?;
            println!("{id}: {}", r.state);
            Ok(())
        }
    }
}
