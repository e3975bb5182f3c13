//! Every Prometheus metric this crate records (prefix `gma_producer_`; bounded labels), in one
//! place. Roles that embed a producer (rescheduler, relay, monitor) report these too: they are
//! the figures of the producer inside them. RPC figures (`gma_<role>_rpc_*`) come from
//! [`gma_core::rpc`].

gma_core::metric_names! {
    counter EVENTS_PUBLISHED = "gma_producer_events_published_total",
        "events accepted into the hub (sensors, ingest, derived)";
    counter PUBLISH_REJECTED = "gma_producer_publish_rejected_total",
        "events refused by the hub (unknown schema, wrong layout)";
    counter SENSOR_ERRORS = "gma_producer_sensor_errors_total", "sensor samples that failed";
    counter DERIVED_EVENTS = "gma_producer_derived_events_total", "summary and forecast events derived";
    counter CONFLATED_EVENTS = "gma_producer_conflated_events_total",
        "events replaced by a newer value before delivery (latest policy)";
    counter GAP_EVENTS = "gma_producer_gap_events_total", "events a subscriber missed, reported as gaps";
    counter CHUNKS_ENCODED = "gma_producer_chunks_encoded_total",
        "stream batches encoded (shared by every subscriber of one selection)";
    gauge SUBSCRIPTIONS = "gma_producer_subscriptions", "open subscriptions";
    counter EVENTS_SENT = "gma_producer_events_sent_total", "events sent to subscribers";
    counter PUSH_RETRIES = "gma_producer_push_retries_total",
        "producer-initiated streams restarted after an error";
    counter PUSH_SESSIONS = "gma_producer_push_sessions_total", "producer-initiated streams opened";
    gauge SERIES = "gma_producer_series", "distinct (name, source) series held";
    counter OTLP_POINTS = "gma_producer_otlp_points_total",
        "OTLP metric data points converted into events (--otlp-listen)";
}
