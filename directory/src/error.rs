//! The directory's one error type and its one mapping to gRPC status codes.

use tonic::Status;

/// Everything that can go wrong in the directory. Messages are lowercase, carry no trailing
/// period and say what to do; the variant picks the gRPC code (`impl From<DirError> for Status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum DirError {
    /// The request is malformed: bad record, schema, pattern, TTL, page token. INVALID_ARGUMENT.
    #[error("{0}")]
    InvalidArgument(String),
    /// Update/Remove/GetSchema matched nothing. NOT_FOUND.
    #[error("{0}")]
    NotFound(String),
    /// Register of a duplicate id, or a schema version redefined. ALREADY_EXISTS.
    #[error("{0}")]
    AlreadyExists(String),
    /// The directory is full (`max_records`). RESOURCE_EXHAUSTED.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A watch asked for history that was compacted away. OUT_OF_RANGE.
    #[error("{0}")]
    OutOfRange(String),
    /// The caller may not do this (the leader's policy refused a forwarded command, or a
    /// member refused another's raft traffic). PERMISSION_DENIED.
    #[error("{0}")]
    PermissionDenied(String),
    /// The directory cannot take writes now (shutting down, or storage failed). UNAVAILABLE.
    #[error("{0}")]
    Unavailable(String),
    /// The storage engine failed or holds inconsistent data. INTERNAL.
    #[error("directory storage: {0}")]
    Storage(String),
    /// The configuration is invalid (never reaches a client).
    #[error("invalid directory config: {0}")]
    Config(String),
    /// The gRPC transport failed (never reaches a client).
    #[error("directory server: {0}")]
    Transport(String),
}

impl DirError {
    pub(crate) fn invalid(msg: impl Into<String>) -> DirError {
        DirError::InvalidArgument(msg.into())
    }
}

impl From<DirError> for Status {
    fn from(e: DirError) -> Status {
        let msg = e.to_string();
        match e {
            DirError::InvalidArgument(_) => Status::invalid_argument(msg),
            DirError::NotFound(_) => Status::not_found(msg),
            DirError::AlreadyExists(_) => Status::already_exists(msg),
            DirError::ResourceExhausted(_) => Status::resource_exhausted(msg),
            DirError::OutOfRange(_) => Status::out_of_range(msg),
            DirError::Unavailable(_) => Status::unavailable(msg),
            DirError::PermissionDenied(_) => Status::permission_denied(msg),
            DirError::Storage(_) | DirError::Config(_) | DirError::Transport(_) => Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn codes() {
        let cases = [
            (DirError::invalid("x"), Code::InvalidArgument),
            (DirError::NotFound("x".into()), Code::NotFound),
            (DirError::AlreadyExists("x".into()), Code::AlreadyExists),
            (DirError::ResourceExhausted("x".into()), Code::ResourceExhausted),
            (DirError::OutOfRange("x".into()), Code::OutOfRange),
            (DirError::Unavailable("x".into()), Code::Unavailable),
            (DirError::PermissionDenied("x".into()), Code::PermissionDenied),
            (DirError::Storage("x".into()), Code::Internal),
        ];
        for (e, code) in cases {
            assert_eq!(Status::from(e).code(), code);
        }
        assert_eq!(
            Status::from(DirError::NotFound("no producer record with id a".into())).message(),
            "no producer record with id a"
        );
    }
}
