//! `gma bench resched`: how fast the rescheduler turns a contract violation into a decision.
//!
//! In one process, over real gRPC on loopback: a directory, a producer running 1,000
//! simulated hosts, and the rescheduler (its action is a no-op command, so only deciding is
//! measured). Each trial publishes an application's `app.state` and then its contract
//! monitor's `migration_request` through `Ingest`; the time is from that request's timestamp
//! to the moment a subscriber receives the `resched.decision` event. Separately, the pure
//! `plan()` is timed over a 1,000-host view.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_consumer::stream::{ProducerStream, StreamOptions};
use gma_core::event::EventData;
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use gma_rescheduler::action::ActionConfig;
use gma_rescheduler::service::ReschedulerConfig;
use gma_rescheduler::{plan, AppState, HostLoad, Mode, Policy};
use hdrhistogram::Histogram;

use crate::args::Output;

const HOSTS: usize = 1000;

/// Pushes one event of `schema` into the producer through `Ingest`.
async fn push(
    ingest: &mut pb::ingest_client::IngestClient<tonic::transport::Channel>,
    event: &EventData,
    schema: &pb::EventSchema,
) -> anyhow::Result<()> {
    ingest
        .push(pb::IngestRequest {
            events: vec![event.to_wire(0, &schema.fields)],
            schemas: vec![],
        })
        .await
        .map_err(|s| anyhow!("ingest: {}", s.message()))?;
    Ok(())
}

pub async fn run(trials: u32, output: Output) -> anyhow::Result<()> {
    if trials == 0 {
        bail!("--trials must be positive");
    }
    let tmp = tempfile::tempdir().context("temp dir")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let dl = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let dir = dl.local_addr()?.to_string();
    tokio::spawn(gma_directory::run(
        gma_directory::DirectoryConfig::new(tmp.path().join("d")),
        dl,
        stop(),
    ));

    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        format!("period_ms = 500\n[[generate]]\ncount = {HOSTS}\nprefix = \"sim\"\nseed = 7\ncpus = 8\n"),
    )?;
    let producer = gma_producer::Producer::new(gma_producer::ProducerConfig {
        registration: gma_core::registration::Registration::new(Some(dir.clone())),
        host_sensors: false,
        source: Some("bench-sim".into()),
        simulate: Some(sim),
        ..gma_producer::ProducerConfig::default()
    })
    .map_err(|e| anyhow!("{e}"))?;
    let cschema = gma_sensors::contract::contract_schema();
    let sschema = gma_rescheduler::app_state_schema();
    producer
        .hub
        .add_schemas(&[cschema.clone(), sschema.clone()])
        .map_err(|e| anyhow!("{e}"))?;
    let pl = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let paddr = pl.local_addr()?.to_string();
    tokio::spawn(producer.run(pl, stop()));

    let rl = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let raddr = rl.local_addr()?.to_string();
    let cfg = ReschedulerConfig {
        registration: gma_core::registration::Registration::new(Some(dir.clone())),
        cost_s: 900.0,
        threshold: 0.3,
        max_age_ms: 5000,
        opportunistic: false,
        action: ActionConfig::Commands {
            stop: "true".into(),
            resume: "true".into(),
            declined: None,
        },
        ..ReschedulerConfig::default()
    };
    tokio::spawn(gma_rescheduler::service::run(cfg, rl, stop()));

    let ch = gma_consumer::connect(&paddr).await.map_err(|e| anyhow!("{e}"))?;
    let mut ingest = pb::ingest_client::IngestClient::new(ch);
    let mut decisions = ProducerStream::new(
        &raddr,
        StreamOptions {
            patterns: vec!["resched.decision".into()],
            ..StreamOptions::default()
        },
    );
    // Wait until the rescheduler follows the producer (its view has the hosts).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut e2e = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut inside = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for i in 0..trials {
        let app_id = format!("bench-{i}");
        let now = now_ns();
        let state = EventData {
            name: "app.state".into(),
            source: app_id.clone(),
            timestamp_ns: now,
            numbers: vec![10.0, 100.0, 0.1, 20_000.0, 3.0],
            strings: vec![
                app_id.clone(),
                "running".into(),
                "sim-0000".into(),
                String::new(),
                String::new(),
            ],
        };
        push(&mut ingest, &state, &sschema).await?;
        let sent = now_ns();
        let request = EventData {
            name: "app.contract".into(),
            source: app_id.clone(),
            timestamp_ns: sent,
            numbers: vec![10.0, 300.0, 100.0, 3.0, 3.0, 1.5, 0.5, 0.1],
            strings: vec![app_id.clone(), "migration_request".into()],
        };
        push(&mut ingest, &request, &cschema).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = None;
        while got.is_none() {
            if Instant::now() > deadline {
                bail!("no decision for {app_id} within 10 s");
            }
            decisions
                .next_with(|e| {
                    if e.text("app_id") == Some(app_id.as_str()) {
                        got = Some((now_ns(), e.number("decide_ms").unwrap_or(f64::NAN)));
                    }
                })
                .await
                .map_err(|e| anyhow!("{e}"))?;
        }
        if let Some((at, decide_ms)) = got {
            let _ = e2e.record(((at - sent) / 1000).max(1) as u64);
            if decide_ms.is_finite() {
                let _ = inside.record(((decide_ms * 1000.0) as u64).max(1));
            }
        }
    }

    // The pure decision over 1,000 hosts.
    let view: Vec<HostLoad> = (0..HOSTS)
        .map(|i| HostLoad {
            host: format!("sim-{i:04}"),
            cpus: 8.0,
            free_cpus: (i % 8) as f64,
            load1: (i % 13) as f64 * 0.7,
            bench: 0.8 + (i % 5) as f64 * 0.1,
            age_ms: (i % 3000) as u64,
        })
        .collect();
    let app = AppState {
        app_id: "a".into(),
        hosts: vec!["sim-0000".into()],
        cpus_needed: 4,
        fraction_completed: 0.2,
        total_predicted_s: 20_000.0,
        observed_avg_ratio: 2.5,
    };
    let policy = Policy::default();
    let n = 2000u32;
    let t0 = Instant::now();
    let mut migrate = 0;
    for _ in 0..n {
        let p = plan(&app, &view, Mode::OnRequest, &policy);
        if p.decision == gma_rescheduler::Decision::Migrate {
            migrate += 1;
        }
    }
    let plan_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    let _ = stop_tx.send(true);

    let q = |h: &Histogram<u64>, p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    match output {
        Output::Json => crate::report::emit(serde_json::json!({
            "scenario": "resched", "machine_cores": crate::report::cores(), "trials": trials,
            "hosts": HOSTS,
            "request_to_decision_ms": {"p50": q(&e2e, 0.5), "p99": q(&e2e, 0.99), "max": e2e.max() as f64 / 1000.0},
            "inside_rescheduler_ms": {"p50": q(&inside, 0.5), "p99": q(&inside, 0.99)},
            "plan_us_1000_hosts": plan_us, "plan_migrated": migrate == n,
        })),
        Output::Table => {
            println!(
                "resched: contract violation -> published decision, {HOSTS} simulated hosts, loopback gRPC"
            );
            println!("  machine cores                 {}", crate::report::cores());
            println!(
                "  request -> decision received  p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms ({trials} trials)",
                q(&e2e, 0.5),
                q(&e2e, 0.99),
                e2e.max() as f64 / 1000.0
            );
            println!(
                "  inside the rescheduler        p50 {:.2} ms  p99 {:.2} ms (request event time -> decision published)",
                q(&inside, 0.5),
                q(&inside, 0.99)
            );
            println!("  one decision, {HOSTS} hosts      {plan_us:.1} us (pure plan(), {n} runs)");
        }
    }
    Ok(())
}
