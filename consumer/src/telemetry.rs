//! Every Prometheus metric this crate records (prefix `gma_consumer_`): the consumer library
//! inside every role that subscribes (archiver, rescheduler, relay, monitor, dashboard) or
//! keeps a record in the directory.

gma_core::metric_names! {
    counter EVENTS_RECEIVED = "gma_consumer_events_received_total", "events received on subscriptions";
    counter REGISTRATIONS = "gma_consumer_registrations_total",
        "records registered (or re-registered) in the directory";
    counter REGISTRATION_RETRIES = "gma_consumer_registration_retries_total",
        "directory registration attempts that failed and are retried";
    /// The sink role (`gma sink`, the `Consumer` service for pushed streams).
    counter SINK_EVENTS = "gma_sink_events_total", "events received on pushed streams";
    gauge SINK_STREAMS = "gma_sink_streams", "pushed streams open";
}
