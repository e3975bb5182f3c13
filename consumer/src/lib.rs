//! gma-consumer: the consumer side of the fabric, as a library.
//!
//! - [`connect`]: a gRPC channel to any role.
//! - [`directory`]: search (all pages) and lookups against the directory.
//! - [`emit`]: [`emit::Emitter`], application sensors: push your own events (fields by name)
//!   into a producer's `Ingest` service.
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

pub mod directory;
pub mod emit;
pub mod registrar;
pub mod sink;
pub mod stream;
pub mod subscriber;
pub mod telemetry;

use gma_core::Refusal;
use tonic::transport::Channel;
use tonic::Status;

/// The consumer library's one error type: what its clients (connect, search, subscribe, emit,
/// the registrar) fail with, and what the sink's `Consumer` service refuses. Messages are
/// lowercase, carry no trailing period and say what to do; `impl From<ConsumerError> for
/// Status` is the one mapping to gRPC codes (model: `gma_directory::error`).
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("bad address {0:?}: {1}")]
    Address(String, String),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    #[error("{0}: {msg} ({code:?})", msg = .1.message(), code = .1.code())]
    Rpc(String, tonic::Status),
    #[error("malformed stream from {0}: {1}")]
    Protocol(String, String),
    /// Refused before anything was sent, e.g. an event that does not fit its schema.
    #[error("{0}")]
    Invalid(String),
    /// No member of the directory could be reached (none given, a bad address, all down).
    #[error("{0}")]
    Directory(String),
    /// The directory refused the first registration of a record: its code and message.
    #[error("{0}")]
    Registration(String),
    /// A request to this side (the sink's `Deliver`) refused, with its code; the gate's
    /// refusals included.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

impl From<gma_core::Error> for ConsumerError {
    fn from(e: gma_core::Error) -> ConsumerError {
        ConsumerError::Invalid(e.to_string())
    }
}

/// The one mapping to the wire: a refusal keeps its code, a peer's status its code (with what
/// was being asked in the message); bad input is INVALID_ARGUMENT, a peer out of reach
/// UNAVAILABLE, the rest INTERNAL.
impl From<ConsumerError> for Status {
    fn from(e: ConsumerError) -> Status {
        let msg = e.to_string();
        match e {
            ConsumerError::Refused(r) => r.into(),
            ConsumerError::Rpc(_, s) => Status::new(s.code(), msg),
            ConsumerError::Invalid(_) => Status::invalid_argument(msg),
            ConsumerError::Connect(..) | ConsumerError::Directory(_) => Status::unavailable(msg),
            ConsumerError::Address(..) | ConsumerError::Protocol(..) | ConsumerError::Registration(_) => {
                Status::internal(msg)
            }
        }
    }
}

impl ConsumerError {
    /// The gRPC status behind this error, if any.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            ConsumerError::Rpc(_, s) => Some(s),
            _ => None,
        }
    }
}

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
    let ep =
        gma_core::tls::endpoint(addr).map_err(|e| ConsumerError::Address(addr.to_string(), e.to_string()))?;
    let uri = ep.uri().to_string();
    ep.connect()
        .await
        .map_err(|e| ConsumerError::Connect(uri, error_chain(&e)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::Refuse;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_code_and_keeps_its_message() {
        let cases = [
            (
                ConsumerError::invalid_argument("hello.producer_id must be 1..=512 bytes"),
                Code::InvalidArgument,
            ),
            (
                ConsumerError::from(Refusal::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (
                ConsumerError::Rpc("search".into(), Status::not_found("no record")),
                Code::NotFound,
            ),
            (
                ConsumerError::Invalid("event x: no field y".into()),
                Code::InvalidArgument,
            ),
            (
                ConsumerError::Connect("a:1".into(), "refused".into()),
                Code::Unavailable,
            ),
            (
                ConsumerError::Directory("no directory address given".into()),
                Code::Unavailable,
            ),
            (ConsumerError::Address("x".into(), "bad".into()), Code::Internal),
            (
                ConsumerError::Protocol("a:1".into(), "seq".into()),
                Code::Internal,
            ),
            (ConsumerError::Registration("ttl".into()), Code::Internal),
        ];
        gma_core::assert_statuses(cases);
        assert_eq!(
            Status::from(ConsumerError::Rpc(
                "search".into(),
                Status::not_found("no record")
            ))
            .message(),
            "search: no record (NotFound)"
        );
    }
}
