//! Every Prometheus metric this crate records (prefix `gma_dashboard_`).

pub const CLIENTS: &str = "gma_dashboard_clients";
pub const MESSAGES: &str = "gma_dashboard_messages_total";
pub const EVENTS: &str = "gma_dashboard_events_total";
pub const LAGGED: &str = "gma_dashboard_lagged_total";
pub const HOSTS: &str = "gma_dashboard_hosts";
pub const HTTP_REQUESTS: &str = "gma_dashboard_http_requests_total";
pub const HTTP_ERRORS: &str = "gma_dashboard_http_errors_total";
pub const HTTP_SECONDS: &str = "gma_dashboard_http_duration_seconds";

/// Registers the descriptions (HELP lines) of this crate's metrics with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(CLIENTS, "browsers connected to the live stream (/api/events)");
    describe_counter!(
        MESSAGES,
        "messages broadcast to browsers (each framed once, shared by all)"
    );
    describe_counter!(EVENTS, "fabric events received by the dashboard's one subscriber");
    describe_counter!(
        LAGGED,
        "times a browser fell behind and was sent a fresh snapshot instead"
    );
    describe_gauge!(HOSTS, "hosts charted");
    describe_counter!(HTTP_REQUESTS, "HTTP requests, by route");
    describe_counter!(
        HTTP_ERRORS,
        "HTTP requests answered with a 4xx or 5xx status, by route"
    );
    describe_histogram!(
        HTTP_SECONDS,
        Unit::Seconds,
        "HTTP latency to the response head, by route"
    );
}
