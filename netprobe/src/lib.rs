//! gma-netprobe: the network sensor of the fabric — latency and bandwidth between the hosts of
//! a segment, measured so that no two probes ever overlap (GMA white paper, lines 515–516 and
//! 780–797), with forecasts of every link (Network Weather Service style). Design and figures:
//! `docs/netprobe.md`.
//!
//! A netprobe is a producer (`net.rtt`, `net.bw` and their forecasts, `net.probe`) that also
//! serves `Probe` and `Clique` on the same endpoint. The netprobes of one site form a clique; a
//! token circulates among them and only its holder probes, one peer at a time.
//!
//! - [`clique`]: the token protocol as a pure state machine (+ simulation property tests).
//! - [`budget`]: the bytes-per-second cap (a token bucket, pure).
//! - [`probe`]: the `Probe` service (target side) and the measurement of one peer.
//! - [`membership`]: the clique's members from the directory (Search + Watch).
//! - [`events`]: schemas and events (`net.rtt`, `net.bw`, `net.probe`).
//! - [`matrix`]: the link table of `gma net matrix`, from queried events (pure).
//! - [`service`]: the running role: `run(config, listener, shutdown)`.
//! - [`config`]: [`NetprobeConfig`] and its validation.
//! - [`telemetry`]: metric names and counters.

pub mod budget;
pub mod clique;
pub mod config;
pub mod error;
pub mod events;
pub mod matrix;
pub mod membership;
pub mod probe;
pub mod service;
pub mod telemetry;

pub use config::NetprobeConfig;
pub use service::{run, NetprobeError};
