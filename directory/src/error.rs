//! The directory's one error type and its one mapping to gRPC status codes.

use gma_core::Refusal;
use tonic::Status;

/// Everything that can go wrong in the directory. Messages are lowercase, carry no trailing
/// period and say what to do; the variant picks the gRPC code (`impl From<DirError> for Status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum DirError {
    /// The storage engine failed or holds inconsistent data. INTERNAL.
    #[error("directory storage: {0}")]
    Storage(String),
    /// The configuration is invalid (never reaches a client). INTERNAL.
    #[error("invalid directory config: {0}")]
    Config(String),
    /// The gRPC transport failed (never reaches a client). INTERNAL.
    #[error("directory server: {0}")]
    Transport(String),
    /// A request refused with its code (made with [`gma_core::Refuse`]: `DirError::not_found`):
    /// a bad record, schema, pattern, TTL, page token or raft message (INVALID_ARGUMENT),
    /// Update/Remove/GetSchema matching nothing (NOT_FOUND), a duplicate id or a schema version
    /// redefined (ALREADY_EXISTS), the directory full (RESOURCE_EXHAUSTED), a watch asking for
    /// compacted history (OUT_OF_RANGE), a caller the policy or a member refuses
    /// (PERMISSION_DENIED), a write sent to a follower or a membership change under way
    /// (FAILED_PRECONDITION), the directory or its leader out of reach (UNAVAILABLE), and the
    /// gate's refusals.
    ///
    /// Serialized as the refusal alone (`{"NotFound": "…"}`), as these replies were when
    /// each code was a variant here.
    #[error(transparent)]
    #[serde(untagged)]
    Refused(#[from] Refusal),
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

    #[test]
    fn replies_serialize_as_before_the_refusal_was_shared() {
        let cases = [
            (
                DirError::not_found("no producer record with id a"),
                r#"{"NotFound":"no producer record with id a"}"#,
            ),
            (
                DirError::permission_denied("may not"),
                r#"{"PermissionDenied":"may not"}"#,
            ),
            (DirError::Storage("disk".into()), r#"{"Storage":"disk"}"#),
        ];
        for (e, json) in cases {
            assert_eq!(serde_json::to_string(&e).unwrap(), json);
            assert_eq!(serde_json::from_str::<DirError>(json).unwrap(), e);
        }
    }
}
