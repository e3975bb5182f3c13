//! The link matrix of `gma net matrix`: the latest measurement and forecast of every
//! (src, dst) pair, built from the events the netprobes answer to a `Query` (pure).

use std::collections::BTreeMap;

use gma_proto::v1 as pb;

use crate::events::{split_link, BW, BW_FORECAST, RTT, RTT_FORECAST};

/// One directed link.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Link {
    pub src: String,
    pub dst: String,
    pub rtt_ms: Option<f64>,
    pub rtt_forecast_ms: Option<f64>,
    pub rtt_mae_ms: Option<f64>,
    pub rtt_method: Option<String>,
    /// When the latest latency probe started.
    pub rtt_at_ns: Option<i64>,
    pub bw_mbps: Option<f64>,
    pub bw_forecast_mbps: Option<f64>,
    pub bw_mae_mbps: Option<f64>,
    pub bw_method: Option<String>,
    pub bw_at_ns: Option<i64>,
}

fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite())
}

/// Field `name` of `e`, by its schema.
fn field<'a>(e: &'a pb::Event, schema: &pb::EventSchema, name: &str) -> Option<&'a pb::value::Kind> {
    let i = schema.fields.iter().position(|f| f.name == name)?;
    e.values.get(i)?.kind.as_ref()
}

fn number(e: &pb::Event, schema: &pb::EventSchema, name: &str) -> Option<f64> {
    match field(e, schema, name)? {
        pb::value::Kind::Number(n) => finite(Some(*n)),
        pb::value::Kind::Text(_) => None,
    }
}

fn string(e: &pb::Event, schema: &pb::EventSchema, name: &str) -> Option<String> {
    match field(e, schema, name)? {
        pb::value::Kind::Text(t) if !t.is_empty() => Some(t.clone()),
        _ => None,
    }
}

/// Merges the latest `net.rtt`, `net.bw` and their forecasts into one row per link, sorted by
/// (src, dst). Of several events of one series (several producers answered) the newest wins.
pub fn build(events: &[pb::Event], schemas: &BTreeMap<String, pb::EventSchema>) -> Vec<Link> {
    let mut newest: BTreeMap<(&str, &str), &pb::Event> = BTreeMap::new();
    for e in events {
        let slot = newest.entry((e.name.as_str(), e.source.as_str())).or_insert(e);
        if e.timestamp_ns > slot.timestamp_ns {
            *slot = e;
        }
    }
    let mut links: BTreeMap<(String, String), Link> = BTreeMap::new();
    for ((name, source), e) in newest {
        let Some((src, dst)) = split_link(source) else {
            continue;
        };
        let Some(schema) = schemas.get(name) else { continue };
        let l = links
            .entry((src.to_string(), dst.to_string()))
            .or_insert_with(|| Link {
                src: src.to_string(),
                dst: dst.to_string(),
                ..Link::default()
            });
        match name {
            RTT => {
                l.rtt_ms = number(e, schema, "rtt_ms");
                l.rtt_at_ns = Some(e.timestamp_ns);
            }
            BW => {
                l.bw_mbps = number(e, schema, "mbps");
                l.bw_at_ns = Some(e.timestamp_ns);
            }
            RTT_FORECAST => {
                l.rtt_forecast_ms = number(e, schema, "rtt_ms");
                l.rtt_mae_ms = number(e, schema, "rtt_ms_mae");
                l.rtt_method = string(e, schema, "rtt_ms_method");
            }
            BW_FORECAST => {
                l.bw_forecast_mbps = number(e, schema, "mbps");
                l.bw_mae_mbps = number(e, schema, "mbps_mae");
                l.bw_method = string(e, schema, "mbps_method");
            }
            _ => {}
        }
    }
    links.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_producer::derive::forecast_schema;

    fn num(v: f64) -> pb::Value {
        pb::Value {
            kind: Some(pb::value::Kind::Number(v)),
        }
    }

    fn txt(v: &str) -> pb::Value {
        pb::Value {
            kind: Some(pb::value::Kind::Text(v.into())),
        }
    }

    #[test]
    fn the_newest_of_each_series_fills_its_link() {
        let schemas: BTreeMap<String, pb::EventSchema> = crate::events::schemas()
            .into_iter()
            .flat_map(|s| [forecast_schema(&s), s])
            .map(|s| (s.name.clone(), s))
            .collect();
        let ev = |name: &str, source: &str, ts: i64, values: Vec<pb::Value>| pb::Event {
            name: name.into(),
            source: source.into(),
            timestamp_ns: ts,
            seq: 1,
            values,
        };
        let rtt = |ts, v| {
            ev(
                RTT,
                "a/b",
                ts,
                vec![num(v), num(1.0), txt("a"), txt("b"), txt("1.1"), txt("a")],
            )
        };
        let events = vec![
            rtt(20, 0.3),
            rtt(10, 9.0),
            ev(
                BW_FORECAST,
                "a/b",
                20,
                vec![
                    num(19.0),
                    num(0.5),
                    txt("last"),
                    num(1.0),
                    num(0.0),
                    txt("last"),
                    num(5.0),
                    num(1.0),
                    txt("mean"),
                ],
            ),
            ev(
                BW,
                "b/a",
                30,
                vec![
                    num(100.0),
                    num(1024.0),
                    num(2.0),
                    txt("b"),
                    txt("a"),
                    txt("1.2"),
                    txt("a"),
                ],
            ),
            ev(RTT, "not-a-link", 30, vec![num(1.0)]),
        ];
        let links = build(&events, &schemas);
        assert_eq!(links.len(), 2);
        let ab = &links[0];
        assert_eq!((ab.src.as_str(), ab.dst.as_str()), ("a", "b"));
        assert_eq!(ab.rtt_ms, Some(0.3), "the newest of two rtt events");
        assert_eq!(ab.rtt_at_ns, Some(20));
        assert_eq!(ab.bw_forecast_mbps, Some(19.0));
        assert_eq!(ab.bw_mae_mbps, Some(0.5));
        assert_eq!(ab.bw_method.as_deref(), Some("last"));
        assert_eq!(ab.bw_mbps, None);
        assert_eq!(links[1].bw_mbps, Some(100.0));
    }
}
