//! gma-directory: the GMA directory — producers and consumers register metadata records with
//! leases; consumers search and watch them. Metadata only: no event value ever passes here.
//!
//! Modules:
//! - [`state`]: the deterministic state machine (records, schemas, leases, revisions, change
//!   history). `apply(Command) -> Applied` has no I/O and no clock, so a replicated log can
//!   drive it; Search/GetSchema/Watch snapshots are read-only queries on it.
//! - `store`: the only module that touches sled: writes each applied command's keys in one
//!   batch and flushes before the client is answered; loads the state on start.
//! - `service`: the tonic `Directory` implementation: one write lock orders
//!   apply → persist → publish; watchers fan out from a broadcast and catch up from history.
//! - `server`: [`DirectoryConfig`] and [`run`] (open store, extend leases, expiry ticker,
//!   serve, graceful stop).
//! - `validate`: syntax checks of records and schemas (limits, addresses, names).
//! - [`error`]: [`DirError`] and its one mapping to gRPC status codes.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod error;
mod server;
mod service;
pub mod state;
mod store;
mod validate;

pub use error::DirError;
pub use server::{run, DirectoryConfig};
pub use validate::{
    MAX_ACCEPTS, MAX_ATTRIBUTES, MAX_EVENTS, MAX_FIELD_LEN, MAX_SCHEMAS, MAX_SERVICES, MAX_SOURCES,
};
