//! Jepsen-style test of the replicated directory: three real `gma directory` processes, each in
//! its own network namespace on a bridge (`common::netns`), clients in the test process doing
//! register / update / remove / linearizable search on a few record ids with every invocation
//! and completion recorded, while a nemesis partitions members (blackhole routes isolating one
//! member from the others or from one other, or a member's bridge port down), kills them with
//! SIGKILL and restarts them (one, or all three at once), and pauses them (SIGSTOP / SIGCONT). Then it heals everything, waits for the
//! members to agree, reads every record, and checks (`common::linearizable`) that the history
//! is linearizable against a per-record register model and that no acknowledged write is
//! missing. The checker's own tests are at the bottom.
//!
//! Sizes: CI-sized by default (about 30 s of faults and a few hundred operations). Long runs:
//! `GMA_JEPSEN_SECONDS=600 GMA_JEPSEN_SEED=n` or `scripts/jepsen.sh` (several seeds). The seed
//! fixes the fault schedule and every client's choices; it is printed at the start and on
//! failure, with the command that replays it. Needs root and `ip` (installed with apt-get when
//! missing): without them this test fails, it never falls back to loopback.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::linearizable::{self, Call, Op, Outcome, Verdict};
use common::netns::Segment;
use common::*;
use gma_proto::v1 as pb;
use pb::directory_client::DirectoryClient;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::runtime::Runtime;
use tonic::transport::Channel;

const MEMBERS: usize = 3;
/// Every member listens on this port of its own namespace.
const PORT: u16 = 7000;
/// The `v` attribute of a record is the register's value.
const VALUE: &str = "v";
/// Marks the test's records (a stale search lists them all).
const MARK: &str = "jepsen";
/// Leases outlive any run (1 h, the directory's maximum): nothing expires mid-test.
const LEASE_TTL_MS: u64 = 3_600_000;
/// A client's deadline for one operation; past it the operation is indeterminate.
const OP_TIMEOUT: Duration = Duration::from_millis(2500);
/// The search budget per record for the checker.
const CHECK_BUDGET: u64 = 200_000_000;

// ---------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------

struct Settings {
    seed: u64,
    /// How long clients run while the nemesis injects faults (at least one of each kind).
    workload: Duration,
    clients: usize,
    /// Record ids in use at a time.
    keys: usize,
    /// Operations on one record id before its slot moves to a fresh id.
    per_key: usize,
    /// Think time between a client's operations: uniform in [0, stagger).
    stagger: Duration,
    /// The kinds of fault the nemesis uses (`GMA_JEPSEN_FAULTS=kill,pause`; default all).
    faults: Vec<Fault>,
}

impl Settings {
    fn from_env() -> Settings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let seed = var("GMA_JEPSEN_SEED")
            .map(|v| v.parse().expect("GMA_JEPSEN_SEED is a u64"))
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64;
                (t ^ u64::from(std::process::id()).rotate_left(32)) % 1_000_000_000
            });
        let seconds: u64 = var("GMA_JEPSEN_SECONDS")
            .map(|v| v.parse().expect("GMA_JEPSEN_SECONDS is a number of seconds"))
            .unwrap_or(30);
        Settings {
            seed,
            workload: Duration::from_secs(seconds),
            clients: 6,
            keys: 5,
            per_key: 120,
            stagger: Duration::from_millis(250),
            faults: var("GMA_JEPSEN_FAULTS")
                .map(|v| {
                    v.split(',')
                        .map(|name| {
                            *FAULTS
                                .iter()
                                .find(|f| format!("{f:?}").eq_ignore_ascii_case(name.trim()))
                                .unwrap_or_else(|| {
                                    panic!("GMA_JEPSEN_FAULTS: {name:?} is none of {FAULTS:?}")
                                })
                        })
                        .collect()
                })
                .unwrap_or_else(|| FAULTS.to_vec()),
        }
    }

    fn replay(&self) -> String {
        let faults = if self.faults == FAULTS {
            String::new()
        } else {
            let names: Vec<String> = self.faults.iter().map(|f| format!("{f:?}")).collect();
            format!("GMA_JEPSEN_FAULTS={} ", names.join(","))
        };
        format!(
            "GMA_JEPSEN_SEED={} GMA_JEPSEN_SECONDS={} {faults}cargo nextest run -p gma --test jepsen",
            self.seed,
            self.workload.as_secs()
        )
    }
}

// ---------------------------------------------------------------------------------------------
// The members, each in its namespace
// ---------------------------------------------------------------------------------------------

/// Fields drop in order: the processes die before their data and their namespaces go.
struct Members {
    procs: Vec<Option<Proc>>,
    paused: Vec<bool>,
    tmp: tempfile::TempDir,
    seg: Segment,
    addrs: Vec<String>,
    peers: String,
}

impl Members {
    fn start(seg: Segment) -> Members {
        let addrs: Vec<String> = seg.host_ips.iter().map(|ip| format!("{ip}:{PORT}")).collect();
        let peers = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut m = Members {
            procs: Vec::new(),
            paused: vec![false; MEMBERS],
            tmp: tempdir(),
            seg,
            addrs,
            peers,
        };
        for i in 0..MEMBERS {
            let p = m.spawn(i, i == 0);
            m.procs.push(Some(p));
        }
        m
    }

    fn spawn(&self, i: usize, init: bool) -> Proc {
        let data = self.tmp.path().join(format!("n{}", i + 1));
        // Small snapshots: a member that was down long enough catches up by snapshot.
        let cfg = self.tmp.path().join(format!("n{}.toml", i + 1));
        std::fs::write(
            &cfg,
            format!("data_dir = {:?}\nsnapshot_logs = 200\n", data.to_str().unwrap()),
        )
        .unwrap();
        let id = (i + 1).to_string();
        let mut args = vec![
            "directory",
            "--id",
            &id,
            "--listen",
            &self.addrs[i],
            "--config",
            cfg.to_str().unwrap(),
            "--peers",
            &self.peers,
            // A test network of our own, and no companion producer adding records.
            "--allow-plaintext",
            "--rpc-events-ms",
            "0",
        ];
        if init {
            args.push("--init");
        }
        self.seg.start_on_host(i, &args, "gma directory listening on")
    }

    fn pid(&self, i: usize) -> Option<String> {
        self.procs[i].as_ref().map(|p| p.child.id().to_string())
    }

    fn signal(&self, i: usize, sig: &str) {
        if let Some(pid) = self.pid(i) {
            let ok = std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} {pid} (member {}) failed", i + 1);
        }
    }

    /// SIGKILL: no shutdown, no flush.
    fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            p.kill();
        }
        self.paused[i] = false;
    }

    fn restart(&mut self, i: usize) {
        if self.procs[i].is_none() {
            let p = self.spawn(i, false);
            self.procs[i] = Some(p);
        }
    }

    fn pause(&mut self, i: usize) {
        self.signal(i, "-STOP");
        self.paused[i] = true;
    }

    fn resume(&mut self, i: usize) {
        if self.paused[i] {
            self.signal(i, "-CONT");
            self.paused[i] = false;
        }
    }

    /// Undoes every fault: links up, routes back, processes resumed, the dead restarted.
    fn heal(&mut self) {
        for i in 0..MEMBERS {
            self.seg.uncut(i).unwrap();
            for j in i + 1..MEMBERS {
                self.seg.unblock(i, j).unwrap();
            }
        }
        for i in 0..MEMBERS {
            self.resume(i);
            self.restart(i);
        }
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for (i, p) in self.procs.iter().enumerate() {
            if let Some(p) = p {
                let text = p.stderr_text();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                out += &format!("member {} stderr (last 30 lines):\n{tail}\n", i + 1);
            }
        }
        out
    }
}

fn channel(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(OP_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy()
}

async fn status(addr: &str) -> Option<pb::ClusterStatusResponse> {
    let mut c = DirectoryClient::new(channel(addr));
    let mut req = tonic::Request::new(pb::ClusterStatusRequest {});
    req.set_timeout(Duration::from_millis(500));
    let r = tokio::time::timeout(Duration::from_secs(1), c.cluster_status(req)).await;
    r.ok()?.ok().map(|r| r.into_inner())
}

/// The member that says it leads with the highest term, if any answers so.
fn leader(rt: &Runtime, m: &Members) -> Option<usize> {
    let all = rt.block_on(futures::future::join_all(m.addrs.iter().map(|a| status(a))));
    all.iter()
        .enumerate()
        .filter_map(|(i, s)| s.as_ref().filter(|s| s.state == "Leader").map(|s| (s.term, i)))
        .max()
        .map(|(_, i)| i)
}

// ---------------------------------------------------------------------------------------------
// Clients: every invocation and completion recorded
// ---------------------------------------------------------------------------------------------

fn schema() -> pb::EventSchema {
    pb::EventSchema {
        name: "jepsen.v".into(),
        version: 1,
        fields: vec![gma_core::event::dbl("x", "", "")],
        description: String::new(),
    }
}

fn record(key: &str, value: &str) -> pb::Record {
    pb::Record {
        record: Some(pb::record::Record::Producer(pb::ProducerRecord {
            id: key.into(),
            address: "http://127.0.0.1:9".into(),
            events: vec!["jepsen.v".into()],
            attributes: [(VALUE.into(), value.into()), (MARK.into(), "1".into())].into(),
            ..Default::default()
        })),
    }
}

/// The value of the record in a search answer (`None`: no record). More than one record for
/// an id is reported as a value no write carried.
fn value_of(entries: Vec<pb::RecordEntry>) -> Option<String> {
    let values: Vec<String> = entries
        .into_iter()
        .filter_map(gma_consumer::directory::producer_of)
        .map(|p| p.attributes.get(VALUE).cloned().unwrap_or_default())
        .collect();
    match values.len() {
        0 => None,
        1 => values.into_iter().next(),
        _ => Some(format!("!{} records: {values:?}", values.len())),
    }
}

/// Statuses that are neither a definite outcome nor "may have happened" (a bug somewhere), and
/// a tally of the indeterminate and unsent operations by reason, for the report.
#[derive(Default)]
struct Unexpected {
    statuses: Mutex<Vec<String>>,
    reasons: Mutex<BTreeMap<String, usize>>,
}

async fn perform(
    c: &mut DirectoryClient<Channel>,
    key: &str,
    call: &Call,
    unexpected: &Unexpected,
) -> Outcome {
    let r = match call {
        Call::Register(v) => c
            .register(pb::RegisterRequest {
                record: Some(record(key, v)),
                schemas: vec![schema()],
                lease_ttl_ms: LEASE_TTL_MS,
            })
            .await
            .map(|_| Outcome::Ok),
        Call::Update(v) => c
            .update(pb::UpdateRequest {
                record: Some(record(key, v)),
                schemas: vec![schema()],
                lease_ttl_ms: 0,
            })
            .await
            .map(|_| Outcome::Ok),
        Call::Remove => c
            .remove(pb::RemoveRequest {
                kind: pb::RecordKind::Producer as i32,
                id: key.into(),
            })
            .await
            .map(|_| Outcome::Ok),
        Call::Read => c
            .search(pb::SearchRequest {
                kind: pb::RecordKind::Producer as i32,
                id: key.into(),
                page_size: 10,
                stale_ok: false,
                ..Default::default()
            })
            .await
            .map(|r| Outcome::Read(value_of(r.into_inner().entries))),
    };
    use tonic::Code;
    match r {
        Ok(o) => o,
        Err(s) => match (s.code(), call) {
            (Code::AlreadyExists, Call::Register(_)) => Outcome::AlreadyExists,
            (Code::NotFound, Call::Update(_) | Call::Remove) => Outcome::NotFound,
            // hyper's connector failed: no connection, so nothing was sent.
            (Code::Unavailable, _) if s.message() == "tcp connect error" => {
                let mut why = String::new();
                let mut cur = std::error::Error::source(&s);
                while let Some(e) = cur {
                    why = e.to_string();
                    cur = e.source();
                }
                *unexpected
                    .reasons
                    .lock()
                    .unwrap()
                    .entry(format!("not sent: {why}"))
                    .or_default() += 1;
                Outcome::NotSent
            }
            (Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown, _) => {
                let msg: String = s.message().chars().take(70).collect();
                *unexpected
                    .reasons
                    .lock()
                    .unwrap()
                    .entry(format!("{:?}: {msg}", s.code()))
                    .or_default() += 1;
                Outcome::Unknown
            }
            (code, _) => {
                unexpected
                    .statuses
                    .lock()
                    .unwrap()
                    .push(format!("{call:?} on {key}: {code:?} {}", s.message()));
                Outcome::Unknown
            }
        },
    }
}

struct Recorder {
    start: Instant,
    ops: Mutex<Vec<Op>>,
    unexpected: Unexpected,
}

impl Recorder {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Runs one operation with `c`, recording it. Returns its outcome.
    async fn run(&self, client: usize, c: &mut DirectoryClient<Channel>, key: &str, call: Call) -> Outcome {
        let invoked = self.now();
        let outcome = match tokio::time::timeout(
            OP_TIMEOUT + Duration::from_secs(1),
            perform(c, key, &call, &self.unexpected),
        )
        .await
        {
            Ok(o) => o,
            Err(_) => Outcome::Unknown,
        };
        let completed = (outcome != Outcome::Unknown).then(|| self.now());
        self.ops.lock().unwrap().push(Op {
            client,
            key: key.into(),
            call,
            invoked,
            completed,
            outcome: outcome.clone(),
        });
        outcome
    }
}

/// The record ids in use: `keys` slots, each moving on to a fresh id after `per_key`
/// operations, so that every id's history stays short (Jepsen's independent keys) and the
/// checker's search with it, however long the run.
struct KeySpace {
    slots: Mutex<Vec<(u64, usize)>>,
    per_key: usize,
}

impl KeySpace {
    fn new(keys: usize, per_key: usize) -> KeySpace {
        KeySpace {
            slots: Mutex::new(vec![(0, 0); keys]),
            per_key,
        }
    }

    /// The id in `slot` for one more operation.
    fn take(&self, slot: usize) -> String {
        let mut slots = self.slots.lock().unwrap();
        let (generation, used) = &mut slots[slot];
        *used += 1;
        if *used > self.per_key {
            *generation += 1;
            *used = 1;
        }
        format!("jk{slot}.{generation}")
    }

    fn slots(&self) -> usize {
        self.slots.lock().unwrap().len()
    }
}

impl Recorder {
    /// One linearizable search of every test record (all pages) through `addr`, recorded as
    /// a read of each id in `keys` over the search's whole interval (each page is a
    /// linearizable read inside it). `None` if it failed (nothing recorded: a failed read
    /// constrains nothing).
    async fn read_all(
        &self,
        client: usize,
        addr: &str,
        keys: &std::collections::BTreeSet<String>,
    ) -> Option<BTreeMap<String, Option<String>>> {
        let mut c = DirectoryClient::new(channel(addr));
        let req = pb::SearchRequest {
            kind: pb::RecordKind::Producer as i32,
            attributes: [(MARK.to_string(), "1".to_string())].into(),
            page_size: 1000,
            ..Default::default()
        };
        let invoked = self.now();
        let (entries, _) = gma_consumer::directory::search_all(&mut c, req).await.ok()?;
        let completed = self.now();
        let mut by_id: BTreeMap<String, Vec<pb::RecordEntry>> = BTreeMap::new();
        for e in entries {
            if let Some(pb::record::Record::Producer(p)) = e.record.as_ref().and_then(|r| r.record.as_ref()) {
                by_id.entry(p.id.clone()).or_default().push(e);
            }
        }
        let mut out = BTreeMap::new();
        let mut ops = self.ops.lock().unwrap();
        for key in keys {
            let v = value_of(by_id.remove(key).unwrap_or_default());
            ops.push(Op {
                client,
                key: key.clone(),
                call: Call::Read,
                invoked,
                completed: Some(completed),
                outcome: Outcome::Read(v.clone()),
            });
            out.insert(key.clone(), v);
        }
        // A test record under an id no client used would be a bug of its own.
        assert!(by_id.is_empty(), "records nobody wrote: {by_id:?}");
        Some(out)
    }
}

/// One client bound to one member, as in Jepsen: random operations on random keys until
/// `stop`, with a think time in between. After an indeterminate operation it reconnects.
async fn client(
    id: usize,
    addr: String,
    keys: Arc<KeySpace>,
    seed: u64,
    stagger: Duration,
    stop: Arc<AtomicBool>,
    rec: Arc<Recorder>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(1 + id as u64));
    let mut c = DirectoryClient::new(channel(&addr));
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let key = &keys.take(rng.random_range(0..keys.slots()));
        n += 1;
        let value = format!("{id}.{n}");
        let call = match rng.random_range(0..100) {
            0..40 => Call::Read,
            40..60 => Call::Register(value),
            60..85 => Call::Update(value),
            _ => Call::Remove,
        };
        if matches!(
            rec.run(id, &mut c, key, call).await,
            Outcome::Unknown | Outcome::NotSent
        ) {
            c = DirectoryClient::new(channel(&addr));
        }
        let think = rng.random_range(0..stagger.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The nemesis
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// Blackhole routes between one member and the two others; clients still reach all.
    Partition,
    /// Blackhole routes between one member and one other only: the third still reaches both
    /// (overlapping majorities, the partition that makes raft leaders churn).
    Bridge,
    /// One member's bridge port down: cut off from peers and clients alike.
    Cut,
    /// SIGKILL one member, restart it after the hold.
    Kill,
    /// SIGKILL all three at once, restart them after the hold.
    KillAll,
    /// SIGSTOP one member, SIGCONT after the hold.
    Pause,
}

const FAULTS: [Fault; 6] = [
    Fault::Partition,
    Fault::Bridge,
    Fault::Cut,
    Fault::Kill,
    Fault::KillAll,
    Fault::Pause,
];

/// Keeps a fault in place: the thing under test, not a wait for a condition.
async fn hold_fault(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Lets the cluster work between faults.
async fn quiet_period(d: Duration) {
    tokio::time::sleep(d).await;
}

struct Nemesis {
    rng: ChaCha8Rng,
    log: Vec<(u64, String)>,
    done: BTreeMap<Fault, usize>,
}

impl Nemesis {
    fn note(&mut self, rec: &Recorder, what: String) {
        eprintln!("nemesis {:>8.3} s: {what}", rec.now() as f64 / 1e9);
        self.log.push((rec.now(), what));
    }

    /// One fault: inject, hold, heal, quiet.
    fn run(&mut self, rt: &Runtime, m: &mut Members, rec: &Recorder, fault: Fault) {
        // The same draws in the same order whatever happens, so a seed replays the schedule;
        // only who leads at the time depends on the run. Half the time the victim is the
        // leader (the interesting one), else a member drawn at random.
        let (want_leader, any, other_pick) = (
            self.rng.random_bool(0.5),
            self.rng.random_range(0..MEMBERS),
            self.rng.random_range(0..MEMBERS - 1),
        );
        let hold = Duration::from_millis(self.rng.random_range(1000..3000));
        let quiet = Duration::from_millis(self.rng.random_range(1000..2000));
        let l = leader(rt, m);
        let victim = match l {
            Some(l) if want_leader => l,
            _ => any,
        };
        let is_leader = l == Some(victim);
        let who = format!(
            "member {}{}",
            victim + 1,
            if is_leader { " (leader)" } else { "" }
        );
        let others: Vec<usize> = (0..MEMBERS).filter(|j| *j != victim).collect();
        match fault {
            Fault::Partition => {
                for j in &others {
                    m.seg.block(victim, *j).unwrap();
                }
                self.note(rec, format!("partition {who} from the others for {hold:?}"));
                rt.block_on(hold_fault(hold));
                for j in &others {
                    m.seg.unblock(victim, *j).unwrap();
                }
            }
            Fault::Bridge => {
                let other = others[other_pick];
                m.seg.block(victim, other).unwrap();
                self.note(
                    rec,
                    format!("partition {who} from member {} only for {hold:?}", other + 1),
                );
                rt.block_on(hold_fault(hold));
                m.seg.unblock(victim, other).unwrap();
            }
            Fault::Cut => {
                m.seg.cut(victim).unwrap();
                self.note(rec, format!("cut {who}'s link for {hold:?}"));
                rt.block_on(hold_fault(hold));
                m.seg.uncut(victim).unwrap();
            }
            Fault::Kill => {
                m.kill(victim);
                self.note(rec, format!("kill -9 {who}, restart after {hold:?}"));
                rt.block_on(hold_fault(hold));
                m.restart(victim);
            }
            Fault::KillAll => {
                for i in 0..MEMBERS {
                    m.kill(i);
                }
                self.note(rec, format!("kill -9 all members, restart after {hold:?}"));
                rt.block_on(hold_fault(hold));
                for i in 0..MEMBERS {
                    m.restart(i);
                }
            }
            Fault::Pause => {
                m.pause(victim);
                self.note(rec, format!("SIGSTOP {who} for {hold:?}"));
                rt.block_on(hold_fault(hold));
                m.resume(victim);
            }
        }
        self.note(rec, format!("healed {fault:?}"));
        *self.done.entry(fault).or_default() += 1;
        rt.block_on(quiet_period(quiet));
    }
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

fn count(ops: &[Op], pred: impl Fn(&Op) -> bool) -> usize {
    ops.iter().filter(|o| pred(o)).count()
}

#[test]
fn the_directory_stays_linearizable_under_partitions_kills_and_pauses() {
    let s = Settings::from_env();
    eprintln!(
        "jepsen: seed {} ({} s of faults, {} clients, {} keys at a time, {} operations each); replay with: {}",
        s.seed,
        s.workload.as_secs(),
        s.clients,
        s.keys,
        s.per_key,
        s.replay()
    );
    let seg = Segment::new(MEMBERS).unwrap_or_else(|e| {
        panic!(
            "the Jepsen test needs a network namespace per directory member and cannot make them: {e} \
             (it runs as root with iproute2; it never falls back to loopback)"
        )
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Channels made outside the runtime's tasks (the final reads) spawn their connection on it.
    let _in_runtime = rt.enter();
    let t0 = Instant::now();
    let mut m = Members::start(seg);
    assert!(
        wait_until(Duration::from_secs(30), || leader(&rt, &m).is_some()),
        "no leader elected: {}",
        m.logs()
    );
    eprintln!("jepsen: cluster up in {:?}", t0.elapsed());

    let rec = Arc::new(Recorder {
        start: Instant::now(),
        ops: Mutex::new(Vec::new()),
        unexpected: Unexpected::default(),
    });
    let keys = Arc::new(KeySpace::new(s.keys, s.per_key));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..s.clients)
        .map(|id| {
            rt.spawn(client(
                id,
                m.addrs[id % MEMBERS].clone(),
                keys.clone(),
                s.seed,
                s.stagger,
                stop.clone(),
                rec.clone(),
            ))
        })
        .collect();

    // The nemesis: every kind of fault once, in a seeded order, then seeded random faults
    // until the workload time is over.
    let mut nem = Nemesis {
        rng: ChaCha8Rng::seed_from_u64(s.seed),
        log: Vec::new(),
        done: BTreeMap::new(),
    };
    rt.block_on(quiet_period(Duration::from_secs(1)));
    let mut first = s.faults.clone();
    first.shuffle(&mut nem.rng);
    for f in first {
        nem.run(&rt, &mut m, &rec, f);
    }
    while rec.start.elapsed() < s.workload {
        let f = s.faults[nem.rng.random_range(0..s.faults.len())];
        nem.run(&rt, &mut m, &rec, f);
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        rt.block_on(t).unwrap();
    }
    let workload_time = rec.start.elapsed();

    // Heal, then wait until every member answers, they agree on the leader and revision.
    m.heal();
    nem.note(&rec, "healed everything; clients stopped".into());
    let mut last = Vec::new();
    let converged = wait_until(Duration::from_secs(60), || {
        last = rt.block_on(futures::future::join_all(m.addrs.iter().map(|a| status(a))));
        last.iter().all(|s| s.is_some())
            && last.iter().flatten().all(|x| {
                let f = last[0].as_ref().unwrap();
                x.leader_id != 0 && x.leader_id == f.leader_id && x.revision == f.revision
            })
    });
    assert!(
        converged,
        "the members did not converge after healing (seed {}): {last:#?}\n{}",
        s.seed,
        m.logs()
    );

    // Final reads: one linearizable search of every test record, recorded as a read of each
    // record id the run used, until every member's own state (a stale read) agrees with it.
    let used: std::collections::BTreeSet<String> =
        rec.ops.lock().unwrap().iter().map(|o| o.key.clone()).collect();
    let mut finals: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut views = Vec::new();
    let mut attempt = 0;
    let agreed = wait_until(Duration::from_secs(60), || {
        attempt += 1;
        let Some(read) = rt.block_on(rec.read_all(s.clients, &m.addrs[attempt % MEMBERS], &used)) else {
            return false;
        };
        finals = read;
        views = m.addrs.iter().map(|a| rt.block_on(member_view(a))).collect();
        let expected: BTreeMap<String, String> = finals
            .iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.clone(), v)))
            .collect();
        views.iter().all(|v| v.as_ref() == Some(&expected))
    });
    assert!(
        agreed,
        "the members' own states do not agree with the final reads (seed {}): finals {finals:?}, members {views:?}\n{}",
        s.seed,
        m.logs()
    );

    // Check.
    let ops = rec.ops.lock().unwrap().clone();
    let report_path = write_report(&s, &ops, &nem.log);
    let check_start = Instant::now();
    let verdict = linearizable::check(&ops, CHECK_BUDGET);
    let check_time = check_start.elapsed();
    let writes = |c: fn(&Call) -> bool| count(&ops, |o| c(&o.call));
    eprintln!(
        "jepsen: {} ops in {:.1} s ({} reads, {} registers, {} updates, {} removes): {} ok, {} definite failures, {} indeterminate",
        ops.len(),
        workload_time.as_secs_f64(),
        writes(|c| matches!(c, Call::Read)),
        writes(|c| matches!(c, Call::Register(_))),
        writes(|c| matches!(c, Call::Update(_))),
        writes(|c| matches!(c, Call::Remove)),
        count(&ops, |o| matches!(o.outcome, Outcome::Ok | Outcome::Read(_))),
        count(&ops, |o| matches!(o.outcome, Outcome::AlreadyExists | Outcome::NotFound)),
        count(&ops, |o| o.outcome == Outcome::Unknown),
    );
    eprintln!(
        "jepsen: {} more not sent (no connection to the client's member)",
        count(&ops, |o| o.outcome == Outcome::NotSent)
    );
    eprintln!(
        "jepsen: faults {:?}; history and schedule in {}",
        nem.done,
        report_path.display()
    );
    eprintln!(
        "jepsen: at the end {} of the {} record ids used hold a record",
        finals.values().filter(|v| v.is_some()).count(),
        finals.len()
    );
    let mut reasons: Vec<(usize, String)> = rec
        .unexpected
        .reasons
        .lock()
        .unwrap()
        .iter()
        .map(|(r, n)| (*n, r.clone()))
        .collect();
    reasons.sort_by(|a, b| b.cmp(a));
    for (n, r) in reasons.iter().take(8) {
        eprintln!("jepsen: {n:>5} x {r}");
    }
    match verdict {
        Verdict::Linearizable(st) => eprintln!(
            "jepsen: linearizable ({} keys, {} ops searched, {} steps, {} cached states, {:?}); total {:?}",
            st.keys,
            st.ops,
            st.steps,
            st.cache,
            check_time,
            t0.elapsed()
        ),
        Verdict::NotLinearizable(v) => panic!(
            "NOT LINEARIZABLE (seed {}; replay: {}; full history in {})\n{v}",
            s.seed,
            s.replay(),
            report_path.display()
        ),
        Verdict::Unknown { key, steps } => panic!(
            "the checker gave up on record {key} after {steps} steps: nothing proved (seed {}; history in {})",
            s.seed,
            report_path.display()
        ),
    }
    let lost = linearizable::lost_writes(&ops, &finals);
    assert!(
        lost.is_empty(),
        "acknowledged writes missing at the end (seed {}): {:#?}",
        s.seed,
        lost.iter().map(|o| o.to_string()).collect::<Vec<_>>()
    );
    let unexpected = rec.unexpected.statuses.lock().unwrap().clone();
    assert!(unexpected.is_empty(), "unexpected statuses: {unexpected:#?}");

    // The run tested something: every fault happened, every kind of operation succeeded, and
    // reads saw records both present and absent.
    for f in &s.faults {
        assert!(nem.done.get(f).copied().unwrap_or(0) >= 1, "no {f:?} fault ran");
    }
    for (name, pred) in [
        (
            "register",
            (|o: &Op| matches!(o.call, Call::Register(_)) && o.outcome == Outcome::Ok) as fn(&Op) -> bool,
        ),
        ("update", |o: &Op| {
            matches!(o.call, Call::Update(_)) && o.outcome == Outcome::Ok
        }),
        ("remove", |o: &Op| {
            o.call == Call::Remove && o.outcome == Outcome::Ok
        }),
        ("read of a record", |o: &Op| {
            matches!(o.outcome, Outcome::Read(Some(_)))
        }),
        ("read of no record", |o: &Op| o.outcome == Outcome::Read(None)),
    ] {
        assert!(
            count(&ops, pred) >= 5,
            "fewer than 5 successful {name} operations"
        );
    }
}

/// Checks a history saved by a run again (`GMA_JEPSEN_HISTORY=target/tmp/jepsen/history-N.txt
/// cargo nextest run -p gma --test jepsen --run-ignored only recheck`): for working on the
/// checker, or on a failure, without the cluster.
#[test]
#[ignore = "needs GMA_JEPSEN_HISTORY: a history file written by a run"]
fn recheck_a_saved_history() {
    let path = std::env::var("GMA_JEPSEN_HISTORY").expect("GMA_JEPSEN_HISTORY=<history file>");
    let text = std::fs::read_to_string(&path).unwrap();
    let ops: Vec<Op> = text
        .lines()
        .skip_while(|l| *l != "operations:")
        .skip(1)
        .map(|l| l.parse().unwrap())
        .collect();
    let t = Instant::now();
    match linearizable::check(&ops, CHECK_BUDGET) {
        Verdict::Linearizable(st) => eprintln!("{} ops: linearizable {st:?} in {:?}", ops.len(), t.elapsed()),
        Verdict::NotLinearizable(v) => panic!("NOT LINEARIZABLE\n{v}"),
        Verdict::Unknown { key, steps } => panic!("gave up on {key} after {steps} steps"),
    }
}

/// Every test record a member holds (id -> value), read from its own state (stale_ok).
async fn member_view(addr: &str) -> Option<BTreeMap<String, String>> {
    let mut c = DirectoryClient::new(channel(addr));
    let req = pb::SearchRequest {
        kind: pb::RecordKind::Producer as i32,
        attributes: [(MARK.to_string(), "1".to_string())].into(),
        stale_ok: true,
        page_size: 1000,
        ..Default::default()
    };
    let (entries, _) = gma_consumer::directory::search_all(&mut c, req).await.ok()?;
    Some(
        entries
            .into_iter()
            .filter_map(gma_consumer::directory::producer_of)
            .map(|p| (p.id, p.attributes.get(VALUE).cloned().unwrap_or_default()))
            .collect(),
    )
}

/// The history (by record, in invocation order) and the fault schedule, as text.
fn write_report(s: &Settings, ops: &[Op], nemesis: &[(u64, String)]) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("jepsen");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("history-{}.txt", s.seed));
    let mut text = format!("seed {}\nreplay: {}\n\nnemesis:\n", s.seed, s.replay());
    for (t, what) in nemesis {
        text += &format!("  {:>10.3} ms  {what}\n", *t as f64 / 1e6);
    }
    let mut sorted: Vec<&Op> = ops.iter().collect();
    sorted.sort_by(|a, b| (&a.key, a.invoked).cmp(&(&b.key, b.invoked)));
    text += "\noperations:\n";
    for o in sorted {
        text += &format!("  {o}\n");
    }
    std::fs::write(&path, text).unwrap();
    path
}

// ---------------------------------------------------------------------------------------------
// The checker's own tests: known linearizable and known non-linearizable histories
// ---------------------------------------------------------------------------------------------

mod checker {
    use super::common::linearizable::{check, lost_writes, Call, Op, Outcome, Verdict};
    use proptest::prelude::*;
    use proptest::sample::Index;
    use proptest::test_runner::FileFailurePersistence;
    use std::cell::Cell;
    use std::collections::BTreeMap;

    const BUDGET: u64 = 10_000_000;

    /// `cases` cases; a failure is kept in `jepsen.proptest-regressions` beside this file
    /// (an integration test has no lib.rs above it for proptest's default place).
    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
                "proptest-regressions",
            ))),
            ..ProptestConfig::default()
        }
    }

    fn op(client: usize, call: Call, invoked: u64, completed: Option<u64>, outcome: Outcome) -> Op {
        Op {
            client,
            key: "k".into(),
            call,
            invoked,
            completed,
            outcome,
        }
    }
    fn reg(c: usize, v: &str, a: u64, b: u64) -> Op {
        op(c, Call::Register(v.into()), a, Some(b), Outcome::Ok)
    }
    fn upd(c: usize, v: &str, a: u64, b: u64) -> Op {
        op(c, Call::Update(v.into()), a, Some(b), Outcome::Ok)
    }
    fn rm(c: usize, a: u64, b: u64) -> Op {
        op(c, Call::Remove, a, Some(b), Outcome::Ok)
    }
    fn read(c: usize, v: Option<&str>, a: u64, b: u64) -> Op {
        op(c, Call::Read, a, Some(b), Outcome::Read(v.map(String::from)))
    }
    fn unknown(c: usize, call: Call, a: u64) -> Op {
        op(c, call, a, None, Outcome::Unknown)
    }

    fn linearizable(h: &[Op]) -> bool {
        match check(h, BUDGET) {
            Verdict::Linearizable(_) => true,
            Verdict::NotLinearizable(v) => {
                eprintln!("{v}");
                false
            }
            Verdict::Unknown { key, steps } => panic!("out of budget on {key} after {steps}"),
        }
    }

    #[test]
    fn a_sequential_history_is_linearizable() {
        let h = [
            read(0, None, 0, 1),
            reg(0, "a", 2, 3),
            read(1, Some("a"), 4, 5),
            upd(1, "b", 6, 7),
            read(0, Some("b"), 8, 9),
            op(
                0,
                Call::Register("c".into()),
                10,
                Some(11),
                Outcome::AlreadyExists,
            ),
            rm(1, 12, 13),
            read(0, None, 14, 15),
            op(0, Call::Update("d".into()), 16, Some(17), Outcome::NotFound),
            op(1, Call::Remove, 18, Some(19), Outcome::NotFound),
        ];
        assert!(linearizable(&h));
    }

    #[test]
    fn concurrent_writes_may_take_effect_in_either_order() {
        // Two updates overlap; reads after both see b then b: b last. Or a last: both fine.
        let base = [reg(0, "x", 0, 1)];
        for last in ["a", "b"] {
            let mut h = base.to_vec();
            h.extend([
                upd(0, "a", 10, 20),
                upd(1, "b", 12, 22),
                read(2, Some(last), 30, 31),
                read(2, Some(last), 32, 33),
            ]);
            assert!(linearizable(&h), "last {last}");
        }
        // A read concurrent with a write may see the old or the new value.
        for seen in ["x", "a"] {
            let mut h = base.to_vec();
            h.extend([upd(0, "a", 10, 20), read(1, Some(seen), 11, 19)]);
            assert!(linearizable(&h), "seen {seen}");
        }
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_rejected() {
        let h = [reg(0, "a", 0, 1), upd(0, "b", 2, 3), read(1, Some("a"), 4, 5)];
        assert!(!linearizable(&h));
    }

    #[test]
    fn a_read_of_a_value_never_written_is_rejected() {
        let h = [reg(0, "a", 0, 1), read(1, Some("zz"), 2, 3)];
        assert!(!linearizable(&h));
        // Nor may a record appear that nobody registered.
        assert!(!linearizable(&[read(1, Some("a"), 0, 1)]));
    }

    #[test]
    fn reads_that_observe_two_concurrent_writes_in_both_orders_are_rejected() {
        // a and b are written concurrently; one read sees b, a later one a, a later one b
        // again: that needs a third write.
        let h = [
            reg(0, "x", 0, 1),
            upd(0, "a", 10, 100),
            upd(1, "b", 10, 100),
            read(2, Some("b"), 20, 21),
            read(2, Some("a"), 30, 31),
            read(2, Some("b"), 40, 41),
        ];
        assert!(!linearizable(&h));
        // Two readers disagreeing on the order after both writes completed.
        let h = [
            reg(0, "x", 0, 1),
            upd(0, "a", 10, 20),
            upd(1, "b", 10, 20),
            read(2, Some("a"), 30, 31),
            read(3, Some("b"), 32, 33),
        ];
        assert!(!linearizable(&h));
    }

    #[test]
    fn definite_failures_must_be_explained_by_the_state() {
        // ALREADY_EXISTS while the record was certainly absent.
        let h = [
            read(0, None, 0, 1),
            op(1, Call::Register("a".into()), 2, Some(3), Outcome::AlreadyExists),
        ];
        assert!(!linearizable(&h));
        // NOT_FOUND while it was certainly present.
        let h = [
            reg(0, "a", 0, 1),
            op(1, Call::Update("b".into()), 2, Some(3), Outcome::NotFound),
        ];
        assert!(!linearizable(&h));
        let h = [
            reg(0, "a", 0, 1),
            op(1, Call::Remove, 2, Some(3), Outcome::NotFound),
        ];
        assert!(!linearizable(&h));
        // A failed register changes nothing: the old value stays.
        let h = [
            reg(0, "a", 0, 1),
            op(1, Call::Register("b".into()), 2, Some(3), Outcome::AlreadyExists),
            read(1, Some("b"), 4, 5),
        ];
        assert!(!linearizable(&h));
        // Two registers of an absent record both acknowledged, with no remove between.
        let h = [reg(0, "a", 0, 10), reg(1, "b", 0, 10), read(2, Some("b"), 11, 12)];
        assert!(!linearizable(&h));
    }

    #[test]
    fn indeterminate_writes_may_apply_at_any_later_time_or_never() {
        // Never observed: fine.
        let h = [
            reg(0, "a", 0, 1),
            unknown(1, Call::Update("b".into()), 2),
            read(0, Some("a"), 10, 11),
        ];
        assert!(linearizable(&h));
        // Observed long after its invocation (applied late): fine, and the old value may be
        // read before it.
        let h = [
            reg(0, "a", 0, 1),
            unknown(1, Call::Update("b".into()), 2),
            read(0, Some("a"), 10, 11),
            read(0, Some("b"), 20, 21),
        ];
        assert!(linearizable(&h));
        // An indeterminate remove explains a later register's success.
        let h = [
            reg(0, "a", 0, 1),
            unknown(1, Call::Remove, 2),
            reg(0, "c", 10, 11),
            read(0, Some("c"), 12, 13),
        ];
        assert!(linearizable(&h));
        // An indeterminate register explains a later ALREADY_EXISTS.
        let h = [
            unknown(1, Call::Register("a".into()), 0),
            op(
                0,
                Call::Register("c".into()),
                10,
                Some(11),
                Outcome::AlreadyExists,
            ),
            read(0, Some("a"), 12, 13),
        ];
        assert!(linearizable(&h));
        // Indeterminate reads constrain nothing.
        let h = [reg(0, "a", 0, 1), op(1, Call::Read, 2, None, Outcome::Unknown)];
        assert!(linearizable(&h));
    }

    #[test]
    fn a_request_that_was_never_sent_has_no_effect() {
        let h = [
            reg(0, "a", 0, 1),
            op(1, Call::Update("b".into()), 2, Some(3), Outcome::NotSent),
            read(0, Some("b"), 10, 11),
        ];
        assert!(!linearizable(&h));
        let h = [
            op(1, Call::Register("a".into()), 0, Some(1), Outcome::NotSent),
            read(0, None, 10, 11),
        ];
        assert!(linearizable(&h));
    }

    #[test]
    fn an_indeterminate_write_cannot_take_effect_before_it_was_invoked() {
        let h = [
            reg(0, "a", 0, 1),
            read(1, Some("b"), 2, 3),
            unknown(2, Call::Update("b".into()), 5),
        ];
        assert!(!linearizable(&h));
        // Nor twice: once seen and overwritten, its value cannot come back.
        let h = [
            reg(0, "a", 0, 1),
            unknown(1, Call::Update("b".into()), 2),
            read(0, Some("b"), 10, 11),
            upd(0, "c", 12, 13),
            read(0, Some("b"), 14, 15),
        ];
        assert!(!linearizable(&h));
    }

    #[test]
    fn records_are_checked_separately_and_the_bad_one_is_named() {
        let mut h = vec![reg(0, "a", 0, 1), read(1, Some("a"), 2, 3)];
        let mut other = vec![reg(2, "p", 0, 1), upd(2, "q", 2, 3), read(3, Some("p"), 4, 5)];
        for o in &mut other {
            o.key = "k2".into();
        }
        h.extend(other);
        match check(&h, BUDGET) {
            Verdict::NotLinearizable(v) => {
                assert_eq!(v.key, "k2");
                let text = v.to_string();
                assert!(text.contains("read -> p"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn acknowledged_writes_contradicted_by_the_final_state_are_lost() {
        let h = [reg(0, "a", 0, 1), upd(0, "b", 2, 3)];
        let finals = |v: Option<&str>| BTreeMap::from([("k".to_string(), v.map(String::from))]);
        assert!(lost_writes(&h, &finals(Some("b"))).is_empty());
        let lost = lost_writes(&h, &finals(Some("a")));
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].call, Call::Update("b".into()));
        assert_eq!(lost_writes(&h, &finals(None)).len(), 1);
        // An acknowledged remove, then the record is back with no write after it.
        let h = [reg(0, "a", 0, 1), rm(0, 2, 3)];
        assert_eq!(lost_writes(&h, &finals(Some("a"))).len(), 1);
        // A write that may have come later excuses it (an indeterminate one too).
        let h = [reg(0, "a", 0, 1), upd(0, "b", 2, 10), upd(1, "c", 5, 6)];
        assert!(lost_writes(&h, &finals(Some("c"))).is_empty());
        let h = [reg(0, "a", 0, 1), upd(0, "b", 2, 3), unknown(1, Call::Remove, 0)];
        assert!(lost_writes(&h, &finals(None)).is_empty());
        // Definite failures do not.
        let h = [
            reg(0, "a", 0, 1),
            upd(0, "b", 2, 3),
            op(1, Call::Update("c".into()), 4, Some(5), Outcome::NotFound),
        ];
        assert_eq!(lost_writes(&h, &finals(Some("c"))).len(), 1);
    }

    proptest! {
        #![proptest_config(config(300))]
        /// Random concurrent histories made linearizable by construction (each operation takes
        /// effect atomically at a random instant inside its interval, on a real register) pass;
        /// the same histories with one read answer changed to a value never written fail.
        #[test]
        fn random_linearizable_histories_pass_and_corrupted_ones_fail(
            (h, reads) in random_history(4, 40),
            which in any::<Index>(),
        ) {
            prop_assert!(linearizable(&h));
            if !reads.is_empty() {
                let mut bad = h.clone();
                bad[reads[which.index(reads.len())]].outcome = Outcome::Read(Some("never-written".into()));
                prop_assert!(!linearizable(&bad), "corrupted read accepted");
            }
        }
    }

    /// The checker agrees with an exhaustive search on thousands of small random histories
    /// (random intervals and random outcomes, so both verdicts are common): its reductions
    /// (indeterminate operations, unobserved values, memoization) neither accept nor reject
    /// anything they should not.
    #[test]
    fn the_checker_agrees_with_an_exhaustive_search_on_small_histories() {
        let verdicts = [Cell::new(0usize), Cell::new(0usize)];
        let history = prop::collection::vec(random_op(), 1..=7).prop_map(|ops| {
            ops.into_iter()
                .enumerate()
                .map(|(i, (call, invoked, completed, outcome))| op(i, call, invoked, completed, outcome))
                .collect::<Vec<Op>>()
        });
        proptest!(config(4000), |(h in history)| {
            let want = brute_force(&h);
            let got = linearizable_quiet(&h);
            prop_assert_eq!(got, want, "checker says {}, exhaustive search {}: {:#?}", got, want, h);
            let v = &verdicts[usize::from(want)];
            v.set(v.get() + 1);
        });
        // Both verdicts were exercised.
        let verdicts = verdicts.map(Cell::into_inner);
        eprintln!("{} not linearizable, {} linearizable", verdicts[0], verdicts[1]);
        assert!(verdicts.iter().all(|v| *v > 500), "{verdicts:?}");
    }

    fn linearizable_quiet(h: &[Op]) -> bool {
        match check(h, BUDGET) {
            Verdict::Linearizable(_) => true,
            Verdict::NotLinearizable(_) => false,
            Verdict::Unknown { key, steps } => panic!("out of budget on {key} after {steps}"),
        }
    }

    /// One operation of a small random history, but for its client: a call on one of three
    /// values, its interval (0-19, 0-7 long) and an outcome of any kind for the call (a read
    /// sees the value 3 times in 5), indeterminate ones never completed.
    fn random_op() -> impl Strategy<Value = (Call, u64, Option<u64>, Outcome)> {
        let v = || prop::sample::select(vec!["a", "b", "c"]).prop_map(String::from);
        let call = prop_oneof![
            (v(), 0..5u8).prop_map(|(v, k)| (
                Call::Read,
                match k {
                    0 => Outcome::Read(None),
                    1 => Outcome::Unknown,
                    _ => Outcome::Read(Some(v)),
                }
            )),
            (
                v(),
                prop::sample::select(vec![Outcome::Ok, Outcome::AlreadyExists, Outcome::Unknown])
            )
                .prop_map(|(v, o)| (Call::Register(v), o)),
            (
                v(),
                prop::sample::select(vec![Outcome::Ok, Outcome::NotFound, Outcome::Unknown])
            )
                .prop_map(|(v, o)| (Call::Update(v), o)),
            prop::sample::select(vec![Outcome::Ok, Outcome::NotFound, Outcome::Unknown])
                .prop_map(|o| (Call::Remove, o)),
        ];
        (call, 0..20u64, 0..8u64).prop_map(|((call, outcome), invoked, len)| {
            let completed = (outcome != Outcome::Unknown).then_some(invoked + len);
            (call, invoked, completed, outcome)
        })
    }

    /// Linearizable by definition, by trying every order of every subset that holds all
    /// completed operations (indeterminate ones may be left out: never applied), respecting
    /// real time, on a plain register.
    fn brute_force(h: &[Op]) -> bool {
        let ops: Vec<&Op> = h
            .iter()
            .filter(|o| !(o.call == Call::Read && o.outcome == Outcome::Unknown))
            .collect();
        fn apply(state: &Option<String>, o: &Op) -> Option<Option<String>> {
            let present = state.is_some();
            match (&o.call, &o.outcome) {
                (Call::Register(v), Outcome::Ok) if !present => Some(Some(v.clone())),
                (Call::Register(_), Outcome::AlreadyExists) if present => Some(state.clone()),
                (Call::Register(v), Outcome::Unknown) => Some(state.clone().or(Some(v.clone()))),
                (Call::Update(v), Outcome::Ok) if present => Some(Some(v.clone())),
                (Call::Update(_), Outcome::NotFound) if !present => Some(None),
                (Call::Update(v), Outcome::Unknown) => Some(state.as_ref().map(|_| v.clone())),
                (Call::Remove, Outcome::Ok) if present => Some(None),
                (Call::Remove, Outcome::NotFound) if !present => Some(None),
                (Call::Remove, Outcome::Unknown) => Some(None),
                (Call::Read, Outcome::Read(seen)) if seen == state => Some(state.clone()),
                _ => None,
            }
        }
        fn search(ops: &[&Op], used: &mut Vec<bool>, order: &mut Vec<usize>, state: Option<String>) -> bool {
            if ops
                .iter()
                .enumerate()
                .all(|(i, o)| used[i] || o.completed.is_none())
            {
                return true;
            }
            for i in 0..ops.len() {
                if used[i] {
                    continue;
                }
                // Real time: nothing placed so far may have been invoked after i completed,
                // and i may not go before an unplaced operation that completed before i began.
                let placed_after = order
                    .iter()
                    .any(|j| ops[i].completed.is_some_and(|c| c < ops[*j].invoked));
                let must_precede = (0..ops.len())
                    .any(|j| j != i && !used[j] && ops[j].completed.is_some_and(|c| c < ops[i].invoked));
                if placed_after || must_precede {
                    continue;
                }
                if let Some(next) = apply(&state, ops[i]) {
                    used[i] = true;
                    order.push(i);
                    if search(ops, used, order, next) {
                        return true;
                    }
                    order.pop();
                    used[i] = false;
                }
            }
            false
        }
        search(&ops, &mut vec![false; ops.len()], &mut Vec::new(), None)
    }

    /// `clients` clients each doing `ops` operations with random intervals; every operation
    /// takes effect at a random point of its interval (some never complete: indeterminate,
    /// applied or not). Returns the history and the indices of completed reads.
    /// One planned operation of a client: the pause before it (after the first), its length,
    /// where in its interval it takes effect (a fraction), its kind, whether the client
    /// crashed during it (1 in 10) and then whether it was applied.
    type Planned = (u64, u64, f64, u8, bool, bool);

    /// A concurrent history of `clients` clients with up to `ops / clients` operations each,
    /// linearizable by construction, and the indices of its reads.
    fn random_history(clients: usize, ops: usize) -> impl Strategy<Value = (Vec<Op>, Vec<usize>)> {
        let plan = (
            0..10u64,
            prop::collection::vec(
                (
                    1..5u64,
                    1..30u64,
                    0.0..=1.0f64,
                    0..4u8,
                    prop::bool::weighted(0.1),
                    prop::bool::ANY,
                ),
                ops / clients,
            ),
        );
        prop::collection::vec(plan, clients).prop_map(|plans| history_of(&plans))
    }

    fn history_of(plans: &[(u64, Vec<Planned>)]) -> (Vec<Op>, Vec<usize>) {
        // (effect time, client, call, invoked, completed, indeterminate)
        let mut planned = Vec::new();
        for (c, (first, ops)) in plans.iter().enumerate() {
            let mut t = *first;
            for (n, &(pause, len, effect, kind, lost, applied)) in ops.iter().enumerate() {
                if n > 0 {
                    t += pause;
                }
                let start = t;
                let end = start + len;
                let at = start + (effect * len as f64).round() as u64;
                let v = format!("{c}.{n}");
                let call = match kind {
                    0 => Call::Read,
                    1 => Call::Register(v),
                    2 => Call::Update(v),
                    _ => Call::Remove,
                };
                // Indeterminate: applied (at `at`) or never, as generated.
                let applied = !lost || applied;
                planned.push((at, c, call, start, end, lost, applied));
                t = end;
                if lost {
                    break; // a crashed client does no more
                }
            }
        }
        planned.sort_by_key(|p| p.0);
        let mut state: Option<String> = None;
        let mut h = Vec::new();
        let mut reads = Vec::new();
        for (_, c, call, start, end, lost, applied) in planned {
            let outcome = if lost && !applied {
                Outcome::Unknown
            } else {
                let o = match &call {
                    Call::Read => Outcome::Read(state.clone()),
                    Call::Register(v) if state.is_none() => {
                        state = Some(v.clone());
                        Outcome::Ok
                    }
                    Call::Register(_) => Outcome::AlreadyExists,
                    Call::Update(v) if state.is_some() => {
                        state = Some(v.clone());
                        Outcome::Ok
                    }
                    Call::Update(_) => Outcome::NotFound,
                    Call::Remove if state.is_some() => {
                        state = None;
                        Outcome::Ok
                    }
                    Call::Remove => Outcome::NotFound,
                };
                if lost {
                    Outcome::Unknown
                } else {
                    o
                }
            };
            if matches!(outcome, Outcome::Read(_)) {
                reads.push(h.len());
            }
            h.push(op(c, call, start, (!lost).then_some(end), outcome));
        }
        (h, reads)
    }
}
