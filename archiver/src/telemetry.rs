//! Every Prometheus metric this crate records (prefix `gma_archiver_`). RPC figures
//! (`gma_archiver_rpc_*`) come from [`gma_core::rpc`].

pub const SAMPLES: &str = "gma_archiver_samples_total";
pub const GAP_EVENTS: &str = "gma_archiver_gap_events_total";
pub const CHUNKS_SEALED: &str = "gma_archiver_chunks_sealed_total";
pub const BAD_TIMESTAMPS: &str = "gma_archiver_bad_timestamps_total";

/// Registers the descriptions (HELP lines) of this crate's metrics with the installed recorder.
pub fn describe() {
    use metrics::describe_counter;
    describe_counter!(SAMPLES, "samples (rows x fields) made durable");
    describe_counter!(GAP_EVENTS, "events producers could not deliver to the archiver");
    describe_counter!(CHUNKS_SEALED, "compressed chunks sealed into the store");
    describe_counter!(
        BAD_TIMESTAMPS,
        "events not archived: timestamp outside the valid range"
    );
}
