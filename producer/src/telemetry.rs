//! Every Prometheus metric this crate records (prefix `gma_producer_`; bounded labels), in one
//! place. Roles that embed a producer (rescheduler, relay, monitor) report these too: they are
//! the figures of the producer inside them. RPC figures (`gma_<role>_rpc_*`) come from
//! [`gma_core::rpc`].

pub const EVENTS_PUBLISHED: &str = "gma_producer_events_published_total";
pub const PUBLISH_REJECTED: &str = "gma_producer_publish_rejected_total";
pub const SENSOR_ERRORS: &str = "gma_producer_sensor_errors_total";
pub const DERIVED_EVENTS: &str = "gma_producer_derived_events_total";
pub const CONFLATED_EVENTS: &str = "gma_producer_conflated_events_total";
pub const GAP_EVENTS: &str = "gma_producer_gap_events_total";
pub const CHUNKS_ENCODED: &str = "gma_producer_chunks_encoded_total";
pub const SUBSCRIPTIONS: &str = "gma_producer_subscriptions";
pub const EVENTS_SENT: &str = "gma_producer_events_sent_total";
pub const PUSH_RETRIES: &str = "gma_producer_push_retries_total";
pub const PUSH_SESSIONS: &str = "gma_producer_push_sessions_total";
pub const SERIES: &str = "gma_producer_series";

/// Registers the descriptions (HELP lines) of this crate's metrics with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        EVENTS_PUBLISHED,
        "events accepted into the hub (sensors, ingest, derived)"
    );
    describe_counter!(
        PUBLISH_REJECTED,
        "events refused by the hub (unknown schema, wrong layout)"
    );
    describe_counter!(SENSOR_ERRORS, "sensor samples that failed");
    describe_counter!(DERIVED_EVENTS, "summary and forecast events derived");
    describe_counter!(
        CONFLATED_EVENTS,
        "events replaced by a newer value before delivery (latest policy)"
    );
    describe_counter!(GAP_EVENTS, "events a subscriber missed, reported as gaps");
    describe_counter!(
        CHUNKS_ENCODED,
        "stream batches encoded (shared by every subscriber of one selection)"
    );
    describe_gauge!(SUBSCRIPTIONS, "open subscriptions");
    describe_counter!(EVENTS_SENT, "events sent to subscribers");
    describe_counter!(
        PUSH_RETRIES,
        "producer-initiated streams restarted after an error"
    );
    describe_counter!(PUSH_SESSIONS, "producer-initiated streams opened");
    describe_gauge!(SERIES, "distinct (name, source) series held");
}
