//! The producer's latest sensor values in Prometheus text format, so an existing Prometheus can
//! scrape a GMA producer (`gma producer --prometheus ADDR` serves [`render`] at `/metrics`).
//!
//! Mapping, from the hub's latest-value cache (one sample per series):
//!
//! - every numeric field of event `NAME` becomes the gauge `gma_<NAME>_<FIELD>`, with every
//!   character other than `[a-zA-Z0-9_]` replaced by `_` (`host.cpu` field `user` ->
//!   `gma_host_cpu_user`; events named `gma.*` are not prefixed twice: `gma.agent` field
//!   `rss_mb` -> `gma_agent_rss_mb`), and the label `source` = the event's source
//!   (`gma_host_net_rx_bytes_per_s{source="hostA/eth0"}`);
//! - string fields are not exported (they are labels of a different kind; `host.info` is the
//!   place to read them);
//! - `gma_event_timestamp_seconds{name,source}`: when each series was last sampled (UTC), so a
//!   stale series can be told from a steady one;
//! - NaN ("not available") is written as `NaN`.
//!
//! The HELP line of each family is the field's description and unit from its schema.

use std::collections::BTreeMap;
use std::fmt::Write;

use gma_core::authz::{Action, Door};

use crate::hub::Hub;

/// `gma producer --prometheus ADDR` (served by the `gma` binary with the producer's TLS, client
/// CA and policy).
pub const DOORS: &[Door] = &[Door::policy(
    "GET /metrics (gma producer --prometheus)",
    &[Action::MetricsRead, Action::ProducerQuery],
    "only the gauges of series it may query raw: summary series (host.load.avg1m) \
                   yes, raw sensor values never",
)];

/// `host.cpu` + `user` -> `gma_host_cpu_user`.
pub fn metric_name(event: &str, field: &str) -> String {
    let mut out = String::with_capacity(5 + event.len() + field.len());
    // The fabric's own events (`gma.rpc`, `gma.agent`) already carry the prefix.
    if !event.starts_with("gma.") {
        out.push_str("gma_");
    }
    push_sanitized(&mut out, event);
    out.push('_');
    push_sanitized(&mut out, field);
    out
}

fn push_sanitized(out: &mut String, s: &str) {
    out.extend(s.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' {
            c
        } else {
            '_'
        }
    }));
}

/// A label value with `\`, `"` and newlines escaped.
fn push_label_value(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// HELP text: no newlines, backslashes escaped.
fn push_help(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

struct Family {
    help: String,
    samples: BTreeMap<String, f64>,
}

/// The latest value of every numeric field of every series in `hub`, in Prometheus text
/// exposition format (version 0.0.4).
pub fn render(hub: &Hub) -> String {
    render_filtered(hub, |_| true)
}

/// [`render`] of the series whose event name `shown` accepts (what the scraping identity may
/// read raw; the others are left out, their timestamps too).
pub fn render_filtered(hub: &Hub, shown: impl Fn(&str) -> bool) -> String {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut stamps: Vec<(String, String, f64)> = Vec::new();
    {
        let inner = hub.lock();
        for stored in inner.latest() {
            let Some(info) = inner.series.get(stored.series as usize) else {
                continue;
            };
            if !shown(&info.name) {
                continue;
            }
            stamps.push((
                info.name.clone(),
                info.source.clone(),
                stored.timestamp_ns as f64 / 1e9,
            ));
            let numeric = info
                .fields
                .iter()
                .filter(|f| f.r#type() != gma_proto::v1::FieldType::String);
            for (field, value) in numeric.zip(stored.numbers.iter()) {
                let name = metric_name(&info.name, &field.name);
                let family = families.entry(name).or_insert_with(|| Family {
                    help: if field.unit.is_empty() {
                        format!("{} {}", info.name, field.description)
                    } else {
                        format!("{} {} ({})", info.name, field.description, field.unit)
                    },
                    samples: BTreeMap::new(),
                });
                // Two (event, field) pairs may sanitize to one name: the first sample of a
                // source wins, so the output never repeats a series.
                family.samples.entry(info.source.clone()).or_insert(*value);
            }
        }
    }
    let mut out = String::new();
    for (name, f) in &families {
        let _ = write!(out, "# HELP {name} ");
        push_help(&mut out, &f.help);
        let _ = writeln!(out, "\n# TYPE {name} gauge");
        for (source, v) in &f.samples {
            let _ = write!(out, "{name}{{source=\"");
            push_label_value(&mut out, source);
            out.push_str("\"} ");
            push_value(&mut out, *v);
            out.push('\n');
        }
    }
    if !stamps.is_empty() {
        out.push_str("# HELP gma_event_timestamp_seconds when the series was last sampled (UTC)\n");
        out.push_str("# TYPE gma_event_timestamp_seconds gauge\n");
        stamps.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        for (name, source, t) in stamps {
            out.push_str("gma_event_timestamp_seconds{name=\"");
            push_label_value(&mut out, &name);
            out.push_str("\",source=\"");
            push_label_value(&mut out, &source);
            out.push_str("\"} ");
            push_value(&mut out, t);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use gma_core::event::{dbl, text, EventData};
    use gma_proto::v1 as pb;

    #[test]
    fn latest_values_become_gauges_per_source() {
        let hub = Hub::new(1, 100);
        hub.add_schemas(&[pb::EventSchema {
            name: "host.cpu".into(),
            version: 1,
            fields: vec![
                dbl("user", "%", "user time"),
                text("note", "a label"),
                dbl("idle", "%", "idle \"time\"\nsecond line"),
            ],
            description: String::new(),
        }])
        .unwrap();
        let ev = |src: &str, user: f64, ts: i64| EventData {
            name: "host.cpu".into(),
            source: src.into(),
            timestamp_ns: ts,
            numbers: vec![user, f64::NAN],
            strings: vec!["x".into()],
        };
        let (_, r) = hub.publish(&[
            ev("hostA", 1.0, 1_000_000_000),
            ev("h\"B", 2.5, 2_000_000_000),
            ev("hostA", 3.0, 3_000_000_000),
        ]);
        r.unwrap();
        let text = render(&hub);
        assert!(text.contains("# TYPE gma_host_cpu_user gauge\n"), "{text}");
        assert!(text.contains("gma_host_cpu_user{source=\"hostA\"} 3\n"), "{text}");
        assert!(
            text.contains("gma_host_cpu_user{source=\"h\\\"B\"} 2.5\n"),
            "{text}"
        );
        assert!(
            text.contains("gma_host_cpu_idle{source=\"hostA\"} NaN\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP gma_host_cpu_idle host.cpu idle \"time\"\\nsecond line (%)\n"),
            "{text}"
        );
        assert!(
            text.contains("gma_event_timestamp_seconds{name=\"host.cpu\",source=\"hostA\"} 3\n"),
            "{text}"
        );
        assert!(!text.contains("note"), "{text}");
        assert_eq!(metric_name("app.x-y", "a.b"), "gma_app_x_y_a_b");
        assert_eq!(metric_name("gma.agent", "rss_mb"), "gma_agent_rss_mb");
        // What the scraper may not read raw is left out, timestamps included.
        assert_eq!(render_filtered(&hub, |n| n != "host.cpu"), "");
        assert_eq!(render_filtered(&hub, |_| true), text);
    }
}
