//! The netprobe's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). Refusals of a request — the gate's included — are a
//! [`gma_core::Refusal`] (made with [`gma_core::Refuse`]: `Error::invalid_argument`); a failed
//! probe of a peer is UNAVAILABLE, the netprobe's own failures INTERNAL.

use gma_core::Refusal;
use tonic::Status;

/// Everything the netprobe's RPCs, probes and set-up can refuse or fail with. Messages are
/// lowercase, carry no trailing period and say what to do; the variant picks the gRPC code
/// (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request refused with its code: a bad payload, member id, token or transfer
    /// (INVALID_ARGUMENT), a request that does not fit this member's state — a transfer without
    /// a reservation, a token of another site (FAILED_PRECONDITION), shutting down
    /// (UNAVAILABLE), and the gate's refusals.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// An echo to a peer failed (this side's probe; never reaches a client). UNAVAILABLE.
    #[error("echo to {0}: {1}")]
    Echo(String, String),
    /// A transfer to a peer failed (this side's probe; never reaches a client). UNAVAILABLE.
    #[error("transfer to {0}: {1}")]
    Transfer(String, String),
    /// The configuration is invalid (never reaches a client). INTERNAL.
    #[error("invalid netprobe config: {0}")]
    Config(String),
    /// The role's embedded producer failed (never reaches a client). INTERNAL.
    #[error("producer: {0}")]
    Producer(String),
    /// Binding or reading failed (never reaches a client). INTERNAL.
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
}

gma_core::status_from!(Error,
    e @ (Error::Echo(..) | Error::Transfer(..)) => Status::unavailable(e.to_string()),
);

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::Refuse;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_code_and_keeps_its_message() {
        let cases = [
            (Error::invalid_argument("token: missing"), Code::InvalidArgument),
            (
                Error::failed_precondition("without a reservation"),
                Code::FailedPrecondition,
            ),
            (Error::unavailable("netprobe shutting down"), Code::Unavailable),
            (
                Error::from(Refusal::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (Error::Echo("b".into(), "refused".into()), Code::Unavailable),
            (Error::Transfer("b".into(), "reset".into()), Code::Unavailable),
            (Error::Config("peers".into()), Code::Internal),
            (Error::Producer("bind".into()), Code::Internal),
            (Error::Io(std::io::Error::other("disk")), Code::Internal),
        ];
        gma_core::assert_statuses(cases);
        assert_eq!(
            Status::from(Error::Echo("b".into(), "refused".into())).message(),
            "echo to b: refused"
        );
        assert_eq!(
            Status::from(Error::Config("x".into())).message(),
            "invalid netprobe config: x"
        );
    }
}
