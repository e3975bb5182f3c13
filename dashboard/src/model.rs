//! The dashboard's live model: what a browser that connects now is sent first (the snapshot),
//! and the pure reductions from fabric inputs (directory records, cluster status, events) to
//! the small JSON messages every browser receives.
//!
//! No I/O and no clock inside: every function takes the time it needs.
//!
//! Messages (one JSON object per server-sent event, `type` says which; see docs/dashboard.md):
//!
//! - `snapshot`: everything below at once (sent first, and again to a browser that lagged);
//! - `record` (`op` = `put` | `delete`): a producer or consumer record appeared, changed or left;
//! - `cluster`: the directory members, the leader, each member's own view;
//! - `points`: chart points `[host, metric, t_ms, value]`, metric in cpu | mem | net | load;
//! - `hosts_gone`: hosts whose only producer left the directory;
//! - `decision`: a broker or rescheduler decision event;
//! - `rpc`: `gma.rpc` rows (one per role instance and method);
//! - `job`: a batch job's row (`job.batch` of the Slurm adapter) after a state change.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use gma_core::codec::OwnedEvent;
use gma_proto::v1 as pb;
use serde_json::{json, Value};

/// The chart metrics of a host.
pub const METRICS: [&str; 4] = ["cpu", "mem", "net", "load"];
/// Decision events kept for new browsers.
pub const MAX_DECISIONS: usize = 100;
/// `gma.rpc` rows kept.
pub const MAX_RPC_ROWS: usize = 2000;
/// Hosts charted (more are dropped, and counted).
pub const MAX_HOSTS: usize = 5000;
/// Finished batch jobs (completed, failed, cancelled) kept for new browsers: the oldest
/// finished one leaves when one more finishes.
pub const MAX_FINISHED_JOBS: usize = 100;
/// Pending and running batch jobs shown (more are dropped, and counted).
pub const MAX_ACTIVE_JOBS: usize = 2000;

/// What a record looks like on the page.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordView {
    pub kind: &'static str,
    pub id: String,
    pub address: String,
    pub events: Vec<String>,
    pub sources: usize,
    pub site: String,
    pub manner: String,
    /// When this dashboard first saw the record (ms since the epoch).
    pub first_seen_ms: i64,
    /// When it last saw it written (Register or Update).
    pub updated_ms: i64,
    /// The record was there when the dashboard started: its true age is at least this.
    pub before_start: bool,
    pub lease_id: u64,
    pub create_revision: u64,
    pub mod_revision: u64,
}

impl RecordView {
    fn json(&self, now_ms: i64) -> Value {
        let mut events = self.events.clone();
        let n_events = events.len();
        events.truncate(24);
        json!({
            "kind": self.kind,
            "id": self.id,
            "address": self.address,
            "events": events,
            "n_events": n_events,
            "n_sources": self.sources,
            "site": self.site,
            "manner": self.manner,
            "age_ms": (now_ms - self.first_seen_ms).max(0),
            "updated_ms_ago": (now_ms - self.updated_ms).max(0),
            "before_start": self.before_start,
            "lease_id": self.lease_id,
            "create_revision": self.create_revision,
            "mod_revision": self.mod_revision,
        })
    }
}

/// The record inside a directory entry, as the page shows it.
pub fn record_view(entry: &pb::RecordEntry, now_ms: i64, before_start: bool) -> Option<RecordView> {
    let rec = entry.record.as_ref()?.record.as_ref()?;
    let base = |kind, id: &str, address: &str, site: &str| RecordView {
        kind,
        id: id.to_string(),
        address: address.to_string(),
        events: Vec::new(),
        sources: 0,
        site: site.to_string(),
        manner: String::new(),
        first_seen_ms: now_ms,
        updated_ms: now_ms,
        before_start,
        lease_id: entry.lease_id,
        create_revision: entry.create_revision,
        mod_revision: entry.mod_revision,
    };
    Some(match rec {
        pb::record::Record::Producer(p) => RecordView {
            events: p.events.clone(),
            sources: p.sources.len(),
            ..base("producer", &p.id, &p.address, &p.site)
        },
        pb::record::Record::Consumer(c) => RecordView {
            events: c.accepts.clone(),
            manner: c.manner.clone(),
            ..base("consumer", &c.id, &c.address, &c.site)
        },
    })
}

/// One chart point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub t_ms: f64,
    pub value: f64,
}

#[derive(Default)]
struct HostSeries {
    /// Per metric, the last points (bounded by `history`).
    points: [VecDeque<Point>; 4],
    /// host.net: the latest bytes/s of each interface (summed into the `net` point).
    ifaces: BTreeMap<String, f64>,
    /// The producers this host's events came from.
    producers: HashSet<String>,
}

/// The live model.
pub struct Model {
    history: usize,
    records: BTreeMap<(&'static str, String), RecordView>,
    cluster: Value,
    hosts: BTreeMap<String, HostSeries>,
    decisions: VecDeque<Value>,
    rpc: BTreeMap<String, Value>,
    /// `federation.status`: (site, peer) -> the latest row.
    federation: BTreeMap<(String, String), Value>,
    jobs: Jobs,
    /// The hierarchy around each configured federation endpoint (`gma_federation::tree`).
    hierarchy: Vec<Value>,
    archiver: bool,
    /// Hosts not charted because of [`MAX_HOSTS`].
    pub hosts_dropped: u64,
}

/// The batch jobs panel: the latest row of every job, by (adapter source, job id).
#[derive(Default)]
struct Jobs {
    rows: BTreeMap<(String, String), Value>,
    /// Finished jobs, oldest first (bounded by [`MAX_FINISHED_JOBS`]).
    finished: VecDeque<(String, String)>,
    /// New pending or running jobs not shown because of [`MAX_ACTIVE_JOBS`].
    dropped: u64,
}

/// The batch job event of the Slurm adapter (`gma slurm`, docs/slurm.md).
pub const JOB_EVENT: &str = "job.batch";

/// True for a `job.batch` state after which the job does not change.
pub fn job_finished(state: &str) -> bool {
    matches!(state, "completed" | "failed" | "cancelled")
}

impl Jobs {
    /// A `job.batch` event: the job's new row, or None when it is not shown (cap reached).
    fn event(&mut self, e: &OwnedEvent) -> Option<Value> {
        let r = e.as_ref();
        let t = |f: &str| r.text(f).unwrap_or("").to_string();
        let n = |f: &str| num(r.number(f).unwrap_or(f64::NAN));
        let job = t("job");
        let state = t("state");
        let key = (e.series.source.clone(), job.clone());
        let row = json!({
            "source": e.series.source,
            "t_ms": e.timestamp_ns as f64 / 1e6,
            "job": job,
            "name": t("name"),
            "state": state,
            "resource": t("resource"),
            "reservation": t("reservation"),
            "owner": t("owner"),
            "reason": t("reason"),
            "exit_code": n("exit_code"),
            "signal": n("signal"),
            "cpus": n("cpus"),
            "submit_s": n("submit_s"),
            "start_s": n("start_s"),
            "end_s": n("end_s"),
        });
        let known = self.rows.contains_key(&key);
        let active = self.rows.len() - self.finished.len();
        if !known && !job_finished(&state) && active >= MAX_ACTIVE_JOBS {
            self.dropped += 1;
            return None;
        }
        if job_finished(&state) && !self.finished.contains(&key) {
            self.finished.push_back(key.clone());
            while self.finished.len() > MAX_FINISHED_JOBS {
                if let Some(old) = self.finished.pop_front() {
                    self.rows.remove(&old);
                }
            }
        }
        self.rows.insert(key, row.clone());
        Some(row)
    }

    fn snapshot(&self) -> Vec<&Value> {
        self.rows.values().collect()
    }
}

/// A JSON number, or null for NaN and infinities.
fn num(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

/// The host a source belongs to: `hostA/eth0` -> `hostA`.
pub fn host_of(source: &str) -> &str {
    source.split('/').next().unwrap_or(source)
}

/// The chart point an event gives, as (host, metric index, value), if any.
fn chart_value(e: &OwnedEvent) -> Option<(usize, f64)> {
    let r = e.as_ref();
    match e.series.name.as_str() {
        "host.cpu" => {
            let v = match r.number("idle") {
                Some(idle) if idle.is_finite() => 100.0 - idle,
                _ => r.number("user").unwrap_or(f64::NAN) + r.number("system").unwrap_or(f64::NAN),
            };
            Some((0, v))
        }
        "host.mem" => {
            let v = match r.number("used_pct") {
                Some(v) if v.is_finite() => v,
                _ => {
                    let total = r.number("total_mb").unwrap_or(f64::NAN);
                    let avail = r.number("available_mb").unwrap_or(f64::NAN);
                    (total - avail) / total * 100.0
                }
            };
            Some((1, v))
        }
        "host.net" => Some((
            2,
            r.number("rx_bytes_per_s").unwrap_or(f64::NAN) + r.number("tx_bytes_per_s").unwrap_or(f64::NAN),
        )),
        "host.load" => Some((3, r.number("load1").unwrap_or(f64::NAN))),
        _ => None,
    }
}

/// Per-peer status of a federation endpoint (gma federation): shown as the federation table.
pub const FEDERATION_STATUS: &str = "federation.status";

/// Event names whose events are shown as decisions.
pub fn is_decision(name: &str) -> bool {
    name.ends_with(".decision")
}

impl Model {
    /// `history`: chart points kept per host and metric (what a new browser starts with).
    pub fn new(history: usize, archiver: bool) -> Model {
        Model {
            history: history.max(1),
            records: BTreeMap::new(),
            cluster: Value::Null,
            hosts: BTreeMap::new(),
            decisions: VecDeque::new(),
            rpc: BTreeMap::new(),
            federation: BTreeMap::new(),
            jobs: Jobs::default(),
            hierarchy: Vec::new(),
            archiver,
            hosts_dropped: 0,
        }
    }

    /// Everything a new browser needs, as one `snapshot` message.
    pub fn snapshot(&self, now_ms: i64) -> Value {
        let records: Vec<Value> = self.records.values().map(|r| r.json(now_ms)).collect();
        let hosts: Vec<Value> = self
            .hosts
            .iter()
            .map(|(h, s)| {
                let series: serde_json::Map<String, Value> = METRICS
                    .iter()
                    .zip(s.points.iter())
                    .map(|(m, pts)| {
                        let arr: Vec<Value> = pts.iter().map(|p| json!([p.t_ms, num(p.value)])).collect();
                        (m.to_string(), Value::Array(arr))
                    })
                    .collect();
                json!({"host": h, "series": series})
            })
            .collect();
        json!({
            "type": "snapshot",
            "now_ms": now_ms,
            "records": records,
            "cluster": self.cluster,
            "hosts": hosts,
            "decisions": self.decisions,
            "rpc": self.rpc.values().collect::<Vec<_>>(),
            "federation": self.federation.values().collect::<Vec<_>>(),
            "jobs": self.jobs.snapshot(),
            "hierarchy": self.hierarchy,
            "archiver": self.archiver,
            "history": self.history,
        })
    }

    /// The trees walked from the configured federation endpoints: one `hierarchy` message.
    pub fn set_hierarchy(&mut self, trees: Vec<Value>) -> Value {
        self.hierarchy = trees;
        json!({"type": "hierarchy", "trees": self.hierarchy})
    }

    /// A record was written (Register/Update), or listed at start (`before_start`).
    pub fn put_record(&mut self, entry: &pb::RecordEntry, now_ms: i64, before_start: bool) -> Option<Value> {
        let mut view = record_view(entry, now_ms, before_start)?;
        let key = (view.kind, view.id.clone());
        if let Some(old) = self.records.get(&key) {
            // Same registration (same lease): the age runs on; a new lease restarts it.
            if old.lease_id == view.lease_id || old.create_revision == view.create_revision {
                view.first_seen_ms = old.first_seen_ms;
                view.before_start = old.before_start;
            }
        }
        let msg = json!({"type": "record", "op": "put", "record": view.json(now_ms)});
        self.records.insert(key, view);
        Some(msg)
    }

    /// A record left (removed or its lease expired).
    pub fn delete_record(&mut self, entry: &pb::RecordEntry, reason: &str) -> Option<Value> {
        let view = record_view(entry, 0, false)?;
        self.records.remove(&(view.kind, view.id.clone()))?;
        Some(json!({"type": "record", "op": "delete", "kind": view.kind, "id": view.id, "reason": reason}))
    }

    /// After a re-list: records not seen in it are gone.
    pub fn retain_records(&mut self, seen: &HashSet<(&'static str, String)>) -> Vec<Value> {
        let gone: Vec<_> = self
            .records
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        gone.into_iter()
            .map(|(kind, id)| {
                self.records.remove(&(kind, id.clone()));
                json!({"type": "record", "op": "delete", "kind": kind, "id": id, "reason": "not in the directory"})
            })
            .collect()
    }

    pub fn records(&self) -> impl Iterator<Item = &RecordView> {
        self.records.values()
    }

    /// The cluster view changed: returns the message, or None if it did not change.
    pub fn set_cluster(&mut self, cluster: Value) -> Option<Value> {
        if self.cluster == cluster {
            return None;
        }
        self.cluster = cluster.clone();
        Some(json!({"type": "cluster", "cluster": cluster}))
    }

    /// Events from one delivery of `producer`: the messages they make (chart points, decisions,
    /// rpc rows), at most one of each type.
    pub fn events(&mut self, producer: &str, events: &[OwnedEvent]) -> Vec<Value> {
        let mut points = Vec::new();
        let mut decisions = Vec::new();
        let mut rpc = Vec::new();
        let mut federation = Vec::new();
        let mut jobs = Vec::new();
        for e in events {
            let name = e.series.name.as_str();
            let t_ms = e.timestamp_ns as f64 / 1e6;
            if let Some((mi, mut v)) = chart_value(e) {
                let host = host_of(&e.series.source).to_string();
                if !self.hosts.contains_key(&host) && self.hosts.len() >= MAX_HOSTS {
                    self.hosts_dropped += 1;
                    continue;
                }
                let hs = self.hosts.entry(host.clone()).or_default();
                hs.producers.insert(producer.to_string());
                if mi == 2 {
                    let iface = e.series.source.split_once('/').map(|x| x.1).unwrap_or("");
                    if iface == "lo" {
                        continue;
                    }
                    hs.ifaces.insert(iface.to_string(), v);
                    v = hs.ifaces.values().filter(|x| x.is_finite()).sum();
                }
                let pts = &mut hs.points[mi];
                while pts.len() >= self.history {
                    pts.pop_front();
                }
                pts.push_back(Point { t_ms, value: v });
                points.push(json!([host, METRICS[mi], t_ms, num(v)]));
            } else if is_decision(name) {
                let v: Value = serde_json::from_str(&e.as_ref().to_json()).unwrap_or(Value::Null);
                let d = json!({"name": name, "source": e.series.source, "t_ms": t_ms, "values": v["values"]});
                while self.decisions.len() >= MAX_DECISIONS {
                    self.decisions.pop_front();
                }
                self.decisions.push_back(d.clone());
                decisions.push(d);
            } else if name == FEDERATION_STATUS {
                let v: Value = serde_json::from_str(&e.as_ref().to_json()).unwrap_or(Value::Null);
                let peer = v["values"]["peer"].as_str().unwrap_or("").to_string();
                let row = json!({"site": e.series.source, "t_ms": t_ms, "values": v["values"]});
                let key = (e.series.source.clone(), peer);
                if self.federation.contains_key(&key) || self.federation.len() < MAX_RPC_ROWS {
                    self.federation.insert(key, row.clone());
                    federation.push(row);
                }
            } else if name == JOB_EVENT {
                jobs.extend(self.jobs.event(e));
            } else if name == gma_core::rpc::RPC_EVENT {
                let r = e.as_ref();
                let n = |f: &str| num(r.number(f).unwrap_or(f64::NAN));
                let row = json!({
                    "producer": producer,
                    "source": e.series.source,
                    "t_ms": t_ms,
                    "role": r.text("role").unwrap_or(""),
                    "method": r.text("method").unwrap_or(""),
                    "requests": n("requests"),
                    "errors": n("errors"),
                    "p50_ms": n("p50_ms"),
                    "p99_ms": n("p99_ms"),
                    "max_ms": n("max_ms"),
                    "period_s": n("period_s"),
                    "total_requests": n("total_requests"),
                });
                if self.rpc.contains_key(&e.series.source) || self.rpc.len() < MAX_RPC_ROWS {
                    self.rpc.insert(e.series.source.clone(), row.clone());
                    rpc.push(row);
                }
            }
        }
        let mut out = Vec::new();
        if !points.is_empty() {
            out.push(json!({"type": "points", "points": points}));
        }
        for d in decisions {
            out.push(json!({"type": "decision", "decision": d}));
        }
        if !rpc.is_empty() {
            out.push(json!({"type": "rpc", "rows": rpc}));
        }
        if !federation.is_empty() {
            out.push(json!({"type": "federation", "rows": federation}));
        }
        for j in jobs {
            out.push(json!({"type": "job", "job": j}));
        }
        out
    }

    /// `producer` left: hosts served by no other producer are removed.
    pub fn producer_gone(&mut self, producer: &str) -> Option<Value> {
        let mut gone = Vec::new();
        for (h, s) in self.hosts.iter_mut() {
            if s.producers.remove(producer) && s.producers.is_empty() {
                gone.push(h.clone());
            }
        }
        for h in &gone {
            self.hosts.remove(h);
        }
        let rows: Vec<String> = self
            .rpc
            .iter()
            .filter(|(_, r)| r["producer"] == producer)
            .map(|(s, _)| s.clone())
            .collect();
        for s in &rows {
            self.rpc.remove(s);
        }
        (!gone.is_empty() || !rows.is_empty())
            .then(|| json!({"type": "hosts_gone", "hosts": gone, "rpc_sources": rows}))
    }

    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// Batch jobs not shown because of [`MAX_ACTIVE_JOBS`].
    pub fn jobs_dropped(&self) -> u64 {
        self.jobs.dropped
    }
}

/// The cluster JSON from the answering member's status and each member's own answer
/// (`None` = unreachable).
pub fn cluster_json(
    status: &pb::ClusterStatusResponse,
    members: &HashMap<u64, Result<pb::ClusterStatusResponse, crate::DashboardError>>,
) -> Value {
    let list: Vec<Value> = status
        .members
        .iter()
        .map(|m| {
            let own = members.get(&m.id);
            json!({
                "id": m.id,
                "address": m.address,
                "voter": m.voter,
                "leader": m.leader,
                "reachable": own.is_some_and(|r| r.is_ok()),
                "state": own.and_then(|r| r.as_ref().ok()).map(|s| s.state.clone()).unwrap_or_default(),
                "last_applied": own.and_then(|r| r.as_ref().ok()).map(|s| s.last_applied),
                "error": own.and_then(|r| r.as_ref().err()).map(|e| e.to_string()),
            })
        })
        .collect();
    json!({
        "leader_id": status.leader_id,
        "term": status.term,
        "revision": status.revision,
        "producers": status.producers,
        "consumers": status.consumers,
        "schemas": status.schemas,
        "leases": status.leases,
        "members": list,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use gma_core::codec::{Mark, SeriesInfo};
    use gma_core::event::{dbl, text};
    use std::sync::Arc;

    fn ev(
        name: &str,
        source: &str,
        fields: Vec<pb::FieldSpec>,
        numbers: Vec<f64>,
        strings: Vec<&str>,
    ) -> OwnedEvent {
        let schema = pb::EventSchema {
            name: name.into(),
            version: 1,
            fields,
            description: String::new(),
        };
        OwnedEvent {
            series: Arc::new(SeriesInfo::new(1, name, source, &schema)),
            seq: 1,
            timestamp_ns: 2_000_000_000,
            numbers,
            strings: strings.into_iter().map(String::from).collect(),
            mark: Mark::None,
        }
    }

    fn producer_entry(id: &str, lease: u64) -> pb::RecordEntry {
        pb::RecordEntry {
            record: Some(pb::Record {
                record: Some(pb::record::Record::Producer(pb::ProducerRecord {
                    id: id.into(),
                    address: "http://127.0.0.1:1".into(),
                    events: vec!["host.cpu".into()],
                    sources: vec!["a".into(), "b".into()],
                    ..Default::default()
                })),
            }),
            lease_id: lease,
            create_revision: lease,
            mod_revision: lease,
        }
    }

    #[test]
    fn host_events_become_chart_points_and_leave_with_their_producer() {
        let mut m = Model::new(3, false);
        let cpu = ev(
            "host.cpu",
            "hostA",
            vec![dbl("user", "%", ""), dbl("idle", "%", "")],
            vec![10.0, 75.0],
            vec![],
        );
        let net = |iface: &str, rx: f64| {
            ev(
                "host.net",
                &format!("hostA/{iface}"),
                vec![dbl("rx_bytes_per_s", "", ""), dbl("tx_bytes_per_s", "", "")],
                vec![rx, 1.0],
                vec![],
            )
        };
        let msgs = m.events(
            "p1",
            &[cpu.clone(), net("eth0", 100.0), net("lo", 5.0), net("eth1", 10.0)],
        );
        assert_eq!(msgs.len(), 1);
        let pts = msgs[0]["points"].as_array().unwrap();
        assert_eq!(pts[0], json!(["hostA", "cpu", 2000.0, 25.0]));
        assert_eq!(pts[1], json!(["hostA", "net", 2000.0, 101.0]));
        assert_eq!(
            pts[2],
            json!(["hostA", "net", 2000.0, 112.0]),
            "interfaces summed, lo skipped"
        );
        for _ in 0..5 {
            m.events("p1", std::slice::from_ref(&cpu));
        }
        let snap = m.snapshot(0);
        assert_eq!(
            snap["hosts"][0]["series"]["cpu"].as_array().unwrap().len(),
            3,
            "bounded history"
        );
        assert!(m.producer_gone("p2").is_none());
        let gone = m.producer_gone("p1").unwrap();
        assert_eq!(gone["hosts"], json!(["hostA"]));
        assert_eq!(m.host_count(), 0);
    }

    #[test]
    fn decisions_and_rpc_rows() {
        let mut m = Model::new(10, true);
        let d = ev(
            "resched.decision",
            "rescheduler",
            vec![dbl("gain", "", ""), text("decision", "")],
            vec![0.5],
            vec!["MIGRATE"],
        );
        let schema = gma_core::rpc::rpc_schema();
        let rpc = ev(
            "gma.rpc",
            "hostA/Producer.Subscribe",
            schema.fields.clone(),
            vec![3.0, 1.0, 0.5, 0.9, 1.0, 10.0, 3.0],
            vec!["producer", "Producer.Subscribe"],
        );
        let msgs = m.events("p", &[d, rpc]);
        assert_eq!(msgs[0]["type"], "decision");
        assert_eq!(msgs[0]["decision"]["values"]["decision"], "MIGRATE");
        assert_eq!(msgs[1]["rows"][0]["method"], "Producer.Subscribe");
        assert_eq!(msgs[1]["rows"][0]["errors"], 1.0);
        let snap = m.snapshot(5);
        assert_eq!(snap["decisions"].as_array().unwrap().len(), 1);
        assert_eq!(snap["rpc"].as_array().unwrap().len(), 1);
        assert_eq!(snap["archiver"], true);
    }

    #[test]
    fn the_hierarchy_replaces_the_last_one_and_is_in_the_snapshot() {
        let mut m = Model::new(10, false);
        assert_eq!(m.snapshot(0)["hierarchy"], json!([]));
        let t = json!({"superiors": [], "root": {"site": "R", "inferiors": []}});
        let msg = m.set_hierarchy(vec![t.clone()]);
        assert_eq!(msg, json!({"type": "hierarchy", "trees": [t]}));
        m.set_hierarchy(vec![json!({"endpoint": "x:1", "error": "down"})]);
        assert_eq!(
            m.snapshot(0)["hierarchy"],
            json!([{"endpoint": "x:1", "error": "down"}])
        );
    }

    #[test]
    fn federation_status_rows_are_kept_per_site_and_peer() {
        let mut m = Model::new(10, false);
        let fields = vec![
            dbl("live", "", ""),
            dbl("summary_age_ms", "ms", ""),
            dbl("forwarded_out", "", ""),
            text("peer", ""),
        ];
        let a = ev(
            FEDERATION_STATUS,
            "siteA",
            fields.clone(),
            vec![1.0, 250.0, 3.0],
            vec!["siteB"],
        );
        let b = ev(
            FEDERATION_STATUS,
            "siteA",
            fields.clone(),
            vec![0.0, 9000.0, 4.0],
            vec!["siteB"],
        );
        let c = ev(
            FEDERATION_STATUS,
            "siteA",
            fields,
            vec![1.0, 100.0, 0.0],
            vec!["siteC"],
        );
        let msgs = m.events("fed", &[a]);
        assert_eq!(msgs[0]["type"], "federation");
        assert_eq!(msgs[0]["rows"][0]["values"]["peer"], "siteB");
        m.events("fed", &[b, c]);
        let snap = m.snapshot(5);
        let rows = snap["federation"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "one row per (site, peer), the newest");
        assert_eq!(rows[0]["values"]["forwarded_out"], 4.0);
        assert_eq!(rows[0]["values"]["live"], 0.0);
    }

    /// A `job.batch` event as the Slurm adapter publishes it (its own schema).
    fn job_event(source: &str, job: &str, state: &str, exit_code: f64) -> OwnedEvent {
        let started = if state == "pending" { 0.0 } else { 100.0 };
        let ended = if job_finished(state) { 160.0 } else { 0.0 };
        ev(
            JOB_EVENT,
            source,
            gma_broker::slurm::job_schema().fields,
            vec![exit_code, 0.0, 2.0, 90.0, started, ended],
            vec![job, "hello", "gma-r1", "node1", "alice", state, "R", "/tmp/out"],
        )
    }

    #[test]
    fn batch_jobs_are_shown_through_their_states_and_finished_ones_are_bounded() {
        assert_eq!(JOB_EVENT, gma_broker::slurm::JOB_EVENT);
        let mut m = Model::new(10, false);
        let msgs = m.events(
            "slurm",
            &[
                job_event("slurm-a", "7", "pending", f64::NAN),
                job_event("slurm-a", "7", "running", f64::NAN),
            ],
        );
        assert_eq!(msgs.len(), 2, "one message per state change: {msgs:?}");
        assert_eq!(msgs[0]["type"], "job");
        assert_eq!(msgs[0]["job"]["state"], "pending");
        let running = &msgs[1]["job"];
        assert_eq!(
            (
                running["job"].as_str(),
                running["state"].as_str(),
                running["resource"].as_str(),
                running["reservation"].as_str(),
                running["owner"].as_str(),
                running["name"].as_str()
            ),
            (
                Some("7"),
                Some("running"),
                Some("node1"),
                Some("gma-r1"),
                Some("alice"),
                Some("hello")
            )
        );
        assert_eq!(running["start_s"], 100.0);
        assert_eq!(running["exit_code"], Value::Null, "NaN until it ended");
        // The same job id at another adapter is another job.
        m.events("slurm2", &[job_event("slurm-b", "7", "running", f64::NAN)]);
        let snap = m.snapshot(0);
        let jobs = snap["jobs"].as_array().unwrap();
        assert_eq!(jobs.len(), 2, "{jobs:?}");
        assert!(jobs.iter().all(|j| j["state"] == "running"), "{jobs:?}");
        // Completed: the row keeps the exit code and the end.
        let done = m.events("slurm", &[job_event("slurm-a", "7", "completed", 0.0)]);
        assert_eq!(done[0]["job"]["exit_code"], 0.0);
        assert_eq!(done[0]["job"]["end_s"], 160.0);
        // Finished jobs are kept up to MAX_FINISHED_JOBS, the oldest finished leaving first;
        // the running one stays.
        for i in 0..MAX_FINISHED_JOBS {
            m.events("slurm", &[job_event("slurm-a", &format!("f{i}"), "failed", 3.0)]);
        }
        let snap = m.snapshot(0);
        let jobs = snap["jobs"].as_array().unwrap();
        assert_eq!(jobs.len(), MAX_FINISHED_JOBS + 1);
        assert!(
            !jobs.iter().any(|j| j["source"] == "slurm-a" && j["job"] == "7"),
            "the oldest finished job left"
        );
        assert!(jobs
            .iter()
            .any(|j| j["source"] == "slurm-b" && j["state"] == "running"));
        assert_eq!(m.jobs_dropped(), 0);
    }

    #[test]
    fn active_jobs_beyond_the_cap_are_dropped_and_counted() {
        let mut m = Model::new(10, false);
        for i in 0..MAX_ACTIVE_JOBS {
            m.events("s", &[job_event("slurm-a", &i.to_string(), "pending", f64::NAN)]);
        }
        let over = m.events("s", &[job_event("slurm-a", "extra", "running", f64::NAN)]);
        assert!(over.is_empty(), "{over:?}");
        assert_eq!(m.jobs_dropped(), 1);
        // A job already shown still changes state, and a finished one makes room.
        let msgs = m.events("s", &[job_event("slurm-a", "0", "completed", 0.0)]);
        assert_eq!(msgs[0]["job"]["state"], "completed");
        let msgs = m.events("s", &[job_event("slurm-a", "extra", "running", f64::NAN)]);
        assert_eq!(msgs[0]["job"]["job"], "extra");
        assert_eq!(
            m.snapshot(0)["jobs"].as_array().unwrap().len(),
            MAX_ACTIVE_JOBS + 1
        );
    }

    #[test]
    fn records_keep_their_age_across_updates_and_leave() {
        let mut m = Model::new(10, false);
        let put = m.put_record(&producer_entry("p1", 7), 1000, false).unwrap();
        assert_eq!(put["record"]["id"], "p1");
        assert_eq!(put["record"]["n_sources"], 2);
        let put = m.put_record(&producer_entry("p1", 7), 4000, false).unwrap();
        assert_eq!(put["record"]["age_ms"], 3000);
        assert_eq!(put["record"]["updated_ms_ago"], 0);
        let put = m.put_record(&producer_entry("p1", 9), 5000, false).unwrap();
        assert_eq!(put["record"]["age_ms"], 0, "a new lease is a new registration");
        let del = m
            .delete_record(&producer_entry("p1", 9), "lease expired")
            .unwrap();
        assert_eq!(del["op"], "delete");
        assert!(m.delete_record(&producer_entry("p1", 9), "again").is_none());
        m.put_record(&producer_entry("p2", 1), 0, true);
        let gone = m.retain_records(&HashSet::new());
        assert_eq!(gone.len(), 1);
    }
}
