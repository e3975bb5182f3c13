//! What remote write fails with: one typed error for the section's check, the resume state,
//! the store reads, the encoding and one attempt of the client. The messages name the key or
//! the file and say what to do; the archiver wraps them as `invalid archiver config: …` when
//! the role cannot start, and logs them otherwise (a failed attempt is retried).

use std::path::PathBuf;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum RemoteWriteError {
    /// A key of `[remote_write]` is invalid, or a file it names cannot be used (the message
    /// names the key).
    #[error("{0}")]
    Config(String),
    /// The resume state file cannot be read or written durably: `what` is the step ("cannot
    /// read", "create", "fsync", …).
    #[error("{what} {}: {source}", path.display())]
    StateIo {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The resume state file holds something else.
    #[error("{} is not a remote-write resume state ({source}); move it away to start over (everything archived is sent again)", path.display())]
    StateCorrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The resume state cannot be encoded.
    #[error("encode the resume state: {0}")]
    StateEncode(serde_json::Error),
    /// The store cannot be read for a request.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A request cannot be compressed.
    #[error("snappy: {0}")]
    Snappy(#[from] snap::Error),
    /// A blocking task (state file, store read) did not finish.
    #[error("task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// One attempt found no receiver at `authority` (TCP), or could not set up TLS with it.
    #[error("{what} {authority}: {source}")]
    Connect {
        what: &'static str,
        authority: String,
        source: std::io::Error,
    },
    /// One attempt failed in HTTP: `what` is the step ("connection", "send", "handshake with
    /// HOST:PORT").
    #[error("{what}: {source}")]
    Http { what: String, source: hyper::Error },
    /// The request could not be built.
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
}

impl RemoteWriteError {
    /// A bad key of `[remote_write]` (the message names it and says what to do).
    pub fn config(message: impl Into<String>) -> RemoteWriteError {
        RemoteWriteError::Config(message.into())
    }
}
