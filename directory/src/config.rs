//! The directory's configuration: the `[directory]` TOML of `gma directory --config`, its
//! defaults and its checks.

use std::path::PathBuf;

use crate::error::DirError;
use crate::member::Member;
use crate::state::Limits;

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
    /// Bytes of records (protobuf-encoded) those changes may hold at most; the oldest go first.
    /// Like `history_limit`, give every member the same value.
    #[serde(default = "defaults::history_bytes")]
    pub history_bytes: usize,
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
    /// ... or once the entries appended since the last snapshot hold this many bytes (as
    /// written to the log), whichever comes first: the log stays in memory until then.
    #[serde(default = "defaults::snapshot_log_bytes")]
    pub snapshot_log_bytes: u64,
    /// Entries kept in the log behind a snapshot, so that a follower slightly behind catches up
    /// from the log rather than by a whole snapshot.
    #[serde(default = "defaults::snapshot_keep_logs")]
    pub snapshot_keep_logs: u64,
    /// A write not committed within this time answers UNAVAILABLE (e.g. no quorum).
    #[serde(default = "defaults::write_timeout_ms")]
    pub write_timeout_ms: u64,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
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
    pub fn history_bytes() -> usize {
        16 << 20
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
    // The in-memory log grows until a snapshot: at the ~6 entries/s of a 10,000-host grid,
    // 1,000 entries is a snapshot every ~3 minutes (10,000 took 29 minutes, and the memory
    // grew the whole time).
    pub fn snapshot_logs() -> u64 {
        1_000
    }
    pub fn snapshot_log_bytes() -> u64 {
        8 << 20
    }
    pub fn snapshot_keep_logs() -> u64 {
        100
    }
    pub fn write_timeout_ms() -> u64 {
        5_000
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
            history_bytes: defaults::history_bytes(),
            max_records: defaults::max_records(),
            node_id: defaults::node_id(),
            peers: String::new(),
            init: false,
            heartbeat_ms: defaults::heartbeat_ms(),
            election_min_ms: defaults::election_min_ms(),
            election_max_ms: defaults::election_max_ms(),
            snapshot_logs: defaults::snapshot_logs(),
            snapshot_log_bytes: defaults::snapshot_log_bytes(),
            snapshot_keep_logs: defaults::snapshot_keep_logs(),
            write_timeout_ms: defaults::write_timeout_ms(),
            endpoint: Default::default(),
            members: Vec::new(),
            member_cn: None,
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
        let counts = [
            ("expiry_tick_ms", self.expiry_tick_ms),
            ("history_limit", self.history_limit as u64),
            ("history_bytes", self.history_bytes as u64),
            ("snapshot_log_bytes", self.snapshot_log_bytes),
            ("max_records", self.max_records as u64),
            ("node_id", self.node_id),
            ("write_timeout_ms", self.write_timeout_ms),
            ("snapshot_logs", self.snapshot_logs),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, n)| *n == 0) {
            return bad(format!("{name} must be at least 1"));
        }
        crate::member::parse_peers(&self.peers)?;
        if self.heartbeat_ms == 0
            || self.election_min_ms <= self.heartbeat_ms * 2
            || self.election_max_ms <= self.election_min_ms
        {
            return bad(format!(
                "raft timing must satisfy 0 < 2 * heartbeat_ms ({}) < election_min_ms ({}) < election_max_ms ({})",
                self.heartbeat_ms, self.election_min_ms, self.election_max_ms
            ));
        }
        self.endpoint
            .validate()
            .map_err(|e| DirError::Config(e.to_string()))?;
        if self.endpoint.tls.enabled()
            && !self.peers.trim().is_empty()
            && self.endpoint.tls.client_ca.is_none()
        {
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
        if !self.members.is_empty() && self.endpoint.tls.client_ca.is_none() {
            return bad(
                "[[members]] recognizes members by their certificates: set tls.client_ca (--tls-client-ca) too"
                    .into(),
            );
        }
        if self.endpoint.tls.client_ca.is_none() {
            return Ok(());
        }
        let peers = crate::member::parse_peers(&self.peers)?;
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
            .endpoint
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
            history_bytes: self.history_bytes,
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
        assert_eq!(c.history_bytes, 16 << 20);
        assert_eq!(
            (c.snapshot_logs, c.snapshot_log_bytes, c.snapshot_keep_logs),
            (1_000, 8 << 20, 100)
        );
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
            DirectoryConfig {
                history_bytes: 0,
                ..ok.clone()
            },
            DirectoryConfig {
                snapshot_log_bytes: 0,
                ..ok.clone()
            },
        ] {
            assert!(matches!(bad.validate(), Err(DirError::Config(_))), "{bad:?}");
        }
    }
}
