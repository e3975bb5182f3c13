//! Raft RPCs over tonic.
//!
//! Client side: [`Network`] implements openraft's `RaftNetworkFactory`; each target gets a lazily
//! connected channel, so `new_client` never fails and a dead peer shows up as `Unreachable`
//! (which makes openraft back off instead of retrying every heartbeat). Server side:
//! [`RaftService`] hands each message to the local `Raft` and returns its result; it also takes
//! writes forwarded by followers and membership changes from `gma cluster`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gma_core::Refuse;
use gma_proto::raft as rpb;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use rpb::raft_client::RaftClient;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::types::{Node, NodeId, Raft, TypeConfig};
use crate::error::DirError;
use crate::state::Command;

/// Creates per-target clients.
#[derive(Clone, Default)]
pub struct Network;

pub struct Connection {
    target: NodeId,
    addr: String,
    client: Option<RaftClient<Channel>>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Connection {
        Connection {
            target,
            addr: node.rpc_addr.clone(),
            client: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

fn channel(addr: &str) -> Result<Channel, DirError> {
    Ok(gma_core::tls::endpoint(addr)
        .map_err(|e| DirError::unavailable(format!("bad member address {addr}: {e}")))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// A raft client for `addr`, with the fabric's message limit.
pub fn client(addr: &str) -> Result<RaftClient<Channel>, DirError> {
    Ok(RaftClient::new(channel(addr)?)
        .max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES * 16)
        .max_encoding_message_size(gma_core::MAX_MESSAGE_BYTES * 16))
}

impl Connection {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: &'static str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let data = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        if self.client.is_none() {
            self.client = Some(client(&self.addr).map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?);
        }
        let Some(c) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(&Msg("no client".into()))));
        };
        let mut request = Request::new(rpb::RaftRequest { data });
        request.set_timeout(option.hard_ttl());
        let reply = match kind {
            "append" => c.append_entries(request).await,
            "vote" => c.vote(request).await,
            _ => c.install_snapshot(request).await,
        };
        let reply = match reply {
            Ok(r) => r.into_inner(),
            Err(s) => {
                let err = Msg(format!(
                    "{kind} to node {} at {}: {}",
                    self.target,
                    self.addr,
                    s.message()
                ));
                return Err(match s.code() {
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                        RPCError::Unreachable(Unreachable::new(&err))
                    }
                    _ => RPCError::Network(NetworkError::new(&err)),
                });
            }
        };
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&reply.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call("append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call("snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call("vote", &rpc, &option).await
    }
}

/// Authorizes a forwarded command for the client it carries and proposes it on the leader;
/// what `Forward` runs. Supplied by the server so the leader applies its own policy and
/// stamps forwarded commands with its own clock.
pub type Proposer = Arc<
    dyn Fn(Command, gma_core::authz::Identity) -> futures::future::BoxFuture<'static, super::types::Reply>
        + Send
        + Sync,
>;

/// The server side of the internal raft service.
pub struct RaftService {
    pub raft: Raft,
    pub propose: Proposer,
    pub(crate) access: std::sync::Arc<crate::access::Access>,
}

impl RaftService {
    /// A raft message from a member: its sender checked (a member, as the node id that
    /// `sender` reads from the message: the vote's), then the message decoded.
    fn admit<T: DeserializeOwned>(
        &self,
        req: Request<rpb::RaftRequest>,
        sender: impl Fn(&T) -> Option<NodeId>,
    ) -> Result<T, DirError> {
        let who = self.access.raft_peer(&req)?;
        let r: T = decode(&req.into_inner().data)?;
        self.access.raft_sender(&who, sender(&r))?;
        Ok(r)
    }
}

fn reply<T: Serialize>(v: &T) -> Result<Response<rpb::RaftReply>, DirError> {
    let data =
        serde_json::to_vec(v).map_err(|e| DirError::internal(format!("cannot encode raft reply: {e}")))?;
    Ok(Response::new(rpb::RaftReply { data }))
}

fn decode<T: DeserializeOwned>(data: &[u8]) -> Result<T, DirError> {
    serde_json::from_slice(data)
        .map_err(|e| DirError::invalid_argument(format!("malformed raft message: {e}")))
}

#[tonic::async_trait]
impl rpb::raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        req: Request<rpb::RaftRequest>,
    ) -> Result<Response<rpb::RaftReply>, Status> {
        let r = self.admit(req, |r: &AppendEntriesRequest<TypeConfig>| {
            r.vote.leader_id.voted_for()
        })?;
        Ok(reply(&self.raft.append_entries(r).await)?)
    }

    async fn vote(&self, req: Request<rpb::RaftRequest>) -> Result<Response<rpb::RaftReply>, Status> {
        let r = self.admit(req, |r: &VoteRequest<NodeId>| r.vote.leader_id.voted_for())?;
        Ok(reply(&self.raft.vote(r).await)?)
    }

    async fn install_snapshot(
        &self,
        req: Request<rpb::RaftRequest>,
    ) -> Result<Response<rpb::RaftReply>, Status> {
        let r = self.admit(req, |r: &InstallSnapshotRequest<TypeConfig>| {
            r.vote.leader_id.voted_for()
        })?;
        Ok(reply(&self.raft.install_snapshot(r).await)?)
    }

    async fn forward(
        &self,
        req: Request<rpb::ForwardRequest>,
    ) -> Result<Response<rpb::ForwardReply>, Status> {
        self.access.raft_peer(&req)?;
        let req = req.into_inner();
        // The member authorized its client already; the leader does again, under its policy.
        let caller = self.access.forwarded_caller(req.caller)?;
        let cmd: Command = decode(&req.command)?;
        let r = (self.propose)(cmd, caller).await;
        let reply =
            serde_json::to_vec(&r).map_err(|e| DirError::internal(format!("cannot encode reply: {e}")))?;
        Ok(Response::new(rpb::ForwardReply { reply }))
    }

    async fn add_learner(
        &self,
        req: Request<rpb::AddLearnerRequest>,
    ) -> Result<Response<rpb::AdminReply>, Status> {
        self.access.admin(&req, "cluster.add-learner")?;
        let req = req.into_inner();
        if req.id == 0 {
            return Err(DirError::invalid_argument("node ids start at 1").into());
        }
        let addr = req.address.trim_start_matches("http://").to_string();
        if addr.parse::<std::net::SocketAddr>().is_err() && !addr.contains(':') {
            return Err(
                DirError::invalid_argument(format!("address {:?} is not host:port", req.address)).into(),
            );
        }
        let node = Node {
            rpc_addr: addr.clone(),
            api_addr: addr,
        };
        match self.raft.add_learner(req.id, node, true).await {
            Ok(r) => Ok(Response::new(rpb::AdminReply {
                message: format!("node {} added as a learner and caught up", req.id),
                log_index: r.log_id.index,
            })),
            Err(e) => Err(admin_error(e).into()),
        }
    }

    async fn change_membership(
        &self,
        req: Request<rpb::ChangeMembershipRequest>,
    ) -> Result<Response<rpb::AdminReply>, Status> {
        self.access.admin(&req, "cluster.change-membership")?;
        let req = req.into_inner();
        if req.voters.is_empty() {
            return Err(DirError::invalid_argument("the new voter set must not be empty").into());
        }
        let voters: BTreeSet<NodeId> = req.voters.iter().copied().collect();
        match self.raft.change_membership(voters.clone(), req.retain).await {
            Ok(r) => Ok(Response::new(rpb::AdminReply {
                message: format!("voters are now {voters:?}"),
                log_index: r.log_id.index,
            })),
            Err(e) => Err(admin_error(e).into()),
        }
    }
}

fn admin_error(e: RaftError<NodeId, openraft::error::ClientWriteError<NodeId, Node>>) -> DirError {
    use openraft::error::ClientWriteError;
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => DirError::failed_precondition(format!(
            "this node is not the leader; run the command against the leader{}",
            f.leader_node
                .map(|n| format!(" at {}", n.api_addr))
                .unwrap_or_default()
        )),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
            DirError::failed_precondition(c.to_string())
        }
        RaftError::Fatal(f) => DirError::unavailable(format!("raft stopped: {f}")),
    }
}
