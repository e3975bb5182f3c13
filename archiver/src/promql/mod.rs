//! PromQL over the archive: the Prometheus HTTP query API (`/api/v1/query`, `query_range`,
//! `series`, `labels`, `label/<name>/values`, `status/buildinfo`) served on the archiver's
//! `http_listen`, so Grafana's Prometheus data source and `promtool query` chart archived
//! history. docs/promql.md is the user's page.
//!
//! - [`eval`]: the evaluator of the supported subset of PromQL (parsed by `promql-parser`) on
//!   an [`eval::Archive`]: selectors with label matchers, range vectors, `rate`, `increase`,
//!   `*_over_time`, aggregations, `topk`, arithmetic with scalars; Prometheus 2.x semantics
//!   (5 m lookback, closed windows, extrapolated rates with counter resets);
//! - [`http`]: the routes, the form/query-string parameters, the JSON answers in Prometheus'
//!   format, and the [`eval::Archive`] over the store that authorizes like the `Archive` gRPC
//!   query (`archive.query` per event name; summary-only grants see the summary series only).
//!
//! An archived series (event, source, field) is named by [`crate::promlabels`]; text fields are
//! not mapped.

use std::time::Duration;

use serde::Deserialize;

pub mod eval;
pub mod http;

/// `[promql]` of the archiver config: the bounds of one query.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromqlConfig {
    /// Most samples one query may load from the archive (each selector's samples counted).
    pub max_samples: usize,
    /// Longest a query may run (a request's `timeout` may shorten it).
    pub timeout_s: u64,
}

impl Default for PromqlConfig {
    fn default() -> Self {
        PromqlConfig {
            max_samples: 5_000_000,
            timeout_s: 120,
        }
    }
}

impl PromqlConfig {
    /// Checks the bounds (for the archiver's config check).
    pub fn validate(&self) -> Result<(), crate::error::Error> {
        let bad = |m: &str| Err(crate::error::Error::Config(m.into()));
        if self.max_samples == 0 {
            return bad("promql.max_samples must be at least 1");
        }
        if self.timeout_s == 0 {
            return bad("promql.timeout_s must be at least 1");
        }
        Ok(())
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_s)
    }
}

/// Why a PromQL request failed; [`Error::status`] is the one mapping to HTTP status and
/// Prometheus `errorType`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A malformed parameter or query, or a construct this evaluator does not support (400
    /// `bad_data`, as Prometheus answers a bad query).
    #[error("{0}")]
    BadData(String),
    /// The query would load more samples than `promql.max_samples` (422 `execution`, as
    /// Prometheus answers its sample limit).
    #[error("query processing would load too many samples into memory in query execution: more than {0} samples (promql.max_samples); narrow the selector or the range")]
    TooManySamples(usize),
    /// The query ran out of time (503 `timeout`).
    #[error("query timed out in query execution after {0:?}; narrow the selector or the range, or raise promql.timeout_s")]
    Timeout(Duration),
    /// The policy refused (403 `forbidden`; 401 for an anonymous caller where a certificate
    /// would help is still 403: the message says what to present), or a rate limit (429).
    #[error("{}", .0.message())]
    Refused(gma_core::Refusal),
    /// The store failed (500 `internal`).
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The HTTP status and Prometheus `errorType` of the error.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            Error::BadData(_) => (400, "bad_data"),
            Error::TooManySamples(_) => (422, "execution"),
            Error::Timeout(_) => (503, "timeout"),
            Error::Refused(r) => match r.code() {
                tonic::Code::ResourceExhausted => (429, "unavailable"),
                tonic::Code::InvalidArgument => (400, "bad_data"),
                tonic::Code::Unauthenticated => (401, "unauthorized"),
                tonic::Code::PermissionDenied => (403, "forbidden"),
                _ => (500, "internal"),
            },
            Error::Internal(_) => (500, "internal"),
        }
    }
}

impl From<crate::store::StoreError> for Error {
    fn from(e: crate::store::StoreError) -> Error {
        match e {
            crate::store::StoreError::Invalid(m) => Error::BadData(m),
            e => Error::Internal(e.to_string()),
        }
    }
}

impl From<crate::error::Error> for Error {
    fn from(e: crate::error::Error) -> Error {
        match e {
            crate::error::Error::Refused(r) => Error::Refused(r),
            crate::error::Error::Store(s) => s.into(),
            e => Error::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::Refuse;

    #[test]
    fn each_error_has_its_status_and_type() {
        assert_eq!(Error::BadData("x".into()).status(), (400, "bad_data"));
        assert_eq!(Error::TooManySamples(3).status(), (422, "execution"));
        assert!(Error::TooManySamples(3)
            .to_string()
            .starts_with("query processing would load too many samples"));
        assert_eq!(Error::Timeout(Duration::from_secs(1)).status(), (503, "timeout"));
        let denied = Error::from(crate::error::Error::permission_denied("bob may not"));
        assert_eq!(denied.status(), (403, "forbidden"));
        assert_eq!(denied.to_string(), "bob may not");
        let invalid = Error::from(crate::store::StoreError::Invalid("bad step".into()));
        assert_eq!(invalid, Error::BadData("bad step".into()));
        assert!(PromqlConfig::default().validate().is_ok());
        let zero = PromqlConfig {
            max_samples: 0,
            ..PromqlConfig::default()
        };
        assert!(zero.validate().is_err());
    }

    #[test]
    fn the_archiver_config_takes_http_listen_and_promql() {
        let c: crate::ArchiverConfig = toml::from_str(
            "data_dir = \"/tmp/x\"\nhttp_listen = \"127.0.0.1:9300\"\n[promql]\nmax_samples = 10\ntimeout_s = 5\n",
        )
        .unwrap_or_default();
        assert_eq!(c.http_listen.as_deref(), Some("127.0.0.1:9300"));
        assert_eq!(
            c.promql,
            PromqlConfig {
                max_samples: 10,
                timeout_s: 5
            }
        );
        assert!(c.validate().is_ok());
        let bad = crate::ArchiverConfig {
            promql: PromqlConfig {
                timeout_s: 0,
                ..PromqlConfig::default()
            },
            ..c.clone()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("promql.timeout_s"));
        // Plain HTTP off loopback is refused like the gRPC listener's plaintext.
        let open = crate::ArchiverConfig {
            http_listen: Some("0.0.0.0:9300".into()),
            ..c
        };
        assert!(open.validate().unwrap_err().to_string().contains("http_listen"));
        let unknown = toml::from_str::<crate::ArchiverConfig>("[promql]\nmax_sample = 1\n");
        assert!(unknown.is_err());
    }
}
