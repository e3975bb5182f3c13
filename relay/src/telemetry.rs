//! Metric names of the relay (one place; prefix `gma_relay_`).

gma_core::metric_names! {
    /// Events republished unchanged.
    counter EVENTS = "gma_relay_events_relayed_total", "events republished unchanged by the relay";
    /// `site.load` summaries published.
    counter SITE_LOAD = "gma_relay_site_load_published_total", "site.load summaries published";
}
