//! The door census kit (tests/tests/census.rs): the doors of the `gma` binary (`gma doors
//! --output json`), the static check of every RPC of `gma_proto::FILE_DESCRIPTOR_SET` and every
//! HTTP route against them, the identities the census knocks as, what a knock returned
//! ([`Outcome`]), what counts as raw data in a response (the `raw_*` detectors) and the verdict
//! on each knock ([`verdict`]).
//!
//! **Raw data**, concretely: the values of an event series that is not a summary
//! (`host.load`, `host.cpu`, `gma.rpc`, `net.probe`, `reservation.state`, `app.state` — anything
//! but `<name>.avg1m`, `.avg10m`, `.avg60m`): a gRPC `Event` or `EventBatch` of such a series,
//! archived points or a listed series of such a name, the broker's view of hosts, the calendars
//! of a resource manager, a netprobe's `net.probe` counters, an application's status; in the
//! dashboard's JSON and SSE, host names and chart points, `gma.rpc`, decision and federation
//! rows; in a Prometheus scrape, a gauge of such a series (the producer's `--prometheus`) or
//! any `gma_host_*` / `gma_net_*` gauge (the roles' `/metrics`). Records, schemas, versions,
//! cluster status, counters and derived answers (rankings, site summaries) are not raw data.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use gma_core::authz::is_summary_name;
use serde_json::Value;

use crate::*;

/// One door as `gma doors --output json` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorRow {
    pub group: String,
    pub kind: String,
    pub door: String,
    pub peers: String,
    pub actions: Vec<String>,
    pub summary_only: String,
}

impl DoorRow {
    /// Nothing but the listener's TLS guards it (it must carry no data).
    pub fn is_open(&self) -> bool {
        self.peers == "any" && self.actions.is_empty()
    }

    /// The door says a summary-only identity is refused there.
    pub fn refuses_summary_only(&self) -> bool {
        self.summary_only.starts_with("PERMISSION_DENIED") || self.peers != "any"
    }

    /// `GET /metrics (--metrics-listen)` -> `GET /metrics`; RPC paths unchanged.
    pub fn route(&self) -> &str {
        match self.door.find(" (") {
            Some(i) if self.kind == "http" => &self.door[..i],
            _ => &self.door,
        }
    }
}

/// One group of doors (a service set, an HTTP endpoint) and the routes its router serves.
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    pub kind: String,
    pub routes: Vec<String>,
    pub doors: Vec<DoorRow>,
}

/// The doors of the `gma` binary under test.
pub fn binary_doors() -> Vec<Group> {
    let r = gma(&["doors", "--output", "json"], Duration::from_secs(30));
    assert_eq!(r.code, 0, "gma doors: {}", r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).expect("gma doors --output json is JSON");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    v.as_array()
        .expect("an array of groups")
        .iter()
        .map(|g| {
            let name = g["group"].as_str().unwrap_or_default().to_string();
            let kind = g["kind"].as_str().unwrap_or_default().to_string();
            let doors = g["doors"]
                .as_array()
                .expect("doors")
                .iter()
                .map(|d| DoorRow {
                    group: name.clone(),
                    kind: kind.clone(),
                    door: d["door"].as_str().unwrap_or_default().to_string(),
                    peers: d["peers"].as_str().unwrap_or_default().to_string(),
                    actions: strings(&d["actions"]),
                    summary_only: d["summary_only"].as_str().unwrap_or_default().to_string(),
                })
                .collect();
            Group {
                routes: strings(&g["routes"]),
                name,
                kind,
                doors,
            }
        })
        .collect()
}

/// What the static census found wrong.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// An RPC of the descriptor set without a door: no authorization decision is written down.
    RpcWithoutDoor(String),
    /// A door naming an RPC that does not exist.
    NoSuchRpc(String),
    /// An HTTP route a router serves without a door.
    RouteWithoutDoor { group: String, route: String },
    /// An HTTP door its router does not serve.
    NoSuchRoute { group: String, door: String },
    /// The same door listed twice.
    Duplicate(String),
    /// A door guarded by nothing that does not say it serves no data.
    OpenDoorClaimsNothing(String),
    /// A door whose summary-only answer is not written down.
    NoSummaryAnswer(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::RpcWithoutDoor(r) => write!(f, "RPC {r} has no door (add it to its service's DOORS)"),
            Problem::NoSuchRpc(d) => write!(f, "door {d} names no RPC of the descriptor set"),
            Problem::RouteWithoutDoor { group, route } => write!(f, "{group}: route {route} has no door"),
            Problem::NoSuchRoute { group, door } => write!(f, "{group}: door {door} is not a route"),
            Problem::Duplicate(d) => write!(f, "door {d} is listed twice"),
            Problem::OpenDoorClaimsNothing(d) => write!(
                f,
                "door {d} is guarded by nothing and does not say it is served without data (\"served ...\")"
            ),
            Problem::NoSummaryAnswer(d) => {
                write!(f, "door {d} does not say what a summary-only identity gets")
            }
        }
    }
}

/// The static census: every RPC (`/pkg.Service/Method`) has exactly one door and every gRPC
/// door is an RPC; every HTTP route of every group has a door and every HTTP door is a route;
/// every door says what a summary-only identity gets, and an unguarded one that it is served
/// without data. Sorted; empty when all is well.
pub fn static_problems(rpcs: &[String], groups: &[Group]) -> Vec<Problem> {
    let mut out = BTreeSet::new();
    let rpc_set: BTreeSet<&str> = rpcs.iter().map(String::as_str).collect();
    let mut grpc_doors: BTreeMap<&str, usize> = BTreeMap::new();
    for g in groups {
        let mut http_doors: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &g.doors {
            if d.summary_only.trim().is_empty() {
                out.insert(Problem::NoSummaryAnswer(d.door.clone()));
            }
            if d.is_open() && !d.summary_only.starts_with("served") {
                out.insert(Problem::OpenDoorClaimsNothing(d.door.clone()));
            }
            if g.kind == "grpc" {
                *grpc_doors.entry(d.door.as_str()).or_default() += 1;
                if !rpc_set.contains(d.door.as_str()) {
                    out.insert(Problem::NoSuchRpc(d.door.clone()));
                }
            } else {
                *http_doors.entry(d.route()).or_default() += 1;
                if !g.routes.iter().any(|r| r == d.route()) {
                    out.insert(Problem::NoSuchRoute {
                        group: g.name.clone(),
                        door: d.door.clone(),
                    });
                }
            }
        }
        for route in &g.routes {
            if g.kind == "http" && !http_doors.contains_key(route.as_str()) {
                out.insert(Problem::RouteWithoutDoor {
                    group: g.name.clone(),
                    route: route.clone(),
                });
            }
        }
        for (door, n) in http_doors {
            if n > 1 {
                out.insert(Problem::Duplicate(format!("{}: {door}", g.name)));
            }
        }
    }
    for rpc in rpcs {
        match grpc_doors.get(rpc.as_str()) {
            None => {
                out.insert(Problem::RpcWithoutDoor(rpc.clone()));
            }
            Some(n) if *n > 1 => {
                out.insert(Problem::Duplicate(rpc.clone()));
            }
            Some(_) => {}
        }
    }
    out.into_iter().collect()
}

/// Who knocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Who {
    /// (a) TLS without a client certificate.
    NoCert,
    /// (b) a certificate of another CA (`eve`, org `site1`).
    OtherCa,
    /// (c) the summary-only outsider (`bob`, org `partner`).
    Outsider,
    /// (d) an inside user (`alice`, org `site1`).
    Inside,
    /// (e) a member certificate of the wrong organization (`CN=dir-evil, O=partner`).
    WrongOrg,
    /// The roles' own certificate (`node1`, org `site1`): the directory member and the linked
    /// site of the doors only those may use.
    Member,
}

impl Who {
    pub const ALL: [Who; 6] = [
        Who::NoCert,
        Who::OtherCa,
        Who::Outsider,
        Who::Inside,
        Who::WrongOrg,
        Who::Member,
    ];

    /// The certificate under the site's `certs/` (and its CA directory).
    pub fn cert(self) -> Option<(&'static str, &'static str)> {
        match self {
            Who::NoCert => None,
            Who::OtherCa => Some(("other-ca", "eve")),
            Who::Outsider => Some(("ca", "bob")),
            Who::Inside => Some(("ca", "alice")),
            Who::WrongOrg => Some(("ca", "dir-evil")),
            Who::Member => Some(("ca", "node1")),
        }
    }

    pub fn column(self) -> &'static str {
        match self {
            Who::NoCert => "a:no-cert",
            Who::OtherCa => "b:other-CA",
            Who::Outsider => "c:outsider",
            Who::Inside => "d:inside",
            Who::WrongOrg => "e:dir-evil",
            Who::Member => "m:member",
        }
    }
}

/// What one knock returned.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// No TLS session: the handshake (or the connection right after it) was refused.
    Handshake(String),
    /// A gRPC status other than OK.
    Status(tonic::Code, String),
    /// An HTTP answer other than 2xx.
    Http(u16, String),
    /// Served (gRPC OK, HTTP 2xx): the raw data found in the answer (empty: none) and a note
    /// on what came back.
    Served { raw: Vec<String>, note: String },
}

impl Outcome {
    /// A short cell of the results table.
    pub fn cell(&self) -> String {
        match self {
            Outcome::Handshake(_) => "TLS-refused".into(),
            Outcome::Status(c, _) => format!("{c:?}"),
            Outcome::Http(s, _) => format!("HTTP {s}"),
            Outcome::Served { raw, .. } if raw.is_empty() => "served".into(),
            Outcome::Served { raw, .. } => format!("served RAW({})", raw.len()),
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Outcome::Handshake(m) => format!("handshake refused: {}", clip(m)),
            Outcome::Status(c, m) => format!("{c:?}: {}", clip(m)),
            Outcome::Http(s, b) => format!("HTTP {s}: {}", clip(b)),
            Outcome::Served { raw, note } => format!("served ({}); raw data: {raw:?}", clip(note)),
        }
    }

    fn refused(&self) -> bool {
        matches!(
            self,
            Outcome::Handshake(_)
                | Outcome::Status(tonic::Code::Unauthenticated | tonic::Code::PermissionDenied, _)
                | Outcome::Http(401 | 403, _)
        )
    }

    fn denied(&self) -> bool {
        matches!(
            self,
            Outcome::Status(tonic::Code::PermissionDenied, _) | Outcome::Http(403, _)
        )
    }
}

fn clip(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.len() > 300 {
        let mut end = 300;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    } else {
        s
    }
}

/// The census's judgement of one knock; `Err` says what is wrong. `inside_raw`: the inside
/// user must receive raw data there (the detectors are shown to see it on a live answer).
pub fn verdict(door: &DoorRow, who: Who, inside_raw: bool, got: &Outcome) -> Result<(), String> {
    let guarded_by_peers = door.peers != "any";
    match who {
        Who::NoCert | Who::OtherCa => {
            if got.refused() {
                Ok(())
            } else {
                Err(format!("not refused: {}", got.detail()))
            }
        }
        Who::Outsider | Who::WrongOrg => {
            if let Outcome::Served { raw, .. } = got {
                if !raw.is_empty() {
                    return Err(format!("RAW DATA to a summary-only identity: {raw:?}"));
                }
            }
            if let Outcome::Handshake(m) = got {
                return Err(format!(
                    "a certificate of the CA was refused at the handshake: {m}"
                ));
            }
            if door.refuses_summary_only() && !got.denied() {
                return Err(format!(
                    "the door says {:?} but the answer is {}",
                    door.summary_only,
                    got.detail()
                ));
            }
            Ok(())
        }
        Who::Inside | Who::Member => {
            if who == Who::Inside && guarded_by_peers {
                // alice is neither a directory member nor a linked site.
                return if got.denied() {
                    Ok(())
                } else {
                    Err(format!("served to a non-member: {}", got.detail()))
                };
            }
            match got {
                Outcome::Served { raw, note } => {
                    if inside_raw && raw.is_empty() {
                        Err(format!(
                            "no raw data found in the inside user's answer ({})",
                            clip(note)
                        ))
                    } else {
                        Ok(())
                    }
                }
                Outcome::Status(c, m) => match c {
                    tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied
                    | tonic::Code::Unimplemented
                    | tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::DeadlineExceeded => Err(format!("not served: {c:?}: {m}")),
                    _ if inside_raw => Err(format!("no raw data for the inside user: {c:?}: {m}")),
                    _ => Ok(()),
                },
                Outcome::Http(s, b)
                    if (400..500).contains(s) && ![401, 403, 404].contains(s) && !inside_raw =>
                {
                    let _ = b;
                    Ok(())
                }
                other => Err(format!("not served: {}", other.detail())),
            }
        }
    }
}

/// Non-summary event names among `names`: raw data when values come with them.
pub fn raw_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| !is_summary_name(n))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Raw data in an answer of the archiver's Prometheus query API (`--http-listen`): a result
/// or a listed series whose `event` label is not a summary, or such a name among the values of
/// the `event` label.
pub fn raw_in_promql(text: &str) -> Vec<String> {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    let data = &v["data"];
    let items = data["result"].as_array().or(data.as_array());
    raw_names(items.into_iter().flatten().filter_map(|it| {
        it["metric"]["event"]
            .as_str()
            .or(it["event"].as_str())
            .or(it.as_str())
    }))
}

/// Raw data in a dashboard JSON document: a snapshot, one message of the live stream, a
/// history answer (`series` with points) or a series listing.
pub fn raw_in_dashboard_json(v: &Value) -> Vec<String> {
    let mut raw = Vec::new();
    let nonempty = |k: &str| v[k].as_array().is_some_and(|a| !a.is_empty());
    match v["type"].as_str() {
        Some("snapshot") => {
            for h in v["hosts"].as_array().into_iter().flatten() {
                let host = h["host"].as_str().unwrap_or("?");
                raw.push(format!("host name {host}"));
                for (metric, pts) in h["series"].as_object().into_iter().flatten() {
                    if pts.as_array().is_some_and(|p| !p.is_empty()) {
                        raw.push(format!("chart points {metric} of {host}"));
                    }
                }
            }
            for d in v["decisions"].as_array().into_iter().flatten() {
                raw.push(format!("decision {}", d["name"].as_str().unwrap_or("?")));
            }
            if nonempty("rpc") {
                raw.push("gma.rpc rows".into());
            }
            if nonempty("federation") {
                raw.push("federation.status rows".into());
            }
        }
        Some("points") if nonempty("points") => raw.push("chart points".into()),
        Some("decision") => raw.push(format!(
            "decision {}",
            v["decision"]["name"].as_str().unwrap_or("?")
        )),
        Some("rpc") if nonempty("rows") => raw.push("gma.rpc rows".into()),
        Some("federation") if nonempty("rows") => raw.push("federation.status rows".into()),
        Some("hosts_gone") if nonempty("hosts") => raw.push("host names".into()),
        Some(_) => {}
        None => {
            // /api/history and /api/archive/series: {"series": [{"name": ...}, ...]}
            let names = v["series"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["name"].as_str());
            raw.extend(raw_names(names));
        }
    }
    raw
}

/// Raw data in a server-sent-events stream of the dashboard (every `data:` line).
pub fn raw_in_sse(text: &str) -> Vec<String> {
    let mut raw = Vec::new();
    for line in text.lines() {
        if let Some(data) = line.strip_prefix("data:") {
            if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
                raw.extend(raw_in_dashboard_json(&v));
            }
        }
    }
    raw.sort();
    raw.dedup();
    raw
}

/// The metric names of the samples of a Prometheus scrape.
fn samples(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect()
}

/// Raw data in a scrape of the producer's `--prometheus` (sensor values): every gauge but those
/// of summary series (`gma_host_load_avg1m_load1`), and every `gma_event_timestamp_seconds`
/// whose `name` label is not a summary name.
pub fn raw_in_sensor_scrape(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let metric = line.split(['{', ' ']).next().unwrap_or(line);
        if metric == "gma_event_timestamp_seconds" {
            let name = line
                .split_once("name=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map_or("", |(n, _)| n);
            if !is_summary_name(name) {
                out.push(format!("{metric}{{name=\"{name}\"}}"));
            }
        } else if !["_avg1m_", "_avg10m_", "_avg60m_"]
            .iter()
            .any(|s| metric.contains(s))
        {
            out.push(metric.to_string());
        }
    }
    out.dedup();
    out
}

/// Whether the TLS listener at `addr` accepts `who` (a certificate under the site's `certs/`,
/// or none): a TLS handshake, then the HTTP/2 preface and an empty SETTINGS frame. A gRPC
/// server that accepted the certificate answers with its SETTINGS; one that refused it sends a
/// TLS alert (or closes). `Err` says why the connection was refused.
pub fn tls_probe(site: &super::secure::Secure, addr: &str, who: Option<&str>) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::io::{Read, Write};
    use tokio_rustls::rustls;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(site.dir.join("ca/ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match who {
        Some(w) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(site.dir.join(format!("certs/{w}.pem")))
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect();
            let key = PrivateKeyDer::from_pem_file(site.dir.join(format!("certs/{w}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from("127.0.0.1").unwrap().to_owned();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    tls.write_all(&hello)
        .map_err(|e| format!("handshake or write: {e}"))?;
    let mut buf = [0u8; 64];
    match tls.read(&mut buf) {
        Ok(0) => Err("closed without an answer".into()),
        // A SETTINGS frame: type 4 at byte 3.
        Ok(n) if n >= 9 && buf[3] == 4 => Ok(()),
        Ok(n) => Err(format!("not an HTTP/2 answer: {:?}", &buf[..n])),
        Err(e) => Err(e.to_string()),
    }
}

/// Raw data in a scrape of a role's `/metrics` (counters and latencies only): a host or network
/// sensor gauge.
pub fn raw_in_role_scrape(text: &str) -> Vec<String> {
    let mut out: Vec<String> = samples(text)
        .into_iter()
        .filter(|m| m.starts_with("gma_host_") || m.starts_with("gma_net_"))
        .map(str::to_string)
        .collect();
    out.dedup();
    out
}

/// Each identity's answer at one door and the verdict on it.
pub type Answers = BTreeMap<Who, (Outcome, Result<(), String>)>;

/// The results table: one row per knock, one column per identity; failures marked `!`.
pub fn table(rows: &[(String, Answers)]) -> String {
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(10).max(10);
    let mut out = format!("{:<width$}", "door [variant] @ role");
    for w in Who::ALL {
        out.push_str(&format!(" | {:<18}", w.column()));
    }
    out.push('\n');
    for (name, cells) in rows {
        out.push_str(&format!("{name:<width$}"));
        for w in Who::ALL {
            let cell = match cells.get(&w) {
                Some((o, Ok(()))) => o.cell(),
                Some((o, Err(_))) => format!("!{}", o.cell()),
                None => "-".into(),
            };
            out.push_str(&format!(" | {cell:<18}"));
        }
        out.push('\n');
    }
    out
}
