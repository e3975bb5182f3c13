//! The keep-policy: which events of a stream are archived.
//!
//! Rules (`[[keep]]`, first matching pattern wins) keep every *abnormal* event — one for which the
//! rule's `abnormal` expression (the filter language of `gma subscribe --when`) holds, or that a
//! producer marked as a threshold crossing — and one in `sample_normal` of the others, per
//! stream (1 = all, 0 = none). Events no rule matches are all kept.

use std::collections::HashMap;
use std::sync::Arc;

use gma_core::codec::{Mark, OwnedEvent, SeriesInfo};
use gma_core::filter::{Bound, Filter};
use gma_core::pattern::Pattern;
use serde::Deserialize;

use crate::error::Error;

/// One `[[keep]]` rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepRule {
    /// Event-name pattern the rule applies to.
    pub pattern: String,
    /// Filter expression marking abnormal events (`load1 > 4`); empty: only producer-marked
    /// crossings are abnormal.
    #[serde(default)]
    pub abnormal: String,
    /// Keep one normal event in this many per stream (1 = every one, 0 = none).
    #[serde(default = "one")]
    pub sample_normal: u64,
}

fn one() -> u64 {
    1
}

struct Rule {
    pattern: Pattern,
    filter: Option<Filter>,
    sample_normal: u64,
}

/// What [`Keeper::filter`] did, for stats.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KeepCounts {
    pub abnormal: u64,
    pub sampled_out: u64,
}

/// Applies the keep rules; remembers per stream its compiled filter and sampling counter.
pub struct Keeper {
    rules: Vec<Rule>,
    /// Per stream (name, source, schema version).
    streams: HashMap<(String, String, u32), StreamState>,
}

/// A stream's rule, its compiled filter, and the normal events seen so far.
struct StreamState {
    rule: Option<usize>,
    bound: Option<Arc<Bound>>,
    normal_seen: u64,
}

impl Keeper {
    /// Compiles the rules; errors name the rule.
    pub fn new(rules: &[KeepRule]) -> Result<Keeper, Error> {
        let mut out = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            let pattern =
                Pattern::event(&r.pattern).map_err(|e| Error::Config(format!("keep rule {}: {e}", i + 1)))?;
            let filter = if r.abnormal.trim().is_empty() {
                None
            } else {
                Some(
                    Filter::parse(&r.abnormal)
                        .map_err(|e| Error::Config(format!("keep rule {}: abnormal: {e}", i + 1)))?,
                )
            };
            out.push(Rule {
                pattern,
                filter,
                sample_normal: r.sample_normal,
            });
        }
        Ok(Keeper {
            rules: out,
            streams: HashMap::new(),
        })
    }

    fn stream(&mut self, s: &SeriesInfo) -> &mut StreamState {
        let key = (s.name.clone(), s.source.clone(), s.schema_version);
        let rules = &self.rules;
        self.streams.entry(key).or_insert_with(|| {
            let idx = rules.iter().position(|r| r.pattern.matches(&s.name));
            let bound = idx
                .and_then(|i| rules[i].filter.as_ref())
                .and_then(|f| match f.bind(&s.name, &s.fields) {
                    Ok(b) => b.map(Arc::new),
                    Err(e) => {
                        tracing::warn!(event = %s.name, error = %e, "keep rule does not apply to this schema");
                        None
                    }
                });
            StreamState {
                rule: idx,
                bound,
                normal_seen: 0,
            }
        })
    }

    /// Drops the events the rules do not keep (in place, order preserved).
    pub fn filter(&mut self, events: &mut Vec<OwnedEvent>) -> KeepCounts {
        let mut counts = KeepCounts::default();
        if self.rules.is_empty() {
            return counts;
        }
        events.retain(|e| {
            let sample = self.stream(&e.series).rule.map(|i| self.rules[i].sample_normal);
            let Some(sample_normal) = sample else {
                return true;
            };
            let st = self.stream(&e.series);
            let abnormal = e.mark != Mark::None
                || st
                    .bound
                    .as_ref()
                    .is_some_and(|b| b.eval(&e.numbers, &e.strings) == Some(true));
            if abnormal {
                counts.abnormal += 1;
                return true;
            }
            st.normal_seen += 1;
            let keep = sample_normal > 0 && (st.normal_seen - 1).is_multiple_of(sample_normal);
            if !keep {
                counts.sampled_out += 1;
            }
            keep
        });
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::event::dbl;
    use gma_proto::v1 as pb;

    fn events(values: &[f64]) -> Vec<OwnedEvent> {
        let schema = pb::EventSchema {
            name: "host.load".into(),
            version: 1,
            fields: vec![dbl("load1", "", "")],
            description: String::new(),
        };
        let series = Arc::new(SeriesInfo::new(1, "host.load", "h1", &schema));
        values
            .iter()
            .enumerate()
            .map(|(i, v)| OwnedEvent {
                series: series.clone(),
                seq: i as u64 + 1,
                timestamp_ns: i as i64,
                numbers: vec![*v],
                strings: vec![],
                mark: Mark::None,
            })
            .collect()
    }

    #[test]
    fn keeps_abnormal_and_samples_normal() {
        let mut k = Keeper::new(&[KeepRule {
            pattern: "host.*".into(),
            abnormal: "load1 > 4".into(),
            sample_normal: 3,
        }])
        .unwrap();
        let mut ev = events(&[1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 5.0, 1.0]);
        let c = k.filter(&mut ev);
        let kept: Vec<u64> = ev.iter().map(|e| e.seq).collect();
        // Normal events 1,2,4,5,6,8 -> the 1st, 4th of them (seq 1, 5); abnormal 3 and 7.
        assert_eq!(kept, vec![1, 3, 5, 7]);
        assert_eq!(
            c,
            KeepCounts {
                abnormal: 2,
                sampled_out: 4
            }
        );
    }

    #[test]
    fn unmatched_events_are_all_kept_and_bad_rules_are_named() {
        let mut k = Keeper::new(&[KeepRule {
            pattern: "job.*".into(),
            abnormal: String::new(),
            sample_normal: 0,
        }])
        .unwrap();
        let mut ev = events(&[1.0, 2.0]);
        k.filter(&mut ev);
        assert_eq!(ev.len(), 2);
        let e = Keeper::new(&[KeepRule {
            pattern: "host.load".into(),
            abnormal: "load1 >".into(),
            sample_normal: 1,
        }])
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.starts_with("invalid archiver config: keep rule 1: abnormal:"),
            "{e}"
        );
    }
}
