//! gma-dashboard: the live web dashboard, a GMA "real-time monitor".
//!
//! The dashboard is one consumer of the fabric however many browsers watch: it follows the
//! directory (Watch: producers and consumers appearing and leaving; ClusterStatus: members and
//! leader), subscribes once to the events it shows (host load, CPU, memory and network,
//! `*.decision`, `gma.rpc`, `federation.status`, `job.batch`), reduces them to small JSON
//! messages ([`model`]), and fans each message out to every browser over server-sent events. Each message is framed once and
//! shared (`Bytes` through a bounded `tokio::sync::broadcast`); a browser that falls
//! behind the channel is sent a fresh snapshot instead of the messages it missed, so a slow
//! browser never grows the dashboard's memory.
//!
//! - [`model`]: the live state and the pure reductions to messages.
//! - [`feed`]: the tasks that read the fabric (Watch, ClusterStatus, one Subscriber).
//! - [`http`]: the page (embedded assets), `/api/events` (SSE), `/api/snapshot`,
//!   `/api/history` (archiver queries), `/metrics`.
//! - [`telemetry`]: the names of the Prometheus metrics this crate records.
//! - [`tls`]: HTTPS (rustls) when the config has a certificate and key, client certificates
//!   when it has a client CA; also used by the roles' Prometheus endpoints.
//! - [`auth`]: who is asking (client certificate, a trusted proxy's headers, a bearer token)
//!   and the policy's answer.
//! - [`view`]: what one identity may see of the live data (no raw host values to identities
//!   granted only summaries).
//!
//! [`run`] serves on a listener the caller bound (tests use port 0).

pub mod auth;
pub mod feed;
pub mod http;
pub mod model;
pub mod telemetry;
pub mod tls;
pub mod view;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

use crate::model::Model;

/// The events the dashboard subscribes to by default.
pub const DEFAULT_PATTERNS: &[&str] = &[
    "host.cpu",
    "host.mem",
    "host.net",
    "host.load",
    "broker.decision",
    "resched.decision",
    "gma.rpc",
    "federation.status",
    "job.batch",
];

/// Federation endpoints a dashboard walks at most.
pub const MAX_FEDERATION: usize = 16;

/// `gma dashboard --config FILE` (flags override).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// HTTP listen address (used by the binary).
    pub listen: String,
    /// Directory member(s), `a:1,b:2`.
    pub directory: Option<String>,
    /// An archiver's `Archive` address: enables the history panel.
    pub archiver: Option<String>,
    /// Event-name patterns subscribed to.
    pub patterns: Vec<String>,
    /// ClusterStatus polling period.
    pub cluster_poll_ms: u64,
    /// Federation endpoints whose hierarchy the page shows (each walked with
    /// `FederationStatus`, its superiors and inferiors; at most 16).
    pub federation: Vec<String>,
    /// How often the hierarchy is walked again.
    pub federation_poll_ms: u64,
    /// Chart points kept per host and metric (what a browser that connects starts with).
    pub history_points: usize,
    /// Messages buffered per browser before it is considered lagging (then sent a snapshot).
    pub broadcast_capacity: usize,
    /// Serve plain HTTP even though `[tls]` has a certificate (then only the identity of the
    /// dashboard's own connections into the fabric): behind an authenticating proxy on the
    /// same host.
    pub plain_http: bool,
    /// How browsers and scripts authenticate besides client certificates.
    pub auth: auth::AuthConfig,
    /// The shared endpoint keys ([`gma_core::endpoint::Endpoint`]), as the dashboard reads them:
    /// `[tls]` `cert` and `key` serve HTTPS, `client_ca` verifies browsers' client certificates
    /// (their identity for the policy), `ca` (with `cert`/`key` as the client identity) is the
    /// TLS of the connections to the directory, producers and archiver, `allow_plaintext`
    /// allows plain HTTP off loopback; `access_policy` is asked by every data route (without
    /// one the dashboard is open and serves on loopback only); `[limits]` caps the HTTP
    /// listener's connections and times its handshakes and headers; `metrics_listen` is where
    /// the binary also serves Prometheus `/metrics` (the dashboard serves it on its own port
    /// too). The dashboard publishes no `gma.rpc` events: `rpc_events_ms` is refused.
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            listen: "127.0.0.1:7500".into(),
            directory: None,
            archiver: None,
            patterns: DEFAULT_PATTERNS.iter().map(|s| s.to_string()).collect(),
            cluster_poll_ms: 1000,
            federation: Vec::new(),
            federation_poll_ms: 2000,
            history_points: 120,
            broadcast_capacity: 1024,
            plain_http: false,
            auth: Default::default(),
            endpoint: Default::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("invalid dashboard config: {0}")]
    Config(String),
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    /// The directory could not be reached, refused, or ended its watch: the feed retries, and
    /// the page shows the message (per member in the cluster view).
    #[error("{0}")]
    Directory(String),
}

/// The refusals of the HTTP routes, mapped to statuses in one place ([`IntoResponse`]): the
/// body is `{"error": message}`.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0}")]
    BadRequest(String),
    /// No identity (or an unusable one): 401, with `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthenticated(String),
    /// An identity the policy denies: 403, naming the rule.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// The archiver failed or could not be reached.
    #[error("{0}")]
    BadGateway(String),
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let code = match &self {
            HttpError::BadRequest(_) => StatusCode::BAD_REQUEST,
            HttpError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            HttpError::Forbidden(_) => StatusCode::FORBIDDEN,
            HttpError::NotFound(_) => StatusCode::NOT_FOUND,
            HttpError::BadGateway(_) => StatusCode::BAD_GATEWAY,
        };
        let body = axum::Json(serde_json::json!({ "error": self.to_string() }));
        if code == StatusCode::UNAUTHORIZED {
            (
                code,
                [(
                    axum::http::header::WWW_AUTHENTICATE,
                    "Bearer realm=\"gma dashboard\"",
                )],
                body,
            )
                .into_response()
        } else {
            (code, body).into_response()
        }
    }
}

impl DashboardConfig {
    pub fn validate(&self) -> Result<(), DashboardError> {
        let bad = |m: &str| Err(DashboardError::Config(m.into()));
        if self.directory.as_deref().is_none_or(|d| d.trim().is_empty()) {
            return bad("give the directory with --directory ADDR (or directory in --config)");
        }
        gma_core::pattern::event_patterns(&self.patterns)
            .map_err(|e| DashboardError::Config(e.to_string()))?;
        if self.cluster_poll_ms == 0 {
            return bad("cluster_poll_ms must be at least 1");
        }
        if self.federation.len() > MAX_FEDERATION {
            return bad("give at most 16 federation endpoints (federation)");
        }
        if self.federation.iter().any(|f| f.trim().is_empty()) {
            return bad("a federation endpoint is empty: give HOST:PORT");
        }
        if !(100..=3_600_000).contains(&self.federation_poll_ms) {
            return bad("federation_poll_ms must lie in 100..=3600000");
        }
        if self.history_points == 0 || self.history_points > 100_000 {
            return bad("history_points must lie in 1..=100000");
        }
        if self.broadcast_capacity == 0 || self.broadcast_capacity > 1 << 20 {
            return bad("broadcast_capacity must lie in 1..=1048576");
        }
        self.endpoint
            .validate()
            .map_err(|e| DashboardError::Config(e.to_string()))?;
        if self.endpoint.rpc_events_ms.is_some() {
            return bad("the dashboard publishes no gma.rpc events: leave out rpc_events_ms");
        }
        let tls = &self.endpoint.tls;
        if tls.cert.is_some() != tls.key.is_some() {
            return bad("give both a certificate and its key (--tls-cert and --tls-key)");
        }
        if tls.client_ca.is_some() && (tls.cert.is_none() || self.plain_http) {
            return bad("a client CA (--tls-client-ca) verifies browsers over HTTPS: give --tls-cert and --tls-key, without --plain-http");
        }
        Ok(())
    }

    /// True when the dashboard serves HTTPS.
    pub fn https(&self) -> bool {
        self.endpoint.tls.cert.is_some() && !self.plain_http
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    gma_core::time::now_ns() / 1_000_000
}

/// One broadcast message: its SSE bytes (encoded once) and the classes of data it holds
/// ([`view::classes`]), so that a viewer who may not see all of them gets a filtered copy.
#[derive(Debug, Clone)]
pub struct Frame {
    pub bytes: Bytes,
    pub classes: u16,
}

/// What the feeds and the HTTP handlers share.
pub struct Shared {
    model: Mutex<Model>,
    tx: broadcast::Sender<Frame>,
    archiver: Option<String>,
    metrics: Option<PrometheusHandle>,
    stop: watch::Receiver<bool>,
    status: Mutex<Value>,
    auth: auth::Auth,
}

/// One server-sent event carrying `v` (`data: <json>\n\n`; JSON has no raw newlines).
pub fn sse_frame(v: &Value) -> Bytes {
    let mut s = String::with_capacity(256);
    s.push_str("data: ");
    s.push_str(&v.to_string());
    s.push_str("\n\n");
    Bytes::from(s)
}

impl Shared {
    /// Applies `f` to the model and broadcasts the messages it returns, under the model's lock
    /// (so a browser's snapshot and the messages after it never overlap or miss).
    pub fn update(&self, f: impl FnOnce(&mut Model) -> Vec<Value>) {
        let mut m = self.model.lock();
        for msg in f(&mut m) {
            metrics::counter!(telemetry::MESSAGES).increment(1);
            // No receiver is fine: nobody watches right now.
            let _ = self.tx.send(Frame {
                bytes: sse_frame(&msg),
                classes: view::classes(&msg),
            });
        }
        metrics::gauge!(telemetry::HOSTS).set(m.host_count() as f64);
    }

    /// A subscription to the messages and the snapshot (as `view` may see it) they follow,
    /// taken atomically.
    pub fn subscribe(&self, view: &view::View) -> (broadcast::Receiver<Frame>, Bytes) {
        let m = self.model.lock();
        let rx = self.tx.subscribe();
        let mut snap = m.snapshot(now_ms());
        snap["status"] = self.status.lock().clone();
        view.filter(&mut snap);
        (rx, sse_frame(&snap))
    }

    /// The snapshot as `view` may see it.
    pub fn snapshot(&self, view: &view::View) -> Value {
        let mut snap = self.model.lock().snapshot(now_ms());
        snap["status"] = self.status.lock().clone();
        view.filter(&mut snap);
        snap
    }

    pub fn auth(&self) -> &auth::Auth {
        &self.auth
    }

    /// The state of an input (`directory`): `error` = None when it works.
    pub fn send_status(&self, input: &str, error: Option<&str>) {
        let v = {
            let mut st = self.status.lock();
            let new = match error {
                Some(e) => Value::String(e.to_string()),
                None => Value::Null,
            };
            if st.get(input) == Some(&new) {
                return;
            }
            st[input] = new;
            st.clone()
        };
        self.update(|_| vec![serde_json::json!({"type": "status", "status": v})]);
    }
}

/// Serves the dashboard on `listener` until `shutdown` resolves. `metrics` (the process's
/// Prometheus recorder) is served at `/metrics` when given.
pub async fn run(
    config: DashboardConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    metrics: Option<PrometheusHandle>,
) -> Result<(), DashboardError> {
    config.validate()?;
    let directory = config.directory.clone().unwrap_or_default();
    let bound = listener.local_addr()?;
    let policy = match &config.endpoint.access_policy {
        Some(p) => Some(gma_core::authz::Policy::load(p).map_err(|e| DashboardError::Config(e.to_string()))?),
        None => None,
    };
    if policy.is_none() && !bound.ip().is_loopback() {
        return Err(DashboardError::Config(format!(
            "without a policy the dashboard serves every fabric datum to whoever reaches it, so only on \
             loopback: {bound} is not; give --access-policy FILE (and a way to authenticate: \
             --tls-client-ca, [auth]) or listen on 127.0.0.1"
        )));
    }
    let client_ca = config
        .endpoint
        .tls
        .client_ca
        .as_deref()
        .filter(|_| config.https());
    let client_auth = match client_ca {
        None => tls::ClientAuth::None,
        Some(_) if config.auth.has_other_modes() => tls::ClientAuth::Optional,
        Some(_) => tls::ClientAuth::Required,
    };
    let auth = auth::Auth::new(policy, &config.auth, client_ca.is_some())?;
    let tls_config = match (&config.endpoint.tls.cert, &config.endpoint.tls.key) {
        (Some(cert), Some(key)) if config.https() => {
            Some(tls::server_config(cert, key, client_ca, client_auth)?)
        }
        _ => None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let (tx, _) = broadcast::channel(config.broadcast_capacity);
    let shared = Arc::new(Shared {
        model: Mutex::new(Model::new(config.history_points, config.archiver.is_some())),
        tx,
        archiver: config.archiver.clone(),
        metrics,
        stop: stop_rx.clone(),
        status: Mutex::new(serde_json::json!({})),
        auth,
    });
    let mut tasks = vec![
        tokio::spawn(feed::records(shared.clone(), directory.clone(), stop_rx.clone())),
        tokio::spawn(feed::cluster(
            shared.clone(),
            directory.clone(),
            Duration::from_millis(config.cluster_poll_ms),
            stop_rx.clone(),
        )),
        tokio::spawn(feed::events(
            shared.clone(),
            directory,
            config.patterns.clone(),
            format!("dashboard@{bound}"),
            stop_rx.clone(),
        )),
    ];
    if !config.federation.is_empty() {
        tasks.push(tokio::spawn(feed::hierarchy(
            shared.clone(),
            config.federation.clone(),
            Duration::from_millis(config.federation_poll_ms),
            stop_rx.clone(),
        )));
    }
    tracing::info!(%bound, "dashboard serving");
    let app = http::router(shared.clone());
    let signal = async move {
        shutdown.await;
        // Ends every SSE stream, so the graceful shutdown does not wait on browsers.
        let _ = stop_tx.send(true);
    };
    gma_core::conn::serve_http(
        listener,
        tls_config,
        app,
        &config.endpoint.limits,
        "dashboard",
        signal,
    )
    .await;
    for t in tasks {
        t.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys users write stay where they were with the endpoint section flattened in.
    #[test]
    fn the_endpoint_keys_stay_at_the_top_level() {
        let c: DashboardConfig = gma_core::config::parse_toml(
            "listen = \"127.0.0.1:2\"\ndirectory = \"127.0.0.1:3\"\naccess_policy = \"p.toml\"\n\
             metrics_listen = \"127.0.0.1:9\"\nplain_http = true\n[tls]\nallow_plaintext = true\n\
             [limits]\nmax_connections = 7\n[auth]\nproxy_user_header = \"X-User\"\n",
            "d.toml",
        )
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:2");
        assert_eq!(c.endpoint.access_policy, Some("p.toml".into()));
        assert_eq!(c.endpoint.metrics_listen.as_deref(), Some("127.0.0.1:9"));
        assert!(c.endpoint.tls.allow_plaintext && c.plain_http);
        assert_eq!(c.endpoint.limits.max_connections, 7);
        assert_eq!(c.auth.proxy_user_header.as_deref(), Some("X-User"));
        c.validate().unwrap();
        let err = gma_core::config::parse_toml::<DashboardConfig>(
            "directory = \"a:1\"\n\nmetrics_listn = \"x\"\n",
            "d.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `metrics_listn`"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        // It publishes no gma.rpc events: the key is refused whatever its value, the
        // default's included.
        for ms in [0, gma_core::rpc::DEFAULT_PERIOD_MS, 5] {
            let c: DashboardConfig = gma_core::config::parse_toml(
                &format!("directory = \"a:1\"\nrpc_events_ms = {ms}\n"),
                "d.toml",
            )
            .unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("leave out rpc_events_ms"), "{ms}: {err}");
        }
    }

    #[test]
    fn rpc_events_ms_is_refused_it_publishes_none() {
        let c: DashboardConfig =
            gma_core::config::parse_toml("directory = \"a:1\"\nrpc_events_ms = 500\n", "d.toml").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("rpc_events_ms"), "{e}");
    }

    #[test]
    fn federation_endpoints_are_bounded_and_checked() {
        let parse = |t: &str| -> DashboardConfig {
            gma_core::config::parse_toml(&format!("directory = \"a:1\"\n{t}"), "d.toml").unwrap()
        };
        assert!(parse("federation = [\"f:1\", \"f:2\"]\n").validate().is_ok());
        let many: Vec<String> = (0..17).map(|i| format!("\"f:{i}\"")).collect();
        let e = parse(&format!("federation = [{}]\n", many.join(",")))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 16"), "{e}");
        let e = parse("federation = [\" \"]\n")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("HOST:PORT"), "{e}");
        let e = parse("federation_poll_ms = 10\n")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("federation_poll_ms"), "{e}");
    }
}
