//! `gma netprobe` (run the network sensor) and `gma net matrix|status` (read the links and the
//! cliques of running netprobes through the directory).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand};
use gma_consumer::directory;
use gma_core::time::now_ns;
use gma_netprobe::events::{BW, BW_FORECAST, RTT, RTT_FORECAST};
use gma_netprobe::matrix::{self, Link};
use gma_netprobe::NetprobeConfig;
use gma_proto::v1::{self as pb, clique_client::CliqueClient, producer_client::ProducerClient};
use serde_json::json;

use crate::args::{require_directory, Output, RoleArgs};
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("Listen address: an address the other hosts of the clique can reach (overrides `listen` in --config; default 127.0.0.1:7700)")))]
#[command(mut_arg("config", |a| a.help("TOML config (period_ms, token_timeout_ms, transfer_bytes, max_bytes_per_s, ...; docs/netprobe.md)")))]
pub struct NetprobeArgs {
    /// The clique: netprobes of one site probe each other, one at a time.
    #[arg(long)]
    pub site: Option<String>,
    /// This host's name in net.* series (default: the kernel host name).
    #[arg(long)]
    pub source: Option<String>,
    #[arg(long)]
    pub lease_ttl_ms: Option<u64>,
    #[command(flatten)]
    pub role: RoleArgs,
}

#[derive(Args, Debug)]
pub struct NetArgs {
    #[command(subcommand)]
    pub command: NetCommand,
}

#[derive(Subcommand, Debug)]
pub enum NetCommand {
    /// The latest round-trip time and bandwidth of every measured pair of hosts, with their
    /// forecasts.
    Matrix(NetRead),
    /// What every netprobe knows of its clique's token: phase, newest token, members, counters.
    Status(NetRead),
}

/// Which netprobes `gma net` reads, and how it prints.
#[derive(Args, Debug)]
pub struct NetRead {
    /// Directory address(es): the netprobes are found by their records.
    #[arg(long)]
    directory: String,
    /// Only this clique.
    #[arg(long)]
    site: Option<String>,
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
}

pub async fn netprobe(a: NetprobeArgs) -> anyhow::Result<()> {
    let mut cfg: NetprobeConfig = a.role.load()?;
    a.role
        .apply(&mut cfg.listen, &mut cfg.registration, &mut cfg.endpoint)?;
    if let Some(s) = a.site {
        cfg.registration.site = s;
    }
    if a.source.is_some() {
        cfg.source = a.source;
    }
    if let Some(t) = a.lease_ttl_ms {
        cfg.registration.lease_ttl_ms = t;
    }
    require_directory(&cfg.registration.directory)?;
    cfg.validate()
        .map_err(|e| anyhow!("invalid netprobe config: {e}"))?;
    let listener = open_endpoint("netprobe", &cfg.listen, &cfg.endpoint).await?;
    gma_netprobe::run(cfg, listener, shutdown_signal())
        .await
        .map_err(|e| anyhow!("{e}"))
}

pub async fn net(a: NetArgs) -> anyhow::Result<()> {
    match a.command {
        NetCommand::Matrix(r) => matrix_cmd(&r.directory, r.site.as_deref(), r.output).await,
        NetCommand::Status(r) => status_cmd(&r.directory, r.site.as_deref(), r.output).await,
    }
}

const T: Duration = Duration::from_secs(10);

/// Asks every netprobe in `found`, one after the other, each within [`T`]: the answers with the
/// address that gave them; a netprobe that refuses or does not answer is a warning on stderr.
async fn ask_each<R, F, Fut>(found: &[pb::ProducerRecord], ask: F) -> Vec<(String, R)>
where
    F: Fn(tonic::transport::Channel) -> Fut,
    Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
{
    let mut answers = Vec::new();
    for p in found {
        let call = async {
            let ch = gma_consumer::connect(&p.address).await?;
            ask(ch).await.map_err(|s| anyhow!("{}", s.message()))
        };
        match tokio::time::timeout(T, call).await {
            Ok(Ok(r)) => answers.push((p.address.clone(), r.into_inner())),
            Ok(Err(e)) => eprintln!("warning: {}: {e}", p.id),
            Err(_) => eprintln!("warning: {}: no answer within {T:?}", p.id),
        }
    }
    answers
}

/// The netprobes registered in the directory (of `site`, if given).
async fn netprobes(dir: &str, site: Option<&str>) -> anyhow::Result<Vec<pb::ProducerRecord>> {
    let mut client = directory::client(dir).await.map_err(|e| anyhow!("{e}"))?;
    let mut found = directory::producers(&mut client, RTT, "")
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if let Some(s) = site {
        found.retain(|p| p.site == s);
    }
    if found.is_empty() {
        bail!(
            "no netprobe in the directory{}",
            site.map(|s| format!(" for site {s:?}")).unwrap_or_default()
        );
    }
    Ok(found)
}

async fn matrix_cmd(dir: &str, site: Option<&str>, output: Output) -> anyhow::Result<()> {
    let found = netprobes(dir, site).await?;
    let req = pb::QueryRequest {
        patterns: [RTT, BW, RTT_FORECAST, BW_FORECAST].map(String::from).to_vec(),
        sources: Vec::new(),
        max_age_ms: 0,
        ..Default::default()
    };
    let mut events = Vec::new();
    let mut schemas = BTreeMap::new();
    let answers = ask_each(&found, |ch| {
        let req = req.clone();
        async move {
            let mut c = ProducerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
            c.query(req).await
        }
    })
    .await;
    for (_, r) in answers {
        events.extend(r.events);
        schemas.extend(r.schemas.into_iter().map(|s| (s.name.clone(), s)));
    }
    let links = matrix::build(&events, &schemas);
    if links.is_empty() {
        bail!("no link measured yet ({} netprobes found)", found.len());
    }
    let now = now_ns();
    match output {
        Output::Json => println!(
            "{}",
            serde_json::Value::Array(links.iter().map(|l| link_json(l, now)).collect())
        ),
        Output::Table => {
            println!(
                "{:<16} {:<16} {:>9} {:>9} {:>8} {:>9} {:>9} {:>8} {:>6}",
                "src", "dst", "rtt_ms", "rtt_f", "rtt_mae", "bw_mbps", "bw_f", "bw_mae", "age_s"
            );
            for l in &links {
                println!(
                    "{:<16} {:<16} {:>9} {:>9} {:>8} {:>9} {:>9} {:>8} {:>6}",
                    l.src,
                    l.dst,
                    f3(l.rtt_ms),
                    f3(l.rtt_forecast_ms),
                    f3(l.rtt_mae_ms),
                    f1(l.bw_mbps),
                    f1(l.bw_forecast_mbps),
                    f1(l.bw_mae_mbps),
                    age(l, now).map_or("-".into(), |a| format!("{a:.1}"))
                );
            }
        }
    }
    Ok(())
}

fn f3(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.3}"))
}

fn f1(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

/// Seconds since the newest measurement of the link.
fn age(l: &Link, now: i64) -> Option<f64> {
    let at = l.rtt_at_ns.max(l.bw_at_ns)?;
    Some((now - at).max(0) as f64 / 1e9)
}

fn link_json(l: &Link, now: i64) -> serde_json::Value {
    json!({
        "src": l.src, "dst": l.dst,
        "rtt_ms": l.rtt_ms, "rtt_forecast_ms": l.rtt_forecast_ms, "rtt_mae_ms": l.rtt_mae_ms,
        "rtt_method": l.rtt_method, "rtt_at_ns": l.rtt_at_ns,
        "bw_mbps": l.bw_mbps, "bw_forecast_mbps": l.bw_forecast_mbps, "bw_mae_mbps": l.bw_mae_mbps,
        "bw_method": l.bw_method, "bw_at_ns": l.bw_at_ns,
        "age_s": age(l, now),
    })
}

fn token_json(t: &Option<pb::CliqueToken>) -> serde_json::Value {
    match t {
        Some(t) => json!({"generation": t.generation, "origin": t.origin, "seq": t.seq, "holder": t.holder}),
        None => serde_json::Value::Null,
    }
}

async fn status_cmd(dir: &str, site: Option<&str>, output: Output) -> anyhow::Result<()> {
    let found = netprobes(dir, site).await?;
    let rows = ask_each(&found, |ch| async move {
        CliqueClient::new(ch).status(pb::CliqueStatusRequest {}).await
    })
    .await;
    match output {
        Output::Json => println!(
            "{}",
            serde_json::Value::Array(
                rows.iter()
                    .map(|(addr, s)| json!({
                        "id": s.id, "address": addr, "site": s.site, "host": s.host, "phase": s.phase,
                        "newest": token_json(&s.newest), "members": s.members,
                        "turn_age_ms": s.turn_age_ms, "evidence_age_ms": s.evidence_age_ms,
                        "regenerations": s.regenerations, "tokens_dropped": s.tokens_dropped,
                        "probes": s.probes, "probe_failures": s.probe_failures,
                        "skipped_budget": s.skipped_budget, "bytes_sent": s.bytes_sent,
                        "bytes_received": s.bytes_received,
                    }))
                    .collect()
            )
        ),
        Output::Table => {
            println!(
                "{:<16} {:<12} {:<10} {:<28} {:>7} {:>6} {:>7} {:>8}",
                "host",
                "site",
                "phase",
                "newest token (gen.seq holder)",
                "members",
                "regen",
                "dropped",
                "probes"
            );
            for (_, s) in &rows {
                let t = s
                    .newest
                    .as_ref()
                    .map(|t| format!("{}.{} {}", t.generation, t.seq, t.holder))
                    .unwrap_or_else(|| "-".into());
                println!(
                    "{:<16} {:<12} {:<10} {:<28} {:>7} {:>6} {:>7} {:>8}",
                    s.host,
                    s.site,
                    s.phase,
                    t,
                    s.members.len(),
                    s.regenerations,
                    s.tokens_dropped,
                    s.probes
                );
            }
        }
    }
    Ok(())
}
