//! `gma bench federation`: mean job completion with federation vs local-only (simulated sites,
//! the real route() and job manager), summary size, route() latency, and the propagation
//! latency of summaries over real gRPC.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gma_broker::job::Job;
use gma_federation::config::FederationConfig;
use gma_federation::route::RoutePolicy;
use gma_federation::sim::{route_latency, run_scenario, summary_bytes_1000_hosts, Scenario};
use gma_federation::site::{Link, Role};
use gma_proto::v1::{self as pb, site_scheduler_client::SiteSchedulerClient};
use hdrhistogram::Histogram;
use serde_json::json;

use crate::args::Output;

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
    let la = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let lb = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (aa, ab) = (la.local_addr()?.to_string(), lb.local_addr()?.to_string());
    let cfg = |site: &str, peer: &str, addr: &str| FederationConfig {
        registration: gma_core::registration::Registration {
            site: site.into(),
            ..Default::default()
        },
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

pub async fn run(
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

/// A SiteScheduler client with the fabric's message-size bound.
async fn scheduler(addr: &str) -> anyhow::Result<SiteSchedulerClient<tonic::transport::Channel>> {
    let ch = gma_consumer::connect(addr).await?;
    Ok(SiteSchedulerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}
