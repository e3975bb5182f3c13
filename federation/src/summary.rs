//! `site.summary`: what a site tells other sites about itself, aggregated per resource class.
//!
//! A [`Summary`] is built from a broker [`Snapshot`] (the site's hosts, as its live view holds
//! them) plus the site's queue state ([`SiteLoad`]). Per class `(arch, os)`: nodes up/total,
//! CPUs total / free summed / free on the best single node, a histogram of nodes by free CPUs
//! (≥ 1, 2, 4, ..., 128), memory min/max/sum per node, load, benchmark ranges. Per site: jobs
//! running and queued, the predicted start of probe jobs of 1, 4, 16 and 64 CPUs, the CPUs
//! still offered to outsiders, and a validity period. No host name leaves the site (the two
//! resume nodes below are anonymous figures).
//!
//! [`merge`] is associative and commutative, exactly (every sum is an integer: CPUs are whole,
//! memory in MiB, load and benchmark sums in thousandths; min/max are exact on floats), so a
//! parent's (VO's) summary is exactly the merge of its children's whatever the order. The merge
//! of headers is conservative: the oldest generation time, the shortest validity, the union of
//! contributing sites; the sender stamps its own site, epoch and seq afterwards
//! ([`Summary::stamp`]). Beyond [`MAX_CLASSES`] classes the largest keys fold into one
//! [`OTHER_ARCH`] class (also associative: the kept classes are always the smallest keys of
//! the union).
//!
//! Free CPUs are floored to whole CPUs and count only up (fresh) nodes, so a summary never
//! promises more than the hosts published.
//!
//! Vasques' resume (issue 22, notes/utility-and-provisioning.md §1.2): the average utilization
//! is `1 − cpus_free_sum / cpus_total`; each class also names two of its up nodes anonymously
//! ([`HostDigest`]: CPUs, free CPUs, load, memory, no name): the one with the lowest CPU
//! occupation (`least_loaded`) and the one with the most memory (`most_memory`). Each is the
//! maximum of a total order over its figures, so the merge stays associative and commutative.
//! The `utility` route policy reads exactly these ([`crate::route`]).

use gma_core::Refuse;
use std::collections::{BTreeMap, BTreeSet};

use gma_broker::Snapshot;
use gma_core::event::{dbl, schema, text, EventData};
use gma_proto::v1 as pb;
use prost::Message;

use crate::error::Error;

/// The event name.
pub const SUMMARY_EVENT: &str = "site.summary";
/// Probe job shapes (CPUs on one node) whose predicted start a summary carries.
pub const PROBE_CPUS: [u32; 4] = [1, 4, 16, 64];
/// Histogram grades: nodes with at least this many free CPUs.
pub const HIST_GRADES: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
/// Most classes in a summary; beyond, the largest keys fold into [`OTHER_ARCH`].
pub const MAX_CLASSES: usize = 16;
/// The arch of the folded class (sorts after every printable ASCII arch).
pub const OTHER_ARCH: &str = "~other";
/// Longest site id, arch, os or benchmark name accepted from a peer (bytes).
pub const MAX_NAME: usize = 256;
/// Most contributing sites / benchmarks per class accepted from a peer.
pub const MAX_LIST: usize = 1024;

/// A resource class.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassKey {
    pub arch: String,
    pub os: String,
}

impl ClassKey {
    pub fn other() -> ClassKey {
        ClassKey {
            arch: OTHER_ARCH.into(),
            os: String::new(),
        }
    }

    pub fn is_other(&self) -> bool {
        self.arch == OTHER_ARCH
    }

    /// Whether a job asking for `arch` ("" = any) may run on this class. The folded class
    /// matches only jobs that do not care.
    pub fn matches_arch(&self, arch: &str) -> bool {
        arch.is_empty() || (!self.is_other() && self.arch == arch)
    }
}

/// A benchmark's range over the up nodes of a class.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRange {
    pub min: f64,
    pub max: f64,
    pub sum_milli: u64,
    pub count: u32,
}

impl BenchRange {
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            self.sum_milli as f64 / 1000.0 / f64::from(self.count)
        }
    }

    fn merge(&mut self, o: &BenchRange) {
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.sum_milli = self.sum_milli.saturating_add(o.sum_milli);
        self.count = self.count.saturating_add(o.count);
    }
}

/// One up node's figures without its name (Vasques' resume; see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostDigest {
    /// > 0.
    pub cpus_total: u32,
    /// <= `cpus_total`.
    pub cpus_free: u32,
    pub load_milli: u64,
    pub memory_mb: u64,
}

impl HostDigest {
    /// Lower CPU occupation first (`free / total` higher, compared exactly), then more free
    /// CPUs, lower load, more memory, more CPUs: a total order, so the choice is associative.
    pub fn less_loaded(&self, o: &HostDigest) -> std::cmp::Ordering {
        let a = u64::from(self.cpus_free) * u64::from(o.cpus_total);
        let b = u64::from(o.cpus_free) * u64::from(self.cpus_total);
        a.cmp(&b)
            .then(self.cpus_free.cmp(&o.cpus_free))
            .then(o.load_milli.cmp(&self.load_milli))
            .then(self.memory_mb.cmp(&o.memory_mb))
            .then(self.cpus_total.cmp(&o.cpus_total))
    }

    /// More memory first, then the [`HostDigest::less_loaded`] order.
    pub fn more_memory(&self, o: &HostDigest) -> std::cmp::Ordering {
        self.memory_mb.cmp(&o.memory_mb).then_with(|| self.less_loaded(o))
    }

    /// CPU occupation in `[0, 1]`.
    pub fn occupation(&self) -> f64 {
        1.0 - f64::from(self.cpus_free) / f64::from(self.cpus_total.max(1))
    }

    fn to_proto(self) -> pb::HostDigest {
        pb::HostDigest {
            cpus_total: self.cpus_total,
            cpus_free: self.cpus_free,
            load_milli: self.load_milli,
            memory_mb: self.memory_mb,
        }
    }

    fn from_proto(p: &pb::HostDigest, at: &str) -> Result<HostDigest, Error> {
        if p.cpus_total == 0 || p.cpus_free > p.cpus_total {
            return Err(Error::invalid_argument(format!(
                "{at}: cpus_total must be > 0 and cpus_free <= cpus_total"
            )));
        }
        Ok(HostDigest {
            cpus_total: p.cpus_total,
            cpus_free: p.cpus_free,
            load_milli: p.load_milli,
            memory_mb: p.memory_mb,
        })
    }
}

/// The better of two optional digests under `order` (None loses).
fn pick(
    a: Option<HostDigest>,
    b: Option<HostDigest>,
    order: fn(&HostDigest, &HostDigest) -> std::cmp::Ordering,
) -> Option<HostDigest> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if order(&y, &x).is_gt() { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The figures of one class.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassStats {
    pub nodes_total: u32,
    pub nodes_up: u32,
    pub cpus_total: u32,
    pub cpus_free_sum: u32,
    pub cpus_free_max_node: u32,
    /// `free_hist[i]`: up nodes with at least `HIST_GRADES[i]` free CPUs.
    pub free_hist: [u32; 8],
    /// `u64::MAX` when no node is up.
    pub mem_min_node: u64,
    pub mem_max_node: u64,
    pub mem_sum: u64,
    pub load_milli_sum: u64,
    pub benchmarks: BTreeMap<String, BenchRange>,
    /// The up node with the lowest CPU occupation (`None`: no up node with CPUs, or an older
    /// sender).
    pub least_loaded: Option<HostDigest>,
    /// The up node with the most memory.
    pub most_memory: Option<HostDigest>,
}

impl Default for ClassStats {
    fn default() -> Self {
        ClassStats {
            nodes_total: 0,
            nodes_up: 0,
            cpus_total: 0,
            cpus_free_sum: 0,
            cpus_free_max_node: 0,
            free_hist: [0; 8],
            mem_min_node: u64::MAX,
            mem_max_node: 0,
            mem_sum: 0,
            load_milli_sum: 0,
            benchmarks: BTreeMap::new(),
            least_loaded: None,
            most_memory: None,
        }
    }
}

impl ClassStats {
    pub fn merge(&mut self, o: &ClassStats) {
        self.nodes_total = self.nodes_total.saturating_add(o.nodes_total);
        self.nodes_up = self.nodes_up.saturating_add(o.nodes_up);
        self.cpus_total = self.cpus_total.saturating_add(o.cpus_total);
        self.cpus_free_sum = self.cpus_free_sum.saturating_add(o.cpus_free_sum);
        self.cpus_free_max_node = self.cpus_free_max_node.max(o.cpus_free_max_node);
        for (a, b) in self.free_hist.iter_mut().zip(o.free_hist) {
            *a = a.saturating_add(b);
        }
        self.mem_min_node = self.mem_min_node.min(o.mem_min_node);
        self.mem_max_node = self.mem_max_node.max(o.mem_max_node);
        self.mem_sum = self.mem_sum.saturating_add(o.mem_sum);
        self.load_milli_sum = self.load_milli_sum.saturating_add(o.load_milli_sum);
        self.least_loaded = pick(self.least_loaded, o.least_loaded, HostDigest::less_loaded);
        self.most_memory = pick(self.most_memory, o.most_memory, HostDigest::more_memory);
        for (k, v) in &o.benchmarks {
            match self.benchmarks.get_mut(k) {
                Some(b) => b.merge(v),
                None => {
                    self.benchmarks.insert(k.clone(), v.clone());
                }
            }
        }
    }

    /// Mean 1-minute load of the up nodes (NaN when none).
    pub fn load_mean(&self) -> f64 {
        if self.nodes_up == 0 {
            f64::NAN
        } else {
            self.load_milli_sum as f64 / 1000.0 / f64::from(self.nodes_up)
        }
    }

    /// Up nodes with at least `cpus` free CPUs, as far as the histogram can tell (a lower bound:
    /// the grade at or above `cpus`).
    pub fn nodes_with_free(&self, cpus: u32) -> u32 {
        match HIST_GRADES.iter().position(|g| *g >= cpus) {
            Some(i) => self.free_hist[i],
            None => 0,
        }
    }
}

/// The site-level block: queue and what the site offers to others.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteLoad {
    pub jobs_running: u32,
    pub jobs_queued: u32,
    /// Predicted start (s) of a probe job of `PROBE_CPUS[i]` CPUs; `f64::INFINITY` = unknown.
    pub probe_start_s: [f64; 4],
    pub foreign_quota_free: u32,
    pub accepts_foreign: bool,
}

impl Default for SiteLoad {
    fn default() -> Self {
        SiteLoad {
            jobs_running: 0,
            jobs_queued: 0,
            probe_start_s: [f64::INFINITY; 4],
            foreign_quota_free: 0,
            accepts_foreign: false,
        }
    }
}

/// A site summary (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub site: String,
    pub epoch: u64,
    pub seq: u64,
    pub generated_at_ns: i64,
    pub valid_for_ms: u32,
    /// How old the content already was when it was sent (set by the sender).
    pub age_at_send_ms: u64,
    pub contributing: BTreeSet<String>,
    pub classes: BTreeMap<ClassKey, ClassStats>,
    pub load: SiteLoad,
}

impl Default for Summary {
    /// The identity of [`merge`].
    fn default() -> Self {
        Summary {
            site: String::new(),
            epoch: 0,
            seq: 0,
            generated_at_ns: i64::MAX,
            valid_for_ms: u32::MAX,
            age_at_send_ms: 0,
            contributing: BTreeSet::new(),
            classes: BTreeMap::new(),
            load: SiteLoad::default(),
        }
    }
}

fn whole(v: f64) -> u32 {
    if v.is_finite() && v > 0.0 {
        v.floor().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

fn milli(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        (v * 1000.0).round().min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// Folds the classes beyond [`MAX_CLASSES`] (the largest keys) into the [`OTHER_ARCH`] class.
fn cap_classes(classes: &mut BTreeMap<ClassKey, ClassStats>) {
    if classes.len() <= MAX_CLASSES {
        return;
    }
    let mut other = classes.remove(&ClassKey::other()).unwrap_or_default();
    while classes.len() > MAX_CLASSES - 1 {
        if let Some((_, v)) = classes.pop_last() {
            other.merge(&v);
        }
    }
    classes.insert(ClassKey::other(), other);
}

impl Summary {
    /// Builds a site's own summary from its view (`max_age_ms`: rows older are not up) and its
    /// queue block. Header: `site`, epoch 0, seq 0, generated at the snapshot's time.
    pub fn build(site: &str, snap: &Snapshot, max_age_ms: u64, load: SiteLoad, valid_for_ms: u32) -> Summary {
        let mut classes: BTreeMap<ClassKey, ClassStats> = BTreeMap::new();
        for r in snap.resources.iter() {
            let key = ClassKey {
                arch: if r.arch.is_empty() {
                    "unknown".into()
                } else {
                    gma_core::clip(&r.arch, MAX_NAME)
                },
                os: gma_core::clip(&r.os, MAX_NAME),
            };
            let c = classes.entry(key).or_default();
            c.nodes_total += 1;
            if r.age_ms(snap.now_ns) > max_age_ms {
                continue;
            }
            c.nodes_up += 1;
            let free = whole(r.free_cpus).min(whole(r.total_cpus));
            c.cpus_total = c.cpus_total.saturating_add(whole(r.total_cpus));
            c.cpus_free_sum = c.cpus_free_sum.saturating_add(free);
            c.cpus_free_max_node = c.cpus_free_max_node.max(free);
            for (i, g) in HIST_GRADES.iter().enumerate() {
                if free >= *g {
                    c.free_hist[i] += 1;
                }
            }
            let mem = if r.memory_mb.is_finite() && r.memory_mb > 0.0 {
                r.memory_mb.floor() as u64
            } else {
                0
            };
            c.mem_min_node = c.mem_min_node.min(mem);
            c.mem_max_node = c.mem_max_node.max(mem);
            c.mem_sum = c.mem_sum.saturating_add(mem);
            c.load_milli_sum = c.load_milli_sum.saturating_add(milli(r.load1));
            if whole(r.total_cpus) > 0 {
                let d = Some(HostDigest {
                    cpus_total: whole(r.total_cpus),
                    cpus_free: free,
                    load_milli: milli(r.load1),
                    memory_mb: mem,
                });
                c.least_loaded = pick(c.least_loaded, d, HostDigest::less_loaded);
                c.most_memory = pick(c.most_memory, d, HostDigest::more_memory);
            }
            for (name, score) in &r.benchmarks {
                if !(score.is_finite() && *score > 0.0) {
                    continue;
                }
                let b = BenchRange {
                    min: *score,
                    max: *score,
                    sum_milli: milli(*score),
                    count: 1,
                };
                match c.benchmarks.get_mut(name) {
                    Some(x) => x.merge(&b),
                    None => {
                        c.benchmarks.insert(name.clone(), b);
                    }
                }
            }
        }
        cap_classes(&mut classes);
        Summary {
            site: site.to_string(),
            epoch: 0,
            seq: 0,
            generated_at_ns: snap.now_ns,
            valid_for_ms,
            age_at_send_ms: 0,
            contributing: BTreeSet::from([site.to_string()]),
            classes,
            load,
        }
    }

    /// Sets the sender's header on a (merged) summary.
    pub fn stamp(mut self, site: &str, epoch: u64, seq: u64) -> Summary {
        self.site = site.to_string();
        self.epoch = epoch;
        self.seq = seq;
        self.contributing.insert(site.to_string());
        self
    }

    /// Free CPUs over every class.
    pub fn cpus_free_sum(&self) -> u32 {
        self.classes
            .values()
            .map(|c| c.cpus_free_sum)
            .fold(0, u32::saturating_add)
    }

    pub fn cpus_free_max_node(&self) -> u32 {
        self.classes
            .values()
            .map(|c| c.cpus_free_max_node)
            .max()
            .unwrap_or(0)
    }

    pub fn nodes_up(&self) -> u32 {
        self.classes.values().map(|c| c.nodes_up).sum()
    }

    pub fn nodes_total(&self) -> u32 {
        self.classes.values().map(|c| c.nodes_total).sum()
    }

    pub fn cpus_total(&self) -> u32 {
        self.classes.values().map(|c| c.cpus_total).sum()
    }

    /// Predicted start of the smallest probe shape that holds `cpus` (the largest probe when
    /// none does).
    pub fn probe_start_for(&self, cpus: u32) -> f64 {
        let i = PROBE_CPUS
            .iter()
            .position(|c| *c >= cpus)
            .unwrap_or(PROBE_CPUS.len() - 1);
        self.load.probe_start_s[i]
    }

    pub fn to_proto(&self) -> pb::SiteSummary {
        pb::SiteSummary {
            site: self.site.clone(),
            epoch: self.epoch,
            seq: self.seq,
            generated_at_ns: self.generated_at_ns,
            valid_for_ms: self.valid_for_ms,
            age_at_send_ms: self.age_at_send_ms,
            contributing_sites: self.contributing.iter().cloned().collect(),
            classes: self
                .classes
                .iter()
                .map(|(k, c)| pb::ResourceClass {
                    arch: k.arch.clone(),
                    os: k.os.clone(),
                    nodes_total: c.nodes_total,
                    nodes_up: c.nodes_up,
                    cpus_total: c.cpus_total,
                    cpus_free_sum: c.cpus_free_sum,
                    cpus_free_max_node: c.cpus_free_max_node,
                    free_cpu_hist: c.free_hist.to_vec(),
                    memory_mb_min_node: c.mem_min_node,
                    memory_mb_max_node: c.mem_max_node,
                    memory_mb_sum: c.mem_sum,
                    load_milli_sum: c.load_milli_sum,
                    benchmarks: c
                        .benchmarks
                        .iter()
                        .map(|(n, b)| pb::BenchmarkRange {
                            name: n.clone(),
                            min: b.min,
                            max: b.max,
                            sum_milli: b.sum_milli,
                            count: b.count,
                        })
                        .collect(),
                    least_loaded: c.least_loaded.map(HostDigest::to_proto),
                    most_memory: c.most_memory.map(HostDigest::to_proto),
                })
                .collect(),
            jobs_running: self.load.jobs_running,
            jobs_queued: self.load.jobs_queued,
            probe_start_s: self.load.probe_start_s.to_vec(),
            foreign_cpu_quota_free: self.load.foreign_quota_free,
            accepts_foreign: self.load.accepts_foreign,
        }
    }

    /// Decodes and validates a peer's summary; errors name the field.
    pub fn from_proto(p: &pb::SiteSummary) -> Result<Summary, Error> {
        let name = |what: &str, s: &str| -> Result<(), Error> {
            if s.len() > MAX_NAME {
                return Err(Error::invalid_argument(format!(
                    "{what}: at most {MAX_NAME} bytes"
                )));
            }
            Ok(())
        };
        name("site", &p.site)?;
        if p.contributing_sites.len() > MAX_LIST {
            return Err(Error::invalid_argument(format!(
                "contributing_sites: at most {MAX_LIST} entries"
            )));
        }
        for s in &p.contributing_sites {
            name("contributing_sites", s)?;
        }
        if p.classes.len() > MAX_CLASSES {
            return Err(Error::invalid_argument(format!(
                "classes: at most {MAX_CLASSES} classes"
            )));
        }
        if p.probe_start_s.len() != PROBE_CPUS.len() {
            return Err(Error::invalid_argument(format!(
                "probe_start_s: give {} values",
                PROBE_CPUS.len()
            )));
        }
        let mut probe_start_s = [f64::INFINITY; 4];
        for (i, v) in p.probe_start_s.iter().enumerate() {
            if v.is_nan() || *v < 0.0 {
                return Err(Error::invalid_argument(format!(
                    "probe_start_s[{i}]: must be a number >= 0 (inf: unknown)"
                )));
            }
            probe_start_s[i] = *v;
        }
        let mut classes = BTreeMap::new();
        for (i, c) in p.classes.iter().enumerate() {
            name(&format!("classes[{i}].arch"), &c.arch)?;
            name(&format!("classes[{i}].os"), &c.os)?;
            if c.free_cpu_hist.len() != HIST_GRADES.len() {
                return Err(Error::invalid_argument(format!(
                    "classes[{i}].free_cpu_hist: give {} counts",
                    HIST_GRADES.len()
                )));
            }
            if c.nodes_up > c.nodes_total
                || c.cpus_free_sum > c.cpus_total
                || c.cpus_free_max_node > c.cpus_free_sum
            {
                return Err(Error::invalid_argument(format!(
                    "classes[{i}]: inconsistent (nodes_up <= nodes_total, free_max <= free_sum <= total)"
                )));
            }
            if c.benchmarks.len() > MAX_LIST {
                return Err(Error::invalid_argument(format!(
                    "classes[{i}].benchmarks: at most {MAX_LIST}"
                )));
            }
            let mut free_hist = [0u32; 8];
            free_hist.copy_from_slice(&c.free_cpu_hist);
            let mut benchmarks = BTreeMap::new();
            for b in &c.benchmarks {
                name(&format!("classes[{i}].benchmarks.name"), &b.name)?;
                if !(b.min.is_finite() && b.max.is_finite() && b.min > 0.0 && b.min <= b.max) {
                    return Err(Error::invalid_argument(format!(
                        "classes[{i}].benchmarks.{}: min and max must be finite, > 0, min <= max",
                        gma_core::clip(&b.name, 32)
                    )));
                }
                benchmarks.insert(
                    b.name.clone(),
                    BenchRange {
                        min: b.min,
                        max: b.max,
                        sum_milli: b.sum_milli,
                        count: b.count,
                    },
                );
            }
            let key = ClassKey {
                arch: c.arch.clone(),
                os: c.os.clone(),
            };
            let stats = ClassStats {
                nodes_total: c.nodes_total,
                nodes_up: c.nodes_up,
                cpus_total: c.cpus_total,
                cpus_free_sum: c.cpus_free_sum,
                cpus_free_max_node: c.cpus_free_max_node,
                free_hist,
                mem_min_node: c.memory_mb_min_node,
                mem_max_node: c.memory_mb_max_node,
                mem_sum: c.memory_mb_sum,
                load_milli_sum: c.load_milli_sum,
                benchmarks,
                least_loaded: c
                    .least_loaded
                    .as_ref()
                    .map(|d| HostDigest::from_proto(d, &format!("classes[{i}].least_loaded")))
                    .transpose()?,
                most_memory: c
                    .most_memory
                    .as_ref()
                    .map(|d| HostDigest::from_proto(d, &format!("classes[{i}].most_memory")))
                    .transpose()?,
            };
            if classes.insert(key, stats).is_some() {
                return Err(Error::invalid_argument(format!(
                    "classes[{i}]: the class is listed twice"
                )));
            }
        }
        Ok(Summary {
            site: p.site.clone(),
            epoch: p.epoch,
            seq: p.seq,
            generated_at_ns: p.generated_at_ns,
            valid_for_ms: p.valid_for_ms,
            age_at_send_ms: p.age_at_send_ms,
            contributing: p.contributing_sites.iter().cloned().collect(),
            classes,
            load: SiteLoad {
                jobs_running: p.jobs_running,
                jobs_queued: p.jobs_queued,
                probe_start_s,
                foreign_quota_free: p.foreign_cpu_quota_free,
                accepts_foreign: p.accepts_foreign,
            },
        })
    }

    /// Encoded size on the wire (protobuf), bytes.
    pub fn encoded_len(&self) -> usize {
        self.to_proto().encoded_len()
    }

    /// The `site.summary` event (source = the site): site totals as numbers, the classes as
    /// compact JSON text (for dashboards and outsiders; peers exchange the proto message).
    pub fn to_event(&self, timestamp_ns: i64) -> EventData {
        let num = |v: f64| if v.is_finite() { v } else { f64::NAN };
        let classes: Vec<serde_json::Value> = self
            .classes
            .iter()
            .map(|(k, c)| {
                serde_json::json!({
                    "arch": k.arch, "os": k.os, "nodes_up": c.nodes_up, "nodes_total": c.nodes_total,
                    "cpus_total": c.cpus_total, "cpus_free_sum": c.cpus_free_sum,
                    "cpus_free_max_node": c.cpus_free_max_node, "free_cpu_hist": c.free_hist,
                    "memory_mb_max_node": c.mem_max_node, "load_mean": num(c.load_mean()),
                    "benchmarks": c.benchmarks.iter().map(|(n, b)| (n.clone(), serde_json::json!([b.min, b.mean(), b.max]))).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        let mut numbers = vec![
            f64::from(self.nodes_up()),
            f64::from(self.nodes_total()),
            f64::from(self.cpus_total()),
            f64::from(self.cpus_free_sum()),
            f64::from(self.cpus_free_max_node()),
            f64::from(self.load.jobs_running),
            f64::from(self.load.jobs_queued),
            f64::from(self.load.foreign_quota_free),
        ];
        numbers.extend(self.load.probe_start_s.iter().map(|v| num(*v)));
        numbers.extend([
            f64::from(self.valid_for_ms),
            self.epoch as f64,
            self.seq as f64,
            self.encoded_len() as f64,
        ]);
        EventData {
            name: SUMMARY_EVENT.into(),
            source: self.site.clone(),
            timestamp_ns,
            numbers,
            strings: vec![
                serde_json::Value::Array(classes).to_string(),
                self.contributing.iter().cloned().collect::<Vec<_>>().join(","),
            ],
        }
    }
}

/// The `site.summary` schema (field order of [`Summary::to_event`]).
pub fn summary_schema() -> pb::EventSchema {
    schema(
        SUMMARY_EVENT,
        "aggregated state of a site for other sites (gma federation)",
        vec![
            dbl("nodes_up", "hosts", "hosts whose latest host.load is fresh"),
            dbl("nodes_total", "hosts", "hosts known"),
            dbl("cpus_total", "cpus", "CPUs of the up hosts"),
            dbl("cpus_free_sum", "cpus", "free CPUs over the up hosts"),
            dbl("cpus_free_max_node", "cpus", "most free CPUs on one host"),
            dbl("jobs_running", "jobs", "jobs running at the site"),
            dbl("jobs_queued", "jobs", "jobs queued at the site"),
            dbl(
                "foreign_cpu_quota_free",
                "cpus",
                "CPUs still offered to other sites",
            ),
            dbl(
                "start_1cpu_s",
                "s",
                "predicted start of a 1-CPU job (NaN: unknown)",
            ),
            dbl("start_4cpu_s", "s", "predicted start of a 4-CPU job"),
            dbl("start_16cpu_s", "s", "predicted start of a 16-CPU job"),
            dbl("start_64cpu_s", "s", "predicted start of a 64-CPU job"),
            dbl(
                "valid_for_ms",
                "ms",
                "the summary is never used once older than this",
            ),
            dbl("epoch", "", "the site endpoint's incarnation"),
            dbl("seq", "", "summary sequence number within the epoch"),
            dbl("bytes", "bytes", "encoded size of the summary message"),
            text("classes", "per class (arch, os) figures, JSON"),
            text("contributing", "sites whose state is inside, comma-separated"),
        ],
    )
}

/// Merges two summaries (associative and commutative; see the module doc). The result has no
/// sender (`site` empty, epoch and seq 0): stamp it with [`Summary::stamp`].
pub fn merge(a: &Summary, b: &Summary) -> Summary {
    let mut classes = a.classes.clone();
    for (k, v) in &b.classes {
        match classes.get_mut(k) {
            Some(c) => c.merge(v),
            None => {
                classes.insert(k.clone(), v.clone());
            }
        }
    }
    cap_classes(&mut classes);
    let mut probe = [0.0; 4];
    for (i, p) in probe.iter_mut().enumerate() {
        *p = a.load.probe_start_s[i].min(b.load.probe_start_s[i]);
    }
    Summary {
        site: String::new(),
        epoch: 0,
        seq: 0,
        generated_at_ns: a.generated_at_ns.min(b.generated_at_ns),
        valid_for_ms: a.valid_for_ms.min(b.valid_for_ms),
        age_at_send_ms: a.age_at_send_ms.max(b.age_at_send_ms),
        contributing: a.contributing.union(&b.contributing).cloned().collect(),
        classes,
        load: SiteLoad {
            jobs_running: a.load.jobs_running.saturating_add(b.load.jobs_running),
            jobs_queued: a.load.jobs_queued.saturating_add(b.load.jobs_queued),
            probe_start_s: probe,
            foreign_quota_free: a
                .load
                .foreign_quota_free
                .saturating_add(b.load.foreign_quota_free),
            accepts_foreign: a.load.accepts_foreign || b.load.accepts_foreign,
        },
    }
}

/// Merges any number of summaries (the identity for none).
pub fn merge_all<'a>(items: impl IntoIterator<Item = &'a Summary>) -> Summary {
    items
        .into_iter()
        .fold(Summary::default(), |acc, s| merge(&acc, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_broker::Resource;
    use proptest::prelude::*;

    pub(crate) fn host(name: &str, arch: &str, total: f64, free: f64, mem: f64, specint: f64) -> Resource {
        let mut r = Resource::unknown(name);
        r.total_cpus = total;
        r.free_cpus = free;
        r.memory_mb = mem;
        r.arch = arch.into();
        r.os = "Linux".into();
        r.load1 = total - free;
        r.queue_waiting = 0.0;
        r.benchmarks.insert("specint".into(), specint);
        r.updated_ns = 1_000_000_000;
        r
    }

    /// One host of a random summary: (total CPUs, arch, free CPUs as a fraction of the total,
    /// memory, specint, stale).
    fn host_params() -> impl Strategy<Value = (u32, String, f64, u32, f64, bool)> {
        let archs = ["x86_64", "aarch64", "ppc64le", "riscv64"]
            .map(String::from)
            .to_vec();
        (
            1..=64u32,
            // Many archs so that the class cap is exercised by merges.
            prop_oneof![
                3 => (0..40u32).prop_map(|i| format!("a{i}")),
                7 => prop::sample::select(archs),
            ],
            0.0..=1.0f64,
            0..65536u32,
            100.0..5000.0f64,
            prop::bool::weighted(0.2),
        )
    }

    fn site_load() -> impl Strategy<Value = SiteLoad> {
        (
            0..100u32,
            0..100u32,
            prop::array::uniform4(prop::option::weighted(0.7, 0.0..10_000.0f64)),
            0..1000u32,
            prop::bool::weighted(0.8),
        )
            .prop_map(
                |(jobs_running, jobs_queued, probe, foreign_quota_free, accepts_foreign)| SiteLoad {
                    jobs_running,
                    jobs_queued,
                    probe_start_s: probe.map(|p| p.unwrap_or(f64::INFINITY)),
                    foreign_quota_free,
                    accepts_foreign,
                },
            )
    }

    /// A random summary of site `site`: 0 to 29 hosts (1 in 5 stale), its load, interval and
    /// generation time.
    fn random_summary(site: &str) -> impl Strategy<Value = Summary> {
        let site = site.to_string();
        (
            prop::collection::vec(host_params(), 0..30),
            site_load(),
            1000..20_000u32,
            0..1_000_000i64,
        )
            .prop_map(move |(hosts, load, interval, generated_at_ns)| {
                let hosts: Vec<Resource> = hosts
                    .into_iter()
                    .enumerate()
                    .map(|(i, (total, arch, free, mem, specint, stale))| {
                        let total = f64::from(total);
                        let mut h = host(
                            &format!("{site}-h{i}"),
                            &arch,
                            total,
                            free * total,
                            f64::from(mem),
                            specint,
                        );
                        if stale {
                            h.updated_ns = 0;
                        }
                        h
                    })
                    .collect();
                let snap = Snapshot::new(10_000_000_000, hosts);
                let mut s = Summary::build(&site, &snap, 5000, load, interval);
                s.generated_at_ns = generated_at_ns;
                s
            })
    }

    #[test]
    fn conservative_aggregation_the_1_1_1_1_example() {
        // notes/broker-and-meta-scheduling.md point 37: sum 4, max on one node 1.
        let hosts = (0..4)
            .map(|i| host(&format!("h{i}"), "x86_64", 8.0, 1.0, 4096.0, 1000.0))
            .collect();
        let s = Summary::build(
            "b",
            &Snapshot::new(1_000_000_000, hosts),
            5000,
            SiteLoad::default(),
            15_000,
        );
        let c = &s.classes[&ClassKey {
            arch: "x86_64".into(),
            os: "Linux".into(),
        }];
        assert_eq!((c.cpus_free_sum, c.cpus_free_max_node, c.nodes_up), (4, 1, 4));
        assert_eq!(c.free_hist, [4, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(c.nodes_with_free(4), 0);
        assert_eq!(c.nodes_with_free(1), 4);
    }

    #[test]
    fn stale_hosts_count_as_known_not_up_and_free_is_floored() {
        let mut a = host("a", "x86_64", 8.0, 3.7, 1024.0, 1000.0);
        let mut b = host("b", "x86_64", 8.0, 8.0, 2048.0, 2000.0);
        a.updated_ns = 6_000_000_000;
        b.updated_ns = 0;
        let s = Summary::build(
            "s",
            &Snapshot::new(7_000_000_000, vec![a, b]),
            5000,
            SiteLoad::default(),
            1,
        );
        let c = s.classes.values().next().unwrap();
        assert_eq!(
            (c.nodes_total, c.nodes_up, c.cpus_free_sum, c.cpus_free_max_node),
            (2, 1, 3, 3)
        );
        assert_eq!((c.mem_min_node, c.mem_max_node), (1024, 1024));
        assert_eq!(c.benchmarks["specint"].count, 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]
        #[test]
        fn property_merge_is_associative_and_commutative(
            a in random_summary("a"),
            b in random_summary("b"),
            c in random_summary("c"),
        ) {
            prop_assert_eq!(merge(&a, &b), merge(&b, &a), "not commutative");
            prop_assert_eq!(
                merge(&merge(&a, &b), &c),
                merge(&a, &merge(&b, &c)),
                "not associative"
            );
            prop_assert_eq!(
                &merge(&Summary::default(), &a).classes,
                &a.classes,
                "the default is the identity"
            );
            prop_assert!(merge(&a, &b).classes.len() <= MAX_CLASSES);
        }
    }

    /// 1 to 5 children `k0`.. of a parent.
    fn children() -> impl Strategy<Value = Vec<Summary>> {
        (1..6usize).prop_flat_map(|n| {
            (0..n)
                .map(|i| random_summary(&format!("k{i}")))
                .collect::<Vec<_>>()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn property_a_parent_summary_is_the_merge_of_its_children_in_any_order(mut kids in children()) {
            let n = kids.len();
            let forward = merge_all(&kids);
            kids.reverse();
            let backward = merge_all(&kids);
            prop_assert_eq!(&forward, &backward);
            // Totals are the sums of the children's (nothing lost by merging, even folded).
            let free: u32 = kids.iter().map(|k| k.cpus_free_sum()).sum();
            prop_assert_eq!(forward.cpus_free_sum(), free);
            let max = kids.iter().map(|k| k.cpus_free_max_node()).max().unwrap_or(0);
            prop_assert_eq!(forward.cpus_free_max_node(), max);
            prop_assert_eq!(forward.contributing.len(), n);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn proto_round_trip_and_validation(s in random_summary("x")) {
            let s = s.stamp("x", 7, 9);
            let back = Summary::from_proto(&s.to_proto()).unwrap();
            prop_assert_eq!(&back, &s);
            let mut p = s.to_proto();
            p.probe_start_s.pop();
            prop_assert!(Summary::from_proto(&p).unwrap_err().to_string().starts_with("probe_start_s"));
            let mut p = s.to_proto();
            // In place of the last class when the summary already has as many as allowed.
            if p.classes.len() == MAX_CLASSES {
                p.classes.pop();
            }
            p.classes.push(pb::ResourceClass {
                cpus_free_sum: 9,
                cpus_total: 1,
                free_cpu_hist: vec![0; 8],
                ..Default::default()
            });
            let e = Summary::from_proto(&p).unwrap_err().to_string();
            prop_assert!(e.contains("inconsistent"), "{}", e);
        }
    }

    #[test]
    fn a_thousand_hosts_fit_in_two_kib() {
        let archs = ["x86_64", "aarch64"];
        let oss = ["Linux", "Linux-rt", "FreeBSD", "AIX"];
        let hosts: Vec<Resource> = (0..1000)
            .map(|i| {
                let mut h = host(
                    &format!("h{i}"),
                    archs[i % 2],
                    16.0,
                    (i % 17) as f64,
                    65536.0,
                    1000.0 + i as f64,
                );
                h.os = oss[(i / 2) % 4].into();
                h.benchmarks.insert("specfp".into(), 900.0 + i as f64);
                h
            })
            .collect();
        let s = Summary::build(
            "site",
            &Snapshot::new(1_000_000_000, hosts),
            5000,
            SiteLoad::default(),
            15_000,
        )
        .stamp("site", 1, 1);
        assert_eq!(s.classes.len(), 8);
        assert!(s.encoded_len() <= 2048, "{} bytes", s.encoded_len());
        let ev = s.to_event(1);
        assert_eq!(ev.numbers.len() + ev.strings.len(), summary_schema().fields.len());
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn summary_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&summary_schema()),
            "site.summary v1: nodes_up double hosts, nodes_total double hosts, cpus_total double cpus, cpus_free_sum double cpus, cpus_free_max_node double cpus, jobs_running double jobs, jobs_queued double jobs, foreign_cpu_quota_free double cpus, start_1cpu_s double s, start_4cpu_s double s, start_16cpu_s double s, start_64cpu_s double s, valid_for_ms double ms, epoch double, seq double, bytes double bytes, classes string, contributing string"
        );
    }

    #[test]
    fn the_resume_names_the_least_loaded_and_the_most_memory_node() {
        // a: 8 CPUs, 6 free (occupation 25 %); b: 4 CPUs, 2 free (50 %), the most memory;
        // c: stale (not up), idle and bigger than both: never named.
        let a = host("a", "x86_64", 8.0, 6.0, 4096.0, 1000.0);
        let b = host("b", "x86_64", 4.0, 2.0, 16384.0, 1000.0);
        let mut c = host("c", "x86_64", 64.0, 64.0, 1_048_576.0, 1000.0);
        c.updated_ns = 0;
        let snap = Snapshot::new(6_000_000_000, vec![a, b, c]);
        let s = Summary::build("s", &snap, 5000, SiteLoad::default(), 15_000);
        let k = &s.classes[&ClassKey {
            arch: "x86_64".into(),
            os: "Linux".into(),
        }];
        let ll = k.least_loaded.unwrap();
        assert_eq!(
            (ll.cpus_total, ll.cpus_free, ll.load_milli, ll.memory_mb),
            (8, 6, 2000, 4096)
        );
        assert_eq!(ll.occupation(), 0.25);
        let mm = k.most_memory.unwrap();
        assert_eq!((mm.cpus_total, mm.cpus_free, mm.memory_mb), (4, 2, 16384));
        // Occupation is compared exactly: 1 of 2 free and 2 of 4 free are equal; then more free.
        let x = HostDigest {
            cpus_total: 2,
            cpus_free: 1,
            load_milli: 0,
            memory_mb: 0,
        };
        let y = HostDigest {
            cpus_total: 4,
            cpus_free: 2,
            load_milli: 0,
            memory_mb: 0,
        };
        assert!(y.less_loaded(&x).is_gt());
        // An older sender (no digest) merges with a newer one: the newer one's digest stays.
        let mut old = s.clone();
        for c in old.classes.values_mut() {
            c.least_loaded = None;
            c.most_memory = None;
        }
        let m = merge(&old, &s);
        assert_eq!(m.classes.values().next().unwrap().least_loaded, Some(ll));
        // Wire: absent stays absent; a digest with no CPUs or more free than total is refused.
        assert_eq!(Summary::from_proto(&old.to_proto()).unwrap(), old);
        let mut p = s.to_proto();
        p.classes[0].least_loaded.as_mut().unwrap().cpus_free = 9;
        let e = Summary::from_proto(&p).unwrap_err().to_string();
        assert!(
            e.contains("classes[0].least_loaded: cpus_total must be > 0"),
            "{e}"
        );
        let mut p = s.to_proto();
        p.classes[0].most_memory.as_mut().unwrap().cpus_total = 0;
        assert!(Summary::from_proto(&p).is_err());
    }
}
