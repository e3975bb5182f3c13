//! The site's job manager: a state machine with no I/O and no clock of its own.
//!
//! Every input — a local submission, a forwarded job, a peer's summary or heartbeat, the
//! answer to a call this site made, the passing of time ([`SiteState::step`]) — is a method
//! call with the current time; every output is an [`Effect`] the caller executes (publish a
//! `job.state` event, persist, set a simulated host's free CPUs, call a peer). The running
//! endpoint (`service`) and the discrete-event benchmark (`bench`) drive the same code.
//!
//! # Execution model
//!
//! A job placed locally occupies `cpus` on one host for `(stage_in + exec + stage_out) ×
//! time_scale` seconds of real time, `exec` being the broker's benchmark-scaled prediction for
//! that host. The occupancy is made visible in the fabric: the endpoint lowers (and later
//! raises) the simulated host's `free_cpus` through the producer's `Simulator` service, so
//! `host.load`, the summaries and the peers all see it. Until the host's stream shows a sample
//! taken after the change, the manager's own accounting is authoritative
//! (`free = min(published, baseline − occupied)`). On a host without a simulator the job is
//! virtual and only subtracted from what the host publishes.
//!
//! # Exactly once
//!
//! - A job is forwarded to a site at most once (`visited`), and hops are bounded.
//! - A receiver dedupes `ForwardJob` by the global id: a retry gets the first answer.
//! - **Start grant.** A receiver starts a foreign job only after the site it came from says
//!   yes (`ConfirmStart`); that site says yes at most once, and never for a job it has
//!   re-placed or cancelled. A granted job is never re-placed. So a job never starts twice,
//!   whatever the network does (the notes' lease alone cannot tell an origin whether a job
//!   started during a partition; the grant can).
//! - **Lease.** A foreign job not started holds under the origin's lease, renewed by anything
//!   heard from that site; after `origin_lease_ms` of silence the receiver cancels it. The
//!   origin re-places a forwarded, ungranted job only after `origin_lease_ms + 2 × heartbeat`
//!   of silence from the receiver, or at once when the receiver reports it cancelled. So a job
//!   is never lost: it is queued, running, or known at one site at every instant.
//! - A granted job whose runner vanishes shows its last state until the session comes back
//!   and `ListForwarded` reconciles it; one the runner does not know any more is `failed`.

use gma_core::Refuse;
use std::collections::{BTreeMap, HashMap, VecDeque};

use gma_broker::{rank_candidates, Job, Policy, RankConfig, Resource, Snapshot};
use gma_proto::v1 as pb;
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::route::{
    debit, local_estimate, route, Ahead, LocalView, PeerView, Release, Route, RouteJob, RoutePolicy,
};
use crate::summary::{merge, merge_all, SiteLoad, Summary, PROBE_CPUS};

/// Events kept per peer for `WatchJobs` resumption.
pub const LOG_EVENTS: usize = 10_000;

/// The role of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Peer,
    Parent,
    Child,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "peer" => Role::Peer,
            "parent" => Role::Parent,
            "child" => Role::Child,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Peer => "peer",
            Role::Parent => "parent",
            Role::Child => "child",
        }
    }

    /// Hops a link of this role allows by default: a job sent to a peer runs there; one sent
    /// up or down a hierarchy may go one step further (child → parent → sibling).
    pub fn default_hops(self) -> u32 {
        match self {
            Role::Peer => 1,
            Role::Parent | Role::Child => 2,
        }
    }
}

/// A link to another site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub site: String,
    pub endpoint: String,
    pub role: Role,
    /// Hops a job sent over this link may make from here (0 = the role's default).
    #[serde(default)]
    pub hops: u32,
}

impl Link {
    pub fn hops(&self) -> u32 {
        if self.hops == 0 {
            self.role.default_hops()
        } else {
            self.hops
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting here for a host (or a peer).
    Queued,
    /// `ForwardJob` sent to `at`, no answer yet.
    Forwarding,
    /// Accepted by `at` (started there once `granted`).
    Forwarded,
    /// A foreign job with a host reserved here, waiting for its start grant.
    Starting,
    Running,
    Finished,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn terminal(self) -> bool {
        matches!(self, JobState::Finished | JobState::Failed | JobState::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Forwarding => "forwarding",
            JobState::Forwarded => "forwarded",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Finished => "finished",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

mod job_hex {
    use super::*;

    pub fn serialize<S: serde::Serializer>(job: &Job, s: S) -> Result<S::Ok, S::Error> {
        let bytes = job.to_proto().encode_to_vec();
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push_str(&format!("{b:02x}"));
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Job, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = (0..text.len() / 2)
            .map(|i| {
                text.get(2 * i..2 * i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| serde::de::Error::custom("job: not hex"))?;
        let spec = pb::JobSpec::decode(bytes.as_slice()).map_err(serde::de::Error::custom)?;
        Job::from_proto(&spec, "job.").map_err(serde::de::Error::custom)
    }
}

/// One job as this site knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRec {
    pub id: String,
    pub origin: String,
    /// The site that forwarded it here (`None` at the origin).
    pub from: Option<String>,
    #[serde(with = "job_hex")]
    pub job: Job,
    pub state: JobState,
    /// Sites the job was at or was sent to, this one included.
    pub visited: Vec<String>,
    pub hops_left: u32,
    /// Where it is: this site, or the peer it was forwarded to.
    pub at: String,
    pub host: String,
    pub submitted_ns: i64,
    pub started_ns: i64,
    pub finished_ns: i64,
    /// Planned end of a local run.
    pub end_ns: i64,
    /// Real duration of the local run (set when a host is chosen).
    #[serde(default)]
    pub run_ns: i64,
    /// When it was forwarded, or accepted here (foreign).
    pub since_ns: i64,
    pub granted: bool,
    /// The receiver's acceptance of the current forward was processed.
    #[serde(default)]
    pub accepted: bool,
    pub cancel_requested: bool,
    /// An operator's choice of peer (`gma job submit --site`).
    pub pin: Option<String>,
    pub reason: String,
    /// Peers that refused it, until when.
    #[serde(default)]
    pub excluded: BTreeMap<String, i64>,
    #[serde(skip)]
    pub next_try_ns: i64,
    #[serde(skip)]
    pub in_flight: bool,
    #[serde(skip)]
    pub queued_reported: bool,
}

impl JobRec {
    pub fn hops(&self) -> u32 {
        self.visited.len().saturating_sub(1) as u32
    }

    pub fn info(&self) -> pb::JobInfo {
        pb::JobInfo {
            global_job_id: self.id.clone(),
            name: self.job.name.clone(),
            origin_site: self.origin.clone(),
            state: self.state.as_str().into(),
            current_site: self.at.clone(),
            host: self.host.clone(),
            hops: self.hops(),
            visited_sites: self.visited.clone(),
            submitted_ns: self.submitted_ns,
            started_ns: self.started_ns,
            finished_ns: self.finished_ns,
            reason: self.reason.clone(),
            granted: self.granted,
            cpus: self.job.cpus,
            from_site: self.from.clone().unwrap_or_default(),
        }
    }

    fn foreign(&self) -> bool {
        self.from.is_some()
    }
}

/// The manager's settings.
#[derive(Debug, Clone)]
pub struct Params {
    pub site: String,
    pub rank: RankConfig,
    pub route: RoutePolicy,
    /// Real seconds per job second.
    pub time_scale: f64,
    pub heartbeat_ms: u64,
    /// Missed heartbeats after which a session expires.
    pub session_misses: u32,
    pub origin_lease_ms: u64,
    pub valid_for_ms: u32,
    pub summary_interval_ms: u64,
    pub push_debounce_ms: u64,
    pub max_hops: u32,
    /// CPUs offered to other sites' jobs (`None`: all).
    pub foreign_cpus: Option<u32>,
    pub accepts_foreign: bool,
    pub status_interval_ms: u64,
    /// Finished, failed and cancelled jobs remembered (dedupe, status).
    pub keep_terminal: usize,
    pub max_queue: usize,
}

impl Params {
    pub fn new(site: &str) -> Params {
        Params {
            site: site.to_string(),
            rank: RankConfig::default(),
            route: RoutePolicy::default(),
            time_scale: 1.0,
            heartbeat_ms: 2_000,
            session_misses: 3,
            origin_lease_ms: 30_000,
            valid_for_ms: 15_000,
            summary_interval_ms: 5_000,
            push_debounce_ms: 250,
            max_hops: 2,
            foreign_cpus: None,
            accepts_foreign: true,
            status_interval_ms: 2_000,
            keep_terminal: 10_000,
            max_queue: 100_000,
        }
    }

    fn session_timeout_ns(&self) -> i64 {
        (self.heartbeat_ms * u64::from(self.session_misses.max(1))) as i64 * 1_000_000
    }

    fn replace_after_ns(&self) -> i64 {
        (self.origin_lease_ms + 2 * self.heartbeat_ms) as i64 * 1_000_000
    }
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Write [`SiteState::saved`] to stable storage before executing the effects after it.
    Persist,
    /// Publish a `job.state` event.
    Publish(pb::JobEvent),
    /// Set a simulated host's free CPUs (then call [`SiteState::set_applied`]).
    SetFree {
        host: String,
        producer: String,
        free: f64,
    },
    /// Call `ForwardJob` at `to` (then [`SiteState::forward_result`]).
    Forward {
        to: String,
        req: Box<pb::ForwardRequest>,
    },
    /// Ask `to` for the start grant (then [`SiteState::start_result`]).
    AskStart { id: String, to: String, host: String },
    /// Ask `to` to cancel a job it holds for us.
    CancelRemote { id: String, to: String, reason: String },
    /// A new summary: send [`SiteState::summary_for`] each peer, publish `site.summary`.
    Summary,
    /// `federation.status`, one entry per peer.
    Status(Vec<pb::PeerStatus>),
}

/// How a forward went, from the caller's side.
#[derive(Debug, Clone, PartialEq)]
pub enum ForwardOutcome {
    Accepted(pb::ForwardReply),
    /// Refused for good (loop, no such resources, not a peer): never again there.
    Refused(String),
    /// Refused for now (quota, rate): not there before `retry_after_ms`.
    Busy {
        reason: String,
        retry_after_ms: u64,
    },
    /// No answer: the receiver may or may not have it.
    Unreachable(String),
}

pub use crate::error::Reject;

/// The answer to `ConfirmStart`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Yes,
    No(String),
    /// This site holds the job for another one: ask it first, then [`SiteState::upstream_grant`].
    AskUpstream {
        to: String,
    },
}

/// What the session layer reports about a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    Up,
    Down(String),
    Refused(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Debit {
    job: String,
    cpus: u32,
    arch: String,
    /// The receiver's summary (epoch, seq) at acceptance; `None` while unanswered.
    until: Option<(u64, u64)>,
}

/// A linked site as this one sees it.
#[derive(Debug, Clone)]
pub struct Peer {
    pub link: Link,
    pub summary: Option<Summary>,
    debited: Option<Summary>,
    pub received_ns: i64,
    debits: Vec<Debit>,
    pub last_heard_ns: i64,
    pub live: bool,
    pub refused: bool,
    /// When it last refused our session (it answered: alive, though not linked to us).
    refused_ns: i64,
    pub last_error: String,
    pub forwarded_out: u64,
    pub forwarded_in: u64,
}

impl Peer {
    fn new(link: Link) -> Peer {
        Peer {
            link,
            summary: None,
            debited: None,
            received_ns: 0,
            debits: Vec::new(),
            last_heard_ns: 0,
            live: false,
            refused: false,
            refused_ns: 0,
            last_error: String::new(),
            forwarded_out: 0,
            forwarded_in: 0,
        }
    }

    pub fn in_flight_cpus(&self) -> u32 {
        self.debits.iter().map(|d| d.cpus).sum()
    }

    fn rebuild_debited(&mut self) {
        self.debited = self.summary.as_ref().map(|s| {
            let mut d = s.clone();
            for x in &self.debits {
                debit(&mut d, x.cpus, &x.arch);
            }
            d
        });
    }

    fn session_name(&self) -> &'static str {
        if self.refused {
            "refused"
        } else if self.live {
            "up"
        } else if self.last_heard_ns > 0 {
            "expired"
        } else {
            "connecting"
        }
    }
}

#[derive(Debug, Clone, Default)]
struct HostUse {
    producer: String,
    /// Free CPUs of the host without our jobs.
    baseline: Option<f64>,
    occupied: u32,
    /// Changes sent to the simulator and not yet applied.
    pending_sets: u32,
    /// When the last change was applied (a sample after it reflects it).
    applied_ns: i64,
    /// `Some(false)`: the host has no simulator (jobs are virtual).
    simulated: Option<bool>,
}

/// A superior this site may re-attach to (`crate::reattach`): configured (`[[superior]]`) or
/// told by a parent (its own superiors).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Superior {
    pub site: String,
    /// Its federation endpoint.
    pub endpoint: String,
    /// Its directory: where this site registers as its child.
    pub directory: String,
}

/// Most superiors a site tells its inferiors (and keeps from one parent).
pub const MAX_TOLD: usize = 8;

/// What [`SiteState::saved`] writes and [`SiteState::restore`] reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    pub site: String,
    pub jobs: Vec<JobRec>,
    pub links: Vec<Link>,
    /// Sites whose links were removed at runtime (`gma federation remove`, a re-attachment):
    /// a configured `[[peer]]` of these is not linked again on restart.
    #[serde(default)]
    pub removed: Vec<String>,
    /// The directory each linked site announced (its Welcome): what this site tells its
    /// inferiors about its parents.
    #[serde(default)]
    pub directories: BTreeMap<String, String>,
    /// What each parent told of its own superiors (nearest first): this site's default chain.
    #[serde(default)]
    pub told: BTreeMap<String, Vec<Superior>>,
}

/// The job manager of one site.
pub struct SiteState {
    p: Params,
    epoch: u64,
    rng: ChaCha8Rng,
    jobs: HashMap<String, JobRec>,
    queue: Vec<String>,
    hosts: HashMap<String, HostUse>,
    peers: BTreeMap<String, Peer>,
    /// See [`Saved::removed`].
    removed: std::collections::BTreeSet<String>,
    /// See [`Saved::directories`].
    directories: BTreeMap<String, String>,
    /// See [`Saved::told`].
    told: BTreeMap<String, Vec<Superior>>,
    logs: HashMap<String, VecDeque<pb::JobEvent>>,
    event_seq: u64,
    summary_seq: u64,
    own: Option<Summary>,
    pushed: Option<Summary>,
    last_push_ns: i64,
    push_due: Option<i64>,
    /// A summary from a parent or child changed what this site relays: push (debounced).
    relay_due: bool,
    last_status_ns: i64,
    last_view: Option<std::sync::Arc<[std::sync::Arc<Resource>]>>,
    terminal: VecDeque<String>,
    effects: Vec<Effect>,
    dirty: bool,
    persist: bool,
}

fn uuid(rng: &mut ChaCha8Rng) -> String {
    let (a, b): (u64, u64) = (rng.random(), rng.random());
    format!("{a:016x}{b:016x}")
}

impl SiteState {
    /// A new manager; `epoch` names this run (and seeds job ids).
    pub fn new(p: Params, epoch: u64) -> SiteState {
        SiteState {
            rng: ChaCha8Rng::seed_from_u64(epoch ^ 0x9e37_79b9_7f4a_7c15),
            p,
            epoch,
            jobs: HashMap::new(),
            queue: Vec::new(),
            hosts: HashMap::new(),
            peers: BTreeMap::new(),
            removed: std::collections::BTreeSet::new(),
            directories: BTreeMap::new(),
            told: BTreeMap::new(),
            logs: HashMap::new(),
            event_seq: 0,
            summary_seq: 0,
            own: None,
            pushed: None,
            last_push_ns: i64::MIN / 2,
            push_due: None,
            relay_due: false,
            last_status_ns: i64::MIN / 2,
            last_view: None,
            terminal: VecDeque::new(),
            effects: Vec::new(),
            dirty: true,
            persist: false,
        }
    }

    /// A manager resuming saved state: queued jobs queue again, forwarded ones keep their
    /// peer and lease (counted from `now`), running simulated jobs run to their planned end, a
    /// foreign job waiting for its grant asks again.
    pub fn restore(p: Params, epoch: u64, saved: Saved, now: i64) -> SiteState {
        let mut s = SiteState::new(p, epoch);
        s.set_links(saved.links, now);
        s.removed = saved.removed.into_iter().collect();
        s.directories = saved.directories;
        s.told = saved.told;
        for p in s.peers.values_mut() {
            p.last_heard_ns = now;
        }
        let mut jobs = saved.jobs;
        jobs.sort_by_key(|j| j.submitted_ns);
        for mut j in jobs {
            match j.state {
                JobState::Running => {
                    let h = s.hosts.entry(j.host.clone()).or_default();
                    h.occupied += j.job.cpus;
                }
                JobState::Starting => {
                    j.state = JobState::Queued;
                    j.host.clear();
                    j.at = s.p.site.clone();
                }
                _ => {}
            }
            if j.state == JobState::Queued {
                s.queue.push(j.id.clone());
            }
            if j.foreign() && !j.state.terminal() {
                j.since_ns = now;
            }
            if j.state.terminal() {
                s.terminal.push_back(j.id.clone());
            }
            s.jobs.insert(j.id.clone(), j);
        }
        s
    }

    pub fn site(&self) -> &str {
        &self.p.site
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn params(&self) -> &Params {
        &self.p
    }

    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Whether something changed that a [`SiteState::step`] should look at.
    pub fn dirty(&self) -> bool {
        self.dirty
    }

    pub fn saved(&self) -> Saved {
        let mut jobs: Vec<JobRec> = self.jobs.values().cloned().collect();
        jobs.sort_by(|a, b| a.submitted_ns.cmp(&b.submitted_ns).then(a.id.cmp(&b.id)));
        Saved {
            site: self.p.site.clone(),
            jobs,
            links: self.peers.values().map(|p| p.link.clone()).collect(),
            removed: self.removed.iter().cloned().collect(),
            directories: self.directories.clone(),
            told: self.told.clone(),
        }
    }

    fn mark_persist(&mut self) {
        if !self.persist {
            self.persist = true;
            self.effects.push(Effect::Persist);
        }
    }

    /// Call after the Persist effect was executed.
    pub fn persisted(&mut self) {
        self.persist = false;
    }

    // ---------------------------------------------------------------------------------------
    // Links and sessions
    // ---------------------------------------------------------------------------------------

    /// The links now configured; peers no longer listed are forgotten (their jobs stay).
    pub fn set_links(&mut self, links: Vec<Link>, now: i64) {
        let keep: std::collections::BTreeSet<String> = links.iter().map(|l| l.site.clone()).collect();
        let removed = &mut self.removed;
        let mut gone = Vec::new();
        self.peers.retain(|k, _| {
            let stays = keep.contains(k);
            if !stays {
                removed.insert(k.clone());
                gone.push(k.clone());
            }
            stays
        });
        for site in &gone {
            self.link_gone(site, now);
        }
        for l in links {
            self.removed.remove(&l.site);
            if l.site == self.p.site {
                continue;
            }
            match self.peers.get_mut(&l.site) {
                Some(p) => p.link = l,
                None => {
                    self.peers.insert(l.site.clone(), Peer::new(l));
                }
            }
        }
        self.dirty = true;
        self.mark_persist();
    }

    /// The link to `site` was removed (by an operator, or by a re-attachment that gave up on a
    /// dead superior): this site's jobs there are settled now rather than left waiting on a
    /// manager that will never answer. One not yet started there goes back to the queue (its
    /// start needs this site's grant, so it cannot also run there); one started there is
    /// reported failed — its outcome is unknown, and running it again could run it twice.
    fn link_gone(&mut self, site: &str, now: i64) {
        let ids: Vec<String> = self
            .jobs
            .values()
            .filter(|j| j.at == site && j.origin == self.p.site && !j.state.terminal())
            .map(|j| j.id.clone())
            .collect();
        for id in ids {
            let Some(j) = self.jobs.get_mut(&id) else { continue };
            if j.granted {
                j.state = JobState::Failed;
                j.finished_ns = now;
                j.reason = format!(
                    "the link to {site} was removed while the job ran there (re-attachment or \
                     gma federation remove): its outcome is unknown"
                );
                let why = j.reason.clone();
                self.finish_terminal(&id);
                self.event(&id, "failed", &why, now);
            } else {
                self.requeue(&id, &format!("the link to {site} was removed"), now);
            }
        }
    }

    /// Sites whose links were removed at runtime (see [`Saved::removed`]).
    pub fn removed(&self) -> impl Iterator<Item = &String> {
        self.removed.iter()
    }

    /// The superiors (parent links): site and whether it was heard at `now` — its session is
    /// live, or it refused the session within the session timeout (a parent that answers "not
    /// linked" is alive, not silent: it may not have added this site yet, so re-attachment
    /// must not take its place).
    pub fn parents(&self, now: i64) -> Vec<(String, bool)> {
        let timeout = self.p.session_timeout_ns();
        self.peers
            .values()
            .filter(|p| p.link.role == Role::Parent)
            .map(|p| {
                let answered = p.refused && now.saturating_sub(p.refused_ns) <= timeout;
                (p.link.site.clone(), p.live || answered)
            })
            .collect()
    }

    /// `site` announced its directory (its Welcome).
    pub fn set_directory(&mut self, site: &str, directory: &str) {
        if directory.is_empty() || self.directories.get(site).is_some_and(|d| d == directory) {
            return;
        }
        self.directories.insert(site.to_string(), directory.to_string());
        self.mark_persist();
    }

    /// Parent `parent` told its superiors (validated by the caller). Ignored from a site that
    /// is not a parent of this one; this site itself is left out (a cycle), at most
    /// [`MAX_TOLD`] are kept. Returns whether anything changed.
    pub fn told_by(&mut self, parent: &str, superiors: Vec<Superior>) -> bool {
        if !self
            .peers
            .get(parent)
            .is_some_and(|p| p.link.role == Role::Parent)
        {
            return false;
        }
        let me = self.p.site.clone();
        let mut list: Vec<Superior> = Vec::new();
        for s in superiors {
            if s.site != me && s.site != parent && !list.iter().any(|x| x.site == s.site) {
                list.push(s);
            }
        }
        list.truncate(MAX_TOLD);
        if self.told.get(parent) == Some(&list) {
            return false;
        }
        self.told.insert(parent.to_string(), list);
        self.mark_persist();
        true
    }

    /// This site's chain of superiors: `configured` first, then what its current parents told
    /// (kept after a parent died: that is when it is needed), each site once, never itself.
    pub fn chain(&self, configured: &[Superior]) -> Vec<Superior> {
        let told = self
            .peers
            .values()
            .filter(|p| p.link.role == Role::Parent)
            .filter_map(|p| self.told.get(&p.link.site))
            .flatten();
        let mut out: Vec<Superior> = Vec::new();
        for s in configured.iter().chain(told) {
            if s.site != self.p.site && !out.iter().any(|x| x.site == s.site) {
                out.push(s.clone());
            }
        }
        out
    }

    /// What this site tells its inferiors: its parents whose directory it knows, then its own
    /// chain; at most [`MAX_TOLD`].
    pub fn superiors_to_tell(&self, configured: &[Superior]) -> Vec<Superior> {
        let mut out: Vec<Superior> = self
            .peers
            .values()
            .filter(|p| p.link.role == Role::Parent)
            .filter_map(|p| {
                Some(Superior {
                    site: p.link.site.clone(),
                    endpoint: p.link.endpoint.clone(),
                    directory: self.directories.get(&p.link.site)?.clone(),
                })
            })
            .collect();
        for s in self.chain(configured) {
            if !out.iter().any(|x| x.site == s.site) {
                out.push(s);
            }
        }
        out.truncate(MAX_TOLD);
        out
    }

    pub fn links(&self) -> Vec<Link> {
        self.peers.values().map(|p| p.link.clone()).collect()
    }

    pub fn is_peer(&self, site: &str) -> bool {
        self.peers.contains_key(site)
    }

    pub fn peer(&self, site: &str) -> Option<&Peer> {
        self.peers.get(site)
    }

    /// Anything received from `site` renews its session (and its jobs' lease here).
    pub fn heard(&mut self, site: &str, now: i64) {
        if let Some(p) = self.peers.get_mut(site) {
            p.last_heard_ns = p.last_heard_ns.max(now);
            p.refused = false;
            if !p.live {
                p.live = true;
                self.dirty = true;
            }
        }
    }

    pub fn session_event(&mut self, site: &str, ev: SessionEvent, now: i64) {
        let Some(p) = self.peers.get_mut(site) else { return };
        match ev {
            SessionEvent::Up => {
                p.refused = false;
                p.last_error.clear();
                self.heard(site, now);
            }
            SessionEvent::Down(e) => p.last_error = e,
            SessionEvent::Refused(e) => {
                p.refused = true;
                p.refused_ns = now;
                p.last_error = e;
            }
        }
    }

    /// The newest summary (epoch, seq) held from `site`.
    pub fn last_summary_of(&self, site: &str) -> (u64, u64) {
        self.peers
            .get(site)
            .and_then(|p| p.summary.as_ref())
            .map_or((0, 0), |s| (s.epoch, s.seq))
    }

    /// A summary from `site`. Older or duplicate ones (same epoch, seq not newer) are ignored;
    /// one that contains this site is refused (split horizon: no echo).
    pub fn peer_summary(&mut self, site: &str, s: Summary, now: i64) -> Result<bool, Error> {
        let me = self.p.site.clone();
        let mut self_relay = false;
        let Some(p) = self.peers.get_mut(site) else {
            return Err(Error::invalid_argument(format!("{site} is not a linked site")));
        };
        if s.site != site {
            return Err(Error::invalid_argument(format!(
                "summary of {:?} on {site}'s session",
                s.site
            )));
        }
        if s.contributing.contains(&me) {
            return Err(Error::invalid_argument(format!(
                "summary from {site} contains {me} itself (split horizon)"
            )));
        }
        if let Some(old) = &p.summary {
            if old.epoch == s.epoch && s.seq <= old.seq {
                return Ok(false);
            }
        }
        p.debits.retain(|d| match d.until {
            None => true,
            Some((e, q)) => e == s.epoch && s.seq <= q,
        });
        // A parent's or child's summary is relayed (merged into what this site sends on): when
        // its content changed, push at once (debounced) rather than at the next periodic
        // refresh, so a change travels a hierarchy in network time, not a period per level.
        // An unchanged content is not relayed again (no ping-pong between two relays).
        let relayed = p.link.role != Role::Peer;
        let changed = p
            .summary
            .as_ref()
            .is_none_or(|old| old.contributing != s.contributing || significant_change(old, &s));
        if relayed && changed {
            self_relay = true;
        }
        p.summary = Some(s);
        p.received_ns = now;
        p.rebuild_debited();
        self.dirty = true;
        self.relay_due |= self_relay;
        self.heard(site, now);
        Ok(true)
    }

    // ---------------------------------------------------------------------------------------
    // Jobs: local users
    // ---------------------------------------------------------------------------------------

    fn event(&mut self, id: &str, state: &str, reason: &str, now: i64) {
        let Some(j) = self.jobs.get(id) else { return };
        self.event_seq += 1;
        let ev = pb::JobEvent {
            seq: self.event_seq,
            global_job_id: j.id.clone(),
            origin_site: j.origin.clone(),
            site: self.p.site.clone(),
            current_site: j.at.clone(),
            state: state.into(),
            host: j.host.clone(),
            hops: j.hops(),
            reason: reason.into(),
            timestamp_ns: now,
            name: j.job.name.clone(),
        };
        if let Some(from) = &j.from {
            let log = self.logs.entry(from.clone()).or_default();
            log.push_back(ev.clone());
            while log.len() > LOG_EVENTS {
                log.pop_front();
            }
        }
        self.effects.push(Effect::Publish(ev));
    }

    /// A job from a local user; `pin` forwards it to that peer instead of routing it.
    pub fn submit(&mut self, job: Job, pin: Option<String>, now: i64) -> Result<String, Error> {
        job.validate()
            .map_err(|e| Error::invalid_argument(format!("job.{e}")))?;
        if let Some(site) = &pin {
            if !self.peers.contains_key(site) {
                return Err(Error::invalid_argument(format!(
                    "site: {site:?} is not a linked site (gma federation status lists them)"
                )));
            }
        }
        if self.queue.len() >= self.p.max_queue {
            return Err(Error::resource_exhausted(format!(
                "the queue is full ({} jobs)",
                self.p.max_queue
            )));
        }
        let id = format!("{}/{}", self.p.site, uuid(&mut self.rng));
        let rec = JobRec {
            id: id.clone(),
            origin: self.p.site.clone(),
            from: None,
            job,
            state: JobState::Queued,
            visited: vec![self.p.site.clone()],
            hops_left: self.p.max_hops,
            at: self.p.site.clone(),
            host: String::new(),
            submitted_ns: now,
            started_ns: 0,
            finished_ns: 0,
            end_ns: 0,
            run_ns: 0,
            since_ns: now,
            granted: false,
            accepted: false,
            cancel_requested: false,
            pin,
            reason: String::new(),
            excluded: BTreeMap::new(),
            next_try_ns: 0,
            in_flight: false,
            queued_reported: false,
        };
        self.jobs.insert(id.clone(), rec);
        self.queue.push(id.clone());
        self.event(&id, "submitted", "", now);
        self.mark_persist();
        self.dirty = true;
        Ok(id)
    }

    pub fn job(&self, id: &str) -> Option<&JobRec> {
        self.jobs.get(id)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &JobRec> {
        self.jobs.values()
    }

    /// A local user cancels a job. Queued: cancelled. Forwarded and not started: the receiver
    /// is asked to cancel (`cancelling`). Started: refused.
    pub fn cancel(&mut self, id: &str, now: i64) -> Result<&'static str, Error> {
        let Some(j) = self.jobs.get_mut(id) else {
            return Err(Error::not_found(format!("no job {id:?} here")));
        };
        match j.state {
            JobState::Queued => {
                j.state = JobState::Cancelled;
                j.reason = "cancelled by the user".into();
                j.finished_ns = now;
                self.queue.retain(|q| q != id);
                self.finish_terminal(id);
                self.event(id, "cancelled", "cancelled by the user", now);
                self.mark_persist();
                self.dirty = true;
                Ok("cancelled")
            }
            JobState::Forwarding | JobState::Forwarded if !j.granted => {
                j.cancel_requested = true;
                let to = j.at.clone();
                self.effects.push(Effect::CancelRemote {
                    id: id.to_string(),
                    to,
                    reason: "cancelled by the user".into(),
                });
                self.mark_persist();
                Ok("cancelling")
            }
            s if s.terminal() => Ok(s.as_str()),
            _ => Err(Error::failed_precondition(format!(
                "job {id} has started ({}): it cannot be cancelled",
                j.state.as_str()
            ))),
        }
    }

    fn finish_terminal(&mut self, id: &str) {
        self.terminal.push_back(id.to_string());
        while self.terminal.len() > self.p.keep_terminal {
            if let Some(old) = self.terminal.pop_front() {
                self.jobs.remove(&old);
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Jobs: other sites
    // ---------------------------------------------------------------------------------------

    /// `ForwardJob` from `from` (already authenticated). `snap` is the current view.
    pub fn accept_forward(
        &mut self,
        from: &str,
        req: &pb::ForwardRequest,
        snap: &Snapshot,
        now: i64,
    ) -> Result<pb::ForwardReply, Reject> {
        let me = self.p.site.clone();
        if !self.peers.contains_key(from) {
            return Err(Reject::NotPeer(format!(
                "{from} is not a linked site of {me} (gma federation add --site {from} ... at {me})"
            )));
        }
        self.heard(from, now);
        if req.visited_sites.contains(&me) {
            return Err(Reject::Loop(format!(
                "job {} has already been at {me} (visited: {})",
                gma_core::clip(&req.global_job_id, 128),
                req.visited_sites.join(",")
            )));
        }
        if let Some(j) = self.jobs.get(&req.global_job_id) {
            if j.from.as_deref() == Some(from) {
                // A retry: the first answer again.
                return Ok(self.forward_reply(&req.global_job_id));
            }
            return Err(Reject::Exists(format!("job {} is already known here", j.id)));
        }
        let Some(spec) = &req.job else {
            return Err(Reject::Invalid("job: give the job".into()));
        };
        let job = Job::from_proto(spec, "job.").map_err(|e| Reject::Invalid(e.to_string()))?;
        let (origin, _) = req
            .global_job_id
            .split_once('/')
            .ok_or_else(|| Reject::Invalid("global_job_id: must be <origin_site>/<uuid>".into()))?;
        if origin.is_empty() || origin != req.origin_site || req.global_job_id.len() > 512 {
            return Err(Reject::Invalid(
                "global_job_id: must be <origin_site>/<uuid>, with origin_site its origin".into(),
            ));
        }
        // The sites it has been at or was refused by for good, the caller among them (not
        // necessarily last: a site that refused it for good stays listed after the caller).
        if req.visited_sites.is_empty()
            || req.visited_sites.len() > 64
            || !req.visited_sites.iter().any(|v| v == from)
        {
            return Err(Reject::Invalid(format!(
                "visited_sites: 1 to 64 sites, the caller ({from}) among them"
            )));
        }
        if !self.p.accepts_foreign {
            return Err(Reject::Busy(format!("{me} accepts no jobs from other sites")));
        }
        let ranked = rank_candidates(snap, &job, Policy::Ttd, &self.p.rank).map_or(0, |r| r.len());
        if ranked == 0 {
            return Err(Reject::Infeasible(format!(
                "no host of {me} meets the job's requirements ({} CPUs, {} MiB, arch {:?})",
                job.cpus, job.memory_mb, job.arch
            )));
        }
        let quota = self.foreign_quota_free(snap);
        if quota < job.cpus {
            return Err(Reject::Busy(format!(
                "{me} offers {quota} more CPUs to other sites, the job needs {}",
                job.cpus
            )));
        }
        if self.queue.len() >= self.p.max_queue {
            return Err(Reject::Busy(format!("{me}'s queue is full")));
        }
        let mut visited = req.visited_sites.clone();
        visited.push(me.clone());
        let rec = JobRec {
            id: req.global_job_id.clone(),
            origin: req.origin_site.clone(),
            from: Some(from.to_string()),
            job,
            state: JobState::Queued,
            visited,
            hops_left: req.hops_left.min(self.p.max_hops),
            at: me,
            host: String::new(),
            submitted_ns: req.submitted_ns,
            started_ns: 0,
            finished_ns: 0,
            end_ns: 0,
            run_ns: 0,
            since_ns: now,
            granted: false,
            accepted: false,
            cancel_requested: false,
            pin: None,
            reason: String::new(),
            excluded: BTreeMap::new(),
            next_try_ns: 0,
            in_flight: false,
            queued_reported: true,
        };
        let id = rec.id.clone();
        self.jobs.insert(id.clone(), rec);
        self.queue.push(id.clone());
        if let Some(p) = self.peers.get_mut(from) {
            p.forwarded_in += 1;
        }
        self.event(&id, "queued", &format!("forwarded by {from}"), now);
        self.mark_persist();
        self.dirty = true;
        Ok(self.forward_reply(&id))
    }

    fn forward_reply(&self, id: &str) -> pb::ForwardReply {
        pb::ForwardReply {
            global_job_id: id.to_string(),
            state: self.jobs.get(id).map_or("unknown", |j| j.state.as_str()).into(),
            summary_epoch: self.epoch,
            summary_seq: self.summary_seq,
        }
    }

    fn foreign_used(&self) -> u32 {
        self.jobs
            .values()
            .filter(|j| {
                j.foreign() && matches!(j.state, JobState::Queued | JobState::Starting | JobState::Running)
            })
            .map(|j| j.job.cpus)
            .sum()
    }

    fn foreign_quota_free(&self, snap: &Snapshot) -> u32 {
        let quota = self.p.foreign_cpus.unwrap_or_else(|| {
            snap.resources
                .iter()
                .map(|r| {
                    if r.total_cpus.is_finite() {
                        r.total_cpus.max(0.0) as u32
                    } else {
                        0
                    }
                })
                .sum()
        });
        quota.saturating_sub(self.foreign_used())
    }

    /// `ConfirmStart` from `from` for a job this site forwarded there.
    pub fn confirm_start(&mut self, from: &str, id: &str, now: i64) -> Grant {
        self.heard(from, now);
        let Some(j) = self.jobs.get_mut(id) else {
            return Grant::No(format!("{} does not know job {id}", self.p.site));
        };
        if j.at != from || !matches!(j.state, JobState::Forwarding | JobState::Forwarded) {
            return Grant::No(format!(
                "job {id} is not held by {from} for {} (it is {} at {})",
                self.p.site,
                j.state.as_str(),
                j.at
            ));
        }
        if j.cancel_requested {
            return Grant::No(format!("job {id} was cancelled"));
        }
        if j.granted {
            return Grant::Yes;
        }
        if let Some(up) = j.from.clone() {
            return Grant::AskUpstream { to: up };
        }
        j.granted = true;
        j.state = JobState::Forwarded;
        self.mark_persist();
        Grant::Yes
    }

    /// The answer of the site upstream to a grant this site asked for on `from`'s behalf.
    pub fn upstream_grant(&mut self, from: &str, id: &str, granted: bool, now: i64) -> Grant {
        if !granted {
            return Grant::No(format!("the site {id} came from refused its start"));
        }
        let Some(j) = self.jobs.get_mut(id) else {
            return Grant::No(format!("job {id} is gone"));
        };
        if j.at != from || !matches!(j.state, JobState::Forwarding | JobState::Forwarded) {
            return Grant::No(format!("job {id} moved"));
        }
        j.granted = true;
        j.state = JobState::Forwarded;
        self.mark_persist();
        self.heard(from, now);
        Grant::Yes
    }

    /// `CancelJob` from `from` (the site that forwarded the job here).
    pub fn cancel_from(
        &mut self,
        from: &str,
        id: &str,
        reason: &str,
        now: i64,
    ) -> Result<&'static str, Error> {
        self.heard(from, now);
        // FAILED_PRECONDITION throughout, as the forwarding site has always been answered.
        let Some(j) = self.jobs.get_mut(id) else {
            return Err(Error::failed_precondition(format!("no job {id:?} here")));
        };
        if j.from.as_deref() != Some(from) {
            return Err(Error::failed_precondition(format!(
                "job {id} was not forwarded here by {from}"
            )));
        }
        match j.state {
            JobState::Queued => {
                j.state = JobState::Cancelled;
                j.finished_ns = now;
                j.reason = format!("cancelled by {from}: {reason}");
                let why = j.reason.clone();
                self.queue.retain(|q| q != id);
                self.finish_terminal(id);
                self.event(id, "cancelled", &why, now);
                self.mark_persist();
                self.dirty = true;
                Ok("cancelled")
            }
            JobState::Starting | JobState::Forwarding | JobState::Forwarded if !j.granted => {
                j.cancel_requested = true;
                Ok("cancelling")
            }
            s if s.terminal() => Ok(s.as_str()),
            _ => Err(Error::failed_precondition(format!(
                "job {id} has started here: it cannot be cancelled"
            ))),
        }
    }

    /// `ListForwarded` for `from`: its jobs here, and where `WatchJobs` continues.
    pub fn list_forwarded(&self, from: &str) -> pb::ListForwardedReply {
        let mut jobs: Vec<pb::JobInfo> = self
            .jobs
            .values()
            .filter(|j| j.from.as_deref() == Some(from))
            .map(JobRec::info)
            .collect();
        jobs.sort_by(|a, b| {
            a.submitted_ns
                .cmp(&b.submitted_ns)
                .then(a.global_job_id.cmp(&b.global_job_id))
        });
        pb::ListForwardedReply {
            jobs,
            epoch: self.epoch,
            next_seq: self.event_seq + 1,
        }
    }

    /// Events for `from`'s jobs with seq >= `from_seq`.
    pub fn events_for(&self, from: &str, from_seq: u64) -> Vec<pb::JobEvent> {
        self.logs
            .get(from)
            .map(|l| l.iter().filter(|e| e.seq >= from_seq).cloned().collect())
            .unwrap_or_default()
    }

    pub fn event_head(&self) -> u64 {
        self.event_seq
    }

    /// A state change reported by `from` about a job this site forwarded there.
    pub fn remote_event(&mut self, from: &str, ev: &pb::JobEvent, now: i64) {
        self.heard(from, now);
        let id = ev.global_job_id.clone();
        let Some(j) = self.jobs.get_mut(&id) else { return };
        if j.at != from || !matches!(j.state, JobState::Forwarding | JobState::Forwarded) {
            return;
        }
        match ev.state.as_str() {
            "started" => {
                j.granted = true;
                j.state = JobState::Forwarded;
                j.started_ns = ev.timestamp_ns;
                j.host = ev.host.clone();
                self.event(&id, "started", &format!("at {from}"), now);
                self.mark_persist();
            }
            "finished" | "failed" => {
                j.state = if ev.state == "finished" {
                    JobState::Finished
                } else {
                    JobState::Failed
                };
                j.finished_ns = ev.timestamp_ns;
                j.host = ev.host.clone();
                j.reason = ev.reason.clone();
                let st = ev.state.clone();
                self.finish_terminal(&id);
                self.event(&id, &st, &format!("at {from}"), now);
                self.mark_persist();
            }
            "cancelled" => self.remote_cancelled(&id, from, &ev.reason, now),
            _ => {}
        }
    }

    /// `from` reports it will never start `id`: re-place it (or end it, if the user asked).
    fn remote_cancelled(&mut self, id: &str, from: &str, reason: &str, now: i64) {
        let Some(j) = self.jobs.get_mut(id) else { return };
        if j.cancel_requested {
            j.state = JobState::Cancelled;
            j.finished_ns = now;
            j.reason = "cancelled by the user".into();
            self.finish_terminal(id);
            self.event(id, "cancelled", &format!("cancelled at {from}"), now);
        } else {
            self.requeue(id, &format!("{from} gave it back: {reason}"), now);
        }
        if let Some(p) = self.peers.get_mut(from) {
            p.debits.retain(|d| d.job != id);
            p.rebuild_debited();
        }
        self.mark_persist();
        self.dirty = true;
    }

    fn requeue(&mut self, id: &str, reason: &str, now: i64) {
        let Some(j) = self.jobs.get_mut(id) else { return };
        j.state = JobState::Queued;
        j.at = self.p.site.clone();
        j.host.clear();
        j.granted = false;
        j.accepted = false;
        j.in_flight = false;
        j.pin = None;
        j.reason = reason.to_string();
        j.queued_reported = true;
        let at = j.submitted_ns;
        // Back in its place (submission order).
        let pos = self
            .queue
            .iter()
            .position(|q| self.jobs.get(q).is_some_and(|x| x.submitted_ns > at))
            .unwrap_or(self.queue.len());
        self.queue.insert(pos, id.to_string());
        self.event(id, "queued", reason, now);
        self.dirty = true;
    }

    /// `ListForwarded` from `from`, after a session (re)opened: bring this site's view of the
    /// jobs it forwarded there up to date.
    pub fn reconcile(&mut self, from: &str, list: &pb::ListForwardedReply, now: i64) {
        self.heard(from, now);
        let theirs: HashMap<&str, &pb::JobInfo> =
            list.jobs.iter().map(|j| (j.global_job_id.as_str(), j)).collect();
        let mine: Vec<String> = self
            .jobs
            .values()
            .filter(|j| j.at == from && matches!(j.state, JobState::Forwarding | JobState::Forwarded))
            .map(|j| j.id.clone())
            .collect();
        for id in mine {
            match theirs.get(id.as_str()) {
                Some(info) => {
                    let state = match info.state.as_str() {
                        "running" => "started",
                        s => s,
                    };
                    let ev = pb::JobEvent {
                        global_job_id: id.clone(),
                        state: state.into(),
                        host: info.host.clone(),
                        timestamp_ns: if info.finished_ns > 0 {
                            info.finished_ns
                        } else {
                            info.started_ns
                        },
                        reason: info.reason.clone(),
                        ..Default::default()
                    };
                    if state == "finished" {
                        // Report the start first if it was never seen.
                        if self.jobs.get(&id).is_some_and(|j| j.started_ns == 0) {
                            let start = pb::JobEvent {
                                state: "started".into(),
                                timestamp_ns: info.started_ns,
                                ..ev.clone()
                            };
                            self.remote_event(from, &start, now);
                        }
                    }
                    self.remote_event(from, &ev, now);
                }
                None => {
                    let Some(j) = self.jobs.get_mut(&id) else { continue };
                    if j.state == JobState::Forwarding {
                        continue; // the forward is retried; the receiver dedupes
                    }
                    if j.granted {
                        j.state = JobState::Failed;
                        j.finished_ns = now;
                        j.reason = format!("{from} no longer knows the job it started");
                        let why = j.reason.clone();
                        self.finish_terminal(&id);
                        self.event(&id, "failed", &why, now);
                    } else {
                        self.requeue(&id, &format!("{from} no longer knows it"), now);
                    }
                    self.mark_persist();
                }
            }
        }
    }

    /// The answer to a `ForwardJob` this site made.
    pub fn forward_result(&mut self, id: &str, to: &str, outcome: ForwardOutcome, now: i64) {
        let Some(j) = self.jobs.get_mut(id) else { return };
        // The receiver may have asked for the start grant (or even reported the job done)
        // before this answer came back: the acceptance is booked whatever the state now.
        if j.at != to || j.accepted || !(j.state == JobState::Forwarding || j.granted) {
            return;
        }
        j.in_flight = false;
        match outcome {
            ForwardOutcome::Accepted(reply) => {
                j.accepted = true;
                if j.state == JobState::Forwarding {
                    j.state = JobState::Forwarded;
                }
                j.reason.clear();
                if let Some(p) = self.peers.get_mut(to) {
                    p.forwarded_out += 1;
                    for d in p.debits.iter_mut().filter(|d| d.job == id) {
                        d.until = Some((reply.summary_epoch, reply.summary_seq));
                    }
                    // Already reflected if a newer summary came in meanwhile.
                    if let Some(s) = &p.summary {
                        p.debits.retain(|d| match d.until {
                            Some((e, q)) => e == s.epoch && s.seq <= q,
                            None => true,
                        });
                        p.rebuild_debited();
                    }
                }
                self.event(id, "forwarded", &format!("to {to}"), now);
                match reply.state.as_str() {
                    "cancelled" | "failed" | "finished" | "running" => {
                        let ev = pb::JobEvent {
                            global_job_id: id.to_string(),
                            state: if reply.state == "running" {
                                "started".into()
                            } else {
                                reply.state.clone()
                            },
                            timestamp_ns: now,
                            ..Default::default()
                        };
                        self.remote_event(to, &ev, now);
                    }
                    _ => {}
                }
                self.mark_persist();
            }
            _ if j.state != JobState::Forwarding => {}
            ForwardOutcome::Refused(reason) => self.refused(id, to, &reason, None, now),
            ForwardOutcome::Busy {
                reason,
                retry_after_ms,
            } => self.refused(id, to, &reason, Some(retry_after_ms), now),
            ForwardOutcome::Unreachable(e) => {
                j.next_try_ns = now + (self.p.heartbeat_ms as i64) * 1_000_000;
                j.reason = format!("{to} unreachable: {e}");
            }
        }
    }

    /// `to` refused `id`: for good (`retry_after_ms` none: it stays in the visited list) or
    /// for a while (excluded until then, then it may go back).
    fn refused(&mut self, id: &str, to: &str, reason: &str, retry_after_ms: Option<u64>, now: i64) {
        if let Some(p) = self.peers.get_mut(to) {
            p.debits.retain(|d| d.job != id);
            p.rebuild_debited();
        }
        if let Some(j) = self.jobs.get_mut(id) {
            if let Some(ms) = retry_after_ms {
                let ms = ms.max(self.p.summary_interval_ms);
                j.excluded.insert(to.to_string(), now + (ms as i64) * 1_000_000);
                if let Some(pos) = j.visited.iter().rposition(|v| v == to) {
                    j.visited.remove(pos);
                }
            }
        }
        self.requeue(id, &format!("{to} refused it: {reason}"), now);
        self.mark_persist();
    }

    /// The answer to a start grant this site asked for (`None`: no answer).
    pub fn start_result(&mut self, id: &str, granted: Option<bool>, reason: &str, now: i64) {
        let Some(j) = self.jobs.get(id) else { return };
        if j.state != JobState::Starting {
            return;
        }
        let cancel = j.cancel_requested;
        match granted {
            Some(true) if !cancel => self.run(id, now),
            Some(_) => {
                self.release(id);
                if let Some(j) = self.jobs.get_mut(id) {
                    j.state = JobState::Cancelled;
                    j.finished_ns = now;
                    j.reason = format!(
                        "start refused by {}: {reason}",
                        j.from.clone().unwrap_or_default()
                    );
                }
                let why = self.jobs.get(id).map(|j| j.reason.clone()).unwrap_or_default();
                self.finish_terminal(id);
                self.event(id, "cancelled", &why, now);
                self.mark_persist();
            }
            None => {
                self.release(id);
                if let Some(j) = self.jobs.get_mut(id) {
                    j.state = JobState::Queued;
                    j.host.clear();
                    j.next_try_ns = now + (self.p.heartbeat_ms as i64) * 1_000_000;
                    j.reason = format!("no start grant yet: {reason}");
                }
                let at = self.jobs.get(id).map_or(0, |j| j.submitted_ns);
                let pos = self
                    .queue
                    .iter()
                    .position(|q| self.jobs.get(q).is_some_and(|x| x.submitted_ns > at))
                    .unwrap_or(self.queue.len());
                self.queue.insert(pos, id.to_string());
            }
        }
        self.dirty = true;
    }

    /// The simulator applied a change to `host` (or cannot: `ok` false).
    pub fn set_applied(&mut self, host: &str, ok: bool, now: i64) {
        if let Some(h) = self.hosts.get_mut(host) {
            h.pending_sets = h.pending_sets.saturating_sub(1);
            h.applied_ns = now;
            if h.simulated.is_none() || !ok {
                h.simulated = Some(ok);
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Execution
    // ---------------------------------------------------------------------------------------

    fn occupy(&mut self, host: &str, cpus: u32, add: bool) {
        let h = self.hosts.entry(host.to_string()).or_default();
        if add {
            h.occupied += cpus;
        } else {
            h.occupied = h.occupied.saturating_sub(cpus);
        }
        if h.simulated == Some(false) {
            return;
        }
        let free = (h.baseline.unwrap_or(0.0) - f64::from(h.occupied)).max(0.0);
        h.pending_sets += 1;
        self.effects.push(Effect::SetFree {
            host: host.to_string(),
            producer: h.producer.clone(),
            free,
        });
    }

    fn release(&mut self, id: &str) {
        let Some(j) = self.jobs.get(id) else { return };
        if matches!(j.state, JobState::Running | JobState::Starting) && !j.host.is_empty() {
            let (h, c) = (j.host.clone(), j.job.cpus);
            self.occupy(&h, c, false);
        }
    }

    /// Real run time of `job` on a host where its predicted execution takes `exec_s`.
    fn duration_ns(&self, job: &Job, exec_s: f64) -> i64 {
        let s = job.stage_in_s.unwrap_or(0.0) + exec_s + job.stage_out_s.unwrap_or(0.0);
        (s * self.p.time_scale * 1e9).max(0.0) as i64
    }

    fn run(&mut self, id: &str, now: i64) {
        let Some(j) = self.jobs.get_mut(id) else { return };
        j.state = JobState::Running;
        j.started_ns = now;
        j.end_ns = now + j.run_ns;
        j.at = self.p.site.clone();
        j.reason.clear();
        self.event(id, "started", "", now);
        self.mark_persist();
    }

    /// The view with this site's own jobs subtracted (see the module doc).
    fn effective(&mut self, snap: &Snapshot) -> Vec<Resource> {
        let mut out = Vec::with_capacity(snap.resources.len());
        for r in snap.resources.iter() {
            let h = self.hosts.entry(r.name.clone()).or_default();
            h.producer.clone_from(&r.producer);
            let mut x = Resource::clone(r);
            if r.free_cpus.is_finite() {
                if h.simulated == Some(false) {
                    x.free_cpus = (r.free_cpus - f64::from(h.occupied)).max(0.0);
                } else {
                    if h.pending_sets == 0 && r.updated_ns > h.applied_ns {
                        h.baseline = Some(r.free_cpus + f64::from(h.occupied));
                    }
                    if let Some(b) = h.baseline {
                        x.free_cpus = r.free_cpus.min(b - f64::from(h.occupied)).max(0.0);
                    }
                }
            }
            out.push(x);
        }
        out
    }

    fn releases(&self, now: i64) -> Vec<Release> {
        let scale = self.p.time_scale.max(1e-12);
        self.jobs
            .values()
            .filter(|j| matches!(j.state, JobState::Running | JobState::Starting) && !j.host.is_empty())
            .map(|j| Release {
                host: j.host.clone(),
                cpus: j.job.cpus,
                remaining_s: if j.state == JobState::Running {
                    (j.end_ns - now).max(0) as f64 / 1e9 / scale
                } else {
                    j.job.reference_time_s
                },
            })
            .collect()
    }

    /// Advances time: ends jobs due, applies leases and session timeouts, places queued jobs
    /// (route()), rebuilds and pushes the summary, emits status. `snap` is the live view.
    pub fn step(&mut self, now: i64, snap: &Snapshot) {
        let mut eff = self.effective(snap);
        let view_changed = !self
            .last_view
            .as_ref()
            .is_some_and(|v| std::sync::Arc::ptr_eq(v, &snap.resources));
        self.last_view = Some(snap.resources.clone());

        // 1. Jobs that ran to their end.
        let due: Vec<String> = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running && j.end_ns <= now)
            .map(|j| j.id.clone())
            .collect();
        for id in due {
            self.release(&id);
            if let Some(j) = self.jobs.get_mut(&id) {
                j.state = JobState::Finished;
                j.finished_ns = now;
            }
            self.finish_terminal(&id);
            self.event(&id, "finished", "", now);
            self.mark_persist();
            self.dirty = true;
        }
        if self.dirty {
            eff = self.effective(snap);
        }

        // 2. Sessions: a peer not heard from within the timeout is out at once.
        let timeout = self.p.session_timeout_ns();
        for p in self.peers.values_mut() {
            let live = p.last_heard_ns > 0 && now - p.last_heard_ns <= timeout && !p.refused;
            if live != p.live {
                p.live = live;
                self.dirty = true;
            }
        }

        // 3. Foreign jobs not started whose origin went silent past the lease: cancelled here.
        let lease = (self.p.origin_lease_ms as i64) * 1_000_000;
        let expired: Vec<(String, String)> = self
            .jobs
            .values()
            .filter(|j| j.foreign() && matches!(j.state, JobState::Queued | JobState::Starting))
            .filter_map(|j| {
                let from = j.from.clone().unwrap_or_default();
                let heard = self
                    .peers
                    .get(&from)
                    .map_or(0, |p| p.last_heard_ns)
                    .max(j.since_ns);
                (now - heard > lease).then(|| (j.id.clone(), from))
            })
            .collect();
        for (id, from) in expired {
            self.release(&id);
            self.queue.retain(|q| *q != id);
            let why = format!(
                "origin lease expired: {from} silent for more than {} ms",
                self.p.origin_lease_ms
            );
            if let Some(j) = self.jobs.get_mut(&id) {
                j.state = JobState::Cancelled;
                j.finished_ns = now;
                j.reason = why.clone();
            }
            self.finish_terminal(&id);
            self.event(&id, "cancelled", &why, now);
            self.mark_persist();
            self.dirty = true;
        }

        // 4. Jobs this site forwarded: retry unanswered forwards, re-place ungranted ones whose
        //    receiver went silent past lease + 2 heartbeats.
        let replace_after = self.p.replace_after_ns();
        let mut replace = Vec::new();
        let mut retry = Vec::new();
        for j in self.jobs.values() {
            if !matches!(j.state, JobState::Forwarding | JobState::Forwarded) || j.granted {
                continue;
            }
            let p = self.peers.get(&j.at);
            let heard = p.map_or(0, |p| p.last_heard_ns).max(j.since_ns);
            if now - heard > replace_after {
                replace.push(j.id.clone());
            } else if j.state == JobState::Forwarding
                && !j.in_flight
                && j.next_try_ns <= now
                && p.is_some_and(|p| p.live)
            {
                retry.push(j.id.clone());
            }
        }
        for id in replace {
            let Some(j) = self.jobs.get(&id) else { continue };
            let at = j.at.clone();
            if let Some(p) = self.peers.get_mut(&at) {
                p.debits.retain(|d| d.job != id);
                p.rebuild_debited();
            }
            if j.cancel_requested {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.state = JobState::Cancelled;
                    j.finished_ns = now;
                }
                self.finish_terminal(&id);
                self.event(&id, "cancelled", "cancelled by the user", now);
            } else {
                let why = format!(
                    "{at} silent for more than origin_lease_ms + 2 heartbeats ({} ms): re-placed",
                    replace_after / 1_000_000
                );
                self.requeue(&id, &why, now);
            }
            self.mark_persist();
        }
        for id in retry {
            if let Some(req) = self.forward_request(&id) {
                let to = self.jobs.get(&id).map(|j| j.at.clone()).unwrap_or_default();
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.in_flight = true;
                }
                self.effects.push(Effect::Forward {
                    to,
                    req: Box::new(req),
                });
            }
        }

        // 5. Placement, in submission order (a job that cannot start lets later ones try).
        if self.dirty
            || view_changed
            || self.queue.iter().any(|q| {
                self.jobs
                    .get(q)
                    .is_some_and(|j| j.next_try_ns > 0 && j.next_try_ns <= now)
            })
        {
            self.place(now, &mut eff, snap.now_ns);
        }

        // 6. The summary.
        self.summarize(now, &eff, snap.now_ns, view_changed);

        // 7. federation.status.
        if now - self.last_status_ns >= (self.p.status_interval_ms as i64) * 1_000_000 {
            self.last_status_ns = now;
            let st = self.peer_statuses(now);
            if !st.is_empty() {
                self.effects.push(Effect::Status(st));
            }
        }
        self.dirty = false;
    }

    fn forward_request(&self, id: &str) -> Option<pb::ForwardRequest> {
        let j = self.jobs.get(id)?;
        let link_hops = self.peers.get(&j.at).map_or(1, |p| p.link.hops());
        // visited without the receiver (it was pushed when the forward was decided).
        let mut visited = j.visited.clone();
        if visited.last() == Some(&j.at) {
            visited.pop();
        }
        Some(pb::ForwardRequest {
            global_job_id: j.id.clone(),
            job: Some(j.job.to_proto()),
            origin_site: j.origin.clone(),
            visited_sites: visited,
            hops_left: j.hops_left.min(link_hops).saturating_sub(1),
            origin_lease_ms: self.p.origin_lease_ms.min(u64::from(u32::MAX)) as u32,
            idempotency_key: j.id.clone(),
            submitted_ns: j.submitted_ns,
        })
    }

    fn place(&mut self, now: i64, eff: &mut [Resource], snap_ns: i64) {
        let queue = self.queue.clone();
        let mut placed: Vec<String> = Vec::new();
        let mut ahead: Vec<Ahead> = Vec::new();
        let mut releases = self.releases(now);
        let mut snapshot = Snapshot::new(snap_ns, eff.to_vec());
        let valid = |p: &Peer| {
            p.live
                && p.summary.as_ref().is_some_and(|s| {
                    let age = ((now - p.received_ns).max(0) / 1_000_000) as u64 + s.age_at_send_ms;
                    age <= u64::from(s.valid_for_ms)
                })
        };
        let peer_max = self
            .peers
            .values()
            .filter(|p| valid(p))
            .filter_map(|p| p.debited.as_ref())
            .map(Summary::cpus_free_max_node)
            .max()
            .unwrap_or(0);
        for id in queue {
            let Some(j) = self.jobs.get(&id) else {
                placed.push(id);
                continue;
            };
            if j.state != JobState::Queued {
                placed.push(id);
                continue;
            }
            if j.next_try_ns > now {
                ahead.push(Ahead {
                    cpus: j.job.cpus,
                    exec_s: j.job.reference_time_s,
                });
                continue;
            }
            let excluded: Vec<String> = j
                .excluded
                .iter()
                .filter(|(_, until)| **until > now)
                .map(|(s, _)| s.clone())
                .collect();
            // Cheap pre-check (the same answer route() would give, without ranking): no local
            // host has the CPUs free and no peer's best node does.
            let local_max = eff
                .iter()
                .filter(|r| r.age_ms(snap_ns) <= self.p.rank.max_age_ms)
                .map(|r| r.free_cpus)
                .filter(|f| f.is_finite())
                .fold(0.0, f64::max);
            let decision = if j.pin.is_none() && f64::from(j.job.cpus) > local_max && j.job.cpus > peer_max {
                Route::Queue {
                    reason: "no local host has the CPUs free and no peer can take it".into(),
                }
            } else if let Some(pin) = j.pin.clone() {
                let ok = self.peers.get(&pin).is_some_and(|p| {
                    p.live && !j.visited.contains(&pin) && j.hops_left.min(p.link.hops()) > 0
                });
                if ok {
                    Route::Forward { site: pin }
                } else {
                    Route::Queue {
                        reason: format!("waiting for {pin} (the site it was sent to) to be reachable"),
                    }
                }
            } else {
                let peers: Vec<PeerView> = self
                    .peers
                    .values()
                    .filter_map(|p| {
                        Some(PeerView {
                            site: &p.link.site,
                            advertised: p.summary.as_ref()?,
                            summary: p.debited.as_ref()?,
                            received_ns: p.received_ns,
                            live: p.live,
                            link_hops: p.link.hops(),
                            in_flight_cpus: p.in_flight_cpus(),
                        })
                    })
                    .collect();
                let local = LocalView {
                    snapshot: &snapshot,
                    rank: &self.p.rank,
                    releases: &releases,
                    ahead: &ahead,
                };
                let rj = RouteJob {
                    id: &j.id,
                    job: &j.job,
                    visited: &j.visited,
                    hops_left: j.hops_left,
                    excluded: &excluded,
                };
                route(&local, &peers, &rj, &self.p.route, now).route
            };
            match decision {
                Route::Local { host } => {
                    let exec = rank_candidates(&snapshot, &j.job, Policy::Ttd, &self.p.rank)
                        .ok()
                        .and_then(|r| r.into_iter().find(|x| x.resource == host))
                        .map_or(j.job.reference_time_s, |x| x.exec_s);
                    let dur = self.duration_ns(&j.job, exec);
                    let cpus = j.job.cpus;
                    let foreign = j.foreign();
                    let from = j.from.clone();
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.host = host.clone();
                        j.run_ns = dur;
                        j.state = JobState::Starting;
                    }
                    self.occupy(&host, cpus, true);
                    if let Some(r) = eff.iter_mut().find(|r| r.name == host) {
                        r.free_cpus = (r.free_cpus - f64::from(cpus)).max(0.0);
                    }
                    snapshot = Snapshot::new(snap_ns, eff.to_vec());
                    releases.push(Release {
                        host: host.clone(),
                        cpus,
                        remaining_s: exec,
                    });
                    if foreign {
                        self.effects.push(Effect::AskStart {
                            id: id.clone(),
                            to: from.unwrap_or_default(),
                            host,
                        });
                        self.mark_persist();
                    } else {
                        self.run(&id, now);
                    }
                    placed.push(id);
                }
                Route::Forward { site } => {
                    let arch = j.job.arch.clone();
                    let cpus = j.job.cpus;
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.state = JobState::Forwarding;
                        j.accepted = false;
                        j.at = site.clone();
                        j.visited.push(site.clone());
                        j.since_ns = now;
                        j.in_flight = true;
                        j.pin = None;
                    }
                    if let Some(p) = self.peers.get_mut(&site) {
                        p.debits.push(Debit {
                            job: id.clone(),
                            cpus,
                            arch,
                            until: None,
                        });
                        p.rebuild_debited();
                    }
                    self.mark_persist();
                    if let Some(req) = self.forward_request(&id) {
                        self.effects.push(Effect::Forward {
                            to: site,
                            req: Box::new(req),
                        });
                    }
                    placed.push(id);
                }
                Route::Queue { reason } => {
                    ahead.push(Ahead {
                        cpus: j.job.cpus,
                        exec_s: j.job.reference_time_s,
                    });
                    if !j.queued_reported {
                        if let Some(j) = self.jobs.get_mut(&id) {
                            j.queued_reported = true;
                            j.reason.clone_from(&reason);
                        }
                        self.event(&id, "queued", &reason, now);
                    }
                }
            }
        }
        if !placed.is_empty() {
            self.queue.retain(|q| !placed.contains(q));
        }
    }

    fn summarize(&mut self, now: i64, eff: &[Resource], snap_ns: i64, view_changed: bool) {
        let interval = (self.p.summary_interval_ms as i64) * 1_000_000;
        let periodic = now - self.last_push_ns >= interval;
        let due = self.push_due.is_some_and(|d| d <= now);
        if !(self.dirty || view_changed || periodic || due || self.relay_due) {
            return;
        }
        let snapshot = Snapshot::new(snap_ns, eff.to_vec());
        let releases = self.releases(now);
        let ahead: Vec<Ahead> = self
            .queue
            .iter()
            .filter_map(|q| self.jobs.get(q))
            .map(|j| Ahead {
                cpus: j.job.cpus,
                exec_s: j.job.reference_time_s,
            })
            .collect();
        let local = LocalView {
            snapshot: &snapshot,
            rank: &self.p.rank,
            releases: &releases,
            ahead: &ahead,
        };
        let mut probe = [f64::INFINITY; 4];
        for (i, c) in PROBE_CPUS.iter().enumerate() {
            let j = Job {
                name: "probe".into(),
                cpus: *c,
                reference_time_s: 1.0,
                ..Job::default()
            };
            probe[i] = local_estimate(&local, &j).start_s;
        }
        let running = self
            .jobs
            .values()
            .filter(|j| matches!(j.state, JobState::Running | JobState::Starting))
            .count() as u32;
        let load = SiteLoad {
            jobs_running: running,
            jobs_queued: self.queue.len() as u32,
            probe_start_s: probe,
            foreign_quota_free: self.foreign_quota_free(&snapshot),
            accepts_foreign: self.p.accepts_foreign,
        };
        let mut own = Summary::build(
            &self.p.site,
            &snapshot,
            self.p.rank.max_age_ms,
            load,
            self.p.valid_for_ms,
        );
        own.generated_at_ns = now;
        let significant = match &self.pushed {
            None => true,
            Some(old) => significant_change(old, &own),
        } || std::mem::take(&mut self.relay_due);
        let debounce = (self.p.push_debounce_ms as i64) * 1_000_000;
        let push = periodic || due || (significant && now - self.last_push_ns >= debounce);
        if !push {
            if significant && self.push_due.is_none() {
                self.push_due = Some(self.last_push_ns + debounce);
            }
            return;
        }
        self.summary_seq += 1;
        let own = own.stamp(&self.p.site, self.epoch, self.summary_seq);
        self.pushed = Some(own.clone());
        self.own = Some(own);
        self.last_push_ns = now;
        self.push_due = None;
        self.effects.push(Effect::Summary);
    }

    /// This site's own summary as last pushed.
    pub fn own_summary(&self) -> Option<&Summary> {
        self.own.as_ref()
    }

    /// What to send `peer` (split horizon): to a peer, this site alone; to a parent, this site
    /// and its children; to a child, this site, its parent and its other children. A summary
    /// that contains the receiver is never part of it.
    pub fn summary_for(&self, peer: &str, now: i64) -> Option<Summary> {
        let own = self.own.as_ref()?;
        let link = &self.peers.get(peer)?.link;
        let parts: Vec<(&Summary, i64)> = match link.role {
            Role::Peer => Vec::new(),
            Role::Parent => self.fresh_of(|r| r == Role::Child, now),
            Role::Child => self.fresh_of(|r| r != Role::Peer, now),
        }
        .into_iter()
        .filter(|(s, _)| s.site != peer && !s.contributing.contains(peer))
        .collect();
        // The age sent is this hop's: since this site built its own part, and since it received
        // each relayed part (each of which it holds only while fresh, and each hop drops what it
        // stops hearing). Carrying every part's age from its origin instead made a summary two
        // relays away look older than valid_for_ms while its source was alive and refreshing.
        let own_age = (now - own.generated_at_ns).max(0);
        let age_ns = parts
            .iter()
            .map(|(_, received_ns)| (now - received_ns).max(0))
            .fold(own_age, i64::max);
        let mut out = if parts.is_empty() {
            own.clone()
        } else {
            let merged = merge_all(parts.iter().map(|(s, _)| *s));
            merge(own, &merged).stamp(&self.p.site, own.epoch, own.seq)
        };
        out.age_at_send_ms = (age_ns / 1_000_000) as u64;
        Some(out)
    }

    /// The summaries of live links with `role` still fresh, each with when it was received.
    fn fresh_of(&self, role: impl Fn(Role) -> bool, now: i64) -> Vec<(&Summary, i64)> {
        self.peers
            .values()
            .filter(|p| role(p.link.role) && p.live)
            .filter_map(|p| {
                let s = p.summary.as_ref()?;
                let age = ((now - p.received_ns).max(0) / 1_000_000) as u64 + s.age_at_send_ms;
                (age <= u64::from(s.valid_for_ms)).then_some((s, p.received_ns))
            })
            .collect()
    }

    pub fn peer_statuses(&self, now: i64) -> Vec<pb::PeerStatus> {
        self.peers
            .values()
            .map(|p| {
                let age = p.summary.as_ref().map_or(-1, |s| {
                    (now - p.received_ns).max(0) / 1_000_000 + s.age_at_send_ms as i64
                });
                let fresh = p
                    .summary
                    .as_ref()
                    .is_some_and(|s| age >= 0 && age as u64 <= u64::from(s.valid_for_ms));
                pb::PeerStatus {
                    site: p.link.site.clone(),
                    endpoint: p.link.endpoint.clone(),
                    role: p.link.role.as_str().into(),
                    session: p.session_name().into(),
                    live: p.live,
                    eligible: p.live && fresh,
                    summary_age_ms: age,
                    summary_seq: p.summary.as_ref().map_or(0, |s| s.seq),
                    forwarded_out: p.forwarded_out,
                    forwarded_in: p.forwarded_in,
                    in_flight_cpus: p.in_flight_cpus(),
                    cpus_free_sum: p.summary.as_ref().map_or(0, Summary::cpus_free_sum),
                    last_error: p.last_error.clone(),
                    heard_ms_ago: if p.last_heard_ns > 0 {
                        (now - p.last_heard_ns).max(0) / 1_000_000
                    } else {
                        -1
                    },
                }
            })
            .collect()
    }

    pub fn counts(&self) -> (u32, u32, u64) {
        let running = self
            .jobs
            .values()
            .filter(|j| matches!(j.state, JobState::Running | JobState::Starting))
            .count() as u32;
        (self.queue.len() as u32, running, self.jobs.len() as u64)
    }

    /// The earliest time after `now` a [`SiteState::step`] has work without any input (a
    /// job's end, a debounced or periodic push, a retry, an exclusion ending), for
    /// discrete-event drivers.
    pub fn next_deadline(&self, now: i64) -> Option<i64> {
        let mut t: Option<i64> = None;
        let mut at = |x: i64| {
            if x > now {
                t = Some(t.map_or(x, |y| y.min(x)));
            }
        };
        if let Some(d) = self.push_due {
            at(d);
        }
        if self.own.is_some() {
            at(self
                .last_push_ns
                .saturating_add((self.p.summary_interval_ms as i64).saturating_mul(1_000_000)));
        }
        for j in self.jobs.values() {
            match j.state {
                JobState::Running => at(j.end_ns),
                JobState::Queued => {
                    at(j.next_try_ns);
                    for until in j.excluded.values() {
                        at(*until);
                    }
                }
                _ => {}
            }
        }
        t
    }
}

/// Whether a new summary differs enough from the last one pushed to push it now: a histogram
/// grade, the set of classes, ≥ 10 % of free CPUs, a probe's predicted start by ≥ 10 % (or
/// becoming (un)known), the queue, or the quota.
pub fn significant_change(old: &Summary, new: &Summary) -> bool {
    if old.classes.len() != new.classes.len() {
        return true;
    }
    for ((ka, a), (kb, b)) in old.classes.iter().zip(&new.classes) {
        if ka != kb || a.free_hist != b.free_hist || a.nodes_up != b.nodes_up {
            return true;
        }
    }
    let (fa, fb) = (f64::from(old.cpus_free_sum()), f64::from(new.cpus_free_sum()));
    if (fa - fb).abs() >= 0.1 * fa.max(1.0) {
        return true;
    }
    for (a, b) in old.load.probe_start_s.iter().zip(&new.load.probe_start_s) {
        if a.is_finite() != b.is_finite() || (a.is_finite() && (a - b).abs() > 0.1 * a.abs().max(1.0)) {
            return true;
        }
    }
    old.load.jobs_queued != new.load.jobs_queued
        || old.load.foreign_quota_free != new.load.foreign_quota_free
        || old.load.accepts_foreign != new.load.accepts_foreign
}

#[cfg(test)]
mod tests;
