//! gma-federation: multi-site federation (docs/federation.md).
//!
//! - [`summary`]: `site.summary`, a site's state aggregated per resource class; `merge` is
//!   associative and commutative; proto and event encodings.
//! - [`route`]: the pure forwarding decision `route(local, peers, job, policy, now)` and the
//!   origin's debit of a peer summary after a forward.
//! - [`site`]: the site's job manager, a state machine without I/O: placement through
//!   `route()`, simulated execution, forwarding with start grants and origin leases,
//!   reconciliation, split-horizon summaries, what is persisted.
//! - [`service`]: the running federation endpoint: the `Federation` and `SiteScheduler`
//!   services, sessions to linked sites, the effects of the manager.
//! - [`grid`]: resource queries through the hierarchy of endpoints (down to children, up to
//!   the parent only when the subtree has nothing, bounded by levels) and reservations
//!   through the endpoint that manages a host.
//! - [`links`]: peer links as directory records, kept alive by the endpoint.
//! - [`config`]: `gma federation --config FILE`.
//! - [`store`]: the endpoint's state file.
//! - [`tree`]: the hierarchy around an endpoint (superiors, inferiors, link health, free CPUs
//!   per subtree), walked with `FederationStatus` (`gma federation tree`, the dashboard).
//! - [`sim`]: a discrete-event world of sites running the same manager (benchmark, tests).

// Tests unwrap freely: a panic there is the failure report. Library code never unwraps.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod config;
pub mod error;
pub mod grid;
pub mod links;
pub mod reattach;
pub mod route;
pub mod service;
pub mod sim;
pub mod site;
pub mod store;
pub mod summary;
pub mod tree;
