//! gma-consumer: the consumer side of the fabric, as a library.
//!
//! - [`connect`]: a gRPC channel to any role.
//! - [`counted`]: [`counted::CountingConnector`], a channel's own socket bytes counted (benches).
//! - [`directory`]: search (all pages) and lookups against the directory.
//! - [`emit`]: [`emit::Emitter`], application sensors: push your own events (fields by name)
//!   into a producer's `Ingest` service.
//! - [`error`]: [`ConsumerError`], the crate's one error type and its mapping to gRPC statuses.
//! - [`grpc_frames`]: a gRPC response read message by message as slices of its HTTP/2 DATA
//!   frames (no copy into a decode buffer), for the subscriptions' streams.
//! - [`registrar`]: keep a record (producer or consumer) in the directory under a lease.
//! - [`sink`]: accept producer-initiated (pushed) streams: the `Consumer` service.
//! - [`stream`]: [`stream::ProducerStream`], one subscription to one producer that reconnects
//!   with backoff and resumes from its last seq, surfacing gaps the producer reports.
//! - [`telemetry`]: the names of the Prometheus metrics this crate records.
//! - [`subscriber`]: discover every producer of a pattern through Search + Watch, subscribe to
//!   each, and merge their streams into one channel of [`subscriber::Delivery`].

/// Consumer-record attribute: "true" means the consumer subscribes to producers itself (its
/// `address` serves something else, e.g. the archiver's queries), so producers must not push.
pub const PULL_ATTRIBUTE: &str = "gma.pull";

pub mod counted;
pub mod directory;
pub mod emit;
pub mod error;
pub mod grpc_frames;
pub mod registrar;
pub mod sink;
pub mod stream;
pub mod subscriber;
pub mod telemetry;

pub use error::ConsumerError;

use tonic::transport::Channel;

/// Whether a status is a refusal that asking again will not change (not allowed, not
/// authenticated, or a request the server cannot accept): callers stop and report it rather
/// than retry. Only UNAVAILABLE and the like are worth retrying.
pub fn is_refusal(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::PermissionDenied | tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
    )
}

/// Opens a channel to `addr` (`host:port` or `http(s)://host:port`), with this process's
/// client TLS when one is installed ([`gma_core::tls::install_client`]).
pub async fn connect(addr: &str) -> Result<Channel, ConsumerError> {
    connect_with(addr, |ep| ep, None).await
}

/// [`connect`] with the endpoint's settings adjusted by `adjust` (e.g. a stream's frame size)
/// and, with `bytes`, the connection's socket bytes counted into them ([`counted`]).
pub(crate) async fn connect_with(
    addr: &str,
    adjust: impl FnOnce(tonic::transport::Endpoint) -> tonic::transport::Endpoint,
    bytes: Option<counted::SocketBytes>,
) -> Result<Channel, ConsumerError> {
    let ep =
        gma_core::tls::endpoint(addr).map_err(|e| ConsumerError::Address(addr.to_string(), e.to_string()))?;
    let ep = adjust(ep);
    let uri = ep.uri().to_string();
    let connected = match bytes {
        None => ep.connect().await,
        Some(bytes) => {
            ep.connect_with_connector(counted::CountingConnector { bytes })
                .await
        }
    };
    connected.map_err(|e| ConsumerError::Connect(uri, error_chain(&e)))
}

/// Renders an error with its sources, for one-line messages.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}
