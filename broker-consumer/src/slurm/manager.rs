//! The Slurm adapter's state: the reservations it made (with their creators) and the jobs
//! started in them, the operations on them through Slurm's commands, and the loop that reads
//! them back and publishes every change (`reservation.state`, `job.batch`).

use gma_core::Refuse;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gma_core::time::now_ns;
use gma_producer::Hub;
use gma_proto::v1 as pb;
use parking_lot::Mutex;

use super::command::{
    exit_of, format_time, job_state, parse_nodes, parse_reservations, parse_squeue, CmdError, Slurm,
    SlurmNode, SlurmReservation,
};
use super::config::SlurmConfig;
use crate::error::Error;
use crate::remote::{answer_to_proto, reservation_to_proto};
use crate::reserve::{Answer, Reservation, ReserveRequest};
use crate::simjobs::publish_job;
pub use crate::simjobs::{job_schema, JOB_EVENT};
use crate::simres::{check_window, owned_by};

/// Start times tried for one request (each after the end of what was in the way).
const MAX_ATTEMPTS: usize = 16;
/// Largest batch script accepted.
const MAX_SCRIPT: usize = 1 << 20;
/// Done jobs are forgotten this long after they ended.
const FORGET_AFTER_S: i64 = 3600;
/// Most reservations held at once.
const MAX_HELD: usize = 100_000;

struct Held {
    res: Reservation,
    confirmed: bool,
    job: Option<String>,
}

struct Job {
    info: pb::BatchJob,
    cpus: u32,
}

/// A release Slurm has not confirmed yet (the controller was unreachable, or the reservation
/// was still in use): retried by the read-back loop, with backoff, until Slurm answers.
struct PendingRelease {
    /// The reservation as its holder knew it (None: a leftover of an earlier run).
    res: Option<Reservation>,
    /// Its job, cancelled before the reservation is deleted.
    job: Option<String>,
    attempts: u32,
    next_try: tokio::time::Instant,
}

/// First retry of a pending release; doubled per failed attempt up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(30);

fn retry_delay(attempts: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1u32 << attempts.min(16))
        .min(RETRY_MAX)
}

#[derive(Default)]
struct State {
    held: HashMap<String, Held>,
    jobs: HashMap<String, Job>,
    /// Releases accepted but not yet done in Slurm, by reservation name.
    pending: HashMap<String, PendingRelease>,
    /// Whether Slurm's reservations have been read once since start (the leftovers of earlier
    /// runs are known and queued for release).
    reconciled: bool,
}

/// The adapter.
pub struct SlurmManager {
    slurm: Slurm,
    nodes: Vec<SlurmNode>,
    user: String,
    software: Vec<String>,
    job_dir: PathBuf,
    max_jobs: usize,
    /// Reservation names are `<prefix><n>`; the prefix names the adapter's source and run.
    prefix: String,
    /// Leftovers of earlier runs of this adapter start with this.
    family: String,
    next: AtomicU64,
    state: Mutex<State>,
    /// One Slurm-changing operation at a time (a search for a start sees a stable picture).
    ops: tokio::sync::Mutex<()>,
    hub: Option<Arc<Hub>>,
    source: String,
    slots: SlotOffer,
}

/// What the adapter offers as `rm.slots` and what it last published.
struct SlotOffer {
    poll: Option<Duration>,
    slot_s: i64,
    /// Per offered node (as `nodes`).
    prices: Vec<f64>,
    last: Mutex<SlotsPublished>,
}

#[derive(Default)]
struct SlotsPublished {
    read_at: Option<std::time::Instant>,
    published_at: Option<std::time::Instant>,
    /// The capacities the last snapshot was cut from (node, usable cpus, reserved windows).
    caps: Option<Vec<NodeCapacity>>,
    version: u64,
}

fn invalid(m: impl Into<String>) -> Error {
    Error::invalid_argument(m.into())
}

/// A command failure as a status: an unreachable controller is UNAVAILABLE, a refusal
/// FAILED_PRECONDITION; both carry the command's standard error.
fn cmd_error(what: &str, e: &CmdError) -> Error {
    if e.unreachable() {
        Error::unavailable(format!("slurm is unreachable ({what}): {e}"))
    } else {
        Error::failed_precondition(format!("slurm refused to {what}: {}", e.stderr()))
    }
}

fn now_s() -> i64 {
    now_ns() / 1_000_000_000
}

fn clip(s: &str) -> String {
    gma_core::clip(s, 64)
}

impl SlurmManager {
    /// Reads the nodes from Slurm (the controller must be up) and cleans up reservations an
    /// earlier run of this adapter left behind.
    pub async fn start(cfg: &SlurmConfig, hub: Option<Arc<Hub>>) -> Result<SlurmManager, Error> {
        cfg.validate()?;
        let slurm = Slurm {
            bin_dir: cfg.bin_dir.clone(),
            conf: cfg.slurm_conf.clone(),
            timeout: Duration::from_millis(cfg.command_timeout_ms),
        };
        let text = slurm
            .run("scontrol", &["show".into(), "node".into(), "-o".into()])
            .await
            .map_err(|e| Error::Simres(format!("cannot read Slurm's nodes: {e}")))?;
        let mut nodes = parse_nodes(&text);
        if !cfg.nodes.is_empty() {
            if let Some(missing) = cfg.nodes.iter().find(|n| !nodes.iter().any(|x| &x.name == *n)) {
                return Err(Error::Simres(format!(
                    "nodes: Slurm has no node {missing:?} (scontrol show node lists {:?})",
                    nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>()
                )));
            }
            nodes.retain(|n| cfg.nodes.contains(&n.name));
        }
        if nodes.is_empty() {
            return Err(Error::Simres("Slurm reports no node (scontrol show node)".into()));
        }
        if let Some(name) = cfg.prices.keys().find(|n| !nodes.iter().any(|x| &x.name == *n)) {
            return Err(Error::Simres(format!("prices.{name}: no such offered node")));
        }
        let prices = nodes
            .iter()
            .map(|n| cfg.prices.get(&n.name).copied().unwrap_or(cfg.price))
            .collect();
        let user = if cfg.user.is_empty() {
            let out = tokio::process::Command::new("id")
                .arg("-un")
                .output()
                .await
                .map_err(|e| Error::Simres(format!("user: cannot run id -un: {e}")))?;
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        } else {
            cfg.user.clone()
        };
        if user.is_empty() {
            return Err(Error::Simres(
                "user: cannot tell the adapter's Unix user; set user".into(),
            ));
        }
        let job_dir = match &cfg.job_dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir().join(format!("gma-slurm-{}", std::process::id())),
        };
        std::fs::create_dir_all(&job_dir)
            .map_err(|e| Error::Simres(format!("job_dir: cannot create {}: {e}", job_dir.display())))?;
        let tag: String = cfg
            .source
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(32)
            .collect();
        let family = format!("gma-{tag}-");
        let run = (now_ns() as u64 ^ u64::from(std::process::id()).rotate_left(20)) & 0xffff_ffff;
        let m = SlurmManager {
            slurm,
            nodes,
            user,
            software: cfg.software.clone(),
            job_dir,
            max_jobs: cfg.max_jobs,
            prefix: format!("{family}{run:08x}-"),
            family,
            next: AtomicU64::new(1),
            state: Mutex::new(State::default()),
            ops: tokio::sync::Mutex::new(()),
            hub,
            source: cfg.source.clone(),
            slots: SlotOffer {
                poll: (cfg.slots_poll_ms > 0).then(|| Duration::from_millis(cfg.slots_poll_ms)),
                slot_s: cfg.slot_s,
                prices,
                last: Mutex::new(SlotsPublished::default()),
            },
        };
        m.clean_leftovers().await;
        Ok(m)
    }

    /// What `Resources` answers: every offered node.
    pub fn resources(&self) -> Vec<pb::ReservableResource> {
        let disk = free_disk_mb(&self.job_dir);
        self.nodes
            .iter()
            .map(|n| pb::ReservableResource {
                name: n.name.clone(),
                cpus: n.cpus,
                memory_mb: n.memory_mb,
                arch: n.arch.clone(),
                horizon_s: 0,
                runs_jobs: true,
                disk_mb: disk,
                software: self.software.clone(),
            })
            .collect()
    }

    async fn scontrol(&self, args: &[String]) -> Result<String, CmdError> {
        self.slurm.run("scontrol", args).await
    }

    async fn reservations(&self) -> Result<Vec<SlurmReservation>, CmdError> {
        let args = ["show", "reservation", "-o"].map(String::from);
        self.scontrol(&args).await.map(|t| parse_reservations(&t))
    }

    /// Queues for release the reservations of earlier runs of this adapter (same source:
    /// names start with its family, but not with this run's prefix) and tries them at once.
    /// When Slurm cannot be read, the read-back loop calls this again until it can.
    async fn clean_leftovers(&self) {
        let list = match self.reservations().await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read Slurm's reservations to find what an earlier run left; trying again");
                return;
            }
        };
        {
            let mut st = self.state.lock();
            st.reconciled = true;
            let now = tokio::time::Instant::now();
            for r in list {
                if r.name.starts_with(&self.family)
                    && !r.name.starts_with(&self.prefix)
                    && !st.pending.contains_key(&r.name)
                {
                    tracing::warn!(reservation = %r.name, "releasing a reservation an earlier run of this adapter left behind");
                    st.pending.insert(
                        r.name,
                        PendingRelease {
                            res: None,
                            job: None,
                            attempts: 0,
                            next_try: now,
                        },
                    );
                }
            }
        }
        self.retry_pending().await;
    }

    /// Cancels `job` (unless done) and deletes reservation `id` in Slurm. A job Slurm no
    /// longer knows is not an error. A leftover of an earlier run (`job` unknown) has the jobs
    /// still pending in it cancelled (nobody follows them any more, and they would start
    /// unattended); one that runs keeps running, and the reservation goes when it ends.
    async fn release_in_slurm(&self, id: &str, job: Option<&str>, leftover: bool) -> Result<(), CmdError> {
        if leftover {
            let args = [format!("--reservation={id}"), "--state=PENDING".into()];
            match self.slurm.run("scancel", &args).await {
                Err(e) if e.unreachable() => return Err(e),
                _ => {}
            }
        }
        if let Some(j) = job {
            let done = self.state.lock().jobs.get(j).is_some_and(|x| x.info.done);
            if !done {
                match self.slurm.run("scancel", &[j.to_string()]).await {
                    Err(e) if e.unreachable() => return Err(e),
                    // Already ended or unknown to Slurm: nothing to cancel.
                    _ => {}
                }
            }
        }
        self.delete_until_free(id).await
    }

    /// One attempt at every pending release that is due; each that fails again waits twice
    /// as long (up to [`RETRY_MAX`]).
    async fn retry_pending(&self) {
        let now = tokio::time::Instant::now();
        let due: Vec<(String, Option<String>, bool)> = {
            let st = self.state.lock();
            st.pending
                .iter()
                .filter(|(_, p)| p.next_try <= now)
                .map(|(id, p)| (id.clone(), p.job.clone(), p.res.is_none()))
                .collect()
        };
        for (id, job, leftover) in due {
            let r = {
                let _op = self.ops.lock().await;
                self.release_in_slurm(&id, job.as_deref(), leftover).await
            };
            match r {
                Ok(()) => {
                    let done = self.state.lock().pending.remove(&id);
                    tracing::info!(reservation = %id, "pending release done");
                    if let Some(res) = done.and_then(|p| p.res) {
                        self.publish_res(&res, "released");
                    }
                }
                Err(e) => {
                    let mut st = self.state.lock();
                    if let Some(p) = st.pending.get_mut(&id) {
                        p.attempts = p.attempts.saturating_add(1);
                        p.next_try = tokio::time::Instant::now() + retry_delay(p.attempts);
                        if p.attempts.is_power_of_two() {
                            tracing::warn!(reservation = %id, attempts = p.attempts, error = %e,
                                "release still pending; retrying");
                        }
                    }
                }
            }
        }
    }

    /// Releases Slurm has not confirmed yet (reservation names), for operators and tests.
    pub fn pending_releases(&self) -> Vec<String> {
        let mut v: Vec<String> = self.state.lock().pending.keys().cloned().collect();
        v.sort();
        v
    }

    async fn delete(&self, name: &str) -> Result<(), CmdError> {
        let args = ["delete".to_string(), format!("reservation={name}")];
        self.scontrol(&args).await.map(|_| ())
    }

    fn publish_res(&self, r: &Reservation, state: &str) {
        crate::simres::publish_reservation(self.hub.as_deref(), &self.source, r, state);
    }

    fn publish_job(&self, j: &pb::BatchJob, cpus: u32) {
        publish_job(self.hub.as_deref(), &self.source, j, cpus);
    }

    fn node(&self, name: &str) -> Option<&SlurmNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The held reservation `id` of `owner`: NOT_FOUND, or PERMISSION_DENIED naming the
    /// creator, when it is not.
    fn holder_check(&self, id: &str, owner: &str, what: &str) -> Result<Reservation, Error> {
        let st = self.state.lock();
        let rule = format!(": only its creator may {what} it");
        owned_by(
            st.held.get(id),
            |h| h.res.owner.as_str(),
            "reservation",
            id,
            owner,
            &rule,
        )
        .map(|h| h.res.clone())
    }

    /// The earliest time after `start` at which what overlaps `[start, start + dur)` on
    /// `node` (reservations, jobs) has ended; None when nothing visible is in the way.
    async fn next_start(
        &self,
        node: &str,
        start: i64,
        dur: i64,
        except: &str,
    ) -> Result<Option<i64>, CmdError> {
        let mut ends: Vec<i64> = self
            .reservations()
            .await?
            .into_iter()
            .filter(|r| r.name != except && on_node(&r.nodes, node))
            .filter(|r| r.start_s < start + dur && r.end_s > start)
            .map(|r| r.end_s)
            .collect();
        let jobs = parse_squeue(&self.slurm.run("squeue", &["--json".into()]).await?)?;
        ends.extend(
            jobs.into_iter()
                .filter(|j| !job_state(&j.job_state).1 && on_node(&j.nodes, node) && j.end_time > start)
                .map(|j| j.end_time),
        );
        Ok(ends.into_iter().filter(|e| *e > start).min())
    }

    /// Checks a window and answers NEVER for what can never be granted.
    fn checked(&self, r: &ReserveRequest, now: i64) -> Result<Result<i64, Answer>, Error> {
        let (resource, cpus) = (r.resource.as_str(), r.cpus);
        if resource.is_empty() || resource.len() > 256 {
            return Err(invalid("resource: give a node name (1..=256 bytes)"));
        }
        check_window(r, now)?;
        let Some(node) = self.node(resource) else {
            return Ok(Err(Answer::Never(format!(
                "unknown resource {:?}: this Slurm adapter offers {:?}",
                clip(resource),
                self.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>()
            ))));
        };
        if cpus > node.cpus {
            return Ok(Err(Answer::Never(format!(
                "{} has {} CPUs, {cpus} asked",
                node.name, node.cpus
            ))));
        }
        if r.latest_s < now {
            return Ok(Err(Answer::Never("the start window is in the past".into())));
        }
        Ok(Ok(r.earliest_s.max(now)))
    }

    /// Creates reservation `name` at the earliest start in the window, trying after each thing
    /// in the way; the three-way answer.
    async fn place(
        &self,
        name: &str,
        node: &str,
        cpus: u32,
        duration_s: i64,
        mut start: i64,
        latest: i64,
    ) -> Result<Result<(String, SlurmReservation), Answer>, Error> {
        let what = "create the reservation";
        for _ in 0..MAX_ATTEMPTS {
            let now = now_s();
            let start_arg = if start <= now {
                "now".to_string()
            } else {
                format_time(start)
            };
            let end = start.max(now) + duration_s;
            let mut args = vec![
                "create".to_string(),
                "reservation".into(),
                format!("ReservationName={name}"),
                format!("Nodes={node}"),
                format!("Users={}", self.user),
            ];
            args.push(format!("StartTime={start_arg}"));
            args.push(format!("EndTime={}", format_time(end)));
            args.push(format!("CoreCnt={cpus}"));
            match self.scontrol(&args).await {
                Ok(_) => {
                    let got = self
                        .reservations()
                        .await
                        .map_err(|e| cmd_error("read the reservation back", &e))?
                        .into_iter()
                        .find(|r| r.name == name);
                    return match got {
                        Some(r) => Ok(Ok((name.to_string(), r))),
                        None => Err(Error::unavailable(format!(
                            "slurm accepted reservation {name} but does not list it"
                        ))),
                    };
                }
                Err(e) if e.unreachable() => return Err(cmd_error(what, &e)),
                Err(e) => {
                    let msg = e.stderr();
                    let low = msg.to_ascii_lowercase();
                    if !(low.contains("busy") || low.contains("overlaps")) {
                        return Err(cmd_error(what, &e));
                    }
                    let next = self
                        .next_start(node, start.max(now), duration_s, name)
                        .await
                        .map_err(|e| cmd_error("list what is in the way", &e))?;
                    match next {
                        Some(n) if n <= latest => start = n,
                        Some(n) => {
                            return Ok(Err(Answer::Retry {
                                from_s: n,
                                reason: msg,
                            }))
                        }
                        None => {
                            return Ok(Err(Answer::Retry {
                                from_s: start.max(now) + 60,
                                reason: msg,
                            }))
                        }
                    }
                }
            }
        }
        Ok(Err(Answer::Retry {
            from_s: start,
            reason: format!("no start found after {MAX_ATTEMPTS} tries"),
        }))
    }

    pub async fn reserve(&self, req: &pb::ReserveRequest, owner: &str) -> Result<pb::ReserveResponse, Error> {
        let now = now_s();
        let start = match self.checked(&ReserveRequest::from_reserve(req, owner), now)? {
            Ok(s) => s,
            Err(a) => return Ok(answer_to_proto(&a, false)),
        };
        if self.state.lock().held.len() >= MAX_HELD {
            return Err(Error::failed_precondition(format!(
                "this adapter holds {MAX_HELD} reservations already: release some"
            )));
        }
        let requested = Reservation {
            id: String::new(),
            resource: req.resource.clone(),
            cpus: req.cpus,
            start_s: start,
            end_s: start + req.duration_s,
            owner: owner.to_string(),
        };
        self.publish_res(&requested, "requested");
        let _op = self.ops.lock().await;
        let name = format!("{}{}", self.prefix, self.next.fetch_add(1, Ordering::Relaxed));
        let placed = self
            .place(
                &name,
                &req.resource,
                req.cpus,
                req.duration_s,
                start,
                req.latest_start_s,
            )
            .await?;
        let answer = match placed {
            Ok((name, r)) => {
                let res = Reservation {
                    id: name.clone(),
                    resource: req.resource.clone(),
                    cpus: req.cpus,
                    start_s: r.start_s,
                    end_s: r.end_s,
                    owner: owner.to_string(),
                };
                // Confirmed: Slurm reports it active (its start has come and the cores are
                // held); a later start is confirmed by the read-back loop.
                let active = r.state == "ACTIVE";
                self.state.lock().held.insert(
                    name,
                    Held {
                        res: res.clone(),
                        confirmed: active,
                        job: None,
                    },
                );
                self.publish_res(&res, "granted");
                if active {
                    self.publish_res(&res, "confirmed");
                }
                metrics::counter!("gma_slurm_reservations_total", "answer" => "granted").increment(1);
                Answer::Granted(res)
            }
            Err(a) => {
                metrics::counter!("gma_slurm_reservations_total", "answer" => "refused").increment(1);
                a
            }
        };
        Ok(answer_to_proto(&answer, false))
    }

    pub async fn modify(
        &self,
        req: &pb::ModifyReservationRequest,
        owner: &str,
    ) -> Result<pb::ReserveResponse, Error> {
        let held = self.holder_check(&req.id, owner, "modify")?;
        if self
            .state
            .lock()
            .held
            .get(&req.id)
            .is_some_and(|h| h.job.is_some())
        {
            return Err(Error::failed_precondition(format!(
                "reservation {:?} is claimed by a job: it can no longer be moved",
                clip(&req.id)
            )));
        }
        let now = now_s();
        let start = match self.checked(&ReserveRequest::from_modify(req, &held.resource, owner), now)? {
            Ok(s) => s,
            Err(a) => return Ok(answer_to_proto(&a, false)),
        };
        let _op = self.ops.lock().await;
        // Slurm refuses to update a core-based reservation ("Core-based reservation can not be
        // updated", 22.05), so a move deletes the reservation and creates it again under the
        // same name; a refused move puts the original back where it was if it still can.
        self.delete(&req.id)
            .await
            .map_err(|e| cmd_error("move the reservation (delete it first)", &e))?;
        let placed = self
            .place(
                &req.id,
                &held.resource,
                req.cpus,
                req.duration_s,
                start,
                req.latest_start_s,
            )
            .await;
        let refused = match placed {
            Ok(Ok((_, r))) => {
                let res = Reservation {
                    cpus: req.cpus,
                    start_s: r.start_s,
                    end_s: r.end_s,
                    ..held
                };
                if let Some(h) = self.state.lock().held.get_mut(&req.id) {
                    h.res = res.clone();
                }
                self.publish_res(&res, "modified");
                return Ok(answer_to_proto(&Answer::Granted(res), false));
            }
            Ok(Err(a)) => Ok(a),
            Err(e) => Err(e),
        };
        let back = held.start_s.max(now_s());
        let restored = held.end_s > back
            && matches!(
                self.place(&req.id, &held.resource, held.cpus, held.end_s - back, back, back)
                    .await,
                Ok(Ok(_))
            );
        if !restored {
            self.state.lock().held.remove(&req.id);
            self.publish_res(&held, "released");
        }
        refused.map(|a| answer_to_proto(&a, !restored))
    }

    /// Releases a reservation (its job, if any, is cancelled first). When Slurm cannot be
    /// reached the release is kept and retried until Slurm answers (the holder gets
    /// UNAVAILABLE saying so, and the reservation can no longer be modified or claimed).
    pub async fn release(&self, id: &str, owner: &str) -> Result<(), Error> {
        if let Some(res_owner) = self.pending_owner(id) {
            if res_owner != owner {
                return Err(Error::permission_denied(format!(
                    "reservation {:?} belongs to {:?}: only its creator may release it",
                    clip(id),
                    clip(&res_owner)
                )));
            }
            return Err(Error::unavailable(format!(
                "the release of reservation {:?} is pending: slurm is unreachable; the adapter retries it until slurm answers",
                clip(id)
            )));
        }
        let held = self.holder_check(id, owner, "release")?;
        let job = self.state.lock().held.get(id).and_then(|h| h.job.clone());
        let _op = self.ops.lock().await;
        match self.release_in_slurm(id, job.as_deref(), false).await {
            Ok(()) => {
                self.state.lock().held.remove(id);
                self.publish_res(&held, "released");
                Ok(())
            }
            Err(e) if e.unreachable() => {
                {
                    let mut st = self.state.lock();
                    st.held.remove(id);
                    st.pending.insert(
                        id.to_string(),
                        PendingRelease {
                            res: Some(held.clone()),
                            job,
                            attempts: 1,
                            next_try: tokio::time::Instant::now() + retry_delay(1),
                        },
                    );
                }
                self.publish_res(&held, "releasing");
                tracing::warn!(reservation = %id, error = %e, "slurm unreachable: the release is kept and retried");
                Err(Error::unavailable(format!(
                    "slurm is unreachable (delete the reservation): {e}; the release is kept and retried until slurm answers"
                )))
            }
            Err(e) => Err(cmd_error("delete the reservation", &e)),
        }
    }

    /// The creator of a reservation whose release is pending.
    fn pending_owner(&self, id: &str) -> Option<String> {
        let st = self.state.lock();
        let p = st.pending.get(id)?;
        Some(p.res.as_ref().map_or_else(String::new, |r| r.owner.clone()))
    }

    /// Deletes a reservation, waiting (bounded by the command timeout) while a job that is
    /// ending still uses it.
    async fn delete_until_free(&self, id: &str) -> Result<(), CmdError> {
        let deadline = tokio::time::Instant::now() + self.slurm.timeout;
        loop {
            match self.delete(id).await {
                Ok(()) => return Ok(()),
                Err(e) if e.stderr().contains("Invalid reservation name") => return Ok(()),
                Err(e) if e.stderr().contains("in use") && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn list(&self, req: &pb::ListReservationsRequest) -> Vec<pb::Reservation> {
        let st = self.state.lock();
        let mut out: Vec<pb::Reservation> = st
            .held
            .values()
            .map(|h| &h.res)
            .filter(|r| req.resource.is_empty() || r.resource == req.resource)
            .filter(|r| req.owner.is_empty() || r.owner == req.owner)
            .filter(|r| req.from_s == 0 || r.end_s > req.from_s)
            .filter(|r| req.to_s == 0 || r.start_s < req.to_s)
            .map(reservation_to_proto)
            .collect();
        out.sort_by(|a, b| (a.start_s, &a.id).cmp(&(b.start_s, &b.id)));
        out
    }

    /// Starts `spec` in the held reservation `id` (only its creator may), with `sbatch`.
    pub async fn claim(&self, id: &str, owner: &str, spec: &pb::BatchJobSpec) -> Result<pb::BatchJob, Error> {
        let held = self.holder_check(id, owner, "claim")?;
        if let Some(j) = self.state.lock().held.get(id).and_then(|h| h.job.clone()) {
            return Err(Error::failed_precondition(format!(
                "reservation {:?} is already claimed by job {j}",
                clip(id)
            )));
        }
        let node = self
            .node(&held.resource)
            .cloned()
            .ok_or_else(|| Error::internal(format!("reservation {id} is on an unknown node")))?;
        let now = now_s();
        let limit_s = validate_spec(spec, &held, &node, &self.software, now)?;
        let workdir = if spec.workdir.is_empty() {
            self.job_dir.clone()
        } else {
            PathBuf::from(&spec.workdir)
        };
        if !workdir.is_dir() {
            return Err(invalid(format!(
                "workdir: {} is not a directory on the resource",
                workdir.display()
            )));
        }
        if spec.disk_mb > 0.0 {
            let free = free_disk_mb(&workdir);
            if free < spec.disk_mb {
                return Err(Error::failed_precondition(format!(
                    "disk_mb: {} has {free:.0} MB free, the job needs {:.0}",
                    workdir.display(),
                    spec.disk_mb
                )));
            }
        }
        if self.state.lock().jobs.len() >= self.max_jobs {
            return Err(Error::failed_precondition(format!(
                "this adapter follows {} jobs already: wait for some to end",
                self.max_jobs
            )));
        }
        let script = self.job_dir.join(format!("{id}.sh"));
        write_script(&script, &spec.script)
            .map_err(|e| Error::internal(format!("cannot write the job script {}: {e}", script.display())))?;
        let output = workdir.join(format!("{}-%j.out", safe_name(&spec.name)));
        let mut args = vec![
            "--parsable".to_string(),
            format!("--reservation={id}"),
            format!("--job-name={}", spec.name),
            "--ntasks=1".into(),
            format!("--cpus-per-task={}", spec.cpus),
            format!("--time={}", (limit_s / 60).max(1)),
            format!("--chdir={}", workdir.display()),
            format!("--output={}", output.display()),
        ];
        if spec.memory_mb > 0.0 {
            args.push(format!("--mem={}", spec.memory_mb.ceil() as u64));
        }
        args.push(script.display().to_string());
        let _op = self.ops.lock().await;
        let out = self
            .slurm
            .run("sbatch", &args)
            .await
            .map_err(|e| cmd_error("submit the job", &e))?;
        let job_id = out.trim().split(';').next().unwrap_or("").to_string();
        if job_id.is_empty() || !job_id.chars().all(|c| c.is_ascii_digit()) {
            return Err(Error::internal(format!(
                "sbatch printed {:?}, not a job id",
                clip(out.trim())
            )));
        }
        let info = pb::BatchJob {
            job_id: job_id.clone(),
            reservation_id: id.to_string(),
            resource: held.resource.clone(),
            owner: owner.to_string(),
            name: spec.name.clone(),
            state: "pending".into(),
            done: false,
            exit_code: -1,
            signal: 0,
            reason: "submitted".into(),
            submit_s: now,
            start_s: 0,
            end_s: 0,
            output: output.display().to_string().replace("%j", &job_id),
        };
        {
            let mut st = self.state.lock();
            if let Some(h) = st.held.get_mut(id) {
                h.job = Some(job_id.clone());
            }
            st.jobs.insert(
                job_id,
                Job {
                    info: info.clone(),
                    cpus: spec.cpus,
                },
            );
        }
        self.publish_res(&held, "claimed");
        self.publish_job(&info, spec.cpus);
        Ok(info)
    }

    fn owned_job(&self, job_id: &str, owner: &str) -> Result<pb::BatchJob, Error> {
        let st = self.state.lock();
        owned_by(
            st.jobs.get(job_id),
            |j| j.info.owner.as_str(),
            "job",
            job_id,
            owner,
            "",
        )
        .map(|j| j.info.clone())
    }

    pub fn job(&self, job_id: &str, owner: &str) -> Result<pb::BatchJob, Error> {
        self.owned_job(job_id, owner)
    }

    pub async fn cancel(&self, job_id: &str, owner: &str) -> Result<pb::BatchJob, Error> {
        let j = self.owned_job(job_id, owner)?;
        if !j.done {
            self.slurm
                .run("scancel", std::slice::from_ref(&j.job_id))
                .await
                .map_err(|e| cmd_error("cancel the job", &e))?;
        }
        Ok(j)
    }

    /// One pass of the read-back loop: job states from `squeue --json`, reservations from
    /// `scontrol show reservation`; every change published. Ended jobs release their
    /// reservations.
    pub async fn tick(&self) {
        if !self.state.lock().reconciled {
            self.clean_leftovers().await;
        }
        self.retry_pending().await;
        let active: Vec<String> = {
            let st = self.state.lock();
            st.jobs
                .values()
                .filter(|j| !j.info.done)
                .map(|j| j.info.job_id.clone())
                .collect()
        };
        if !active.is_empty() {
            match self
                .slurm
                .run("squeue", &["--json".into()])
                .await
                .and_then(|t| parse_squeue(&t))
            {
                Ok(list) => {
                    let by_id: HashMap<String, _> =
                        list.into_iter().map(|j| (j.job_id.to_string(), j)).collect();
                    for id in &active {
                        match by_id.get(id) {
                            Some(q) => self.update_job(id, q),
                            None => self.vanished(id).await,
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read job states"),
            }
        }
        self.release_ended().await;
        self.forget_old();
        self.publish_slots().await;
        let any_held = !self.state.lock().held.is_empty();
        if any_held {
            // Under the operations lock: a move deletes and re-creates a reservation, and the
            // gap between must not read as a release.
            let _op = self.ops.lock().await;
            match self.reservations().await {
                Ok(list) => self.follow_reservations(&list),
                Err(e) => tracing::warn!(error = %e, "cannot read reservations"),
            }
        }
    }

    /// `rm.slots`: every `slots_poll_ms`, reads Slurm's nodes and reservations and, when the
    /// free capacity changed (or a slot length has passed since the last snapshot), publishes
    /// a new snapshot: per offered node, its CPUs (none when the node is down, drained or
    /// failing) minus every reservation on it (each reservation's CoreCnt, capped at the
    /// node's CPUs; the whole node when it has none), from now to 24 h ahead, cut at every
    /// reservation boundary and every `slot_s` (`provision::free`).
    async fn publish_slots(&self) {
        let (Some(poll), Some(hub)) = (self.slots.poll, self.hub.as_deref()) else {
            return;
        };
        if self.slots.last.lock().read_at.is_some_and(|t| t.elapsed() < poll) {
            return;
        }
        self.slots.last.lock().read_at = Some(std::time::Instant::now());
        let args = ["show", "node", "-o"].map(String::from);
        let nodes = match self.scontrol(&args).await {
            Ok(t) => parse_nodes(&t),
            Err(e) => {
                tracing::warn!(error = %e, "rm.slots: cannot read Slurm's nodes");
                return;
            }
        };
        let reservations = match self.reservations().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "rm.slots: cannot read Slurm's reservations");
                return;
            }
        };
        let caps = slot_capacities(&self.nodes, &nodes, &reservations);
        let now = now_s();
        {
            let last = self.slots.last.lock();
            let stale = last
                .published_at
                .is_none_or(|t| t.elapsed().as_secs() >= self.slots.slot_s.unsigned_abs());
            if last.caps.as_ref() == Some(&caps) && !stale {
                return;
            }
        }
        let offered: Vec<crate::provision::free::Capacity> = caps
            .iter()
            .zip(&self.slots.prices)
            .map(
                |((node, cpus, reserved), &price)| crate::provision::free::Capacity {
                    resource: node.clone(),
                    cpus: *cpus,
                    until_s: now + SLOTS_HORIZON_S,
                    reserved: reserved.clone(),
                    price,
                },
            )
            .collect();
        let slots = crate::provision::free::free_slots(now, self.slots.slot_s, &offered);
        let version = {
            let mut last = self.slots.last.lock();
            last.version += 1;
            last.caps = Some(caps);
            last.published_at = Some(std::time::Instant::now());
            last.version
        };
        let events = crate::provision::offers::snapshot_events(&self.source, now_ns(), version, slots);
        if let (_, Err(err)) = hub.publish(&events) {
            tracing::warn!(error = %err, "cannot publish rm.slots");
        }
    }

    fn update_job(&self, id: &str, q: &super::command::SqueueJob) {
        let (state, done) = job_state(&q.job_state);
        let (exit_code, signal) = match (done, q.exit_code) {
            (true, Some(s)) => exit_of(s),
            (true, None) => (-1, 0),
            _ => (-1, 0),
        };
        let changed = {
            let mut st = self.state.lock();
            let Some(j) = st.jobs.get_mut(id) else { return };
            let reason = if q.state_reason.is_empty() || q.state_reason == "None" {
                q.job_state.clone()
            } else {
                format!("{} ({})", q.job_state, q.state_reason)
            };
            let new = pb::BatchJob {
                state: state.into(),
                done,
                exit_code,
                signal,
                reason,
                submit_s: if q.submit_time > 0 {
                    q.submit_time
                } else {
                    j.info.submit_s
                },
                start_s: if state == "pending" { 0 } else { q.start_time },
                end_s: if done { q.end_time } else { 0 },
                ..j.info.clone()
            };
            if new.state != j.info.state || new.done != j.info.done {
                j.info = new.clone();
                Some((new, j.cpus))
            } else {
                j.info = new;
                None
            }
        };
        if let Some((info, cpus)) = changed {
            self.publish_job(&info, cpus);
        }
    }

    /// A job Slurm no longer lists (forgotten after MinJobAge, or the controller lost it).
    async fn vanished(&self, id: &str) {
        let args = ["show".to_string(), "job".into(), "-o".into(), id.to_string()];
        match self.scontrol(&args).await {
            Err(e) if e.stderr().contains("Invalid job id") => {}
            _ => return,
        }
        let info = {
            let mut st = self.state.lock();
            let Some(j) = st.jobs.get_mut(id) else { return };
            j.info.state = "failed".into();
            j.info.done = true;
            j.info.reason = "the batch system no longer knows the job".into();
            j.info.end_s = now_s();
            (j.info.clone(), j.cpus)
        };
        self.publish_job(&info.0, info.1);
    }

    /// Deletes the reservations whose jobs are done.
    async fn release_ended(&self) {
        let ended: Vec<Reservation> = {
            let st = self.state.lock();
            st.held
                .values()
                .filter(|h| {
                    h.job
                        .as_ref()
                        .is_some_and(|j| st.jobs.get(j).is_some_and(|x| x.info.done))
                })
                .map(|h| h.res.clone())
                .collect()
        };
        for r in ended {
            let _op = self.ops.lock().await;
            match self.delete(&r.id).await {
                Err(e) if !e.stderr().contains("Invalid reservation name") => {
                    // Still in use while the job completes: the next pass tries again.
                    tracing::debug!(reservation = %r.id, error = %e, "cannot release yet");
                    continue;
                }
                _ => {}
            }
            if self.state.lock().held.remove(&r.id).is_some() {
                self.publish_res(&r, "released");
            }
        }
    }

    fn forget_old(&self) {
        let now = now_s();
        self.state
            .lock()
            .jobs
            .retain(|_, j| !j.info.done || j.info.end_s + FORGET_AFTER_S > now);
    }

    fn follow_reservations(&self, list: &[SlurmReservation]) {
        let now = now_s();
        let mut events = Vec::new();
        {
            let mut st = self.state.lock();
            let mut gone = Vec::new();
            for (id, h) in st.held.iter_mut() {
                match list.iter().find(|r| &r.name == id) {
                    Some(r) if r.state == "ACTIVE" && !h.confirmed => {
                        h.confirmed = true;
                        events.push((h.res.clone(), "confirmed"));
                    }
                    Some(_) => {}
                    None => {
                        gone.push(id.clone());
                        let state = if now >= h.res.end_s { "expired" } else { "released" };
                        events.push((h.res.clone(), state));
                    }
                }
            }
            for id in gone {
                st.held.remove(&id);
            }
        }
        for (r, state) in events {
            self.publish_res(&r, state);
        }
    }

    /// Cancels every job still running and deletes every reservation held (shutdown).
    pub async fn release_all(&self) {
        let held: Vec<Reservation> = self.state.lock().held.values().map(|h| h.res.clone()).collect();
        for r in held {
            if let Err(e) = self.release(&r.id, &r.owner).await {
                tracing::warn!(reservation = %r.id, error = %e, "cannot release at shutdown");
            }
        }
        // One last try at what is pending; what Slurm still holds then, the next start of this
        // adapter (same source) releases.
        let now = tokio::time::Instant::now();
        for p in self.state.lock().pending.values_mut() {
            p.next_try = now;
        }
        self.retry_pending().await;
        let left = self.pending_releases();
        if !left.is_empty() {
            tracing::warn!(reservations = ?left, "releases still pending at shutdown: the next start of this adapter releases them");
        }
    }
}

/// One offered node for `rm.slots`: its name, the CPUs usable now and the windows
/// reservations hold on it (start, end, cpus).
type NodeCapacity = (String, u32, Vec<(i64, i64, u32)>);

/// How far ahead the adapter offers slots.
const SLOTS_HORIZON_S: i64 = 86_400;

/// Per offered node (in `offered` order): its name, the CPUs usable now (0 when Slurm reports
/// it down, drained or failing, or not at all) and the windows reservations hold on it.
fn slot_capacities(
    offered: &[SlurmNode],
    now: &[SlurmNode],
    reservations: &[SlurmReservation],
) -> Vec<NodeCapacity> {
    offered
        .iter()
        .map(|n| {
            let usable = now.iter().find(|x| x.name == n.name).is_some_and(|x| {
                let st = x.state.to_ascii_uppercase();
                !["DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER"]
                    .iter()
                    .any(|bad| st.contains(bad))
            });
            let mut held: Vec<(i64, i64, u32)> = reservations
                .iter()
                .filter(|r| on_node(&r.nodes, &n.name) && r.end_s > r.start_s)
                .map(|r| {
                    let cpus = if r.cores == 0 { n.cpus } else { r.cores.min(n.cpus) };
                    (r.start_s, r.end_s, cpus)
                })
                .collect();
            held.sort_unstable();
            (n.name.clone(), if usable { n.cpus } else { 0 }, held)
        })
        .collect()
}

/// Whether a Slurm node list names `node` (a plain comma list; bracket ranges are compared
/// as written).
fn on_node(list: &str, node: &str) -> bool {
    list.split(',').any(|n| n == node)
}

/// Validates a job for a reservation; the time limit it gets (seconds).
fn validate_spec(
    spec: &pb::BatchJobSpec,
    held: &Reservation,
    node: &SlurmNode,
    software: &[String],
    now: i64,
) -> Result<i64, Error> {
    if spec.name.is_empty() || spec.name.len() > 128 || spec.name.chars().any(|c| c.is_control()) {
        return Err(invalid("job.name: 1..=128 printable characters"));
    }
    if spec.script.len() > MAX_SCRIPT {
        return Err(invalid(format!("job.script: at most {MAX_SCRIPT} bytes")));
    }
    if !spec.script.starts_with("#!") {
        return Err(invalid(
            "job.script: must start with #! and an interpreter (e.g. #!/bin/sh), as sbatch requires",
        ));
    }
    if spec.cpus == 0 || spec.cpus > held.cpus {
        return Err(invalid(format!(
            "job.cpus: must be within 1..={} (the reservation's CPUs)",
            held.cpus
        )));
    }
    if !spec.memory_mb.is_finite() || spec.memory_mb < 0.0 {
        return Err(invalid("job.memory_mb: must be a finite number >= 0"));
    }
    if node.memory_mb > 0.0 && spec.memory_mb > node.memory_mb {
        return Err(Error::failed_precondition(format!(
            "job.memory_mb: {} has {} MB, the job asks {}",
            node.name, node.memory_mb, spec.memory_mb
        )));
    }
    if !spec.disk_mb.is_finite() || spec.disk_mb < 0.0 {
        return Err(invalid("job.disk_mb: must be a finite number >= 0"));
    }
    if let Some(s) = spec.software.iter().find(|s| !software.contains(s)) {
        return Err(Error::failed_precondition(format!(
            "job.software: {:?} is not installed here (software = {software:?})",
            clip(s)
        )));
    }
    if !spec.workdir.is_empty() && !Path::new(&spec.workdir).is_absolute() {
        return Err(invalid("job.workdir: must be an absolute path"));
    }
    if spec.time_limit_s < 0 {
        return Err(invalid(
            "job.time_limit_s: must be >= 0 (0 = until the reservation ends)",
        ));
    }
    let left = held.end_s - held.start_s.max(now);
    if left < 60 {
        return Err(Error::failed_precondition(format!(
            "reservation {} has {left} s left: a job needs at least a minute (Slurm's time limits are in minutes)",
            held.id
        )));
    }
    Ok(if spec.time_limit_s == 0 {
        left
    } else {
        spec.time_limit_s.min(left)
    })
}

fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

fn write_script(path: &Path, script: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, script)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

/// Free disk (MB) of the file system holding `dir` (`df -Pk`); 0 when unknown.
fn free_disk_mb(dir: &Path) -> f64 {
    let Ok(out) = std::process::Command::new("df").arg("-Pk").arg(dir).output() else {
        return 0.0;
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> SlurmNode {
        SlurmNode {
            name: "n1".into(),
            cpus: 2,
            memory_mb: 1000.0,
            arch: "x86_64".into(),
            state: "IDLE".into(),
            partitions: "debug".into(),
        }
    }

    #[test]
    fn slot_capacities_subtract_reservations_and_offer_nothing_on_a_down_node() {
        let n2 = SlurmNode {
            name: "n2".into(),
            cpus: 4,
            ..node()
        };
        let res = |nodes: &str, cores: u32, start: i64, end: i64| SlurmReservation {
            name: "r".into(),
            start_s: start,
            end_s: end,
            nodes: nodes.into(),
            cores,
            state: "INACTIVE".into(),
        };
        let reservations = [
            res("n1", 0, 100, 200),
            res("n1,n2", 1, 300, 400),
            res("n2", 9, 500, 600),
            res("n3", 0, 0, 10),
        ];
        let down = SlurmNode {
            state: "DOWN+NOT_RESPONDING".into(),
            ..n2.clone()
        };
        let caps = slot_capacities(&[node(), n2.clone()], &[node(), down], &reservations);
        assert_eq!(
            caps,
            [
                ("n1".to_string(), 2, vec![(100, 200, 2), (300, 400, 1)]),
                ("n2".to_string(), 0, vec![(300, 400, 1), (500, 600, 4)]),
            ]
        );
        let caps = slot_capacities(std::slice::from_ref(&n2), std::slice::from_ref(&n2), &[]);
        assert_eq!(caps, [("n2".to_string(), 4, vec![])]);
    }

    fn held(start: i64, end: i64) -> Reservation {
        Reservation {
            id: "gma-x-1".into(),
            resource: "n1".into(),
            cpus: 2,
            start_s: start,
            end_s: end,
            owner: "alice".into(),
        }
    }

    #[test]
    fn pending_releases_back_off_to_a_ceiling() {
        let d: Vec<u128> = (0..10).map(|a| retry_delay(a).as_millis()).collect();
        assert_eq!(
            d,
            [200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000]
        );
        assert_eq!(retry_delay(u32::MAX), RETRY_MAX);
    }

    #[test]
    fn a_job_is_checked_against_its_reservation_and_node() {
        let spec = pb::BatchJobSpec {
            name: "j".into(),
            script: "#!/bin/sh\necho hi\n".into(),
            cpus: 1,
            ..Default::default()
        };
        let sw = vec!["python3".to_string()];
        assert_eq!(
            validate_spec(&spec, &held(100, 400), &node(), &sw, 100).unwrap(),
            300
        );
        let limited = pb::BatchJobSpec {
            time_limit_s: 120,
            ..spec.clone()
        };
        assert_eq!(
            validate_spec(&limited, &held(100, 400), &node(), &sw, 100).unwrap(),
            120
        );
        for (bad, want) in [
            (
                pb::BatchJobSpec {
                    script: "echo hi".into(),
                    ..spec.clone()
                },
                "job.script",
            ),
            (
                pb::BatchJobSpec {
                    cpus: 3,
                    ..spec.clone()
                },
                "job.cpus",
            ),
            (
                pb::BatchJobSpec {
                    memory_mb: 2000.0,
                    ..spec.clone()
                },
                "job.memory_mb",
            ),
            (
                pb::BatchJobSpec {
                    software: vec!["matlab".into()],
                    ..spec.clone()
                },
                "job.software",
            ),
            (
                pb::BatchJobSpec {
                    workdir: "rel".into(),
                    ..spec.clone()
                },
                "job.workdir",
            ),
            (
                pb::BatchJobSpec {
                    name: String::new(),
                    ..spec.clone()
                },
                "job.name",
            ),
        ] {
            let e = validate_spec(&bad, &held(100, 400), &node(), &sw, 100)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(want), "{want}: {e}");
        }
        let e = validate_spec(&spec, &held(100, 130), &node(), &sw, 100).unwrap_err();
        assert!(e.to_string().contains("at least a minute"), "{e}");
        assert!(on_node("n1,n2", "n2") && !on_node("n10", "n1"));
        assert_eq!(safe_name("a b/c"), "a_b_c");
    }
}
