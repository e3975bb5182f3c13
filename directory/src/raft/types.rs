//! Raft type configuration of the replicated directory.
//!
//! The log carries [`Command`]s (each stamped with the leader's time); applying one yields a
//! [`Reply`]. Node addresses travel inside the replicated membership as [`Node`].

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::error::DirError;
use crate::state::Command;

pub use crate::member::{Node, NodeId};

/// What a successful command returns to its client.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub lease_id: u64,
    pub ttl_ms: u64,
    pub revision: u64,
}

/// The state machine's answer to one log entry: the command's result (a rejected command is
/// still a committed entry; it just changed nothing), and for a [`Command::Batch`] entry the
/// result of each of its commands, in order (`.0` is then `Ok`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply(pub Result<Ack, DirError>, pub Vec<Result<Ack, DirError>>);

impl Reply {
    /// The reply to a single command.
    pub fn one(r: Result<Ack, DirError>) -> Reply {
        Reply(r, Vec::new())
    }
}

impl Default for Reply {
    fn default() -> Self {
        Reply::one(Ok(Ack::default()))
    }
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
