//! A discrete-event world of sites, in one process: each site is a real [`SiteState`] (the
//! job manager the endpoint runs) with simulated hosts; the messages between sites (forwards,
//! start grants, job events, summaries, heartbeats) are delivered after a latency, or dropped
//! across a cut link. Used by `gma bench federation` (mean completion with and without
//! federation) and by tests of exactly-once under partitions.
//!
//! Simplifications against the endpoint: liveness is implicit (a site hears every peer it is
//! not cut from whenever it steps) unless explicit heartbeats are asked for; there is no
//! persistence; a request across a cut link times out after `timeout_ns`; sessions across a
//! cut link reopen (`ListForwarded`, reconcile) when [`World::heal`] heals it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use gma_broker::{Job, Resource, Snapshot};
use gma_proto::v1 as pb;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::route::{route, LocalView, PeerView, Release, RouteJob, RoutePolicy};
use crate::site::{Effect, ForwardOutcome, Grant, Link, Params, Reject, Role, SiteState};
use crate::summary::{SiteLoad, Summary};
use gma_broker::RankConfig;
use hdrhistogram::Histogram;
use std::time::Instant;

/// The world's clock starts here (ns).
pub const T0: i64 = 1_000_000_000_000;

#[derive(Debug, Clone)]
pub struct SiteSpec {
    pub params: Params,
    pub hosts: u32,
    pub cpus_per_host: u32,
}

#[derive(Debug, Clone)]
enum Msg {
    Forward(Box<pb::ForwardRequest>),
    ForwardResult {
        id: String,
        outcome: ForwardOutcome,
    },
    AskStart {
        id: String,
    },
    StartResult {
        id: String,
        granted: Option<bool>,
        reason: String,
    },
    Cancel {
        id: String,
        reason: String,
    },
    Summary(Summary),
    Event(pb::JobEvent),
}

#[derive(Debug, Clone)]
enum Ev {
    Submit {
        site: usize,
        job: Job,
        pin: Option<String>,
    },
    Step {
        site: usize,
    },
    Deliver {
        from: usize,
        to: usize,
        msg: Msg,
    },
    Beat,
}

struct SimSite {
    state: SiteState,
    hosts: Vec<Resource>,
    snap: Snapshot,
    /// Next event seq to pass to each peer (by peer index).
    cursor: HashMap<usize, u64>,
    peers: Vec<usize>,
    scheduled: Option<i64>,
}

/// The world.
pub struct World {
    pub now: i64,
    sites: Vec<SimSite>,
    index: HashMap<String, usize>,
    heap: BinaryHeap<Reverse<(i64, u64)>>,
    pending: HashMap<u64, Ev>,
    next: u64,
    /// One-way message latency.
    pub latency_ns: i64,
    /// How long a request across a cut link waits before it counts as unanswered.
    pub timeout_ns: i64,
    /// Directed pairs (from, to) whose messages are dropped.
    cut: HashSet<(usize, usize)>,
    /// Explicit heartbeats every this many ns (`None`: implicit liveness).
    heartbeat_ns: Option<i64>,
    /// Every `job.state` event any site published, in order.
    pub log: Vec<pb::JobEvent>,
    pub summaries_sent: u64,
    pub summary_bytes: Vec<usize>,
}

impl World {
    /// Sites and the symmetric peer links between them (by name).
    pub fn new(specs: Vec<SiteSpec>, links: &[(&str, &str)]) -> World {
        let mut index = HashMap::new();
        let mut sites = Vec::new();
        for (i, s) in specs.into_iter().enumerate() {
            let name = s.params.site.clone();
            index.insert(name.clone(), i);
            let hosts: Vec<Resource> = (0..s.hosts)
                .map(|h| {
                    let mut r = Resource::unknown(&format!("{name}-h{h:03}"));
                    r.total_cpus = f64::from(s.cpus_per_host);
                    r.free_cpus = f64::from(s.cpus_per_host);
                    r.load1 = 0.0;
                    r.queue_waiting = 0.0;
                    r.memory_mb = 65_536.0;
                    r.arch = "x86_64".into();
                    r.os = "Linux".into();
                    r.producer = format!("{name}-sim");
                    r.updated_ns = T0;
                    r
                })
                .collect();
            let snap = Snapshot::new(T0, hosts.clone());
            sites.push(SimSite {
                state: SiteState::new(s.params, 1 + i as u64),
                hosts,
                snap,
                cursor: HashMap::new(),
                peers: Vec::new(),
                scheduled: None,
            });
        }
        let mut w = World {
            now: T0,
            sites,
            index,
            heap: BinaryHeap::new(),
            pending: HashMap::new(),
            next: 0,
            latency_ns: 1_000_000,
            timeout_ns: 2_000_000_000,
            cut: HashSet::new(),
            heartbeat_ns: None,
            log: Vec::new(),
            summaries_sent: 0,
            summary_bytes: Vec::new(),
        };
        let mut per: BTreeMap<usize, Vec<Link>> = BTreeMap::new();
        for (a, b) in links {
            let (ia, ib) = (w.index[*a], w.index[*b]);
            for (x, y, name) in [(ia, ib, *b), (ib, ia, *a)] {
                per.entry(x).or_default().push(Link {
                    site: name.to_string(),
                    endpoint: format!("sim://{name}"),
                    role: Role::Peer,
                    hops: 0,
                });
                w.sites[x].peers.push(y);
            }
        }
        for (i, links) in per {
            w.sites[i].state.set_links(links, T0);
            let peers = w.sites[i].peers.clone();
            for p in peers {
                w.sites[i].cursor.insert(p, 1);
            }
        }
        for i in 0..w.sites.len() {
            w.at(T0, Ev::Step { site: i });
        }
        w
    }

    /// Gives the hosts of `site` other attributes before the run (`f` gets each host's index
    /// and row: memory, benchmarks, CPUs); free CPUs follow the total (`gma bench utility`).
    pub fn reshape_hosts(&mut self, site: &str, f: impl Fn(usize, &mut Resource)) {
        let now = self.now;
        let s = &mut self.sites[self.index[site]];
        for (i, h) in s.hosts.iter_mut().enumerate() {
            f(i, h);
            h.free_cpus = h.total_cpus;
        }
        s.snap = Snapshot::new(now, s.hosts.clone());
    }

    /// Heartbeats every `every_ns` instead of implicit liveness.
    pub fn heartbeats(&mut self, every_ns: i64) {
        self.heartbeat_ns = Some(every_ns);
        self.at(self.now, Ev::Beat);
    }

    /// Drops every message between `a` and `b` (both ways) until [`World::heal`].
    pub fn cut(&mut self, a: &str, b: &str) {
        let (ia, ib) = (self.index[a], self.index[b]);
        self.cut.insert((ia, ib));
        self.cut.insert((ib, ia));
    }

    /// Heals every cut. Each site reopens its sessions across the links that were cut, as the
    /// endpoint does: it reconciles the jobs it forwarded there with that site's
    /// `ListForwarded` and follows its job events from there on (events sent across the cut,
    /// a cancellation for instance, were dropped).
    pub fn heal(&mut self) {
        let now = self.now;
        let mut cut: Vec<(usize, usize)> = self.cut.drain().collect();
        cut.sort_unstable();
        for (origin, receiver) in cut {
            let origin_name = self.sites[origin].state.site().to_string();
            let receiver_name = self.sites[receiver].state.site().to_string();
            let list = self.sites[receiver].state.list_forwarded(&origin_name);
            self.sites[receiver].cursor.insert(origin, list.next_seq);
            self.sites[origin].state.reconcile(&receiver_name, &list, now);
        }
        let n = self.sites.len();
        for i in 0..n {
            self.at(self.now, Ev::Step { site: i });
        }
    }

    pub fn site(&self, name: &str) -> &SiteState {
        &self.sites[self.index[name]].state
    }

    fn at(&mut self, t: i64, ev: Ev) {
        let k = self.next;
        self.next += 1;
        self.pending.insert(k, ev);
        self.heap.push(Reverse((t, k)));
    }

    /// Submits `job` at site `site` at time `t`.
    pub fn submit_at(&mut self, t: i64, site: &str, job: Job) {
        let i = self.index[site];
        self.at(
            t,
            Ev::Submit {
                site: i,
                job,
                pin: None,
            },
        );
    }

    /// Submits `job` at `site`, sent to the peer `to` (an operator's choice).
    pub fn submit_pinned_at(&mut self, t: i64, site: &str, job: Job, to: &str) {
        let i = self.index[site];
        self.at(
            t,
            Ev::Submit {
                site: i,
                job,
                pin: Some(to.to_string()),
            },
        );
    }

    /// Runs until the clock passes `until` or nothing is left.
    pub fn run_until(&mut self, until: i64) {
        while let Some(Reverse((t, k))) = self.heap.peek().copied() {
            if t > until {
                break;
            }
            self.heap.pop();
            let Some(ev) = self.pending.remove(&k) else {
                continue;
            };
            self.now = self.now.max(t);
            self.handle(ev);
        }
        self.now = self.now.max(until);
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        if self.cut.contains(&(from, to)) {
            // Requests across a cut time out at the caller.
            let reply = match &msg {
                Msg::Forward(req) => Some(Msg::ForwardResult {
                    id: req.global_job_id.clone(),
                    outcome: ForwardOutcome::Unreachable("link cut".into()),
                }),
                Msg::AskStart { id } => Some(Msg::StartResult {
                    id: id.clone(),
                    granted: None,
                    reason: "link cut".into(),
                }),
                _ => None,
            };
            if let Some(r) = reply {
                self.at(
                    self.now + self.timeout_ns,
                    Ev::Deliver {
                        from: to,
                        to: from,
                        msg: r,
                    },
                );
            }
            return;
        }
        self.at(self.now + self.latency_ns, Ev::Deliver { from, to, msg });
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        let site = match ev {
            Ev::Submit { site, job, pin } => {
                if let Err(e) = self.sites[site].state.submit(job, pin, now) {
                    tracing::warn!(error = %e, "sim submit refused");
                }
                site
            }
            Ev::Step { site } => {
                self.sites[site].scheduled = None;
                site
            }
            Ev::Beat => {
                let n = self.sites.len();
                for i in 0..n {
                    for p in self.sites[i].peers.clone() {
                        if !self.cut.contains(&(p, i)) {
                            let name = self.sites[p].state.site().to_string();
                            self.sites[i].state.heard(&name, now);
                        }
                    }
                }
                if let Some(hb) = self.heartbeat_ns {
                    self.at(now + hb, Ev::Beat);
                }
                for i in 0..n {
                    self.step(i);
                }
                return;
            }
            Ev::Deliver { from, to, msg } => {
                self.deliver(from, to, msg);
                to
            }
        };
        self.step(site);
    }

    fn deliver(&mut self, from: usize, to: usize, msg: Msg) {
        let now = self.now;
        let from_name = self.sites[from].state.site().to_string();
        match msg {
            Msg::Forward(req) => {
                let snap = self.sites[to].snap.clone();
                let outcome = match self.sites[to].state.accept_forward(&from_name, &req, &snap, now) {
                    Ok(r) => ForwardOutcome::Accepted(r),
                    Err(Reject::Busy(m)) => ForwardOutcome::Busy {
                        reason: m,
                        retry_after_ms: 0,
                    },
                    Err(
                        Reject::NotPeer(m)
                        | Reject::Loop(m)
                        | Reject::Invalid(m)
                        | Reject::Infeasible(m)
                        | Reject::Exists(m),
                    ) => ForwardOutcome::Refused(m),
                };
                self.send(
                    to,
                    from,
                    Msg::ForwardResult {
                        id: req.global_job_id,
                        outcome,
                    },
                );
            }
            Msg::ForwardResult { id, outcome } => {
                self.sites[to].state.forward_result(&id, &from_name, outcome, now);
            }
            Msg::AskStart { id } => {
                let (granted, reason) = match self.sites[to].state.confirm_start(&from_name, &id, now) {
                    Grant::Yes => (Some(true), String::new()),
                    Grant::No(r) => (Some(false), r),
                    Grant::AskUpstream { .. } => (Some(false), "multi-hop grants are not simulated".into()),
                };
                self.send(to, from, Msg::StartResult { id, granted, reason });
            }
            Msg::StartResult { id, granted, reason } => {
                self.sites[to].state.start_result(&id, granted, &reason, now);
            }
            Msg::Cancel { id, reason } => {
                let _ = self.sites[to].state.cancel_from(&from_name, &id, &reason, now);
            }
            Msg::Summary(s) => {
                let _ = self.sites[to].state.peer_summary(&from_name, s, now);
            }
            Msg::Event(e) => self.sites[to].state.remote_event(&from_name, &e, now),
        }
    }

    fn step(&mut self, i: usize) {
        let now = self.now;
        if self.heartbeat_ns.is_none() {
            for p in self.sites[i].peers.clone() {
                if !self.cut.contains(&(p, i)) {
                    let name = self.sites[p].state.site().to_string();
                    self.sites[i].state.heard(&name, now);
                }
            }
        }
        let snap = self.sites[i].snap.clone();
        self.sites[i].state.step(now, &snap);
        self.drain(i);
        // Job events for the sites that forwarded jobs here (WatchJobs).
        for p in self.sites[i].peers.clone() {
            let name = self.sites[p].state.site().to_string();
            let from_seq = self.sites[i].cursor.get(&p).copied().unwrap_or(1);
            let evs = self.sites[i].state.events_for(&name, from_seq);
            if let Some(last) = evs.last() {
                self.sites[i].cursor.insert(p, last.seq + 1);
            }
            for e in evs {
                self.send(i, p, Msg::Event(e));
            }
        }
        let next = self.sites[i].state.next_deadline(now);
        if let Some(t) = next {
            let t = t.max(now + 1);
            if self.sites[i].scheduled.is_none_or(|s| t < s) {
                self.sites[i].scheduled = Some(t);
                self.at(t, Ev::Step { site: i });
            }
        }
    }

    fn drain(&mut self, i: usize) {
        loop {
            let effects = self.sites[i].state.take_effects();
            if effects.is_empty() {
                return;
            }
            let now = self.now;
            for e in effects {
                match e {
                    Effect::Persist => self.sites[i].state.persisted(),
                    Effect::Publish(ev) => self.log.push(ev),
                    Effect::SetFree { host, free, .. } => {
                        let s = &mut self.sites[i];
                        if let Some(h) = s.hosts.iter_mut().find(|h| h.name == host) {
                            h.free_cpus = free;
                            h.updated_ns = now;
                        }
                        s.snap = Snapshot {
                            now_ns: now,
                            resources: s.hosts.iter().cloned().map(Arc::new).collect(),
                        };
                        s.state.set_applied(&host, true, now);
                    }
                    Effect::Forward { to, req } => {
                        let t = self.index[&to];
                        self.send(i, t, Msg::Forward(req));
                    }
                    Effect::AskStart { id, to, .. } => {
                        let t = self.index[&to];
                        self.send(i, t, Msg::AskStart { id });
                    }
                    Effect::CancelRemote { id, to, reason } => {
                        let t = self.index[&to];
                        self.send(i, t, Msg::Cancel { id, reason });
                    }
                    Effect::Summary => {
                        for p in self.sites[i].peers.clone() {
                            let name = self.sites[p].state.site().to_string();
                            if let Some(s) = self.sites[i].state.summary_for(&name, now) {
                                self.summaries_sent += 1;
                                if self.summary_bytes.len() < 10_000 {
                                    self.summary_bytes.push(s.encoded_len());
                                }
                                self.send(i, p, Msg::Summary(s));
                            }
                        }
                    }
                    Effect::Status(_) => {}
                }
            }
        }
    }

    /// Jobs and their published events, by global id.
    pub fn by_job(&self) -> BTreeMap<String, Vec<&pb::JobEvent>> {
        let mut m: BTreeMap<String, Vec<&pb::JobEvent>> = BTreeMap::new();
        for e in &self.log {
            m.entry(e.global_job_id.clone()).or_default().push(e);
        }
        m
    }

    /// Events where the job itself did `state` (published by the site it happened at).
    pub fn count(&self, id: &str, state: &str) -> usize {
        self.log
            .iter()
            .filter(|e| e.global_job_id == id && e.state == state && e.site == e.current_site)
            .count()
    }
}

/// The `gma bench federation` scenario: sites of `hosts × cpus_per_host` CPUs, Poisson
/// arrivals at each site giving its offered load, jobs whose CPUs are drawn uniformly from
/// `shapes` (default 1, 2, 4, 4) running an exponential time (mean `mean_exec_s`), the same job
/// stream with and without federation.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub loads: Vec<f64>,
    pub hosts: u32,
    pub cpus_per_host: u32,
    pub jobs_per_site: usize,
    /// Job sizes in CPUs, drawn uniformly.
    pub shapes: Vec<u32>,
    pub mean_exec_s: f64,
    pub seed: u64,
    pub policy: RoutePolicy,
    pub latency_ms: f64,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            loads: vec![0.9, 0.3, 0.5],
            hosts: 16,
            cpus_per_host: 4,
            jobs_per_site: 3000,
            shapes: vec![1, 2, 4, 4],
            mean_exec_s: 3600.0,
            seed: 1,
            policy: RoutePolicy::default(),
            latency_ms: 20.0,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub jobs: usize,
    pub finished: usize,
    /// Mean completion (finish − submit), seconds.
    pub mean_completion_s: f64,
    pub mean_wait_s: f64,
    pub forwarded: usize,
    pub started_twice: usize,
    pub summaries: u64,
    pub mean_summary_bytes: f64,
}

/// The manager's settings in the simulated world (`policy` routes).
pub fn sim_params(site: &str, policy: &RoutePolicy) -> Params {
    let mut p = Params::new(site);
    p.rank.max_age_ms = u64::MAX / 4;
    p.route = policy.clone();
    p.time_scale = 1.0;
    p.heartbeat_ms = 10_000;
    p.origin_lease_ms = 600_000;
    p.valid_for_ms = u32::MAX;
    p.summary_interval_ms = 300_000;
    p.push_debounce_ms = 1_000;
    p.status_interval_ms = u64::MAX / 4_000_000;
    p
}

/// Runs the scenario, with federation (full mesh of peers) or local-only.
pub fn run_scenario(sc: &Scenario, federate: bool) -> Outcome {
    let names: Vec<String> = (0..sc.loads.len()).map(|i| format!("s{i}")).collect();
    let specs = names
        .iter()
        .map(|n| SiteSpec {
            params: sim_params(n, &sc.policy),
            hosts: sc.hosts,
            cpus_per_host: sc.cpus_per_host,
        })
        .collect();
    let mut links = Vec::new();
    if federate {
        for a in 0..names.len() {
            for b in a + 1..names.len() {
                links.push((names[a].as_str(), names[b].as_str()));
            }
        }
    }
    let mut w = World::new(specs, &links);
    w.latency_ns = (sc.latency_ms * 1e6) as i64;
    let cpus = f64::from(sc.hosts * sc.cpus_per_host);
    let shapes: Vec<u32> = if sc.shapes.is_empty() {
        vec![1]
    } else {
        sc.shapes.clone()
    };
    let mean_cpus = shapes.iter().map(|c| f64::from(*c)).sum::<f64>() / shapes.len() as f64;
    let mut end = T0;
    for (i, load) in sc.loads.iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(sc.seed.wrapping_mul(1_000).wrapping_add(i as u64));
        let rate = load * cpus / (mean_cpus * sc.mean_exec_s); // jobs per second
        let mut t = T0 as f64;
        for k in 0..sc.jobs_per_site {
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            t += -u.ln() / rate * 1e9;
            let c = shapes[rng.random_range(0..shapes.len())].min(sc.cpus_per_host);
            let v: f64 = rng.random_range(f64::EPSILON..1.0);
            let job = Job {
                name: format!("{}-{k}", names[i]),
                cpus: c,
                reference_time_s: (-v.ln() * sc.mean_exec_s).max(1.0),
                ..Job::default()
            };
            w.submit_at(t as i64, &names[i], job);
            end = end.max(t as i64);
        }
    }
    // Run until every job is done (bounded: ten times the arrival span).
    let horizon = end + 10 * (end - T0);
    let mut t = T0;
    loop {
        t += 3_600_000_000_000;
        w.run_until(t);
        let done = names
            .iter()
            .all(|n| w.site(n).counts().0 == 0 && w.site(n).counts().1 == 0);
        if (t > end && done) || t > horizon {
            break;
        }
    }
    let mut out = Outcome {
        summaries: w.summaries_sent,
        mean_summary_bytes: if w.summary_bytes.is_empty() {
            0.0
        } else {
            w.summary_bytes.iter().sum::<usize>() as f64 / w.summary_bytes.len() as f64
        },
        ..Outcome::default()
    };
    let (mut sum, mut wait) = (0.0, 0.0);
    for evs in w.by_job().values() {
        out.jobs += 1;
        let submitted = evs
            .iter()
            .find(|e| e.state == "submitted")
            .map(|e| e.timestamp_ns);
        let started: Vec<i64> = evs
            .iter()
            .filter(|e| e.state == "started" && e.site == e.current_site)
            .map(|e| e.timestamp_ns)
            .collect();
        let finished = evs
            .iter()
            .find(|e| e.state == "finished" && e.site == e.current_site)
            .map(|e| e.timestamp_ns);
        if started.len() > 1 {
            out.started_twice += 1;
        }
        out.forwarded += evs.iter().filter(|e| e.state == "forwarded").count();
        if let (Some(s), Some(f), Some(st)) = (submitted, finished, started.first()) {
            out.finished += 1;
            sum += (f - s) as f64 / 1e9;
            wait += (st - s) as f64 / 1e9;
        }
    }
    if out.finished > 0 {
        out.mean_completion_s = sum / out.finished as f64;
        out.mean_wait_s = wait / out.finished as f64;
    }
    out
}

/// The encoded size of a summary of 1,000 hosts in 8 classes (2 archs × 4 OSs).
pub fn summary_bytes_1000_hosts() -> usize {
    let archs = ["x86_64", "aarch64"];
    let oss = ["Linux", "Linux-rt", "FreeBSD", "AIX"];
    let hosts: Vec<Resource> = (0..1000)
        .map(|i| {
            let mut r = Resource::unknown(&format!("h{i:04}"));
            r.total_cpus = 16.0;
            r.free_cpus = (i % 17) as f64;
            r.memory_mb = 65536.0;
            r.load1 = 3.0;
            r.arch = archs[i % 2].into();
            r.os = oss[(i / 2) % 4].into();
            r.benchmarks.insert("specint".into(), 1000.0 + i as f64);
            r.benchmarks.insert("specfp".into(), 900.0 + i as f64);
            r.updated_ns = 1;
            r
        })
        .collect();
    Summary::build(
        "site",
        &Snapshot::new(1, hosts),
        5000,
        SiteLoad::default(),
        15_000,
    )
    .stamp("site", 1, 1)
    .encoded_len()
}

/// route() with `peers` peers of 16 classes each, from a saturated origin: (p50, p99, max) µs.
pub fn route_latency(peers: usize, trials: usize) -> (f64, f64, f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let now = 1_000_000_000_000i64;
    let hosts: Vec<Resource> = (0..16)
        .map(|i| {
            let mut r = Resource::unknown(&format!("o{i}"));
            r.total_cpus = 4.0;
            r.free_cpus = 0.0;
            r.memory_mb = 65536.0;
            r.arch = "x86_64".into();
            r.queue_waiting = 0.0;
            r.updated_ns = now;
            r
        })
        .collect();
    let releases: Vec<Release> = hosts
        .iter()
        .map(|h| Release {
            host: h.name.clone(),
            cpus: 4,
            remaining_s: rng.random_range(60.0..7200.0),
        })
        .collect();
    let snap = Snapshot::new(now, hosts);
    let sums: Vec<Summary> = (0..peers)
        .map(|p| {
            let hs: Vec<Resource> = (0..64)
                .map(|i| {
                    let mut r = Resource::unknown(&format!("p{p}-{i}"));
                    r.total_cpus = 16.0;
                    r.free_cpus = f64::from(rng.random_range(0..=16u32));
                    r.memory_mb = 65536.0;
                    r.arch = format!("arch{}", i % 16);
                    r.os = "Linux".into();
                    r.benchmarks
                        .insert("specint".into(), rng.random_range(500.0..2000.0));
                    r.updated_ns = now;
                    r
                })
                .collect();
            let load = SiteLoad {
                probe_start_s: [0.0, 0.0, 60.0, 600.0],
                foreign_quota_free: 1024,
                accepts_foreign: true,
                ..SiteLoad::default()
            };
            let s = format!("p{p}");
            Summary::build(&s, &Snapshot::new(now, hs), 5000, load, 15_000).stamp(&s, 1, 1)
        })
        .collect();
    let names: Vec<String> = (0..peers).map(|p| format!("p{p}")).collect();
    let views: Vec<PeerView> = names
        .iter()
        .zip(&sums)
        .map(|(n, s)| PeerView {
            site: n,
            advertised: s,
            summary: s,
            received_ns: now,
            live: true,
            link_hops: 1,
            in_flight_cpus: 0,
        })
        .collect();
    let cfg = RankConfig::default();
    let local = LocalView {
        snapshot: &snap,
        rank: &cfg,
        releases: &releases,
        ahead: &[],
    };
    let policy = RoutePolicy::default();
    let visited = ["o".to_string()];
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    for k in 0..trials {
        let mut job = Job {
            name: "j".into(),
            cpus: rng.random_range(1..=16),
            reference_time_s: 3600.0,
            ..Job::default()
        };
        job.reference.insert("specint".into(), 1000.0);
        if k % 2 == 0 {
            job.arch = format!("arch{}", k % 16);
        }
        let id = format!("o/{k}");
        let rj = RouteJob {
            id: &id,
            job: &job,
            visited: &visited,
            hops_left: 1,
            excluded: &[],
        };
        let t0 = Instant::now();
        let d = route(&local, &views, &rj, &policy, now);
        let ns = t0.elapsed().as_nanos() as u64;
        std::hint::black_box(d);
        let _ = h.record(ns.max(1));
    }
    (
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        h.max() as f64 / 1e3,
    )
}

pub mod hier;

#[cfg(test)]
mod tests;
