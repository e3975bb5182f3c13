//! Every Prometheus metric this crate records (prefix `gma_consumer_`): the consumer library
//! inside every role that subscribes (archiver, rescheduler, relay, monitor, dashboard) or
//! keeps a record in the directory.

pub const EVENTS_RECEIVED: &str = "gma_consumer_events_received_total";
pub const REGISTRATIONS: &str = "gma_consumer_registrations_total";
pub const REGISTRATION_RETRIES: &str = "gma_consumer_registration_retries_total";
/// The sink role (`gma sink`, the `Consumer` service for pushed streams).
pub const SINK_EVENTS: &str = "gma_sink_events_total";
pub const SINK_STREAMS: &str = "gma_sink_streams";

/// Registers the descriptions (HELP lines) of this crate's metrics with the installed recorder.
pub fn describe() {
    use metrics::describe_counter;
    describe_counter!(EVENTS_RECEIVED, "events received on subscriptions");
    describe_counter!(
        REGISTRATIONS,
        "records registered (or re-registered) in the directory"
    );
    describe_counter!(
        REGISTRATION_RETRIES,
        "directory registration attempts that failed and are retried"
    );
    describe_counter!(SINK_EVENTS, "events received on pushed streams");
    metrics::describe_gauge!(SINK_STREAMS, "pushed streams open");
}
