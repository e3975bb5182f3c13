//! The `run` entry point: open the store, serve gRPC, expire leases, stop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gma_core::rpc::{RpcLayer, RpcStats};
use gma_core::MAX_MESSAGE_BYTES;
use gma_proto::v1::directory_server::DirectoryServer;
use tokio::net::TcpListener;

use std::collections::BTreeMap;

use gma_proto::raft::raft_server::RaftServer;

use crate::config::DirectoryConfig;
use crate::error::DirError;
use crate::raft::network::{Network, Proposer, RaftService};
use crate::raft::types::{Node, NodeId, Raft, Reply};
use crate::service::{restamp, DirectoryService, Shared, BROADCAST_CAPACITY};

/// How long shutdown waits for open connections to finish before closing the store anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Starts this member's raft node over the storage in `config.data_dir`: a single-node
/// directory (no peers) initializes itself on first start; a member started with `init`
/// initializes the cluster with its peers. `advertised` is this node's `host:port`.
pub(crate) async fn start_node(config: &DirectoryConfig, advertised: &str) -> Result<Arc<Shared>, DirError> {
    start_node_with(config, advertised, BROADCAST_CAPACITY).await
}

/// [`start_node`] with a given watch broadcast capacity (tests use a small one to force lag).
pub(crate) async fn start_node_with(
    config: &DirectoryConfig,
    advertised: &str,
    broadcast_capacity: usize,
) -> Result<Arc<Shared>, DirError> {
    config.validate()?;
    let id = config.node_id;
    let peers = crate::member::parse_peers(&config.peers)?;
    let me = peers.get(&id).cloned().unwrap_or_else(|| Node {
        rpc_addr: advertised.to_string(),
        api_addr: advertised.to_string(),
    });
    let (mut log, sm_store, sm) =
        crate::raft::storage::open(&config.data_dir.join("raft"), config.limits(), broadcast_capacity)?;
    let restored = restored_leadership(&mut log, id).await?;
    let raft_config = openraft::Config {
        cluster_name: "gma-directory".into(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_min_ms,
        election_timeout_max: config.election_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_logs),
        max_in_snapshot_log_to_keep: config.snapshot_keep_logs.min(config.snapshot_logs),
        ..Default::default()
    }
    .validate()
    .map_err(|e| DirError::Config(format!("raft: {e}")))?;
    let log_handle = log.clone();
    let raft = Raft::new(id, Arc::new(raft_config), Network, log, sm_store)
        .await
        .map_err(|e| DirError::Storage(format!("cannot start raft: {e}")))?;
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| DirError::Storage(format!("raft: {e}")))?;
    if !initialized && (peers.is_empty() || config.init) {
        let mut members: BTreeMap<NodeId, Node> = peers.clone();
        members.insert(id, me.clone());
        tracing::info!(?members, "initializing the directory cluster");
        raft.initialize(members)
            .await
            .map_err(|e| DirError::Storage(format!("cannot initialize the cluster: {e}")))?;
    }
    Ok(Arc::new(Shared::new(
        config.clone(),
        id,
        raft,
        log_handle,
        sm,
        restored,
    )))
}

/// When this member led when it stopped (its stored vote is a committed vote for itself),
/// openraft 0.9 makes it leader again at once, in the same term: `(term, index of the last
/// entry in its log)`, for [`Shared::read_barrier`].
async fn restored_leadership(
    log: &mut crate::raft::storage::LogStore,
    id: NodeId,
) -> Result<Option<(u64, u64)>, DirError> {
    use openraft::storage::RaftLogStorage;
    let vote = log
        .read_vote()
        .await
        .map_err(|e| DirError::Storage(format!("cannot read the raft vote: {e}")))?;
    let Some(vote) = vote.filter(|v| v.committed && v.leader_id.voted_for() == Some(id)) else {
        return Ok(None);
    };
    let last = log
        .get_log_state()
        .await
        .map_err(|e| DirError::Storage(format!("cannot read the raft log state: {e}")))?
        .last_log_id
        .map_or(0, |l| l.index);
    Ok(Some((vote.leader_id.get_term(), last)))
}

/// Runs a directory member on `listener` until `shutdown` completes.
///
/// Starts raft (see [`start_node`]), leads lease upkeep when this member leads (one `ExtendAll`
/// per term, then `Expire` every `expiry_tick_ms`), and serves the client-facing `Directory`
/// service and the internal raft service on the same port. On shutdown it stops accepting
/// connections, ends open Watch and KeepAlive streams, waits up to 5 s for connections to
/// close, then stops raft.
pub async fn run(
    config: DirectoryConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DirError> {
    run_with_rpc(config, listener, shutdown, RpcStats::new("directory")).await
}

/// [`run`], recording every RPC served into `rpc` (which the caller may publish as `gma.rpc`
/// events, e.g. through a companion producer).
pub async fn run_with_rpc(
    config: DirectoryConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    rpc: Arc<RpcStats>,
) -> Result<(), DirError> {
    let bound = listener
        .local_addr()
        .map_err(|e| DirError::Transport(format!("listener has no address: {e}")))?;
    let advertised = gma_core::addr::advertised(bound)
        .trim_start_matches("http://")
        .to_string();
    tracing::info!(
        data_dir = %config.data_dir.display(),
        %advertised,
        node = config.node_id,
        "directory starting"
    );
    config.validate()?;
    let tls = config
        .endpoint
        .tls
        .rustls_config(bound)
        .map_err(|e| DirError::Config(e.to_string()))?;
    // Members connect to each other with the same identity; the client CA is their CA.
    let mut client = config.endpoint.tls.client();
    if client.ca.is_none() && config.endpoint.tls.enabled() {
        client.ca = config.endpoint.tls.client_ca.clone();
        client.cert = config.endpoint.tls.cert.clone().filter(|_| client.ca.is_some());
        client.key = config.endpoint.tls.key.clone().filter(|_| client.ca.is_some());
    }
    gma_core::tls::install_client_if_unset(&client).map_err(|e| DirError::Config(e.to_string()))?;
    let access = Arc::new(crate::access::Access::new(&config)?);
    let tick = Duration::from_millis(config.expiry_tick_ms);
    let shared = start_node(&config, &advertised).await?;
    let ticker = tokio::spawn(expiry_loop(shared.clone(), tick, config.snapshot_log_bytes));
    let service = DirectoryServer::new(DirectoryService::new(shared.clone(), access.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let raft_service = {
        let forwarder = shared.clone();
        let policy = access.clone();
        let propose: Proposer = Arc::new(move |cmd, caller| {
            let (s, access) = (forwarder.clone(), policy.clone());
            Box::pin(async move {
                let cmd = match s.authorize_forwarded(&access, &caller, cmd).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::info!(%caller, error = %e, "forwarded command refused");
                        return Reply::one(Err(e));
                    }
                };
                let cmd = restamp(cmd, s.now_ms());
                Reply::one(s.propose(cmd, None).await)
            })
        });
        RaftServer::new(RaftService {
            raft: shared.raft.clone(),
            propose,
            access,
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES * 16)
        .max_encoding_message_size(MAX_MESSAGE_BYTES * 16)
    };
    let incoming = gma_core::conn::Incoming::grpc(listener, tls, &config.endpoint.limits, "directory");
    let on_shutdown = shared.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!("directory shutting down");
        on_shutdown.begin_shutdown();
    };
    let mut stopping = shared.stop_signal();
    let server = gma_core::conn::grpc_server(&config.endpoint.limits).layer(RpcLayer::new(rpc));
    let services = gma_core::conn::Services::new()
        .add_service(service)
        .add_service(raft_service);
    let served = tokio::select! {
        r = gma_core::conn::serve_grpc(server, services, incoming, signal) => {
            r.map_err(|e| DirError::Transport(e.to_string()))
        }
        _ = async {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("connections still open {SHUTDOWN_GRACE:?} after shutdown; stopping raft anyway");
            Ok(())
        }
    };
    shared.begin_shutdown();
    if let Err(e) = ticker.await {
        tracing::warn!(error = %e, "expiry task failed");
    }
    let closed = shared.close().await;
    tracing::info!("directory stopped");
    served.and(closed)
}

/// Asks raft for a snapshot once the entries appended since the last one hold
/// `snapshot_log_bytes` (openraft 0.9's own policy counts entries only: a few large records
/// would otherwise keep the log, which lives in memory until the purge after a snapshot, large).
struct SnapshotBySize {
    limit: u64,
    /// `appended_bytes` at the last snapshot (built by raft or asked for here).
    mark: u64,
    last_snapshot: Option<crate::raft::types::LogId>,
}

impl SnapshotBySize {
    async fn tick(&mut self, shared: &Shared) {
        let snapshot = shared.raft.metrics().borrow().snapshot;
        let appended = shared.log.appended_bytes();
        if snapshot != self.last_snapshot {
            self.last_snapshot = snapshot;
            self.mark = appended;
        }
        if appended.saturating_sub(self.mark) < self.limit {
            return;
        }
        self.mark = appended;
        tracing::debug!(bytes = self.limit, "raft log past snapshot_log_bytes: snapshot");
        if let Err(e) = shared.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "cannot trigger a raft snapshot");
        }
    }
}

/// Expires due leases every `tick` until shutdown; on every member, snapshots by size.
async fn expiry_loop(shared: Arc<Shared>, tick: Duration, snapshot_log_bytes: u64) {
    let mut stop = shared.stop_signal();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut by_size = SnapshotBySize {
        limit: snapshot_log_bytes,
        mark: shared.log.appended_bytes(),
        last_snapshot: shared.raft.metrics().borrow().snapshot,
    };
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = interval.tick() => {}
        }
        crate::telemetry::raft_state(&shared.raft.metrics().borrow());
        crate::telemetry::memory(
            shared.log.entries_in_memory(),
            shared.sm.state.read().await.dir.history_size(),
        );
        by_size.tick(&shared).await;
        match shared.expire_due().await {
            Ok(0) => {}
            Ok(n) => {
                metrics::counter!(crate::telemetry::LEASES_EXPIRED).increment(n as u64);
                tracing::info!(removed = n, "expired leases")
            }
            Err(e) => tracing::warn!(error = %e, "cannot expire leases"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::authz::Identity;
    use gma_proto::v1 as pb;

    use crate::state::Command;

    /// A producer record of `sources` sources (a few KB each when written to the log).
    async fn register(shared: &Shared, id: &str, sources: usize) {
        let record = pb::Record {
            record: Some(pb::record::Record::Producer(pb::ProducerRecord {
                id: id.into(),
                address: "http://127.0.0.1:7001".into(),
                events: vec!["host.cpu".into()],
                sources: (0..sources).map(|i| format!("node-{i:05}.example.org")).collect(),
                ..Default::default()
            })),
        };
        shared
            .write(&Identity::anonymous(), |now_ms| Command::Register {
                record,
                schemas: vec![pb::EventSchema {
                    name: "host.cpu".into(),
                    version: 1,
                    fields: vec![gma_core::event::dbl("load", "", "")],
                    description: String::new(),
                }],
                lease_id: 0,
                ttl_ms: 60_000,
                now_ms,
            })
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_log_past_snapshot_log_bytes_is_snapshotted_and_purged() {
        let dir = tempfile::tempdir().unwrap();
        let config = DirectoryConfig {
            // Never by count: only the size can trigger it.
            snapshot_logs: 1_000_000,
            snapshot_log_bytes: 32 << 10,
            snapshot_keep_logs: 0,
            ..DirectoryConfig::new(dir.path())
        };
        let shared = start_node(&config, "127.0.0.1:1").await.unwrap();
        shared
            .raft
            .wait(Some(Duration::from_secs(10)))
            .current_leader(1, "single node leads")
            .await
            .unwrap();
        let mut by_size = SnapshotBySize {
            limit: config.snapshot_log_bytes,
            mark: shared.log.appended_bytes(),
            last_snapshot: None,
        };
        by_size.tick(&shared).await;
        assert!(
            shared.raft.metrics().borrow().snapshot.is_none(),
            "no snapshot below the limit"
        );
        for i in 0..10 {
            register(&shared, &format!("p{i}"), 200).await;
        }
        assert!(shared.log.appended_bytes() >= config.snapshot_log_bytes);
        let before = shared.log.entries_in_memory();
        by_size.tick(&shared).await;
        let m = shared
            .raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(
                |m| m.snapshot.is_some() && m.purged == m.snapshot,
                "snapshot built and log purged",
            )
            .await
            .unwrap();
        assert!(
            shared.log.entries_in_memory() < before,
            "{} entries left of {before}",
            shared.log.entries_in_memory()
        );
        // Counted from the snapshot on: the next tick asks for none.
        by_size.tick(&shared).await;
        assert_eq!(by_size.last_snapshot, m.snapshot);
        assert!(shared.log.appended_bytes() - by_size.mark < config.snapshot_log_bytes);
        shared.begin_shutdown();
        shared.close().await.unwrap();
    }
}
