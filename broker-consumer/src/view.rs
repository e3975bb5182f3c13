//! The live resource view: an in-memory table fed by the load streams the broker follows.
//!
//! One row per host (event source): `host.load` sets capacity, load, queue and benchmarks and
//! stamps the row's freshness with the sample's own timestamp; `host.info` sets architecture,
//! OS and memory, and adds each package of its `software` (`name=version,...`) as the software
//! entries `name` and `name=version`; `host.cpu` refreshes `load1`; `net.bw.forecast` (from `gma netprobe`, series
//! `<src>/<dst>`) sets the bandwidth of host `dst`: the largest forecast among the measured
//! paths into it, since a pair's throughput is bounded by both of its ends and the best path
//! in shows what the host's own link carries (the broker does not know where a job's input
//! lives). A measured bandwidth overrides a configured `bandwidth_mbps`; when the netprobes
//! that measured a host leave, the configured value (or none) comes back. Newest wins: a
//! sample older than what the row already holds is ignored. `site.load` summaries are kept apart (sites are not hosts: see
//! [`LiveView::sites`]). Static facts a load stream does not carry (price, software, site,
//! bandwidth) come from `[[resources]]` annotations in the broker config, matched by host-name
//! pattern.
//!
//! `rm.slots` (the free slots resource managers offer, Singh et al.) is kept apart too: the
//! newest complete snapshot per manager ([`crate::provision::offers`], read with
//! [`LiveView::slot_offers`]).
//!
//! Reads never wait on a producer: [`LiveView::snapshot`] hands out the current rows as shared
//! pointers (rebuilt only after a change), so a decision costs no copy of the table.

use gma_core::Refuse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gma_core::codec::OwnedEvent;
use gma_core::pattern::Pattern;
use parking_lot::Mutex;
use serde::Deserialize;

use crate::error::Error;
use crate::provision::offers::{ManagerOffer, SlotBook, SlotEvent, SLOTS_EVENT};
use crate::rank::{Resource, Snapshot};

/// The forecast of every measured link (`gma netprobe`), series `<src>/<dst>`.
pub const NET_BW_FORECAST: &str = "net.bw.forecast";

/// The largest forecast into a host.
fn max_link(links: Option<&HashMap<(String, String), f64>>) -> Option<f64> {
    links?.values().copied().reduce(f64::max)
}

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
    /// Checks every field; the error (INVALID_ARGUMENT) names the first bad one under `at`.
    pub fn validate(&self, at: &str) -> Result<(), Error> {
        gma_core::pattern::source_patterns(std::slice::from_ref(&self.pattern))
            .map_err(|e| Error::invalid_argument(format!("{at}.match: {e}")))?;
        for (name, v) in [
            ("bandwidth_mbps", self.bandwidth_mbps),
            ("cost_per_cpu_hour", self.cost_per_cpu_hour),
        ] {
            if v.is_some_and(|x| !x.is_finite() || x < 0.0) {
                return Err(Error::invalid_argument(format!(
                    "{at}.{name}: must be a finite number >= 0"
                )));
            }
        }
        if self.benchmarks.values().any(|s| !s.is_finite() || *s <= 0.0) {
            return Err(Error::invalid_argument(format!(
                "{at}.benchmarks: scores must be finite numbers > 0"
            )));
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
    /// By host name: a snapshot is the rows in order, with no sort (100,000 hosts).
    rows: BTreeMap<String, Row>,
    /// Forecast bandwidth into each host (Mbit/s), by (producer, source host) of the link.
    links: HashMap<String, HashMap<(String, String), f64>>,
    by_producer: HashMap<String, HashSet<String>>,
    sites: BTreeMap<String, SiteRow>,
    snapshot: Option<Arc<[Arc<Resource>]>>,
}

/// The broker's table of resources.
pub struct LiveView {
    inner: Mutex<Inner>,
    /// The slot offers (`rm.slots`), apart from the load table: planning reads them rarely.
    slots: Mutex<SlotBook>,
    annotations: Vec<(Pattern, Annotation)>,
}

impl LiveView {
    pub fn new(annotations: Vec<Annotation>) -> Result<LiveView, Error> {
        let mut compiled = Vec::with_capacity(annotations.len());
        for (i, a) in annotations.into_iter().enumerate() {
            a.validate(&format!("resources[{i}]"))?;
            let mut p = gma_core::pattern::source_patterns(std::slice::from_ref(&a.pattern))
                .map_err(|e| Error::invalid_argument(format!("resources[{i}].match: {e}")))?;
            if let Some(p) = p.pop() {
                compiled.push((p, a));
            }
        }
        Ok(LiveView {
            inner: Mutex::new(Inner::default()),
            slots: Mutex::new(SlotBook::default()),
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
        if e.series.name == SLOTS_EVENT {
            let text = |f: &str| ev.text(f).unwrap_or_default().to_string();
            let slot = SlotEvent {
                start_s: num("start_s"),
                end_s: num("end_s"),
                processors: num("processors"),
                price: num("price"),
                version: num("version"),
                count: num("count"),
                resource: text("resource"),
                slot: text("slot"),
            };
            return self.slots.lock().apply(producer, name, e.timestamp_ns, &slot);
        }
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
            NET_BW_FORECAST => return self.apply_link(inner, producer, name, num("mbps")),
            "host.load" | "host.info" | "host.cpu" => {}
            _ => return false,
        }
        // Looked up before inserting: no allocation per event for a known host (at 100,000
        // hosts the view applies 300,000 events/s).
        if !inner.rows.contains_key(name) {
            let mut r = self.fresh_row(name, producer);
            if let Some(bw) = max_link(inner.links.get(name)) {
                r.bandwidth_mbps = bw;
            }
            let row = Row {
                res: Arc::new(r),
                load_seen: false,
            };
            inner.rows.insert(name.to_string(), row);
        }
        let Some(row) = inner.rows.get_mut(name) else {
            return false;
        };
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
                for (b, field) in [("specint", "bench_specint"), ("specfp", "bench_specfp")] {
                    let v = num(field);
                    if v.is_finite() && v > 0.0 {
                        match r.benchmarks.get_mut(b) {
                            Some(old) => *old = v,
                            None => {
                                r.benchmarks.insert(b.to_string(), v);
                            }
                        }
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
                if let Some(sw) = ev.text("software") {
                    // What the host publishes now, on top of what the config declares: a
                    // package removed from the host stops matching.
                    let mut software = self.fresh_row(name, "").software;
                    for entry in gma_sensors::info::software_entries(sw) {
                        if !software.iter().any(|s| s == entry) {
                            software.push(entry.to_string());
                        }
                    }
                    r.software = software;
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
        match inner.by_producer.get_mut(producer) {
            Some(set) => {
                if !set.contains(name) {
                    set.insert(name.to_string());
                }
            }
            None => {
                inner
                    .by_producer
                    .insert(producer.to_string(), HashSet::from([name.to_string()]));
            }
        }
        inner.snapshot = None;
        true
    }

    /// A `net.bw.forecast` of link `<src>/<dst>`: the forecast `mbps` from `producer`.
    fn apply_link(&self, inner: &mut Inner, producer: &str, link: &str, mbps: f64) -> bool {
        let Some((src, dst)) = link.split_once('/') else {
            return false;
        };
        if !mbps.is_finite() || mbps <= 0.0 || src.is_empty() || dst.is_empty() {
            return false;
        }
        inner
            .links
            .entry(dst.to_string())
            .or_default()
            .insert((producer.to_string(), src.to_string()), mbps);
        self.refresh_bandwidth(inner, dst)
    }

    /// Sets the bandwidth of `host`'s row from the links into it (or the configured value when
    /// none is left). Returns whether the row changed.
    fn refresh_bandwidth(&self, inner: &mut Inner, host: &str) -> bool {
        let bw = match max_link(inner.links.get(host)) {
            Some(bw) => bw,
            None => self.fresh_row(host, "").bandwidth_mbps,
        };
        let Some(row) = inner.rows.get_mut(host) else {
            return false;
        };
        if row.res.bandwidth_mbps == bw || (row.res.bandwidth_mbps.is_nan() && bw.is_nan()) {
            return false;
        }
        Arc::make_mut(&mut row.res).bandwidth_mbps = bw;
        inner.snapshot = None;
        true
    }

    /// Applies a bandwidth measurement toward `host` (Mbit/s).
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

    /// Records where `producer` serves (the address its slot offers are reserved at).
    pub fn set_address(&self, producer: &str, address: &str) {
        self.slots.lock().set_address(producer, address);
    }

    /// The slot offers followed from `rm.slots` as of `now_s` (ended slots dropped).
    pub fn slot_offers(&self, now_s: i64) -> Vec<ManagerOffer> {
        self.slots.lock().offers(now_s)
    }

    /// Forgets every resource (and slot offer) learned from `producer` (it left the
    /// directory). Returns how many resources.
    pub fn remove_producer(&self, producer: &str) -> usize {
        self.slots.lock().remove_producer(producer);
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
        let mut measured_by: Vec<String> = Vec::new();
        for (dst, m) in inner.links.iter_mut() {
            let before = m.len();
            m.retain(|(p, _), _| p != producer);
            if m.len() != before {
                measured_by.push(dst.clone());
            }
        }
        inner.links.retain(|_, m| !m.is_empty());
        for dst in measured_by {
            self.refresh_bandwidth(inner, &dst);
        }
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
                // In name order already (a BTreeMap).
                let s: Arc<[Arc<Resource>]> = g
                    .rows
                    .values()
                    .filter(|r| r.load_seen)
                    .map(|r| r.res.clone())
                    .collect();
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

    /// The job of `job_toml` ranked by time to done over the view as of `now`.
    fn rank_ttd(v: &LiveView, now: i64, job_toml: &str, limits: crate::rank::Limits) -> crate::rank::Ranking {
        let job = crate::job::Job::from_toml(job_toml, "job.toml").unwrap();
        crate::rank::rank(
            &v.snapshot(now),
            &job,
            crate::rank::Policy::Ttd,
            &crate::rank::RankConfig::default(),
            limits,
        )
        .unwrap()
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

        // A host publishing its packages: each name and name=version, next to the config's.
        let sw = |software: &str, t: i64| {
            event("host.info", "h1", t, &[("cores", 8.0)], &[("software", software)])
        };
        assert!(v.apply("p1", &sw("mpi=4.1,python3=3.11.2-1", 400)));
        let s = v.snapshot(500);
        assert_eq!(
            s.resources[0].software,
            ["mpi", "mpi=4.1", "python3", "python3=3.11.2-1"]
        );
        // Removed from the host: no longer offered; the declared entry stays.
        assert!(v.apply("p1", &sw("", 600)));
        assert_eq!(v.snapshot(700).resources[0].software, ["mpi"]);
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

    /// The view at the largest scale: 100,000 hosts from 4 producers, every host
    /// once in name order, a refresh changing no row count, a producer leaving taking its
    /// quarter, and a ranking over what is left.
    #[test]
    fn a_view_of_100000_hosts() {
        const N: usize = 100_000;
        let v = LiveView::new(vec![]).unwrap();
        for round in 0..2 {
            for i in 0..N {
                let ev = load(&format!("p{}h-{i:05}", i % 4), 10 + round, 8.0);
                assert!(v.apply(&format!("p{}", i % 4), &ev));
            }
        }
        let s = v.snapshot(20);
        assert_eq!(s.resources.len(), N);
        assert!(
            s.resources.windows(2).all(|w| w[0].name < w[1].name),
            "name order"
        );
        assert!(s.resources.iter().all(|r| r.updated_ns == 11));
        assert_eq!(v.remove_producer("p1"), N / 4);
        assert_eq!(v.len(), N - N / 4);
        let limits = crate::rank::Limits {
            limit: 10,
            rejected: false,
        };
        let ranking = rank_ttd(&v, 20, "name = \"j\"\ncpus = 2\nreference_time_s = 60\n", limits);
        assert_eq!(ranking.ranked.len(), 10);
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

    fn bw_forecast(link: &str, ts: i64, mbps: f64) -> OwnedEvent {
        event(
            NET_BW_FORECAST,
            link,
            ts,
            &[("mbps", mbps), ("mbps_mae", 0.1)],
            &[("mbps_method", "last")],
        )
    }

    #[test]
    fn forecast_bandwidth_into_a_host_sets_its_bandwidth() {
        let v = LiveView::new(vec![Annotation {
            pattern: "b".into(),
            bandwidth_mbps: Some(1000.0),
            ..Annotation::default()
        }])
        .unwrap();
        // A forecast before the host's first load sample is kept for the row to come.
        assert!(!v.apply("np-c", &bw_forecast("c/a", 1, 40.0)));
        v.apply("p", &load("a", 1, 8.0));
        v.apply("p", &load("b", 1, 8.0));
        let bw = |v: &LiveView, h: &str| {
            v.snapshot(9)
                .resources
                .iter()
                .find(|r| r.name == h)
                .map(|r| r.bandwidth_mbps)
                .unwrap()
        };
        assert_eq!(bw(&v, "a"), 40.0);
        assert!(
            !v.apply("np-b", &bw_forecast("b/a", 2, 19.5)),
            "a's bandwidth is unchanged"
        );
        assert_eq!(bw(&v, "a"), 40.0, "the best path into a");
        assert!(v.apply("np-c", &bw_forecast("c/a", 3, 18.0)));
        assert_eq!(bw(&v, "a"), 19.5, "c's forecast dropped: b's is now the best");
        assert!(
            !v.apply("np-c", &bw_forecast("c/a", 4, f64::NAN)),
            "no prediction yet"
        );
        assert!(!v.apply("np-c", &bw_forecast("nolink", 4, 5.0)));
        // Measured beats configured; when the netprobes leave, the configured value is back.
        assert_eq!(bw(&v, "b"), 1000.0);
        v.apply("np-a", &bw_forecast("a/b", 5, 90.0));
        assert_eq!(bw(&v, "b"), 90.0);
        assert_eq!(v.remove_producer("np-a"), 0, "a netprobe holds no host rows");
        assert_eq!(bw(&v, "b"), 1000.0);
        v.remove_producer("np-b");
        v.remove_producer("np-c");
        assert!(bw(&v, "a").is_nan());
        // The ranking stages a job's input over it: 1 GB into b at 80 Mbit/s takes 100 s.
        v.apply("np-a", &bw_forecast("a/b", 6, 80.0));
        let ranking = rank_ttd(
            &v,
            9,
            "name = \"j\"\ncpus = 1\nreference_time_s = 60\ninput_bytes = 1e9\n",
            crate::rank::Limits::default(),
        );
        let b = ranking.ranked.iter().find(|r| r.resource == "b").unwrap();
        assert!((b.stage_in_s - 100.0).abs() < 1e-9, "{}", b.stage_in_s);
    }

    #[test]
    fn bad_annotations_name_the_field() {
        let e = LiveView::new(vec![Annotation {
            pattern: "a b".into(),
            ..Annotation::default()
        }])
        .err()
        .unwrap()
        .to_string();
        assert!(e.starts_with("resources[0].match"), "{e}");
        let e = LiveView::new(vec![Annotation {
            pattern: "a".into(),
            cost_per_cpu_hour: Some(-1.0),
            ..Annotation::default()
        }])
        .err()
        .unwrap()
        .to_string();
        assert!(e.starts_with("resources[0].cost_per_cpu_hour"), "{e}");
    }
}
