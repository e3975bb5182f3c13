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
//! - [`FILE_DESCRIPTOR_SET`]: the descriptors of all of them ([`rpcs`] lists every RPC).
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

/// The encoded `google.protobuf.FileDescriptorSet` of every `.proto` of the fabric: the
/// public services (`gma.v1`) and the directory's raft service (`gma.raft.v1`), with their
/// imports and comments. The door census enumerates every RPC from it ([`rpcs`]); gRPC
/// reflection can serve it as it is.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gma_descriptor.bin"));

/// One RPC of a service in [`FILE_DESCRIPTOR_SET`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rpc {
    /// The gRPC path: `/gma.v1.Directory/Register`.
    pub path: String,
    /// The request is a stream.
    pub client_streaming: bool,
    /// The response is a stream.
    pub server_streaming: bool,
}

/// Every RPC of every service in [`FILE_DESCRIPTOR_SET`], sorted by path.
pub fn rpcs() -> Result<Vec<Rpc>, prost::DecodeError> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET)?;
    let mut out = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for m in &service.method {
                out.push(Rpc {
                    path: format!("/{}.{}/{}", file.package(), service.name(), m.name()),
                    client_streaming: m.client_streaming(),
                    server_streaming: m.server_streaming(),
                });
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_set_holds_every_service_and_the_raft_service() {
        let rpcs = rpcs().expect("the descriptor set decodes");
        let has = |p: &str| rpcs.iter().any(|r| r.path == p);
        for p in [
            "/gma.v1.Directory/Register",
            "/gma.v1.Producer/Subscribe",
            "/gma.v1.Archive/Query",
            "/gma.v1.Broker/View",
            "/gma.v1.Reservations/Reserve",
            "/gma.v1.Probe/Bulk",
            "/gma.v1.Federation/Exchange",
            "/gma.v1.SiteScheduler/Submit",
            "/gma.raft.v1.Raft/Forward",
        ] {
            assert!(has(p), "{p} missing from {rpcs:#?}");
        }
        let sub = rpcs
            .iter()
            .find(|r| r.path == "/gma.v1.Producer/Subscribe")
            .expect("subscribe");
        assert!(sub.server_streaming && !sub.client_streaming);
        // Each path once: the wire twins of Producer and Consumer are not in the set.
        let mut paths: Vec<&str> = rpcs.iter().map(|r| r.path.as_str()).collect();
        paths.dedup();
        assert_eq!(paths.len(), rpcs.len());
    }
}
