//! The tonic `Directory` service over the replicated state machine.
//!
//! Writes: every mutation is a [`Command`] stamped with this node's clock and proposed to raft
//! (`client_write`). A follower forwards it to the leader (internal `Forward` RPC), which
//! re-stamps it with its own clock, so lease times are always the leader's. Callers never need
//! to know who leads.
//!
//! Reads: Search and GetSchema are linearizable by default: the leader confirms its leadership
//! (`ensure_linearizable`, a ReadIndex) and waits until it has applied that far; a follower
//! passes the read to the leader. `stale_ok` serves from the local state machine.
//!
//! Watch: served by any node from its own state machine. A new watcher reads its snapshot (or
//! history) and subscribes to the change broadcast under the same read lock, so nothing is
//! missed or repeated between the two; the state machine broadcasts under the write lock. A
//! watcher that lags re-reads the missed revisions from the history, so its stream stays
//! ordered, unique and gap-free (etcd's guarantees); if they were compacted it ends with
//! OUT_OF_RANGE. Revisions are the same on every node (the state machine is deterministic), so
//! a watcher can resume on any node after a failover.

use gma_core::Refuse;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gma_core::time::now_ms;
use gma_proto::v1::{self as pb, directory_server::Directory};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use gma_core::authz::{Action, Identity};

use crate::config::DirectoryConfig;
use crate::error::DirError;
use crate::raft::storage::SmShared;
use crate::raft::types::{Ack, Node, NodeId, Raft, Reply};
use crate::state::{Command, Kind, RecordFilter, SearchQuery};

/// Changes buffered for watchers before a slow one lags (and catches up from history).
pub(crate) const BROADCAST_CAPACITY: usize = 1024;
/// Events queued per watch stream.
const WATCH_BUFFER: usize = 64;
/// Responses queued per KeepAlive stream.
const KEEPALIVE_BUFFER: usize = 16;

/// Milliseconds since the Unix epoch that never go backwards: wall time at start plus a
/// monotonic elapsed time. A wall-clock step does not expire or extend leases.
pub(crate) struct Clock {
    wall_ms: u64,
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            wall_ms: now_ms(),
            start: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.wall_ms
            .saturating_add(self.start.elapsed().as_millis() as u64)
    }
}

/// The same command with its time replaced by `now_ms` (the leader stamps forwarded writes).
pub(crate) fn restamp(mut cmd: Command, now: u64) -> Command {
    set_now(&mut cmd, now);
    cmd
}

fn set_now(cmd: &mut Command, now: u64) {
    match cmd {
        Command::Register { now_ms, .. }
        | Command::Update { now_ms, .. }
        | Command::KeepAlive { now_ms, .. }
        | Command::Expire { now_ms }
        | Command::ExtendAll { now_ms } => *now_ms = now,
        Command::Remove { .. } => {}
        Command::Batch(cs) => cs.iter_mut().for_each(|c| set_now(c, now)),
    }
}

/// What every handler and background task shares.
pub(crate) struct Shared {
    pub sm: Arc<SmShared>,
    pub raft: Raft,
    /// A handle on this member's raft log (its size in memory, for snapshots by bytes).
    pub log: crate::raft::storage::LogStore,
    pub id: NodeId,
    config: DirectoryConfig,
    clock: Clock,
    stop: watch::Sender<bool>,
    closed: AtomicBool,
    /// The term in which this node, as leader, last extended every lease (0: never).
    extended_term: AtomicU64,
    /// `(term, last log index at start)` when this member led when it stopped and openraft
    /// restored it as leader in that term (see [`Shared::read_barrier`]).
    restored: Option<(u64, u64)>,
    /// Concurrent writes go to raft together (one entry, one fdatasync).
    batcher: crate::batch::Batcher,
}

/// Sends a write made for `caller` to the leader (which authorizes it again for `caller`) and
/// returns its reply.
async fn forward(leader: &Node, cmd: &Command, caller: &Identity) -> Result<Ack, DirError> {
    let data =
        serde_json::to_vec(cmd).map_err(|e| DirError::Storage(format!("cannot encode command: {e}")))?;
    let mut client = crate::raft::network::client(&leader.rpc_addr)?;
    let mut req = Request::new(gma_proto::raft::ForwardRequest {
        command: data,
        caller: Some(gma_proto::raft::Caller {
            cn: caller.cn.clone(),
            org: caller.org.clone(),
        }),
    });
    req.set_timeout(std::time::Duration::from_secs(10));
    let r = client.forward(req).await.map_err(|s| match s.code() {
        // The leader does not take this member's word (not in its [[members]]): retrying
        // does not help.
        tonic::Code::PermissionDenied | tonic::Code::InvalidArgument => DirError::permission_denied(format!(
            "the directory leader at {} refused this member's forwarded write: {}",
            leader.api_addr,
            s.message()
        )),
        _ => DirError::unavailable(format!(
            "cannot reach the directory leader at {} ({}); while no majority of members is up no write can commit: retry, and check `gma cluster status`",
            leader.api_addr,
            s.message()
        )),
    })?;
    let reply: Reply = serde_json::from_slice(&r.into_inner().reply)
        .map_err(|e| DirError::unavailable(format!("malformed reply from the leader: {e}")))?;
    reply.0
}

/// A client-facing Directory client for the leader (to pass linearizable reads on).
async fn leader_client(
    leader: &Node,
) -> Result<pb::directory_client::DirectoryClient<tonic::transport::Channel>, DirError> {
    let ch = gma_core::tls::endpoint(&leader.api_addr)
        .map_err(|e| DirError::unavailable(format!("bad leader address {}: {e}", leader.api_addr)))?
        .connect_timeout(std::time::Duration::from_secs(1))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| {
            DirError::unavailable(format!(
                "cannot reach the directory leader at {}: {e}",
                leader.api_addr
            ))
        })?;
    Ok(pb::directory_client::DirectoryClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

impl Shared {
    pub fn new(
        config: DirectoryConfig,
        id: NodeId,
        raft: Raft,
        log: crate::raft::storage::LogStore,
        sm: Arc<SmShared>,
        restored: Option<(u64, u64)>,
    ) -> Shared {
        let batcher = crate::batch::Batcher::start(raft.clone());
        Shared {
            sm,
            raft,
            log,
            id,
            config,
            clock: Clock::new(),
            stop: watch::channel(false).0,
            closed: AtomicBool::new(false),
            extended_term: AtomicU64::new(0),
            restored,
            batcher,
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Proposes a command built with the current time for the client `caller` (who was
    /// authorized for it); forwards it to the leader, in `caller`'s name, if needed.
    pub async fn write(&self, caller: &Identity, make: impl FnOnce(u64) -> Command) -> Result<Ack, DirError> {
        let cmd = make(self.clock.now_ms());
        self.propose(cmd, Some(caller)).await
    }

    /// Proposes `cmd` here if this node leads, else (when `forward_for` names the client it
    /// was authorized for) on the leader.
    pub async fn propose(&self, cmd: Command, forward_for: Option<&Identity>) -> Result<Ack, DirError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(DirError::unavailable(
                "the directory is shutting down: retry on another member",
            ));
        }
        let timeout = std::time::Duration::from_millis(self.config.write_timeout_ms);
        let written = match tokio::time::timeout(timeout, self.batcher.write(cmd.clone())).await {
            Ok(r) => r,
            Err(_) => {
                return Err(DirError::unavailable(format!(
                    "the write was not committed within {} ms (no quorum reachable?); it may still be applied later: retry, and check `gma cluster status`",
                    self.config.write_timeout_ms
                )))
            }
        };
        match written {
            Ok(r) => r,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                let (Some(leader), Some(caller)) = (f.leader_node, forward_for) else {
                    return Err(DirError::unavailable(
                        "no directory leader is known yet (election in progress or no quorum): retry shortly",
                    ));
                };
                forward(&leader, &cmd, caller).await
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => Err(
                DirError::unavailable(format!("membership change in progress: {e}")),
            ),
            Err(RaftError::Fatal(e)) => {
                Err(DirError::unavailable(format!("raft stopped on this member: {e}")))
            }
        }
    }

    /// Waits until a linearizable read of the local state is allowed. `Ok(None)`: read here;
    /// `Ok(Some(leader))`: this node is a follower; pass the read to `leader`.
    ///
    /// openraft's read index is the larger of the leader's first entry of its term and its
    /// commit index. A member that led when it stopped is made leader again at once by
    /// openraft 0.9, in the same term, with the commit index it had persisted, which is not
    /// flushed and may trail entries it had committed and acknowledged (the Jepsen test found
    /// it: after kill -9 of all three members, a read missed an acknowledged update, which
    /// came back a moment later). So while this member leads in the term it restored, a read
    /// also waits until everything its log held at start is applied: every entry ever
    /// committed is there (its own entries were on its disk before they committed; the
    /// earlier ones it held when it was elected).
    ///
    /// openraft gives each follower one heartbeat interval (`heartbeat_ms`, 50 ms) to confirm
    /// the leadership; a follower that is slow rather than gone (a loaded machine, a long round
    /// trip) misses it, and a healthy cluster would refuse the read. So the check is asked again,
    /// one heartbeat apart, until `write_timeout_ms` — the time a write gets to reach a quorum —
    /// before the read answers UNAVAILABLE; so is a member that knows no leader (an election
    /// in progress, which a loaded machine starts when heartbeats come late).
    pub async fn read_barrier(&self) -> Result<Option<Node>, DirError> {
        let deadline = Instant::now() + std::time::Duration::from_millis(self.config.write_timeout_ms);
        loop {
            match self.raft.ensure_linearizable().await {
                Ok(_) => {
                    self.await_restored_log().await?;
                    return Ok(None);
                }
                Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => match f.leader_node {
                    Some(n) if f.leader_id != Some(self.id) => return Ok(Some(n)),
                    _ if Instant::now() >= deadline => {
                        return Err(DirError::unavailable(format!(
                            "no directory leader is known within {} ms (election in progress or no quorum): retry, or read with stale_ok",
                            self.config.write_timeout_ms
                        )))
                    }
                    _ => tokio::time::sleep(std::time::Duration::from_millis(self.config.heartbeat_ms)).await,
                },
                Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q))) => {
                    if Instant::now() >= deadline {
                        return Err(DirError::unavailable(format!(
                            "this member cannot reach a quorum ({q}) within {} ms: retry on another member, or read with stale_ok",
                            self.config.write_timeout_ms
                        )));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(self.config.heartbeat_ms)).await;
                }
                Err(RaftError::Fatal(e)) => {
                    return Err(DirError::unavailable(format!("raft stopped on this member: {e}")))
                }
            }
        }
    }

    /// See [`Shared::read_barrier`]: on a leader restored in its old term, waits until the
    /// log it started with is applied.
    async fn await_restored_log(&self) -> Result<(), DirError> {
        let Some((term, last)) = self.restored else {
            return Ok(());
        };
        let (current, applied) = {
            let m = self.raft.metrics().borrow().clone();
            (m.current_term, m.last_applied.map_or(0, |l| l.index))
        };
        if current != term || applied >= last {
            return Ok(());
        }
        let timeout = std::time::Duration::from_millis(self.config.write_timeout_ms);
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(last), "restored leader applies its log")
            .await
            .map(|_| ())
            .map_err(|e| {
                DirError::unavailable(format!(
                    "this member leads again after a restart and has not yet applied its log up to index {last} ({e}): retry"
                ))
            })
    }

    /// On the leader: extend every lease once per term (so a failover never mass-expires
    /// producers), then expire due leases. Returns how many records expiry removed.
    pub async fn expire_due(&self) -> Result<usize, DirError> {
        let (leader, term) = {
            let m = self.raft.metrics().borrow().clone();
            (m.current_leader == Some(self.id), m.current_term)
        };
        if !leader {
            return Ok(0);
        }
        if self.extended_term.load(Ordering::SeqCst) != term {
            self.propose(
                Command::ExtendAll {
                    now_ms: self.now_ms(),
                },
                None,
            )
            .await?;
            self.extended_term.store(term, Ordering::SeqCst);
            tracing::info!(term, "leader extended every lease by one TTL");
        }
        let now = self.clock.now_ms();
        let due = self
            .sm
            .state
            .read()
            .await
            .dir
            .next_expiry()
            .is_some_and(|at| at <= now);
        if !due {
            return Ok(0);
        }
        let before = self.sm.state.read().await.dir.counts();
        self.propose(Command::Expire { now_ms: now }, None).await?;
        let after = self.sm.state.read().await.dir.counts();
        Ok((before.producers + before.consumers).saturating_sub(after.producers + after.consumers) as usize)
    }

    /// Asks every stream task and the expiry ticker to end.
    pub fn begin_shutdown(&self) {
        self.stop.send_replace(true);
    }

    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Stops raft on this member. Later writes answer UNAVAILABLE.
    pub async fn close(&self) -> Result<(), DirError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.raft
            .shutdown()
            .await
            .map_err(|e| DirError::Storage(format!("raft did not stop cleanly: {e}")))
    }

    fn resolve_ttl(&self, requested: u64) -> Result<u64, DirError> {
        let c = &self.config;
        if requested == 0 {
            return Ok(c.default_ttl_ms);
        }
        if requested < c.min_ttl_ms || requested > c.max_ttl_ms {
            return Err(DirError::invalid_argument(format!(
                "lease_ttl_ms {requested} is outside [{}, {}]: pick a value in range, or 0 for the default ({} ms)",
                c.min_ttl_ms, c.max_ttl_ms, c.default_ttl_ms
            )));
        }
        Ok(requested)
    }

    /// On the leader: authorizes a command a member forwarded for the client `caller` under
    /// this member's policy, as if `caller` had called here, and returns it ready to propose
    /// (owner attributes stamped for `caller`, lease renewals checked against this state).
    pub async fn authorize_forwarded(
        &self,
        access: &crate::access::Access,
        caller: &Identity,
        mut cmd: Command,
    ) -> Result<Command, DirError> {
        let denied = |e: DirError| DirError::permission_denied(e.to_string());
        let register = Action::DirectoryRegister;
        match &mut cmd {
            // The record must be valid before and after its owner is stamped.
            Command::Register { record, schemas, .. } | Command::Update { record, schemas, .. } => {
                crate::validate::record(Some(record))?;
                access
                    .authorize(caller, register, record_id(Some(record)))
                    .map_err(denied)?;
                stamp_owner(record, caller);
                crate::validate::record(Some(record))?;
                crate::validate::schemas(schemas)?;
            }
            Command::Remove { kind, id } => {
                crate::validate::id(*kind, id)?;
                access.authorize(caller, register, id).map_err(denied)?;
            }
            Command::KeepAlive {
                lease_id, checked, ..
            } => {
                if access.restricts() {
                    // What the follower checked, or what the lease holds here; the state
                    // machine renews only if the lease holds nothing else when it applies.
                    let held = match checked.take() {
                        Some(ids) => ids,
                        None => self.sm.state.read().await.dir.lease_record_ids(*lease_id),
                    };
                    for id in &held {
                        access.authorize(caller, register, id).map_err(denied)?;
                    }
                    *checked = Some(held);
                }
            }
            Command::Expire { .. } | Command::ExtendAll { .. } => {
                return Err(DirError::permission_denied(
                    "lease expiry is the leader's own command; a member may only forward client commands",
                ))
            }
            Command::Batch(_) => {
                // A member forwards each client's command on its own (`propose`); batches are
                // formed by the proposing member's batcher, never forwarded.
                return Err(DirError::invalid_argument(
                    "a forwarded write carries one client command, not a batch",
                ));
            }
        }
        Ok(cmd)
    }
}

/// Record attributes naming the identity that registered the record (set by the directory,
/// never taken from the client): producers authorize pushed streams for it.
pub const OWNER_CN: &str = "gma.owner.cn";
pub const OWNER_ORG: &str = "gma.owner.org";

/// Sets the owner attributes of `record` to `who` (removes them for anonymous peers).
fn stamp_owner(record: &mut pb::Record, who: &gma_core::authz::Identity) {
    use pb::record::Record as Body;
    let attrs = match record.record.as_mut() {
        Some(Body::Producer(p)) => &mut p.attributes,
        Some(Body::Consumer(c)) => &mut c.attributes,
        None => return,
    };
    attrs.remove(OWNER_CN);
    attrs.remove(OWNER_ORG);
    if !who.is_anonymous() {
        attrs.insert(OWNER_CN.into(), who.cn.clone());
        attrs.insert(OWNER_ORG.into(), who.org.clone());
    }
}

/// The id of a record (checked by `validate::record`), for authorization.
fn record_id(r: Option<&pb::Record>) -> &str {
    use pb::record::Record as Body;
    match r.and_then(|r| r.record.as_ref()) {
        Some(Body::Producer(p)) => &p.id,
        Some(Body::Consumer(c)) => &c.id,
        None => "",
    }
}

/// The gRPC service.
#[derive(Clone)]
pub(crate) struct DirectoryService {
    shared: Arc<Shared>,
    access: Arc<crate::access::Access>,
}

impl DirectoryService {
    pub fn new(shared: Arc<Shared>, access: Arc<crate::access::Access>) -> DirectoryService {
        DirectoryService { shared, access }
    }

    /// What Register and Update check before they write: the record's syntax, the caller's
    /// right to write its id (directory.register), then the record again with the owner
    /// attributes set (they count against the attribute limit) and the schemas. Syntax errors
    /// never reach the replicated log. Returns the caller, the record, its schemas and the
    /// lease TTL asked for.
    fn admit_record<R: RecordWrite>(
        &self,
        req: Request<R>,
    ) -> Result<(Identity, pb::Record, Vec<pb::EventSchema>, u64), Status> {
        crate::validate::record(req.get_ref().record())?;
        let who = self
            .access
            .check(&req, Action::DirectoryRegister, record_id(req.get_ref().record()))?;
        let (record, schemas, ttl_ms) = req.into_inner().into_parts();
        let mut record = record.unwrap_or_default();
        stamp_owner(&mut record, &who);
        crate::validate::record(Some(&record))?;
        crate::validate::schemas(&schemas)?;
        Ok((who, record, schemas, ttl_ms))
    }
}

/// Register's and Update's requests: a record, its schemas and a lease TTL.
trait RecordWrite {
    fn record(&self) -> Option<&pb::Record>;
    fn into_parts(self) -> (Option<pb::Record>, Vec<pb::EventSchema>, u64);
}

macro_rules! record_write {
    ($($request:ty),*) => {$(
        impl RecordWrite for $request {
            fn record(&self) -> Option<&pb::Record> {
                self.record.as_ref()
            }

            fn into_parts(self) -> (Option<pb::Record>, Vec<pb::EventSchema>, u64) {
                (self.record, self.schemas, self.lease_ttl_ms)
            }
        }
    )*};
}

record_write!(pb::RegisterRequest, pb::UpdateRequest);

#[tonic::async_trait]
impl Directory for DirectoryService {
    #[tracing::instrument(skip_all)]
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let (who, record, schemas, ttl_ms) = self.admit_record(req)?;
        let ttl_ms = self.shared.resolve_ttl(ttl_ms)?;
        let a = self
            .shared
            .write(&who, |now_ms| Command::Register {
                record,
                schemas,
                lease_id: 0,
                ttl_ms,
                now_ms,
            })
            .await?;
        tracing::debug!(lease = a.lease_id, revision = a.revision, "registered");
        Ok(Response::new(pb::RegisterResponse {
            lease_id: a.lease_id,
            lease_ttl_ms: a.ttl_ms,
            revision: a.revision,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn update(&self, req: Request<pb::UpdateRequest>) -> Result<Response<pb::UpdateResponse>, Status> {
        let (who, record, schemas, ttl_ms) = self.admit_record(req)?;
        // 0 keeps the record's lease; anything else is a new lease, checked like Register's.
        let ttl_ms = match ttl_ms {
            0 => 0,
            n => self.shared.resolve_ttl(n)?,
        };
        let a = self
            .shared
            .write(&who, |now_ms| Command::Update {
                record,
                schemas,
                ttl_ms,
                now_ms,
            })
            .await?;
        Ok(Response::new(pb::UpdateResponse {
            lease_id: a.lease_id,
            lease_ttl_ms: a.ttl_ms,
            revision: a.revision,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn remove(&self, req: Request<pb::RemoveRequest>) -> Result<Response<pb::RemoveResponse>, Status> {
        let who = self
            .access
            .check(&req, Action::DirectoryRegister, &req.get_ref().id)?;
        let req = req.into_inner();
        let Some(kind) = Kind::from_pb(req.kind)? else {
            return Err(DirError::invalid_argument(
                "kind is required: RECORD_KIND_PRODUCER or RECORD_KIND_CONSUMER",
            )
            .into());
        };
        let id = req.id;
        crate::validate::id(kind, &id)?;
        let a = self.shared.write(&who, |_| Command::Remove { kind, id }).await?;
        Ok(Response::new(pb::RemoveResponse { revision: a.revision }))
    }

    type KeepAliveStream = ReceiverStream<Result<pb::KeepAliveResponse, Status>>;

    #[tracing::instrument(skip_all)]
    async fn keep_alive(
        &self,
        req: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let who = self.access.admit(&req)?;
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(KEEPALIVE_BUFFER);
        let shared = self.shared.clone();
        let access = self.access.clone();
        let mut stop = shared.stop_signal();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    m = inbound.message() => m,
                };
                let lease_id = match msg {
                    Ok(Some(r)) => r.lease_id,
                    Ok(None) => break,
                    Err(status) => {
                        // A malformed message ends the stream with its status, not OK.
                        tracing::debug!(%status, "keepalive stream ended");
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                };
                // Whoever renews a lease must be allowed to register what it holds.
                let held = shared.sm.state.read().await.dir.lease_record_ids(lease_id);
                let allowed = held
                    .iter()
                    .try_for_each(|id| access.authorize(&who, Action::DirectoryRegister, id));
                // The leader re-checks against its own state: this member may lag behind it.
                let checked = access.restricts().then_some(held);
                let reply = match allowed {
                    Err(e) => Err(Status::from(e)),
                    Ok(()) => shared
                        .write(&who, |now_ms| Command::KeepAlive {
                            lease_id,
                            now_ms,
                            checked,
                        })
                        .await
                        .map_err(Status::from),
                };
                let reply = match reply {
                    Ok(a) => Ok(pb::KeepAliveResponse {
                        lease_id,
                        ttl_ms: a.ttl_ms,
                    }),
                    Err(e) => Err(e),
                };
                let fatal = reply.is_err();
                if tx.send(reply).await.is_err() || fatal {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    #[tracing::instrument(skip_all)]
    async fn search(&self, req: Request<pb::SearchRequest>) -> Result<Response<pb::SearchResponse>, Status> {
        let q = SearchQuery::from_pb(req.get_ref())?;
        let who = self
            .access
            .check(&req, Action::DirectorySearch, &req.get_ref().event_pattern)?;
        if !req.get_ref().stale_ok {
            if let Some(leader) = self.shared.read_barrier().await? {
                let mut pass = Request::new(req.into_inner());
                crate::access::speak_for(&mut pass, &who);
                return leader_client(&leader).await?.search(pass).await;
            }
        }
        let state = self.shared.sm.state.read().await;
        Ok(Response::new(state.dir.search(&q)))
    }

    #[tracing::instrument(skip_all)]
    async fn get_schema(
        &self,
        req: Request<pb::GetSchemaRequest>,
    ) -> Result<Response<pb::GetSchemaResponse>, Status> {
        crate::validate::schema_name(&req.get_ref().name)?;
        let who = self
            .access
            .check(&req, Action::DirectorySearch, &req.get_ref().name)?;
        if let Some(leader) = self.shared.read_barrier().await? {
            let mut pass = Request::new(req.into_inner());
            crate::access::speak_for(&mut pass, &who);
            return leader_client(&leader).await?.get_schema(pass).await;
        }
        let req = req.into_inner();
        let schema = self
            .shared
            .sm
            .state
            .read()
            .await
            .dir
            .get_schema(&req.name, req.version)?;
        Ok(Response::new(pb::GetSchemaResponse { schema: Some(schema) }))
    }

    type WatchStream = ReceiverStream<Result<pb::WatchEvent, Status>>;

    #[tracing::instrument(skip_all)]
    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let filter = RecordFilter::new(req.get_ref().kind, &req.get_ref().event_pattern)?;
        self.access
            .check(&req, Action::DirectoryWatch, &req.get_ref().event_pattern)?;
        let slot = self.access.watch_slot(&req)?;
        let req = req.into_inner();
        let from = req.from_revision;
        let (initial, current, changes) = {
            let state = self.shared.sm.state.read().await;
            // Subscribing under the read lock: every change after `current` reaches `changes`.
            let changes = self.shared.sm.changes.subscribe();
            let initial = if from == 0 {
                state.dir.snapshot(&filter)
            } else {
                state.dir.changes_since(from, &filter)?
            };
            (initial, state.dir.revision(), changes)
        };
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let watcher = Watcher {
            shared: self.shared.clone(),
            filter,
            min: from,
            cursor: current + 1,
            tx,
            stop: self.shared.stop_signal(),
            _slot: Some(slot),
        };
        tokio::spawn(watcher.run(initial, current, changes));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn version(
        &self,
        _req: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        gma_core::endpoint::version("directory")
    }

    async fn cluster_status(
        &self,
        _req: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let m = self.shared.raft.metrics().borrow().clone();
        let state = self.shared.sm.state.read().await;
        let counts = state.dir.counts();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| pb::ClusterMember {
                id: *id,
                address: gma_core::addr::endpoint_uri(&node.api_addr),
                leader: m.current_leader == Some(*id),
                voter: voters.contains(id),
            })
            .collect();
        Ok(Response::new(pb::ClusterStatusResponse {
            members,
            leader_id: m.current_leader.unwrap_or(0),
            revision: state.dir.revision(),
            producers: counts.producers,
            consumers: counts.consumers,
            schemas: counts.schemas,
            leases: counts.leases,
            node_id: self.shared.id,
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index).unwrap_or(0),
            last_log: m.last_log_index.unwrap_or(0),
            state: format!("{:?}", m.state),
        }))
    }
}

/// One Watch stream's task.
struct Watcher {
    shared: Arc<Shared>,
    filter: RecordFilter,
    /// Changes below this revision are not delivered (the request's from_revision).
    min: u64,
    /// The next revision this watcher has to account for.
    cursor: u64,
    tx: mpsc::Sender<Result<pb::WatchEvent, Status>>,
    stop: watch::Receiver<bool>,
    /// The connection's Watch slot, freed when the watcher ends.
    _slot: Option<gma_core::guard::Slot>,
}

impl Watcher {
    async fn run(
        mut self,
        initial: Vec<pb::WatchEvent>,
        synced_at: u64,
        mut changes: broadcast::Receiver<Arc<pb::WatchEvent>>,
    ) {
        metrics::gauge!(crate::telemetry::WATCHERS).increment(1.0);
        struct Open;
        impl Drop for Open {
            fn drop(&mut self) {
                metrics::gauge!(crate::telemetry::WATCHERS).decrement(1.0);
            }
        }
        let _open = Open;
        for ev in initial {
            if !self.send(Ok(ev)).await {
                return;
            }
        }
        let synced = pb::WatchEvent {
            r#type: pb::WatchEventType::Synced as i32,
            revision: synced_at,
            entry: None,
            reason: String::new(),
        };
        if !self.send(Ok(synced)).await {
            return;
        }
        loop {
            let msg = tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return,
                _ = self.tx.closed() => return,
                m = changes.recv() => m,
            };
            match msg {
                Ok(ev) => {
                    if ev.revision > self.cursor && !self.catch_up().await {
                        return;
                    }
                    if ev.revision < self.cursor {
                        continue;
                    }
                    self.cursor = ev.revision + 1;
                    if ev.revision >= self.min
                        && ev.entry.as_ref().is_some_and(|e| self.filter.matches(e))
                        && !self.send(Ok((*ev).clone())).await
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::debug!(skipped, cursor = self.cursor, "watcher lagged; reading history");
                    if !self.catch_up().await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Delivers every change from `cursor` to the current revision from the history.
    async fn catch_up(&mut self) -> bool {
        let (events, current) = {
            let state = self.shared.sm.state.read().await;
            (
                state.dir.changes_since(self.cursor, &self.filter),
                state.dir.revision(),
            )
        };
        match events {
            Ok(events) => {
                for ev in events {
                    if ev.revision >= self.min && !self.send(Ok(ev)).await {
                        return false;
                    }
                }
                self.cursor = current + 1;
                true
            }
            Err(e) => {
                let e = match e {
                    DirError::Refused(r) if r.code() == tonic::Code::OutOfRange => {
                        DirError::out_of_range(format!("watch fell behind: {}", r.message()))
                    }
                    other => other,
                };
                self.send(Err(e.into())).await;
                false
            }
        }
    }

    /// False when the client left or the directory is stopping.
    async fn send(&mut self, item: Result<pb::WatchEvent, Status>) -> bool {
        tokio::select! {
            r = self.tx.send(item) => r.is_ok(),
            _ = self.stop.wait_for(|s| *s) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::event::dbl;
    use gma_proto::v1::record::Record as Body;
    use tokio_stream::StreamExt;

    async fn shared(dir: &std::path::Path, history_limit: usize, capacity: usize) -> Arc<Shared> {
        let config = DirectoryConfig {
            history_limit,
            ..DirectoryConfig::new(dir)
        };
        let shared = crate::server::start_node_with(&config, "127.0.0.1:1", capacity)
            .await
            .unwrap();
        shared
            .raft
            .wait(Some(std::time::Duration::from_secs(10)))
            .current_leader(1, "single node leads")
            .await
            .unwrap();
        shared
    }

    async fn register(shared: &Shared, i: usize) {
        let record = pb::Record {
            record: Some(Body::Producer(pb::ProducerRecord {
                id: format!("p{i}"),
                address: "http://127.0.0.1:7001".into(),
                events: vec!["host.cpu".into()],
                ..Default::default()
            })),
        };
        let schemas = vec![pb::EventSchema {
            name: "host.cpu".into(),
            version: 1,
            fields: vec![dbl("load", "", "")],
            description: String::new(),
        }];
        shared
            .write(&Identity::anonymous(), |now_ms| Command::Register {
                record,
                schemas,
                lease_id: 0,
                ttl_ms: 60_000,
                now_ms,
            })
            .await
            .unwrap();
    }

    async fn watch(
        shared: &Arc<Shared>,
        from_revision: u64,
    ) -> ReceiverStream<Result<pb::WatchEvent, Status>> {
        let access = crate::access::Access::new(&DirectoryConfig::new("unused")).unwrap();
        let svc = DirectoryService::new(shared.clone(), Arc::new(access));
        let req = pb::WatchRequest {
            from_revision,
            ..Default::default()
        };
        svc.watch(Request::new(req)).await.unwrap().into_inner()
    }

    #[tokio::test]
    async fn a_lagging_watcher_catches_up_from_history_without_gaps_or_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path(), 10_000, 4).await;
        let mut stream = watch(&shared, 0).await;
        let synced = stream.next().await.unwrap().unwrap();
        assert_eq!(synced.r#type(), pb::WatchEventType::Synced);
        // Nobody reads the stream: the watcher's queue fills and the broadcast (4) lags.
        let n = 3 * WATCH_BUFFER;
        for i in 0..n {
            register(&shared, i).await;
        }
        let mut revisions = Vec::new();
        while revisions.len() < n {
            let ev = stream.next().await.unwrap().unwrap();
            assert_eq!(ev.r#type(), pb::WatchEventType::Put);
            revisions.push(ev.revision);
        }
        assert_eq!(revisions, (1..=n as u64).collect::<Vec<_>>());
        // And it is live again afterwards.
        register(&shared, n).await;
        assert_eq!(stream.next().await.unwrap().unwrap().revision, n as u64 + 1);
        shared.begin_shutdown();
        assert!(stream.next().await.is_none(), "shutdown ends the stream");
        shared.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_watcher_lagging_past_the_history_gets_out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path(), 8, 4).await;
        let mut stream = watch(&shared, 0).await;
        stream.next().await.unwrap().unwrap();
        let n = 2 * WATCH_BUFFER;
        for i in 0..n {
            register(&shared, i).await;
        }
        let mut last = 0;
        let status = loop {
            match stream.next().await.unwrap() {
                Ok(ev) => {
                    assert_eq!(ev.revision, last + 1, "in order, no gaps");
                    last = ev.revision;
                }
                Err(status) => break status,
            }
        };
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert!(
            status.message().starts_with("watch fell behind: revision"),
            "{}",
            status.message()
        );
        assert!(stream.next().await.is_none());
        shared.close().await.unwrap();
        // Writes after close are refused, reads still work.
        let e = shared
            .write(&Identity::anonymous(), |now_ms| Command::Expire { now_ms })
            .await
            .unwrap_err();
        assert!(
            matches!(e, DirError::Refused(ref r) if r.code() == tonic::Code::Unavailable),
            "{e:?}"
        );
    }
}
