//! `gma grid`: resource queries through the hierarchy of federation endpoints, and
//! reservations through the endpoint that manages a host (docs/federation.md).

use std::path::PathBuf;

use anyhow::anyhow;
use clap::{Args, Subcommand};
use gma_broker::job::Job;
use gma_proto::v1::{self as pb, grid_client::GridClient};
use serde_json::json;

use crate::args::Output;
use crate::federation::call;

#[derive(Args, Debug)]
pub struct GridArgs {
    #[command(subcommand)]
    pub command: GridCommand,
}

#[derive(Subcommand, Debug)]
pub enum GridCommand {
    /// Hosts matching a job's requirements, from this endpoint down its children, and up to its
    /// parent only when nothing below matched; each with the endpoint that manages it.
    Query {
        /// The requirements: a job file of `gma job submit` (cpus, memory_mb, arch, software ...).
        #[arg(long)]
        requirements: PathBuf,
        /// The federation endpoint to ask.
        #[arg(long)]
        federation: String,
        /// Links the query may travel (0 = this endpoint only; absent = unlimited).
        #[arg(long)]
        levels: Option<u32>,
        /// Answer within this many milliseconds (partial answers name who did not answer).
        #[arg(long, default_value_t = 5000)]
        deadline_ms: u32,
        #[arg(long, default_value_t = 1000)]
        max_results: u32,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Reserve a host at the endpoint that manages it: prints the reservation number.
    Reserve {
        /// The managing endpoint (the `endpoint` of a query answer).
        #[arg(long)]
        federation: String,
        #[arg(long)]
        host: String,
        /// The job that will run there (its CPUs, unless --exclusive).
        #[arg(long)]
        job: PathBuf,
        /// All the host's CPUs.
        #[arg(long)]
        exclusive: bool,
        /// Unix seconds (0 = now).
        #[arg(long, default_value_t = 0)]
        start_s: i64,
        /// Real seconds (0 = the job's walltime at the endpoint's time scale).
        #[arg(long, default_value_t = 0)]
        duration_s: u32,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Start the job of a reservation on its host: prints the job id.
    Start {
        number: u64,
        #[arg(long)]
        federation: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Release a reservation.
    Release {
        number: u64,
        #[arg(long)]
        federation: String,
    },
    /// The reservations an endpoint holds.
    List {
        #[arg(long)]
        federation: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

async fn client(addr: &str) -> anyhow::Result<GridClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(GridClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

fn reservation_json(r: &pb::GridReservation) -> serde_json::Value {
    json!({
        "number": r.number, "site": r.site, "host": r.host, "cpus": r.cpus, "start_s": r.start_s,
        "end_s": r.end_s, "exclusive": r.exclusive, "state": r.state, "job_id": r.job_id,
        "owner": r.owner, "epoch": r.epoch,
    })
}

fn reservation_line(r: &pb::GridReservation) -> String {
    format!(
        "{:<8} {:<12} {:<16} {:>4} {:>11} {:>11} {:<9} {:<9} {}",
        r.number,
        r.site,
        r.host,
        r.cpus,
        r.start_s,
        r.end_s,
        if r.exclusive { "exclusive" } else { "shared" },
        r.state,
        r.job_id
    )
}

fn print_reservation(r: &pb::GridReservation, output: Output, table: String) {
    match output {
        Output::Json => println!("{}", reservation_json(r)),
        Output::Table => println!("{table}"),
    }
}

pub async fn run(a: GridArgs) -> anyhow::Result<()> {
    match a.command {
        GridCommand::Query {
            requirements,
            federation,
            levels,
            deadline_ms,
            max_results,
            output,
        } => {
            let job = Job::load(&requirements).map_err(|e| anyhow!("{e}"))?;
            let mut c = client(&federation).await?;
            let q = pb::GridQuery {
                query_id: String::new(),
                requirements: Some(job.to_proto()),
                levels,
                path: Vec::new(),
                deadline_ms,
                max_results,
            };
            let r = call(&federation, c.query(q)).await?;
            match output {
                Output::Json => {
                    let res: Vec<serde_json::Value> = r
                        .resources
                        .iter()
                        .map(|x| {
                            json!({
                                "site": x.site, "endpoint": x.endpoint, "host": x.host, "arch": x.arch,
                                "os": x.os, "cpus_total": x.cpus_total, "cpus_free": x.cpus_free,
                                "memory_mb": x.memory_mb, "load1": x.load1, "completion_s": x.completion_s,
                                "distance": x.distance,
                            })
                        })
                        .collect();
                    println!(
                        "{}",
                        json!({
                            "query_id": r.query_id, "resources": res, "answered": r.answered,
                            "unreached": r.unreached, "escalations": r.escalations,
                            "duplicates": r.duplicates, "truncated": r.truncated,
                        })
                    );
                }
                Output::Table => {
                    println!(
                        "{:<12} {:<22} {:<16} {:<8} {:>5} {:>5} {:>9} {:>10} {:>4}",
                        "site", "endpoint", "host", "arch", "cpus", "free", "mem MB", "ttd s", "dist"
                    );
                    for x in &r.resources {
                        println!(
                            "{:<12} {:<22} {:<16} {:<8} {:>5} {:>5} {:>9.0} {:>10.1} {:>4}",
                            x.site,
                            x.endpoint,
                            x.host,
                            x.arch,
                            x.cpus_total,
                            x.cpus_free,
                            x.memory_mb,
                            x.completion_s,
                            x.distance
                        );
                    }
                    println!(
                        "{} resources from {} managers (query {}){}{}",
                        r.resources.len(),
                        r.answered.len(),
                        r.query_id,
                        if r.escalations.is_empty() {
                            String::new()
                        } else {
                            format!("; escalated {}", r.escalations.join(", "))
                        },
                        if r.truncated { "; truncated" } else { "" }
                    );
                    for u in &r.unreached {
                        println!("not answered: {u}");
                    }
                }
            }
            Ok(())
        }
        GridCommand::Reserve {
            federation,
            host,
            job,
            exclusive,
            start_s,
            duration_s,
            output,
        } => {
            let job = Job::load(&job).map_err(|e| anyhow!("{e}"))?;
            let mut c = client(&federation).await?;
            let r = call(
                &federation,
                c.reserve(pb::GridReserveRequest {
                    host,
                    job: Some(job.to_proto()),
                    exclusive,
                    start_s,
                    duration_s,
                }),
            )
            .await?;
            print_reservation(&r, output, r.number.to_string());
            Ok(())
        }
        GridCommand::Start {
            number,
            federation,
            output,
        } => {
            let mut c = client(&federation).await?;
            let r = call(&federation, c.start(pb::GridReservationRef { number })).await?;
            print_reservation(&r, output, r.job_id.clone());
            Ok(())
        }
        GridCommand::Release { number, federation } => {
            let mut c = client(&federation).await?;
            let r = call(&federation, c.release(pb::GridReservationRef { number })).await?;
            println!("released reservation {} ({} on {})", r.number, r.cpus, r.host);
            Ok(())
        }
        GridCommand::List { federation, output } => {
            let mut c = client(&federation).await?;
            let r = call(&federation, c.list(pb::GridListRequest {})).await?;
            output.print_list(
                &r.reservations,
                "reservations",
                reservation_json,
                reservation_line,
            );
            Ok(())
        }
    }
}
