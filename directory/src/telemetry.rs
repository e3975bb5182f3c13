//! Every Prometheus metric this crate records (prefix `gma_directory_`). RPC figures
//! (`gma_directory_rpc_*`) come from [`gma_core::rpc`].

gma_core::metric_names! {
    counter LEASES_EXPIRED = "gma_directory_leases_expired_total",
        "leases expired by this member while it led (their records removed)";
    gauge WATCHERS = "gma_directory_watchers", "open Watch streams on this member";
    gauge IS_LEADER = "gma_directory_is_leader", "1 while this member is the raft leader";
    gauge TERM = "gma_directory_term", "current raft term";
    gauge LAST_APPLIED = "gma_directory_last_applied", "raft log index applied on this member";
    gauge LOG_ENTRIES = "gma_directory_log_entries_in_memory",
        "raft log entries held in memory (appended, not yet purged behind a snapshot)";
    gauge HISTORY_CHANGES = "gma_directory_history_changes", "changes kept for Watch resumption";
    gauge HISTORY_BYTES = "gma_directory_history_bytes",
        "bytes of records (protobuf-encoded) in the changes kept for Watch resumption";
}

/// Samples the terms of this member's memory that grow with use (called every expiry tick).
pub(crate) fn memory(log_entries: usize, (changes, bytes): (usize, usize)) {
    metrics::gauge!(LOG_ENTRIES).set(log_entries as f64);
    metrics::gauge!(HISTORY_CHANGES).set(changes as f64);
    metrics::gauge!(HISTORY_BYTES).set(bytes as f64);
}

/// Samples the raft state into the gauges (called every expiry tick).
pub(crate) fn raft_state(m: &openraft::RaftMetrics<crate::raft::types::NodeId, crate::raft::types::Node>) {
    metrics::gauge!(IS_LEADER).set(if m.current_leader == Some(m.id) { 1.0 } else { 0.0 });
    metrics::gauge!(TERM).set(m.current_term as f64);
    metrics::gauge!(LAST_APPLIED).set(m.last_applied.map(|l| l.index).unwrap_or(0) as f64);
}
