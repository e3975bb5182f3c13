//! gma-rescheduler: the job-migration rescheduler (GrADS, notes §1.3.3), as a GMA consumer.
//!
//! The decision is a pure function (STYLE rule 7): it takes a snapshot of the application's
//! state and of the hosts' load and returns a [`Plan`], with no I/O and no clock inside. The
//! async service that gathers the snapshot (host load from producers, contract-monitor
//! requests, application completions) and applies the plan (STOP/RESUME, `AdjustTolerance`
//! back to the contract monitor) is built on top of it.
//!
//! - [`plan`](mod@plan): the decision. [`gain`] and [`decide`] are the paper's rule
//!   `(ret_current - (ret_new + C)) / ret_current > threshold`; [`plan()`] picks the target
//!   hosts, predicts both remaining times and applies the rule and the overrides of a
//!   [`Policy`].
//!
//! - [`service`]: the async shell: follows `host.load`, `app.state` and `app.contract`,
//!   evaluates, publishes `resched.decision`, applies the plan through an [`action`].
//! - [`action`]: how a plan is applied: the application's `AppControl` service, or commands.
//! - [`telemetry`]: the names of the Prometheus metrics this crate records.
//!
//! The contract monitor that raises the requests lives in `gma_sensors::contract`.

// Tests unwrap freely: a panic there is the failure report. Library code never unwraps.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod action;
pub mod error;
pub mod plan;
pub mod service;
pub mod telemetry;

pub use plan::{
    decide, gain, plan, slowdown, AppState, Decision, Force, HostLoad, Mode, Plan, PlanError, Policy,
};

/// The version of `app.state`: 2 is version 1 with `batch_job` appended (a reader of version
/// 1's fields, by name or by position, reads them unchanged). A new version because the
/// directory refuses a different definition under an existing one.
pub const APP_STATE_VERSION: u32 = 2;

/// `app.state`: where an application runs and how far it is (the rescheduler's input; published
/// by applications such as `gma app-sim`).
pub fn app_state_schema() -> gma_proto::v1::EventSchema {
    let mut s = gma_core::event::schema(
        "app.state",
        "an application's placement and progress",
        vec![
            gma_core::event::dbl("phase", "", "phases completed"),
            gma_core::event::dbl("phases", "", "phases in all"),
            gma_core::event::dbl(
                "fraction_completed",
                "",
                "predicted work done / all predicted work",
            ),
            gma_core::event::dbl(
                "total_predicted_s",
                "s",
                "predicted run time of all phases on an unloaded host",
            ),
            gma_core::event::dbl(
                "avg_ratio",
                "",
                "running average of actual / predicted phase times",
            ),
            gma_core::event::text("app_id", "application id"),
            gma_core::event::text("state", "running, stopping, stopped, resuming, completed"),
            gma_core::event::text("hosts", "comma-separated hosts the application runs on"),
            gma_core::event::text("control", "address of the application's AppControl service"),
            gma_core::event::text(
                "batch_job",
                "the batch system's job id it runs as (\"\" when it runs outside one)",
            ),
        ],
    );
    s.version = APP_STATE_VERSION;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn app_state_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&app_state_schema()),
            "app.state v2: phase double, phases double, fraction_completed double, total_predicted_s double s, avg_ratio double, app_id string, state string, hosts string, control string, batch_job string"
        );
    }
}
