//! gma-proto: the `gma.v1` wire protocol.
//!
//! Every `.proto` of the fabric lives in `proto/proto/`; `build.rs` compiles them with a
//! vendored `protoc`, so nothing has to be installed by hand. Each service is declared once, so
//! every file of the folder compiles together in any language (`python -m grpc_tools.protoc -I
//! proto/proto ... $(find proto/proto -name '*.proto')`; tested here and in tests/tests/wire.rs).
//!
//! - [`v1`]: messages (`gma.proto`) and services (`services.proto`, `broker.proto`,
//!   `netprobe.proto`) — what every client uses.
//! - [`wire`]: the producer's side of `Producer.Subscribe` and `Consumer.Deliver` with batches
//!   carried as pre-encoded bytes, so one encoding is shared by every subscriber (generated from
//!   the same service declarations: same gRPC paths, same bytes on the wire).
//! - [`raft`]: the directory's internal RPCs.
//! - [`FILE_DESCRIPTOR_SET`]: the descriptors of all of them ([`rpcs`] lists every RPC).
#![allow(clippy::all)]

pub mod codec;

pub mod v1 {
    tonic::include_proto!("gma.v1");
}

/// The producer's side of `Producer.Subscribe` and `Consumer.Deliver`, whose batches travel
/// pre-encoded: one encoding of an `EventBatch` is shared by every subscriber.
///
/// [`SubscribeResponse`] and [`DeliverRequest`] are Rust twins of the `gma.v1` messages of the
/// same names, with the `EventBatch` field held as its encoded bytes. A `bytes` field and an
/// embedded message field with the same number are the same on the wire (both
/// length-delimited), so a consumer decodes them as `gma.v1.SubscribeResponse` and
/// `gma.v1.DeliverRequest`. [`producer_server`] and [`consumer_client`] are generated from the
/// one declaration of the services in `services.proto` (build.rs), with these two messages in
/// place of the public ones: same services, methods and gRPC paths, same bytes on the wire.
pub mod wire {
    use prost::bytes::Bytes;

    pub use crate::wire_gen::{consumer_client, producer_server};

    /// `gma.v1.SubscribeResponse` with its `batch` (an `EventBatch`) pre-encoded.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct SubscribeResponse {
        #[prost(uint64, tag = "1")]
        pub subscription_id: u64,
        /// An encoded `gma.v1.EventBatch` (empty: none, as an absent message field).
        #[prost(bytes = "bytes", tag = "2")]
        pub batch: Bytes,
    }

    /// `gma.v1.DeliverRequest` with its `batch` (an `EventBatch`) pre-encoded.
    #[derive(Clone, PartialEq, ::prost::Message)]
    pub struct DeliverRequest {
        #[prost(oneof = "deliver_request::Msg", tags = "1, 2")]
        pub msg: ::core::option::Option<deliver_request::Msg>,
    }

    pub mod deliver_request {
        use prost::bytes::Bytes;

        #[derive(Clone, PartialEq, ::prost::Oneof)]
        pub enum Msg {
            #[prost(message, tag = "1")]
            Hello(crate::v1::DeliverHello),
            /// An encoded `gma.v1.EventBatch`.
            #[prost(bytes = "bytes", tag = "2")]
            Batch(Bytes),
        }
    }
}

/// Generated code of the producer's side of the streaming services (see [`wire`]).
mod wire_gen {
    include!(concat!(env!("OUT_DIR"), "/wire/gma.v1.rs"));
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
    rpcs_of(FILE_DESCRIPTOR_SET)
}

/// Every RPC of every service in an encoded `FileDescriptorSet`, sorted by path.
pub fn rpcs_of(file_descriptor_set: &[u8]) -> Result<Vec<Rpc>, prost::DecodeError> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(file_descriptor_set)?;
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
        // Each path once: every service is declared once.
        let mut paths: Vec<&str> = rpcs.iter().map(|r| r.path.as_str()).collect();
        paths.dedup();
        assert_eq!(paths.len(), rpcs.len());
    }

    /// The twins of `wire` are the public messages on the wire: what the producer sends
    /// decodes as the public message, and the public message encodes to the same bytes.
    #[test]
    fn the_wire_twins_are_the_public_messages_on_the_wire() {
        use prost::Message;
        let batch = v1::EventBatch {
            series: vec![v1::SeriesDecl {
                id: 7,
                name: "host.load".into(),
                source: "h1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let encoded = prost::bytes::Bytes::from(batch.encode_to_vec());
        let twin = wire::SubscribeResponse {
            subscription_id: 42,
            batch: encoded.clone(),
        };
        let public = v1::SubscribeResponse {
            subscription_id: 42,
            batch: Some(batch.clone()),
        };
        assert_eq!(twin.encode_to_vec(), public.encode_to_vec());
        assert_eq!(
            v1::SubscribeResponse::decode(&twin.encode_to_vec()[..]).unwrap(),
            public
        );
        // The first message carries no batch, as the public message with none.
        let first = wire::SubscribeResponse {
            subscription_id: 42,
            batch: Default::default(),
        };
        let none = v1::SubscribeResponse {
            subscription_id: 42,
            batch: None,
        };
        assert_eq!(first.encode_to_vec(), none.encode_to_vec());

        let hello = v1::DeliverHello {
            producer_id: "p".into(),
            address: "127.0.0.1:1".into(),
            epoch: 3,
            events: vec!["host.*".into()],
            subscription_id: 9,
        };
        for (twin, public) in [
            (
                wire::deliver_request::Msg::Hello(hello.clone()),
                v1::deliver_request::Msg::Hello(hello),
            ),
            (
                wire::deliver_request::Msg::Batch(encoded),
                v1::deliver_request::Msg::Batch(batch),
            ),
        ] {
            let twin = wire::DeliverRequest { msg: Some(twin) };
            let public = v1::DeliverRequest { msg: Some(public) };
            assert_eq!(twin.encode_to_vec(), public.encode_to_vec());
            assert_eq!(
                v1::DeliverRequest::decode(&twin.encode_to_vec()[..]).unwrap(),
                public
            );
        }
    }

    /// The twins' field numbers are the public messages' (from the descriptor set).
    #[test]
    fn the_wire_twins_have_the_field_numbers_of_the_public_messages() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
        let fields = |name: &str| -> Vec<(String, i32)> {
            let m = set
                .file
                .iter()
                .filter(|f| f.package() == "gma.v1")
                .flat_map(|f| &f.message_type)
                .find(|m| m.name() == name)
                .unwrap_or_else(|| panic!("gma.v1.{name} missing"));
            m.field
                .iter()
                .map(|f| (f.name().to_string(), f.number()))
                .collect()
        };
        assert_eq!(
            fields("SubscribeResponse"),
            vec![("subscription_id".to_string(), 1), ("batch".to_string(), 2)]
        );
        assert_eq!(
            fields("DeliverRequest"),
            vec![("hello".to_string(), 1), ("batch".to_string(), 2)]
        );
    }

    /// Every .proto under proto/ compiles together (what a client in another language does):
    /// no symbol is declared twice.
    #[test]
    fn every_proto_file_compiles_together() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
        let mut files = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "proto") {
                    files.push(p);
                }
            }
        }
        files.sort();
        assert!(files.len() >= 6, "{files:?}");
        let out = std::env::temp_dir().join(format!("gma-proto-all-{}.bin", std::process::id()));
        let r = std::process::Command::new(protoc_bin_vendored::protoc_bin_path().unwrap())
            .arg("-I")
            .arg(&dir)
            .arg(format!("--descriptor_set_out={}", out.display()))
            .args(&files)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&out);
        assert!(
            r.status.success(),
            "protoc over every file of proto/: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
}
