//! The replicated directory with real `gma directory` processes on 127.0.0.1: failover with
//! nothing acknowledged lost, catch-up, minority refusal, leases across failover, crash loop.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use gma_proto::v1 as pb;
use tokio::runtime::Runtime;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Cluster {
    tmp: tempfile::TempDir,
    addrs: Vec<String>,
    peers: String,
    nodes: Vec<Option<Proc>>,
}

impl Cluster {
    fn start(n: usize) -> Cluster {
        let tmp = tempdir();
        let addrs: Vec<String> = (0..n).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let peers = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            tmp,
            addrs,
            peers,
            nodes: Vec::new(),
        };
        for i in 0..n {
            let p = c.spawn(i, i == 0);
            c.nodes.push(Some(p));
        }
        c
    }

    fn spawn(&self, i: usize, init: bool) -> Proc {
        let data = self.tmp.path().join(format!("n{}", i + 1));
        let id = (i + 1).to_string();
        let mut args = vec![
            "directory",
            "--id",
            &id,
            "--listen",
            &self.addrs[i],
            "--data",
            data.to_str().unwrap(),
            "--peers",
            &self.peers,
        ];
        if init {
            args.push("--init");
        }
        Proc::start(&args, "gma directory listening on")
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i].take() {
            p.kill();
        }
    }

    fn restart(&mut self, i: usize) {
        self.kill(i);
        let p = self.spawn(i, false);
        self.nodes[i] = Some(p);
    }

    fn all(&self) -> String {
        self.addrs.join(",")
    }

    fn live(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_some())
            .collect()
    }
}

async fn status(addr: &str) -> Option<pb::ClusterStatusResponse> {
    let mut c = gma_consumer::directory::client(addr).await.ok()?;
    let mut req = tonic::Request::new(pb::ClusterStatusRequest {});
    req.set_timeout(Duration::from_secs(2));
    Some(c.cluster_status(req).await.ok()?.into_inner())
}

/// The leader's index once every live node agrees on one.
fn leader(rt: &Runtime, c: &Cluster, timeout: Duration) -> Option<usize> {
    let mut found = None;
    wait_until(timeout, || {
        let ids: Vec<u64> = c
            .live()
            .iter()
            .map(|i| {
                rt.block_on(status(&c.addrs[*i]))
                    .map(|s| s.leader_id)
                    .unwrap_or(0)
            })
            .collect();
        let first = ids[0];
        if first != 0 && ids.iter().all(|x| *x == first) && c.live().contains(&((first - 1) as usize)) {
            found = Some((first - 1) as usize);
            true
        } else {
            false
        }
    });
    found
}

fn schema() -> pb::EventSchema {
    pb::EventSchema {
        name: "host.cpu".into(),
        version: 1,
        fields: vec![gma_core::event::dbl("load", "", "")],
        description: String::new(),
    }
}

fn record(id: &str) -> pb::Record {
    pb::Record {
        record: Some(pb::record::Record::Producer(pb::ProducerRecord {
            id: id.into(),
            address: "http://127.0.0.1:9".into(),
            events: vec!["host.cpu".into()],
            ..Default::default()
        })),
    }
}

async fn register(addrs: &str, id: &str, ttl_ms: u64) -> Result<(), tonic::Status> {
    let mut c = gma_consumer::directory::client(addrs)
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(pb::RegisterRequest {
        record: Some(record(id)),
        schemas: vec![schema()],
        lease_ttl_ms: ttl_ms,
    });
    req.set_timeout(Duration::from_secs(8));
    c.register(req).await.map(|_| ())
}

/// Producer ids on one member, read locally (stale_ok) so each node's own state is checked.
async fn ids_on(addr: &str) -> Option<BTreeSet<String>> {
    let mut c = gma_consumer::directory::client(addr).await.ok()?;
    let req = pb::SearchRequest {
        kind: pb::RecordKind::Producer as i32,
        stale_ok: true,
        page_size: 1000,
        ..Default::default()
    };
    let (entries, _) = gma_consumer::directory::search_all(&mut c, req).await.ok()?;
    Some(
        entries
            .into_iter()
            .filter_map(gma_consumer::directory::producer_of)
            .map(|p| p.id)
            .collect(),
    )
}

/// Registers `p<N>` records in a loop against every member until stopped; collects the acked.
fn writer(rt: &Runtime, addrs: String) -> (Arc<Mutex<Vec<String>>>, Arc<std::sync::atomic::AtomicBool>) {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (a, s) = (acked.clone(), stop.clone());
    rt.spawn(async move {
        let mut n = 0u64;
        while !s.load(std::sync::atomic::Ordering::SeqCst) {
            n += 1;
            let id = format!("p{n:06}");
            if register(&addrs, &id, 600_000).await.is_ok() {
                a.lock().unwrap().push(id);
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    (acked, stop)
}

#[test]
fn leader_failover_loses_no_acknowledged_write_and_the_node_catches_up() {
    let rt = Runtime::new().unwrap();
    let mut c = Cluster::start(3);
    let l = leader(&rt, &c, Duration::from_secs(30)).expect("a leader is elected");
    let (acked, stop) = writer(&rt, c.all());
    assert!(wait_until(Duration::from_secs(30), || acked
        .lock()
        .unwrap()
        .len()
        >= 50));
    // kill -9 the leader mid-stream.
    c.kill(l);
    let before = acked.lock().unwrap().len();
    let new = leader(&rt, &c, Duration::from_secs(30)).expect("a new leader is elected");
    assert_ne!(new, l);
    assert!(
        wait_until(Duration::from_secs(30), || acked.lock().unwrap().len()
            >= before + 50),
        "registrations did not resume after the failover"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    let acked: BTreeSet<String> = acked.lock().unwrap().iter().cloned().collect();
    // Every acknowledged registration is on every survivor.
    for i in c.live() {
        let addr = c.addrs[i].clone();
        assert!(
            wait_until(Duration::from_secs(20), || rt
                .block_on(ids_on(&addr))
                .is_some_and(|ids| ids.is_superset(&acked))),
            "node {} is missing acknowledged registrations",
            i + 1
        );
    }
    // The killed node restarts and catches up.
    c.restart(l);
    let addr = c.addrs[l].clone();
    assert!(
        wait_until(Duration::from_secs(30), || rt
            .block_on(ids_on(&addr))
            .is_some_and(|ids| ids.is_superset(&acked))),
        "the restarted node did not catch up"
    );
    // A member alone (no quorum) refuses writes with a clear status.
    let alone = c.live().into_iter().find(|i| *i != l).unwrap();
    for i in c.live() {
        if i != alone {
            c.kill(i);
        }
    }
    let started = Instant::now();
    let e = rt
        .block_on(register(&c.addrs[alone], "lonely", 600_000))
        .expect_err("a minority must not accept writes");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains("quorum") || e.message().contains("majority"),
        "{}",
        e.message()
    );
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn leases_survive_a_failover_and_dead_producers_still_expire() {
    let rt = Runtime::new().unwrap();
    let mut c = Cluster::start(3);
    let l = leader(&rt, &c, Duration::from_secs(30)).expect("a leader is elected");
    let all = c.all();
    let ttl = 2000u64;
    // A live producer renewing its lease, and one that will die.
    let live = Proc::producer(&[
        "--directory",
        &all,
        "--lease-ttl-ms",
        &ttl.to_string(),
        "--source",
        "alive",
    ]);
    let mut dead = Proc::producer(&[
        "--directory",
        &all,
        "--lease-ttl-ms",
        &ttl.to_string(),
        "--source",
        "dying",
    ]);
    let listed = |addr: &str, src: &str| {
        rt.block_on(ids_on(addr))
            .is_some_and(|ids| ids.iter().any(|id| id.starts_with(&format!("{src}@"))))
    };
    let any_live = |c: &Cluster| c.addrs[c.live()[0]].clone();
    assert!(wait_until(Duration::from_secs(30), || listed(
        &any_live(&c),
        "alive"
    ) && listed(
        &any_live(&c),
        "dying"
    )));
    dead.kill();
    c.kill(l);
    let new = leader(&rt, &c, Duration::from_secs(30)).expect("new leader");
    let settled = Instant::now();
    let addr = c.addrs[new].clone();
    // The dead producer goes within TTL + 1 s of the new leader settling ...
    assert!(
        wait_until(Duration::from_millis(ttl + 1000), || !listed(&addr, "dying")),
        "dead producer still listed {:?} after the new leader settled",
        settled.elapsed()
    );
    // ... while the renewing one was never expired: it is listed throughout several TTLs.
    let until = Instant::now() + Duration::from_millis(3 * ttl);
    while Instant::now() < until {
        assert!(
            listed(&addr, "alive"),
            "a renewing producer was expired by the failover"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(live);
}

#[test]
fn crash_loop_restarts_and_converges() {
    let rt = Runtime::new().unwrap();
    let mut c = Cluster::start(3);
    leader(&rt, &c, Duration::from_secs(30)).expect("a leader is elected");
    let (acked, stop) = writer(&rt, c.all());
    let cycles = std::env::var("GMA_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for cycle in 0..cycles {
        let victim = cycle % 3;
        let n = acked.lock().unwrap().len();
        // Kill -9 mid-write: only once writes are flowing.
        assert!(
            wait_until(Duration::from_secs(30), || acked.lock().unwrap().len() > n + 5),
            "writes stalled in cycle {cycle}"
        );
        c.kill(victim);
        c.restart(victim);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    let acked: BTreeSet<String> = acked.lock().unwrap().iter().cloned().collect();
    assert!(acked.len() > 20 * 5);
    // Every node ends with the same records, a superset of everything acknowledged.
    let mut states = Vec::new();
    for i in 0..3 {
        let addr = c.addrs[i].clone();
        let mut last = None;
        assert!(
            wait_until(Duration::from_secs(60), || {
                last = rt.block_on(ids_on(&addr));
                last.as_ref().is_some_and(|ids| ids.is_superset(&acked))
            }),
            "node {} lost acknowledged writes after the crash loop",
            i + 1
        );
        states.push(last.unwrap());
    }
    // Writes that timed out during a crash may still commit; wait for all three to agree,
    // records and revision alike.
    let agree = || {
        let seen: Vec<_> = (0..3)
            .map(|i| {
                let ids = rt.block_on(ids_on(&c.addrs[i]));
                let rev = rt
                    .block_on(status(&c.addrs[i]))
                    .map(|s| (s.revision, s.last_applied));
                (ids, rev.map(|r| r.0))
            })
            .collect();
        seen[0].0.is_some() && seen.iter().all(|s| *s == seen[0])
    };
    assert!(
        wait_until(Duration::from_secs(30), agree),
        "nodes disagree after the crash loop: {states:?}"
    );
}
