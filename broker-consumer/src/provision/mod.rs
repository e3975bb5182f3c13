//! Provisioning for workflows (Singh, Kesselman, Deelman, HPDC'07): resource managers offer
//! slots (processors of a resource over a time window, at a price); a client chooses which
//! slots to take for a workflow DAG. Pure: no I/O.
//!
//! - [`format`]: the workflow and slot-offer files (TOML), validated with precise errors.
//! - [`free`]: slots cut from a resource manager's calendar (its free processors).
//! - [`offers`]: the newest complete `rm.slots` snapshot per manager, as a broker follows them.
//! - [`heft`]: slot-aware HEFT, the makespan of a workflow on a set of slots (∞ = `None`).
//! - [`moga`]: the multi-objective GA over (allocation cost, makespan) with its Pareto
//!   archive, the exact front by brute force for small offers, and the α trade-off choice.
//! - [`execution`]: provisioned against best-effort execution on a batch-scheduled site with
//!   background load (the paper's §5–6 comparison).
//! - [`synthetic`]: the paper's synthetic-slot experiment set-up (§3).
//!
//! docs/provisioning.md describes the formats, the algorithm choices and what is not done.

pub mod execution;
pub mod format;
pub mod free;
pub mod heft;
pub mod moga;
pub mod offers;
pub mod synthetic;

pub use format::{FormatError, Offer, Slot, Workflow};
pub use heft::{Problem, Schedule};
pub use moga::{choose, moga, MogaConfig, Outcome, Plan};
