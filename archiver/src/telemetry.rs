//! Every Prometheus metric this crate records (prefix `gma_archiver_`). RPC figures
//! (`gma_archiver_rpc_*`) come from [`gma_core::rpc`].

gma_core::metric_names! {
    counter SAMPLES = "gma_archiver_samples_total", "samples (rows x fields) made durable";
    counter GAP_EVENTS = "gma_archiver_gap_events_total",
        "events producers could not deliver to the archiver";
    counter CHUNKS_SEALED = "gma_archiver_chunks_sealed_total", "compressed chunks sealed into the store";
    counter BAD_TIMESTAMPS = "gma_archiver_bad_timestamps_total",
        "events not archived: timestamp outside the valid range";
    /// Events whose stream an append found in its series cache (the events of one series share
    /// one `Arc` from the decoder) ...
    counter SERIES_CACHE_HITS = "gma_archiver_series_cache_hits_total",
        "appended events whose stream was found in the batch's series cache";
    /// ... and events whose stream it had to resolve (the first of each series in a batch).
    counter SERIES_CACHE_MISSES = "gma_archiver_series_cache_misses_total",
        "appended events whose stream had to be resolved (first of its series in a batch)";
}
