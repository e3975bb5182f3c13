//! Every Prometheus metric this crate records (prefix `gma_rescheduler_`). RPC figures
//! (`gma_rescheduler_rpc_*`) come from [`gma_core::rpc`]; the producer inside the rescheduler
//! (which serves its decisions) reports `gma_producer_*`.

pub const DECISIONS: &str = "gma_rescheduler_decisions_total";
pub const DECIDE_SECONDS: &str = "gma_rescheduler_decide_seconds";
pub const MIGRATIONS_FAILED: &str = "gma_rescheduler_migration_failures_total";

/// Registers the descriptions (HELP lines) of this crate's metrics with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(DECISIONS, "decisions published, by decision (MIGRATE, STAY)");
    describe_histogram!(
        DECIDE_SECONDS,
        Unit::Seconds,
        "trigger event to published decision"
    );
    describe_counter!(
        MIGRATIONS_FAILED,
        "stop or resume actions that failed (retried or abandoned)"
    );
}
