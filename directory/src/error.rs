//! The directory's one error type and its one mapping to gRPC status codes.

use gma_core::Refusal;
use tonic::Status;

/// Everything that can go wrong in the directory. Messages are lowercase, carry no trailing
/// period and say what to do; the variant picks the gRPC code (`impl From<DirError> for Status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum DirError {
    /// A request refused with its code (made with [`gma_core::Refuse`]: `DirError::not_found`):
    /// a bad record, schema, pattern, TTL, page token or raft message (INVALID_ARGUMENT),
    /// Update/Remove/GetSchema matching nothing (NOT_FOUND), a duplicate id or a schema version
    /// redefined (ALREADY_EXISTS), the directory full (RESOURCE_EXHAUSTED), a watch asking for
    /// compacted history (OUT_OF_RANGE), a caller the policy or a member refuses
    /// (PERMISSION_DENIED), a write sent to a follower or a membership change under way
    /// (FAILED_PRECONDITION), the directory or its leader out of reach (UNAVAILABLE), and the
    /// gate's refusals.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The storage engine failed or holds inconsistent data. INTERNAL.
    #[error("directory storage: {0}")]
    Storage(String),
    /// The configuration is invalid (never reaches a client). INTERNAL.
    #[error("invalid directory config: {0}")]
    Config(String),
    /// The gRPC transport failed (never reaches a client). INTERNAL.
    #[error("directory server: {0}")]
    Transport(String),
}

impl From<DirError> for Status {
    fn from(e: DirError) -> Status {
        match e {
            DirError::Refused(r) => r.into(),
            other => Status::internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::Refuse;
    use tonic::Code;

    #[test]
    fn codes() {
        let cases = [
            (DirError::invalid_argument("x"), Code::InvalidArgument),
            (DirError::not_found("x"), Code::NotFound),
            (DirError::already_exists("x"), Code::AlreadyExists),
            (DirError::resource_exhausted("x"), Code::ResourceExhausted),
            (DirError::out_of_range("x"), Code::OutOfRange),
            (DirError::unavailable("x"), Code::Unavailable),
            (DirError::permission_denied("x"), Code::PermissionDenied),
            (DirError::failed_precondition("x"), Code::FailedPrecondition),
            (DirError::Storage("x".into()), Code::Internal),
            (DirError::Config("x".into()), Code::Internal),
            (DirError::Transport("x".into()), Code::Internal),
        ];
        for (e, code) in cases {
            let msg = e.to_string();
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, msg.as_str()));
        }
        assert_eq!(
            Status::from(DirError::not_found("no producer record with id a")).message(),
            "no producer record with id a"
        );
        assert_eq!(
            Status::from(DirError::Storage("x".into())).message(),
            "directory storage: x"
        );
    }
}
