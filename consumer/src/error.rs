//! The consumer library's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`).

use gma_core::Refusal;
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
