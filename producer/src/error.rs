//! The producer's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). Refusals of a request — the gate's included — are a
//! [`gma_core::Refusal`] (code and message, made with [`gma_core::Refuse`]: `Error::not_found`);
//! the producer's own failures are INTERNAL, a refused registration FAILED_PRECONDITION.

use gma_core::{Refusal, Refuse};
use tonic::Status;

use crate::hub::PublishError;

/// Everything a producer's RPCs and library functions can refuse or fail with. Messages are
/// lowercase, carry no trailing period and say what to do; the variant picks the gRPC code
/// (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request refused with its code: bad pattern, policy, window, filter or event
    /// (INVALID_ARGUMENT), no such event, schema, subscription or simulated host (NOT_FOUND), a
    /// summary-only grant or another identity's subscription (PERMISSION_DENIED), a bound hit
    /// (RESOURCE_EXHAUSTED), no simulated hosts (FAILED_PRECONDITION), the directory out of
    /// reach (UNAVAILABLE), and the gate's refusals.
    #[error(transparent)]
    Refused(#[from] Refusal),
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

impl From<PublishError> for Error {
    fn from(e: PublishError) -> Error {
        match e {
            PublishError::TooManySeries => Error::resource_exhausted(e.to_string()),
            _ => Error::invalid_argument(e.to_string()),
        }
    }
}

gma_core::status_from!(Error,
    e @ Error::Registration(_) => Status::failed_precondition(e.to_string()),
);

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_code_and_keeps_its_message() {
        let cases = [
            (Error::invalid_argument("bad pattern"), Code::InvalidArgument),
            (
                Error::not_found("no subscription 7 on this producer"),
                Code::NotFound,
            ),
            (Error::permission_denied("may not"), Code::PermissionDenied),
            (Error::resource_exhausted("too many"), Code::ResourceExhausted),
            (Error::failed_precondition("no sim"), Code::FailedPrecondition),
            (Error::unavailable("directory down"), Code::Unavailable),
            (
                Error::from(Refusal::from(Status::resource_exhausted("rate limit"))),
                Code::ResourceExhausted,
            ),
            (Error::Registration("ttl".into()), Code::FailedPrecondition),
            (Error::Config("period_ms".into()), Code::Internal),
            (Error::Io(std::io::Error::other("disk")), Code::Internal),
        ];
        gma_core::assert_statuses(cases);
        assert_eq!(
            Status::from(Error::not_found("no subscription 7 on this producer")).message(),
            "no subscription 7 on this producer"
        );
        assert_eq!(
            Status::from(Error::Config("x".into())).message(),
            "invalid producer config: x"
        );
        let series = Status::from(Error::from(PublishError::TooManySeries));
        assert_eq!(series.code(), Code::ResourceExhausted);
        assert_eq!(series.message(), PublishError::TooManySeries.to_string());
        let unknown = Status::from(Error::from(PublishError::UnknownSchema("a.b".into())));
        assert_eq!(unknown.code(), Code::InvalidArgument);
    }
}
