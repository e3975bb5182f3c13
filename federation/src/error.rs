//! The federation endpoint's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). Refusals of a request — the gate's included — are a
//! [`gma_core::Refusal`] (made with [`gma_core::Refuse`]: `Error::not_found`); the federation's
//! own failures are INTERNAL.

use std::path::PathBuf;

use gma_core::{Refusal, Refuse};

/// A refused forward, as the receiver says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    NotPeer(String),
    Loop(String),
    Invalid(String),
    Infeasible(String),
    Busy(String),
    Exists(String),
}

/// The federation state file could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not a federation state file: {1}")]
    Parse(PathBuf, String),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error("{0} holds the state of site {1:?}, not {2:?}: give another data directory")]
    Site(PathBuf, String, String),
}

/// Everything the federation's RPCs and set-up can refuse or fail with. Messages are
/// lowercase, carry no trailing period and say what to do; the variant picks the gRPC code
/// (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request refused with its code: a bad job, site id, summary or first frame
    /// (INVALID_ARGUMENT), no such job or session (NOT_FOUND), a forwarded job already held
    /// (ALREADY_EXISTS), no site certificate (UNAUTHENTICATED), a caller that may not speak for
    /// that site or is not linked (PERMISSION_DENIED), the job queue full (RESOURCE_EXHAUSTED),
    /// a job that cannot take this step in its state (FAILED_PRECONDITION), a linked site out of
    /// reach (UNAVAILABLE), and the gate's refusals.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The configuration is invalid (never reaches a client). INTERNAL.
    #[error("invalid federation config: {0}")]
    Config(String),
    /// The endpoint's embedded producer failed (never reaches a client). INTERNAL.
    #[error("producer: {0}")]
    Producer(String),
    /// The state file failed (never reaches a client). INTERNAL.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A forwarded job refused by this site.
impl From<Reject> for Error {
    fn from(r: Reject) -> Error {
        match r {
            Reject::NotPeer(m) => Error::permission_denied(m),
            Reject::Loop(m) | Reject::Infeasible(m) => Error::failed_precondition(m),
            Reject::Invalid(m) => Error::invalid_argument(m),
            Reject::Busy(m) => Error::resource_exhausted(m),
            Reject::Exists(m) => Error::already_exists(m),
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
                Error::unavailable("b did not answer within 5s"),
                Code::Unavailable,
            ),
            (
                Error::invalid_argument("job: give the job"),
                Code::InvalidArgument,
            ),
            (Error::not_found("no job \"x\" here"), Code::NotFound),
            (Error::already_exists("held"), Code::AlreadyExists),
            (
                Error::unauthenticated("present a site certificate"),
                Code::Unauthenticated,
            ),
            (
                Error::permission_denied("not a linked site"),
                Code::PermissionDenied,
            ),
            (
                Error::resource_exhausted("the queue is full (1 jobs)"),
                Code::ResourceExhausted,
            ),
            (
                Error::failed_precondition("has started"),
                Code::FailedPrecondition,
            ),
            (
                Error::from(Refusal::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (Error::Producer("bind".into()), Code::Internal),
            (Error::from(Reject::NotPeer("a".into())), Code::PermissionDenied),
            (Error::from(Reject::Loop("a".into())), Code::FailedPrecondition),
            (
                Error::from(Reject::Infeasible("a".into())),
                Code::FailedPrecondition,
            ),
            (Error::from(Reject::Invalid("a".into())), Code::InvalidArgument),
            (Error::from(Reject::Busy("a".into())), Code::ResourceExhausted),
            (Error::from(Reject::Exists("a".into())), Code::AlreadyExists),
        ];
        gma_core::assert_statuses(cases);
        assert_eq!(
            Status::from(Error::Config("site".into())).message(),
            "invalid federation config: site"
        );
    }
}
