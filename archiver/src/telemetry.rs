//! Every Prometheus metric this crate records (prefix `gma_archiver_`). RPC figures
//! (`gma_archiver_rpc_*`) come from [`gma_core::rpc`].

pub const SAMPLES: &str = "gma_archiver_samples_total";
pub const GAP_EVENTS: &str = "gma_archiver_gap_events_total";
pub const CHUNKS_SEALED: &str = "gma_archiver_chunks_sealed_total";
pub const BAD_TIMESTAMPS: &str = "gma_archiver_bad_timestamps_total";
/// Events whose stream an append found in its series cache (the events of one series share
/// one `Arc` from the decoder) ...
pub const SERIES_CACHE_HITS: &str = "gma_archiver_series_cache_hits_total";
/// ... and events whose stream it had to resolve (the first of each series in a batch).
pub const SERIES_CACHE_MISSES: &str = "gma_archiver_series_cache_misses_total";

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
    describe_counter!(
        SERIES_CACHE_HITS,
        "appended events whose stream was found in the batch's series cache"
    );
    describe_counter!(
        SERIES_CACHE_MISSES,
        "appended events whose stream had to be resolved (first of its series in a batch)"
    );
}
