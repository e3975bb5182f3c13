//! gma-proto: the `gma.v1` wire protocol.
//!
//! Every `.proto` of the fabric lives in `proto/proto/`; `build.rs` compiles them with a
//! vendored `protoc`, so nothing has to be installed by hand.
//!
//! - [`v1`]: messages (`gma.proto`) and services (`services.proto`, `broker.proto`,
//!   `netprobe.proto`) — what every client uses.
//! - [`wire`]: the producer's side of `Producer.Subscribe` and `Consumer.Deliver` with batches
//!   carried as pre-encoded bytes, so one encoding is shared by every subscriber (same gRPC
//!   paths, same bytes on the wire).
//! - [`raft`]: the directory's internal RPCs.
#![allow(clippy::all)]

pub mod codec;

pub mod v1 {
    tonic::include_proto!("gma.v1");
}

/// Pre-encoded twins of the streaming messages and the services that carry them: the
/// `Producer` server and the `Consumer` client whose stream items hold encoded `EventBatch`es.
pub mod wire {
    pub use crate::wire_gen::v1::{consumer_client, producer_server};
    pub use crate::wire_gen::wire::*;
}

/// Generated code, laid out as its proto packages so its relative paths resolve.
mod wire_gen {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/wire/gma.v1.rs"));
    }
    pub mod wire {
        include!(concat!(env!("OUT_DIR"), "/wire/gma.wire.rs"));
    }
}

/// Internal RPCs of the replicated directory (raft, forwarding, membership).
pub mod raft {
    tonic::include_proto!("gma.raft.v1");
}

/// Interface version answered by every `Version` RPC.
pub const INTERFACE_VERSION: &str = "gma.v1";
