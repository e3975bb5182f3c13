//! `gma federation` (run a site's federation endpoint; `add`, `remove`, `status` of its links),
//! `gma job` (submit, status, list, cancel at an endpoint) and `gma bench federation`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use gma_broker::job::Job;
use gma_federation::config::FederationConfig;
use gma_federation::route::RoutePolicy;
use gma_federation::sim::{route_latency, run_scenario, summary_bytes_1000_hosts, Scenario};
use gma_federation::site::{Link, Role};
use gma_federation::summary::Summary;
use gma_proto::v1::{self as pb, site_scheduler_client::SiteSchedulerClient};
use hdrhistogram::Histogram;
use serde_json::json;

use crate::cli::Output;
use crate::roles::{apply_security, bind, bind_checked, shutdown_signal};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FederationArgs {
    #[command(subcommand)]
    pub command: Option<FederationCommand>,
    /// TOML config: site, directory, peers, rank, route, leases ... (docs/federation.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address (overrides the config).
    #[arg(long)]
    pub listen: Option<String>,
    /// The site's directory (overrides the config).
    #[arg(long)]
    pub directory: Option<String>,
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
}

#[derive(Args, Debug)]
pub struct JobArgs {
    #[command(subcommand)]
    pub command: JobCommand,
}

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Submit a job (the broker's job file): prints its global id `<site>/<uuid>`.
    Submit {
        #[arg(long)]
        job: PathBuf,
        /// The site's federation endpoint.
        #[arg(long)]
        federation: String,
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
                match output {
                    Output::Json => println!(
                        "{}",
                        serde_json::Value::Array(
                            links
                                .iter()
                                .map(|l| json!({"site": l.site, "endpoint": l.endpoint, "role": l.role.as_str(), "hops": l.hops()}))
                                .collect()
                        )
                    ),
                    Output::Table => {
                        for l in &links {
                            println!("{:<20} {:<24} {:<7} hops {}", l.site, l.endpoint, l.role.as_str(), l.hops());
                        }
                        println!("{} links", links.len());
                    }
                }
                Ok(())
            }
            (None, None) => {
                bail!("give --federation ADDR (a running endpoint) or --directory ADDR (its link records)")
            }
        },
        None => serve(a.config, a.listen, a.directory).await,
    }
}

async fn serve(
    config: Option<PathBuf>,
    listen: Option<String>,
    directory: Option<String>,
) -> anyhow::Result<()> {
    let Some(path) = config else {
        bail!("give the endpoint's config with --config FILE (site = \"...\" at least; docs/federation.md)");
    };
    let mut cfg: FederationConfig = gma_core::config::load_toml(&path)?;
    if let Some(l) = listen {
        cfg.listen = l;
    }
    if directory.is_some() {
        cfg.directory = directory;
    }
    cfg.validate()
        .map_err(|e| anyhow!("invalid config file {}: {e}", path.display()))?;
    apply_security(&mut cfg.tls, &mut cfg.policy)?;
    let listener = bind_checked(&cfg.listen, &cfg.tls).await?;
    eprintln!("gma federation listening on {}", listener.local_addr()?);
    gma_federation::service::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("{e}"))
}

async fn scheduler(addr: &str) -> anyhow::Result<SiteSchedulerClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(SiteSchedulerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

async fn call<T>(
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

fn ms_ago(v: i64) -> String {
    if v < 0 {
        "-".into()
    } else {
        format!("{v} ms")
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
                    ms_ago(p.summary_age_ms),
                    p.cpus_free_sum,
                    p.forwarded_out,
                    p.forwarded_in,
                    ms_ago(p.heard_ms_ago),
                    p.last_error
                );
            }
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
            site,
            count,
            output,
        } => {
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
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::Value::Array(r.jobs.iter().map(job_json).collect())
                ),
                Output::Table => {
                    for j in &r.jobs {
                        println!("{}", job_line(j));
                    }
                    println!("{} jobs", r.jobs.len());
                }
            }
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

// ---------------------------------------------------------------------------------------------
// gma bench federation
// ---------------------------------------------------------------------------------------------

struct Pair {
    fed: f64,
    local: f64,
    forwarded_pct: f64,
    started_twice: usize,
    jobs: usize,
    finished: usize,
    summary_bytes: f64,
}

/// (hosts per site, CPUs per host, job shapes).
type Shape = (u32, u32, Vec<u32>);

fn compare(loads: &[f64], jobs: usize, seeds: u64, shape: &Shape) -> Pair {
    let (mut fed, mut local, mut fwd, mut twice, mut n, mut fin, mut bytes) = (0.0, 0.0, 0.0, 0, 0, 0, 0.0);
    for seed in 1..=seeds {
        let sc = Scenario {
            loads: loads.to_vec(),
            jobs_per_site: jobs,
            hosts: shape.0,
            cpus_per_host: shape.1,
            shapes: shape.2.clone(),
            seed,
            policy: RoutePolicy::default(),
            ..Scenario::default()
        };
        let f = run_scenario(&sc, true);
        let l = run_scenario(&sc, false);
        fed += f.mean_completion_s;
        local += l.mean_completion_s;
        fwd += f.forwarded as f64 / f.jobs.max(1) as f64 * 100.0;
        twice += f.started_twice + l.started_twice;
        n += f.jobs;
        fin += f.finished;
        bytes += f.mean_summary_bytes;
    }
    let k = seeds.max(1) as f64;
    Pair {
        fed: fed / k,
        local: local / k,
        forwarded_pct: fwd / k,
        started_twice: twice,
        jobs: n,
        finished: fin,
        summary_bytes: bytes / k,
    }
}

/// Summary propagation between two real endpoints over loopback gRPC: a change at A (a job
/// queued) until B holds A's new summary. (p50, p99, max) ms.
async fn propagation(changes: usize) -> anyhow::Result<(f64, f64, f64)> {
    let la = bind("127.0.0.1:0").await?;
    let lb = bind("127.0.0.1:0").await?;
    let (aa, ab) = (la.local_addr()?.to_string(), lb.local_addr()?.to_string());
    let cfg = |site: &str, peer: &str, addr: &str| FederationConfig {
        site: site.into(),
        heartbeat_ms: 200,
        push_debounce_ms: 0,
        summary_interval_ms: 60_000,
        tick_ms: 50,
        peer: vec![Link {
            site: peer.into(),
            endpoint: addr.into(),
            role: Role::Peer,
            hops: 0,
        }],
        ..FederationConfig::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let a = tokio::spawn(gma_federation::service::run(
        cfg("A", "B", &ab),
        la,
        stop(stop_rx.clone()),
    ));
    let b = tokio::spawn(gma_federation::service::run(
        cfg("B", "A", &aa),
        lb,
        stop(stop_rx.clone()),
    ));
    let mut ca = scheduler(&aa).await?;
    let mut cb = scheduler(&ab).await?;
    let seq_at_b = |s: &pb::FederationStatusReply| {
        s.peers
            .iter()
            .find(|p| p.site == "A")
            .map_or(0, |p| p.summary_seq)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = cb
            .federation_status(pb::FederationStatusRequest {})
            .await?
            .into_inner();
        if seq_at_b(&s) > 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("B never received A's summary");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job = Job {
        name: "probe".into(),
        cpus: 1,
        reference_time_s: 60.0,
        ..Job::default()
    };
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).context("histogram")?;
    for _ in 0..changes {
        let before = seq_at_b(
            &cb.federation_status(pb::FederationStatusRequest {})
                .await?
                .into_inner(),
        );
        let t0 = Instant::now();
        ca.submit(pb::SubmitJobRequest {
            job: Some(job.to_proto()),
            site: String::new(),
        })
        .await?;
        loop {
            let s = cb
                .federation_status(pb::FederationStatusRequest {})
                .await?
                .into_inner();
            if seq_at_b(&s) > before {
                break;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                bail!("a change at A did not reach B within 10 s");
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let _ = h.record(t0.elapsed().as_micros() as u64);
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), a).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), b).await;
    Ok((
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        h.max() as f64 / 1e3,
    ))
}

pub async fn bench(
    jobs: usize,
    seeds: u64,
    shape: Shape,
    changes: usize,
    output: Output,
) -> anyhow::Result<()> {
    if shape.0 == 0 || shape.1 == 0 || shape.2.is_empty() || shape.2.contains(&0) {
        bail!("--hosts, --cpus-per-host and every --shapes entry must be at least 1");
    }
    let t0 = Instant::now();
    let imb = compare(&[0.9, 0.3, 0.5], jobs, seeds, &shape);
    let bal = compare(&[0.5, 0.5, 0.5], jobs, seeds, &shape);
    let sim_s = t0.elapsed().as_secs_f64();
    let bytes = summary_bytes_1000_hosts();
    let (r50, r99, rmax) = route_latency(100, 10_000);
    let (p50, p99, pmax) = propagation(changes).await?;
    match output {
        Output::Json => println!(
            "{}",
            json!({
                "imbalance": {"loads": [0.9, 0.3, 0.5], "mean_completion_s_federated": imb.fed,
                    "mean_completion_s_local": imb.local, "ratio": imb.fed / imb.local,
                    "forwarded_pct": imb.forwarded_pct, "jobs": imb.jobs, "finished": imb.finished,
                    "started_twice": imb.started_twice, "mean_summary_bytes": imb.summary_bytes},
                "balance": {"loads": [0.5, 0.5, 0.5], "mean_completion_s_federated": bal.fed,
                    "mean_completion_s_local": bal.local, "ratio": bal.fed / bal.local,
                    "forwarded_pct": bal.forwarded_pct, "jobs": bal.jobs, "finished": bal.finished,
                    "started_twice": bal.started_twice},
                "summary_bytes_1000_hosts_8_classes": bytes,
                "route_us_100_peers": {"p50": r50, "p99": r99, "max": rmax},
                "propagation_ms": {"p50": p50, "p99": p99, "max": pmax, "changes": changes},
                "simulation_wall_s": sim_s,
                "sites": {"hosts": shape.0, "cpus_per_host": shape.1, "shapes": shape.2},
            })
        ),
        Output::Table => {
            println!(
                "simulated: 3 sites x {} CPUs ({} hosts x {}), {jobs} jobs per site, {seeds} seeds, job CPUs uniform over {:?}, exp. run time mean 1 h ({sim_s:.1} s wall)",
                shape.0 * shape.1,
                shape.0,
                shape.1,
                shape.2
            );
            for (name, p) in [("imbalance 90/30/50 %", &imb), ("balance 50/50/50 %", &bal)] {
                println!(
                    "{name:<22} mean completion federated {:>8.0} s  local-only {:>8.0} s  ratio {:.3}  forwarded {:>5.1} %  finished {}/{}  run twice {}",
                    p.fed,
                    p.local,
                    p.fed / p.local,
                    p.forwarded_pct,
                    p.finished,
                    p.jobs,
                    p.started_twice
                );
            }
            println!("site.summary for 1,000 hosts in 8 classes: {bytes} bytes (exchanged in the simulation: {:.0} bytes mean)", imb.summary_bytes);
            println!(
                "route() with 100 peers x 16 classes: p50 {r50:.1} us  p99 {r99:.1} us  max {rmax:.1} us"
            );
            println!(
                "summary propagation A -> B over loopback gRPC ({changes} changes): p50 {p50:.2} ms  p99 {p99:.2} ms  max {pmax:.2} ms"
            );
        }
    }
    Ok(())
}
