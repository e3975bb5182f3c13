//! The archiver's one error type and its one mapping to gRPC status codes (model:
//! `gma_directory::error`). Refusals of a query — the gate's included — are a
//! [`gma_core::Refusal`] (made with [`gma_core::Refuse`]: `Error::not_found`); a store error
//! caused by the request is INVALID_ARGUMENT, the archiver's own failures INTERNAL.

use gma_core::Refusal;
use tonic::Status;

use crate::store::StoreError;

/// Everything the archiver's queries and set-up can refuse or fail with. Messages are
/// lowercase, carry no trailing period and say what to do; the variant picks the gRPC code
/// (`impl From<Error> for Status`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A query refused with its code: a bad pattern, field, window or aggregate
    /// (INVALID_ARGUMENT), no series stored for it (NOT_FOUND), a summary-only grant where only
    /// raw data answers (PERMISSION_DENIED), and the gate's refusals.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The configuration is invalid, or the data directory does not fit it (never reaches a
    /// client). INTERNAL.
    #[error("invalid archiver config: {0}")]
    Config(String),
    /// The store failed; its `Invalid` is a bad query (INVALID_ARGUMENT, message as is), the
    /// rest INTERNAL.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The gRPC server failed (never reaches a client). INTERNAL.
    #[error("server error: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The `[remote_write]` section is invalid, or its resume state cannot be read (the role
    /// does not start; never reaches a client). INTERNAL.
    #[error("invalid archiver config: {0}")]
    RemoteWrite(#[from] crate::remote_write::RemoteWriteError),
    /// Reading a file or binding a socket failed (never reaches a client). INTERNAL.
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
}

gma_core::status_from!(Error,
    Error::Store(StoreError::Invalid(m)) => Status::invalid_argument(m),
    Error::Store(s) => Status::internal(s.to_string()),
);

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::Refuse;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_code_and_keeps_its_message() {
        gma_core::assert_statuses([
            (
                Error::invalid_argument("aggregate 42 is unknown"),
                Code::InvalidArgument,
            ),
            (Error::not_found("no series stored for x"), Code::NotFound),
            (
                Error::from(Refusal::resource_exhausted("rate limit")),
                Code::ResourceExhausted,
            ),
            (Error::Config("data_dir".into()), Code::Internal),
            (Error::Io(std::io::Error::other("disk")), Code::Internal),
            (
                Error::from(crate::remote_write::RemoteWriteError::config("remote_write.url")),
                Code::Internal,
            ),
        ]);
        assert_eq!(
            Status::from(Error::Config("data_dir".into())).message(),
            "invalid archiver config: data_dir"
        );
        // A store error says what the store said, without the variant's prefix.
        let cases = [
            (
                Error::Store(StoreError::Invalid("step: too small".into())),
                Code::InvalidArgument,
                "step: too small",
            ),
            (
                Error::Store(StoreError::Storage("disk".into())),
                Code::Internal,
                "storage: disk",
            ),
        ];
        for (e, code, msg) in cases {
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, msg));
        }
    }
}
