//! Prometheus exposition for every role (`--metrics-listen ADDR`, or `metrics_listen` in a
//! role's config): one process-wide recorder of the `metrics` facade, rendered in the
//! Prometheus text format at `GET /metrics` on its own small HTTP server (axum). The companion
//! producers that publish `gma.rpc` for roles without a hub of their own live here too.
//!
//! Histograms are exported as Prometheus histograms (`_bucket`, `_sum`, `_count`) with the
//! latency buckets of [`BUCKETS`], in seconds.
//!
//! These endpoints take the role's security ([`MetricsDoor`]): next to a role with a
//! certificate they serve HTTPS with it, require client certificates of the role's client CA
//! when it has one, and ask the role's policy (`metrics.read` on the role; the producer's
//! sensor values also `producer.query` allowed raw per event name). Plain HTTP next to a TLS
//! role (`http://ADDR`, or any address with `--metrics-insecure`) is refused at start unless
//! `--metrics-insecure` says so explicitly; then the endpoint is open. The doors are listed in
//! `gma_core::rpc::METRICS_DOORS` and `gma_producer::prometheus::DOORS`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{anyhow, bail, Context};
use axum::extract::{Extension, State};
use axum::response::IntoResponse;
use axum::routing::get;
use gma_core::authz::{Action, Decision, Identity, Policy};
use gma_core::conn::Peer;
use gma_core::rpc::RpcStats;
use gma_core::tls::ServerTls;
use gma_dashboard::tls::ClientAuth;
use gma_dashboard::HttpError;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::serve::bind;

static INSECURE: AtomicBool = AtomicBool::new(false);

/// The one route of the Prometheus endpoints: what their routers serve and what `gma doors`
/// checks against `gma_core::rpc::METRICS_DOORS` and `gma_producer::prometheus::DOORS`.
const METRICS_PATH: &str = "/metrics";
/// The routes of `--metrics-listen`.
pub const METRICS_ROUTES: &[(&str, &str)] = &[("GET", METRICS_PATH)];
/// The routes of `gma producer --prometheus`.
pub const PROMETHEUS_ROUTES: &[(&str, &str)] = &[("GET", METRICS_PATH)];

/// `--metrics-insecure`: serve the Prometheus endpoints in plain HTTP without authorization even
/// next to a TLS role.
pub fn set_insecure(on: bool) {
    INSECURE.store(on, Ordering::Relaxed);
}

/// The security a role's Prometheus endpoints take from the role: its `[tls]` and its policy.
#[derive(Debug, Clone, Default)]
pub struct MetricsDoor {
    pub tls: ServerTls,
    pub policy: Option<PathBuf>,
}

impl MetricsDoor {
    pub fn new(tls: &ServerTls, policy: Option<&PathBuf>) -> MetricsDoor {
        MetricsDoor {
            tls: tls.clone(),
            policy: policy.cloned(),
        }
    }
}

/// How one endpoint serves, decided at start.
struct Guard {
    /// The role, the resource of `metrics.read`.
    role: String,
    /// `None`: open (no policy, or --metrics-insecure).
    policy: Option<Policy>,
}

impl Guard {
    /// The identity of the request, authorized for `metrics.read` on the role.
    fn admit(&self, peer: &Peer) -> Result<Identity, HttpError> {
        let who = peer.identity();
        let Some(policy) = &self.policy else {
            return Ok(who);
        };
        let g = policy.authorize(&who, Action::MetricsRead, &self.role);
        if g.decision == Decision::Deny {
            return Err(if who.is_anonymous() {
                HttpError::Unauthenticated(format!(
                    "metrics of the {}: present a client certificate (anonymous scrapers are denied by {})",
                    self.role,
                    policy.describe(&g)
                ))
            } else {
                HttpError::Forbidden(format!(
                    "{who} may not metrics.read {:?} (denied by {})",
                    self.role,
                    policy.describe(&g)
                ))
            });
        }
        Ok(who)
    }

    /// True when `who` may read event `name` raw (open endpoints: always).
    fn raw(&self, who: &Identity, name: &str) -> bool {
        self.policy
            .as_ref()
            .is_none_or(|p| p.authorize(who, Action::ProducerQuery, name).decision == Decision::Allow)
    }
}

/// Binds `addr` (`ADDR`, `http://ADDR` or `https://ADDR`) for the Prometheus endpoint `flag`
/// of `role` and decides how it serves: HTTPS with the role's certificate and client CA and its
/// policy, or plain HTTP (a role without a certificate; or `--metrics-insecure`, open).
async fn open_door(
    flag: &str,
    role: &str,
    addr: &str,
    door: &MetricsDoor,
) -> anyhow::Result<(
    tokio::net::TcpListener,
    Option<Arc<gma_dashboard::tls::ServerConfig>>,
    Guard,
)> {
    let (scheme, bare) = match addr.split_once("://") {
        Some((s, rest)) if s == "http" || s == "https" => (Some(s), rest),
        Some((s, _)) => bail!("{flag} {addr}: unknown scheme {s:?} (give ADDR, http://ADDR or https://ADDR)"),
        None => (None, addr),
    };
    let insecure = INSECURE.load(Ordering::Relaxed);
    let role_tls = door.tls.cert.is_some() && door.tls.key.is_some();
    let what = if door.tls.client_ca.is_some() {
        "mTLS"
    } else {
        "TLS"
    };
    let policy = gma_core::guard::load_policy(door.policy.as_ref()).map_err(|e| anyhow!("{e}"))?;
    let policy = door.policy.as_ref().map(|_| policy);
    let tls = match (scheme, role_tls, insecure) {
        (Some("https"), false, _) => {
            bail!("{flag} {addr}: the {role} has no certificate to serve HTTPS with (give --tls-cert and --tls-key)")
        }
        (Some("http"), true, false) => bail!(
            "{flag} {addr} would serve the {role}'s metrics in plain HTTP next to its {what} endpoint: give \
             {flag} {bare} (it then takes the {role}'s TLS, client CA and policy) or add --metrics-insecure"
        ),
        (Some("https"), true, _) | (None, true, false) => {
            let (Some(cert), Some(key)) = (&door.tls.cert, &door.tls.key) else {
                bail!("{flag}: the {role}'s certificate and key are both needed");
            };
            let auth = if door.tls.client_ca.is_some() {
                ClientAuth::Required
            } else {
                ClientAuth::None
            };
            Some(
                gma_dashboard::tls::server_config(cert, key, door.tls.client_ca.as_deref(), auth)
                    .map_err(|e| anyhow!("{flag}: {e}"))?,
            )
        }
        _ => None,
    };
    let open = tls.is_none() && insecure;
    if open {
        tracing::warn!(
            role,
            flag,
            "serving metrics in plain HTTP without authorization (--metrics-insecure)"
        );
    }
    if tls.is_none() {
        check_plain_listen(flag, bare, door.tls.allow_plaintext)?;
    }
    let listener = bind(bare).await?;
    Ok((
        listener,
        tls,
        Guard {
            role: role.to_string(),
            policy: if open { None } else { policy },
        },
    ))
}

fn serve_in_background(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<gma_dashboard::tls::ServerConfig>>,
    app: axum::Router,
    what: &'static str,
) {
    tokio::spawn(async move {
        let limits = gma_core::guard::Limits::default();
        gma_core::conn::serve_http(listener, tls, app, &limits, what, std::future::pending()).await
    });
}

/// Histogram buckets, seconds: 100 µs to 10 s.
pub const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use (before any role starts, so
/// every metric handle a role creates records into it).
pub fn recorder() -> anyhow::Result<PrometheusHandle> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .map_err(|e| anyhow!("metrics buckets: {e}"))?
        .install_recorder()
        .map_err(|e| anyhow!("cannot install the metrics recorder: {e}"))?;
    gma_producer::telemetry::describe();
    gma_consumer::telemetry::describe();
    gma_directory::telemetry::describe();
    gma_archiver::telemetry::describe();
    gma_rescheduler::telemetry::describe();
    gma_dashboard::telemetry::describe();
    gma_monitor::telemetry::describe();
    gma_relay::telemetry::describe();
    crate::heap::describe();
    let _ = HANDLE.set(handle);
    HANDLE
        .get()
        .cloned()
        .ok_or_else(|| anyhow!("metrics recorder not installed"))
}

/// Refuses plain HTTP off loopback unless plaintext is allowed (`--allow-plaintext` or
/// `allow_plaintext` in `[tls]`): these endpoints have no TLS.
pub fn check_plain_http(what: &str, addr: SocketAddr, allow_plaintext: bool) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || allow_plaintext || crate::serve::allow_plaintext_flag() {
        return Ok(());
    }
    Err(anyhow!(
        "{what} on {addr} would serve plain HTTP off loopback: give --allow-plaintext (it has no TLS), or listen on 127.0.0.1"
    ))
}

/// [`check_plain_http`] for every address `addr` (`HOST:PORT`) resolves to, before binding.
fn check_plain_listen(what: &str, addr: &str, allow_plaintext: bool) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    // An address that does not resolve is left to the bind, which says so.
    for a in addr.to_socket_addrs().into_iter().flatten() {
        check_plain_http(what, a, allow_plaintext)?;
    }
    Ok(())
}

/// Serves `GET /metrics` on `addr` for `role` in the background, guarded by the role's
/// security (`door`, see the module documentation), and prints `gma <role> metrics on ADDR`
/// on stderr.
pub async fn serve_metrics(role: &str, addr: &str, door: &MetricsDoor) -> anyhow::Result<SocketAddr> {
    let handle = recorder()?;
    serve_guarded("--metrics-listen", role, "metrics", addr, door, move |_, _| {
        crate::heap::record();
        handle.render()
    })
    .await
}

/// A Prometheus text exposition response.
pub fn prometheus_text(body: String) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}

/// Serves the producer's latest sensor values (`gma producer --prometheus ADDR`) at
/// `/metrics`, in the background, guarded like [`serve_metrics`]; a scraper gets the gauges of
/// the series it may `producer.query` raw only. Prints `gma producer prometheus on ADDR`.
pub async fn serve_producer_values(
    addr: &str,
    hub: Arc<gma_producer::Hub>,
    door: &MetricsDoor,
) -> anyhow::Result<SocketAddr> {
    serve_guarded(
        "--prometheus",
        "producer",
        "prometheus",
        addr,
        door,
        move |guard, who| gma_producer::prometheus::render_filtered(&hub, |name| guard.raw(who, name)),
    )
    .await
}

/// Serves `GET /metrics` on `addr` (the flag `flag` of `role`) in the background behind the
/// door's guard: an admitted client gets `render(guard, its identity)` as Prometheus text.
/// Prints `gma <role> <what> on ADDR` on stderr.
async fn serve_guarded<R>(
    flag: &str,
    role: &str,
    what: &'static str,
    addr: &str,
    door: &MetricsDoor,
    render: R,
) -> anyhow::Result<SocketAddr>
where
    R: Fn(&Guard, &Identity) -> String + Send + Sync + 'static,
{
    let (listener, tls, guard) = open_door(flag, role, addr, door).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new()
        .route(
            METRICS_PATH,
            get(
                |State(st): State<Arc<(Guard, R)>>, Extension(peer): Extension<Peer>| async move {
                    let (guard, render) = &*st;
                    match guard.admit(&peer) {
                        Ok(who) => prometheus_text(render(guard, &who)).into_response(),
                        Err(e) => e.into_response(),
                    }
                },
            ),
        )
        .with_state(Arc::new((guard, render)));
    eprintln!("gma {role} {what} on {bound}");
    serve_in_background(listener, tls, app, what);
    Ok(bound)
}

/// Events a companion producer keeps for resuming consumers (its `gma.rpc` ring).
pub const COMPANION_BUFFER_EVENTS: usize = 10_000;

/// What a companion producer publishes for.
pub struct Companion {
    /// `directory`, `archiver`: the `role` of the `gma.rpc` events.
    pub role: &'static str,
    pub rpc: Arc<RpcStats>,
    /// Where to register.
    pub directory: String,
    /// The role's own bound address: the companion listens on the same IP (any port) and its
    /// source and record id are `<role>@<this address>`.
    pub near: SocketAddr,
    /// The role's endpoint section: TLS, policy, limits and the `gma.rpc` period.
    pub endpoint: gma_core::endpoint::Endpoint,
}

/// Serves the role's Prometheus `/metrics` on its endpoint's `metrics_listen`, when set, behind
/// the endpoint's TLS and policy.
pub async fn serve_endpoint_metrics(role: &str, e: &gma_core::endpoint::Endpoint) -> anyhow::Result<()> {
    if let Some(m) = &e.metrics_listen {
        serve_metrics(role, m, &MetricsDoor::new(&e.tls, e.access_policy.as_ref())).await?;
    }
    Ok(())
}

/// Starts a producer beside a role that has no hub of its own (the directory, the archiver):
/// it publishes the role's `gma.rpc` events and registers them in the directory like any
/// other producer. Returns when it is serving; it stops with `shutdown`.
pub async fn companion(
    c: Companion,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = bind(&SocketAddr::new(c.near.ip(), 0).to_string()).await?;
    let source = format!("{}@{}", c.role, c.near);
    let p = gma_producer::Producer::embedded(
        c.role,
        &c.endpoint,
        gma_producer::Identity {
            push: false,
            // The resume ring fills with one event per RPC method every `rpc_events_ms`: a
            // directory member's ~1 event/s filled the producer default of 100,000 events over
            // a day, its memory growing all the while. 10,000 events (~1.5 MiB) still let a
            // consumer resume after hours.
            buffer_events: COMPANION_BUFFER_EVENTS,
            ..gma_producer::Identity::new(
                source.clone(),
                gma_core::registration::Registration {
                    id: Some(source),
                    ..gma_core::registration::Registration::new(Some(c.directory))
                },
            )
        },
        &[],
    )
    .map_err(|e| anyhow!("{} companion producer: {e}", c.role))?
    .with_rpc_stats(c.rpc);
    let addr = listener.local_addr().context("companion address")?;
    tracing::info!(role = c.role, %addr, "gma.rpc companion producer");
    Ok(tokio::spawn(async move {
        if let Err(e) = p.run(listener, shutdown).await {
            tracing::warn!(error = %e, "companion producer stopped");
        }
    }))
}
