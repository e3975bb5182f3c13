//! The replicated directory: openraft 0.9 over a fsynced log (gma-durable), raft RPCs over
//! tonic.
//!
//! - [`types`]: the raft type configuration (commands, replies, node addresses).
//! - [`codec`]: the raft log's records on disk (protobuf entries, fixed-layout votes).
//! - [`storage`]: `RaftLogStorage` on a gma-durable log, `RaftStateMachine` in memory with a
//!   snapshot file.
//! - [`network`]: raft RPCs over tonic.

pub mod codec;
pub mod network;
pub mod storage;
pub mod types;
