//! The broker's (and the simulated resource manager's) one error type and its one mapping to
//! gRPC status codes (model: `gma_directory::error`). The gate's own refusals
//! (`PERMISSION_DENIED`, `RESOURCE_EXHAUSTED` from [`gma_core::guard::Gate`]) pass through
//! unchanged as [`Error::Gate`].

use tonic::Status;

use crate::reserve::ReserveError;

/// A job file that does not describe a valid job: the message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobError {
    #[error("cannot read job file {path}: {message}")]
    Read { path: String, message: String },
    #[error("invalid job file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("{field}: {message}")]
    Field { field: String, message: String },
}

/// Everything the broker's and simres' RPCs and set-up can refuse or fail with. Messages are
/// lowercase, carry no trailing period and say what to do; the variant picks the gRPC code
/// (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: bad job, policy, window, owner. INVALID_ARGUMENT.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such reservation. NOT_FOUND.
    #[error("{0}")]
    NotFound(String),
    /// The caller may not do this (another owner's reservation, reserving on behalf without
    /// admin). PERMISSION_DENIED.
    #[error("{0}")]
    PermissionDenied(String),
    /// Nothing can serve the request as things stand (no resource manager, no reservable
    /// resource meets a job's requirements). FAILED_PRECONDITION.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A peer (the directory, a resource manager) could not be reached. UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
    /// A resource manager answered something this side cannot use. INTERNAL.
    #[error("{0}")]
    Internal(String),
    /// A refusal of the gate (rate limit, policy), passed through as is.
    #[error("{}", .0.message())]
    Gate(Box<Status>),
    /// The broker's configuration is invalid (never reaches a client). INTERNAL.
    #[error("invalid broker config: {0}")]
    Config(String),
    /// The simulated resource manager's configuration is invalid, or it could not start
    /// (never reaches a client; the message names the bad field). INTERNAL.
    #[error("{0}")]
    Simres(String),
    /// The role's embedded producer failed (never reaches a client). INTERNAL.
    #[error("producer: {0}")]
    Producer(String),
}

impl From<Status> for Error {
    fn from(s: Status) -> Error {
        Error::Gate(Box::new(s))
    }
}

/// A job that does not parse or validate is bad input.
impl From<JobError> for Error {
    fn from(e: JobError) -> Error {
        Error::InvalidArgument(e.to_string())
    }
}

/// What a reservation calendar refused: an unknown id is NOT_FOUND, a reservation of another
/// owner PERMISSION_DENIED.
impl From<ReserveError> for Error {
    fn from(e: ReserveError) -> Error {
        match e {
            ReserveError::NotFound { id } => Error::NotFound(format!("reservation {id:?} not found")),
            ReserveError::Invalid(m) => Error::PermissionDenied(m),
            other => Error::Internal(other.to_string()),
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
            Error::FailedPrecondition(_) => Status::failed_precondition(msg),
            Error::Unavailable(_) => Status::unavailable(msg),
            Error::Gate(s) => *s,
            Error::Internal(_) | Error::Config(_) | Error::Simres(_) | Error::Producer(_) => {
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
                Error::InvalidArgument("jobs: give at least one job".into()),
                Code::InvalidArgument,
            ),
            (
                Error::NotFound("reservation \"x\" not found".into()),
                Code::NotFound,
            ),
            (Error::PermissionDenied("owner".into()), Code::PermissionDenied),
            (
                Error::FailedPrecondition("no resource manager".into()),
                Code::FailedPrecondition,
            ),
            (
                Error::Unavailable("cannot search the directory".into()),
                Code::Unavailable,
            ),
            (Error::Internal("odd answer".into()), Code::Internal),
            (
                Error::from(Status::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (
                Error::from(Status::permission_denied("policy")),
                Code::PermissionDenied,
            ),
            (
                Error::Simres("resource: give at least one [[resource]] table".into()),
                Code::Internal,
            ),
            (Error::Producer("bind".into()), Code::Internal),
        ];
        for (e, code) in cases {
            let msg = e.to_string();
            let s = Status::from(e);
            assert_eq!(s.code(), code, "{msg}");
            assert_eq!(s.message(), msg);
        }
        assert_eq!(
            Status::from(Error::Config("rank: x".into())).message(),
            "invalid broker config: rank: x"
        );
        let gone = Status::from(Error::from(ReserveError::NotFound { id: "r1".into() }));
        assert_eq!(
            (gone.code(), gone.message()),
            (Code::NotFound, "reservation \"r1\" not found")
        );
        let theirs = Status::from(Error::from(ReserveError::Invalid("held by bob".into())));
        assert_eq!(
            (theirs.code(), theirs.message()),
            (Code::PermissionDenied, "held by bob")
        );
        let down = Status::from(Error::from(ReserveError::Unavailable {
            resource: "a".into(),
            message: "refused".into(),
        }));
        assert_eq!(down.code(), Code::Internal);
    }
}
