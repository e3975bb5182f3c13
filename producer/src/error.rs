//! The producer's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). The gate's own refusals (`PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`
//! from [`gma_core::guard::Gate`]) pass through unchanged as [`Error::Gate`].

use tonic::Status;

use crate::hub::PublishError;

/// Everything a producer's RPCs and library functions can refuse or fail with. Messages are
/// lowercase, carry no trailing period and say what to do; the variant picks the gRPC code
/// (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: bad pattern, policy, window, filter, event. INVALID_ARGUMENT.
    #[error("{0}")]
    InvalidArgument(String),
    /// Nothing matched: no event, schema, subscription or simulated host. NOT_FOUND.
    #[error("{0}")]
    NotFound(String),
    /// The caller may not do this (summary-only grant, another identity's subscription).
    /// PERMISSION_DENIED.
    #[error("{0}")]
    PermissionDenied(String),
    /// A bound was hit: too many events in a request, series, derived rules. RESOURCE_EXHAUSTED.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The producer is not set up for this (no simulated hosts). FAILED_PRECONDITION.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A peer (the directory) could not be reached or refused. UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
    /// A refusal of the gate (rate limit, policy, connection slots), passed through as is.
    #[error("{}", .0.message())]
    Gate(Box<Status>),
    /// The configuration is invalid (never reaches a client). INTERNAL.
    #[error("invalid producer config: {0}")]
    Config(String),
    /// A sensor could not be set up (never reaches a client). INTERNAL.
    #[error(transparent)]
    Sensor(#[from] gma_sensors::SensorError),
    /// The gRPC server failed (never reaches a client). INTERNAL.
    #[error("server error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Reading a file or binding a socket failed (never reaches a client). INTERNAL.
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS set-up is invalid (never reaches a client). INTERNAL.
    #[error(transparent)]
    Tls(#[from] gma_core::tls::TlsError),
    /// The directory refused the first registration (a lease TTL outside its range, a policy
    /// that does not allow it): the producer stops rather than serve unregistered.
    /// FAILED_PRECONDITION.
    #[error("the directory refused this producer's registration: {0}")]
    Registration(String),
}

impl Error {
    pub(crate) fn invalid(msg: impl std::fmt::Display) -> Error {
        Error::InvalidArgument(msg.to_string())
    }
}

impl From<Status> for Error {
    fn from(s: Status) -> Error {
        Error::Gate(Box::new(s))
    }
}

impl From<PublishError> for Error {
    fn from(e: PublishError) -> Error {
        match e {
            PublishError::TooManySeries => Error::ResourceExhausted(e.to_string()),
            _ => Error::InvalidArgument(e.to_string()),
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument(_) => Status::invalid_argument(msg),
            Error::NotFound(_) => Status::not_found(msg),
            Error::PermissionDenied(_) => Status::permission_denied(msg),
            Error::ResourceExhausted(_) => Status::resource_exhausted(msg),
            Error::FailedPrecondition(_) => Status::failed_precondition(msg),
            Error::Unavailable(_) => Status::unavailable(msg),
            Error::Gate(s) => *s,
            Error::Registration(_) => Status::failed_precondition(msg),
            Error::Config(_) | Error::Sensor(_) | Error::Transport(_) | Error::Io(_) | Error::Tls(_) => {
                Status::internal(msg)
            }
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
                Error::InvalidArgument("bad pattern".into()),
                Code::InvalidArgument,
            ),
            (
                Error::NotFound("no subscription 7 on this producer".into()),
                Code::NotFound,
            ),
            (Error::PermissionDenied("may not".into()), Code::PermissionDenied),
            (
                Error::ResourceExhausted("too many".into()),
                Code::ResourceExhausted,
            ),
            (
                Error::FailedPrecondition("no sim".into()),
                Code::FailedPrecondition,
            ),
            (Error::Unavailable("directory down".into()), Code::Unavailable),
            (
                Error::from(Status::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (
                Error::from(Status::permission_denied("policy")),
                Code::PermissionDenied,
            ),
            (Error::Registration("ttl".into()), Code::FailedPrecondition),
            (Error::Config("period_ms".into()), Code::Internal),
            (Error::Io(std::io::Error::other("disk")), Code::Internal),
        ];
        for (e, code) in cases {
            let msg = e.to_string();
            let s = Status::from(e);
            assert_eq!(s.code(), code, "{msg}");
            assert_eq!(s.message(), msg);
        }
        assert_eq!(
            Status::from(Error::NotFound("no subscription 7 on this producer".into())).message(),
            "no subscription 7 on this producer"
        );
        let series = Status::from(Error::from(PublishError::TooManySeries));
        assert_eq!(series.code(), Code::ResourceExhausted);
        assert_eq!(series.message(), PublishError::TooManySeries.to_string());
        let unknown = Status::from(Error::from(PublishError::UnknownSchema("a.b".into())));
        assert_eq!(unknown.code(), Code::InvalidArgument);
    }
}
