//! The one error type of the crate.

use std::path::{Path, PathBuf};

/// Why a sensor could not sample or a simulation could not be configured.
///
/// A failed `sample()` is never fatal: the producer logs and counts it and samples the other
/// sensors as usual (STYLE rule 6).
#[derive(Debug, thiserror::Error)]
pub enum SensorError {
    /// A file could not be read (missing, unreadable, not UTF-8).
    #[error("cannot read {}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A file's text did not have the expected shape. `line` is 1-based; 0 means the file as a
    /// whole (a required line or key is missing).
    #[error("cannot parse {file} line {line}: {message}")]
    Parse {
        file: String,
        line: usize,
        message: String,
    },
    /// A config (simulation file, `[[process]]` table) that does not parse or validate;
    /// `origin` is the file (or `<sim config>` for text).
    #[error("invalid config {origin}: {message}")]
    Config { origin: String, message: String },
    /// A request to a running simulation that cannot be honoured (unknown host or key, bad value).
    #[error("simulation: {0}")]
    Sim(String),
    /// A host command gave nothing to read: not installed, printed nothing, or exited with a
    /// code that means failure (the message names the command).
    #[error("{0}")]
    Command(String),
}

impl SensorError {
    #[cold]
    pub(crate) fn parse(file: &str, line: usize, message: impl Into<String>) -> SensorError {
        SensorError::Parse {
            file: file.to_string(),
            line,
            message: message.into(),
        }
    }

    pub(crate) fn config(origin: &str, message: impl Into<String>) -> SensorError {
        SensorError::Config {
            origin: origin.to_string(),
            message: message.into(),
        }
    }

    /// Says where in a config a config error is: `host "a": ` before its message.
    pub(crate) fn within(self, place: &str) -> SensorError {
        match self {
            SensorError::Config { origin, message } => SensorError::Config {
                origin,
                message: format!("{place}: {message}"),
            },
            other => other,
        }
    }

    /// Names the file a config error came from.
    pub(crate) fn in_origin(self, origin: &str) -> SensorError {
        match self {
            SensorError::Config { message, .. } => SensorError::config(origin, message),
            other => other,
        }
    }

    /// Names the real file in a parse error. Parsers are pure over text and only know the
    /// canonical name (`/proc/stat`); the sensor knows the path it read (which differs under a
    /// test `proc_root`).
    pub fn in_file(self, path: &Path) -> SensorError {
        match self {
            SensorError::Parse { line, message, .. } => SensorError::Parse {
                file: path.display().to_string(),
                line,
                message,
            },
            other => other,
        }
    }
}
