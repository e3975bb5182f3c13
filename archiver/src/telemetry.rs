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
    // ---- remote write (crate::remote_write) ----
    counter RW_SENT = "gma_archiver_remote_write_samples_sent_total",
        "samples the remote-write receiver acknowledged (2xx)";
    counter RW_FAILED = "gma_archiver_remote_write_samples_failed_total",
        "samples dropped because the receiver refused their request (4xx other than 429)";
    counter RW_RESEND_REFUSED = "gma_archiver_remote_write_resend_refused_total",
        "samples of a request re-sent after a restart that the receiver refused (it had most likely stored them already)";
    counter RW_SKIPPED = "gma_archiver_remote_write_samples_skipped_total",
        "samples never sent: older than remote_write.max_backlog, or a second value in one millisecond";
    counter RW_RETRIES = "gma_archiver_remote_write_retries_total",
        "attempts that failed with 5xx, 429, a connection error or a timeout (the request is sent again)";
    gauge RW_PENDING = "gma_archiver_remote_write_samples_pending",
        "samples archived and not yet acknowledged by the receiver (recounted at most every 5 s while behind)";
    gauge RW_LAST_ACK = "gma_archiver_remote_write_last_ack_timestamp_seconds",
        "timestamp of the newest sample the receiver acknowledged";
}
