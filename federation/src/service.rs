//! The federation endpoint of a site, running: the async shell around the [`SiteState`].
//!
//! It follows the site's `host.load` / `host.info` into a broker [`LiveView`] (exactly as the
//! broker does), serves `Federation` (other sites) and `SiteScheduler` (local users) on the
//! endpoint of its own producer, which publishes `job.state`, `site.summary` and
//! `federation.status`; keeps one outbound session per linked site (summaries and heartbeats
//! on an `Exchange` stream, the site's job events through `WatchJobs`, reconciliation with
//! `ListForwarded` on every (re)connect); and executes the manager's effects: persist first,
//! then publish, set simulated hosts' free CPUs (through the producers' `Simulator`
//! services), forward jobs, ask for start grants.
//!
//! Every call between sites names its caller in the `gma-site` header; under mTLS the
//! caller's certificate CN must be that site (else `PERMISSION_DENIED`), and the caller must be
//! a linked site.

use gma_core::Refuse;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use gma_broker::{Job, LiveView};
use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber};
use gma_core::authz::{Action, Door, Peers};
use gma_core::event::{dbl, schema, text, EventData};
use gma_core::guard::Gate;
use gma_producer::{Hub, Identity, Producer};
use gma_proto::v1::{self as pb, federation_client::FederationClient};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::config::{validate_site, FederationConfig};
use crate::site::{Effect, ForwardOutcome, Grant, Link, SessionEvent, SiteState};
use crate::store::Store;
use crate::summary::{summary_schema, Summary};

/// The header naming the calling site.
pub const SITE_HEADER: &str = "gma-site";
pub const JOB_EVENT: &str = "job.state";
pub const STATUS_EVENT: &str = "federation.status";
/// Bound on any call to another site.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The federation's one error type ([`crate::error::Error`]) under the name `run` has always
/// used.
pub use crate::error::Error as FederationError;

/// `job.state`: every state change of a job at the publishing site.
pub fn job_state_schema() -> pb::EventSchema {
    schema(
        JOB_EVENT,
        "a job state change at a federated site (gma federation)",
        vec![
            dbl("hops", "", "times the job was forwarded so far"),
            dbl("seq", "", "event sequence number of the publishing endpoint"),
            text("job", "global job id: <origin_site>/<uuid>"),
            text("origin", "the site the job was submitted to"),
            text("site", "the site that published this event"),
            text("current", "the site the job is at (or runs at)"),
            text(
                "state",
                "submitted, queued, forwarded, started, finished, failed, cancelled",
            ),
            text("host", "the host it runs on"),
            text("reason", "why (re-placed, refused, lease expired ...)"),
            text("name", "the job's name"),
        ],
    )
}

/// `federation.status`: one event per linked site (source `<site>/<peer>`).
pub fn status_schema() -> pb::EventSchema {
    schema(
        STATUS_EVENT,
        "the state of a federation link, for dashboards",
        vec![
            dbl("live", "", "1 when heard from within the session timeout"),
            dbl(
                "eligible",
                "",
                "1 when live with a fresh summary (route() may use it)",
            ),
            dbl("summary_age_ms", "ms", "age of its latest summary (NaN: none)"),
            dbl("forwarded_out", "jobs", "jobs this site forwarded there"),
            dbl("forwarded_in", "jobs", "jobs it forwarded here"),
            dbl(
                "in_flight_cpus",
                "cpus",
                "CPUs forwarded there, not yet in a summary",
            ),
            dbl("cpus_free_sum", "cpus", "free CPUs it advertises"),
            text("peer", "the linked site"),
            text("session", "connecting, up, expired, refused"),
            text("role", "peer, parent, child"),
            text("last_error", "the last session error"),
        ],
    )
}

fn job_event_data(ev: &pb::JobEvent) -> EventData {
    EventData {
        name: JOB_EVENT.into(),
        source: ev.site.clone(),
        timestamp_ns: ev.timestamp_ns,
        numbers: vec![f64::from(ev.hops), ev.seq as f64],
        strings: vec![
            ev.global_job_id.clone(),
            ev.origin_site.clone(),
            ev.site.clone(),
            ev.current_site.clone(),
            ev.state.clone(),
            ev.host.clone(),
            gma_core::clip(&ev.reason, 1024),
            ev.name.clone(),
        ],
    }
}

fn status_data(site: &str, p: &pb::PeerStatus, now: i64) -> EventData {
    EventData {
        name: STATUS_EVENT.into(),
        source: format!("{site}/{}", p.site),
        timestamp_ns: now,
        numbers: vec![
            f64::from(u8::from(p.live)),
            f64::from(u8::from(p.eligible)),
            if p.summary_age_ms < 0 {
                f64::NAN
            } else {
                p.summary_age_ms as f64
            },
            p.forwarded_out as f64,
            p.forwarded_in as f64,
            f64::from(p.in_flight_cpus),
            f64::from(p.cpus_free_sum),
        ],
        strings: vec![
            p.site.clone(),
            p.session.clone(),
            p.role.clone(),
            gma_core::clip(&p.last_error, 512),
        ],
    }
}

/// A clock that never goes back: the wall clock at start plus monotonic time since.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall: i64,
    mono: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            wall: gma_core::time::now_ns(),
            mono: Instant::now(),
        }
    }

    pub fn now(&self) -> i64 {
        self.wall + self.mono.elapsed().as_nanos().min(i64::MAX as u128 / 2) as i64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Adds the caller's site to a request.
pub fn with_site<T>(site: &str, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    if let Ok(v) = site.parse() {
        r.metadata_mut().insert(SITE_HEADER, v);
    }
    r
}

/// What a caller makes of a `ForwardJob` status.
pub fn forward_outcome(r: Result<pb::ForwardReply, Status>, retry_after_ms: u64) -> ForwardOutcome {
    match r {
        Ok(reply) => ForwardOutcome::Accepted(reply),
        Err(s) => match s.code() {
            tonic::Code::ResourceExhausted => ForwardOutcome::Busy {
                reason: s.message().to_string(),
                retry_after_ms,
            },
            tonic::Code::FailedPrecondition
            | tonic::Code::InvalidArgument
            | tonic::Code::PermissionDenied
            | tonic::Code::AlreadyExists
            | tonic::Code::NotFound
            | tonic::Code::Unauthenticated => {
                ForwardOutcome::Refused(format!("{:?}: {}", s.code(), s.message()))
            }
            _ => ForwardOutcome::Unreachable(gma_core::tls::explain(&s)),
        },
    }
}

/// The shared state of a running endpoint.
pub struct Shared {
    state: Mutex<SiteState>,
    view: Arc<LiveView>,
    hub: Arc<Hub>,
    cfg: FederationConfig,
    clock: Clock,
    producers: Mutex<HashMap<String, String>>,
    wake: Notify,
    head: watch::Sender<u64>,
    channels: Mutex<HashMap<String, Channel>>,
    outbound: Mutex<HashMap<String, watch::Sender<Option<pb::SiteSummary>>>>,
    sessions: Mutex<HashMap<String, String>>,
    store: Option<Store>,
    sim_tx: mpsc::UnboundedSender<(String, String, f64)>,
    gate: Arc<Gate>,
    /// Whether the endpoint authenticates its callers (mTLS).
    mtls: bool,
    stopping: std::sync::atomic::AtomicBool,
    /// Grid queries and reservations (`crate::grid`).
    grid: crate::grid::Grid,
}

impl Shared {
    pub fn site(&self) -> &str {
        &self.cfg.registration.site
    }

    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    pub fn config(&self) -> &FederationConfig {
        &self.cfg
    }

    /// Runs `f` on the manager under its lock, then executes the effects it produced.
    pub fn with<R>(self: &Arc<Self>, f: impl FnOnce(&mut SiteState, i64) -> R) -> R {
        let now = self.now();
        let (r, effects, dirty) = {
            let mut s = self.state.lock();
            let r = f(&mut s, now);
            (r, s.take_effects(), s.dirty())
        };
        self.apply(effects);
        if dirty {
            self.wake.notify_one();
        }
        r
    }

    fn channel(&self, endpoint: &str) -> Result<Channel, FederationError> {
        let mut g = self.channels.lock();
        if let Some(c) = g.get(endpoint) {
            return Ok(c.clone());
        }
        let ep =
            gma_core::tls::endpoint(endpoint).map_err(|e| FederationError::unavailable(e.to_string()))?;
        let c = ep.connect_lazy();
        g.insert(endpoint.to_string(), c.clone());
        Ok(c)
    }

    fn peer_endpoint(&self, site: &str) -> Option<String> {
        self.state.lock().peer(site).map(|p| p.link.endpoint.clone())
    }

    fn client(&self, site: &str) -> Result<FederationClient<Channel>, FederationError> {
        let ep = self
            .peer_endpoint(site)
            .ok_or_else(|| FederationError::unavailable(format!("{site} is not a linked site")))?;
        Ok(FederationClient::new(self.channel(&ep)?).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
    }

    fn apply(self: &Arc<Self>, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        // Persist before anything leaves the process.
        if effects.iter().any(|e| matches!(e, Effect::Persist)) {
            let saved = {
                let mut s = self.state.lock();
                s.persisted();
                s.saved()
            };
            if let Some(store) = &self.store {
                if let Err(e) = store.save(&saved) {
                    tracing::error!(error = %e, "cannot persist the federation state");
                    metrics::counter!("gma_federation_persist_errors_total").increment(1);
                }
            }
        }
        let now = self.now();
        let mut events = Vec::new();
        for e in effects {
            match e {
                Effect::Persist => {}
                Effect::Publish(ev) => {
                    metrics::counter!("gma_federation_job_events_total", "state" => ev.state.clone())
                        .increment(1);
                    events.push(job_event_data(&ev));
                }
                Effect::SetFree { host, producer, free } => {
                    let _ = self.sim_tx.send((host, producer, free));
                }
                Effect::Forward { to, req } => {
                    metrics::counter!("gma_federation_forwards_total").increment(1);
                    let me = self.clone();
                    tokio::spawn(async move {
                        let id = req.global_job_id.clone();
                        let outcome = match me.client(&to) {
                            Err(e) => ForwardOutcome::Unreachable(e.to_string()),
                            Ok(mut c) => {
                                let call = c.forward_job(with_site(me.site(), *req));
                                let r = match tokio::time::timeout(CALL_TIMEOUT, call).await {
                                    Ok(r) => r.map(Response::into_inner),
                                    Err(_) => Err(Status::deadline_exceeded("no answer")),
                                };
                                forward_outcome(r, me.cfg.summary_interval_ms)
                            }
                        };
                        if let ForwardOutcome::Unreachable(e) | ForwardOutcome::Refused(e) = &outcome {
                            tracing::info!(job = %id, to = %to, error = %e, "forward not accepted");
                        }
                        me.with(|s, now| s.forward_result(&id, &to, outcome, now));
                    });
                }
                Effect::AskStart { id, to, host } => {
                    let me = self.clone();
                    tokio::spawn(async move {
                        let (granted, reason) = match me.ask_start(&to, &id, &host).await {
                            Ok(r) => (Some(r.granted), r.reason),
                            Err(e) => (None, e.to_string()),
                        };
                        me.with(|s, now| s.start_result(&id, granted, &reason, now));
                    });
                }
                Effect::CancelRemote { id, to, reason } => {
                    let me = self.clone();
                    tokio::spawn(async move {
                        if let Ok(mut c) = me.client(&to) {
                            let call = c.cancel_job(with_site(
                                me.site(),
                                pb::CancelJobRequest {
                                    global_job_id: id.clone(),
                                    reason,
                                },
                            ));
                            if let Ok(Err(s)) = tokio::time::timeout(CALL_TIMEOUT, call).await {
                                tracing::info!(job = %id, to = %to, error = %s.message(), "cancel refused");
                            }
                        }
                    });
                }
                Effect::Summary => {
                    let (own, per_peer) = {
                        let s = self.state.lock();
                        let own = s.own_summary().cloned();
                        let links = s.links();
                        let per: Vec<(String, Option<Summary>)> = links
                            .iter()
                            .map(|l| (l.site.clone(), s.summary_for(&l.site, now)))
                            .collect();
                        (own, per)
                    };
                    let out = self.outbound.lock();
                    for (peer, sum) in per_peer {
                        if let (Some(tx), Some(sum)) = (out.get(&peer), sum) {
                            tx.send_replace(Some(sum.to_proto()));
                        }
                    }
                    if let Some(own) = own {
                        events.push(own.to_event(now));
                    }
                }
                Effect::Status(list) => {
                    for p in &list {
                        events.push(status_data(self.site(), p, now));
                    }
                }
            }
        }
        if !events.is_empty() {
            if let (_, Err(e)) = self.hub.publish(&events) {
                tracing::warn!(error = %e, "cannot publish federation events");
            }
            let head = self.state.lock().event_head();
            self.head.send_replace(head);
        }
    }

    async fn ask_start(
        self: &Arc<Self>,
        to: &str,
        id: &str,
        host: &str,
    ) -> Result<pb::ConfirmStartReply, FederationError> {
        let mut c = self.client(to)?;
        let call = c.confirm_start(with_site(
            self.site(),
            pb::ConfirmStartRequest {
                global_job_id: id.to_string(),
                host: host.to_string(),
            },
        ));
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s))
                if s.code() == tonic::Code::NotFound || s.code() == tonic::Code::FailedPrecondition =>
            {
                Ok(pb::ConfirmStartReply {
                    granted: false,
                    reason: s.message().to_string(),
                })
            }
            Ok(Err(s)) => Err(FederationError::unavailable(gma_core::tls::explain(&s))),
            Err(_) => Err(FederationError::unavailable(format!(
                "{to} did not answer within {CALL_TIMEOUT:?}"
            ))),
        }
    }

    /// The calling site of a federation request (see the module doc).
    fn caller<T>(
        &self,
        req: &Request<T>,
        op: &str,
        claimed: Option<&str>,
    ) -> Result<String, FederationError> {
        let (who, _) = self.gate.check(req, Action::Federation, &[op])?;
        let header = req
            .metadata()
            .get(SITE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let site = match (claimed, header) {
            (Some(c), Some(h)) if c != h => {
                return Err(FederationError::invalid_argument(format!(
                    "site_id {c:?} differs from the {SITE_HEADER} header {h:?}"
                )))
            }
            (Some(c), _) => c.to_string(),
            (None, Some(h)) => h,
            (None, None) => {
                return Err(FederationError::invalid_argument(format!(
                    "name the calling site in the {SITE_HEADER} header"
                )))
            }
        };
        validate_site(&site)?;
        if self.mtls && who.is_anonymous() {
            return Err(FederationError::unauthenticated("present a site certificate"));
        }
        if !who.is_anonymous() && who.cn != site {
            metrics::counter!("gma_federation_denied_total").increment(1);
            return Err(FederationError::permission_denied(format!(
                "{who} may not speak for site {site:?}: the certificate CN must be the site id"
            )));
        }
        if !self.state.lock().is_peer(&site) {
            return Err(FederationError::permission_denied(format!(
                "{site} is not a linked site of {} (gma federation add --site {site} ... at {})",
                self.site(),
                self.site()
            )));
        }
        Ok(site)
    }

    fn local<T>(&self, req: &Request<T>, op: &str) -> Result<(), FederationError> {
        self.gate.check(req, Action::Job, &[op])?;
        Ok(())
    }

    /// The status of the endpoint.
    pub fn status(&self) -> pb::FederationStatusReply {
        let now = self.now();
        let s = self.state.lock();
        let (queued, running, total) = s.counts();
        let own = s.own_summary();
        pb::FederationStatusReply {
            site: self.site().to_string(),
            epoch: s.epoch(),
            peers: s.peer_statuses(now),
            summary: own.map(Summary::to_proto),
            summary_bytes: own.map_or(0, |o| o.encoded_len() as u32),
            jobs_queued: queued,
            jobs_running: running,
            jobs_total: total,
            chain: superiors_to_wire(&s.chain(&self.cfg.superior)).superiors,
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Why a Federation door refuses (the ones whose answers need no further word).
const LINKED_ONLY: &str =
    "PERMISSION_DENIED: only linked sites (certificate CN = the site id), and a summary rule denies federation";
/// Why a SiteScheduler door refuses.
const JOB_DENIED: &str = "PERMISSION_DENIED: a summary rule denies job";

/// A door of the `Federation` service: linked sites only, `federation` on the operation.
const fn linked(door: &'static str, summary_only: &'static str) -> Door {
    Door {
        door,
        peers: Peers::LinkedSites,
        actions: &[Action::Federation],
        summary_only,
    }
}

/// The doors of a federation endpoint: `Federation` (linked sites, `federation` on the
/// operation) and `SiteScheduler` (local users, `job` on the operation), on the endpoint of its
/// own producer (`gma_producer::service::DOORS`). What a linked site receives is site summaries
/// (per resource class aggregates), never host series.
pub const DOORS: &[Door] = &[
    linked("/gma.v1.Federation/OpenSession", LINKED_ONLY),
    linked("/gma.v1.Federation/Exchange", "PERMISSION_DENIED: only linked sites (certificate CN = the site id), and a summary rule denies federation; a linked site exchanges site summaries: per resource class (arch, os) aggregates, no host series (a class of one node still shows that node's figures, at the summary period)"),
    linked("/gma.v1.Federation/ForwardJob", LINKED_ONLY),
    linked("/gma.v1.Federation/ConfirmStart", LINKED_ONLY),
    linked("/gma.v1.Federation/WatchJobs", "PERMISSION_DENIED: only linked sites (certificate CN = the site id), and a summary rule denies federation; a linked site watches its own jobs only"),
    linked("/gma.v1.Federation/CancelJob", LINKED_ONLY),
    linked("/gma.v1.Federation/ListForwarded", LINKED_ONLY),
    linked("/gma.v1.Federation/Query", "PERMISSION_DENIED: only linked sites (certificate CN = the site id), and a summary rule denies federation; a linked site's query is answered with the matching hosts of this subtree (name, arch, os, CPUs, memory, load)"),
    Door::policy("/gma.v1.SiteScheduler/Submit", &[Action::Job], JOB_DENIED),
    Door::policy("/gma.v1.SiteScheduler/Status", &[Action::Job], JOB_DENIED),
    Door::policy("/gma.v1.SiteScheduler/Cancel", &[Action::Job], JOB_DENIED),
    Door::policy("/gma.v1.SiteScheduler/List", &[Action::Job], JOB_DENIED),
    Door::policy(
        "/gma.v1.SiteScheduler/FederationStatus",
        &[Action::Job],
        "PERMISSION_DENIED: a summary rule denies job (federation.status)",
    ),
    Door::open("/gma.v1.SiteScheduler/Version", "served (versions only, no data)"),
];

/// The `Federation` service (other sites).
pub struct FederationService {
    pub shared: Arc<Shared>,
}

#[tonic::async_trait]
impl pb::federation_server::Federation for FederationService {
    async fn open_session(&self, req: Request<pb::Hello>) -> Result<Response<pb::Welcome>, Status> {
        let sh = &self.shared;
        let hello = req.get_ref().clone();
        let site = sh.caller(&req, "session", Some(&hello.site_id))?;
        let hb = if hello.heartbeat_ms == 0 {
            sh.cfg.heartbeat_ms
        } else {
            u64::from(hello.heartbeat_ms).clamp(10, sh.cfg.heartbeat_ms)
        };
        let id = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        sh.sessions.lock().insert(id.clone(), site.clone());
        let (last_epoch, last_seq) = sh.with(|s, now| {
            s.heard(&site, now);
            s.last_summary_of(&site)
        });
        tracing::info!(%site, session = %id, "federation session opened");
        Ok(Response::new(pb::Welcome {
            session_id: id,
            site_id: sh.site().to_string(),
            epoch: sh.state.lock().epoch(),
            heartbeat_ms: hb as u32,
            summary_interval_ms: sh.cfg.summary_interval_ms.min(u64::from(u32::MAX)) as u32,
            last_epoch,
            last_seq,
            directory: sh.cfg.registration.directory.clone().unwrap_or_default(),
        }))
    }

    type ExchangeStream = BoxStream<pb::Frame>;

    async fn exchange(
        &self,
        req: Request<tonic::Streaming<pb::Frame>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let sh = self.shared.clone();
        let site = sh.caller(&req, "session", None)?;
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| FederationError::invalid_argument("the stream ended before its Attach frame"))?;
        let Some(pb::frame::Kind::Attach(a)) = first.kind else {
            return Err(
                FederationError::invalid_argument("the first frame must be Attach{session_id}").into(),
            );
        };
        if sh.sessions.lock().get(&a.session_id) != Some(&site) {
            return Err(FederationError::not_found(format!(
                "no session {:?} of {site}: call OpenSession first",
                gma_core::clip(&a.session_id, 64)
            ))
            .into());
        }
        let (tx, rx) = mpsc::channel::<Result<pb::Frame, Status>>(16);
        let hb = Duration::from_millis(sh.cfg.heartbeat_ms);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(hb);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // What this site last told the caller of its superiors (sent on change).
            let mut told: Option<Vec<crate::site::Superior>> = None;
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let now_told = sh.state.lock().superiors_to_tell(&sh.cfg.superior);
                        if told.as_ref() != Some(&now_told) {
                            let f = pb::Frame { kind: Some(pb::frame::Kind::Superiors(superiors_to_wire(&now_told))) };
                            if tx.send(Ok(f)).await.is_err() {
                                break;
                            }
                            told = Some(now_told);
                        }
                        let f = pb::Frame { kind: Some(pb::frame::Kind::Heartbeat(pb::Heartbeat { now_ns: sh.now() })) };
                        if tx.send(Ok(f)).await.is_err() {
                            break;
                        }
                    }
                    m = inbound.message() => {
                        let f = match m {
                            Ok(Some(f)) => f,
                            Ok(None) | Err(_) => break,
                        };
                        match f.kind {
                            Some(pb::frame::Kind::Summary(p)) => {
                                let (epoch, seq) = (p.epoch, p.seq);
                                let r = match Summary::from_proto(&p) {
                                    Ok(s) => sh.with(|st, now| st.peer_summary(&site, s, now)),
                                    Err(e) => Err(e),
                                };
                                match r {
                                    Ok(_) => {
                                        metrics::counter!("gma_federation_summaries_received_total").increment(1);
                                        let ack = pb::Frame { kind: Some(pb::frame::Kind::Ack(pb::Ack { epoch, seq })) };
                                        let _ = tx.try_send(Ok(ack));
                                    }
                                    Err(e) => {
                                        tracing::warn!(%site, error = %e, "summary refused");
                                        let _ = tx.send(Err(FederationError::invalid_argument(format!("summary: {e}")).into())).await;
                                        break;
                                    }
                                }
                            }
                            Some(pb::frame::Kind::Withdraw(w)) => {
                                sh.with(|st, now| st.session_event(&site, SessionEvent::Down(format!("withdrawn: {}", w.reason)), now));
                                break;
                            }
                            _ => sh.with(|st, now| st.heard(&site, now)),
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn forward_job(
        &self,
        req: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardReply>, Status> {
        let sh = &self.shared;
        let from = sh.caller(&req, "job.forward", None)?;
        let r = req.into_inner();
        let snap = sh.view.snapshot(sh.now());
        let reply = sh
            .with(|s, now| s.accept_forward(&from, &r, &snap, now))
            .map_err(FederationError::from)?;
        Ok(Response::new(reply))
    }

    async fn confirm_start(
        &self,
        req: Request<pb::ConfirmStartRequest>,
    ) -> Result<Response<pb::ConfirmStartReply>, Status> {
        let sh = self.shared.clone();
        let from = sh.caller(&req, "job.start", None)?;
        let id = req.into_inner().global_job_id;
        let mut grant = sh.with(|s, now| s.confirm_start(&from, &id, now));
        if let Grant::AskUpstream { to } = grant {
            let up = sh.ask_start(&to, &id, "").await;
            let granted = matches!(&up, Ok(r) if r.granted);
            grant = sh.with(|s, now| s.upstream_grant(&from, &id, granted, now));
        }
        Ok(Response::new(match grant {
            Grant::Yes => pb::ConfirmStartReply {
                granted: true,
                reason: String::new(),
            },
            Grant::No(r) => pb::ConfirmStartReply {
                granted: false,
                reason: r,
            },
            Grant::AskUpstream { .. } => pb::ConfirmStartReply {
                granted: false,
                reason: "no answer upstream".into(),
            },
        }))
    }

    type WatchJobsStream = BoxStream<pb::JobEvent>;

    async fn watch_jobs(
        &self,
        req: Request<pb::WatchJobsRequest>,
    ) -> Result<Response<Self::WatchJobsStream>, Status> {
        let sh = self.shared.clone();
        let from = sh.caller(&req, "job.watch", None)?;
        let mut cursor = req.get_ref().from_seq.max(1);
        let mut head = sh.head.subscribe();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            loop {
                let events = sh.state.lock().events_for(&from, cursor);
                for e in events {
                    cursor = e.seq + 1;
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    r = head.changed() => if r.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobReply>, Status> {
        let sh = &self.shared;
        let from = sh.caller(&req, "job.cancel", None)?;
        let r = req.into_inner();
        let state = sh.with(|s, now| s.cancel_from(&from, &r.global_job_id, &r.reason, now))?;
        Ok(Response::new(pb::CancelJobReply { state: state.into() }))
    }

    async fn list_forwarded(
        &self,
        req: Request<pb::ListForwardedRequest>,
    ) -> Result<Response<pb::ListForwardedReply>, Status> {
        let sh = &self.shared;
        let from = sh.caller(&req, "job.list", None)?;
        let reply = sh.with(|s, now| {
            s.heard(&from, now);
            s.list_forwarded(&from)
        });
        Ok(Response::new(reply))
    }

    async fn query(&self, req: Request<pb::GridQuery>) -> Result<Response<pb::GridAnswer>, Status> {
        let from = self.shared.caller(&req, "grid.query", None)?;
        let a = crate::grid::answer(self.shared.clone(), req.into_inner(), Some(from)).await?;
        Ok(Response::new(a))
    }
}

/// The `SiteScheduler` service (local users, operators).
pub struct SchedulerService {
    pub shared: Arc<Shared>,
}

#[tonic::async_trait]
impl pb::site_scheduler_server::SiteScheduler for SchedulerService {
    async fn submit(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobReply>, Status> {
        let sh = &self.shared;
        sh.local(&req, "submit")?;
        let r = req.into_inner();
        let spec = r
            .job
            .ok_or_else(|| FederationError::invalid_argument("job: give the job"))?;
        let job =
            Job::from_proto(&spec, "job.").map_err(|e| FederationError::invalid_argument(e.to_string()))?;
        let pin = (!r.site.is_empty()).then_some(r.site);
        let id = sh.with(|s, now| s.submit(job, pin, now))?;
        let state = sh
            .state
            .lock()
            .job(&id)
            .map_or("queued", |j| j.state.as_str())
            .to_string();
        Ok(Response::new(pb::SubmitJobReply {
            global_job_id: id,
            state,
        }))
    }

    async fn status(&self, req: Request<pb::JobStatusRequest>) -> Result<Response<pb::JobInfo>, Status> {
        let sh = &self.shared;
        sh.local(&req, "status")?;
        let id = &req.get_ref().global_job_id;
        sh.state
            .lock()
            .job(id)
            .map(|j| Response::new(j.info()))
            .ok_or_else(|| {
                FederationError::not_found(format!("no job {:?} at {}", gma_core::clip(id, 128), sh.site()))
                    .into()
            })
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobReply>, Status> {
        let sh = &self.shared;
        sh.local(&req, "cancel")?;
        let id = req.into_inner().global_job_id;
        let state = sh.with(|s, now| s.cancel(&id, now))?;
        Ok(Response::new(pb::CancelJobReply { state: state.into() }))
    }

    async fn list(&self, req: Request<pb::ListJobsRequest>) -> Result<Response<pb::ListJobsReply>, Status> {
        let sh = &self.shared;
        sh.local(&req, "list")?;
        let want = req.into_inner().state;
        let mut jobs: Vec<pb::JobInfo> = sh
            .state
            .lock()
            .jobs()
            .filter(|j| want.is_empty() || j.state.as_str() == want)
            .map(|j| j.info())
            .collect();
        jobs.sort_by(|a, b| {
            a.submitted_ns
                .cmp(&b.submitted_ns)
                .then(a.global_job_id.cmp(&b.global_job_id))
        });
        Ok(Response::new(pb::ListJobsReply { jobs }))
    }

    async fn federation_status(
        &self,
        req: Request<pb::FederationStatusRequest>,
    ) -> Result<Response<pb::FederationStatusReply>, Status> {
        self.shared.local(&req, "federation.status")?;
        Ok(Response::new(self.shared.status()))
    }

    async fn version(
        &self,
        _req: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        gma_core::endpoint::version("federation")
    }
}

/// What the grid (queries, reservations) uses of the running endpoint.
impl crate::grid::Endpoint for Shared {
    fn site(&self) -> &str {
        &self.cfg.registration.site
    }

    fn now(&self) -> i64 {
        self.clock.now()
    }

    fn grid(&self) -> &crate::grid::Grid {
        &self.grid
    }

    fn live(&self) -> gma_broker::Snapshot {
        self.view.snapshot(self.clock.now())
    }

    fn links(&self) -> Vec<Link> {
        self.state.lock().links()
    }

    fn rank(&self) -> &gma_broker::RankConfig {
        &self.cfg.rank
    }

    fn time_scale(&self) -> f64 {
        self.cfg.time_scale
    }

    fn gate(&self) -> &Gate {
        &self.gate
    }

    async fn query_site(
        &self,
        site: &str,
        q: pb::GridQuery,
        timeout: Duration,
    ) -> Result<pb::GridAnswer, FederationError> {
        let mut c = self.client(site)?;
        match tokio::time::timeout(timeout, c.query(with_site(self.site(), q))).await {
            Ok(Ok(a)) => Ok(a.into_inner()),
            Ok(Err(s)) => {
                let m = format!("{:?}: {}", s.code(), gma_core::tls::explain(&s));
                Err(gma_core::Refusal::new(s.code(), m).into())
            }
            Err(_) => Err(FederationError::unavailable(format!(
                "no answer within {timeout:?}"
            ))),
        }
    }

    fn submit(self: &Arc<Self>, job: Job) -> Result<String, FederationError> {
        self.with(|s, now| s.submit(job, None, now))
    }
}

fn superiors_to_wire(list: &[crate::site::Superior]) -> pb::Superiors {
    pb::Superiors {
        superiors: list
            .iter()
            .map(|s| pb::SuperiorRef {
                site: s.site.clone(),
                endpoint: s.endpoint.clone(),
                directory: s.directory.clone(),
            })
            .collect(),
    }
}

/// A parent's `Superiors` frame, each entry checked like a configured `[[superior]]`.
fn superiors_from_wire(t: &pb::Superiors, me: &str) -> Result<Vec<crate::site::Superior>, FederationError> {
    if t.superiors.len() > crate::site::MAX_TOLD {
        return Err(FederationError::invalid_argument(format!(
            "superiors: at most {} entries, got {}",
            crate::site::MAX_TOLD,
            t.superiors.len()
        )));
    }
    let mut out = Vec::with_capacity(t.superiors.len());
    for (i, r) in t.superiors.iter().enumerate() {
        let s = crate::site::Superior {
            site: r.site.clone(),
            endpoint: r.endpoint.clone(),
            directory: r.directory.clone(),
        };
        match crate::config::validate_superior(&s, me) {
            Ok(()) => out.push(s),
            // The chain may lead back here (a cycle of links): skip, keep the rest.
            Err(_) if s.site == me => {}
            Err(e) => return Err(FederationError::invalid_argument(format!("superiors[{i}]: {e}"))),
        }
    }
    Ok(out)
}

/// One outbound session to `link.site`, re-opened with backoff until aborted.
async fn session(sh: Arc<Shared>, link: Link, mut summaries: watch::Receiver<Option<pb::SiteSummary>>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if sh.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        let err = session_once(&sh, &link, &mut summaries).await;
        let refused = err.starts_with("refused:");
        sh.with(|s, now| {
            s.session_event(
                &link.site,
                if refused {
                    SessionEvent::Refused(err.clone())
                } else {
                    SessionEvent::Down(err.clone())
                },
                now,
            )
        });
        tracing::debug!(peer = %link.site, error = %err, "federation session ended");
        if started.elapsed() > Duration::from_secs(5) {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        let cap = Duration::from_millis(sh.cfg.heartbeat_ms.clamp(100, 2_000));
        backoff = (backoff * 2).min(cap);
    }
}

async fn session_once(
    sh: &Arc<Shared>,
    link: &Link,
    summaries: &mut watch::Receiver<Option<pb::SiteSummary>>,
) -> String {
    // A fresh connection per session: a peer that was stopped must not leave us on a dead one.
    let ch = match gma_core::tls::endpoint(&link.endpoint) {
        Ok(ep) => match tokio::time::timeout(CALL_TIMEOUT, ep.connect()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return format!(
                    "cannot connect to {}: {}",
                    link.endpoint,
                    gma_consumer::error_chain(&e)
                )
            }
            Err(_) => return format!("cannot connect to {}: timed out", link.endpoint),
        },
        Err(e) => return e.to_string(),
    };
    let mut c = FederationClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
    let me = sh.site().to_string();
    let hello = pb::Hello {
        site_id: me.clone(),
        epoch: sh.state.lock().epoch(),
        version: gma_core::SERVER_VERSION.into(),
        heartbeat_ms: sh.cfg.heartbeat_ms.min(u64::from(u32::MAX)) as u32,
        summary_interval_ms: sh.cfg.summary_interval_ms.min(u64::from(u32::MAX)) as u32,
        max_hops: sh.cfg.max_hops,
    };
    let welcome = match tokio::time::timeout(CALL_TIMEOUT, c.open_session(with_site(&me, hello))).await {
        Ok(Ok(w)) => w.into_inner(),
        Ok(Err(s))
            if matches!(
                s.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            ) =>
        {
            return format!("refused: {:?}: {}", s.code(), s.message())
        }
        Ok(Err(s)) => return format!("open session: {}", gma_core::tls::explain(&s)),
        Err(_) => return "open session: no answer".into(),
    };
    if welcome.site_id != link.site {
        return format!(
            "refused: {} answered as site {:?}, not {:?}",
            link.endpoint, welcome.site_id, link.site
        );
    }
    sh.with(|s, now| {
        s.set_directory(&link.site, &welcome.directory);
        s.session_event(&link.site, SessionEvent::Up, now)
    });
    tracing::info!(peer = %link.site, session = %welcome.session_id, "federation session up");
    // Reconcile what we forwarded there, then follow its job events from that point.
    let list = match tokio::time::timeout(
        CALL_TIMEOUT,
        c.list_forwarded(with_site(&me, pb::ListForwardedRequest {})),
    )
    .await
    {
        Ok(Ok(l)) => l.into_inner(),
        Ok(Err(s)) => return format!("list forwarded: {}", s.message()),
        Err(_) => return "list forwarded: no answer".into(),
    };
    let next_seq = list.next_seq;
    sh.with(|s, now| s.reconcile(&link.site, &list, now));
    let mut jobs = match c
        .watch_jobs(with_site(
            &me,
            pb::WatchJobsRequest {
                from_seq: next_seq,
                epoch: list.epoch,
            },
        ))
        .await
    {
        Ok(s) => s.into_inner(),
        Err(s) => return format!("watch jobs: {}", s.message()),
    };
    let (tx, rx) = mpsc::channel::<pb::Frame>(16);
    let attach = pb::Frame {
        kind: Some(pb::frame::Kind::Attach(pb::Attach {
            session_id: welcome.session_id.clone(),
        })),
    };
    let _ = tx.try_send(attach);
    let mut frames = match c.exchange(with_site(&me, ReceiverStream::new(rx))).await {
        Ok(s) => s.into_inner(),
        Err(s) => return format!("exchange: {}", s.message()),
    };
    let hb = Duration::from_millis(u64::from(welcome.heartbeat_ms.max(10)));
    let mut tick = tokio::time::interval(hb);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Resume: send the current summary unless the peer already holds it.
    let send_summary = |tx: &mpsc::Sender<pb::Frame>, s: &pb::SiteSummary| {
        metrics::counter!("gma_federation_summaries_sent_total").increment(1);
        let _ = tx.try_send(pb::Frame {
            kind: Some(pb::frame::Kind::Summary(s.clone())),
        });
    };
    if let Some(s) = summaries.borrow_and_update().clone() {
        if (s.epoch, s.seq) != (welcome.last_epoch, welcome.last_seq) {
            send_summary(&tx, &s);
        }
    }
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let f = pb::Frame { kind: Some(pb::frame::Kind::Heartbeat(pb::Heartbeat { now_ns: sh.now() })) };
                if tx.try_send(f).is_err() && tx.is_closed() {
                    return "exchange stream closed".into();
                }
            }
            r = summaries.changed() => {
                if r.is_err() {
                    return "stopped".into();
                }
                if let Some(s) = summaries.borrow_and_update().clone() {
                    send_summary(&tx, &s);
                }
            }
            f = frames.next() => match f {
                Some(Ok(pb::Frame { kind: Some(pb::frame::Kind::Superiors(t)) })) => {
                    match superiors_from_wire(&t, &me) {
                        Ok(list) => sh.with(|s, now| {
                            s.heard(&link.site, now);
                            s.told_by(&link.site, list);
                        }),
                        Err(e) => {
                            tracing::warn!(peer = %link.site, error = %e, "superiors refused");
                            sh.with(|s, now| s.heard(&link.site, now));
                        }
                    }
                }
                Some(Ok(_)) => sh.with(|s, now| s.heard(&link.site, now)),
                Some(Err(s)) => return format!("exchange: {}", gma_core::tls::explain(&s)),
                None => return "exchange ended by the peer".into(),
            },
            e = jobs.next() => match e {
                Some(Ok(ev)) => sh.with(|s, now| s.remote_event(&link.site, &ev, now)),
                Some(Err(s)) => return format!("watch jobs: {}", s.message()),
                None => return "watch jobs ended by the peer".into(),
            },
        }
    }
}

/// Starts and stops sessions to follow the set of links.
fn sync_sessions(
    sh: &Arc<Shared>,
    links: &[Link],
    running: &mut HashMap<String, (Link, tokio::task::JoinHandle<()>)>,
) {
    running.retain(|site, (link, task)| {
        let keep = links.iter().any(|l| l == link && &l.site == site);
        if !keep {
            task.abort();
            sh.outbound.lock().remove(site);
        }
        keep
    });
    for l in links {
        if running.contains_key(&l.site) || l.site == sh.site() {
            continue;
        }
        let (tx, rx) = watch::channel(None);
        let now = sh.now();
        if let Some(s) = sh.state.lock().summary_for(&l.site, now) {
            tx.send_replace(Some(s.to_proto()));
        }
        sh.outbound.lock().insert(l.site.clone(), tx);
        let task = tokio::spawn(session(sh.clone(), l.clone(), rx));
        running.insert(l.site.clone(), (l.clone(), task));
    }
}

/// Follows the host streams into the view until aborted.
async fn follow(sh: Arc<Shared>, directory: String) {
    let mut sub = Subscriber::follow(
        directory,
        StreamOptions {
            patterns: sh.cfg.follow.clone(),
            consumer_id: format!("federation-{}-{}", sh.site(), std::process::id()),
            policy: pb::SlowPolicy::Latest,
            ..StreamOptions::default()
        },
    );
    while let Some(d) = sub.recv().await {
        match d {
            Delivery::Discovered { producer, address } => {
                sh.producers.lock().insert(producer, address);
            }
            Delivery::Events { producer, events, .. } => {
                let mut changed = false;
                for e in &events {
                    changed |= sh.view.apply(&producer, e);
                }
                if changed {
                    sh.wake.notify_one();
                }
            }
            Delivery::Gone { producer, .. } => {
                sh.view.remove_producer(&producer);
                sh.wake.notify_one();
            }
            Delivery::Refused { producer, error } => {
                tracing::warn!(%producer, %error, "a producer refused the federation endpoint's subscription");
            }
            Delivery::DirectoryRefused { error } => {
                tracing::error!(%error, "the directory refused the federation endpoint's watch (allow it and restart)");
            }
            _ => {}
        }
    }
}

/// Applies simulated hosts' free CPUs, in order.
async fn setter(sh: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<(String, String, f64)>) {
    let mut clients: HashMap<String, pb::simulator_client::SimulatorClient<Channel>> = HashMap::new();
    while let Some((host, producer, free)) = rx.recv().await {
        let addr = sh.producers.lock().get(&producer).cloned();
        let ok = match addr {
            None => false,
            Some(addr) => {
                let c = match clients.get(&addr) {
                    Some(c) => Some(c.clone()),
                    None => gma_core::tls::endpoint(&addr).ok().map(|ep| {
                        let c = pb::simulator_client::SimulatorClient::new(ep.connect_lazy());
                        clients.insert(addr.clone(), c.clone());
                        c
                    }),
                };
                match c {
                    None => false,
                    Some(mut c) => {
                        let req = pb::SimSetRequest {
                            host: host.clone(),
                            values: [("free_cpus".to_string(), free)].into_iter().collect(),
                        };
                        match tokio::time::timeout(CALL_TIMEOUT, c.set(req)).await {
                            Ok(Ok(_)) => true,
                            Ok(Err(s)) => {
                                tracing::info!(%host, error = %s.message(), "host has no simulator: its jobs are virtual");
                                false
                            }
                            Err(_) => {
                                tracing::warn!(%host, "simulator did not answer");
                                true
                            }
                        }
                    }
                }
            }
        };
        sh.with(|s, now| s.set_applied(&host, ok, now));
    }
}

/// Runs the federation endpoint of a site until `shutdown`.
pub async fn run(
    cfg: FederationConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), FederationError> {
    cfg.validate()
        .map_err(|e| FederationError::Config(e.to_string()))?;
    let view =
        Arc::new(LiveView::new(cfg.resources.clone()).map_err(|e| FederationError::Config(e.to_string()))?);
    let producer = Producer::embedded(
        "federation",
        &cfg.endpoint,
        Identity {
            push: false,
            ..Identity::new(&cfg.registration.site, cfg.registration.clone())
        },
        &[job_state_schema(), summary_schema(), status_schema()],
    )
    .map_err(|e| FederationError::Producer(e.to_string()))?;
    let store = match &cfg.data {
        Some(d) => Some(Store::open(d)?),
        None => None,
    };
    let clock = Clock::new();
    let epoch = clock.now().max(1) as u64;
    let saved = match &store {
        Some(s) => s.load(&cfg.registration.site)?,
        None => None,
    };
    let mut links: Vec<Link> = cfg.peer.clone();
    let state = match saved {
        Some(saved) => {
            // A configured link removed at runtime stays removed.
            links.retain(|l| !saved.removed.contains(&l.site));
            for l in &saved.links {
                if !links.iter().any(|x| x.site == l.site) {
                    links.push(l.clone());
                }
            }
            tracing::info!(jobs = saved.jobs.len(), "federation state restored");
            SiteState::restore(cfg.params(), epoch, saved, clock.now())
        }
        None => SiteState::new(cfg.params(), epoch),
    };
    let (sim_tx, sim_rx) = mpsc::unbounded_channel();
    // What grid answers name as this endpoint: the address it listens on.
    let grid_addr = listener
        .local_addr()
        .map_or_else(|_| cfg.listen.clone(), |a| a.to_string());
    let mtls = cfg.endpoint.tls.client_ca.is_some();
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        view,
        hub: producer.hub.clone(),
        clock,
        producers: Mutex::new(HashMap::new()),
        wake: Notify::new(),
        head: watch::channel(0).0,
        channels: Mutex::new(HashMap::new()),
        outbound: Mutex::new(HashMap::new()),
        sessions: Mutex::new(HashMap::new()),
        store,
        sim_tx,
        gate: producer.gate.clone(),
        mtls,
        stopping: std::sync::atomic::AtomicBool::new(false),
        grid: crate::grid::Grid::new(grid_addr.clone(), epoch),
        cfg: cfg.clone(),
    });
    shared.with(|s, now| s.set_links(links.clone(), now));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    if let Some(dir) = cfg.registration.directory.clone() {
        tasks.push(tokio::spawn(follow(shared.clone(), dir)));
    }
    tasks.push(tokio::spawn(setter(shared.clone(), sim_rx)));
    // Links: from the directory when there is one (config and saved links are put there), else
    // the config alone.
    let (links_tx, mut links_rx) = mpsc::unbounded_channel();
    match cfg.registration.directory.clone() {
        Some(dir) => {
            tasks.push(tokio::spawn(crate::links::keep(
                dir,
                cfg.registration.site.clone(),
                links.clone(),
                cfg.registration.lease_ttl_ms,
                links_tx,
                stop_rx.clone(),
            )));
        }
        None => {
            let _ = links_tx.send(links.clone());
        }
    }
    // Every site with a directory watches its parents: its chain may be configured or told.
    if let Some(dir) = cfg.registration.directory.clone() {
        tasks.push(tokio::spawn(crate::reattach::watch(
            shared.clone(),
            dir,
            grid_addr,
        )));
    }
    {
        let sh = shared.clone();
        tasks.push(tokio::spawn(async move {
            let mut running = HashMap::new();
            while let Some(links) = links_rx.recv().await {
                sh.with(|s, now| s.set_links(links.clone(), now));
                sync_sessions(&sh, &links, &mut running);
            }
            for (_, (_, t)) in running {
                t.abort();
            }
        }));
    }
    // The manager's clock.
    {
        let sh = shared.clone();
        let tick = Duration::from_millis(cfg.tick_ms);
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = sh.wake.notified() => {}
                    _ = tokio::time::sleep(tick) => {}
                }
                let snap = sh.grid.withhold(sh.view.snapshot(sh.now()));
                sh.with(|s, now| s.step(now, &snap));
            }
        }));
    }
    let fed = FederationService {
        shared: shared.clone(),
    };
    let sched = SchedulerService {
        shared: shared.clone(),
    };
    let grid = crate::grid::GridService { ep: shared.clone() };
    let max = gma_core::MAX_MESSAGE_BYTES;
    let r = producer
        .run_with(listener, shutdown, move |services| {
            services
                .add_service(pb::federation_server::FederationServer::new(fed).max_decoding_message_size(max))
                .add_service(
                    pb::site_scheduler_server::SiteSchedulerServer::new(sched).max_decoding_message_size(max),
                )
                .add_service(pb::grid_server::GridServer::new(grid).max_decoding_message_size(max))
        })
        .await;
    let _ = stop_tx.send(true);
    shared.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    shared.outbound.lock().clear();
    for t in tasks {
        t.abort();
    }
    // Sessions are aborted with their manager task; persist a last time.
    if let Some(store) = &shared.store {
        let saved = shared.state.lock().saved();
        if let Err(e) = store.save(&saved) {
            tracing::warn!(error = %e, "cannot persist the federation state on exit");
        }
    }
    r.map_err(|e| FederationError::Producer(e.to_string()))
}

impl crate::reattach::Watched for Shared {
    fn config(&self) -> &FederationConfig {
        &self.cfg
    }

    fn site(&self) -> &str {
        &self.cfg.registration.site
    }

    fn now(&self) -> i64 {
        self.clock.now()
    }

    fn parents(self: &Arc<Self>) -> Vec<(String, bool)> {
        self.with(|s, now| s.parents(now))
    }

    fn chain(self: &Arc<Self>) -> Vec<crate::reattach::Superior> {
        self.state.lock().chain(&self.cfg.superior)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn schemas_are_pinned() {
        assert_eq!(
            gma_core::event::signature(&job_state_schema()),
            "job.state v1: hops double, seq double, job string, origin string, site string, current string, state string, host string, reason string, name string"
        );
        assert_eq!(
            gma_core::event::signature(&status_schema()),
            "federation.status v1: live double, eligible double, summary_age_ms double ms, forwarded_out double jobs, forwarded_in double jobs, in_flight_cpus double cpus, cpus_free_sum double cpus, peer string, session string, role string, last_error string"
        );
    }

    #[test]
    fn a_parent_s_superiors_frame_is_validated() {
        let r = |site: &str, ep: &str, dir: &str| pb::SuperiorRef {
            site: site.into(),
            endpoint: ep.into(),
            directory: dir.into(),
        };
        let t = |v: Vec<pb::SuperiorRef>| pb::Superiors { superiors: v };
        let ok = superiors_from_wire(&t(vec![r("g", "g:1", "g:2"), r("me", "m:1", "m:2")]), "me").unwrap();
        assert_eq!(ok.len(), 1, "the site itself is skipped");
        assert_eq!(ok[0].directory, "g:2");
        let e = superiors_from_wire(&t(vec![r("g", "g:1", "")]), "me").unwrap_err();
        assert!(e.to_string().contains("superiors[0]"), "{e}");
        assert!(superiors_from_wire(&t(vec![r("bad site!", "g:1", "g:2")]), "me").is_err());
        let many = (0..=crate::site::MAX_TOLD)
            .map(|i| r(&format!("s{i}"), "a:1", "a:2"))
            .collect();
        let e = superiors_from_wire(&t(many), "me").unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        let back = superiors_from_wire(&superiors_to_wire(&ok), "me").unwrap();
        assert_eq!(back, ok);
    }
}
