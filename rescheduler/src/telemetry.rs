//! Every Prometheus metric this crate records (prefix `gma_rescheduler_`). RPC figures
//! (`gma_rescheduler_rpc_*`) come from [`gma_core::rpc`]; the producer inside the rescheduler
//! (which serves its decisions) reports `gma_producer_*`.

gma_core::metric_names! {
    counter DECISIONS = "gma_rescheduler_decisions_total", "decisions published, by decision (MIGRATE, STAY)";
    histogram(Seconds) DECIDE_SECONDS = "gma_rescheduler_decide_seconds",
        "trigger event to published decision";
    counter MIGRATIONS_FAILED = "gma_rescheduler_migration_failures_total",
        "stop or resume actions that failed (retried or abandoned)";
}
