//! gma-directory: the GMA directory — producers and consumers register metadata records with
//! leases; consumers search and watch them. Metadata only: no event value ever passes here.
//!
//! Modules:
//! - [`state`]: the deterministic state machine (records, schemas, leases, revisions, change
//!   history). `apply(Command) -> Applied` has no I/O and no clock, so a replicated log can
//!   drive it; Search/GetSchema/Watch snapshots are read-only queries on it.
//! - [`raft`]: replication with openraft 0.9: the raft types, the storage (the raft log and vote
//!   in a gma-durable log, fdatasynced before openraft is told; the state machine lives in
//!   memory and is rebuilt from the latest snapshot file plus the log), and the tonic network
//!   (raft RPCs, write forwarding, membership changes).
//! - [`batch`]: concurrent writes proposed together as one raft entry (openraft 0.9 makes each
//!   entry durable before it takes the next).
//! - `service`: the tonic `Directory` implementation: writes are raft proposals (forwarded to
//!   the leader from a follower), reads are linearizable by default; watchers fan out from the
//!   state machine's broadcast and catch up from history.
//! - `config`: [`DirectoryConfig`], its defaults and its checks.
//! - [`member`]: node ids and addresses (`--peers`, [`member::parse_peers`]) and the
//!   certificate subjects of `[[members]]`.
//! - `kind`: the two record kinds (re-exported as `state::Kind`).
//! - `server`: [`run`] (start raft, lease upkeep on the leader, serve, graceful stop).
//! - `validate`: syntax checks of records and schemas (limits, addresses, names).
//! - [`telemetry`]: the names of the Prometheus metrics this crate records.
//! - [`error`]: [`DirError`] and its one mapping to gRPC status codes.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod access;
pub mod batch;
mod config;
pub mod error;
mod kind;
pub mod member;
pub mod raft;
mod server;
mod service;
pub mod state;
pub mod telemetry;
mod validate;

pub use access::DOORS;
pub use config::DirectoryConfig;
pub use error::DirError;
pub use server::{run, run_with_rpc};
pub use validate::{
    MAX_ACCEPTS, MAX_ATTRIBUTES, MAX_EVENTS, MAX_FIELD_LEN, MAX_SCHEMAS, MAX_SERVICES, MAX_SOURCES,
};
