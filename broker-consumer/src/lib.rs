//! gma-broker: the resource broker of Elmroth & Tordsson, built as a consumer of the fabric.
//!
//! - [`job`]: job files (TOML) and the `JobSpec` message, validated with errors naming the field.
//! - [`rank`]: the ranking, a pure function of (snapshot, job, policy): requirement filter,
//!   benchmark-scaled execution time, load-based queue wait, stage-in/out; policies ttd, tts,
//!   utility and cost; stale data never used as fresh.
//! - [`utility`]: partial-utility step functions and the four user classes.
//! - [`reserve`]: the advance-reservation interface (create / modify / release with the
//!   three-way answer granted / never / retry-from) as the coallocator sees it.
//! - [`calendar`]: per-resource reservation calendars (the simulated resource manager's
//!   state, and the in-memory manager used by tests and replays).
//! - [`coalloc`]: the coallocation algorithm (sliding ε start window, reservations per job,
//!   exchange along shortest augmenting paths, no hold-and-wait, no leaked reservations).
//! - [`remote`]: resource managers over gRPC (the `Reservations` client side).
//! - [`view`]: the live resource table fed by `host.load` / `host.info` / `host.cpu` /
//!   `site.load`, with static annotations; snapshots are shared, never copied per decision.
//! - [`service`]: the running broker: follows the streams, serves `Broker` (Select,
//!   Coallocate, View), publishes `broker.decision` events.
//! - [`simres`]: `gma simres`, a simulated resource manager serving `Reservations` over
//!   per-resource calendars and publishing `reservation.state` events.
//! - [`placement`]: placement quality: a discrete-event simulation of a synthetic workload
//!   placed by `ttd`, at random and round-robin.
//! - [`replay`]: the paper's randomized coallocation experiment (§5.2.2).

// Tests unwrap freely: a panic there is the failure report. Library code never unwraps.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod calendar;
pub mod coalloc;
pub mod job;
pub mod placement;
pub mod rank;
pub mod remote;
pub mod replay;
pub mod reserve;
pub mod service;
pub mod simres;
pub mod utility;
pub mod view;
