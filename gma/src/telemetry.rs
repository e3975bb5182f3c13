//! Prometheus exposition for every role (`--metrics-listen ADDR`, or `metrics_listen` in a
//! role's config): one process-wide recorder of the `metrics` facade, rendered in the
//! Prometheus text format at `GET /metrics` on its own small HTTP server (axum). The companion
//! producers that publish `gma.rpc` for roles without a hub of their own live here too.
//!
//! Histograms are exported as Prometheus histograms (`_bucket`, `_sum`, `_count`) with the
//! latency buckets of [`BUCKETS`], in seconds.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use anyhow::{anyhow, Context};
use axum::routing::get;
use gma_core::rpc::RpcStats;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::roles::bind;

/// Metrics of the roles that live in this binary (relay, monitor).
pub const RELAY_EVENTS: &str = "gma_relay_events_relayed_total";
pub const RELAY_SITE_LOAD: &str = "gma_relay_site_load_published_total";
pub const MONITOR_FIRINGS: &str = "gma_monitor_firings_total";
pub const MONITOR_COMMAND_SECONDS: &str = "gma_monitor_command_seconds";

fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(RELAY_EVENTS, "events republished unchanged by the relay");
    describe_counter!(RELAY_SITE_LOAD, "site.load summaries published");
    describe_counter!(
        MONITOR_FIRINGS,
        "rule firings whose command ran, by outcome (ok, failed)"
    );
    describe_histogram!(
        MONITOR_COMMAND_SECONDS,
        Unit::Seconds,
        "run time of firing commands"
    );
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
    describe();
    let _ = HANDLE.set(handle);
    HANDLE
        .get()
        .cloned()
        .ok_or_else(|| anyhow!("metrics recorder not installed"))
}

/// Refuses plain HTTP off loopback unless plaintext is allowed (`--allow-plaintext` or
/// `allow_plaintext` in `[tls]`): these endpoints have no TLS.
pub fn check_plain_http(what: &str, addr: SocketAddr, allow_plaintext: bool) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || allow_plaintext || crate::roles::allow_plaintext_flag() {
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

/// Serves `GET /metrics` on `addr` for `role` in the background and prints
/// `gma <role> metrics on ADDR` on stderr.
pub async fn serve_metrics(role: &str, addr: &str, allow_plaintext: bool) -> anyhow::Result<SocketAddr> {
    let handle = recorder()?;
    check_plain_listen("--metrics-listen", addr, allow_plaintext)?;
    let listener = bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move { prometheus_text(handle.render()) }
        }),
    );
    eprintln!("gma {role} metrics on {bound}");
    tokio::spawn(async move {
        let limits = gma_core::guard::Limits::default();
        gma_core::conn::serve_http(listener, None, app, &limits, "metrics", std::future::pending()).await
    });
    Ok(bound)
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
/// `/metrics`, in the background; prints `gma producer prometheus on ADDR`.
pub async fn serve_producer_values(
    addr: &str,
    hub: Arc<gma_producer::Hub>,
    allow_plaintext: bool,
) -> anyhow::Result<SocketAddr> {
    check_plain_listen("--prometheus", addr, allow_plaintext)?;
    let listener = bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let hub = hub.clone();
            async move { prometheus_text(gma_producer::prometheus::render(&hub)) }
        }),
    );
    eprintln!("gma producer prometheus on {bound}");
    tokio::spawn(async move {
        let limits = gma_core::guard::Limits::default();
        gma_core::conn::serve_http(listener, None, app, &limits, "prometheus", std::future::pending()).await
    });
    Ok(bound)
}

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
    pub period_ms: u64,
    pub tls: gma_core::tls::ServerTls,
    pub policy: Option<std::path::PathBuf>,
    pub limits: gma_core::guard::Limits,
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
    let p = gma_producer::Producer::new(gma_producer::ProducerConfig {
        directory: Some(c.directory),
        host_sensors: false,
        source: Some(source.clone()),
        id: Some(source),
        push: false,
        rpc_events_ms: c.period_ms,
        role: c.role.into(),
        tls: c.tls,
        policy: c.policy,
        limits: c.limits,
        ..gma_producer::ProducerConfig::default()
    })
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
