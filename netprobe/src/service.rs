//! The netprobe as a running role: a producer of `net.*` events that also serves `Probe` and
//! `Clique`, follows its clique's membership in the directory, and drives the token protocol.
//!
//! One task (the driver) owns the [`Clique`] state machine: RPC handlers, the membership
//! watcher and the tasks carrying out actions (notice rounds, probes, passes — never awaited by
//! the driver, so two members passing to each other cannot deadlock) all talk to it through
//! one channel. On shutdown a holder hands the token on before its record is removed.

use gma_core::Refuse;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gma_core::authz::{Action as AuthzAction, Door};
use gma_core::event::EventData;
use gma_core::guard::Gate;
use gma_core::pattern::Pattern;
use gma_core::registration::Registration;
use gma_core::time::now_ns;
use gma_producer::subscription::Selector;
use gma_producer::{Hub, Identity, Producer};
use gma_proto::v1::{self as pb, clique_client::CliqueClient};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::clique::{Action, Clique, PassOutcome, Token};
use crate::config::{validate_host, NetprobeConfig};
use crate::events::{self, Measurement, BW, PROBE, RTT};
use crate::membership::{self, Members};
use crate::probe::{probe_peer, Local, ProbeService, INGEST_ONLY};
use crate::telemetry::{Counters, TOKENS_DROPPED, TOKENS_REGENERATED};

/// The netprobe's one error type ([`crate::error::Error`]) under the name `run` has always used.
pub use crate::error::Error as NetprobeError;

pub fn token_to_proto(t: &Token) -> pb::CliqueToken {
    pb::CliqueToken {
        generation: t.generation,
        origin: t.origin.clone(),
        seq: t.seq,
        holder: t.holder.clone(),
    }
}

/// A token from the wire; `INVALID_ARGUMENT` naming the field when it is malformed.
pub fn token_from_proto(t: Option<pb::CliqueToken>) -> Result<Token, NetprobeError> {
    let t = t.ok_or_else(|| NetprobeError::invalid_argument("token: missing"))?;
    for (name, v) in [("token.origin", &t.origin), ("token.holder", &t.holder)] {
        if v.is_empty() || v.len() > 256 {
            return Err(NetprobeError::invalid_argument(format!(
                "{name}: a member id of 1..=256 bytes"
            )));
        }
    }
    if t.generation == 0 {
        return Err(NetprobeError::invalid_argument("token.generation: must be >= 1"));
    }
    Ok(Token {
        generation: t.generation,
        origin: t.origin,
        seq: t.seq,
        holder: t.holder,
    })
}

enum Cmd {
    Pass {
        token: Token,
        reply: oneshot::Sender<(bool, Option<Token>)>,
    },
    Notice {
        token: Token,
        reply: oneshot::Sender<Option<Token>>,
    },
    Status {
        reply: oneshot::Sender<pb::CliqueStatusResponse>,
    },
    Members(Members),
    NoticesDone {
        turn: u64,
        answers: Vec<Option<Token>>,
    },
    ProbeDone {
        turn: u64,
    },
    PassResult {
        turn: u64,
        to: String,
        outcome: PassOutcome,
    },
    Leave {
        done: oneshot::Sender<()>,
    },
}

/// Channels to peers, by address (reused across turns; forgotten after a failure).
#[derive(Default)]
struct Channels(Mutex<HashMap<String, Channel>>);

impl Channels {
    async fn get(&self, addr: &str, timeout: Duration) -> Result<Channel, NetprobeError> {
        if let Some(c) = self.0.lock().get(addr) {
            return Ok(c.clone());
        }
        let c = tokio::time::timeout(timeout, gma_consumer::connect(addr))
            .await
            .map_err(|_| NetprobeError::unavailable(format!("cannot connect to {addr}: timed out")))?
            .map_err(|e| NetprobeError::unavailable(e.to_string()))?;
        self.0.lock().insert(addr.to_string(), c.clone());
        Ok(c)
    }

    fn forget(&self, addr: &str) {
        self.0.lock().remove(addr);
    }
}

/// What the driver's helpers share.
struct Ctx {
    cfg: NetprobeConfig,
    local: Arc<Local>,
    hub: Arc<Hub>,
    site: String,
    channels: Channels,
    tx: mpsc::Sender<Cmd>,
}

impl Ctx {
    fn rpc_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.rpc_timeout_ms)
    }

    async fn clique_client(&self, addr: &str) -> Result<CliqueClient<Channel>, NetprobeError> {
        Ok(CliqueClient::new(
            self.channels.get(addr, self.rpc_timeout()).await?,
        ))
    }

    async fn notice(&self, addr: &str, token: &Token) -> Option<Token> {
        let req = pb::NoticeRequest {
            site: self.site.clone(),
            token: Some(token_to_proto(token)),
        };
        let call = async {
            let mut c = self.clique_client(addr).await?;
            c.notice(req)
                .await
                .map_err(|s| NetprobeError::unavailable(s.message().to_string()))
        };
        match tokio::time::timeout(self.rpc_timeout(), call).await {
            Ok(Ok(r)) => r.into_inner().newest.and_then(|t| token_from_proto(Some(t)).ok()),
            Ok(Err(e)) => {
                tracing::debug!(%addr, error = %e, "notice failed");
                self.channels.forget(addr);
                None
            }
            Err(_) => None,
        }
    }

    /// Passes `token` to `addr`. A pass that timed out after it was sent may have arrived: it
    /// is sent once more (a receiver accepts the same pass twice, see `Clique::on_pass`) before
    /// it counts as failed, so a slow answer does not make a duplicate token.
    async fn pass(&self, addr: Option<String>, token: &Token) -> PassOutcome {
        let Some(addr) = addr else {
            return PassOutcome::Failed;
        };
        let client = match self.clique_client(&addr).await {
            Ok(c) => c,
            Err(e) => {
                // Not connected: the pass was certainly not delivered.
                tracing::debug!(%addr, error = %e, "pass failed");
                return PassOutcome::Failed;
            }
        };
        let req = pb::PassRequest {
            site: self.site.clone(),
            token: Some(token_to_proto(token)),
            from: self.local.id.clone(),
        };
        for attempt in 0..2 {
            self.local.counters.control("pass", 1);
            let mut c = client.clone();
            match tokio::time::timeout(self.rpc_timeout(), c.pass(req.clone())).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    return if r.accepted {
                        PassOutcome::Accepted
                    } else {
                        PassOutcome::Rejected(r.newest.and_then(|t| token_from_proto(Some(t)).ok()))
                    };
                }
                Ok(Err(s)) => {
                    tracing::debug!(%addr, error = %s.message(), "pass failed");
                    self.channels.forget(&addr);
                    return PassOutcome::Failed;
                }
                Err(_) => tracing::debug!(%addr, attempt, "pass timed out"),
            }
        }
        self.channels.forget(&addr);
        PassOutcome::Failed
    }

    fn publish(&self, m: &Measurement, token: &Token) {
        if let (_, Err(e)) = self.hub.publish(&[m.event(token)]) {
            tracing::warn!(error = %e, "cannot publish a measurement");
        }
    }
}

struct Driver {
    clique: Clique,
    ctx: Arc<Ctx>,
    peers: Members,
    probe: Option<(u64, JoinHandle<()>)>,
}

impl Driver {
    fn now(&self) -> u64 {
        self.ctx.local.now_ms()
    }

    fn exec(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Notify { turn, token, to } => {
                    let ctx = self.ctx.clone();
                    let addrs: Vec<Option<String>> =
                        to.iter().map(|id| self.peers.get(id).cloned()).collect();
                    ctx.local.counters.control("notice", addrs.len() as u64);
                    tokio::spawn(async move {
                        let answers = futures::future::join_all(addrs.iter().map(|a| async {
                            match a {
                                Some(a) => ctx.notice(a, &token).await,
                                None => None,
                            }
                        }))
                        .await;
                        let _ = ctx.tx.send(Cmd::NoticesDone { turn, answers }).await;
                    });
                }
                Action::Probe { turn, token, targets } => {
                    let ctx = self.ctx.clone();
                    let targets: Vec<(String, Option<String>)> = targets
                        .into_iter()
                        .map(|id| {
                            let a = self.peers.get(&id).cloned();
                            (id, a)
                        })
                        .collect();
                    let task = tokio::spawn(async move {
                        for (id, addr) in targets {
                            let Some(addr) = addr else { continue };
                            probe_one(&ctx, &id, &addr, &token).await;
                        }
                        let _ = ctx.tx.send(Cmd::ProbeDone { turn }).await;
                    });
                    self.probe = Some((turn, task));
                }
                Action::Abort { turn } => {
                    if let Some((t, task)) = self.probe.take() {
                        if t == turn {
                            task.abort();
                            tracing::info!(turn, "token dropped as a duplicate: probe aborted");
                        } else {
                            self.probe = Some((t, task));
                        }
                    }
                }
                Action::Pass { turn, to, token } => {
                    let ctx = self.ctx.clone();
                    let addr = self.peers.get(&to).cloned();
                    tokio::spawn(async move {
                        let outcome = ctx.pass(addr, &token).await;
                        let _ = ctx.tx.send(Cmd::PassResult { turn, to, outcome }).await;
                    });
                }
            }
        }
    }

    fn status(&self) -> pb::CliqueStatusResponse {
        let now = self.now();
        let c = &self.clique;
        let st = c.stats();
        let k = &self.ctx.local.counters;
        pb::CliqueStatusResponse {
            id: c.me().to_string(),
            site: self.ctx.site.clone(),
            host: self.ctx.local.host.clone(),
            phase: c.phase().as_str().into(),
            newest: c.newest().map(token_to_proto),
            members: c.members().iter().cloned().collect(),
            turn_age_ms: if c.holding() {
                now.saturating_sub(c.turn_start_ms())
            } else {
                0
            },
            evidence_age_ms: now.saturating_sub(c.evidence_ms()),
            regenerations: st.regenerated,
            tokens_dropped: st.dropped,
            probes: k.probes(),
            probe_failures: Counters::get(&k.failures),
            skipped_budget: Counters::get(&k.skipped_budget),
            bytes_sent: Counters::get(&k.bytes_sent),
            bytes_received: Counters::get(&k.bytes_received),
        }
    }

    /// Hands the token on before leaving (bounded: one attempt per member).
    async fn leave(&mut self) {
        let mut actions = self.clique.leave(self.now());
        for _ in 0..=self.peers.len() {
            let Some(Action::Pass { turn, to, token }) =
                actions.iter().find(|a| matches!(a, Action::Pass { .. })).cloned()
            else {
                break;
            };
            if let Some((_, task)) = self.probe.take() {
                task.abort();
            }
            let outcome = self.ctx.pass(self.peers.get(&to).cloned(), &token).await;
            let accepted = outcome == PassOutcome::Accepted;
            actions = self.clique.pass_result(turn, &to, outcome, self.now());
            if accepted {
                tracing::info!(%to, "token handed on before leaving");
                break;
            }
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let (mut regenerated, mut dropped) = (0, 0);
        loop {
            let wake = self.clique.next_wakeup().map(|ms| self.ctx.local.instant_of(ms));
            let cmd = tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => Some(c),
                    None => return,
                },
                _ = async {
                    match wake {
                        Some(w) => tokio::time::sleep_until(w).await,
                        None => std::future::pending().await,
                    }
                } => None,
            };
            let now = self.now();
            let actions = match cmd {
                None => self.clique.tick(now),
                Some(Cmd::Pass { token, reply }) => {
                    let (ok, newest, actions) = self.clique.on_pass(&token, now);
                    let _ = reply.send((ok, newest));
                    actions
                }
                Some(Cmd::Notice { token, reply }) => {
                    let (newest, actions) = self.clique.on_notice(&token, now);
                    let _ = reply.send(newest);
                    actions
                }
                Some(Cmd::Status { reply }) => {
                    let _ = reply.send(self.status());
                    Vec::new()
                }
                Some(Cmd::Members(mut m)) => {
                    m.remove(self.clique.me());
                    let joined: Vec<&String> = m.keys().filter(|k| !self.peers.contains_key(*k)).collect();
                    let left: Vec<&String> = self.peers.keys().filter(|k| !m.contains_key(*k)).collect();
                    if !joined.is_empty() || !left.is_empty() {
                        tracing::info!(?joined, ?left, "clique membership changed");
                    }
                    self.clique.set_members(m.keys().cloned());
                    self.peers = m;
                    Vec::new()
                }
                Some(Cmd::NoticesDone { turn, answers }) => self.clique.notices_done(turn, &answers, now),
                Some(Cmd::ProbeDone { turn }) => {
                    if self.probe.as_ref().is_some_and(|(t, _)| *t == turn) {
                        self.probe = None;
                    }
                    self.clique.probe_done(turn);
                    Vec::new()
                }
                Some(Cmd::PassResult { turn, to, outcome }) => {
                    self.clique.pass_result(turn, &to, outcome, now)
                }
                Some(Cmd::Leave { done }) => {
                    self.leave().await;
                    let _ = done.send(());
                    return;
                }
            };
            let st = self.clique.stats();
            if st.regenerated > regenerated {
                regenerated = st.regenerated;
                metrics::counter!(TOKENS_REGENERATED).increment(1);
                tracing::info!(token = ?self.clique.newest(), "token regenerated");
            }
            if st.dropped > dropped {
                dropped = st.dropped;
                metrics::counter!(TOKENS_DROPPED).increment(1);
                tracing::info!(newest = ?self.clique.newest(), "a duplicate token was dropped");
            }
            self.exec(actions);
        }
    }
}

/// Probes one peer (bounded by `probe_timeout_ms`) and publishes what it measured.
async fn probe_one(ctx: &Ctx, id: &str, addr: &str, token: &Token) {
    let timeout = Duration::from_millis(ctx.cfg.probe_timeout_ms);
    let run = async {
        let ch = ctx.channels.get(addr, timeout).await?;
        probe_peer(&ctx.local, &ctx.cfg, ch, id, |m| ctx.publish(&m, token)).await
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            ctx.channels.forget(addr);
            tracing::info!(peer = %id, error = %e, "probe failed");
        }
        Err(_) => {
            // A fresh connection next time: nothing of this one's state is reused.
            ctx.channels.forget(addr);
            ctx.local.counters.failed(true);
            tracing::warn!(peer = %id, ?timeout, "probe abandoned after probe_timeout_ms");
        }
    }
}

/// ... and on `Clique.Status`: its counters are the raw contents of `net.probe`.
const STATUS_RAW: &str =
    "the status is the raw net.probe counters: producer.query allowed on net.probe is needed";

/// The doors of a netprobe: `Probe` (the measurements) and `Clique` (the token), on the
/// endpoint of its producer (whose doors are `gma_producer::service::DOORS`).
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Probe/Echo",
        &[AuthzAction::Ingest],
        "PERMISSION_DENIED naming the rule: taking part in the measurements is ingest of net.rtt",
    ),
    Door::policy(
        "/gma.v1.Probe/Bulk",
        &[AuthzAction::Ingest],
        "PERMISSION_DENIED naming the rule: taking part in the measurements is ingest of net.rtt",
    ),
    Door::policy(
        "/gma.v1.Clique/Pass",
        &[AuthzAction::Ingest],
        "PERMISSION_DENIED naming the rule: the token is passed between members (ingest of net.rtt)",
    ),
    Door::policy(
        "/gma.v1.Clique/Notice",
        &[AuthzAction::Ingest],
        "PERMISSION_DENIED naming the rule: the token is passed between members (ingest of net.rtt)",
    ),
    Door::policy(
        "/gma.v1.Clique/Status",
        &[AuthzAction::ProducerQuery],
        "PERMISSION_DENIED naming the rule: the counters are the raw contents of net.probe \
         (producer.query allowed on net.probe is needed)",
    ),
];

/// The `Clique` service: hands inbound messages to the driver.
struct CliqueService {
    tx: mpsc::Sender<Cmd>,
    gate: Arc<Gate>,
    site: String,
}

impl CliqueService {
    fn check_site(&self, site: &str) -> Result<(), NetprobeError> {
        if site != self.site {
            return Err(NetprobeError::failed_precondition(format!(
                "this netprobe is in clique {:?}, not {site:?}",
                self.site
            )));
        }
        Ok(())
    }

    /// The token a clique peer passes or announces (`parts` reads its site and token from the
    /// request): the caller must take part in the measurements (ingest of net.*) and be of
    /// this clique.
    fn peer_token<T>(
        &self,
        req: Request<T>,
        parts: impl FnOnce(T) -> (String, Option<pb::CliqueToken>),
    ) -> Result<Token, Status> {
        self.gate
            .check_raw(&req, AuthzAction::Ingest, &[RTT], INGEST_ONLY)?;
        let (site, token) = parts(req.into_inner());
        self.check_site(&site)?;
        Ok(token_from_proto(token)?)
    }

    async fn ask<T>(&self, cmd: Cmd, rx: oneshot::Receiver<T>) -> Result<T, NetprobeError> {
        let down = || NetprobeError::unavailable("netprobe shutting down");
        self.tx.send(cmd).await.map_err(|_| down())?;
        rx.await.map_err(|_| down())
    }
}

#[tonic::async_trait]
impl pb::clique_server::Clique for CliqueService {
    #[tracing::instrument(skip_all, level = "debug")]
    async fn pass(&self, req: Request<pb::PassRequest>) -> Result<Response<pb::PassResponse>, Status> {
        let token = self.peer_token(req, |r| (r.site, r.token))?;
        let (reply, rx) = oneshot::channel();
        let (accepted, newest) = self.ask(Cmd::Pass { token, reply }, rx).await?;
        Ok(Response::new(pb::PassResponse {
            accepted,
            newest: newest.as_ref().map(token_to_proto),
        }))
    }

    #[tracing::instrument(skip_all, level = "debug")]
    async fn notice(&self, req: Request<pb::NoticeRequest>) -> Result<Response<pb::NoticeResponse>, Status> {
        let token = self.peer_token(req, |r| (r.site, r.token))?;
        let (reply, rx) = oneshot::channel();
        let newest = self.ask(Cmd::Notice { token, reply }, rx).await?;
        Ok(Response::new(pb::NoticeResponse {
            newest: newest.as_ref().map(token_to_proto),
        }))
    }

    #[tracing::instrument(skip_all, level = "debug")]
    async fn status(
        &self,
        req: Request<pb::CliqueStatusRequest>,
    ) -> Result<Response<pb::CliqueStatusResponse>, Status> {
        self.gate
            .check_raw(&req, AuthzAction::ProducerQuery, &[PROBE], STATUS_RAW)?;
        let (reply, rx) = oneshot::channel();
        Ok(Response::new(self.ask(Cmd::Status { reply }, rx).await?))
    }
}

/// CPU seconds of this process so far (utime + stime), if /proc can tell.
fn cpu_seconds(ticks_per_s: f64) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let s = gma_sensors::agent::parse_self_stat(&text).ok()?;
    Some((s.utime + s.stime) as f64 / ticks_per_s)
}

/// Publishes `net.probe` every `report_ms`.
async fn report(ctx: Arc<Ctx>) {
    let ticks = std::fs::read("/proc/self/auxv")
        .ok()
        .and_then(|b| gma_sensors::agent::parse_auxv_clock_ticks(&b))
        .unwrap_or(gma_sensors::agent::DEFAULT_CLOCK_TICKS) as f64;
    let mut tick = tokio::time::interval(Duration::from_millis(ctx.cfg.report_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut prev: Option<(std::time::Instant, u64, Option<f64>)> = None;
    loop {
        tick.tick().await;
        let (reply, rx) = oneshot::channel();
        if ctx.tx.send(Cmd::Status { reply }).await.is_err() {
            return;
        }
        let Ok(st) = rx.await else { return };
        let bytes = st.bytes_sent + st.bytes_received;
        let cpu = cpu_seconds(ticks);
        let now = std::time::Instant::now();
        let (rate, cpu_pct) = match prev {
            Some((t, b, c)) => {
                let dt = now.duration_since(t).as_secs_f64().max(1e-9);
                let cpu_pct = match (c, cpu) {
                    (Some(a), Some(b)) => (b - a) / dt * 100.0,
                    _ => f64::NAN,
                };
                (bytes.saturating_sub(b) as f64 / dt, cpu_pct)
            }
            None => (f64::NAN, f64::NAN),
        };
        prev = Some((now, bytes, cpu));
        let k = &ctx.local.counters;
        let newest = st.newest.as_ref();
        let e = EventData {
            name: PROBE.into(),
            source: ctx.local.host.clone(),
            timestamp_ns: now_ns(),
            numbers: vec![
                st.probes as f64,
                Counters::get(&k.rtt_probes) as f64,
                Counters::get(&k.bw_probes) as f64,
                st.probe_failures as f64,
                st.skipped_budget as f64,
                st.bytes_sent as f64,
                st.bytes_received as f64,
                rate,
                Counters::get(&k.control_messages) as f64,
                cpu_pct,
                st.members.len() as f64,
                if st.phase == "idle" { 0.0 } else { 1.0 },
                newest.map_or(f64::NAN, |t| t.generation as f64),
                st.regenerations as f64,
                st.tokens_dropped as f64,
            ],
            strings: vec![
                st.site.clone(),
                newest.map(|t| t.holder.clone()).unwrap_or_default(),
            ],
        };
        if let (_, Err(e)) = ctx.hub.publish(&[e]) {
            tracing::warn!(error = %e, "cannot publish net.probe");
        }
    }
}

/// Runs the netprobe until `shutdown`.
pub async fn run(
    config: NetprobeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NetprobeError> {
    config
        .validate()
        .map_err(|e| NetprobeError::Config(e.to_string()))?;
    // The clique is found in the directory.
    let directory = config
        .registration
        .required_directory()
        .map_err(|e| NetprobeError::Config(e.to_string()))?;
    let bound = listener.local_addr()?;
    let address = config.registration.address(bound);
    let host = config.source.clone().unwrap_or_else(gma_producer::host_name);
    validate_host(&host).map_err(|e| NetprobeError::Config(e.to_string()))?;
    let id = config.registration.record_id(&host, &address);
    let producer = Producer::embedded(
        "netprobe",
        &config.endpoint,
        Identity {
            buffer_events: config.buffer_events,
            ..Identity::new(
                &host,
                Registration {
                    advertise: Some(address.clone()),
                    id: Some(id.clone()),
                    ..config.registration.clone()
                },
            )
        },
        &events::schemas(),
    )
    .map_err(|e| NetprobeError::Producer(e.to_string()))?;
    // Forecasts of every link, by the producer's forecaster: net.rtt.forecast, net.bw.forecast.
    let links = Selector {
        patterns: [RTT, BW]
            .iter()
            .map(|p| Pattern::event(p).map_err(|e| NetprobeError::Config(e.to_string())))
            .collect::<Result<_, _>>()?,
        sources: Vec::new(),
    };
    producer
        .deriver
        .activate(&producer.hub, &links, &[], true)
        .map_err(|e| NetprobeError::Producer(e.to_string()))?;

    let local = Arc::new(Local::new(&id, &host, &config));
    let (tx, rx) = mpsc::channel(256);
    let site = config.registration.site.clone();
    let ctx = Arc::new(Ctx {
        cfg: config.clone(),
        local: local.clone(),
        hub: producer.hub.clone(),
        site: site.clone(),
        channels: Channels::default(),
        tx: tx.clone(),
    });
    let driver = Driver {
        clique: Clique::new(&id, config.settings(), local.now_ms()),
        ctx: ctx.clone(),
        peers: Members::new(),
        probe: None,
    };
    let driver = tokio::spawn(driver.run(rx));
    let (mtx, mut mrx) = mpsc::channel(16);
    let watcher = tokio::spawn(membership::follow(directory, site.clone(), mtx));
    let forward = {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(m) = mrx.recv().await {
                if tx.send(Cmd::Members(m)).await.is_err() {
                    return;
                }
            }
        })
    };
    let reporter = tokio::spawn(report(ctx.clone()));
    tracing::info!(%id, %site, %host, "netprobe joining its clique");

    // On shutdown: hand the token on (bounded), then let the producer remove our record.
    let leave_timeout = Duration::from_millis(2 * config.rpc_timeout_ms + 100);
    let leave_tx = tx.clone();
    let shutdown = async move {
        shutdown.await;
        let (done, rx) = oneshot::channel();
        if leave_tx.send(Cmd::Leave { done }).await.is_ok() {
            let _ = tokio::time::timeout(leave_timeout, rx).await;
        }
    };
    let probe_svc = ProbeService {
        local,
        gate: producer.gate.clone(),
    };
    let clique_svc = CliqueService {
        tx,
        gate: producer.gate.clone(),
        site,
    };
    let max = gma_core::MAX_MESSAGE_BYTES;
    let r = producer
        .run_with(listener, shutdown, move |services| {
            services
                .add_service(pb::probe_server::ProbeServer::new(probe_svc).max_decoding_message_size(max))
                .add_service(pb::clique_server::CliqueServer::new(clique_svc).max_decoding_message_size(max))
        })
        .await;
    for t in [watcher, forward, reporter] {
        t.abort();
    }
    driver.abort();
    r.map_err(|e| NetprobeError::Producer(e.to_string()))
}
