//! How an archived series (event name, source, field) is named in Prometheus terms — one mapping
//! shared by the PromQL query API and remote write, so what a query over the archive returns and
//! what a remote store receives carry the same metric name and labels.
//!
//! - metric name: `<event>_<field>` with every character outside `[a-zA-Z0-9_:]` replaced by
//!   `_`, and `_` put in front when it would start with a digit: `host.load` / `load1` →
//!   `host_load_load1`;
//! - labels: `source` (the event's source, e.g. a host name), and `event` and `field` holding the
//!   original names, so two series whose names differ only in punctuation (`host.load` and
//!   `host_load`) stay two series.
//!
//! Text fields have no Prometheus sample type; they are not mapped.

/// The label holding the event's source.
pub const SOURCE_LABEL: &str = "source";
/// The label holding the original event name.
pub const EVENT_LABEL: &str = "event";
/// The label holding the original field name.
pub const FIELD_LABEL: &str = "field";
/// Prometheus' label of the metric name.
pub const NAME_LABEL: &str = "__name__";

/// The Prometheus metric name of field `field` of event `event`.
pub fn metric_name(event: &str, field: &str) -> String {
    let mut out = String::with_capacity(event.len() + field.len() + 2);
    for c in event.chars().chain(std::iter::once('_')).chain(field.chars()) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            out.push(c);
        } else {
            out.push('_');
        }
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The full label set of a series, `__name__` included, sorted by label name (the order remote
/// write requires and the query API prints).
pub fn labels(event: &str, source: &str, field: &str) -> Vec<(&'static str, String)> {
    vec![
        (NAME_LABEL, metric_name(event, field)),
        (EVENT_LABEL, event.to_string()),
        (FIELD_LABEL, field.to_string()),
        (SOURCE_LABEL, source.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_rules() {
        assert_eq!(metric_name("host.load", "load1"), "host_load_load1");
        assert_eq!(metric_name("net.rtt", "rtt-ms"), "net_rtt_rtt_ms");
        assert_eq!(metric_name("9lives", "x"), "_9lives_x");
        assert_eq!(metric_name("a:b", "c"), "a:b_c");
        assert_eq!(metric_name("é", "v"), "__v");
    }

    #[test]
    fn labels_are_sorted_and_keep_the_original_names() {
        let l = labels("host.load", "hostA", "load1");
        let names: Vec<_> = l.iter().map(|(k, _)| *k).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        assert_eq!(l[0], (NAME_LABEL, "host_load_load1".to_string()));
        assert!(l.contains(&(EVENT_LABEL, "host.load".to_string())));
        assert!(l.contains(&(SOURCE_LABEL, "hostA".to_string())));
        // Punctuation-only differences stay distinct series.
        assert_ne!(labels("host.load", "a", "x"), labels("host_load", "a", "x"));
    }
}
