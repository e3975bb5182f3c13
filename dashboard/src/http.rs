//! The dashboard's HTTP endpoints (axum). With a policy, every route that serves data asks it
//! ([`DOORS`], docs/security.md) for the identity of the request ([`crate::auth`]):
//!
//! | route | what | actions |
//! |---|---|---|
//! | `GET /` , `/app.js`, `/style.css` | the page: plain HTML, vanilla JS, a hand-written canvas chart, embedded in the binary | none (no data) |
//! | `GET /api/events` | the live stream (server-sent events): a `snapshot` message, then every change | `dashboard.read`, then per datum ([`crate::view`]) |
//! | `GET /api/snapshot` | the snapshot alone (JSON) | `dashboard.read`, then per datum |
//! | `GET /api/history?name=&source=&field=&range_s=` | archived history (mean per step) from the archiver | `dashboard.read`, `archive.query` on the name |
//! | `GET /api/archive/series?pattern=` | the series an archiver holds | `dashboard.read`, `archive.query` on the pattern |
//! | `GET /metrics` | Prometheus text (when the process has a recorder) | `metrics.read` on `dashboard` |
//! | `GET /healthz` | `ok` | none |

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, MatchedPath, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::{Json, Router};
use gma_core::authz::{Action, Decision, Door, Grant, Identity};
use gma_core::conn::Peer;
use gma_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::view::View;
use crate::{Frame, HttpError, Shared};

/// The dashboard's routes and their decisions (the table above; docs/security.md).
pub const DOORS: &[Door] = &[
    Door::open("GET /", "served (the page, no data)"),
    Door::open("GET /app.js", "served (no data)"),
    Door::open("GET /style.css", "served (no data)"),
    Door::open("GET /healthz", "served (`ok`)"),
    Door::policy(
        "GET /api/events",
        &[
            Action::DashboardRead,
            Action::ProducerSubscribe,
            Action::DirectorySearch,
        ],
        "the stream without raw host values: no chart points, no host names; \
                       decisions, gma.rpc and federation rows it may receive raw; records and \
                       the cluster when directory.search on * is not denied",
    ),
    Door::policy(
        "GET /api/snapshot",
        &[
            Action::DashboardRead,
            Action::ProducerSubscribe,
            Action::DirectorySearch,
        ],
        "the snapshot filtered like /api/events",
    ),
    Door::policy(
        "GET /api/history",
        &[Action::DashboardRead, Action::ArchiveQuery],
        "the archived summary series among the matches; 403 naming the rule when \
                       none",
    ),
    Door::policy(
        "GET /api/archive/series",
        &[Action::DashboardRead, Action::ArchiveQuery],
        "the summary series among the matches; 403 naming the rule when none",
    ),
    Door::policy(
        "GET /metrics",
        &[Action::MetricsRead],
        "served with metrics.read (counters and latencies, no host data)",
    ),
];

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");

/// Comment line sent on an idle stream, so proxies and browsers keep it open.
const PING_EVERY: Duration = Duration::from_secs(15);
/// Points per series asked of the archiver for one history chart.
const HISTORY_POINTS: i64 = 300;
/// Series one history answer may hold.
const HISTORY_SERIES: usize = 50;

/// The handler of a door of [`DOORS`]. The router is built from [`DOORS`], so a route without
/// a door is never served (a handler added here alone stays unreachable) and the census
/// (tests/tests/census.rs) knocks on every route there is.
fn handler(door: &str) -> Option<MethodRouter<Arc<Shared>>> {
    Some(match door {
        "GET /" => get(index),
        "GET /app.js" => get(app_js),
        "GET /style.css" => get(style_css),
        "GET /healthz" => get(|| async { "ok" }),
        "GET /api/events" => get(events),
        "GET /api/snapshot" => get(snapshot),
        "GET /api/history" => get(history),
        "GET /api/archive/series" => get(archive_series),
        "GET /metrics" => get(metrics_text),
        _ => return None,
    })
}

/// The routes served: `(method, path)` of every door of [`DOORS`] that has a handler.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    DOORS
        .iter()
        .filter(|d| handler(d.door).is_some())
        .filter_map(Door::http_route)
        .collect()
}

pub fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new();
    for door in DOORS {
        if let (Some((_, path)), Some(h)) = (door.http_route(), handler(door.door)) {
            router = router.route(path, h);
        }
    }
    router
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

/// The identity of a request ([`crate::auth::Auth::identify`]): client certificate, trusted
/// proxy headers, bearer token, or anonymous.
pub struct Caller(pub Identity);

impl FromRequestParts<Arc<Shared>> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<Shared>) -> Result<Caller, HttpError> {
        let peer = parts.extensions.get::<Peer>();
        s.auth().identify(peer, &parts.headers).map(Caller)
    }
}

/// A caller allowed `dashboard.read` on the route, with what it may see of the data.
pub struct Viewer {
    pub who: Identity,
    pub view: View,
}

impl FromRequestParts<Arc<Shared>> for Viewer {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<Shared>) -> Result<Viewer, HttpError> {
        let Caller(who) = Caller::from_request_parts(parts, s).await?;
        if s.auth().is_open() {
            return Ok(Viewer {
                who,
                view: View::all(),
            });
        }
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
        s.auth().authorize(&who, Action::DashboardRead, &route)?;
        let view = View::of(s.auth().policy(), &who);
        Ok(Viewer { who, view })
    }
}

/// What a viewer may read of the archive for `pattern`: everything (`None`), or only the event
/// names the policy allows it raw (a summary-only grant: its summary series). A deny is
/// 401/403.
fn archive_access(s: &Shared, who: &Identity, pattern: &str) -> Result<Option<Grant>, HttpError> {
    if s.auth().is_open() {
        return Ok(None);
    }
    let g = s.auth().authorize(
        who,
        Action::ArchiveQuery,
        if pattern.is_empty() { "*" } else { pattern },
    )?;
    Ok((g.decision != Decision::Allow).then_some(g))
}

fn raw_allowed(s: &Shared, who: &Identity, name: &str) -> bool {
    s.auth()
        .policy()
        .authorize(who, Action::ArchiveQuery, name)
        .decision
        == Decision::Allow
}

fn summaries_only(s: &Shared, who: &Identity, pattern: &str, grant: &Grant) -> HttpError {
    HttpError::Forbidden(gma_core::guard::summary_only_message(
        s.auth().policy(),
        who,
        pattern,
        grant,
        &format!(
            "the archive holds no summary series of it here; ask for {pattern}.avg1m, \
             {pattern}.avg10m or {pattern}.avg60m"
        ),
    ))
}

async fn snapshot(State(s): State<Arc<Shared>>, v: Viewer) -> Json<Value> {
    Json(s.snapshot(&v.view))
}

async fn metrics_text(State(s): State<Arc<Shared>>, Caller(who): Caller) -> Response {
    if !s.auth().is_open() {
        if let Err(e) = s.auth().authorize(&who, Action::MetricsRead, "dashboard") {
            return e.into_response();
        }
    }
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
    view: View,
    rx: tokio::sync::broadcast::Receiver<Frame>,
    first: Option<Bytes>,
    stop: tokio::sync::watch::Receiver<bool>,
    ping: tokio::time::Interval,
}

/// The bytes of `f` for `view`: the shared ones when it may see everything `f` holds, a
/// filtered copy otherwise, nothing when nothing is left.
fn for_view(view: &View, f: Frame) -> Option<Bytes> {
    if view.passes(f.classes) {
        return Some(f.bytes);
    }
    let text = std::str::from_utf8(&f.bytes).ok()?;
    let json = text.strip_prefix("data: ")?.trim_end();
    let mut v: Value = serde_json::from_str(json).ok()?;
    view.filter(&mut v).then(|| crate::sse_frame(&v))
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
    let frame = loop {
        tokio::select! {
            _ = st.stop.wait_for(|s| *s) => return None,
            _ = st.ping.tick() => break Bytes::from_static(b": ping\n\n"),
            r = st.rx.recv() => match r {
                Ok(f) => match for_view(&st.view, f) {
                    Some(b) => break b,
                    // Nothing this viewer may see: wait for the next one.
                    None => continue,
                },
                Err(RecvError::Lagged(skipped)) => {
                    // Too slow for the channel: skip to the latest state instead of catching up.
                    metrics::counter!(crate::telemetry::LAGGED).increment(1);
                    tracing::debug!(skipped, "browser lagged; sending a snapshot");
                    let (rx, snap) = st.shared.subscribe(&st.view);
                    st.rx = rx;
                    break snap;
                }
                Err(RecvError::Closed) => return None,
            },
        }
    };
    Some((Ok(frame), st))
}

async fn events(State(s): State<Arc<Shared>>, v: Viewer) -> Response {
    let (rx, snap) = s.subscribe(&v.view);
    metrics::gauge!(crate::telemetry::CLIENTS).increment(1.0);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let st = Stream {
        shared: s.clone(),
        view: v.view,
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
) -> Result<pb::archive_client::ArchiveClient<tonic::transport::Channel>, HttpError> {
    let Some(addr) = &s.archiver else {
        return Err(HttpError::NotFound(
            "no archiver configured: start the dashboard with --archiver ADDR".into(),
        ));
    };
    let ch = gma_consumer::connect(addr)
        .await
        .map_err(|e| HttpError::BadGateway(e.to_string()))?;
    Ok(pb::archive_client::ArchiveClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES))
}

async fn history(
    State(s): State<Arc<Shared>>,
    v: Viewer,
    Query(q): Query<HistoryQuery>,
) -> Result<Response, HttpError> {
    let range_s = q.range_s.unwrap_or(900);
    if !(10..=366 * 86_400).contains(&range_s) {
        return Err(HttpError::BadRequest(
            "range_s must lie in 10..=31622400 seconds".into(),
        ));
    }
    if let Err(e) = gma_core::pattern::Pattern::event(&q.name) {
        return Err(HttpError::BadRequest(format!("name: {e}")));
    }
    if !q.source.is_empty() {
        if let Err(e) = gma_core::pattern::Pattern::source(&q.source) {
            return Err(HttpError::BadRequest(format!("source: {e}")));
        }
    }
    // A summary-only viewer gets the summary series among the matches, nothing raw.
    let only = archive_access(&s, &v.who, &q.name)?;
    let mut client = archive_client(&s).await?;
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
    let mut stream = client
        .query(req)
        .await
        .map_err(|st| HttpError::BadGateway(format!("archiver: {}", st.message())))?
        .into_inner();
    let mut series: Vec<HistorySeries> = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                for p in m.series {
                    if only.is_some() && !raw_allowed(&s, &v.who, &p.name) {
                        continue;
                    }
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
            // Nothing stored: for a summary-only viewer, the refusal below says what to ask.
            Err(st) if st.code() == tonic::Code::NotFound && only.is_some() => break,
            Err(st) => return Err(HttpError::BadGateway(format!("archiver: {}", st.message()))),
        }
    }
    if let (Some(g), true) = (&only, series.is_empty()) {
        return Err(summaries_only(&s, &v.who, &q.name, g));
    }
    let out: Vec<Value> = series
        .into_iter()
        .map(|(name, source, field, t, v)| json!({"name": name, "source": source, "field": field, "t": t, "v": v}))
        .collect();
    Ok(Json(json!({"series": out, "step_ms": step_ns / 1_000_000, "from_ms": (to_ns - range_ns) / 1_000_000, "to_ms": to_ns / 1_000_000}))
        .into_response())
}

#[derive(Debug, Deserialize)]
pub struct SeriesQuery {
    #[serde(default)]
    pub pattern: String,
}

async fn archive_series(
    State(s): State<Arc<Shared>>,
    v: Viewer,
    Query(q): Query<SeriesQuery>,
) -> Result<Response, HttpError> {
    let only = archive_access(&s, &v.who, &q.pattern)?;
    let mut client = archive_client(&s).await?;
    let pattern = q.pattern;
    let mut req = tonic::Request::new(pb::ArchiveSeriesRequest {
        pattern: pattern.clone(),
        source: String::new(),
    });
    req.set_timeout(Duration::from_secs(10));
    let r = client
        .series(req)
        .await
        .map_err(|st| HttpError::BadGateway(format!("archiver: {}", st.message())))?;
    let list: Vec<Value> = r
        .into_inner()
        .series
        .into_iter()
        .filter(|x| x.r#type() != pb::FieldType::String)
        .filter(|x| only.is_none() || raw_allowed(&s, &v.who, &x.name))
        .take(5000)
        .map(|s| json!({"name": s.name, "source": s.source, "field": s.field, "unit": s.unit, "samples": s.samples}))
        .collect();
    if let (Some(g), true) = (&only, list.is_empty()) {
        let p = if pattern.is_empty() { "*" } else { pattern.as_str() };
        return Err(summaries_only(&s, &v.who, p, g));
    }
    Ok(Json(json!({ "series": list })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_door_is_a_route_and_every_route_a_door() {
        for d in DOORS {
            assert!(handler(d.door).is_some(), "door {:?} has no handler", d.door);
            assert_eq!(d.http_route().map(|r| r.0), Some("GET"), "{:?}", d.door);
        }
        assert_eq!(routes().len(), DOORS.len());
    }
}
