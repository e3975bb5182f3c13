//! The dashboard's HTTP endpoints (axum):
//!
//! | route | what |
//! |---|---|
//! | `GET /` , `/app.js`, `/style.css` | the page: plain HTML, vanilla JS, a hand-written canvas chart, embedded in the binary |
//! | `GET /api/events` | the live stream (server-sent events): a `snapshot` message, then every change |
//! | `GET /api/snapshot` | the snapshot alone (JSON) |
//! | `GET /api/history?name=&source=&field=&range_s=` | archived history (mean per step) from the archiver |
//! | `GET /api/archive/series?pattern=` | the series an archiver holds |
//! | `GET /metrics` | Prometheus text (when the process has a recorder) |
//! | `GET /healthz` | `ok` |

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gma_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::Shared;

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");

/// Comment line sent on an idle stream, so proxies and browsers keep it open.
const PING_EVERY: Duration = Duration::from_secs(15);
/// Points per series asked of the archiver for one history chart.
const HISTORY_POINTS: i64 = 300;
/// Series one history answer may hold.
const HISTORY_SERIES: usize = 50;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(app_js))
        .route("/style.css", get(style_css))
        .route("/healthz", get(|| async { "ok" }))
        .route("/api/events", get(events))
        .route("/api/snapshot", get(snapshot))
        .route("/api/history", get(history))
        .route("/api/archive/series", get(archive_series))
        .route("/metrics", get(metrics_text))
        // Only matched routes are counted: the route label stays bounded.
        .route_layer(axum::middleware::from_fn(track))
        .with_state(shared)
}

async fn track(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "other".into());
    let start = Instant::now();
    let resp = next.run(req).await;
    metrics::counter!(crate::telemetry::HTTP_REQUESTS, "route" => route.clone()).increment(1);
    if resp.status().is_client_error() || resp.status().is_server_error() {
        metrics::counter!(crate::telemetry::HTTP_ERRORS, "route" => route.clone()).increment(1);
    }
    metrics::histogram!(crate::telemetry::HTTP_SECONDS, "route" => route)
        .record(start.elapsed().as_secs_f64());
    resp
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

async fn snapshot(State(s): State<Arc<Shared>>) -> Json<Value> {
    Json(s.snapshot())
}

async fn metrics_text(State(s): State<Arc<Shared>>) -> Response {
    match &s.metrics {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            h.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no metrics recorder in this process\n").into_response(),
    }
}

/// One browser's stream state; counts the browser while it lives.
struct Stream {
    shared: Arc<Shared>,
    rx: tokio::sync::broadcast::Receiver<Bytes>,
    first: Option<Bytes>,
    stop: tokio::sync::watch::Receiver<bool>,
    ping: tokio::time::Interval,
}

impl Drop for Stream {
    fn drop(&mut self) {
        metrics::gauge!(crate::telemetry::CLIENTS).decrement(1.0);
    }
}

async fn next_frame(mut st: Stream) -> Option<(Result<Bytes, Infallible>, Stream)> {
    if let Some(f) = st.first.take() {
        return Some((Ok(f), st));
    }
    let frame = tokio::select! {
        _ = st.stop.wait_for(|s| *s) => return None,
        _ = st.ping.tick() => Bytes::from_static(b": ping\n\n"),
        r = st.rx.recv() => match r {
            Ok(b) => b,
            Err(RecvError::Lagged(skipped)) => {
                // Too slow for the channel: skip to the latest state instead of catching up.
                metrics::counter!(crate::telemetry::LAGGED).increment(1);
                tracing::debug!(skipped, "browser lagged; sending a snapshot");
                let (rx, snap) = st.shared.subscribe();
                st.rx = rx;
                snap
            }
            Err(RecvError::Closed) => return None,
        },
    };
    Some((Ok(frame), st))
}

async fn events(State(s): State<Arc<Shared>>) -> Response {
    let (rx, snap) = s.subscribe();
    metrics::gauge!(crate::telemetry::CLIENTS).increment(1.0);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let st = Stream {
        shared: s.clone(),
        rx,
        first: Some(snap),
        stop: s.stop.clone(),
        ping,
    };
    let body = Body::from_stream(futures::stream::unfold(st, next_frame));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn error(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(json!({ "error": msg.into() }))).into_response()
}

/// (name, source, field, times in ms, values) of one series of a history answer.
type HistorySeries = (String, String, String, Vec<f64>, Vec<Value>);

#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    /// Event name (or pattern).
    pub name: String,
    /// Source (or pattern); empty = every source.
    #[serde(default)]
    pub source: String,
    /// One field; empty = every numeric field.
    #[serde(default)]
    pub field: String,
    /// The last this many seconds (default 900).
    pub range_s: Option<i64>,
}

async fn archive_client(
    s: &Shared,
) -> Result<pb::archive_client::ArchiveClient<tonic::transport::Channel>, Response> {
    let Some(addr) = &s.archiver else {
        return Err(error(
            StatusCode::NOT_FOUND,
            "no archiver configured: start the dashboard with --archiver ADDR",
        ));
    };
    let ch = gma_consumer::connect(addr)
        .await
        .map_err(|e| error(StatusCode::BAD_GATEWAY, e.to_string()))?;
    Ok(pb::archive_client::ArchiveClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

async fn history(State(s): State<Arc<Shared>>, Query(q): Query<HistoryQuery>) -> Response {
    let range_s = q.range_s.unwrap_or(900);
    if !(10..=366 * 86_400).contains(&range_s) {
        return error(
            StatusCode::BAD_REQUEST,
            "range_s must lie in 10..=31622400 seconds",
        );
    }
    if let Err(e) = gma_core::pattern::Pattern::event(&q.name) {
        return error(StatusCode::BAD_REQUEST, format!("name: {e}"));
    }
    if !q.source.is_empty() {
        if let Err(e) = gma_core::pattern::Pattern::source(&q.source) {
            return error(StatusCode::BAD_REQUEST, format!("source: {e}"));
        }
    }
    let mut client = match archive_client(&s).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let to_ns = gma_core::time::now_ns();
    let range_ns = range_s * 1_000_000_000;
    let step_ns = (range_ns / HISTORY_POINTS).max(1_000_000_000);
    let mut req = tonic::Request::new(pb::ArchiveQueryRequest {
        pattern: q.name.clone(),
        source: q.source.clone(),
        field: q.field.clone(),
        from_ns: to_ns - range_ns,
        to_ns,
        step_ns,
        aggregate: pb::Aggregate::Mean as i32,
        max_points: 0,
    });
    req.set_timeout(Duration::from_secs(20));
    let mut stream = match client.query(req).await {
        Ok(r) => r.into_inner(),
        Err(st) => return error(StatusCode::BAD_GATEWAY, format!("archiver: {}", st.message())),
    };
    let mut series: Vec<HistorySeries> = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                for p in m.series {
                    let key = (p.name, p.source, p.field);
                    let i = match series
                        .iter()
                        .position(|x| (&x.0, &x.1, &x.2) == (&key.0, &key.1, &key.2))
                    {
                        Some(i) => i,
                        None if series.len() < HISTORY_SERIES => {
                            series.push((key.0, key.1, key.2, Vec::new(), Vec::new()));
                            series.len() - 1
                        }
                        None => continue,
                    };
                    let e = &mut series[i];
                    e.3.extend(p.timestamps_ns.iter().map(|t| *t as f64 / 1e6));
                    e.4.extend(
                        p.values
                            .iter()
                            .map(|v| if v.is_finite() { json!(v) } else { Value::Null }),
                    );
                }
            }
            Ok(None) => break,
            Err(st) => return error(StatusCode::BAD_GATEWAY, format!("archiver: {}", st.message())),
        }
    }
    let out: Vec<Value> = series
        .into_iter()
        .map(|(name, source, field, t, v)| json!({"name": name, "source": source, "field": field, "t": t, "v": v}))
        .collect();
    Json(json!({"series": out, "step_ms": step_ns / 1_000_000, "from_ms": (to_ns - range_ns) / 1_000_000, "to_ms": to_ns / 1_000_000}))
        .into_response()
}

#[derive(Debug, Deserialize)]
pub struct SeriesQuery {
    #[serde(default)]
    pub pattern: String,
}

async fn archive_series(State(s): State<Arc<Shared>>, Query(q): Query<SeriesQuery>) -> Response {
    let mut client = match archive_client(&s).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut req = tonic::Request::new(pb::ArchiveSeriesRequest {
        pattern: q.pattern,
        source: String::new(),
    });
    req.set_timeout(Duration::from_secs(10));
    match client.series(req).await {
        Ok(r) => {
            let list: Vec<Value> = r
                .into_inner()
                .series
                .into_iter()
                .filter(|s| s.r#type() != pb::FieldType::String)
                .take(5000)
                .map(|s| json!({"name": s.name, "source": s.source, "field": s.field, "unit": s.unit, "samples": s.samples}))
                .collect();
            Json(json!({ "series": list })).into_response()
        }
        Err(st) => error(StatusCode::BAD_GATEWAY, format!("archiver: {}", st.message())),
    }
}
