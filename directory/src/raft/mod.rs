//! The replicated directory: openraft 0.9 over sled, raft RPCs over tonic.
//!
//! - [`types`]: the raft type configuration (commands, replies, node addresses).
//! - [`storage`]: `RaftLogStorage` and `RaftStateMachine` on sled.

pub mod network;
pub mod storage;
pub mod types;
