//! Who the members of a directory cluster are: node ids and addresses (`--peers`), and the
//! certificate subjects of `[[members]]`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::DirError;

pub type NodeId = u64;

/// A member's addresses: `rpc_addr` for raft traffic, `api_addr` for the Directory service
/// (both `host:port`; the same port serves both).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub rpc_addr: String,
    pub api_addr: String,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.api_addr)
    }
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

/// Node map from `--peers 1=host:port,2=host:port`.
pub fn parse_peers(text: &str) -> Result<BTreeMap<NodeId, Node>, DirError> {
    let bad = |m: String| DirError::Config(m);
    let mut out = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("peer {part:?} is not ID=HOST:PORT")))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| bad(format!("peer id {id:?} is not a number")))?;
        if id == 0 {
            return Err(bad("node ids start at 1".into()));
        }
        let addr = addr.trim().trim_start_matches("http://").to_string();
        if !addr.contains(':') {
            return Err(bad(format!("peer address {addr:?} is not HOST:PORT")));
        }
        out.insert(
            id,
            Node {
                rpc_addr: addr.clone(),
                api_addr: addr,
            },
        );
    }
    Ok(out)
}
