//! gma-core: what every role of the fabric shares.
//!
//! - [`event`]: the in-memory event model (values split into doubles and strings, in schema order)
//!   and schema validation.
//! - [`pattern`]: event-name and source patterns (`host.*`), parsed once, with precise errors.
//! - [`codec`]: the compact `EventBatch` encoding (series declared once, packed doubles,
//!   delta-coded seqs and timestamps) — encoder for producers, decoder for consumers.
//! - [`filter`]: filter expressions over events (`host.cpu.user > 50`), parsed once, checked
//!   against schemas, compiled per schema to index-only three-valued evaluation.
//! - [`cli`]: the command-line flags every serving process shares (TLS, endpoint, listen and
//!   directory), the security they set, binding a listener, the shutdown signal.
//! - [`config`]: TOML loading with unknown keys rejected.
//! - [`endpoint`]: the endpoint section every serving role shares (`[tls]`, `access_policy`,
//!   `[limits]`, `metrics_listen`, `rpc_events_ms`) and the `Version` answer.
//! - [`registration`]: the registration section of every role that keeps a directory record
//!   (`directory`, `id`, `advertise`, `site`, `org`, `lease_ttl_ms`) and its defaults (the
//!   advertised address, the record id `<source>@<address>`).
//! - [`addr`]: endpoint address helpers and the loopback-only rules.
//! - [`tls`]: TLS settings for servers and clients (rustls via tonic) and the peer's identity.
//! - [`time`]: UTC nanosecond clock.
//! - [`forecast`]: NWS-style adaptive forecaster for one numeric series (the predictor with the
//!   lowest recent error wins), plus trace evaluation and a synthetic load trace.
//! - [`rolling`]: rolling-window mean/min/max summaries (1m, 10m, 60m) over bucket rings.
//! - [`authz`]: identities from X.509 subjects (CN, O) and the one authorization policy
//!   (TOML rules, first match wins; allow / summary-only / deny, rate classes).
//! - [`guard`]: the gate in front of every RPC: authorization plus per-identity limits.
//! - [`error`]: [`Refusal`] (a request refused: gRPC code and message), the part every service
//!   crate's error enum shares, and [`Error`], what gma-core's own functions fail with.
//! - [`rpc`]: the middleware sensor: a tower layer counting every RPC (requests, errors,
//!   latency histogram) for Prometheus and the `gma.rpc` events.
//! - [`telemetry`]: [`metric_names!`], how a crate declares its Prometheus metrics and their
//!   HELP lines.

pub mod addr;
pub mod authz;
pub mod cli;
pub mod codec;
pub mod config;
pub mod conn;
pub mod endpoint;
pub mod error;
pub mod event;
pub mod filter;
pub mod forecast;
pub mod guard;
pub mod pattern;
pub mod registration;
pub mod rolling;
pub mod rpc;
pub mod telemetry;
pub mod time;
pub mod tls;

pub use error::{assert_statuses, Error, Refusal, Refuse};

/// Largest gRPC message any role decodes (requests and stream items): 4 MiB.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Implementation string answered by `Version` RPCs.
pub const SERVER_VERSION: &str = concat!("gma ", env!("CARGO_PKG_VERSION"));

/// Shortens client-supplied text quoted in an error message to `max` characters (plus "..."),
/// so an error never echoes a huge input back (status messages travel in HTTP/2 headers).
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push_str("...");
        out
    }
}
