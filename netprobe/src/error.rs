//! The netprobe's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). The gate's own refusals (`PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`
//! from [`gma_core::guard::Gate`]) pass through unchanged as [`Error::Gate`].

use tonic::Status;

/// Everything the netprobe's RPCs, probes and set-up can refuse or fail with. Messages are
/// lowercase, carry no trailing period and say what to do; the variant picks the gRPC code
/// (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: payload, member id, token, transfer. INVALID_ARGUMENT.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request does not fit this member's state: a transfer without a reservation, a
    /// token of another site. FAILED_PRECONDITION.
    #[error("{0}")]
    FailedPrecondition(String),
    /// This netprobe cannot answer now (shutting down). UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
    /// A refusal of the gate (rate limit, policy), passed through as is.
    #[error("{}", .0.message())]
    Gate(Box<Status>),
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

impl From<Status> for Error {
    fn from(s: Status) -> Error {
        Error::Gate(Box::new(s))
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument(_) => Status::invalid_argument(msg),
            Error::FailedPrecondition(_) => Status::failed_precondition(msg),
            Error::Unavailable(_) | Error::Echo(..) | Error::Transfer(..) => Status::unavailable(msg),
            Error::Gate(s) => *s,
            Error::Config(_) | Error::Producer(_) | Error::Io(_) => Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_code_and_keeps_its_message() {
        let cases = [
            (
                Error::InvalidArgument("token: missing".into()),
                Code::InvalidArgument,
            ),
            (
                Error::FailedPrecondition("without a reservation".into()),
                Code::FailedPrecondition,
            ),
            (
                Error::Unavailable("netprobe shutting down".into()),
                Code::Unavailable,
            ),
            (
                Error::from(Status::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (
                Error::from(Status::permission_denied("policy")),
                Code::PermissionDenied,
            ),
            (Error::Echo("b".into(), "refused".into()), Code::Unavailable),
            (Error::Transfer("b".into(), "reset".into()), Code::Unavailable),
            (Error::Config("peers".into()), Code::Internal),
            (Error::Producer("bind".into()), Code::Internal),
            (Error::Io(std::io::Error::other("disk")), Code::Internal),
        ];
        for (e, code) in cases {
            let msg = e.to_string();
            let s = Status::from(e);
            assert_eq!(s.code(), code, "{msg}");
            assert_eq!(s.message(), msg);
        }
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
