//! Configuration and the `run` entry point: open the store, serve gRPC, expire leases, stop.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gma_core::rpc::{RpcLayer, RpcStats};
use gma_core::MAX_MESSAGE_BYTES;
use gma_proto::v1::directory_server::DirectoryServer;
use tokio::net::TcpListener;

use std::collections::BTreeMap;

use gma_proto::raft::raft_server::RaftServer;

use crate::error::DirError;
use crate::raft::network::{Network, Proposer, RaftService};
use crate::raft::types::{Node, NodeId, Raft, Reply};
use crate::service::{restamp, DirectoryService, Shared, BROADCAST_CAPACITY};
use crate::state::Limits;

/// How long shutdown waits for open connections to finish before closing the store anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The directory's configuration (the `[directory]` TOML of `gma directory --config`).
/// Every field but `data_dir` has a default.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryConfig {
    /// Where the raft log and snapshot live (`data_dir/raft`, created if missing).
    pub data_dir: PathBuf,
    /// Lease TTL when a registration asks for 0.
    #[serde(default = "defaults::default_ttl_ms")]
    pub default_ttl_ms: u64,
    /// Smallest lease TTL a client may ask for.
    #[serde(default = "defaults::min_ttl_ms")]
    pub min_ttl_ms: u64,
    /// Largest lease TTL a client may ask for.
    #[serde(default = "defaults::max_ttl_ms")]
    pub max_ttl_ms: u64,
    /// How often due leases are expired; a dead holder disappears within TTL + one tick.
    #[serde(default = "defaults::expiry_tick_ms")]
    pub expiry_tick_ms: u64,
    /// Changes kept for Watch resumption.
    #[serde(default = "defaults::history_limit")]
    pub history_limit: usize,
    /// Most producer + consumer records the directory holds.
    #[serde(default = "defaults::max_records")]
    pub max_records: usize,
    /// This member's raft node id (>= 1). Never reuse an id for a wiped node.
    #[serde(default = "defaults::node_id")]
    pub node_id: u64,
    /// The initial members, `ID=HOST:PORT,...` (this node included or not). Empty: a
    /// single-node directory, initialized on first start.
    #[serde(default)]
    pub peers: String,
    /// Initialize the cluster with `peers` (and this node) as voters, if not yet initialized.
    /// Give it on exactly one member of a new cluster.
    #[serde(default)]
    pub init: bool,
    /// Raft heartbeat interval.
    #[serde(default = "defaults::heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Raft election timeout range; a failover takes about one timeout.
    #[serde(default = "defaults::election_min_ms")]
    pub election_min_ms: u64,
    #[serde(default = "defaults::election_max_ms")]
    pub election_max_ms: u64,
    /// Build a snapshot (and compact the log) after this many entries.
    #[serde(default = "defaults::snapshot_logs")]
    pub snapshot_logs: u64,
    /// A write not committed within this time answers UNAVAILABLE (e.g. no quorum).
    #[serde(default = "defaults::write_timeout_ms")]
    pub write_timeout_ms: u64,
    /// TLS (`[tls]`: cert, key, client_ca for the endpoint, ca for connections to other
    /// members; the client CA doubles as `ca` when `ca` is not given). With `client_ca` every
    /// client and every member must present a certificate; raft is mutually authenticated.
    #[serde(default)]
    pub tls: gma_core::tls::ServerTls,
    /// The members of a TLS cluster (`[[members]]`: `cn`, `org`, optional `id`): only a peer
    /// whose verified certificate matches an entry may send raft traffic (AppendEntries, Vote,
    /// InstallSnapshot, Forward) or speak for a client, and only as the node ids its entry
    /// allows. Required for a cluster with `tls.client_ca`; see docs/directory.md.
    #[serde(default)]
    pub members: Vec<Member>,
    /// Replaced by `[[members]]` (a CN glob alone let any organization's certificate in):
    /// a config that still sets it is refused with what to write instead.
    #[serde(default)]
    pub member_cn: Option<String>,
    /// Authorization policy file (TOML, see docs/security.md); none allows every identity.
    #[serde(default)]
    #[serde(rename = "access_policy")]
    pub policy: Option<PathBuf>,
    /// Per-identity limits (`[limits]`: requests_per_s, burst, subscriptions_per_connection
    /// (Watch streams per connection)).
    #[serde(default)]
    pub limits: gma_core::guard::Limits,
    /// Where `gma directory` serves Prometheus `/metrics` (`--metrics-listen`); none = not
    /// served. Read by the binary, not by [`run`].
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Period of the `gma.rpc` events about this member's RPCs, published by the companion
    /// producer `gma directory` runs beside it (0 = no companion). Read by the binary.
    #[serde(default = "defaults::rpc_events_ms")]
    pub rpc_events_ms: u64,
}

/// One entry of `[[members]]`: the certificate subject of a directory member.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The node id this certificate may speak for; none: any node id (e.g. one entry
    /// `cn = "dir-*"` for every member, present and future).
    #[serde(default)]
    pub id: Option<NodeId>,
    /// Glob over the certificate's CN (`dir-2`, `dir-*`).
    pub cn: String,
    /// Glob over the certificate's O; required, so a certificate of another organization from
    /// the same CA never passes for a member.
    pub org: String,
}

impl Member {
    /// Whether the verified identity `who` is this member.
    pub fn matches(&self, who: &gma_core::authz::Identity) -> bool {
        !who.is_anonymous()
            && gma_core::authz::name_glob(&self.cn, &who.cn)
            && gma_core::authz::name_glob(&self.org, &who.org)
    }
}

mod defaults {
    pub fn default_ttl_ms() -> u64 {
        10_000
    }
    pub fn min_ttl_ms() -> u64 {
        500
    }
    pub fn max_ttl_ms() -> u64 {
        3_600_000
    }
    pub fn expiry_tick_ms() -> u64 {
        200
    }
    pub fn history_limit() -> usize {
        10_000
    }
    pub fn max_records() -> usize {
        1_000_000
    }
    pub fn node_id() -> u64 {
        1
    }
    // openraft 0.9 lets a follower campaign only after the leader lease (= election_max)
    // plus a random election timeout, so failover takes about 1.5 x election_max.
    pub fn heartbeat_ms() -> u64 {
        50
    }
    pub fn election_min_ms() -> u64 {
        250
    }
    pub fn election_max_ms() -> u64 {
        500
    }
    pub fn snapshot_logs() -> u64 {
        10_000
    }
    pub fn write_timeout_ms() -> u64 {
        5_000
    }
    pub fn rpc_events_ms() -> u64 {
        gma_core::rpc::DEFAULT_PERIOD_MS
    }
}

impl Default for DirectoryConfig {
    /// The defaults with an empty `data_dir`, which [`run`] rejects: set it.
    fn default() -> Self {
        DirectoryConfig {
            data_dir: PathBuf::new(),
            default_ttl_ms: defaults::default_ttl_ms(),
            min_ttl_ms: defaults::min_ttl_ms(),
            max_ttl_ms: defaults::max_ttl_ms(),
            expiry_tick_ms: defaults::expiry_tick_ms(),
            history_limit: defaults::history_limit(),
            max_records: defaults::max_records(),
            node_id: defaults::node_id(),
            peers: String::new(),
            init: false,
            heartbeat_ms: defaults::heartbeat_ms(),
            election_min_ms: defaults::election_min_ms(),
            election_max_ms: defaults::election_max_ms(),
            snapshot_logs: defaults::snapshot_logs(),
            write_timeout_ms: defaults::write_timeout_ms(),
            tls: Default::default(),
            members: Vec::new(),
            member_cn: None,
            policy: None,
            limits: Default::default(),
            metrics_listen: None,
            rpc_events_ms: defaults::rpc_events_ms(),
        }
    }
}

impl DirectoryConfig {
    /// The defaults with `data_dir` set.
    pub fn new(data_dir: impl Into<PathBuf>) -> DirectoryConfig {
        DirectoryConfig {
            data_dir: data_dir.into(),
            ..DirectoryConfig::default()
        }
    }

    /// Checks the values make sense together.
    pub fn validate(&self) -> Result<(), DirError> {
        let bad = |m: String| Err(DirError::Config(m));
        if self.data_dir.as_os_str().is_empty() {
            return bad("data_dir is required: set it to a directory the server may write".into());
        }
        if self.min_ttl_ms == 0 || self.min_ttl_ms > self.max_ttl_ms {
            return bad(format!(
                "min_ttl_ms ({}) must be at least 1 and at most max_ttl_ms ({})",
                self.min_ttl_ms, self.max_ttl_ms
            ));
        }
        if self.default_ttl_ms < self.min_ttl_ms || self.default_ttl_ms > self.max_ttl_ms {
            return bad(format!(
                "default_ttl_ms ({}) must lie in [min_ttl_ms, max_ttl_ms] = [{}, {}]",
                self.default_ttl_ms, self.min_ttl_ms, self.max_ttl_ms
            ));
        }
        if self.expiry_tick_ms == 0 {
            return bad("expiry_tick_ms must be at least 1".into());
        }
        if self.history_limit == 0 {
            return bad("history_limit must be at least 1".into());
        }
        if self.max_records == 0 {
            return bad("max_records must be at least 1".into());
        }
        if self.node_id == 0 {
            return bad("node_id must be at least 1".into());
        }
        crate::raft::network::parse_peers(&self.peers).map_err(DirError::Config)?;
        if self.heartbeat_ms == 0
            || self.election_min_ms <= self.heartbeat_ms * 2
            || self.election_max_ms <= self.election_min_ms
        {
            return bad(format!(
                "raft timing must satisfy 0 < 2 * heartbeat_ms ({}) < election_min_ms ({}) < election_max_ms ({})",
                self.heartbeat_ms, self.election_min_ms, self.election_max_ms
            ));
        }
        if self.write_timeout_ms == 0 {
            return bad("write_timeout_ms must be at least 1".into());
        }
        if self.snapshot_logs == 0 {
            return bad("snapshot_logs must be at least 1".into());
        }
        self.limits.validate().map_err(DirError::Config)?;
        if self.tls.enabled() && !self.peers.trim().is_empty() && self.tls.client_ca.is_none() {
            return bad(
                "a TLS cluster authenticates its members mutually: set tls.client_ca (--tls-client-ca) too"
                    .into(),
            );
        }
        self.validate_members()
    }

    /// The member rule: with client certificates, a cluster names its members by CN and O.
    fn validate_members(&self) -> Result<(), DirError> {
        let bad = |m: String| Err(DirError::Config(m));
        let example = "[[members]] entries naming each member's certificate, e.g.\n  \
                       [[members]]\n  id = 1\n  cn = \"dir-1\"\n  org = \"grid\"\n(one per node; \
                       or one entry without id, cn = \"dir-*\", org = \"grid\", for every member)";
        if let Some(glob) = self.member_cn.as_deref().filter(|g| !g.is_empty()) {
            return bad(format!(
                "member_cn = {glob:?} is no longer accepted: a CN glob alone admits a certificate of any \
                 organization from the same CA as a member. Replace it with {example}"
            ));
        }
        for m in &self.members {
            if m.cn.trim().is_empty() || m.org.trim().is_empty() {
                return bad(format!(
                    "[[members]] entry {m:?}: give both cn and org (globs over the certificate subject)"
                ));
            }
            if m.id == Some(0) {
                return bad("[[members]] ids start at 1".into());
            }
        }
        if !self.members.is_empty() && self.tls.client_ca.is_none() {
            return bad(
                "[[members]] recognizes members by their certificates: set tls.client_ca (--tls-client-ca) too"
                    .into(),
            );
        }
        if self.tls.client_ca.is_none() {
            return Ok(());
        }
        let peers = crate::raft::network::parse_peers(&self.peers).map_err(DirError::Config)?;
        if peers.is_empty() {
            return Ok(());
        }
        if self.members.is_empty() {
            return bad(format!(
                "a TLS cluster accepts raft traffic only from its members: add {example}"
            ));
        }
        for id in peers.keys().chain(std::iter::once(&self.node_id)) {
            if !self.members.iter().any(|m| m.id.is_none_or(|i| i == *id)) {
                return bad(format!(
                    "node {id} has no [[members]] entry: add one with id = {id} and the cn and org of its certificate"
                ));
            }
        }
        // This member's own certificate must pass the others' check (a readable one: an
        // unreadable one is the TLS setup's error).
        if let Some(me) = self
            .tls
            .cert
            .as_ref()
            .and_then(|c| gma_core::tls::pem_identity(c).ok())
        {
            let id = self.node_id;
            if !self
                .members
                .iter()
                .any(|m| m.matches(&me) && m.id.is_none_or(|i| i == id))
            {
                return bad(format!(
                    "this member's certificate is {me}, which no [[members]] entry admits as node {id}: \
                     the other members would refuse its raft traffic; fix the entry or the certificate"
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_records: self.max_records,
            history_limit: self.history_limit,
        }
    }
}

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
    let peers = crate::raft::network::parse_peers(&config.peers).map_err(DirError::Config)?;
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
        max_in_snapshot_log_to_keep: config.snapshot_logs.min(1000),
        ..Default::default()
    }
    .validate()
    .map_err(|e| DirError::Config(format!("raft: {e}")))?;
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
    Ok(Arc::new(Shared::new(config.clone(), id, raft, sm, restored)))
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
        .tls
        .rustls_config(bound)
        .map_err(|e| DirError::Config(e.to_string()))?;
    // Members connect to each other with the same identity; the client CA is their CA.
    let mut client = config.tls.client();
    if client.ca.is_none() && config.tls.enabled() {
        client.ca = config.tls.client_ca.clone();
        client.cert = config.tls.cert.clone().filter(|_| client.ca.is_some());
        client.key = config.tls.key.clone().filter(|_| client.ca.is_some());
    }
    gma_core::tls::install_client_if_unset(&client).map_err(|e| DirError::Config(e.to_string()))?;
    let access = Arc::new(crate::access::Access::new(&config)?);
    let tick = Duration::from_millis(config.expiry_tick_ms);
    let shared = start_node(&config, &advertised).await?;
    let ticker = tokio::spawn(expiry_loop(shared.clone(), tick));
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
    let incoming = gma_core::conn::Incoming::grpc(listener, tls, &config.limits, "directory");
    let on_shutdown = shared.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!("directory shutting down");
        on_shutdown.begin_shutdown();
    };
    let mut stopping = shared.stop_signal();
    let server = gma_core::conn::grpc_server(&config.limits).layer(RpcLayer::new(rpc));
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

/// Expires due leases every `tick` until shutdown.
async fn expiry_loop(shared: Arc<Shared>, tick: Duration) {
    let mut stop = shared.stop_signal();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = interval.tick() => {}
        }
        crate::telemetry::raft_state(&shared.raft.metrics().borrow());
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

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c: DirectoryConfig = gma_core::config::parse_toml("data_dir = \"/tmp/d\"\n", "t").unwrap();
        assert_eq!(c.default_ttl_ms, 10_000);
        assert_eq!(c.min_ttl_ms, 500);
        assert_eq!(c.max_ttl_ms, 3_600_000);
        assert_eq!(c.expiry_tick_ms, 200);
        assert_eq!(c.history_limit, 10_000);
        assert_eq!(c.max_records, 1_000_000);
        assert!(c.validate().is_ok());
        let e =
            gma_core::config::parse_toml::<DirectoryConfig>("data_dir = \"d\"\nttl = 1\n", "t").unwrap_err();
        assert!(e.to_string().contains("unknown field `ttl`"), "{e}");
        assert!(gma_core::config::parse_toml::<DirectoryConfig>("default_ttl_ms = 1\n", "t").is_err());
    }

    #[test]
    fn config_validation() {
        assert!(DirectoryConfig::default().validate().is_err());
        let ok = DirectoryConfig::new("/tmp/x");
        assert!(ok.validate().is_ok());
        for bad in [
            DirectoryConfig {
                min_ttl_ms: 0,
                ..ok.clone()
            },
            DirectoryConfig {
                default_ttl_ms: 100,
                ..ok.clone()
            },
            DirectoryConfig {
                min_ttl_ms: 10,
                max_ttl_ms: 5,
                ..ok.clone()
            },
            DirectoryConfig {
                expiry_tick_ms: 0,
                ..ok.clone()
            },
            DirectoryConfig {
                history_limit: 0,
                ..ok.clone()
            },
            DirectoryConfig {
                max_records: 0,
                ..ok.clone()
            },
        ] {
            assert!(matches!(bad.validate(), Err(DirError::Config(_))), "{bad:?}");
        }
    }
}
