//! The door census (issue 26, item 7): every door of every role has an authorization decision
//! written down, and every door keeps it, with real processes over mTLS.
//!
//! - **Static**: every RPC of every service in `gma_proto::FILE_DESCRIPTOR_SET` (the public
//!   services and raft) and of the standard services of every gRPC listener (health,
//!   reflection: `gma_core::conn::STANDARD_DESCRIPTOR_SETS`) and every HTTP route of every role has exactly one door in the roles'
//!   `DOORS` lists (`gma doors`), and no door names an RPC or route that does not exist; the
//!   door table of docs/security.md is those lists.
//! - **Dynamic**: the roles that serve those doors run as real processes with mTLS and one
//!   policy (a 1-member directory with `[[members]]`, a producer of simulated hosts with
//!   `--prometheus` and `--otlp-listen`, an archiver with `--metrics-listen` and `--http-listen`
//!   (PromQL), a broker, a simres, the dashboard, a
//!   netprobe, a federation endpoint, a sink, `gma app-sim`, a relay, a monitor, a
//!   rescheduler); every door is called, with a meaningful request per RPC (and the attacker's
//!   variants of the data doors), as (a) no certificate, (b) a certificate of another CA, (c)
//!   the summary-only outsider, (d) an inside user, (e) a member-named certificate of the wrong
//!   organization (`CN=dir-evil, O=partner`), and, for the doors only directory members or
//!   linked sites may use, (m) the member. (a), (b) must be refused; (c), (e) must never get
//!   raw data (the detectors of `common::census`) and must be refused where the door says so;
//!   (d) must be served (OK or a precise status that is not about authorization), and must see
//!   raw data where it is there to see (so the detectors are shown to work on live answers).
//!   A failure prints the table of every knock.
//! - **Test of the test**: the static check reports exactly the door removed from a copy of
//!   the table; the detectors flag raw answers and pass summary ones; and a producer started
//!   with its checks off (no policy) is caught serving raw data to (c) and (e).

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use common::census::*;
use common::secure::*;
use common::*;
use gma_proto::raft::raft_client::RaftClient;
use gma_proto::v1 as pb;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Everything inside (`site1`) is allowed; `partner` may open the dashboard, read metrics and
/// ask the broker for placements, and gets summaries only of everything else (a summary rule
/// on every action: the non-event actions it denies).
const CENSUS_POLICY: &str = r#"default = "deny"

[[rule]]
org = "site1"
actions = ["*"]
effect = "allow"

[[rule]]
org = "partner"
actions = ["dashboard.read", "metrics.read", "broker.select"]
effect = "allow"

[[rule]]
org = "partner"
actions = ["*"]
effect = "summary"
"#;

/// Messages read from a stream at most, and how long a stream is watched.
const STREAM_MESSAGES: usize = 5;
const STREAM_WINDOW: Duration = Duration::from_secs(3);
/// Knocks in flight at once.
const PARALLEL: usize = 48;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type CallFn = Arc<dyn Fn(Channel) -> BoxFuture<Outcome> + Send + Sync>;

#[derive(Clone)]
enum Call {
    Grpc(CallFn),
    Http {
        method: &'static str,
        path: String,
        detect: fn(&str) -> Vec<String>,
        enough: fn(&str) -> bool,
    },
}

#[derive(Clone)]
struct Knock {
    door: &'static str,
    variant: &'static str,
    target: String,
    /// The inside user must see raw data here.
    inside_raw: bool,
    call: Call,
}

impl Knock {
    fn name(&self) -> String {
        if self.variant.is_empty() {
            format!("{} @ {}", self.door, self.target)
        } else {
            format!("{} [{}] @ {}", self.door, self.variant, self.target)
        }
    }
}

fn status_outcome(s: tonic::Status) -> Outcome {
    Outcome::Status(s.code(), s.message().to_string())
}

/// A call that failed as a transport failure (not a status of the service) on a listener whose
/// TLS refused the identity ([`tls_probe`]) was refused at the handshake.
fn handshake_refused(got: Outcome, probe: &Result<(), String>) -> Outcome {
    match (got, probe) {
        (
            Outcome::Status(
                c @ (tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Internal),
                m,
            ),
            Err(why),
        ) => Outcome::Handshake(format!("{why} (the call: {c:?}: {m})")),
        (got, _) => got,
    }
}

fn note(v: &impl Debug) -> String {
    let mut s = format!("{v:?}");
    if s.len() > 400 {
        let mut end = 400;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// A unary call: its answer judged by `raw`.
fn unary<T, F, R>(fut: F, raw: R) -> BoxFuture<Outcome>
where
    T: Debug + Send + 'static,
    F: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
    R: Fn(&T) -> Vec<String> + Send + 'static,
{
    Box::pin(async move {
        match fut.await {
            Ok(r) => {
                let v = r.into_inner();
                Outcome::Served {
                    raw: raw(&v),
                    note: note(&v),
                }
            }
            Err(s) => status_outcome(s),
        }
    })
}

/// A streaming answer: the first [`STREAM_MESSAGES`] messages within [`STREAM_WINDOW`] (or
/// until one holds raw data), each judged by `raw`.
fn streamed<T, F, R>(fut: F, mut raw: R) -> BoxFuture<Outcome>
where
    T: Debug + Send + 'static,
    F: Future<Output = Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>> + Send + 'static,
    R: FnMut(&T) -> Vec<String> + Send + 'static,
{
    Box::pin(async move {
        let mut s = match fut.await {
            Ok(r) => r.into_inner(),
            Err(st) => return status_outcome(st),
        };
        let deadline = tokio::time::Instant::now() + STREAM_WINDOW;
        let (mut found, mut n, mut notes) = (Vec::new(), 0usize, String::new());
        loop {
            match tokio::time::timeout_at(deadline, s.message()).await {
                Err(_) | Ok(Ok(None)) => break,
                Ok(Ok(Some(m))) => {
                    n += 1;
                    found.extend(raw(&m));
                    if notes.len() < 400 {
                        notes.push_str(&note(&m));
                    }
                    if n >= STREAM_MESSAGES || !found.is_empty() {
                        break;
                    }
                }
                Ok(Err(st)) if n == 0 => return status_outcome(st),
                Ok(Err(st)) => {
                    notes.push_str(&format!(" then {:?}: {}", st.code(), st.message()));
                    break;
                }
            }
        }
        found.sort();
        found.dedup();
        Outcome::Served {
            raw: found,
            note: format!("{n} message(s) in the window: {notes}"),
        }
    })
}

fn none<T>(_: &T) -> Vec<String> {
    Vec::new()
}

/// The raw series among the events of a batch, remembering the stream's declarations.
fn batch_raw(decls: &mut HashMap<u32, String>, b: &pb::EventBatch) -> Vec<String> {
    for d in &b.series {
        decls.insert(d.id, d.name.clone());
    }
    let names: Vec<String> = b
        .series_ids
        .iter()
        .map(|id| {
            decls
                .get(id)
                .cloned()
                .unwrap_or_else(|| format!("undeclared series {id}"))
        })
        .collect();
    raw_names(names.iter().map(String::as_str))
}

fn subscribe_raw() -> impl FnMut(&pb::SubscribeResponse) -> Vec<String> + Send + 'static {
    let mut decls = HashMap::new();
    move |r: &pb::SubscribeResponse| {
        r.batch
            .as_ref()
            .map_or_else(Vec::new, |b| batch_raw(&mut decls, b))
    }
}

fn query_raw(r: &pb::QueryResponse) -> Vec<String> {
    raw_names(r.events.iter().map(|e| e.name.as_str()))
}

fn archive_raw(r: &pb::ArchiveQueryResponse) -> Vec<String> {
    raw_names(
        r.series
            .iter()
            .filter(|s| !s.timestamps_ns.is_empty() || !s.values.is_empty() || !s.texts.is_empty())
            .map(|s| s.name.as_str()),
    )
}

fn series_raw(r: &pb::ArchiveSeriesResponse) -> Vec<String> {
    raw_names(r.series.iter().map(|s| s.name.as_str()))
}

fn view_raw(r: &pb::BrokerViewResponse) -> Vec<String> {
    r.resources
        .iter()
        .map(|v| format!("host values of {}", v.resource))
        .collect()
}

fn calendar_raw(r: &pb::ListReservationsResponse) -> Vec<String> {
    r.reservations
        .iter()
        .map(|x| format!("reservation.state {}", x.id))
        .collect()
}

fn dashboard_json(body: &str) -> Vec<String> {
    match serde_json::from_str(body) {
        Ok(v) => raw_in_dashboard_json(&v),
        Err(_) => Vec::new(),
    }
}

fn no_body(_: &str) -> Vec<String> {
    Vec::new()
}

fn whole(_: &str) -> bool {
    false
}

/// The snapshot and a few more messages of the live stream.
fn sse_enough(t: &str) -> bool {
    t.contains("\"type\":\"snapshot\"") && t.matches("\n\n").count() >= 4
}

/// A gRPC knock: `$client::new(channel).$method($request)` judged by `$judge` (`unary` or
/// `streamed` with a detector). The request expression is evaluated at every knock.
macro_rules! grpc {
    ($judge:ident, $client:ty, $method:ident, $req:expr, $raw:expr) => {{
        let f: CallFn = Arc::new(move |ch: Channel| {
            let req = $req;
            $judge(
                async move {
                    let mut c = <$client>::new(ch);
                    c.$method(req).await
                },
                $raw,
            )
        });
        Call::Grpc(f)
    }};
}

fn event(name: &str) -> pb::Event {
    gma_core::event::to_wire(
        name,
        "census",
        gma_core::time::now_ns(),
        0,
        &[gma_core::event::dbl("x", "", "")],
        &[1.0],
        &[],
    )
}

fn schema(name: &str) -> pb::EventSchema {
    pb::EventSchema {
        name: name.into(),
        version: 1,
        fields: vec![gma_core::event::dbl("x", "", "")],
        description: String::new(),
    }
}

fn record(id: &str) -> pb::Record {
    pb::Record {
        record: Some(pb::record::Record::Producer(pb::ProducerRecord {
            id: id.into(),
            address: "http://127.0.0.1:9".into(),
            events: vec!["census.knock".into()],
            ..Default::default()
        })),
    }
}

fn job() -> pb::JobSpec {
    pb::JobSpec {
        name: "census".into(),
        cpus: 1,
        reference_time_s: 60.0,
        ..Default::default()
    }
}

/// `gma-site: node1` (the linked site the federation endpoint knows) on a request.
fn as_site<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("gma-site", tonic::metadata::MetadataValue::from_static("node1"));
    r
}

fn now_s() -> i64 {
    gma_core::time::now_ns() / 1_000_000_000
}

/// The knocks on the doors of the producer service at `target` (every role built on one).
fn producer_knocks(target: &str, hosts_raw: bool) -> Vec<Knock> {
    use pb::control_client::ControlClient;
    use pb::ingest_client::IngestClient;
    use pb::producer_client::ProducerClient;
    use pb::simulator_client::SimulatorClient;
    let k = |door, variant, inside_raw, call| Knock {
        door,
        variant,
        target: target.to_string(),
        inside_raw,
        call,
    };
    let query = |patterns: &[&str]| {
        let p: Vec<String> = patterns.iter().map(|s| s.to_string()).collect();
        grpc!(
            unary,
            ProducerClient<Channel>,
            query,
            pb::QueryRequest {
                patterns: p.clone(),
                ..Default::default()
            },
            query_raw
        )
    };
    vec![
        k("/gma.v1.Producer/Query", "host.*", hosts_raw, query(&["host.*"])),
        k("/gma.v1.Producer/Query", "*", false, query(&["*"])),
        k(
            "/gma.v1.Producer/Query",
            "host.load.avg1m",
            false,
            query(&["host.load.avg1m"]),
        ),
        k(
            "/gma.v1.Producer/Subscribe",
            "host.*",
            hosts_raw,
            grpc!(
                streamed,
                ProducerClient<Channel>,
                subscribe,
                pb::SubscribeRequest {
                    patterns: vec!["host.*".into()],
                    ..Default::default()
                },
                subscribe_raw()
            ),
        ),
        k(
            "/gma.v1.Producer/Subscribe",
            "host.load --summary 1m",
            false,
            grpc!(
                streamed,
                ProducerClient<Channel>,
                subscribe,
                pb::SubscribeRequest {
                    patterns: vec!["host.load".into()],
                    summaries: vec!["1m".into()],
                    ..Default::default()
                },
                subscribe_raw()
            ),
        ),
        k(
            "/gma.v1.Producer/Unsubscribe",
            "",
            false,
            grpc!(
                unary,
                ProducerClient<Channel>,
                unsubscribe,
                pb::UnsubscribeRequest {
                    subscription_id: u64::MAX,
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Producer/Version",
            "",
            false,
            grpc!(
                unary,
                ProducerClient<Channel>,
                version,
                pb::VersionRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.Ingest/Push",
            "",
            false,
            grpc!(
                unary,
                IngestClient<Channel>,
                push,
                pb::IngestRequest {
                    events: vec![event("census.knock")],
                    schemas: vec![schema("census.knock")],
                },
                none
            ),
        ),
        k(
            "/gma.v1.Ingest/Schema",
            "",
            false,
            grpc!(
                unary,
                IngestClient<Channel>,
                schema,
                pb::GetSchemaRequest {
                    name: "host.load".into(),
                    version: 0,
                },
                none
            ),
        ),
        k(
            "/gma.v1.Simulator/Set",
            "",
            false,
            grpc!(
                unary,
                SimulatorClient<Channel>,
                set,
                pb::SimSetRequest {
                    host: "h1".into(),
                    values: [("queue_waiting".to_string(), 0.0)].into(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Control/ListSensors",
            "",
            false,
            grpc!(
                unary,
                ControlClient<Channel>,
                list_sensors,
                pb::ListSensorsRequest {},
                none
            ),
        ),
        k(
            "/gma.v1.Control/SetPeriod",
            "",
            false,
            grpc!(
                unary,
                ControlClient<Channel>,
                set_period,
                pb::SetPeriodRequest {
                    sensor: "sim".into(),
                    period_ms: 1000,
                },
                none
            ),
        ),
        k(
            "/gma.v1.Control/SetEnabled",
            "",
            false,
            grpc!(
                unary,
                ControlClient<Channel>,
                set_enabled,
                pb::SetEnabledRequest {
                    sensor: "sim".into(),
                    enabled: true,
                },
                none
            ),
        ),
        k(
            "/gma.v1.Control/Watch",
            "",
            false,
            grpc!(
                unary,
                ControlClient<Channel>,
                watch,
                pb::ProcessWatchRequest {
                    name: "census".into(),
                    comm: "census".into(),
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Control/Unwatch",
            "",
            false,
            grpc!(
                unary,
                ControlClient<Channel>,
                unwatch,
                pb::RemoveWatchRequest {
                    name: "census".into()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Control/AddRule",
            "",
            false,
            grpc!(
                unary,
                ControlClient<Channel>,
                add_rule,
                pb::AddRuleRequest {
                    toml: "[[rule]]\nname = \"census\"\nevents = [\"x\"]\nwhen = 'a > 1'\ncommand = [\"true\"]\n".into(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Control/RemoveRule",
            "",
            false,
            grpc!(
                unary,
                ControlClient<Channel>,
                remove_rule,
                pb::RemoveRuleRequest { name: "census".into() },
                none
            ),
        ),
    ]
}

/// The addresses of the running fabric, by target name, and what the knocks need to know.
struct Fabric {
    site: Arc<Secure>,
    addrs: BTreeMap<String, String>,
    /// A lease alice holds (record `census-lease`).
    lease: u64,
    _procs: Vec<Proc>,
}

/// Every knock on the fabric: each door of each role that serves it.
fn knocks(lease: u64) -> Vec<Knock> {
    use gma_proto::raft::{AddLearnerRequest, Caller, ChangeMembershipRequest, ForwardRequest, RaftRequest};
    use pb::app_control_client::AppControlClient;
    use pb::archive_client::ArchiveClient;
    use pb::broker_client::BrokerClient;
    use pb::clique_client::CliqueClient;
    use pb::consumer_client::ConsumerClient;
    use pb::directory_client::DirectoryClient;
    use pb::federation_client::FederationClient;
    use pb::grid_client::GridClient;
    use pb::probe_client::ProbeClient;
    use pb::reservations_client::ReservationsClient;
    use pb::site_scheduler_client::SiteSchedulerClient;
    let k = |door, variant, target: &str, inside_raw, call| Knock {
        door,
        variant,
        target: target.to_string(),
        inside_raw,
        call,
    };
    let mut out = Vec::new();
    // The directory: client API and raft.
    let d = "directory";
    let vote = |term: u64| -> Vec<u8> {
        format!(
            r#"{{"vote":{{"leader_id":{{"term":{term},"node_id":1}},"committed":false}},"last_log_id":null}}"#
        )
        .into_bytes()
    };
    let append = br#"{"vote":{"leader_id":{"term":0,"node_id":1},"committed":true},"prev_log_id":null,"entries":[],"leader_commit":null}"#.to_vec();
    let snapshot = br#"{"vote":{"leader_id":{"term":0,"node_id":1},"committed":true},"meta":{"last_log_id":null,"last_membership":{"log_id":null,"membership":{"configs":[],"nodes":{}}},"snapshot_id":"census"},"offset":0,"data":[],"done":true}"#.to_vec();
    out.extend([
        k(
            "/gma.v1.Directory/Register",
            "",
            d,
            false,
            grpc!(
                unary,
                DirectoryClient<Channel>,
                register,
                pb::RegisterRequest {
                    record: Some(record("census-knock")),
                    schemas: vec![schema("census.knock")],
                    lease_ttl_ms: 60_000,
                },
                none
            ),
        ),
        k(
            "/gma.v1.Directory/Update",
            "",
            d,
            false,
            grpc!(
                unary,
                DirectoryClient<Channel>,
                update,
                pb::UpdateRequest {
                    record: Some(record("census-lease")),
                    schemas: vec![],
                    lease_ttl_ms: 600_000,
                },
                none
            ),
        ),
        k(
            "/gma.v1.Directory/Remove",
            "",
            d,
            false,
            grpc!(
                unary,
                DirectoryClient<Channel>,
                remove,
                pb::RemoveRequest {
                    kind: pb::RecordKind::Producer as i32,
                    id: "census-absent".into(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Directory/KeepAlive",
            "alice's lease",
            d,
            false,
            grpc!(
                streamed,
                DirectoryClient<Channel>,
                keep_alive,
                tokio_stream::iter(vec![pb::KeepAliveRequest { lease_id: lease }]),
                none
            ),
        ),
        k(
            "/gma.v1.Directory/Search",
            "host.*",
            d,
            false,
            grpc!(
                unary,
                DirectoryClient<Channel>,
                search,
                pb::SearchRequest {
                    event_pattern: "host.*".into(),
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Directory/GetSchema",
            "host.load",
            d,
            false,
            grpc!(
                unary,
                DirectoryClient<Channel>,
                get_schema,
                pb::GetSchemaRequest {
                    name: "host.load".into(),
                    version: 0,
                },
                none
            ),
        ),
        k(
            "/gma.v1.Directory/Watch",
            "host.*",
            d,
            false,
            grpc!(
                streamed,
                DirectoryClient<Channel>,
                watch,
                pb::WatchRequest {
                    event_pattern: "host.*".into(),
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Directory/Version",
            "",
            d,
            false,
            grpc!(
                unary,
                DirectoryClient<Channel>,
                version,
                pb::VersionRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.Directory/ClusterStatus",
            "",
            d,
            false,
            grpc!(
                unary,
                DirectoryClient<Channel>,
                cluster_status,
                pb::ClusterStatusRequest::default(),
                none
            ),
        ),
        k(
            "/gma.raft.v1.Raft/AppendEntries",
            "stale term",
            d,
            false,
            grpc!(
                unary,
                RaftClient<Channel>,
                append_entries,
                RaftRequest { data: append.clone() },
                none
            ),
        ),
        k(
            "/gma.raft.v1.Raft/Vote",
            "stale term",
            d,
            false,
            grpc!(
                unary,
                RaftClient<Channel>,
                vote,
                RaftRequest { data: vote(0) },
                none
            ),
        ),
        k(
            "/gma.raft.v1.Raft/InstallSnapshot",
            "stale term",
            d,
            false,
            grpc!(
                unary,
                RaftClient<Channel>,
                install_snapshot,
                RaftRequest {
                    data: snapshot.clone()
                },
                none
            ),
        ),
        k(
            "/gma.raft.v1.Raft/Forward",
            "Remove for alice",
            d,
            false,
            grpc!(
                unary,
                RaftClient<Channel>,
                forward,
                ForwardRequest {
                    command: br#"{"Remove":{"kind":"Producer","id":"census-absent"}}"#.to_vec(),
                    caller: Some(Caller {
                        cn: "alice".into(),
                        org: "site1".into(),
                    }),
                },
                none
            ),
        ),
        k(
            "/gma.raft.v1.Raft/AddLearner",
            "node 0",
            d,
            false,
            grpc!(
                unary,
                RaftClient<Channel>,
                add_learner,
                AddLearnerRequest {
                    id: 0,
                    address: "127.0.0.1:9".into(),
                },
                none
            ),
        ),
        k(
            "/gma.raft.v1.Raft/ChangeMembership",
            "same voters",
            d,
            false,
            grpc!(
                unary,
                RaftClient<Channel>,
                change_membership,
                ChangeMembershipRequest {
                    voters: vec![1],
                    retain: true,
                },
                none
            ),
        ),
    ]);
    // Every role built on a producer serves the producer's doors.
    for (target, hosts_raw) in [
        ("producer", true),
        ("relay", true),
        ("netprobe", false),
        ("simres", false),
        ("federation", false),
        ("monitor", false),
        ("rescheduler", false),
    ] {
        out.extend(producer_knocks(target, hosts_raw));
    }
    // The producer's OTLP door (--otlp-listen): a gauge to ingest.
    out.push(otlp_knock());
    // The sink.
    out.extend([
        k(
            "/gma.v1.Consumer/Deliver",
            "hello",
            "sink",
            false,
            grpc!(
                streamed,
                ConsumerClient<Channel>,
                deliver,
                tokio_stream::iter(vec![pb::DeliverRequest {
                    msg: Some(pb::deliver_request::Msg::Hello(pb::DeliverHello {
                        producer_id: "census-knock".into(),
                        ..Default::default()
                    })),
                }]),
                none
            ),
        ),
        k(
            "/gma.v1.Consumer/Version",
            "",
            "sink",
            false,
            grpc!(
                unary,
                ConsumerClient<Channel>,
                version,
                pb::VersionRequest::default(),
                none
            ),
        ),
    ]);
    // The archiver.
    let archive_query = |pattern: &'static str| {
        grpc!(
            streamed,
            ArchiveClient<Channel>,
            query,
            {
                let now = gma_core::time::now_ns();
                pb::ArchiveQueryRequest {
                    pattern: pattern.into(),
                    from_ns: now - 600_000_000_000,
                    to_ns: now + 60_000_000_000,
                    ..Default::default()
                }
            },
            archive_raw
        )
    };
    out.extend([
        k(
            "/gma.v1.Archive/Query",
            "host.*",
            "archiver",
            true,
            archive_query("host.*"),
        ),
        k(
            "/gma.v1.Archive/Query",
            "host.load",
            "archiver",
            true,
            archive_query("host.load"),
        ),
        k(
            "/gma.v1.Archive/Series",
            "host.*",
            "archiver",
            true,
            grpc!(
                unary,
                ArchiveClient<Channel>,
                series,
                pb::ArchiveSeriesRequest {
                    pattern: "host.*".into(),
                    source: String::new(),
                },
                series_raw
            ),
        ),
        k(
            "/gma.v1.Archive/Stats",
            "",
            "archiver",
            false,
            grpc!(
                unary,
                ArchiveClient<Channel>,
                stats,
                pb::ArchiveStatsRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.Archive/Version",
            "",
            "archiver",
            false,
            grpc!(
                unary,
                ArchiveClient<Channel>,
                version,
                pb::VersionRequest::default(),
                none
            ),
        ),
    ]);
    // The broker.
    out.extend([
        k(
            "/gma.v1.Broker/Select",
            "",
            "broker",
            false,
            grpc!(
                unary,
                BrokerClient<Channel>,
                select,
                pb::SelectRequest {
                    job: Some(job()),
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Broker/Coallocate",
            "",
            "broker",
            false,
            grpc!(
                unary,
                BrokerClient<Channel>,
                coallocate,
                pb::CoallocateRequest {
                    jobs: vec![job()],
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Broker/RunJob",
            "",
            "broker",
            false,
            grpc!(
                streamed,
                BrokerClient<Channel>,
                run_job,
                pb::RunJobRequest {
                    job: Some(job()),
                    script: "#!/bin/sh\ntrue\n".into(),
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Broker/View",
            "",
            "broker",
            true,
            grpc!(
                unary,
                BrokerClient<Channel>,
                view,
                pb::BrokerViewRequest::default(),
                view_raw
            ),
        ),
        k(
            "/gma.v1.Broker/Version",
            "",
            "broker",
            false,
            grpc!(
                unary,
                BrokerClient<Channel>,
                version,
                pb::VersionRequest::default(),
                none
            ),
        ),
    ]);
    // The resource manager.
    out.extend([
        k(
            "/gma.v1.Reservations/Resources",
            "",
            "simres",
            false,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                resources,
                pb::ResourcesRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.Reservations/Reserve",
            "",
            "simres",
            false,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                reserve,
                pb::ReserveRequest {
                    resource: "h1".into(),
                    cpus: 1,
                    duration_s: 60,
                    earliest_start_s: now_s() + 3600,
                    latest_start_s: now_s() + 7200,
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Reservations/Modify",
            "absent",
            "simres",
            false,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                modify,
                pb::ModifyReservationRequest {
                    id: "census-absent".into(),
                    cpus: 1,
                    duration_s: 60,
                    earliest_start_s: now_s() + 3600,
                    latest_start_s: now_s() + 7200,
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Reservations/Release",
            "absent",
            "simres",
            false,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                release,
                pb::ReleaseReservationRequest {
                    id: "census-absent".into(),
                    owner: String::new(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Reservations/Claim",
            "absent",
            "simres",
            false,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                claim,
                pb::ClaimRequest {
                    reservation_id: "census-absent".into(),
                    owner: String::new(),
                    job: Some(pb::BatchJobSpec {
                        name: "census".into(),
                        script: "#!/bin/sh\ntrue\n".into(),
                        cpus: 1,
                        ..Default::default()
                    }),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Reservations/JobStatus",
            "absent",
            "simres",
            false,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                job_status,
                pb::BatchJobRequest {
                    job_id: "census-absent".into(),
                    owner: String::new(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Reservations/CancelJob",
            "absent",
            "simres",
            false,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                cancel_job,
                pb::BatchJobRequest {
                    job_id: "census-absent".into(),
                    owner: String::new(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Reservations/List",
            "",
            "simres",
            true,
            grpc!(
                unary,
                ReservationsClient<Channel>,
                list,
                pb::ListReservationsRequest::default(),
                calendar_raw
            ),
        ),
    ]);
    // The netprobe.
    let token = || pb::CliqueToken {
        generation: 1,
        origin: "census".into(),
        seq: 1,
        holder: "census".into(),
    };
    out.extend([
        k(
            "/gma.v1.Probe/Echo",
            "",
            "netprobe",
            false,
            grpc!(
                unary,
                ProbeClient<Channel>,
                echo,
                pb::EchoRequest {
                    payload: prost::bytes::Bytes::from_static(b"census"),
                    from: "census".into(),
                    ..Default::default()
                },
                none
            ),
        ),
        k(
            "/gma.v1.Probe/Bulk",
            "",
            "netprobe",
            false,
            grpc!(
                unary,
                ProbeClient<Channel>,
                bulk,
                tokio_stream::iter(vec![pb::BulkChunk {
                    data: prost::bytes::Bytes::from_static(b"census"),
                    from: "census".into(),
                    total: 6,
                }]),
                none
            ),
        ),
        k(
            "/gma.v1.Clique/Pass",
            "another clique",
            "netprobe",
            false,
            grpc!(
                unary,
                CliqueClient<Channel>,
                pass,
                pb::PassRequest {
                    site: "elsewhere".into(),
                    token: Some(token()),
                    from: "census".into(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Clique/Notice",
            "another clique",
            "netprobe",
            false,
            grpc!(
                unary,
                CliqueClient<Channel>,
                notice,
                pb::NoticeRequest {
                    site: "elsewhere".into(),
                    token: Some(token()),
                },
                none
            ),
        ),
        k(
            "/gma.v1.Clique/Status",
            "",
            "netprobe",
            true,
            grpc!(
                unary,
                CliqueClient<Channel>,
                status,
                pb::CliqueStatusRequest::default(),
                |_: &pb::CliqueStatusResponse| vec!["net.probe counters".to_string()]
            ),
        ),
    ]);
    // The federation endpoint: linked sites (the member certificate is site node1) ...
    let f = "federation";
    out.extend([
        k(
            "/gma.v1.Federation/OpenSession",
            "as site node1",
            f,
            false,
            grpc!(
                unary,
                FederationClient<Channel>,
                open_session,
                as_site(pb::Hello {
                    site_id: "node1".into(),
                    ..Default::default()
                }),
                none
            ),
        ),
        k(
            "/gma.v1.Federation/Exchange",
            "no session",
            f,
            false,
            grpc!(
                streamed,
                FederationClient<Channel>,
                exchange,
                as_site(tokio_stream::iter(vec![pb::Frame {
                    kind: Some(pb::frame::Kind::Attach(pb::Attach {
                        session_id: "census-absent".into(),
                    })),
                }])),
                none
            ),
        ),
        k(
            "/gma.v1.Federation/ForwardJob",
            "no job",
            f,
            false,
            grpc!(
                unary,
                FederationClient<Channel>,
                forward_job,
                as_site(pb::ForwardRequest {
                    global_job_id: "node1/census".into(),
                    origin_site: "node1".into(),
                    ..Default::default()
                }),
                none
            ),
        ),
        k(
            "/gma.v1.Federation/ConfirmStart",
            "absent",
            f,
            false,
            grpc!(
                unary,
                FederationClient<Channel>,
                confirm_start,
                as_site(pb::ConfirmStartRequest {
                    global_job_id: "node1/absent".into(),
                    host: String::new(),
                }),
                none
            ),
        ),
        k(
            "/gma.v1.Federation/WatchJobs",
            "",
            f,
            false,
            grpc!(
                streamed,
                FederationClient<Channel>,
                watch_jobs,
                as_site(pb::WatchJobsRequest {
                    from_seq: 1,
                    epoch: 0
                }),
                none
            ),
        ),
        k(
            "/gma.v1.Federation/CancelJob",
            "absent",
            f,
            false,
            grpc!(
                unary,
                FederationClient<Channel>,
                cancel_job,
                as_site(pb::CancelJobRequest {
                    global_job_id: "node1/absent".into(),
                    reason: String::new(),
                }),
                none
            ),
        ),
        k(
            "/gma.v1.Federation/ListForwarded",
            "",
            f,
            false,
            grpc!(
                unary,
                FederationClient<Channel>,
                list_forwarded,
                as_site(pb::ListForwardedRequest::default()),
                none
            ),
        ),
        // ... and local users.
        k(
            "/gma.v1.SiteScheduler/Submit",
            "no job",
            f,
            false,
            grpc!(
                unary,
                SiteSchedulerClient<Channel>,
                submit,
                pb::SubmitJobRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.SiteScheduler/Status",
            "absent",
            f,
            false,
            grpc!(
                unary,
                SiteSchedulerClient<Channel>,
                status,
                pb::JobStatusRequest {
                    global_job_id: "census/absent".into()
                },
                none
            ),
        ),
        k(
            "/gma.v1.SiteScheduler/Cancel",
            "absent",
            f,
            false,
            grpc!(
                unary,
                SiteSchedulerClient<Channel>,
                cancel,
                pb::CancelJobRequest {
                    global_job_id: "census/absent".into(),
                    reason: String::new(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.SiteScheduler/List",
            "",
            f,
            false,
            grpc!(
                unary,
                SiteSchedulerClient<Channel>,
                list,
                pb::ListJobsRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.SiteScheduler/FederationStatus",
            "",
            f,
            false,
            grpc!(
                unary,
                SiteSchedulerClient<Channel>,
                federation_status,
                pb::FederationStatusRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.SiteScheduler/Version",
            "",
            f,
            false,
            grpc!(
                unary,
                SiteSchedulerClient<Channel>,
                version,
                pb::VersionRequest::default(),
                none
            ),
        ),
        // The grid: a linked site's query (no requirements) ...
        k(
            "/gma.v1.Federation/Query",
            "no requirements",
            f,
            false,
            grpc!(
                unary,
                FederationClient<Channel>,
                query,
                as_site(pb::GridQuery {
                    query_id: "census".into(),
                    path: vec!["node1".into()],
                    ..Default::default()
                }),
                none
            ),
        ),
        // ... and applications' queries and reservations.
        k(
            "/gma.v1.Grid/Query",
            "no requirements",
            f,
            false,
            grpc!(unary, GridClient<Channel>, query, pb::GridQuery::default(), none),
        ),
        k(
            "/gma.v1.Grid/Reserve",
            "no host",
            f,
            false,
            grpc!(
                unary,
                GridClient<Channel>,
                reserve,
                pb::GridReserveRequest::default(),
                none
            ),
        ),
        k(
            "/gma.v1.Grid/Start",
            "absent",
            f,
            false,
            grpc!(
                unary,
                GridClient<Channel>,
                start,
                pb::GridReservationRef { number: 0 },
                none
            ),
        ),
        k(
            "/gma.v1.Grid/Release",
            "absent",
            f,
            false,
            grpc!(
                unary,
                GridClient<Channel>,
                release,
                pb::GridReservationRef { number: 0 },
                none
            ),
        ),
        k(
            "/gma.v1.Grid/List",
            "",
            f,
            false,
            grpc!(
                unary,
                GridClient<Channel>,
                list,
                pb::GridListRequest::default(),
                none
            ),
        ),
    ]);
    // The application's control endpoint.
    let a = "app-sim";
    out.extend([
        k(
            "/gma.v1.AppControl/Stop",
            "another app",
            a,
            false,
            grpc!(
                unary,
                AppControlClient<Channel>,
                stop,
                pb::AppStopRequest {
                    app_id: "census-other".into(),
                    reason: "census".into(),
                },
                none
            ),
        ),
        k(
            "/gma.v1.AppControl/Resume",
            "another app",
            a,
            false,
            grpc!(
                unary,
                AppControlClient<Channel>,
                resume,
                pb::AppResumeRequest {
                    app_id: "census-other".into(),
                    hosts: vec!["h2".into()],
                },
                none
            ),
        ),
        k(
            "/gma.v1.AppControl/Declined",
            "",
            a,
            false,
            grpc!(
                unary,
                AppControlClient<Channel>,
                declined,
                pb::AppDeclinedRequest {
                    app_id: "census-app".into(),
                    gain: 0.0,
                },
                none
            ),
        ),
        k(
            "/gma.v1.AppControl/Status",
            "",
            a,
            true,
            grpc!(
                unary,
                AppControlClient<Channel>,
                status,
                pb::AppStatusRequest::default(),
                |_: &pb::AppStatusResponse| vec!["app.state".to_string()]
            ),
        ),
    ]);
    // HTTP: the dashboard, the roles' /metrics, the producer's --prometheus.
    let http = |door, variant, target: &str, inside_raw, path: &str, detect, enough| Knock {
        door,
        variant,
        target: target.to_string(),
        inside_raw,
        call: Call::Http {
            method: "GET",
            path: path.to_string(),
            detect,
            enough,
        },
    };
    let dash = "dashboard";
    out.extend([
        http(
            "GET /",
            "",
            dash,
            false,
            "/",
            no_body as fn(&str) -> Vec<String>,
            whole as fn(&str) -> bool,
        ),
        http("GET /app.js", "", dash, false, "/app.js", no_body, whole),
        http("GET /style.css", "", dash, false, "/style.css", no_body, whole),
        http("GET /healthz", "", dash, false, "/healthz", no_body, whole),
        http(
            "GET /api/snapshot",
            "",
            dash,
            true,
            "/api/snapshot",
            dashboard_json,
            whole,
        ),
        http(
            "GET /api/events",
            "",
            dash,
            true,
            "/api/events",
            raw_in_sse,
            sse_enough,
        ),
        http(
            "GET /api/history",
            "host.load",
            dash,
            true,
            "/api/history?name=host.load&range_s=600",
            dashboard_json,
            whole,
        ),
        http(
            "GET /api/history",
            "host.*",
            dash,
            true,
            "/api/history?name=host.*&range_s=600",
            dashboard_json,
            whole,
        ),
        http(
            "GET /api/archive/series",
            "host.*",
            dash,
            true,
            "/api/archive/series?pattern=host.*",
            dashboard_json,
            whole,
        ),
        http(
            "GET /metrics",
            "",
            dash,
            false,
            "/metrics",
            raw_in_role_scrape,
            whole,
        ),
        http(
            "GET /metrics (--metrics-listen)",
            "",
            "metrics@archiver",
            false,
            "/metrics",
            raw_in_role_scrape,
            whole,
        ),
        http(
            "GET /metrics (--metrics-listen)",
            "",
            "metrics@dashboard",
            false,
            "/metrics",
            raw_in_role_scrape,
            whole,
        ),
        http(
            "GET /metrics (gma producer --prometheus)",
            "",
            "prometheus",
            true,
            "/metrics",
            raw_in_sensor_scrape,
            whole,
        ),
    ]);
    // The archiver's Prometheus query API (--http-listen), GET and POST.
    let enc = |q: &str| -> String {
        q.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let now = gma_core::time::now_ns() / 1_000_000_000;
    let host = enc(r#"{event=~"host.load.*"}"#);
    let range = format!(
        "/api/v1/query_range?query={host}&start={}&end={}&step=60",
        now - 600,
        now + 600
    );
    let paths = [
        (
            ["GET /api/v1/query", "POST /api/v1/query"],
            "host.load.*",
            format!("/api/v1/query?query={host}"),
            true,
        ),
        (
            ["GET /api/v1/query", "POST /api/v1/query"],
            "sum by (event)",
            format!(
                "/api/v1/query?query={}",
                enc(r#"sum by (event) ({event=~"host.load.*"})"#)
            ),
            true,
        ),
        (
            ["GET /api/v1/query_range", "POST /api/v1/query_range"],
            "host.load.*",
            range,
            true,
        ),
        (
            ["GET /api/v1/series", "POST /api/v1/series"],
            "host.load.*",
            format!("/api/v1/series?match[]={host}"),
            true,
        ),
        (
            ["GET /api/v1/labels", "POST /api/v1/labels"],
            "",
            "/api/v1/labels".to_string(),
            false,
        ),
    ];
    for (doors, variant, path, raw) in paths {
        for (door, method) in doors.into_iter().zip(["GET", "POST"]) {
            out.push(Knock {
                door,
                variant,
                target: "promql@archiver".into(),
                inside_raw: raw,
                call: Call::Http {
                    method,
                    path: path.clone(),
                    // Label names are no data.
                    detect: if raw { raw_in_promql } else { no_body },
                    enough: whole,
                },
            });
        }
    }
    out.extend([
        http(
            "GET /api/v1/label/{name}/values",
            "event",
            "promql@archiver",
            true,
            "/api/v1/label/event/values",
            raw_in_promql,
            whole,
        ),
        http(
            "GET /api/v1/status/buildinfo",
            "",
            "promql@archiver",
            false,
            "/api/v1/status/buildinfo",
            no_body,
            whole,
        ),
    ]);
    // Health and reflection, on every gRPC listener.
    for t in GRPC_TARGETS {
        out.extend(standard_knocks(t));
    }
    out
}

/// The knock on the producer's OTLP door: one gauge point (`otel.census.knock`).
fn otlp_knock() -> Knock {
    use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Gauge, Metric};
    use opentelemetry_proto::tonic::metrics::v1::{NumberDataPoint, ResourceMetrics, ScopeMetrics};
    let req = || ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "census.knock".into(),
                    data: Some(metric::Data::Gauge(Gauge {
                        data_points: vec![NumberDataPoint {
                            value: Some(number_data_point::Value::AsDouble(1.0)),
                            ..Default::default()
                        }],
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    Knock {
        door: "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        variant: "",
        target: "otlp".into(),
        inside_raw: false,
        call: grpc!(unary, MetricsServiceClient<Channel>, export, req(), none),
    }
}

/// Every gRPC listener of the census fabric.
const GRPC_TARGETS: [&str; 13] = [
    "directory",
    "producer",
    "otlp",
    "archiver",
    "broker",
    "simres",
    "netprobe",
    "federation",
    "sink",
    "relay",
    "monitor",
    "rescheduler",
    "app-sim",
];

/// The knocks on the standard services every gRPC listener serves (`gma_core::conn::DOORS`):
/// health Check and Watch of the server, and the list of services by reflection v1 and
/// v1alpha.
fn standard_knocks(target: &str) -> Vec<Knock> {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::{v1, v1alpha};
    let k = |door, call| Knock {
        door,
        variant: "",
        target: target.to_string(),
        inside_raw: false,
        call,
    };
    vec![
        k(
            "/grpc.health.v1.Health/Check",
            grpc!(
                unary,
                HealthClient<Channel>,
                check,
                HealthCheckRequest {
                    service: String::new()
                },
                none
            ),
        ),
        k(
            "/grpc.health.v1.Health/Watch",
            grpc!(
                streamed,
                HealthClient<Channel>,
                watch,
                HealthCheckRequest {
                    service: String::new()
                },
                none
            ),
        ),
        k(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            grpc!(
                streamed,
                v1::server_reflection_client::ServerReflectionClient<Channel>,
                server_reflection_info,
                tokio_stream::iter([v1::ServerReflectionRequest {
                    host: String::new(),
                    message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
                        String::new()
                    )),
                }]),
                none
            ),
        ),
        k(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            grpc!(
                streamed,
                v1alpha::server_reflection_client::ServerReflectionClient<Channel>,
                server_reflection_info,
                tokio_stream::iter([v1alpha::ServerReflectionRequest {
                    host: String::new(),
                    message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(
                        String::new()
                    )),
                }]),
                none
            ),
        ),
    ]
}

/// A TLS channel to `addr` trusting the site's CA, presenting `who`'s certificate.
async fn channel(site: &Secure, addr: &str, who: Who) -> Result<Channel, String> {
    let pem = |p: String| std::fs::read(site.dir.join(p)).unwrap();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem("ca/ca.pem".into())))
        .domain_name("127.0.0.1");
    if let Some((_, name)) = who.cert() {
        tls = tls.identity(Identity::from_pem(
            pem(format!("certs/{name}.pem")),
            pem(format!("certs/{name}.key")),
        ));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// One row of results per knock.
type Results = Vec<(Knock, Answers)>;

/// Knocks every door of `knocks` as every identity that applies (the member only on doors
/// only members or linked sites may use) and judges each answer.
fn run_census(
    site: &Arc<Secure>,
    addrs: &BTreeMap<String, String>,
    knocks: Vec<Knock>,
    doors: &[DoorRow],
) -> Results {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let door_of = |k: &Knock| -> DoorRow {
        doors
            .iter()
            .find(|d| d.door == k.door)
            .cloned()
            .unwrap_or_else(|| panic!("the census knocks on {} which is no door", k.door))
    };
    rt.block_on(async {
        // One channel per (gRPC target, identity), opened up front.
        let grpc_targets: Vec<String> = {
            let mut t: Vec<String> = knocks
                .iter()
                .filter(|k| matches!(k.call, Call::Grpc(_)))
                .map(|k| k.target.clone())
                .collect();
            t.sort();
            t.dedup();
            t
        };
        let mut channels: HashMap<(String, Who), Result<Channel, String>> = HashMap::new();
        let mut opening = Vec::new();
        for t in &grpc_targets {
            for who in Who::ALL {
                let (site, t, addr) = (site.clone(), t.clone(), addrs[t].clone());
                opening.push(tokio::spawn(async move {
                    ((t, who), channel(&site, &addr, who).await)
                }));
            }
        }
        for o in opening {
            let (key, ch) = o.await.unwrap();
            channels.insert(key, ch);
        }
        let channels = Arc::new(channels);
        // Whether each gRPC listener's TLS accepts the strangers at all.
        let mut probing = Vec::new();
        for t in &grpc_targets {
            for who in [Who::NoCert, Who::OtherCa] {
                let (site, t, addr) = (site.clone(), t.clone(), addrs[t].clone());
                probing.push(tokio::task::spawn_blocking(move || {
                    let r = tls_probe(&site, &addr, who.cert().map(|c| c.1));
                    ((t, who), r)
                }));
            }
        }
        let mut probes: HashMap<(String, Who), Result<(), String>> = HashMap::new();
        for p in probing {
            let (key, r) = p.await.unwrap();
            probes.insert(key, r);
        }
        let probes = Arc::new(probes);
        let gate = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
        let mut tasks = Vec::new();
        for (i, knock) in knocks.iter().enumerate() {
            let door = door_of(knock);
            let whos: Vec<Who> = Who::ALL
                .into_iter()
                .filter(|w| *w != Who::Member || door.peers != "any")
                .collect();
            for who in whos {
                let (gate, channels, site, probes) =
                    (gate.clone(), channels.clone(), site.clone(), probes.clone());
                let (knock, door) = (knock.clone(), door.clone());
                let addr = addrs[&knock.target].clone();
                tasks.push(tokio::spawn(async move {
                    let _permit = gate.acquire_owned().await.unwrap();
                    let got = match &knock.call {
                        Call::Grpc(f) => match &channels[&(knock.target.clone(), who)] {
                            Ok(ch) => {
                                let got = match tokio::time::timeout(Duration::from_secs(30), f(ch.clone()))
                                    .await
                                {
                                    Ok(o) => o,
                                    Err(_) => Outcome::Status(
                                        tonic::Code::DeadlineExceeded,
                                        "no answer within 30 s".into(),
                                    ),
                                };
                                match probes.get(&(knock.target.clone(), who)) {
                                    Some(p) => handshake_refused(got, p),
                                    None => got,
                                }
                            }
                            Err(e) => Outcome::Handshake(e.clone()),
                        },
                        Call::Http {
                            method,
                            path,
                            detect,
                            enough,
                        } => {
                            let (method, path, detect, enough) = (*method, path.clone(), *detect, *enough);
                            tokio::task::spawn_blocking(move || {
                                let name = who.cert().map(|c| c.1);
                                match https_request(&site, method, &addr, &path, name, &[], enough) {
                                    Err(e) => Outcome::Handshake(e),
                                    Ok((s, body)) if (200..300).contains(&s) => Outcome::Served {
                                        raw: detect(&body),
                                        note: body.chars().take(400).collect(),
                                    },
                                    Ok((s, body)) => Outcome::Http(s, body),
                                }
                            })
                            .await
                            .unwrap_or_else(|e| Outcome::Handshake(format!("join: {e}")))
                        }
                    };
                    let v = verdict(&door, who, knock.inside_raw, &got);
                    (i, who, got, v)
                }));
            }
        }
        let mut results: Results = knocks.iter().map(|k| (k.clone(), BTreeMap::new())).collect();
        for t in tasks {
            let (i, who, got, v) = t.await.unwrap();
            results[i].1.insert(who, (got, v));
        }
        results
    })
}

/// The failures of a census: `(knock, identity, what is wrong, what came back)`.
fn failures(results: &Results) -> Vec<(String, Who, String, String)> {
    let mut out = Vec::new();
    for (knock, cells) in results {
        for (who, (got, v)) in cells {
            if let Err(e) = v {
                out.push((knock.name(), *who, e.clone(), got.detail()));
            }
        }
    }
    out
}

fn report(results: &Results) -> String {
    let rows: Vec<(String, Answers)> = results.iter().map(|(k, c)| (k.name(), c.clone())).collect();
    let mut s = table(&rows);
    for (k, who, e, got) in failures(results) {
        s.push_str(&format!("\n{k} as {}: {e}\n    got: {got}", who.column()));
    }
    s
}

fn all_doors() -> Vec<DoorRow> {
    binary_doors().into_iter().flat_map(|g| g.doors).collect()
}

/// Every RPC every role may serve: the fabric's descriptor set and the standard services
/// (health, reflection) of every gRPC listener.
fn fds_rpcs() -> Vec<String> {
    let otlp_metrics = format!("/{}/", gma_producer::otlp::SERVICE_NAME);
    let mut rpcs: Vec<String> = std::iter::once(gma_proto::FILE_DESCRIPTOR_SET)
        .chain(gma_core::conn::STANDARD_DESCRIPTOR_SETS)
        .flat_map(|set| gma_proto::rpcs_of(set).expect("the descriptor set decodes"))
        .map(|r| r.path)
        // The producer's --otlp-listen serves OTLP's metrics service (not traces or logs).
        .chain(
            gma_proto::rpcs_of(opentelemetry_proto::DESCRIPTORS)
                .expect("the OTLP descriptor set decodes")
                .into_iter()
                .map(|r| r.path)
                .filter(|p| p.starts_with(&otlp_metrics)),
        )
        .collect();
    rpcs.sort();
    rpcs
}

#[test]
fn every_rpc_and_every_http_route_has_a_door() {
    let rpcs = fds_rpcs();
    let groups = binary_doors();
    // The descriptor set holds every service: 16 of them, raft included; the 3 standard
    // services of every gRPC listener (health, reflection v1 and v1alpha); and OTLP's metrics
    // service (the producer's --otlp-listen).
    let services: std::collections::BTreeSet<&str> = rpcs
        .iter()
        .filter_map(|r| r.rsplit_once('/').map(|(s, _)| s))
        .collect();
    assert_eq!(services.len(), 20, "{services:?}");
    let problems = static_problems(&rpcs, &groups);
    assert!(
        problems.is_empty(),
        "the door census found:\n{}",
        problems
            .iter()
            .map(|p| format!("- {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The HTTP groups name the routes their routers serve.
    let http: Vec<&Group> = groups.iter().filter(|g| g.kind == "http").collect();
    assert_eq!(http.len(), 4, "dashboard, metrics, prometheus, promql");
    assert!(http.iter().all(|g| !g.routes.is_empty()));
}

/// The test of the static census: a copy of the table with one door removed, or one door
/// renamed to an RPC that does not exist, or an HTTP route served without a door, is reported,
/// and exactly that.
#[test]
fn the_static_census_reports_exactly_a_door_removed_from_the_table() {
    let rpcs = fds_rpcs();
    let groups = binary_doors();
    assert!(static_problems(&rpcs, &groups).is_empty());
    for victim in [
        "/gma.v1.Archive/Query",
        "/gma.raft.v1.Raft/Forward",
        "/gma.v1.Clique/Status",
    ] {
        let mut cut = groups.clone();
        for g in &mut cut {
            g.doors.retain(|d| d.door != victim);
        }
        assert_eq!(
            static_problems(&rpcs, &cut),
            vec![Problem::RpcWithoutDoor(victim.to_string())],
            "removing {victim}"
        );
    }
    // A door for an RPC that does not exist.
    let mut renamed = groups.clone();
    renamed[0].doors[0].door = "/gma.v1.Directory/Backdoor".into();
    let first = groups[0].doors[0].door.clone();
    assert_eq!(
        static_problems(&rpcs, &renamed),
        vec![
            Problem::RpcWithoutDoor(first),
            Problem::NoSuchRpc("/gma.v1.Directory/Backdoor".into())
        ]
    );
    // A new RPC in the descriptor set without a door.
    let mut more = rpcs.clone();
    more.push("/gma.v1.Archive/Delete".into());
    assert_eq!(
        static_problems(&more, &groups),
        vec![Problem::RpcWithoutDoor("/gma.v1.Archive/Delete".into())]
    );
    // An HTTP route served without a door, and a door without its route.
    let mut routed = groups.clone();
    let dash = routed.iter_mut().find(|g| g.name == "dashboard").unwrap();
    dash.routes.push("GET /api/raw".into());
    dash.doors.retain(|d| d.door != "GET /api/events");
    assert_eq!(
        static_problems(&rpcs, &routed),
        vec![
            Problem::RouteWithoutDoor {
                group: "dashboard".into(),
                route: "GET /api/events".into()
            },
            Problem::RouteWithoutDoor {
                group: "dashboard".into(),
                route: "GET /api/raw".into()
            },
        ]
    );
    // A door guarded by nothing that carries data.
    let mut open = groups.clone();
    let d = open[1]
        .doors
        .iter_mut()
        .find(|d| d.door == "/gma.v1.Producer/Query")
        .unwrap();
    d.actions.clear();
    assert_eq!(
        static_problems(&rpcs, &open),
        vec![Problem::OpenDoorClaimsNothing("/gma.v1.Producer/Query".into())]
    );
}

/// The door table of docs/security.md is `gma doors --output markdown`.
#[test]
fn the_door_table_of_docs_security_md_is_the_doors_lists() {
    let r = gma(&["doors", "--output", "markdown"], Duration::from_secs(30));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let begin = "<!-- doors: begin (gma doors --output markdown) -->\n";
    let end = "<!-- doors: end -->";
    let (Some(a), Some(b)) = (doc.find(begin), doc.find(end)) else {
        panic!("docs/security.md has no {begin:?} ... {end:?} block");
    };
    let table = &doc[a + begin.len()..b];
    assert!(
        table == r.stdout,
        "the door table of docs/security.md differs from the roles' DOORS: replace the block with \
         the output of `gma doors --output markdown`:\n{}",
        r.stdout
    );
}

/// The test of the detectors: raw answers of every kind are flagged, summary ones pass, and the
/// verdict turns raw data to a summary-only identity into a failure.
#[test]
fn the_raw_data_detectors_flag_raw_answers_and_pass_summaries() {
    // Events and batches.
    assert_eq!(
        raw_names(["host.load", "host.load.avg1m", "host.cpu.avg10m"]),
        vec!["host.load".to_string()]
    );
    let q = |name: &str| pb::QueryResponse {
        events: vec![event(name)],
        ..Default::default()
    };
    assert_eq!(query_raw(&q("host.load")), vec!["host.load".to_string()]);
    assert!(query_raw(&q("host.load.avg1m")).is_empty());
    let batch = |name: &str| pb::EventBatch {
        series: vec![pb::SeriesDecl {
            id: 7,
            name: name.into(),
            ..Default::default()
        }],
        series_ids: vec![7, 7],
        ..Default::default()
    };
    let mut decls = HashMap::new();
    assert_eq!(
        batch_raw(&mut decls, &batch("host.cpu")),
        vec!["host.cpu".to_string()]
    );
    assert!(batch_raw(&mut HashMap::new(), &batch("host.cpu.avg1m")).is_empty());
    // A series declared in an earlier batch, or never: still raw.
    let later = pb::EventBatch {
        series_ids: vec![7, 9],
        ..Default::default()
    };
    assert_eq!(
        batch_raw(&mut decls, &later),
        vec!["host.cpu".to_string(), "undeclared series 9".to_string()]
    );
    // Archived points and listings.
    let points = |name: &str| pb::ArchiveQueryResponse {
        series: vec![pb::SeriesPoints {
            name: name.into(),
            timestamps_ns: vec![1],
            values: vec![1.5],
            ..Default::default()
        }],
    };
    assert_eq!(archive_raw(&points("host.load")), vec!["host.load".to_string()]);
    assert!(archive_raw(&points("host.load.avg60m")).is_empty());
    // The dashboard: a snapshot with host charts, and one filtered for a summary-only viewer.
    let raw_snapshot = serde_json::json!({
        "type": "snapshot", "records": [], "cluster": null,
        "hosts": [{"host": "h1", "series": {"load": [[1000, 1.5]], "cpu": []}}],
        "decisions": [], "rpc": [{"source": "producer@x"}], "federation": []
    });
    assert_eq!(
        raw_in_dashboard_json(&raw_snapshot),
        vec![
            "host name h1".to_string(),
            "chart points load of h1".to_string(),
            "gma.rpc rows".to_string()
        ]
    );
    let filtered = serde_json::json!({
        "type": "snapshot", "records": [{"id": "p"}], "cluster": null, "hosts": [],
        "decisions": [], "rpc": [], "federation": []
    });
    assert!(raw_in_dashboard_json(&filtered).is_empty());
    let sse = format!(
        "event: message\ndata: {filtered}\n\ndata: {{\"type\":\"points\",\"points\":[[\"h1\",\"load\",1000,1.5]]}}\n\n"
    );
    assert_eq!(raw_in_sse(&sse), vec!["chart points".to_string()]);
    assert!(raw_in_sse(&format!("data: {filtered}\n\n")).is_empty());
    assert_eq!(
        dashboard_json(r#"{"series":[{"name":"host.load","t":[1],"v":[1.5]}]}"#),
        vec!["host.load".to_string()]
    );
    assert!(dashboard_json(r#"{"series":[{"name":"host.load.avg1m","t":[1],"v":[1.5]}]}"#).is_empty());
    // Prometheus scrapes.
    let scrape = "# HELP x\n# TYPE gma_host_load_load1 gauge\ngma_host_load_load1{source=\"h1\"} 1.5\n\
                  gma_host_load_avg1m_load1{source=\"h1\"} 1.4\n";
    assert_eq!(
        raw_in_sensor_scrape(scrape),
        vec!["gma_host_load_load1".to_string()]
    );
    assert!(raw_in_sensor_scrape("gma_host_load_avg1m_load1{source=\"h1\"} 1.4\n").is_empty());
    // When a series was last sampled is told per series: raw for a raw series only.
    assert_eq!(
        raw_in_sensor_scrape(
            "gma_event_timestamp_seconds{name=\"host.load\",source=\"h1\"} 3\n\
             gma_event_timestamp_seconds{name=\"host.load.avg1m\",source=\"h1\"} 3\n"
        ),
        vec!["gma_event_timestamp_seconds{name=\"host.load\"}".to_string()]
    );
    assert_eq!(raw_in_role_scrape(scrape).len(), 2);
    assert!(raw_in_role_scrape("gma_producer_rpc_requests_total{method=\"x\"} 3\n").is_empty());
    // The verdict.
    let door = DoorRow {
        group: "producer".into(),
        kind: "grpc".into(),
        door: "/gma.v1.Producer/Query".into(),
        peers: "any".into(),
        actions: vec!["producer.query".into()],
        summary_only: "only when every pattern is a summary name".into(),
    };
    let raw = Outcome::Served {
        raw: vec!["host.load".into()],
        note: String::new(),
    };
    let clean = Outcome::Served {
        raw: vec![],
        note: String::new(),
    };
    assert!(verdict(&door, Who::Outsider, false, &raw).is_err());
    assert!(verdict(&door, Who::WrongOrg, false, &raw).is_err());
    assert!(verdict(&door, Who::Outsider, false, &clean).is_ok());
    assert!(verdict(&door, Who::NoCert, false, &clean).is_err());
    assert!(verdict(&door, Who::NoCert, false, &Outcome::Handshake("alert".into())).is_ok());
    assert!(verdict(&door, Who::Inside, true, &clean).is_err());
    assert!(verdict(&door, Who::Inside, true, &raw).is_ok());
    let denied = Outcome::Status(tonic::Code::PermissionDenied, "no".into());
    assert!(verdict(&door, Who::Inside, false, &denied).is_err());
    let mut strict = door.clone();
    strict.summary_only = "PERMISSION_DENIED: ...".into();
    assert!(verdict(&strict, Who::Outsider, false, &clean).is_err());
    assert!(verdict(&strict, Who::Outsider, false, &denied).is_ok());
}

/// Starts every role of the census with mTLS and [`CENSUS_POLICY`], waits until they hold
/// data, and returns their addresses.
fn start_fabric() -> Fabric {
    let site = Arc::new(Secure::with_policy(
        CENSUS_POLICY,
        &[("ca", "dir-evil", "partner")],
    ));
    let write = |name: &str, text: String| {
        let p = site.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let dcfg = write(
        "directory.toml",
        format!(
            "data_dir = \"{}\"\nlisten = \"127.0.0.1:0\"\n[[members]]\nid = 1\ncn = \"node1\"\norg = \"site1\"\n",
            site.path("dir-data")
        ),
    );
    let dir = site.start(&["directory", "--config", &dcfg], "gma directory listening on");
    let d = dir.addr.clone();
    let relay_cfg = write(
        "relay.toml",
        "site = \"census\"\nperiod_ms = 200\nrelay = [\"host.*\"]\n".into(),
    );
    let monitor_cfg = write(
        "monitor.toml",
        "[[rule]]\nname = \"hot\"\nevents = [\"host.load\"]\nwhen = \"load1 > 1000\"\ncommand = [\"true\"]\n"
            .into(),
    );
    let simres_cfg = write(
        "simres.toml",
        "[[resource]]\nname = \"h1\"\ncpus = 4\n[[resource]]\nname = \"h2\"\ncpus = 8\n".into(),
    );
    let fed_cfg = write(
        "federation.toml",
        "site = \"census\"\nheartbeat_ms = 200\nsummary_interval_ms = 500\nlease_ttl_ms = 2000\n\
         [[peer]]\nsite = \"node1\"\nendpoint = \"127.0.0.1:9\"\nrole = \"peer\"\n"
            .into(),
    );
    let producer_cmd = site.producer_cmd(&d);
    let arch_data = site.path("archive");
    let any = "127.0.0.1:0";
    // (target, args, marker): started side by side once the directory runs.
    let roles: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "producer",
            producer_cmd
                .iter()
                .cloned()
                .chain(["--prometheus".into(), any.into()])
                .chain(["--otlp-listen".into(), any.into()])
                .collect(),
            "gma producer listening on",
        ),
        (
            "archiver",
            [
                "archiver",
                "--listen",
                any,
                "--directory",
                &d,
                "--data",
                &arch_data,
                "--metrics-listen",
                any,
                "--http-listen",
                any,
            ]
            .map(String::from)
            .to_vec(),
            "gma archiver listening on",
        ),
        (
            "broker",
            ["broker", "--listen", any, "--directory", &d]
                .map(String::from)
                .to_vec(),
            "gma broker listening on",
        ),
        (
            "simres",
            [
                "simres",
                "--config",
                &simres_cfg,
                "--listen",
                any,
                "--directory",
                &d,
            ]
            .map(String::from)
            .to_vec(),
            "gma simres listening on",
        ),
        (
            "netprobe",
            ["netprobe", "--listen", any, "--directory", &d, "--site", "census"]
                .map(String::from)
                .to_vec(),
            "gma netprobe listening on",
        ),
        (
            "federation",
            [
                "federation",
                "--config",
                &fed_cfg,
                "--directory",
                &d,
                "--listen",
                any,
            ]
            .map(String::from)
            .to_vec(),
            "gma federation listening on",
        ),
        (
            "sink",
            ["sink", "--directory", &d, "--accept", "host.load"]
                .map(String::from)
                .to_vec(),
            "gma sink listening on",
        ),
        (
            "relay",
            [
                "relay",
                "--listen",
                any,
                "--directory",
                &d,
                "--config",
                &relay_cfg,
            ]
            .map(String::from)
            .to_vec(),
            "gma relay listening on",
        ),
        (
            "monitor",
            [
                "monitor",
                "--listen",
                any,
                "--directory",
                &d,
                "--config",
                &monitor_cfg,
            ]
            .map(String::from)
            .to_vec(),
            "gma monitor listening on",
        ),
        (
            "rescheduler",
            ["rescheduler", "--listen", any, "--directory", &d]
                .map(String::from)
                .to_vec(),
            "gma rescheduler listening on",
        ),
    ];
    let started: Vec<(String, Proc)> = std::thread::scope(|s| {
        let hs: Vec<_> = roles
            .iter()
            .map(|(t, args, marker)| {
                let site = &site;
                s.spawn(move || {
                    let a: Vec<&str> = args.iter().map(String::as_str).collect();
                    (t.to_string(), site.start(&a, marker))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut addrs: BTreeMap<String, String> =
        started.iter().map(|(t, p)| (t.clone(), p.addr.clone())).collect();
    addrs.insert("directory".into(), d.clone());
    let get = |t: &str| started.iter().find(|(n, _)| n == t).map(|(_, p)| p).unwrap();
    addrs.insert(
        "prometheus".into(),
        printed_addr(get("producer"), "producer", "prometheus"),
    );
    addrs.insert("otlp".into(), printed_addr(get("producer"), "producer", "otlp"));
    addrs.insert(
        "metrics@archiver".into(),
        printed_addr(get("archiver"), "archiver", "metrics"),
    );
    addrs.insert(
        "promql@archiver".into(),
        printed_addr(get("archiver"), "archiver", "promql"),
    );
    let prod = addrs["producer"].clone();
    let arch = addrs["archiver"].clone();
    let dash = site.start(
        &[
            "dashboard",
            "--listen",
            any,
            "--directory",
            &d,
            "--archiver",
            &arch,
            "--metrics-listen",
            any,
        ],
        "gma dashboard listening on",
    );
    addrs.insert("dashboard".into(), dash.addr.clone());
    addrs.insert(
        "metrics@dashboard".into(),
        printed_addr(&dash, "dashboard", "metrics"),
    );
    let app = site.start(
        &[
            "app-sim",
            "--app-id",
            "census-app",
            "--phases",
            "100000",
            "--predicted-s",
            "1",
            "--host",
            "h1",
            "--producer",
            &prod,
            "--listen",
            any,
        ],
        "gma app-sim listening on",
    );
    addrs.insert("app-sim".into(), app.addr.clone());
    let mut procs: Vec<Proc> = started.into_iter().map(|(_, p)| p).collect();
    procs.extend([dir, dash, app]);

    // Wait until the data doors hold data for the inside user, and take a lease for alice.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let alice = |addr: &str| rt.block_on(channel(&site, addr, Who::Inside));
    let mut lease = 0;
    let ok = wait_until(Duration::from_secs(60), || {
        let Ok(ch) = alice(&d) else { return false };
        rt.block_on(async {
            pb::directory_client::DirectoryClient::new(ch)
                .register(pb::RegisterRequest {
                    record: Some(record("census-lease")),
                    schemas: vec![schema("census.knock")],
                    lease_ttl_ms: 600_000,
                })
                .await
                .map(|r| lease = r.into_inner().lease_id)
                .is_ok()
        })
    });
    assert!(
        ok,
        "alice could not register: {}",
        procs.last().unwrap().stderr_text()
    );
    // A reservation in the calendar, so the inside user's List has raw rows to show.
    let ok = wait_until(Duration::from_secs(60), || {
        let Ok(ch) = alice(&addrs["simres"]) else {
            return false;
        };
        rt.block_on(async {
            pb::reservations_client::ReservationsClient::new(ch)
                .reserve(pb::ReserveRequest {
                    resource: "h2".into(),
                    cpus: 1,
                    duration_s: 60,
                    earliest_start_s: now_s() + 7200,
                    latest_start_s: now_s() + 9000,
                    ..Default::default()
                })
                .await
                .is_ok_and(|r| r.into_inner().reservation.is_some())
        })
    });
    assert!(ok, "alice could not reserve at the simres");
    for t in ["producer", "relay"] {
        let ok = wait_until(Duration::from_secs(60), || {
            let Ok(ch) = alice(&addrs[t]) else { return false };
            rt.block_on(async {
                pb::producer_client::ProducerClient::new(ch)
                    .query(pb::QueryRequest {
                        patterns: vec!["host.*".into()],
                        ..Default::default()
                    })
                    .await
                    .is_ok_and(|r| !r.into_inner().events.is_empty())
            })
        });
        assert!(ok, "the {t} never served host.* to alice");
    }
    let ok = wait_until(Duration::from_secs(60), || {
        let Ok(ch) = alice(&arch) else { return false };
        rt.block_on(async {
            let now = gma_core::time::now_ns();
            let Ok(r) = pb::archive_client::ArchiveClient::new(ch)
                .query(pb::ArchiveQueryRequest {
                    pattern: "host.load".into(),
                    from_ns: now - 600_000_000_000,
                    to_ns: now + 60_000_000_000,
                    ..Default::default()
                })
                .await
            else {
                return false;
            };
            matches!(r.into_inner().message().await, Ok(Some(m)) if !m.series.is_empty())
        })
    });
    assert!(ok, "the archiver never held host.load");
    let ok = wait_until(Duration::from_secs(60), || {
        let Ok(ch) = alice(&addrs["broker"]) else {
            return false;
        };
        rt.block_on(async {
            pb::broker_client::BrokerClient::new(ch)
                .view(pb::BrokerViewRequest::default())
                .await
                .is_ok_and(|r| !r.into_inner().resources.is_empty())
        })
    });
    assert!(ok, "the broker's view never held a host");
    let ok = wait_until(Duration::from_secs(60), || {
        https(
            &site,
            &addrs["dashboard"],
            "/api/snapshot",
            Some("alice"),
            &[],
            whole,
        )
        .is_ok_and(|(s, b)| s == 200 && dashboard_json(&b).iter().any(|r| r.starts_with("chart points")))
    });
    assert!(ok, "the dashboard never showed alice a chart point");
    let ok = wait_until(Duration::from_secs(60), || {
        https(&site, &addrs["prometheus"], "/metrics", Some("alice"), &[], whole)
            .is_ok_and(|(s, b)| s == 200 && !raw_in_sensor_scrape(&b).is_empty())
    });
    assert!(ok, "the producer's --prometheus never served alice a gauge");
    Fabric {
        site,
        addrs,
        lease,
        _procs: procs,
    }
}

#[test]
fn every_door_refuses_strangers_and_never_serves_raw_data_to_summary_only_identities() {
    let fabric = start_fabric();
    let doors = all_doors();
    let knocks = knocks(fabric.lease);
    // Every door of the binary is knocked on.
    for d in &doors {
        assert!(
            knocks.iter().any(|k| k.door == d.door),
            "the census does not knock on {} ({})",
            d.door,
            d.group
        );
    }
    let results = run_census(&fabric.site, &fabric.addrs, knocks, &doors);
    let failed = failures(&results);
    assert!(
        failed.is_empty(),
        "the door census failed {} knock(s):\n{}",
        failed.len(),
        report(&results)
    );
    eprintln!("{}", report(&results));
}

/// The test of the dynamic census: a producer serving with its checks off (mTLS, but no
/// policy: everyone the CA certified may do everything) is caught serving raw data to the
/// summary-only identities, on exactly the doors that carry it.
#[test]
fn the_census_catches_a_producer_serving_raw_data_without_its_policy() {
    let site = Arc::new(Secure::with_policy(
        CENSUS_POLICY,
        &[("ca", "dir-evil", "partner")],
    ));
    let sim = sim_file(&site.dir, "h", 2, 100);
    let args = [
        "producer",
        "--listen",
        "127.0.0.1:0",
        "--no-host-sensors",
        "--simulate",
        sim.to_str().unwrap(),
        "--tls-ca",
        &site.path("ca/ca.pem"),
        "--tls-cert",
        &site.path("certs/node1.pem"),
        "--tls-key",
        &site.path("certs/node1.key"),
        "--tls-client-ca",
        &site.path("ca/ca.pem"),
    ];
    let open = Proc::start(&args, "gma producer listening on");
    let addrs: BTreeMap<String, String> = [("producer".to_string(), open.addr.clone())].into();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ok = wait_until(Duration::from_secs(30), || {
        rt.block_on(async {
            let Ok(ch) = channel(&site, &open.addr, Who::Inside).await else {
                return false;
            };
            pb::producer_client::ProducerClient::new(ch)
                .query(pb::QueryRequest {
                    patterns: vec!["host.*".into()],
                    ..Default::default()
                })
                .await
                .is_ok_and(|r| !r.into_inner().events.is_empty())
        })
    });
    assert!(ok, "the producer never held host events");
    let results = run_census(&site, &addrs, producer_knocks("producer", true), &all_doors());
    let raw: std::collections::BTreeSet<(String, Who)> = failures(&results)
        .into_iter()
        .filter(|f| f.2.starts_with("RAW DATA"))
        .map(|f| (f.0, f.1))
        .collect();
    let want: std::collections::BTreeSet<(String, Who)> = [
        "/gma.v1.Producer/Query [host.*] @ producer",
        "/gma.v1.Producer/Query [*] @ producer",
        "/gma.v1.Producer/Subscribe [host.*] @ producer",
    ]
    .iter()
    .flat_map(|k| [(k.to_string(), Who::Outsider), (k.to_string(), Who::WrongOrg)])
    .collect();
    assert_eq!(raw, want, "{}", report(&results));
    // And the doors that refuse summary-only identities are reported as not refusing.
    let not_refused: Vec<String> = failures(&results)
        .into_iter()
        .filter(|f| f.1 == Who::Outsider && f.2.starts_with("the door says"))
        .map(|f| f.0)
        .collect();
    for door in [
        "/gma.v1.Ingest/Push",
        "/gma.v1.Ingest/Schema",
        "/gma.v1.Simulator/Set",
    ] {
        assert!(
            not_refused.iter().any(|k| k.starts_with(door)),
            "{door} not reported: {}",
            report(&results)
        );
    }
    drop(open);
}
