//! The broker as a running GMA consumer (and producer of its decisions).
//!
//! It discovers every producer of `host.load`, `host.info`, `host.cpu`, `site.load` and
//! `net.bw.forecast` (the link bandwidth forecasts of `gma netprobe`) through the directory,
//! subscribes with the `latest` policy (a slow broker gets the newest value of each series,
//! never a backlog), and keeps the [`LiveView`]. It follows the slot offers of resource
//! managers (`rm.slots`) on a subscription of their own that loses nothing silently (a snapshot
//! is many events of one series, which `latest` would conflate) and starts from the oldest
//! events the manager still holds (its current snapshot was published before the broker came). `Select` ranks the view's current
//! snapshot with the pure [`rank()`](crate::rank::rank) — a decision never waits on a
//! producer — and `Coallocate` runs the coallocation algorithm against the resource managers
//! that publish `reservation.state` (found through the directory) or are configured. Every
//! decision is published as a `broker.decision` event from the broker's own producer, served on
//! the same endpoint as the `Broker` service.

use gma_core::Refuse;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber};
use gma_core::authz::{Action, Decision, Door};
use gma_core::event::{dbl, schema, text, EventData};
use gma_core::guard::Gate;
use gma_core::time::now_ns;
use gma_producer::{Hub, Identity, Producer};
use gma_proto::v1::{self as pb, broker_server::Broker};
use serde::Deserialize;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::coalloc::{coallocate, CoJob, CoOutcome, CoRequest, CoStats};
use crate::costart;
use crate::job::{Job, JobError, DEFAULT_EPSILON_S, DEFAULT_WINDOW_S, MAX_COALLOC_JOBS};
use crate::rank::{rank, Limits, Policy, RankConfig, Ranked, Resource, Snapshot};
use crate::remote::{reservation_to_proto, RemoteReserver};
use crate::view::{Annotation, LiveView};

/// The event a resource manager publishes for every reservation change; its producers are the
/// managers the broker coallocates with.
pub const RESERVATION_EVENT: &str = "reservation.state";
/// The broker's decision events.
pub const DECISION_EVENT: &str = "broker.decision";

/// `gma broker --config FILE`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    pub listen: String,
    /// The registration keys of the broker's record ([`gma_core::registration::Registration`]):
    /// `directory` (required: the broker's view is fed from it), `id`, `advertise`, `site`,
    /// `org`, `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    /// Source name of the decision events (and the broker's record).
    pub source: String,
    /// Event names followed into the view.
    pub follow: Vec<String>,
    pub rank: RankConfig,
    /// Static facts per host-name pattern (`[[resources]]`): price, software, site, bandwidth.
    pub resources: Vec<Annotation>,
    /// Resource-manager addresses for coallocation, in addition to the producers of
    /// `reservation.state` found in the directory.
    pub reservations: Vec<String>,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            listen: "127.0.0.1:0".into(),
            registration: Default::default(),
            source: "broker".into(),
            follow: [
                "host.load",
                "host.info",
                "host.cpu",
                "site.load",
                crate::view::NET_BW_FORECAST,
                crate::provision::offers::SLOTS_EVENT,
            ]
            .map(String::from)
            .to_vec(),
            rank: RankConfig::default(),
            resources: Vec::new(),
            reservations: Vec::new(),
            endpoint: Default::default(),
        }
    }
}

/// The broker's one error type ([`crate::error::Error`]) under the name `run` has always used.
pub use crate::error::Error as BrokerError;

/// `broker.decision`: every Select and Coallocate, with what decided it.
pub fn decision_schema() -> pb::EventSchema {
    schema(
        DECISION_EVENT,
        "a resource broker decision",
        vec![
            dbl(
                "decision_id",
                "",
                "sequence number of the decision in this broker",
            ),
            dbl("ranked", "resources", "resources that passed the filters"),
            dbl("rejected", "resources", "resources filtered out"),
            dbl(
                "stale",
                "resources",
                "resources whose data was older than the bound",
            ),
            dbl(
                "predicted_start_s",
                "s",
                "the chosen resource's predicted start (from now)",
            ),
            dbl(
                "predicted_completion_s",
                "s",
                "the chosen resource's predicted completion",
            ),
            dbl("decide_us", "us", "time spent deciding"),
            text("kind", "select or coallocate"),
            text("job", "job name(s)"),
            text("policy", "ttd, tts, utility or cost"),
            text(
                "chosen",
                "the best resource (select) or job=resource pairs (coallocate)",
            ),
            text(
                "ranking",
                "the first resources in order, with predicted completion",
            ),
            text("outcome", "ok, none, success or failed"),
            text("reason", "why, when nothing was chosen"),
        ],
    )
}

fn policy_of(p: i32) -> Result<Policy, BrokerError> {
    Ok(match pb::BrokerPolicy::try_from(p) {
        Ok(pb::BrokerPolicy::Unspecified) | Ok(pb::BrokerPolicy::Ttd) => Policy::Ttd,
        Ok(pb::BrokerPolicy::Tts) => Policy::Tts,
        Ok(pb::BrokerPolicy::Utility) => Policy::Utility,
        Ok(pb::BrokerPolicy::Cost) => Policy::Cost,
        Err(_) => {
            return Err(BrokerError::invalid_argument(format!(
                "policy: unknown policy {p}"
            )))
        }
    })
}

pub fn policy_to_proto(p: Policy) -> pb::BrokerPolicy {
    match p {
        Policy::Ttd => pb::BrokerPolicy::Ttd,
        Policy::Tts => pb::BrokerPolicy::Tts,
        Policy::Utility => pb::BrokerPolicy::Utility,
        Policy::Cost => pb::BrokerPolicy::Cost,
    }
}

fn ranked_to_proto(r: &Ranked) -> pb::RankedResource {
    pb::RankedResource {
        resource: r.resource.clone(),
        rank: r.rank,
        predicted_start_s: r.start_s,
        predicted_completion_s: r.completion_s,
        exec_s: r.exec_s,
        wait_s: r.wait_s,
        stage_in_s: r.stage_in_s,
        stage_out_s: r.stage_out_s,
        utility: r.utility,
        cost: r.cost,
        score: r.score,
        stale: r.stale,
        age_ms: r.age_ms,
        site: r.site.clone(),
    }
}

/// The shared state of the broker's RPCs.
pub struct BrokerCore {
    pub view: Arc<LiveView>,
    pub rank: RankConfig,
    hub: Arc<Hub>,
    source: String,
    next_id: AtomicU64,
    directory: Option<String>,
    reservations: Vec<String>,
}

impl BrokerCore {
    fn publish(&self, e: EventData) {
        if let (_, Err(err)) = self.hub.publish(&[e]) {
            tracing::warn!(error = %err, "cannot publish a broker decision");
        }
    }

    fn event(&self, numbers: Vec<f64>, strings: Vec<String>) -> EventData {
        EventData {
            name: DECISION_EVENT.into(),
            source: self.source.clone(),
            timestamp_ns: now_ns(),
            numbers,
            strings,
        }
    }

    /// Ranks `job` on the current view and publishes the decision.
    pub fn select(&self, job: &Job, policy: Policy, limits: Limits) -> Result<pb::SelectResponse, JobError> {
        let t0 = Instant::now();
        let snap = self.view.snapshot(now_ns());
        let ranking = rank(&snap, job, policy, &self.rank, limits)?;
        let decide_us = t0.elapsed().as_secs_f64() * 1e6;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        metrics::counter!("gma_broker_decisions_total", "kind" => "select").increment(1);
        metrics::histogram!("gma_broker_decide_seconds").record(decide_us / 1e6);
        let best = ranking.ranked.first();
        let top: Vec<String> = ranking
            .ranked
            .iter()
            .take(5)
            .map(|r| format!("{}:{:.0}", r.resource, r.completion_s))
            .collect();
        let rejected = if limits.rejected {
            ranking.rejected.len()
        } else {
            snap.resources.len().saturating_sub(ranking.ranked.len())
        };
        self.publish(self.event(
            vec![
                id as f64,
                ranking.ranked.len() as f64,
                rejected as f64,
                f64::from(ranking.stale),
                best.map_or(f64::NAN, |b| b.start_s),
                best.map_or(f64::NAN, |b| b.completion_s),
                decide_us,
            ],
            vec![
                "select".into(),
                job.name.clone(),
                policy.as_str().into(),
                best.map(|b| b.resource.clone()).unwrap_or_default(),
                top.join(","),
                if best.is_some() { "ok" } else { "none" }.into(),
                if best.is_some() {
                    String::new()
                } else {
                    "no resource passed the filters".into()
                },
            ],
        ));
        Ok(pb::SelectResponse {
            ranked: ranking.ranked.iter().map(ranked_to_proto).collect(),
            rejected: ranking
                .rejected
                .into_iter()
                .map(|r| pb::RejectedResource {
                    resource: r.resource,
                    reason: r.reason,
                })
                .collect(),
            policy: policy.as_str().into(),
            decision_id: id,
            view_resources: snap.resources.len() as u32,
            view_stale: ranking.stale,
            decide_us,
        })
    }

    /// The resource managers to coallocate with: configured ones plus the producers of
    /// `reservation.state` in the directory.
    async fn managers(&self) -> Result<Vec<String>, BrokerError> {
        let mut out = self.reservations.clone();
        if let Some(dir) = &self.directory {
            let unreachable = |e: gma_consumer::ConsumerError| {
                BrokerError::unavailable(format!("cannot search the directory for resource managers: {e}"))
            };
            let mut client = gma_consumer::directory::client(dir).await.map_err(unreachable)?;
            let found = gma_consumer::directory::producers(&mut client, RESERVATION_EVENT, "")
                .await
                .map_err(unreachable)?;
            for p in found {
                if !out.contains(&p.address) {
                    out.push(p.address);
                }
            }
        }
        Ok(out)
    }

    /// Coallocates `jobs` in the window and publishes the decision.
    pub async fn coallocate(
        &self,
        req: &pb::CoallocateRequest,
        owner: &str,
    ) -> Result<pb::CoallocateResponse, BrokerError> {
        let t0 = Instant::now();
        if req.jobs.is_empty() {
            return Err(BrokerError::invalid_argument("jobs: give at least one job"));
        }
        if req.jobs.len() > MAX_COALLOC_JOBS {
            return Err(BrokerError::invalid_argument(format!(
                "jobs: at most {MAX_COALLOC_JOBS} jobs"
            )));
        }
        let policy = policy_of(req.policy)?;
        let jobs = req
            .jobs
            .iter()
            .enumerate()
            .map(|(i, j)| Job::from_proto(j, &format!("jobs[{i}].")))
            .collect::<Result<Vec<_>, JobError>>()?;
        if !req.runs.is_empty() && req.runs.len() != req.jobs.len() {
            return Err(BrokerError::invalid_argument(format!(
                "runs: give one per job ({} jobs, {} runs) or none",
                req.jobs.len(),
                req.runs.len()
            )));
        }
        for (i, r) in req.runs.iter().enumerate() {
            crate::jobrun::check_run(r)
                .map_err(|(f, m)| BrokerError::invalid_argument(format!("runs[{i}].{f}: {m}")))?;
        }
        let mut names = std::collections::HashSet::new();
        for (i, j) in jobs.iter().enumerate() {
            if !names.insert(j.name.as_str()) {
                return Err(BrokerError::invalid_argument(format!(
                    "jobs[{i}].name: {:?} is used twice",
                    j.name
                )));
            }
        }
        let now_s = now_ns() / 1_000_000_000;
        let start = if req.window_start_s == 0 {
            now_s
        } else {
            req.window_start_s
        };
        let end = if req.window_end_s == 0 {
            start + DEFAULT_WINDOW_S
        } else {
            req.window_end_s
        };
        let eps = if req.epsilon_s == 0 {
            DEFAULT_EPSILON_S
        } else {
            req.epsilon_s
        };
        if end < start {
            return Err(BrokerError::invalid_argument(
                "window_end_s: must not be before window_start_s",
            ));
        }
        if !(1..=86_400).contains(&eps) {
            return Err(BrokerError::invalid_argument(
                "epsilon_s: must be within 1..=86400 seconds",
            ));
        }
        let managers = self.managers().await?;
        if managers.is_empty() {
            return Err(BrokerError::failed_precondition(
                "no resource manager: none publishes reservation.state in the directory and none is configured (reservations = [...])",
            ));
        }
        let reserver = RemoteReserver::connect(&managers)
            .await
            .map_err(|e| BrokerError::unavailable(e.to_string()))?;
        // Candidates of each job: the reservable resources that pass its requirements, in the
        // order the policy ranks them on the live view; reservable resources the view does not
        // know (no load stream) follow, by name.
        let snap = self.view.snapshot(now_ns());
        let known: HashMap<&str, &Arc<Resource>> =
            snap.resources.iter().map(|r| (r.name.as_str(), r)).collect();
        let mut co_jobs = Vec::with_capacity(jobs.len());
        for (i, j) in jobs.iter().enumerate() {
            let reservable: Vec<Resource> = reserver
                .offered()
                .iter()
                .map(|o| match known.get(o.name.as_str()) {
                    Some(r) => {
                        let mut r = Resource::clone(r);
                        r.total_cpus = f64::from(o.cpus);
                        r
                    }
                    None => {
                        let mut r = Resource::unknown(&o.name);
                        r.total_cpus = f64::from(o.cpus);
                        r.memory_mb = if o.memory_mb > 0.0 { o.memory_mb } else { f64::NAN };
                        r.arch.clone_from(&o.arch);
                        r.updated_ns = i64::MIN / 2; // no load data: ranks as stale
                        r
                    }
                })
                .collect();
            let sub = Snapshot::new(snap.now_ns, reservable);
            let cfg = RankConfig {
                stale: crate::rank::StaleMode::Conservative,
                ..self.rank.clone()
            };
            let ranking = rank(&sub, j, policy, &cfg, Limits::default())?;
            let candidates: Vec<String> = ranking.ranked.into_iter().map(|r| r.resource).collect();
            if candidates.is_empty() {
                return Err(BrokerError::failed_precondition(format!(
                    "jobs[{i}] ({}): no reservable resource meets its requirements",
                    j.name
                )));
            }
            co_jobs.push(CoJob {
                name: j.name.clone(),
                cpus: j.cpus,
                memory_mb: j.memory_mb,
                duration_s: j.walltime(),
                offset_s: j.offset_s,
                candidates,
                flexible: true,
            });
        }
        let owner = if req.owner.is_empty() {
            owner.to_string()
        } else {
            req.owner.clone()
        };
        let co = CoRequest {
            jobs: co_jobs,
            window_start_s: start,
            window_end_s: end,
            epsilon_s: eps,
            owner,
        };
        let outcome = coallocate(&co, &reserver).await.map_err(|e| {
            BrokerError::unavailable(format!("coallocation aborted (every reservation released): {e}"))
        })?;
        let job_names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        let (mut success, reservations, mut reason, stats) = match outcome {
            CoOutcome::Success { reservations, stats } => (true, reservations, String::new(), stats),
            CoOutcome::Failed { reason, stats } => (false, Vec::new(), reason, stats),
        };
        // `--submit`: start each job in its reservation and follow the set until it started.
        let (mut stage, mut spread_s, mut batch) = (String::new(), 0, Vec::new());
        if !req.runs.is_empty() {
            if success {
                let members: Vec<costart::Member> = reservations
                    .iter()
                    .zip(jobs.iter().zip(&req.runs))
                    .map(|((name, res), (j, run))| costart::Member {
                        job: name.clone(),
                        res: res.clone(),
                        offset_s: j.offset_s,
                        spec: pb::BatchJobSpec {
                            name: j.name.clone(),
                            script: run.script.clone(),
                            cpus: j.cpus,
                            memory_mb: j.memory_mb,
                            disk_mb: run.disk_mb,
                            software: j.software.clone(),
                            time_limit_s: j.walltime(),
                            workdir: run.workdir.clone(),
                        },
                    })
                    .collect();
                let started = costart::start_set(&reserver, &members, &co.owner, eps).await;
                success = started.stage == "started";
                reason = started.reason;
                stage = started.stage;
                spread_s = started.spread_s;
                batch = started.jobs;
            } else {
                stage = "reserve".into();
            }
        }
        let elapsed_ms = t0.elapsed().as_secs_f64() * 1e3;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        metrics::counter!("gma_broker_decisions_total", "kind" => "coallocate").increment(1);
        let chosen: Vec<String> = reservations
            .iter()
            .map(|(j, r)| format!("{j}={}", r.resource))
            .collect();
        let first_start = reservations.iter().map(|(_, r)| r.start_s).min();
        self.publish(self.event(
            vec![
                id as f64,
                reservations.len() as f64,
                0.0,
                0.0,
                first_start.map_or(f64::NAN, |s| (s - now_s) as f64),
                f64::NAN,
                elapsed_ms * 1e3,
            ],
            vec![
                "coallocate".into(),
                job_names.join(","),
                policy.as_str().into(),
                chosen.join(","),
                format!("iterations={}", stats.iterations),
                match (success, stage.as_str()) {
                    (true, "") => "success".to_string(),
                    (false, "") => "failed".to_string(),
                    (true, _) => format!("started (spread {spread_s} s)"),
                    (false, s) => format!("not started ({s})"),
                },
                reason.clone(),
            ],
        ));
        Ok(pb::CoallocateResponse {
            success,
            reservations: reservations
                .iter()
                .enumerate()
                .map(|(i, (j, r))| pb::CoallocatedJob {
                    job: j.clone(),
                    reservation: Some(reservation_to_proto(r)),
                    manager: reserver.manager_of(&r.resource).unwrap_or("").to_string(),
                    batch: batch.get(i).cloned().flatten(),
                })
                .collect(),
            reason,
            stats: Some(stats_to_proto(&stats)),
            elapsed_ms,
            decision_id: id,
            stage,
            spread_s,
        })
    }
}

pub fn stats_to_proto(s: &CoStats) -> pb::CoallocateStats {
    pb::CoallocateStats {
        iterations: s.iterations,
        creates: s.creates,
        failed_creates: s.failed_creates,
        modifies: s.modifies,
        failed_modifies: s.failed_modifies,
        augmentations: s.augmentations,
        failed_augmentations: s.failed_augmentations,
        releases: s.releases,
    }
}

/// Most slot offers one `View` answer carries (about 1.5 MB), the earliest managers' first.
pub const MAX_VIEW_SLOTS: usize = 16_384;

/// The doors of the `Broker` service.
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Broker/Select",
        &[Action::BrokerSelect],
        "served: a ranking and predicted times (derived, no raw value)",
    ),
    Door::policy(
        "/gma.v1.Broker/Coallocate",
        &[Action::BrokerSelect],
        "served: reservations made for the caller (owner = its CN; the broker needs admin on \
         reservation.on-behalf at the managers)",
    ),
    Door::policy(
        "/gma.v1.Broker/View",
        &[Action::BrokerSelect, Action::ProducerSubscribe],
        "PERMISSION_DENIED naming the rule: the view holds the raw values of the \
                       followed events (producer.subscribe allowed raw on each is needed)",
    ),
    Door::policy(
        "/gma.v1.Broker/RunJob",
        &[Action::BrokerSelect],
        "served: the caller's job run in a reservation made for it (owner = its CN; the broker \
         needs admin on reservation.on-behalf at the managers)",
    ),
    Door::open("/gma.v1.Broker/Version", "served (versions only, no data)"),
];

/// The `Broker` gRPC service.
pub struct BrokerService {
    pub core: Arc<BrokerCore>,
    pub gate: Arc<Gate>,
    /// The event names the view is built from: `View` is served only to identities allowed
    /// to receive each of them raw (`producer.subscribe`).
    pub follow: Vec<String>,
}

#[tonic::async_trait]
impl Broker for BrokerService {
    async fn select(&self, req: Request<pb::SelectRequest>) -> Result<Response<pb::SelectResponse>, Status> {
        self.gate.check(&req, Action::BrokerSelect, &[DECISION_EVENT])?;
        let r = req.get_ref();
        let policy = policy_of(r.policy)?;
        let spec = r
            .job
            .as_ref()
            .ok_or_else(|| BrokerError::invalid_argument("job: give the job to place"))?;
        let job = Job::from_proto(spec, "job.").map_err(BrokerError::from)?;
        let limits = Limits {
            limit: r.limit as usize,
            rejected: r.include_rejected,
        };
        self.core
            .select(&job, policy, limits)
            .map(Response::new)
            .map_err(|e| BrokerError::from(e).into())
    }

    type RunJobStream = tokio_stream::wrappers::ReceiverStream<Result<pb::RunJobUpdate, Status>>;

    async fn run_job(&self, req: Request<pb::RunJobRequest>) -> Result<Response<Self::RunJobStream>, Status> {
        let (who, _) = self.gate.check(&req, Action::BrokerSelect, &[DECISION_EVENT])?;
        let owner = if who.cn.is_empty() {
            "broker".to_string()
        } else {
            who.cn.clone()
        };
        let policy = policy_of(req.get_ref().policy)?;
        let plan = crate::jobrun::plan(req.get_ref(), policy)?;
        let managers = self.core.managers().await?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let core = self.core.clone();
        tokio::spawn(async move {
            let id = core.next_id.fetch_add(1, Ordering::Relaxed) + 1;
            let name = plan.job.name.clone();
            let snap = core.view.snapshot(now_ns());
            let t0 = Instant::now();
            let out = crate::jobrun::run(plan, &snap, &core.rank, &managers, &owner, id, tx).await;
            metrics::counter!("gma_broker_decisions_total", "kind" => "run").increment(1);
            core.publish(core.event(
                vec![
                    id as f64,
                    1.0,
                    0.0,
                    0.0,
                    f64::NAN,
                    f64::NAN,
                    t0.elapsed().as_secs_f64() * 1e6,
                ],
                vec![
                    "run".into(),
                    name,
                    policy.as_str().into(),
                    out.resource,
                    format!("job={}", out.job_id),
                    out.outcome,
                    if out.exit_code >= 0 {
                        format!("exit code {}: {}", out.exit_code, out.reason)
                    } else {
                        out.reason
                    },
                ],
            ));
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn coallocate(
        &self,
        req: Request<pb::CoallocateRequest>,
    ) -> Result<Response<pb::CoallocateResponse>, Status> {
        let (who, _) = self.gate.check(&req, Action::BrokerSelect, &[DECISION_EVENT])?;
        let owner = if who.cn.is_empty() {
            "broker".to_string()
        } else {
            who.cn.clone()
        };
        // Run to the end even if the caller goes away: a coallocation dropped half-way (or a
        // set dropped while it starts) would leave reservations and jobs nobody releases.
        let core = self.core.clone();
        let req = req.into_inner();
        tokio::spawn(async move { core.coallocate(&req, &owner).await })
            .await
            .map_err(|e| BrokerError::internal(format!("the coallocation task failed: {e}")))?
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn view(
        &self,
        req: Request<pb::BrokerViewRequest>,
    ) -> Result<Response<pb::BrokerViewResponse>, Status> {
        let (who, _) = self.gate.check(&req, Action::BrokerSelect, &[DECISION_EVENT])?;
        // The view is raw host data: whoever may not receive an event raw does not get it here.
        for name in &self.follow {
            let grant = self
                .gate
                .authorize(&who, Action::ProducerSubscribe, &[name.as_str()])?;
            if grant.decision != Decision::Allow {
                return Err(self
                    .gate
                    .summary_only(
                        &who,
                        name,
                        &grant,
                        &format!(
                            "the broker's view holds raw values of {name}; subscribe to its summaries \
                         instead (gma subscribe {name} --summary 1m)"
                        ),
                    )
                    .into());
            }
        }
        let now = now_ns();
        let snap = self.core.view.snapshot(now);
        let max_age = self.core.rank.max_age_ms;
        Ok(Response::new(pb::BrokerViewResponse {
            resources: snap
                .resources
                .iter()
                .map(|r| {
                    let age_ms = r.age_ms(now);
                    pb::ViewedResource {
                        resource: r.name.clone(),
                        producer: r.producer.clone(),
                        total_cpus: r.total_cpus,
                        free_cpus: r.free_cpus,
                        load1: r.load1,
                        queue_waiting: r.queue_waiting,
                        memory_mb: r.memory_mb,
                        arch: r.arch.clone(),
                        os: r.os.clone(),
                        benchmarks: r.benchmarks.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                        bandwidth_mbps: r.bandwidth_mbps,
                        cost_per_cpu_hour: r.cost_per_cpu_hour,
                        age_ms,
                        stale: age_ms > max_age,
                        site: r.site.clone(),
                    }
                })
                .collect(),
            max_age_ms: max_age,
            slots: self
                .core
                .view
                .slot_offers(now / 1_000_000_000)
                .into_iter()
                .flat_map(|o| {
                    let age_ms = u64::try_from(now.saturating_sub(o.published_ns) / 1_000_000).unwrap_or(0);
                    o.slots.into_iter().map(move |s| pb::ViewedSlot {
                        manager: o.manager.clone(),
                        address: o.address.clone(),
                        version: o.version,
                        slot: s.id,
                        resource: s.resource,
                        start_s: s.start_s,
                        end_s: s.end_s,
                        processors: s.processors,
                        price: s.price,
                        age_ms,
                    })
                })
                .take(MAX_VIEW_SLOTS)
                .collect(),
        }))
    }

    async fn version(
        &self,
        _req: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        gma_core::endpoint::version("broker")
    }
}

/// Runs the broker until `shutdown`.
pub async fn run(
    config: BrokerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    config
        .rank
        .validate()
        .map_err(|e| BrokerError::Config(e.to_string()))?;
    let directory = config
        .registration
        .required_directory()
        .map_err(|e| BrokerError::Config(e.to_string()))?;
    if config.follow.is_empty() {
        return Err(BrokerError::Config("follow: give at least one event name".into()));
    }
    gma_core::pattern::event_patterns(&config.follow)
        .map_err(|e| BrokerError::Config(format!("follow: {e}")))?;
    let view =
        Arc::new(LiveView::new(config.resources.clone()).map_err(|e| BrokerError::Config(e.to_string()))?);
    let producer = Producer::embedded(
        "broker",
        &config.endpoint,
        Identity::new(&config.source, config.registration.clone()),
        &[decision_schema()],
    )
    .map_err(|e| BrokerError::Producer(e.to_string()))?;
    let core = Arc::new(BrokerCore {
        view: view.clone(),
        rank: config.rank.clone(),
        hub: producer.hub.clone(),
        source: config.source.clone(),
        next_id: AtomicU64::new(0),
        directory: Some(directory.clone()),
        reservations: config.reservations.clone(),
    });
    let (slot_patterns, load_patterns): (Vec<String>, Vec<String>) = config
        .follow
        .iter()
        .cloned()
        .partition(|p| p == crate::provision::offers::SLOTS_EVENT);
    let mut followers = Vec::new();
    if !load_patterns.is_empty() {
        let sub = Subscriber::follow(
            directory.clone(),
            StreamOptions {
                patterns: load_patterns,
                consumer_id: format!("{}-{}", config.source, std::process::id()),
                policy: pb::SlowPolicy::Latest,
                ..StreamOptions::default()
            },
        );
        followers.push(tokio::spawn(follow(view.clone(), sub)));
    }
    if !slot_patterns.is_empty() {
        let sub = Subscriber::start(
            gma_consumer::subscriber::SubscriberOptions {
                directory: directory.clone(),
                stream: StreamOptions {
                    patterns: slot_patterns,
                    consumer_id: format!("{}-slots-{}", config.source, std::process::id()),
                    policy: pb::SlowPolicy::DropOldest,
                    ..StreamOptions::default()
                },
                capacity: 256,
                default_resume: Some(gma_consumer::stream::ResumePoint {
                    epoch: 0,
                    next_seq: 1,
                }),
            },
            HashMap::new(),
        );
        followers.push(tokio::spawn(follow(view, sub)));
    }
    let service = BrokerService {
        core,
        gate: producer.gate.clone(),
        follow: config.follow.clone(),
    };
    let r = producer
        .run_with(listener, shutdown, move |services| {
            services.add_service(
                pb::broker_server::BrokerServer::new(service)
                    .max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES),
            )
        })
        .await;
    for f in followers {
        f.abort();
    }
    r.map_err(|e| BrokerError::Producer(e.to_string()))
}

/// Follows the streams of `sub` into the view until aborted.
async fn follow(view: Arc<LiveView>, mut sub: Subscriber) {
    while let Some(d) = sub.recv().await {
        match d {
            Delivery::Discovered { producer, address } => view.set_address(&producer, &address),
            Delivery::Events { producer, events, .. } => {
                for e in &events {
                    view.apply(&producer, e);
                }
                metrics::counter!("gma_broker_events_total").increment(events.len() as u64);
            }
            Delivery::Gone { producer, reason } => {
                let n = view.remove_producer(&producer);
                tracing::info!(%producer, %reason, resources = n, "producer left; its resources are no longer ranked");
            }
            Delivery::Refused { producer, error } => {
                tracing::warn!(%producer, %error, "a producer refused the broker's subscription");
            }
            Delivery::Reconnecting { producer, error } => {
                // Its hosts are not in the view while this lasts (say why: an empty view
                // otherwise looks like a grid without hosts).
                tracing::warn!(%producer, %error, "the broker's stream from a producer broke; retrying");
            }
            Delivery::DirectoryRefused { error } => {
                tracing::error!(%error, "the directory refused the broker's watch: nothing to rank until it is allowed (restart then)");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn decision_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&decision_schema()),
            "broker.decision v1: decision_id double, ranked double resources, rejected double resources, stale double resources, predicted_start_s double s, predicted_completion_s double s, decide_us double us, kind string, job string, policy string, chosen string, ranking string, outcome string, reason string"
        );
    }
}
