//! Every Prometheus metric this crate records (prefix `gma_dashboard_`).

gma_core::metric_names! {
    gauge CLIENTS = "gma_dashboard_clients", "browsers connected to the live stream (/api/events)";
    counter MESSAGES = "gma_dashboard_messages_total",
        "messages broadcast to browsers (each framed once, shared by all)";
    counter EVENTS = "gma_dashboard_events_total", "fabric events received by the dashboard's one subscriber";
    counter LAGGED = "gma_dashboard_lagged_total",
        "times a browser fell behind and was sent a fresh snapshot instead";
    gauge HOSTS = "gma_dashboard_hosts", "hosts charted";
    counter HTTP_REQUESTS = "gma_dashboard_http_requests_total", "HTTP requests, by route";
    counter HTTP_ERRORS = "gma_dashboard_http_errors_total",
        "HTTP requests answered with a 4xx or 5xx status, by route";
    histogram(Seconds) HTTP_SECONDS = "gma_dashboard_http_duration_seconds",
        "HTTP latency to the response head, by route";
}
