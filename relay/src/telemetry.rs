//! Metric names of the relay (one place; prefix `gma_relay_`).

/// Events republished unchanged.
pub const EVENTS: &str = "gma_relay_events_relayed_total";
/// `site.load` summaries published.
pub const SITE_LOAD: &str = "gma_relay_site_load_published_total";

/// Describes the metrics above to the installed recorder.
pub fn describe() {
    use metrics::describe_counter;
    describe_counter!(EVENTS, "events republished unchanged by the relay");
    describe_counter!(SITE_LOAD, "site.load summaries published");
}
