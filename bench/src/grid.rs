//! `gma bench grid`: grid query latency against the depth and fan-out of a hierarchy of real
//! federation endpoints (in-process servers on 127.0.0.1, one process, plaintext gRPC): a
//! complete tree of `fanout` children per manager over `depth` levels, every link added at
//! both ends (parent / child), queried at the root with unlimited levels. No endpoint has hosts
//! (no directory), so nothing matches and every manager searches: each query visits the whole
//! tree, and the answer must list every manager (`answered`) or the run fails.
//!
//! Then summaries: the same simulated sites (`--sites`, default 3, 30, 300) as a flat peer mesh
//! and as a hierarchy (`--fanout` children per manager), with the real site manager
//! ([`gma_federation::sim::hier`]): bytes of one full refresh, messages and bytes from a change
//! until every site saw it, and that propagation time (or that it never completed in 120 s).
//!
//! Then re-attachment ([`reattach`]): a 3-level chain g > p > c, each with its own directory,
//! c configured with only its parent p (it learns g from p); p runs as a separate `gma
//! federation` process and is killed with SIGKILL; timed from the kill until c has a live
//! session with g and p is gone from its links.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gma_broker::job::Job;
use gma_federation::config::FederationConfig;
use gma_federation::site::{Link, Role};
use gma_proto::v1::{self as pb, grid_client::GridClient, site_scheduler_client::SiteSchedulerClient};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::args::Output;
use gma_federation::sim::hier::{spread as spread_of, Spread, STEP_MS};

const SIM: &str = "simulated sites (the real site manager and split-horizon summaries, discrete events, 1 ms one-way latency, 4 hosts x 4 CPUs each, refresh 5 s, push debounce 250 ms); bytes = encoded summary messages delivered; propagation = a 4-CPU job at the last site until every site's view (own + linked sites' summaries) shows it, checked every 5 simulated ms";

fn spread_json(s: &Spread) -> Value {
    json!({"links": s.links, "refresh_bytes": s.refresh_bytes, "change_messages": s.change_messages,
        "change_bytes": s.change_bytes, "propagation_ms": s.propagation_ms, "resolution_ms": STEP_MS})
}

/// Managers in one tree at most (bounded work on a small machine).
const MAX_MANAGERS: usize = 400;

/// `DxF` (depth levels below the root, fan-out per manager) -> (depth, fanout).
pub fn parse_shape(s: &str) -> anyhow::Result<(u32, u32)> {
    let (d, f) = s
        .split_once('x')
        .with_context(|| format!("shape {s:?}: give DEPTHxFANOUT, e.g. 2x4"))?;
    let d: u32 = d.trim().parse().with_context(|| format!("shape {s:?}: depth"))?;
    let f: u32 = f
        .trim()
        .parse()
        .with_context(|| format!("shape {s:?}: fan-out"))?;
    if d == 0 || f == 0 {
        bail!("shape {s:?}: depth and fan-out must be at least 1");
    }
    let n = managers(d, f);
    if n > MAX_MANAGERS {
        bail!("shape {s:?} has {n} managers: at most {MAX_MANAGERS}");
    }
    Ok((d, f))
}

/// Managers of a complete tree: 1 + f + f² + ... + f^d (saturating).
fn managers(depth: u32, fanout: u32) -> usize {
    let mut n = 0usize;
    let mut level = 1usize;
    for _ in 0..=depth {
        n = n.saturating_add(level);
        level = level.saturating_mul(fanout as usize);
    }
    n
}

/// Parent index of each manager of the tree, breadth first (the root has none).
fn parents(depth: u32, fanout: u32) -> Vec<Option<usize>> {
    let n = managers(depth, fanout);
    (0..n)
        .map(|i| (i > 0).then(|| (i - 1) / fanout as usize))
        .collect()
}

struct Row {
    depth: u32,
    fanout: u32,
    managers: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    answered: usize,
}

async fn one(depth: u32, fanout: u32, queries: usize) -> anyhow::Result<Row> {
    let up = parents(depth, fanout);
    let n = up.len();
    let mut listeners = Vec::with_capacity(n);
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(l.local_addr()?.to_string());
        listeners.push(l);
    }
    let name = |i: usize| format!("m{i}");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::with_capacity(n);
    for (i, l) in listeners.into_iter().enumerate() {
        let mut peer = Vec::new();
        if let Some(p) = up[i] {
            peer.push(Link {
                site: name(p),
                endpoint: addrs[p].clone(),
                role: Role::Parent,
                hops: 0,
            });
        }
        for (c, pc) in up.iter().enumerate() {
            if *pc == Some(i) {
                peer.push(Link {
                    site: name(c),
                    endpoint: addrs[c].clone(),
                    role: Role::Child,
                    hops: 0,
                });
            }
        }
        let cfg = FederationConfig {
            registration: gma_core::registration::Registration {
                site: name(i),
                ..Default::default()
            },
            heartbeat_ms: 200,
            tick_ms: 50,
            peer,
            ..FederationConfig::default()
        };
        let mut rx = stop_rx.clone();
        servers.push(tokio::spawn(gma_federation::service::run(cfg, l, async move {
            let _ = rx.wait_for(|v| *v).await;
        })));
    }
    let result = measure(&addrs, &up, queries).await;
    let _ = stop_tx.send(true);
    for s in servers {
        let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
    }
    let (h, answered) = result?;
    Ok(Row {
        depth,
        fanout,
        managers: n,
        p50_ms: h.value_at_quantile(0.5) as f64 / 1e3,
        p99_ms: h.value_at_quantile(0.99) as f64 / 1e3,
        max_ms: h.max() as f64 / 1e3,
        answered,
    })
}

async fn measure(
    addrs: &[String],
    up: &[Option<usize>],
    queries: usize,
) -> anyhow::Result<(Histogram<u64>, usize)> {
    // Every link live at both ends before timing.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, a) in addrs.iter().enumerate() {
        let links = usize::from(up[i].is_some()) + up.iter().filter(|p| **p == Some(i)).count();
        let ch = gma_consumer::connect(a).await?;
        let mut c = SiteSchedulerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
        loop {
            let s = c
                .federation_status(pb::FederationStatusRequest {})
                .await?
                .into_inner();
            if s.peers.iter().filter(|p| p.live).count() == links {
                break;
            }
            if Instant::now() > deadline {
                bail!("manager m{i} never had its {links} links live: {:?}", s.peers);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let ch = gma_consumer::connect(&addrs[0]).await?;
    let mut g = GridClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
    let job = Job {
        name: "probe".into(),
        cpus: 1,
        reference_time_s: 60.0,
        ..Job::default()
    };
    let q = || pb::GridQuery {
        query_id: String::new(),
        requirements: Some(job.to_proto()),
        levels: None,
        path: Vec::new(),
        deadline_ms: 10_000,
        max_results: 0,
    };
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).context("histogram")?;
    let mut answered = 0;
    // Five untimed warm-up queries (connections between managers), then the timed ones.
    for k in 0..queries + 5 {
        let t0 = Instant::now();
        let a = g.query(q()).await?.into_inner();
        let dt = t0.elapsed();
        if a.answered.len() != addrs.len() || !a.unreached.is_empty() {
            bail!(
                "a query at the root reached {} of {} managers (unreached: {:?})",
                a.answered.len(),
                addrs.len(),
                a.unreached
            );
        }
        answered = a.answered.len();
        if k >= 5 {
            let _ = h.record(dt.as_micros() as u64);
        }
    }
    Ok((h, answered))
}

pub async fn run(
    shapes: Vec<(u32, u32)>,
    queries: usize,
    sites: &[usize],
    fanout: usize,
    output: Output,
) -> anyhow::Result<()> {
    if shapes.is_empty() || queries == 0 {
        bail!("give at least one --shapes entry and --queries 1 or more");
    }
    if sites.iter().any(|n| !(2..=1000).contains(n)) || !(1..=64).contains(&fanout) {
        bail!("--sites entries must lie in 2..=1000 and --fanout in 1..=64");
    }
    let mut rows = Vec::new();
    for (d, f) in shapes {
        rows.push(one(d, f, queries).await?);
    }
    let mut spread = Vec::new();
    for &n in sites {
        let t = Instant::now();
        let mesh = spread_of(n, None);
        let tree = spread_of(n, Some(fanout));
        spread.push((mesh, tree, t.elapsed().as_secs_f64()));
    }
    let re = reattach(REATTACH_ROUNDS).await?;
    let re_sorted = {
        let mut v = re.clone();
        v.sort_by(f64::total_cmp);
        v
    };
    let re_median = re_sorted[re_sorted.len() / 2];
    let placement =
        "one process, in-process federation endpoints on 127.0.0.1, plaintext gRPC, heartbeats 200 ms";
    match output {
        Output::Json => {
            let r: Vec<Value> = rows
                .iter()
                .map(|r| {
                    json!({"depth": r.depth, "fanout": r.fanout, "managers": r.managers,
                        "queries": queries, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
                        "max_ms": r.max_ms, "answered": r.answered})
                })
                .collect();
            let s: Vec<Value> = spread
                .iter()
                .map(|(m, t, wall)| json!({"sites": m.sites, "mesh": spread_json(m), "hierarchy": spread_json(t), "fanout": fanout, "wall_s": wall}))
                .collect();
            crate::report::emit(json!({
                "scenario": "grid", "placement": placement, "query_latency": r,
                "summaries": s, "summaries_placement": SIM,
                "reattach": {"placement": REATTACH, "reattach_after_ms": REATTACH_AFTER_MS,
                    "heartbeat_ms": REATTACH_HEARTBEAT_MS, "rounds_ms": re, "median_ms": re_median},
            }));
        }
        Output::Table => {
            println!("grid queries at the root, unlimited levels, nothing matches (every manager searches); {placement}");
            println!(
                "{:>5} {:>6} {:>8} {:>8} {:>10} {:>10} {:>10}",
                "depth", "fanout", "managers", "queries", "p50 ms", "p99 ms", "max ms"
            );
            for r in &rows {
                println!(
                    "{:>5} {:>6} {:>8} {:>8} {:>10.2} {:>10.2} {:>10.2}",
                    r.depth, r.fanout, r.managers, queries, r.p50_ms, r.p99_ms, r.max_ms
                );
            }
            println!("summaries, flat peer mesh against a hierarchy (fan-out {fanout}); {SIM}");
            println!(
                "{:>5} {:<9} {:>6} {:>14} {:>12} {:>12} {:>14}",
                "sites",
                "topology",
                "links",
                "refresh bytes",
                "change msgs",
                "change bytes",
                "propagation ms"
            );
            for (m, t, _) in &spread {
                for (name, x) in [("mesh", m), ("hierarchy", t)] {
                    println!(
                        "{:>5} {:<9} {:>6} {:>14} {:>12} {:>12} {:>14}",
                        x.sites,
                        name,
                        x.links,
                        x.refresh_bytes,
                        x.change_messages,
                        x.change_bytes,
                        x.propagation_ms
                            .map_or("not in 120 s".into(), |p| format!("{p:.0}"))
                    );
                }
            }
            println!("re-attachment; {REATTACH}");
            println!(
                "kill -9 p to c re-attached to g, ms (reattach_after_ms {REATTACH_AFTER_MS}, heartbeat {REATTACH_HEARTBEAT_MS}): median {re_median:.0}, rounds {}",
                re.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ")
            );
        }
    }
    Ok(())
}

/// Re-attachment rounds per run.
const REATTACH_ROUNDS: usize = 3;
const REATTACH_AFTER_MS: u64 = 1_000;
const REATTACH_HEARTBEAT_MS: u64 = 200;
const REATTACH: &str = "3-level chain g > p > c on 127.0.0.1, a directory each (in-process), g and c in-process endpoints, p a separate gma federation process; c configured with only its parent p (g told by p); time from SIGKILL of p until c's session with g is live and p is gone from its links, polled every 5 ms; sessions expire after 3 heartbeats";

/// One endpoint's federation status.
async fn fed_status(addr: &str) -> anyhow::Result<pb::FederationStatusReply> {
    let ch = gma_consumer::connect(addr).await?;
    let mut c = SiteSchedulerClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
    Ok(c.federation_status(pb::FederationStatusRequest {})
        .await?
        .into_inner())
}

/// Polls `addr`'s status until `done` holds (60 s at most).
async fn until(
    addr: &str,
    what: &str,
    every: Duration,
    done: impl Fn(&pb::FederationStatusReply) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = fed_status(addr).await;
        if s.as_ref().is_ok_and(&done) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within 60 s: {s:?}");
        }
        tokio::time::sleep(every).await;
    }
}

fn live(s: &pb::FederationStatusReply, site: &str) -> bool {
    s.peers.iter().any(|p| p.site == site && p.live)
}

/// `rounds` re-attachments (see the module doc): each round's time from the kill, ms.
pub async fn reattach(rounds: usize) -> anyhow::Result<Vec<f64>> {
    let exe = std::env::current_exe().context("cannot find the gma binary")?;
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let tmp = tempfile::Builder::new().prefix("gma-bench-reattach-").tempdir()?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopper = || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|v| *v).await;
            }
        };
        let mut tasks = Vec::new();
        let mut dirs = Vec::new();
        for n in ["g", "p", "c"] {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            dirs.push(l.local_addr()?.to_string());
            let (data, stop) = (tmp.path().join(format!("dir-{n}")), stopper());
            tasks.push(tokio::spawn(async move {
                let _ = gma_directory::run(gma_directory::DirectoryConfig::new(data), l, stop).await;
            }));
        }
        let (gl, cl) = (
            tokio::net::TcpListener::bind("127.0.0.1:0").await?,
            tokio::net::TcpListener::bind("127.0.0.1:0").await?,
        );
        let (g_addr, c_addr) = (gl.local_addr()?.to_string(), cl.local_addr()?.to_string());
        // p's port: reserved, released, then taken by the process.
        let p_addr = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .to_string();
        let link = |site: &str, endpoint: &str, role: Role| Link {
            site: site.into(),
            endpoint: endpoint.into(),
            role,
            hops: 0,
        };
        let cfg = |site: &str, dir: &str, peer: Vec<Link>| FederationConfig {
            registration: gma_core::registration::Registration {
                site: site.into(),
                directory: Some(dir.into()),
                ..Default::default()
            },
            heartbeat_ms: REATTACH_HEARTBEAT_MS,
            tick_ms: 50,
            reattach_after_ms: REATTACH_AFTER_MS,
            peer,
            ..FederationConfig::default()
        };
        let g = cfg("g", &dirs[0], vec![link("p", &p_addr, Role::Child)]);
        let c = cfg("c", &dirs[2], vec![link("p", &p_addr, Role::Parent)]);
        tasks.push(tokio::spawn({
            let stop = stopper();
            async move {
                let _ = gma_federation::service::run(g, gl, stop).await;
            }
        }));
        tasks.push(tokio::spawn({
            let stop = stopper();
            async move {
                let _ = gma_federation::service::run(c, cl, stop).await;
            }
        }));
        let p_cfg = tmp.path().join("p.toml");
        std::fs::write(
            &p_cfg,
            format!(
                "site = \"p\"\nheartbeat_ms = {REATTACH_HEARTBEAT_MS}\ntick_ms = 50\n\
                 reattach_after_ms = {REATTACH_AFTER_MS}\n\
                 [[peer]]\nsite = \"g\"\nendpoint = \"{g_addr}\"\nrole = \"parent\"\n\
                 [[peer]]\nsite = \"c\"\nendpoint = \"{c_addr}\"\nrole = \"child\"\n"
            ),
        )?;
        let mut p = tokio::process::Command::new(&exe)
            .args([
                "federation",
                "--listen",
                &p_addr,
                "--directory",
                &dirs[1],
                "--config",
            ])
            .arg(&p_cfg)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the middle manager p")?;
        let r = async {
            until(&c_addr, "c learning g from p", Duration::from_millis(20), |s| {
                live(s, "p") && s.chain.iter().any(|x| x.site == "g")
            })
            .await?;
            until(&g_addr, "g's session with p", Duration::from_millis(20), |s| {
                live(s, "p")
            })
            .await?;
            let t = Instant::now();
            p.start_kill().context("cannot kill p")?;
            until(&c_addr, "c re-attaching to g", Duration::from_millis(5), |s| {
                live(s, "g") && !s.peers.iter().any(|x| x.site == "p")
            })
            .await?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            until(&g_addr, "g's session with c", Duration::from_millis(20), |s| {
                live(s, "c")
            })
            .await?;
            anyhow::Ok(ms)
        }
        .await;
        let _ = p.kill().await;
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        out.push(r?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_trees_have_the_right_shape() {
        assert_eq!(managers(1, 2), 3);
        assert_eq!(managers(2, 4), 21);
        assert_eq!(
            parents(2, 2),
            vec![None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(2)]
        );
        assert!(parse_shape("2x4").is_ok());
        assert!(parse_shape("0x4").is_err());
        assert!(parse_shape("9x9").is_err(), "too many managers");
        assert!(parse_shape("2-4").is_err());
    }
}
