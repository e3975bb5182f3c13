//! gma-broker: the resource broker of Elmroth & Tordsson, built as a consumer of the fabric.
//!
//! - [`reserve`]: the advance-reservation interface (create / modify / release with the
//!   three-way answer granted / never / retry-from) as the coallocator sees it.
//! - [`calendar`]: per-resource reservation calendars (the simulated resource manager's
//!   state, and the in-memory manager used by tests and replays).
//! - [`coalloc`]: the coallocation algorithm (sliding ε start window, reservations per job,
//!   exchange along shortest augmenting paths, no hold-and-wait, no leaked reservations).
//! - [`replay`]: the paper's randomized coallocation experiment (§5.2.2).

// Tests unwrap freely: a panic there is the failure report. Library code never unwraps.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod calendar;
pub mod coalloc;
pub mod replay;
pub mod reserve;
