//! What one viewer may see of the live dashboard.
//!
//! Every message the dashboard broadcasts carries the classes of data it holds ([`classes`]):
//! chart points per metric (each the raw values of one event: `host.cpu`, `host.mem`,
//! `host.net`, `host.load`), decisions (`*.decision`), `gma.rpc` rows, federation rows
//! (`federation.status`), batch job rows (`job.batch`), and directory information (records, the cluster, input status). A
//! [`View`] is what the policy lets one identity see:
//!
//! - chart points of a metric: `producer.subscribe` allowed **raw** on its event (a
//!   summary-only identity gets no chart points and no host names);
//! - decisions, `gma.rpc`, federation rows, batch job rows (`job.batch`): `producer.subscribe`
//!   allowed raw on the event name (decisions per name);
//! - records and the cluster: `directory.search` on `*` not denied (summary-only included: the
//!   directory shows such identities which producers exist, docs/security.md).
//!
//! A viewer who may see every class a message holds is sent the shared bytes (one encoding for
//! all such viewers); anyone else gets the message filtered ([`View::filter`]) and re-encoded,
//! or nothing when nothing is left.

use std::sync::Arc;

use gma_core::authz::{Action, Decision, Identity, Policy};
use serde_json::Value;

use crate::model::{is_decision, FEDERATION_STATUS, JOB_EVENT, METRICS};

/// The events behind the chart metrics, in the order of [`METRICS`].
pub const METRIC_EVENTS: [&str; 4] = ["host.cpu", "host.mem", "host.net", "host.load"];

pub const DECISIONS: u16 = 1 << 4;
pub const RPC: u16 = 1 << 5;
pub const FEDERATION: u16 = 1 << 6;
pub const DIRECTORY: u16 = 1 << 7;
/// Batch job rows (`job.batch`).
pub const JOBS: u16 = 1 << 8;
/// Any chart metric (bits 0..4, one per [`METRICS`] entry).
pub const ANY_METRIC: u16 = 0b1111;
pub const ALL: u16 = ANY_METRIC | DECISIONS | RPC | FEDERATION | DIRECTORY | JOBS;

fn metric_bit(metric: &str) -> u16 {
    METRICS
        .iter()
        .position(|m| *m == metric)
        .map_or(ANY_METRIC, |i| 1 << i)
}

/// The classes of data a message (of [`crate::model::Model`]) holds.
pub fn classes(msg: &Value) -> u16 {
    match msg["type"].as_str().unwrap_or("") {
        "points" => msg["points"]
            .as_array()
            .map(|pts| {
                pts.iter()
                    .fold(0, |acc, p| acc | metric_bit(p[1].as_str().unwrap_or("")))
            })
            .unwrap_or(ANY_METRIC),
        "decision" => DECISIONS,
        "rpc" => RPC,
        "federation" => FEDERATION,
        "job" => JOBS,
        "record" | "cluster" | "status" => DIRECTORY,
        "hosts_gone" => {
            let some = |k: &str| msg[k].as_array().is_some_and(|a| !a.is_empty());
            (if some("hosts") { ANY_METRIC } else { 0 }) | (if some("rpc_sources") { RPC } else { 0 })
        }
        // Snapshots and anything unknown: everything.
        _ => ALL,
    }
}

/// What one identity may see (see the module documentation).
#[derive(Clone)]
pub struct View {
    allowed: u16,
    who: Identity,
    policy: Arc<Policy>,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("allowed", &format_args!("{:#010b}", self.allowed))
            .field("who", &self.who)
            .finish()
    }
}

impl View {
    /// Everything (no policy).
    pub fn all() -> View {
        View {
            allowed: ALL,
            who: Identity::anonymous(),
            policy: Arc::new(Policy::allow_all()),
        }
    }

    /// What `policy` lets `who` see.
    pub fn of(policy: &Arc<Policy>, who: &Identity) -> View {
        let raw =
            |name: &str| policy.authorize(who, Action::ProducerSubscribe, name).decision == Decision::Allow;
        let mut allowed = 0;
        for (i, e) in METRIC_EVENTS.iter().enumerate() {
            if raw(e) {
                allowed |= 1 << i;
            }
        }
        if raw("*.decision") {
            allowed |= DECISIONS;
        }
        if raw(gma_core::rpc::RPC_EVENT) {
            allowed |= RPC;
        }
        if raw(FEDERATION_STATUS) {
            allowed |= FEDERATION;
        }
        if raw(JOB_EVENT) {
            allowed |= JOBS;
        }
        if policy.authorize(who, Action::DirectorySearch, "*").is_allowed() {
            allowed |= DIRECTORY;
        }
        View {
            allowed,
            who: who.clone(),
            policy: policy.clone(),
        }
    }

    /// True when a message of `classes` may be sent as it is.
    pub fn passes(&self, classes: u16) -> bool {
        classes & !self.allowed == 0
    }

    fn may(&self, class: u16) -> bool {
        self.allowed & class == class
    }

    fn decision_allowed(&self, d: &Value) -> bool {
        self.may(DECISIONS)
            || d["name"].as_str().is_some_and(|n| {
                is_decision(n)
                    && self
                        .policy
                        .authorize(&self.who, Action::ProducerSubscribe, n)
                        .decision
                        == Decision::Allow
            })
    }

    /// Removes from `msg` what this viewer may not see; false when nothing is left to send.
    pub fn filter(&self, msg: &mut Value) -> bool {
        let empty = |v: &mut Value| *v = Value::Array(Vec::new());
        match msg["type"].as_str().unwrap_or("") {
            "points" => {
                if let Some(pts) = msg["points"].as_array_mut() {
                    pts.retain(|p| self.may(metric_bit(p[1].as_str().unwrap_or(""))));
                    !pts.is_empty()
                } else {
                    false
                }
            }
            "decision" => self.decision_allowed(&msg["decision"]),
            "rpc" => self.may(RPC),
            "federation" | "hierarchy" => self.may(FEDERATION),
            "job" => self.may(JOBS),
            "record" | "cluster" | "status" => self.may(DIRECTORY),
            "hosts_gone" => {
                if self.allowed & ANY_METRIC == 0 {
                    empty(&mut msg["hosts"]);
                }
                if !self.may(RPC) {
                    empty(&mut msg["rpc_sources"]);
                }
                classes(msg) != 0
            }
            "snapshot" => {
                self.filter_snapshot(msg);
                true
            }
            _ => self.allowed == ALL,
        }
    }

    fn filter_snapshot(&self, snap: &mut Value) {
        let empty = |v: &mut Value| *v = Value::Array(Vec::new());
        if self.allowed & ANY_METRIC == 0 {
            empty(&mut snap["hosts"]);
        } else if let Some(hosts) = snap["hosts"].as_array_mut() {
            for h in hosts.iter_mut() {
                if let Some(series) = h["series"].as_object_mut() {
                    for (metric, pts) in series.iter_mut() {
                        if !self.may(metric_bit(metric)) {
                            *pts = Value::Array(Vec::new());
                        }
                    }
                }
            }
        }
        if let Some(ds) = snap["decisions"].as_array_mut() {
            ds.retain(|d| self.decision_allowed(d));
        }
        if !self.may(RPC) {
            empty(&mut snap["rpc"]);
        }
        if !self.may(FEDERATION) {
            empty(&mut snap["federation"]);
            empty(&mut snap["hierarchy"]);
        }
        if !self.may(JOBS) {
            empty(&mut snap["jobs"]);
        }
        if !self.may(DIRECTORY) {
            empty(&mut snap["records"]);
            snap["cluster"] = Value::Null;
            snap["status"] = Value::Object(Default::default());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const POLICY: &str = r#"
[[rule]]
org = "partner"
actions = ["producer.subscribe"]
resources = ["host.*"]
effect = "summary"
[[rule]]
org = "partner"
actions = ["producer.subscribe"]
resources = ["gma.rpc", "broker.decision"]
effect = "allow"
[[rule]]
org = "mixed"
actions = ["producer.subscribe"]
resources = ["host.load"]
effect = "allow"
[[rule]]
org = "site1"
actions = ["*"]
effect = "allow"
"#;

    fn view(org: &str) -> View {
        let p = Arc::new(Policy::parse_toml(POLICY, "p.toml").unwrap());
        View::of(&p, &Identity::new("x", org))
    }

    #[test]
    fn a_summary_only_viewer_gets_no_raw_host_values() {
        let bob = view("partner");
        let points = json!({"type": "points", "points": [["h1", "cpu", 1.0, 2.0], ["h1", "load", 1.0, 0.5]]});
        assert!(!bob.passes(classes(&points)));
        let mut m = points.clone();
        assert!(!bob.filter(&mut m), "{m}");
        let mut rpc = json!({"type": "rpc", "rows": []});
        assert!(bob.passes(classes(&rpc)) && bob.filter(&mut rpc));
        let mut d = json!({"type": "decision", "decision": {"name": "broker.decision"}});
        assert!(!bob.passes(classes(&d)), "not every decision");
        assert!(bob.filter(&mut d));
        let mut d = json!({"type": "decision", "decision": {"name": "resched.decision"}});
        assert!(!bob.filter(&mut d));
        let mut rec = json!({"type": "record", "op": "put"});
        assert!(!bob.filter(&mut rec));
        let mut snap = json!({
            "type": "snapshot",
            "hosts": [{"host": "h1", "series": {"cpu": [[1.0, 2.0]], "load": [[1.0, 0.5]]}}],
            "records": [{"id": "p"}], "cluster": {"leader_id": 1}, "status": {"directory": null},
            "decisions": [{"name": "broker.decision"}, {"name": "resched.decision"}],
            "rpc": [{"source": "x"}], "federation": [{"site": "s"}],
            "hierarchy": [{"root": {"site": "s"}}],
        });
        assert!(bob.filter(&mut snap));
        assert_eq!(snap["hosts"], json!([]));
        assert_eq!(snap["records"], json!([]));
        assert_eq!(snap["cluster"], Value::Null);
        assert_eq!(snap["decisions"], json!([{"name": "broker.decision"}]));
        assert_eq!(snap["rpc"], json!([{"source": "x"}]));
        assert_eq!(snap["federation"], json!([]));
        assert_eq!(snap["hierarchy"], json!([]), "the tree is federation data");
        let mut h = json!({"type": "hierarchy", "trees": [{"root": {"site": "s"}}]});
        assert!(!bob.filter(&mut h));
        let mut gone = json!({"type": "hosts_gone", "hosts": ["h1"], "rpc_sources": ["x/y"]});
        assert!(bob.filter(&mut gone));
        assert_eq!(gone["hosts"], json!([]));
    }

    #[test]
    fn a_partial_viewer_gets_its_metrics_and_a_full_one_the_shared_bytes() {
        let m = view("mixed");
        let mut points =
            json!({"type": "points", "points": [["h1", "cpu", 1.0, 2.0], ["h1", "load", 1.0, 0.5]]});
        assert!(m.filter(&mut points));
        assert_eq!(points["points"], json!([["h1", "load", 1.0, 0.5]]));
        let mut snap = json!({"type": "snapshot", "hosts": [{"host": "h1", "series": {"cpu": [[1.0, 2.0]], "load": [[1.0, 0.5]]}}]});
        assert!(m.filter(&mut snap));
        assert_eq!(snap["hosts"][0]["series"]["cpu"], json!([]));
        assert_eq!(snap["hosts"][0]["series"]["load"], json!([[1.0, 0.5]]));
        let alice = view("site1");
        for msg in [
            json!({"type": "points", "points": [["h1", "cpu", 1.0, 2.0]]}),
            json!({"type": "decision", "decision": {"name": "x.decision"}}),
            json!({"type": "snapshot"}),
            json!({"type": "record"}),
        ] {
            assert!(alice.passes(classes(&msg)), "{msg}");
        }
        assert!(View::all().passes(ALL));
    }

    #[test]
    fn batch_job_rows_need_raw_job_batch() {
        let bob = view("partner");
        let mut job = json!({"type": "job", "job": {"job": "7", "state": "running"}});
        assert_eq!(classes(&job), JOBS);
        assert!(!bob.passes(JOBS) && !bob.filter(&mut job));
        let mut snap = json!({"type": "snapshot", "jobs": [{"job": "7"}]});
        assert!(bob.filter(&mut snap));
        assert_eq!(snap["jobs"], json!([]));
        let alice = view("site1");
        assert!(alice.passes(classes(&job)) && alice.filter(&mut job));
    }
}
