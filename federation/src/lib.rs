//! gma-federation: multi-site federation (docs/federation.md).
//!
//! - [`summary`]: `site.summary`, a site's state aggregated per resource class; `merge` is
//!   associative and commutative; proto and event encodings.
//! - [`route`]: the pure forwarding decision `route(local, peers, job, policy, now)` and the
//!   origin's debit of a peer summary after a forward.

// Tests unwrap freely: a panic there is the failure report. Library code never unwraps.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod route;
pub mod sim;
pub mod site;
pub mod summary;
