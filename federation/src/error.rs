//! The federation endpoint's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). The gate's own refusals (`PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`
//! from [`gma_core::guard::Gate`]) pass through unchanged as [`Error::Gate`].

use std::path::PathBuf;

use tonic::Status;

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
    /// The request is malformed: bad job, site id, summary, first frame. INVALID_ARGUMENT.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such job or session. NOT_FOUND.
    #[error("{0}")]
    NotFound(String),
    /// The forwarded job is already held here. ALREADY_EXISTS.
    #[error("{0}")]
    AlreadyExists(String),
    /// A site certificate is required and none was presented. UNAUTHENTICATED.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller may not speak for that site, or is not a linked site. PERMISSION_DENIED.
    #[error("{0}")]
    PermissionDenied(String),
    /// A bound was hit: the job queue is full. RESOURCE_EXHAUSTED.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The job cannot take this step in its state (started, a loop, infeasible here).
    /// FAILED_PRECONDITION.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A linked site could not be reached or did not answer in time. UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
    /// A refusal of the gate (rate limit, policy), passed through as is.
    #[error("{}", .0.message())]
    Gate(Box<Status>),
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

impl From<Status> for Error {
    fn from(s: Status) -> Error {
        Error::Gate(Box::new(s))
    }
}

/// A forwarded job refused by this site.
impl From<Reject> for Error {
    fn from(r: Reject) -> Error {
        match r {
            Reject::NotPeer(m) => Error::PermissionDenied(m),
            Reject::Loop(m) | Reject::Infeasible(m) => Error::FailedPrecondition(m),
            Reject::Invalid(m) => Error::InvalidArgument(m),
            Reject::Busy(m) => Error::ResourceExhausted(m),
            Reject::Exists(m) => Error::AlreadyExists(m),
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument(_) => Status::invalid_argument(msg),
            Error::NotFound(_) => Status::not_found(msg),
            Error::AlreadyExists(_) => Status::already_exists(msg),
            Error::Unauthenticated(_) => Status::unauthenticated(msg),
            Error::PermissionDenied(_) => Status::permission_denied(msg),
            Error::ResourceExhausted(_) => Status::resource_exhausted(msg),
            Error::FailedPrecondition(_) => Status::failed_precondition(msg),
            Error::Unavailable(_) => Status::unavailable(msg),
            Error::Gate(s) => *s,
            Error::Config(_) | Error::Producer(_) | Error::Store(_) => Status::internal(msg),
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
                Error::Unavailable("b did not answer within 5s".into()),
                Code::Unavailable,
            ),
            (
                Error::InvalidArgument("job: give the job".into()),
                Code::InvalidArgument,
            ),
            (Error::NotFound("no job \"x\" here".into()), Code::NotFound),
            (Error::AlreadyExists("held".into()), Code::AlreadyExists),
            (
                Error::Unauthenticated("present a site certificate".into()),
                Code::Unauthenticated,
            ),
            (
                Error::PermissionDenied("not a linked site".into()),
                Code::PermissionDenied,
            ),
            (
                Error::ResourceExhausted("the queue is full (1 jobs)".into()),
                Code::ResourceExhausted,
            ),
            (
                Error::FailedPrecondition("has started".into()),
                Code::FailedPrecondition,
            ),
            (
                Error::from(Status::resource_exhausted("rate limit")),
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
        for (e, code) in cases {
            let msg = e.to_string();
            let s = Status::from(e);
            assert_eq!(s.code(), code, "{msg}");
            assert_eq!(s.message(), msg);
        }
        assert_eq!(
            Status::from(Error::Config("site".into())).message(),
            "invalid federation config: site"
        );
    }
}
