//! Every Prometheus metric this crate records (prefix `gma_directory_`). RPC figures
//! (`gma_directory_rpc_*`) come from [`gma_core::rpc`].

pub const LEASES_EXPIRED: &str = "gma_directory_leases_expired_total";
pub const WATCHERS: &str = "gma_directory_watchers";
pub const IS_LEADER: &str = "gma_directory_is_leader";
pub const TERM: &str = "gma_directory_term";
pub const LAST_APPLIED: &str = "gma_directory_last_applied";

/// Registers the descriptions (HELP lines) of this crate's metrics with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        LEASES_EXPIRED,
        "leases expired by this member while it led (their records removed)"
    );
    describe_gauge!(WATCHERS, "open Watch streams on this member");
    describe_gauge!(IS_LEADER, "1 while this member is the raft leader");
    describe_gauge!(TERM, "current raft term");
    describe_gauge!(LAST_APPLIED, "raft log index applied on this member");
}

/// Samples the raft state into the gauges (called every expiry tick).
pub(crate) fn raft_state(m: &openraft::RaftMetrics<crate::raft::types::NodeId, crate::raft::types::Node>) {
    metrics::gauge!(IS_LEADER).set(if m.current_leader == Some(m.id) { 1.0 } else { 0.0 });
    metrics::gauge!(TERM).set(m.current_term as f64);
    metrics::gauge!(LAST_APPLIED).set(m.last_applied.map(|l| l.index).unwrap_or(0) as f64);
}
