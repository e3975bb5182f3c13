//! `gma bench etcd`: the directory and etcd side by side, in the same run, with the same client
//! harness ([`op_phase`]), the same durability (both fsync every acknowledged write: etcd's
//! default, the directory's durable log) and the same placement (real server processes on
//! 127.0.0.1, clients in this process, everything on the same cores).
//!
//! Per node count (1, then 3), first `gma directory` processes, then `etcd` processes (Debian's
//! `etcd-server`; the run stops with a clear error when `etcd` is not on the PATH):
//! - **lease + write**, 1 and 64 clients: the directory's Register of a new record with a 60 s
//!   lease (one request, one raft entry) against etcd's LeaseGrant(60 s) followed by a Put of a
//!   new key attached to that lease (two requests, two raft entries: what a registration with a
//!   lease costs a client of etcd);
//! - **plain write**, 1 and 64 clients: the directory's Update of the client's own record (a new
//!   attribute value, same lease) against etcd's Put of the client's own key (256-byte value);
//! - **linearizable read**, 1 client, 2,000 reads after 100 warm-up ones: Search by exact id
//!   against Range of one key (both linearizable: ReadIndex on the leader).
//!
//! Clients talk to the leader (etcd's `benchmark --target-leader`); 64 clients share 8 HTTP/2
//! channels in both cases.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

use crate::args::Output;
use crate::dir::{
    dir_channels, histogram, op_phase, pct, register_req, reserve_ports, Cluster, DirClient, OpFigures,
};
use crate::report::{cores, proc_usage};

/// The etcd v3 API subset of bench/proto/etcd.proto.
pub mod etcdpb {
    tonic::include_proto!("etcdserverpb");
}

use etcdpb::kv_client::KvClient;
use etcdpb::lease_client::LeaseClient;
use etcdpb::maintenance_client::MaintenanceClient;

const CLIENTS: usize = 64;
const LEASE_TTL_S: i64 = 60;
const VALUE_BYTES: usize = 256;
const READS: usize = 2_000;
const READ_WARMUP: usize = 100;
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn run(duration: u64, output: Output) -> anyhow::Result<()> {
    if duration == 0 {
        bail!("--duration must be positive");
    }
    let etcd = which("etcd").ok_or_else(|| {
        anyhow!(
            "etcd is not on the PATH: install Debian's etcd-server (apt-get install etcd-server) to compare"
        )
    })?;
    let version = std::process::Command::new(&etcd)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_default();
    let d = Duration::from_secs(duration);
    for nodes in [1usize, 3] {
        let ours = gma_side(nodes, d)
            .await
            .with_context(|| format!("directory with {nodes} node(s)"))?;
        let theirs = etcd_side(&etcd, nodes, d)
            .await
            .with_context(|| format!("etcd with {nodes} node(s)"))?;
        print(nodes, duration, &version, &ours, &theirs, output);
    }
    Ok(())
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// One system's figures at one node count.
struct Side {
    lease_write: [OpFigures; 2],
    plain_write: [OpFigures; 2],
    read: Histogram<u64>,
}

fn status_err(s: tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

async fn gma_side(nodes: usize, d: Duration) -> anyhow::Result<Side> {
    let cluster = Cluster::start(nodes).await?;
    let l = cluster.agreed_leader(START_TIMEOUT, false).await?;
    let addr = cluster.addrs[l].clone();
    let cpu = || cluster.cpu_total();
    let mut lease_write = Vec::new();
    for (i, clients) in [1, CLIENTS].into_iter().enumerate() {
        let ch = dir_channels(&addr, clients).await?;
        lease_write.push(
            op_phase(&cpu, clients, d, "registration", move |k, n| {
                let mut c = ch[k % ch.len()].clone();
                async move {
                    c.register(register_req(format!("l{i}-{k}-{n}"), HashMap::new()))
                        .await
                        .map(drop)
                }
            })
            .await?,
        );
    }
    let mut plain_write = Vec::new();
    for clients in [1, CLIENTS] {
        let ch = dir_channels(&addr, clients).await?;
        for k in 0..clients {
            ch[k % ch.len()]
                .clone()
                .register(register_req(format!("u{clients}-{k}"), HashMap::new()))
                .await
                .map_err(|s| anyhow!("registering the record of client {k}: {}", status_err(s)))?;
        }
        plain_write.push(
            op_phase(&cpu, clients, d, "update", move |k, n| {
                let mut c: DirClient = ch[k % ch.len()].clone();
                async move {
                    let attrs = HashMap::from([("v".to_string(), n.to_string())]);
                    let reg = register_req(format!("u{clients}-{k}"), attrs);
                    c.update(pb::UpdateRequest {
                        record: reg.record,
                        schemas: Vec::new(),
                        lease_ttl_ms: 0,
                    })
                    .await
                    .map(drop)
                }
            })
            .await?,
        );
    }
    let c = dir_channels(&addr, 1).await?.remove(0);
    let read = read_phase("search by id", || {
        let mut c = c.clone();
        async move {
            let req = pb::SearchRequest {
                kind: pb::RecordKind::Producer as i32,
                id: "u1-0".into(),
                single: true,
                ..Default::default()
            };
            Ok(c.search(req).await?.into_inner().entries.len())
        }
    })
    .await?;
    cluster.stop().await;
    Ok(Side {
        lease_write: into_pair(lease_write)?,
        plain_write: into_pair(plain_write)?,
        read,
    })
}

/// Times `READS` reads one after another (after `READ_WARMUP` unrecorded ones) on one
/// connection; each read must find exactly one entry (`read` answers how many it found).
async fn read_phase<F, Fut>(what: &str, mut read: F) -> anyhow::Result<Histogram<u64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<usize, tonic::Status>>,
{
    let mut latencies = histogram()?;
    for i in 0..READ_WARMUP + READS {
        let t = Instant::now();
        let found = read().await.map_err(|s| anyhow!("{what}: {}", status_err(s)))?;
        if found != 1 {
            bail!("{what} answered {found} entries, not 1");
        }
        if i >= READ_WARMUP {
            let _ = latencies.record((t.elapsed().as_micros() as u64).max(1));
        }
    }
    Ok(latencies)
}

fn into_pair(v: Vec<OpFigures>) -> anyhow::Result<[OpFigures; 2]> {
    v.try_into().map_err(|_| anyhow!("expected two phases"))
}

/// `etcd` member processes on fresh data directories, killed on drop.
struct EtcdCluster {
    children: Vec<tokio::process::Child>,
    pids: Vec<String>,
    clients: Vec<String>,
    tmp: tempfile::TempDir,
    _ports: Vec<gma_core::addr::PortLease>,
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.start_kill();
        }
    }
}

impl EtcdCluster {
    async fn start(etcd: &Path, n: usize) -> anyhow::Result<EtcdCluster> {
        let tmp = tempfile::tempdir().context("cannot create a temporary directory")?;
        let leases = reserve_ports(2 * n)?;
        let ports: Vec<(u16, u16)> = leases.chunks(2).map(|p| (p[0].port(), p[1].port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = EtcdCluster {
            children: Vec::new(),
            pids: Vec::new(),
            clients: Vec::new(),
            tmp,
            _ports: leases,
        };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let data = c.tmp.path().join(format!("e{i}"));
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = tokio::process::Command::new(etcd)
                .args(["--name", &format!("e{i}")])
                .arg("--data-dir")
                .arg(&data)
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--log-level", "error"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("cannot start {}", etcd.display()))?;
            c.pids.push(
                child
                    .id()
                    .ok_or_else(|| anyhow!("etcd member {i} exited at once"))?
                    .to_string(),
            );
            c.children.push(child);
            c.clients.push(format!("127.0.0.1:{client}"));
        }
        Ok(c)
    }

    fn cpu_total(&self) -> f64 {
        self.pids
            .iter()
            .filter_map(|p| proc_usage(p).ok())
            .map(|(cpu, _)| cpu)
            .sum()
    }

    fn rss_mb(&self) -> Vec<f64> {
        self.pids
            .iter()
            .map(|p| proc_usage(p).map(|(_, rss)| rss).unwrap_or(f64::NAN))
            .collect()
    }

    /// The client address of the member every member names as leader.
    async fn leader(&self) -> anyhow::Result<String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("no answer yet");
        loop {
            let mut seen = Vec::new();
            for a in &self.clients {
                match etcd_channel(a).await {
                    Ok(ch) => match MaintenanceClient::new(ch).status(etcdpb::StatusRequest {}).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            seen.push((a.clone(), r.header.map(|h| h.member_id).unwrap_or(0), r.leader));
                        }
                        Err(s) => last = status_err(s),
                    },
                    Err(e) => last = e.to_string(),
                }
            }
            if seen.len() == self.clients.len() {
                let leader = seen[0].2;
                if leader != 0 && seen.iter().all(|s| s.2 == leader) {
                    if let Some(s) = seen.iter().find(|s| s.1 == leader) {
                        return Ok(s.0.clone());
                    }
                }
            }
            if Instant::now() >= deadline {
                bail!("etcd did not agree on a leader within {START_TIMEOUT:?} (last: {last})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn etcd_channel(addr: &str) -> anyhow::Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await?)
}

async fn etcd_channels(addr: &str, clients: usize) -> anyhow::Result<Vec<Channel>> {
    let mut v = Vec::new();
    for _ in 0..clients.clamp(1, 8) {
        v.push(etcd_channel(addr).await?);
    }
    Ok(v)
}

async fn etcd_side(etcd: &Path, nodes: usize, d: Duration) -> anyhow::Result<(Side, Vec<f64>)> {
    let cluster = EtcdCluster::start(etcd, nodes).await?;
    let addr = cluster.leader().await?;
    let cpu = || cluster.cpu_total();
    let value = vec![b'v'; VALUE_BYTES];
    let mut lease_write = Vec::new();
    for (i, clients) in [1, CLIENTS].into_iter().enumerate() {
        let ch = etcd_channels(&addr, clients).await?;
        let value = value.clone();
        lease_write.push(
            op_phase(&cpu, clients, d, "lease grant + put", move |k, n| {
                let ch = ch[k % ch.len()].clone();
                let value = value.clone();
                async move {
                    let lease = LeaseClient::new(ch.clone())
                        .lease_grant(etcdpb::LeaseGrantRequest {
                            ttl: LEASE_TTL_S,
                            id: 0,
                        })
                        .await?
                        .into_inner()
                        .id;
                    KvClient::new(ch)
                        .put(etcdpb::PutRequest {
                            key: format!("l{i}-{k}-{n}").into_bytes(),
                            value,
                            lease,
                        })
                        .await
                        .map(drop)
                }
            })
            .await?,
        );
    }
    let mut plain_write = Vec::new();
    for clients in [1, CLIENTS] {
        let ch = etcd_channels(&addr, clients).await?;
        let value = value.clone();
        plain_write.push(
            op_phase(&cpu, clients, d, "put", move |k, _| {
                let mut kv = KvClient::new(ch[k % ch.len()].clone());
                let value = value.clone();
                async move {
                    kv.put(etcdpb::PutRequest {
                        key: format!("u{clients}-{k}").into_bytes(),
                        value,
                        lease: 0,
                    })
                    .await
                    .map(drop)
                }
            })
            .await?,
        );
    }
    let kv = KvClient::new(etcd_channel(&addr).await?);
    let read = read_phase("range of one key", || {
        let mut kv = kv.clone();
        async move {
            let req = etcdpb::RangeRequest {
                key: b"u1-0".to_vec(),
                ..Default::default()
            };
            Ok(kv.range(req).await?.into_inner().kvs.len())
        }
    })
    .await?;
    let rss = cluster.rss_mb();
    Ok((
        Side {
            lease_write: into_pair(lease_write)?,
            plain_write: into_pair(plain_write)?,
            read,
        },
        rss,
    ))
}

fn print(nodes: usize, duration: u64, version: &str, ours: &Side, theirs: &(Side, Vec<f64>), output: Output) {
    let (theirs, etcd_rss) = theirs;
    match output {
        Output::Json => {
            let side = |s: &Side| {
                serde_json::json!({
                    "lease_write": {"clients_1": s.lease_write[0].json(), "clients_64": s.lease_write[1].json()},
                    "plain_write": {"clients_1": s.plain_write[0].json(), "clients_64": s.plain_write[1].json()},
                    "linearizable_read_ms": pct(&s.read),
                })
            };
            crate::report::emit(serde_json::json!({
                "scenario": "etcd",
                "nodes": nodes,
                "machine_cores": cores(),
                "duration_s": duration,
                "etcd_version": version,
                "gma_directory": side(ours),
                "etcd": side(theirs),
                "etcd_rss_mib": etcd_rss,
            }))
        }
        Output::Table => {
            let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            let ops = |f: &OpFigures| {
                format!(
                    "{:>7.0}/s  p50 {:>7.2} ms  p99 {:>7.2} ms  {:.2} cores{}",
                    f.per_s(),
                    ms(&f.latency, 0.5),
                    ms(&f.latency, 0.99),
                    f.cpu_cores,
                    if f.errors > 0 {
                        format!(
                            "  ({} errors, last: {})",
                            f.errors,
                            f.last_error.as_deref().unwrap_or("")
                        )
                    } else {
                        String::new()
                    }
                )
            };
            println!(
                "directory vs etcd, {nodes} node{}, {duration} s per phase, both fsync every acked write ({version})",
                if nodes > 1 { "s" } else { "" }
            );
            for (name, s) in [("gma directory", ours), ("etcd", theirs)] {
                println!("  {name}");
                println!("    lease + write, 1 client   {}", ops(&s.lease_write[0]));
                println!("    lease + write, 64 clients {}", ops(&s.lease_write[1]));
                println!("    plain write, 1 client     {}", ops(&s.plain_write[0]));
                println!("    plain write, 64 clients   {}", ops(&s.plain_write[1]));
                println!(
                    "    linearizable read         p50 {:.3} ms  p99 {:.3} ms",
                    ms(&s.read, 0.5),
                    ms(&s.read, 0.99)
                );
            }
        }
    }
}
