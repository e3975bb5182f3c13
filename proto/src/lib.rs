//! gma-proto: the `gma.v1` wire protocol.
//!
//! Every `.proto` of the fabric lives in `proto/proto/`; `build.rs` compiles them with a
//! vendored `protoc`, so nothing has to be installed by hand.
#![allow(clippy::all)]

pub mod v1 {
    tonic::include_proto!("gma.v1");
}

/// Internal RPCs of the replicated directory (raft, forwarding, membership).
pub mod raft {
    tonic::include_proto!("gma.raft.v1");
}

/// Interface version answered by every `Version` RPC.
pub const INTERFACE_VERSION: &str = "gma.v1";
