//! The live resource view: an in-memory table fed by the load streams the broker follows.
//!
//! One row per host (event source): `host.load` sets capacity, load, queue and benchmarks and
//! stamps the row's freshness with the sample's own timestamp; `host.info` sets architecture,
//! OS and memory; `host.cpu` refreshes `load1`; `net.bw` forecasts (when network probes run)
//! set the bandwidth toward a host. Newest wins: a sample older than what the row already
//! holds is ignored. `site.load` summaries are kept apart (sites are not hosts: see
//! [`LiveView::sites`]). Static facts a load stream does not carry (price, software, site,
//! bandwidth) come from `[[resources]]` annotations in the broker config, matched by host-name
//! pattern.
//!
//! Reads never wait on a producer: [`LiveView::snapshot`] hands out the current rows as shared
//! pointers (rebuilt only after a change), so a decision costs no copy of the table.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gma_core::codec::OwnedEvent;
use gma_core::pattern::Pattern;
use parking_lot::Mutex;
use serde::Deserialize;

use crate::rank::{Resource, Snapshot};

/// Static facts about resources the streams do not carry (`[[resources]]` in the config).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Annotation {
    /// Host-name pattern (`sim-*`, `hostA`).
    #[serde(rename = "match")]
    pub pattern: String,
    pub site: Option<String>,
    #[serde(default)]
    pub software: Vec<String>,
    pub bandwidth_mbps: Option<f64>,
    pub cost_per_cpu_hour: Option<f64>,
    /// Benchmark scores by name, for hosts that publish none of their own.
    #[serde(default)]
    pub benchmarks: BTreeMap<String, f64>,
    pub arch: Option<String>,
}

impl Annotation {
    pub fn validate(&self, at: &str) -> Result<(), String> {
        gma_core::pattern::source_patterns(std::slice::from_ref(&self.pattern))
            .map_err(|e| format!("{at}.match: {e}"))?;
        for (name, v) in [
            ("bandwidth_mbps", self.bandwidth_mbps),
            ("cost_per_cpu_hour", self.cost_per_cpu_hour),
        ] {
            if v.is_some_and(|x| !x.is_finite() || x < 0.0) {
                return Err(format!("{at}.{name}: must be a finite number >= 0"));
            }
        }
        if self.benchmarks.values().any(|s| !s.is_finite() || *s <= 0.0) {
            return Err(format!("{at}.benchmarks: scores must be finite numbers > 0"));
        }
        Ok(())
    }
}

/// A `site.load` summary as last received.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteRow {
    pub site: String,
    pub producer: String,
    pub values: BTreeMap<String, f64>,
    pub updated_ns: i64,
}

struct Row {
    res: Arc<Resource>,
    /// A host.load was seen (before that the row only holds host.info facts).
    load_seen: bool,
}

#[derive(Default)]
struct Inner {
    rows: HashMap<String, Row>,
    by_producer: HashMap<String, HashSet<String>>,
    sites: BTreeMap<String, SiteRow>,
    snapshot: Option<Arc<[Arc<Resource>]>>,
}

/// The broker's table of resources.
pub struct LiveView {
    inner: Mutex<Inner>,
    annotations: Vec<(Pattern, Annotation)>,
}

impl LiveView {
    pub fn new(annotations: Vec<Annotation>) -> Result<LiveView, String> {
        let mut compiled = Vec::with_capacity(annotations.len());
        for (i, a) in annotations.into_iter().enumerate() {
            a.validate(&format!("resources[{i}]"))?;
            let mut p = gma_core::pattern::source_patterns(std::slice::from_ref(&a.pattern))
                .map_err(|e| format!("resources[{i}].match: {e}"))?;
            if let Some(p) = p.pop() {
                compiled.push((p, a));
            }
        }
        Ok(LiveView {
            inner: Mutex::new(Inner::default()),
            annotations: compiled,
        })
    }

    fn fresh_row(&self, name: &str, producer: &str) -> Resource {
        let mut r = Resource::unknown(name);
        r.producer = producer.to_string();
        for (p, a) in &self.annotations {
            if !p.matches(name) {
                continue;
            }
            if let Some(s) = &a.site {
                r.site.clone_from(s);
            }
            for s in &a.software {
                if !r.software.contains(s) {
                    r.software.push(s.clone());
                }
            }
            if let Some(b) = a.bandwidth_mbps {
                r.bandwidth_mbps = b;
            }
            if let Some(c) = a.cost_per_cpu_hour {
                r.cost_per_cpu_hour = c;
            }
            for (k, v) in &a.benchmarks {
                r.benchmarks.insert(k.clone(), *v);
            }
            if let Some(arch) = &a.arch {
                r.arch.clone_from(arch);
            }
        }
        r
    }

    /// Applies one event from `producer`. Returns whether the view changed.
    pub fn apply(&self, producer: &str, e: &OwnedEvent) -> bool {
        let ev = e.as_ref();
        let num = |f: &str| ev.number(f).unwrap_or(f64::NAN);
        let name = e.series.source.as_str();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        match e.series.name.as_str() {
            "site.load" => {
                let values = e
                    .series
                    .fields
                    .iter()
                    .filter_map(|f| ev.number(&f.name).map(|v| (f.name.clone(), v)))
                    .collect();
                let row = SiteRow {
                    site: name.to_string(),
                    producer: producer.to_string(),
                    values,
                    updated_ns: e.timestamp_ns,
                };
                match inner.sites.get(name) {
                    Some(old) if old.updated_ns > e.timestamp_ns => return false,
                    _ => {
                        inner.sites.insert(name.to_string(), row);
                    }
                }
                return true;
            }
            "host.load" | "host.info" | "host.cpu" => {}
            _ => return false,
        }
        let row = inner.rows.entry(name.to_string()).or_insert_with(|| Row {
            res: Arc::new(self.fresh_row(name, producer)),
            load_seen: false,
        });
        let is_load = e.series.name == "host.load";
        if is_load && row.load_seen && row.res.updated_ns > e.timestamp_ns {
            return false; // a late sample: newest wins
        }
        let r = Arc::make_mut(&mut row.res);
        if r.producer != producer {
            // The host moved to another producer: follow it.
            if let Some(set) = inner.by_producer.get_mut(&r.producer) {
                set.remove(name);
            }
            r.producer = producer.to_string();
        }
        match e.series.name.as_str() {
            "host.load" => {
                r.total_cpus = num("total_cpus");
                r.free_cpus = num("free_cpus");
                r.load1 = num("load1");
                r.queue_waiting = num("queue_waiting");
                let mem = num("memory_mb");
                if mem.is_finite() {
                    r.memory_mb = mem;
                }
                for b in ["specint", "specfp"] {
                    let v = num(&format!("bench_{b}"));
                    if v.is_finite() && v > 0.0 {
                        r.benchmarks.insert(b.to_string(), v);
                    }
                }
                r.updated_ns = e.timestamp_ns;
                row.load_seen = true;
            }
            "host.info" => {
                if let Some(a) = ev.text("arch").filter(|a| !a.is_empty()) {
                    r.arch = a.to_string();
                }
                if let Some(os) = ev.text("os") {
                    r.os = os.to_string();
                }
                let mem = num("memory_mb");
                if r.memory_mb.is_nan() && mem.is_finite() {
                    r.memory_mb = mem;
                }
                let cores = num("cores");
                if r.total_cpus.is_nan() && cores.is_finite() {
                    r.total_cpus = cores;
                }
            }
            _ => {
                // host.cpu: a fresher load average between host.load samples.
                let l = num("load1");
                if l.is_finite() && e.timestamp_ns >= r.updated_ns {
                    r.load1 = l;
                }
            }
        }
        inner
            .by_producer
            .entry(producer.to_string())
            .or_default()
            .insert(name.to_string());
        inner.snapshot = None;
        true
    }

    /// Applies a bandwidth measurement toward `host` (Mbit/s), e.g. a `net.bw` forecast.
    pub fn set_bandwidth(&self, host: &str, mbps: f64) {
        if !mbps.is_finite() || mbps <= 0.0 {
            return;
        }
        let mut g = self.inner.lock();
        if let Some(row) = g.rows.get_mut(host) {
            Arc::make_mut(&mut row.res).bandwidth_mbps = mbps;
            g.snapshot = None;
        }
    }

    /// Forgets every resource learned from `producer` (it left the directory). Returns how many.
    pub fn remove_producer(&self, producer: &str) -> usize {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let hosts = inner.by_producer.remove(producer).unwrap_or_default();
        let mut n = 0;
        for h in hosts {
            if inner.rows.get(&h).is_some_and(|r| r.res.producer == producer) {
                inner.rows.remove(&h);
                n += 1;
            }
        }
        inner.sites.retain(|_, s| s.producer != producer);
        if n > 0 {
            inner.snapshot = None;
        }
        n
    }

    /// The rows with load data, sorted by name, as of `now_ns`.
    pub fn snapshot(&self, now_ns: i64) -> Snapshot {
        let mut g = self.inner.lock();
        let resources = match &g.snapshot {
            Some(s) => s.clone(),
            None => {
                let mut rows: Vec<Arc<Resource>> = g
                    .rows
                    .values()
                    .filter(|r| r.load_seen)
                    .map(|r| r.res.clone())
                    .collect();
                rows.sort_by(|a, b| a.name.cmp(&b.name));
                let s: Arc<[Arc<Resource>]> = rows.into();
                g.snapshot = Some(s.clone());
                s
            }
        };
        Snapshot { now_ns, resources }
    }

    pub fn sites(&self) -> Vec<SiteRow> {
        self.inner.lock().sites.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().rows.values().filter(|r| r.load_seen).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::codec::{Mark, SeriesInfo};

    fn event(
        name: &str,
        source: &str,
        ts: i64,
        fields: &[(&str, f64)],
        texts: &[(&str, &str)],
    ) -> OwnedEvent {
        let schema = gma_proto::v1::EventSchema {
            name: name.into(),
            version: 1,
            fields: fields
                .iter()
                .map(|(f, _)| gma_core::event::dbl(f, "", ""))
                .chain(texts.iter().map(|(f, _)| gma_core::event::text(f, "")))
                .collect(),
            description: String::new(),
        };
        OwnedEvent {
            series: Arc::new(SeriesInfo::new(1, name, source, &schema)),
            seq: 1,
            timestamp_ns: ts,
            numbers: fields.iter().map(|(_, v)| *v).collect(),
            strings: texts.iter().map(|(_, v)| v.to_string()).collect(),
            mark: Mark::None,
        }
    }

    fn load(source: &str, ts: i64, free: f64) -> OwnedEvent {
        event(
            "host.load",
            source,
            ts,
            &[
                ("load1", 1.0),
                ("free_cpus", free),
                ("total_cpus", 8.0),
                ("queue_waiting", 0.0),
                ("memory_mb", 4096.0),
                ("bench_specint", 1200.0),
                ("bench_specfp", f64::NAN),
            ],
            &[],
        )
    }

    #[test]
    fn newest_sample_wins_and_info_fills_in_facts() {
        let v = LiveView::new(vec![Annotation {
            pattern: "h*".into(),
            cost_per_cpu_hour: Some(0.5),
            software: vec!["mpi".into()],
            ..Annotation::default()
        }])
        .unwrap();
        assert!(v.apply(
            "p1",
            &event(
                "host.info",
                "h1",
                5,
                &[("memory_mb", 2048.0), ("cores", 8.0)],
                &[("arch", "x86_64"), ("os", "Linux")]
            )
        ));
        assert!(
            v.snapshot(10).resources.is_empty(),
            "no load yet: not a rankable resource"
        );
        assert!(v.apply("p1", &load("h1", 100, 8.0)));
        assert!(v.apply("p1", &load("h1", 200, 2.0)));
        assert!(!v.apply("p1", &load("h1", 150, 7.0)), "late sample ignored");
        let s = v.snapshot(300);
        let r = &s.resources[0];
        assert_eq!((r.free_cpus, r.updated_ns, r.memory_mb), (2.0, 200, 4096.0));
        assert_eq!(r.arch, "x86_64");
        assert_eq!(r.benchmarks.get("specint"), Some(&1200.0));
        assert!(!r.benchmarks.contains_key("specfp"), "NaN scores are not scores");
        assert_eq!(r.cost_per_cpu_hour, 0.5);
        assert_eq!(r.software, ["mpi"]);
    }

    #[test]
    fn snapshots_are_shared_until_a_change_and_removal_forgets_a_producer() {
        let v = LiveView::new(vec![]).unwrap();
        v.apply("p1", &load("a", 1, 8.0));
        v.apply("p2", &load("b", 1, 8.0));
        let s1 = v.snapshot(5);
        let s2 = v.snapshot(6);
        assert!(Arc::ptr_eq(&s1.resources, &s2.resources));
        v.apply("p1", &load("a", 2, 4.0));
        let s3 = v.snapshot(7);
        assert!(!Arc::ptr_eq(&s1.resources, &s3.resources));
        assert_eq!(
            s1.resources[0].free_cpus, 8.0,
            "an old snapshot is not changed under a reader"
        );
        assert_eq!(v.remove_producer("p1"), 1);
        let names: Vec<_> = v.snapshot(8).resources.iter().map(|r| r.name.clone()).collect();
        assert_eq!(names, ["b"]);
        assert_eq!(v.remove_producer("nobody"), 0);
    }

    #[test]
    fn site_summaries_are_kept_apart() {
        let v = LiveView::new(vec![]).unwrap();
        v.apply(
            "relay",
            &event(
                "site.load",
                "s1",
                9,
                &[("hosts_up", 3.0), ("free_cpus_max", 4.0)],
                &[],
            ),
        );
        assert!(v.is_empty());
        assert_eq!(v.sites()[0].values["free_cpus_max"], 4.0);
        v.remove_producer("relay");
        assert!(v.sites().is_empty());
    }

    #[test]
    fn bad_annotations_name_the_field() {
        let e = LiveView::new(vec![Annotation {
            pattern: "a b".into(),
            ..Annotation::default()
        }])
        .err()
        .unwrap();
        assert!(e.starts_with("resources[0].match"), "{e}");
        let e = LiveView::new(vec![Annotation {
            pattern: "a".into(),
            cost_per_cpu_hour: Some(-1.0),
            ..Annotation::default()
        }])
        .err()
        .unwrap();
        assert!(e.starts_with("resources[0].cost_per_cpu_hour"), "{e}");
    }
}
