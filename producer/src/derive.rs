//! Derived series: rolling summaries and adaptive forecasts computed inside the producer.
//!
//! A subscription asking for `summaries = ["1m"]` or `forecast = true` (or the producer's
//! config) activates a rule: every series its selector matches gets, next to its raw events,
//!
//! - `<name>.avg1m`, `<name>.avg10m`, `<name>.avg60m`: per numeric field `f` the rolling mean
//!   `f`, `f_min` and `f_max` over the window, plus `samples` and `covered_s`, published at most
//!   once per 1/60 of the window (1 s, 10 s, 60 s) — [`gma_core::rolling`];
//! - `<name>.forecast`: per numeric field the predicted next value `f`, the recent mean absolute
//!   error `f_mae` of the predictor that made it and its name `f_method`, published with every
//!   raw event — [`gma_core::forecast`] (NWS-style: several cheap predictors, the one with the
//!   lowest recent error is served).
//!
//! Derived events are ordinary events of the producer: they have schemas (registered in the
//! directory with the rest), seqs, resume and every subscription feature. They are computed by
//! one task that follows the hub's log, never on a sensor's or a consumer's path. Rules stay
//! active for the producer's lifetime (at most [`MAX_RULES`]); state is per derived series.

use std::collections::HashMap;
use std::sync::Arc;

use gma_core::event::{dbl, text, EventData};
use gma_core::forecast::Forecaster;
use gma_core::pattern::Pattern;
use gma_core::rolling::{Rolling, Window, WINDOWS};
use gma_proto::v1 as pb;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::hub::{Hub, HubInner};
use crate::subscription::Selector;

/// Most derivation rules a producer keeps.
pub const MAX_RULES: usize = 64;
/// Events the deriver reads per pass (it yields between passes).
const PASS: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    #[error("too many derivation rules on this producer (limit {MAX_RULES})")]
    TooManyRules,
    #[error("derived pattern: {0}")]
    Pattern(String),
    #[error("derived schema: {0}")]
    Schema(String),
}

/// Suffix of the derived event name of a summary window.
pub fn summary_suffix(w: &Window) -> String {
    format!(".avg{}", w.name)
}

pub const FORECAST_SUFFIX: &str = ".forecast";

/// True for names this module derives (they are never derived from again).
pub fn is_derived(name: &str) -> bool {
    name.ends_with(FORECAST_SUFFIX) || WINDOWS.iter().any(|w| name.ends_with(&summary_suffix(w)))
}

#[derive(Debug, Clone)]
struct Rule {
    selector: Selector,
    windows: Vec<Window>,
    forecast: bool,
}

/// The rules, shared between subscriptions (which add) and the deriver task (which applies).
#[derive(Default)]
pub struct Deriver {
    rules: Mutex<Rules>,
    /// Told when a rule is added. Without rules the deriver task waits for this alone, not
    /// for every publish: the agent's one tick a second woke it for nothing (a task poll a
    /// tick, with its code brought back into a cold cache).
    added: tokio::sync::Notify,
}

#[derive(Default)]
struct Rules {
    /// Bumped by every rule added.
    version: u64,
    list: Vec<Rule>,
    /// The hub's head when the first rule was added: what is derived starts there.
    from: u64,
}

fn numeric(fields: &[pb::FieldSpec]) -> impl Iterator<Item = &pb::FieldSpec> {
    fields.iter().filter(|f| f.r#type() != pb::FieldType::String)
}

/// Schema of `<base>.avg<w>`.
pub fn summary_schema(base: &pb::EventSchema, w: &Window) -> pb::EventSchema {
    let mut fields = Vec::new();
    for f in numeric(&base.fields) {
        fields.push(dbl(
            &f.name,
            &f.unit,
            &format!("mean of {} over the last {}", f.name, w.name),
        ));
        fields.push(dbl(
            &format!("{}_min", f.name),
            &f.unit,
            &format!("minimum of {} over {}", f.name, w.name),
        ));
        fields.push(dbl(
            &format!("{}_max", f.name),
            &f.unit,
            &format!("maximum of {} over {}", f.name, w.name),
        ));
    }
    fields.push(dbl("samples", "events", "raw events summarized"));
    fields.push(dbl(
        "covered_s",
        "s",
        "time span the summary covers (up to the window)",
    ));
    pb::EventSchema {
        name: format!("{}{}", base.name, summary_suffix(w)),
        version: base.version,
        fields,
        description: format!("rolling {} summary of {}", w.name, base.name),
    }
}

/// Schema of `<base>.forecast`.
pub fn forecast_schema(base: &pb::EventSchema) -> pb::EventSchema {
    let mut fields = Vec::new();
    for f in numeric(&base.fields) {
        fields.push(dbl(&f.name, &f.unit, &format!("forecast of the next {}", f.name)));
        fields.push(dbl(
            &format!("{}_mae", f.name),
            &f.unit,
            "recent mean absolute error of the predictor serving the forecast",
        ));
        fields.push(text(
            &format!("{}_method", f.name),
            "predictor serving the forecast",
        ));
    }
    pb::EventSchema {
        name: format!("{}{FORECAST_SUFFIX}", base.name),
        version: base.version,
        fields,
        description: format!(
            "adaptive forecast of {} (lowest recent error of several predictors)",
            base.name
        ),
    }
}

impl Deriver {
    /// Activates derivation of `windows` summaries and/or forecasts for the series `base`
    /// selects, registers the derived schemas of every matching event name known now, and
    /// returns the selector of the derived events.
    pub fn activate(
        &self,
        hub: &Hub,
        base: &Selector,
        windows: &[Window],
        forecast: bool,
    ) -> Result<Selector, DeriveError> {
        let mut suffixes: Vec<String> = windows.iter().map(summary_suffix).collect();
        if forecast {
            suffixes.push(FORECAST_SUFFIX.to_string());
        }
        let mut patterns = Vec::new();
        for p in &base.patterns {
            for s in &suffixes {
                let text = format!("{}{s}", p.as_str());
                patterns.push(Pattern::event(&text).map_err(|e| DeriveError::Pattern(e.to_string()))?);
            }
        }
        let (schemas, head): (Vec<pb::EventSchema>, u64) = {
            let inner = hub.lock();
            let schemas = inner
                .schemas()
                .filter(|s| !is_derived(&s.name) && base.patterns.iter().any(|p| p.matches(&s.name)))
                .flat_map(|s| derived_schemas(s, windows, forecast))
                .collect();
            (schemas, inner.head())
        };
        hub.add_schemas(&schemas)
            .map_err(|e| DeriveError::Schema(e.to_string()))?;
        let mut rules = self.rules.lock();
        let rule = Rule {
            selector: base.clone(),
            windows: windows.to_vec(),
            forecast,
        };
        let same = |r: &Rule| {
            r.forecast == rule.forecast
                && r.windows
                    .iter()
                    .map(|w| w.name)
                    .eq(rule.windows.iter().map(|w| w.name))
                && r.selector.key() == rule.selector.key()
        };
        if !rules.list.iter().any(same) {
            if rules.list.len() >= MAX_RULES {
                return Err(DeriveError::TooManyRules);
            }
            if rules.list.is_empty() {
                rules.from = head;
            }
            rules.list.push(rule);
            rules.version += 1;
            drop(rules);
            self.added.notify_one();
        }
        Ok(Selector {
            patterns,
            sources: base.sources.clone(),
        })
    }

    /// The rules' version, the rules, and where deriving starts.
    fn snapshot(&self) -> (u64, Vec<Rule>, u64) {
        let r = self.rules.lock();
        (r.version, r.list.clone(), r.from)
    }
}

fn derived_schemas(base: &pb::EventSchema, windows: &[Window], forecast: bool) -> Vec<pb::EventSchema> {
    let mut out: Vec<pb::EventSchema> = windows.iter().map(|w| summary_schema(base, w)).collect();
    if forecast {
        out.push(forecast_schema(base));
    }
    out
}

/// What is derived from one series.
struct SeriesState {
    source: String,
    rolling: Vec<(Rolling, i64, String)>,
    forecasters: Option<(Vec<Forecaster>, String)>,
    schemas_added: bool,
    base: pb::EventSchema,
}

impl SeriesState {
    /// `new` is the plan under changed rules: keep the windows and forecasters already running.
    fn merge(mut self, new: SeriesState) -> SeriesState {
        let mut rolling = Vec::new();
        for (r, last, name) in new.rolling {
            match self.rolling.iter().position(|o| o.2 == name) {
                Some(i) => rolling.push(self.rolling.swap_remove(i)),
                None => rolling.push((r, last, name)),
            }
        }
        let forecasters = match (self.forecasters.take(), new.forecasters) {
            (Some(old), Some(_)) => Some(old),
            (_, new) => new,
        };
        SeriesState {
            source: self.source,
            rolling,
            forecasters,
            // Added again (a no-op for the ones already known) with the new ones.
            schemas_added: false,
            base: new.base,
        }
    }

    fn derive(&mut self, ts: i64, numbers: &[f64], out: &mut Vec<EventData>) {
        for (r, last_emit, name) in &mut self.rolling {
            r.add(ts, numbers);
            let every = r.window().span_ns / 60;
            if *last_emit != 0 && ts - *last_emit < every && ts >= *last_emit {
                continue;
            }
            let Some(s) = r.summary(ts) else { continue };
            *last_emit = ts;
            let mut values = Vec::with_capacity(numbers.len() * 3 + 2);
            for i in 0..numbers.len() {
                values.push(s.mean.get(i).copied().unwrap_or(f64::NAN));
                values.push(s.min.get(i).copied().unwrap_or(f64::NAN));
                values.push(s.max.get(i).copied().unwrap_or(f64::NAN));
            }
            values.push(s.samples as f64);
            values.push(s.covered_ns as f64 / 1e9);
            out.push(EventData {
                name: name.clone(),
                source: self.source.clone(),
                timestamp_ns: ts,
                numbers: values,
                strings: Vec::new(),
            });
        }
        if let Some((fs, name)) = &mut self.forecasters {
            let mut values = Vec::with_capacity(numbers.len() * 2);
            let mut methods = Vec::with_capacity(numbers.len());
            for (f, x) in fs.iter_mut().zip(numbers) {
                f.observe(*x);
                match f.forecast() {
                    Some(p) => {
                        values.push(p.value);
                        values.push(p.mae);
                        methods.push(p.method.to_string());
                    }
                    None => {
                        values.push(f64::NAN);
                        values.push(f64::NAN);
                        methods.push(String::new());
                    }
                }
            }
            out.push(EventData {
                name: name.clone(),
                source: self.source.clone(),
                timestamp_ns: ts,
                numbers: values,
                strings: methods,
            });
        }
    }
}

fn plan(rules: &[Rule], inner: &HubInner, series: u32) -> Option<SeriesState> {
    let info = &inner.series[series as usize];
    if is_derived(&info.name) {
        return None;
    }
    let mut windows: Vec<Window> = Vec::new();
    let mut forecast = false;
    for r in rules
        .iter()
        .filter(|r| r.selector.matches(&info.name, &info.source))
    {
        for w in &r.windows {
            if !windows.iter().any(|x| x.name == w.name) {
                windows.push(*w);
            }
        }
        forecast |= r.forecast;
    }
    if windows.is_empty() && !forecast {
        return None;
    }
    let base = inner.schema(&info.name)?.clone();
    let n = info.layout.doubles;
    Some(SeriesState {
        source: info.source.clone(),
        rolling: windows
            .iter()
            .map(|w| {
                (
                    Rolling::new(*w, n),
                    0,
                    format!("{}{}", info.name, summary_suffix(w)),
                )
            })
            .collect(),
        forecasters: forecast.then(|| {
            (
                vec![Forecaster::new(); n],
                format!("{}{FORECAST_SUFFIX}", info.name),
            )
        }),
        schemas_added: false,
        base,
    })
}

/// Follows the hub's log and publishes derived events until `stop` flips.
pub async fn run(deriver: Arc<Deriver>, hub: Arc<Hub>, mut stop: watch::Receiver<bool>) {
    let mut head = hub.watch_head();
    let mut next = hub.lock().head();
    let mut version = u64::MAX;
    let mut rules = Vec::new();
    // Per series id: None = not classified yet, Some(None) = nothing derived.
    let mut states: HashMap<u32, Option<SeriesState>> = HashMap::new();
    let mut batch: Vec<(u32, i64, crate::hub::Numbers)> = Vec::new();
    let mut out = Vec::new();
    loop {
        let (v, r, from) = deriver.snapshot();
        let replan = v != version;
        if replan {
            version = v;
            rules = r;
        }
        batch.clear();
        if rules.is_empty() {
            // Nothing to derive until a rule is added (rules are never removed).
            tokio::select! {
                _ = deriver.added.notified() => {}
                _ = stop.changed() => return,
            }
            continue;
        }
        next = next.max(from);
        let caught_up = {
            let inner = hub.lock();
            if replan {
                // Classify every known series again; what was already derived keeps its state.
                for (id, st) in states.iter_mut() {
                    let fresh = plan(&rules, &inner, *id);
                    *st = match (st.take(), fresh) {
                        (Some(old), Some(new)) => Some(old.merge(new)),
                        (_, fresh) => fresh,
                    };
                }
            }
            next = next.max(inner.oldest());
            for e in inner.since(next).take(PASS) {
                next = e.seq + 1;
                let st = states
                    .entry(e.series)
                    .or_insert_with(|| plan(&rules, &inner, e.series));
                if st.is_some() {
                    batch.push((e.series, e.timestamp_ns, e.numbers.clone()));
                }
            }
            next >= inner.head()
        };
        out.clear();
        let mut schemas = Vec::new();
        for (id, ts, numbers) in &batch {
            if let Some(Some(st)) = states.get_mut(id) {
                if !st.schemas_added {
                    let windows: Vec<Window> = st.rolling.iter().map(|r| r.0.window()).collect();
                    schemas.extend(derived_schemas(&st.base, &windows, st.forecasters.is_some()));
                    st.schemas_added = true;
                }
                st.derive(*ts, numbers, &mut out);
            }
        }
        if !schemas.is_empty() {
            if let Err(e) = hub.add_schemas(&schemas) {
                tracing::warn!(error = %e, "derived schemas refused");
            }
        }
        if !out.is_empty() {
            metrics::counter!(crate::telemetry::DERIVED_EVENTS).increment(out.len() as u64);
            if let (_, Err(e)) = hub.publish(&out) {
                tracing::warn!(error = %e, "derived event refused");
            }
        }
        if !caught_up {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            r = head.changed() => if r.is_err() { return },
            _ = stop.changed() => return,
        }
        head.borrow_and_update();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::rolling::window;

    fn names_in(hub: &Hub) -> Vec<String> {
        let inner = hub.lock();
        let mut v: Vec<String> = inner
            .since(0)
            .map(|e| inner.series[e.series as usize].name.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    #[tokio::test]
    async fn rules_added_later_join_the_running_ones() {
        let hub = Hub::new(1, 10_000);
        hub.add_schemas(&[pb::EventSchema {
            name: "t.x".into(),
            version: 1,
            fields: vec![dbl("v", "", "")],
            description: String::new(),
        }])
        .unwrap();
        let deriver = Arc::new(Deriver::default());
        let sel = Selector {
            patterns: vec![Pattern::event("t.x").unwrap()],
            sources: vec![],
        };
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(run(deriver.clone(), hub.clone(), stop));
        // Let the deriver start following the log before anything is published.
        tokio::task::yield_now().await;
        let publish = |from: i64| {
            let evs: Vec<EventData> = (0..5)
                .map(|i| EventData {
                    name: "t.x".into(),
                    source: "a".into(),
                    timestamp_ns: (from + i) * 2_000_000_000,
                    numbers: vec![i as f64],
                    strings: vec![],
                })
                .collect();
            hub.publish(&evs).1.unwrap();
        };
        let derived = deriver
            .activate(&hub, &sel, &[window("1m").unwrap()], false)
            .unwrap();
        assert_eq!(derived.patterns[0].as_str(), "t.x.avg1m");
        publish(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !names_in(&hub).contains(&"t.x.avg1m".to_string()) {
            assert!(std::time::Instant::now() < deadline, "no summary");
            tokio::task::yield_now().await;
        }
        deriver.activate(&hub, &sel, &[], true).unwrap();
        publish(10);
        while !names_in(&hub).contains(&"t.x.forecast".to_string()) {
            assert!(
                std::time::Instant::now() < deadline,
                "no forecast after the second rule"
            );
            tokio::task::yield_now().await;
        }
        // The summary kept its history: its sample count covers both rounds.
        let inner = hub.lock();
        let last = inner
            .latest()
            .filter(|e| inner.series[e.series as usize].name == "t.x.avg1m")
            .last()
            .map(|e| e.numbers.to_vec())
            .unwrap();
        assert!(last[3] > 5.0, "samples {last:?}");
    }

    /// Without rules the deriver waits for one, not for the hub's publishes; what the first
    /// rule derives starts at the hub's head when it was added, whenever the task sees it.
    #[tokio::test]
    async fn the_first_rule_derives_from_the_head_it_was_added_at() {
        let hub = Hub::new(1, 10_000);
        hub.add_schemas(&[crate::hub::tests::schema()]).unwrap();
        let deriver = Arc::new(Deriver::default());
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(run(deriver.clone(), hub.clone(), stop));
        tokio::task::yield_now().await;
        let publish = |seconds: std::ops::Range<i64>| {
            let evs: Vec<EventData> = seconds
                .map(|s| EventData {
                    name: "t.x".into(),
                    source: "a".into(),
                    timestamp_ns: s * 1_000_000_000,
                    numbers: vec![s as f64],
                    strings: vec![],
                })
                .collect();
            hub.publish(&evs).1.unwrap();
        };
        let forecasts = || {
            let inner = hub.lock();
            inner
                .since(0)
                .filter(|e| inner.series[e.series as usize].name == "t.x.forecast")
                .count()
        };
        // Before any rule: nothing is derived from these, now or later.
        publish(0..5);
        tokio::task::yield_now().await;
        let sel = Selector {
            patterns: vec![Pattern::event("t.x").unwrap()],
            sources: vec![],
        };
        deriver.activate(&hub, &sel, &[], true).unwrap();
        publish(10..13);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while forecasts() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "no forecasts after the rule"
            );
            tokio::task::yield_now().await;
        }
        // The deriver reads in seq order: once the last event's forecast is there, every
        // earlier event it was going to derive from has been.
        publish(20..21);
        while forecasts() < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "no forecast of the last event"
            );
            tokio::task::yield_now().await;
        }
        assert_eq!(
            forecasts(),
            4,
            "only the events from the rule's head on are derived"
        );
    }

    #[test]
    fn derived_schemas_follow_the_base() {
        let base = pb::EventSchema {
            name: "host.load".into(),
            version: 2,
            fields: vec![
                dbl("load1", "tasks", ""),
                text("arch", ""),
                dbl("free_cpus", "cpus", ""),
            ],
            description: String::new(),
        };
        let w = window("1m").unwrap();
        let s = summary_schema(&base, &w);
        assert_eq!(s.name, "host.load.avg1m");
        let names: Vec<&str> = s.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "load1",
                "load1_min",
                "load1_max",
                "free_cpus",
                "free_cpus_min",
                "free_cpus_max",
                "samples",
                "covered_s"
            ]
        );
        let f = forecast_schema(&base);
        assert_eq!(f.name, "host.load.forecast");
        assert_eq!(f.fields.len(), 6);
        gma_core::event::validate_schema(&s).unwrap();
        gma_core::event::validate_schema(&f).unwrap();
        assert!(is_derived("host.load.avg10m") && is_derived("x.forecast") && !is_derived("host.load"));
    }
}
