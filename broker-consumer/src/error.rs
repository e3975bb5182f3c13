//! The broker's (and the simulated resource manager's) one error type and its one mapping to
//! gRPC status codes (model: `gma_directory::error`). Refusals of a request — the gate's
//! included — are a [`gma_core::Refusal`] (made with [`gma_core::Refuse`]: `Error::not_found`);
//! the broker's own failures are INTERNAL.

use gma_core::{Refusal, Refuse};

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
    /// A request refused with its code: a bad job, policy, window or owner (INVALID_ARGUMENT),
    /// no such reservation (NOT_FOUND), another owner's reservation or reserving on behalf
    /// without admin (PERMISSION_DENIED), no resource manager or none meeting a job's
    /// requirements (FAILED_PRECONDITION), the directory or a resource manager out of reach
    /// (UNAVAILABLE), an answer of a resource manager this side cannot use (INTERNAL), and the
    /// gate's refusals.
    #[error(transparent)]
    Refused(#[from] Refusal),
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

/// A job that does not parse or validate is bad input.
impl From<JobError> for Error {
    fn from(e: JobError) -> Error {
        Error::invalid_argument(e.to_string())
    }
}

/// What a reservation calendar refused: an unknown id is NOT_FOUND, a reservation of another
/// owner PERMISSION_DENIED.
impl From<ReserveError> for Error {
    fn from(e: ReserveError) -> Error {
        match e {
            ReserveError::NotFound { id } => Error::not_found(format!("reservation {id:?} not found")),
            ReserveError::Invalid(m) => Error::permission_denied(m),
            other => Error::internal(other.to_string()),
        }
    }
}

gma_core::status_from!(Error);

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    #[test]
    fn each_variant_maps_to_its_code_and_keeps_its_message() {
        let cases = [
            (
                Error::invalid_argument("jobs: give at least one job"),
                Code::InvalidArgument,
            ),
            (Error::not_found("reservation \"x\" not found"), Code::NotFound),
            (Error::permission_denied("owner"), Code::PermissionDenied),
            (
                Error::failed_precondition("no resource manager"),
                Code::FailedPrecondition,
            ),
            (
                Error::unavailable("cannot search the directory"),
                Code::Unavailable,
            ),
            (Error::internal("odd answer"), Code::Internal),
            (
                Error::from(Refusal::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (
                Error::Simres("resource: give at least one [[resource]] table".into()),
                Code::Internal,
            ),
            (Error::Producer("bind".into()), Code::Internal),
            // A resource manager's refusal passed on (RunJob's claim) keeps its code.
            (
                Error::from(Refusal::new(
                    Code::ResourceExhausted,
                    "claim of reservation r1 refused",
                )),
                Code::ResourceExhausted,
            ),
            (
                Error::internal("the coallocation task failed: panicked"),
                Code::Internal,
            ),
        ];
        gma_core::assert_statuses(cases);
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
