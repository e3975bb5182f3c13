//! The Prometheus HTTP query API of the archiver (served on `http_listen`): the routes, their
//! parameters (query string, and for POST the form body too, as Prometheus merges them), the
//! JSON answers in Prometheus' format (`status`, `data.resultType`, `errorType`, `error`), and
//! the [`Archive`] over the store, authorized like the `Archive` gRPC query
//! ([`crate::service::readable`]: `archive.query` per event name; a summary-only grant sees
//! the summary series only; a reader who may see none of the selected series gets 403 naming
//! the rule).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use gma_core::authz::{Action, Door, Identity};
use gma_core::conn::Peer;
use gma_core::guard::Gate;
use gma_core::pattern::Pattern;
use serde_json::{json, Value as Json};

use super::eval::{self, Archive, Budget, LabelMatcher, SeriesRef, Steps, Value};
use super::{Error, PromqlConfig};
use crate::store::{Agg, QuerySpec, Store};

/// The doors of `http_listen` (every route, GET and POST).
pub const DOORS: &[Door] = &[
    Door::policy("GET /api/v1/query", &[Action::ArchiveQuery], SUMMARY),
    Door::policy("POST /api/v1/query", &[Action::ArchiveQuery], SUMMARY),
    Door::policy("GET /api/v1/query_range", &[Action::ArchiveQuery], SUMMARY),
    Door::policy("POST /api/v1/query_range", &[Action::ArchiveQuery], SUMMARY),
    Door::policy("GET /api/v1/series", &[Action::ArchiveQuery], SUMMARY),
    Door::policy("POST /api/v1/series", &[Action::ArchiveQuery], SUMMARY),
    Door::policy("GET /api/v1/labels", &[Action::ArchiveQuery], SUMMARY),
    Door::policy("POST /api/v1/labels", &[Action::ArchiveQuery], SUMMARY),
    Door::policy(
        "GET /api/v1/label/{name}/values",
        &[Action::ArchiveQuery],
        SUMMARY,
    ),
    Door::open("GET /api/v1/status/buildinfo", "served (versions only, no data)"),
];

const SUMMARY: &str = "the archived summary series among the selected ones (raw series never); \
                       403 naming the rule when none is readable";

/// The routes the router serves, `(method, path)`.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    DOORS.iter().filter_map(Door::http_route).collect()
}

/// What the routes share.
pub struct Shared {
    pub store: Arc<Store>,
    pub gate: Arc<Gate>,
    pub config: PromqlConfig,
}

/// The router of the API (each request must carry a [`Peer`], as `serve_http` adds).
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/api/v1/query", get(query).post(query))
        .route("/api/v1/query_range", get(query_range).post(query_range))
        .route("/api/v1/series", get(series).post(series))
        .route("/api/v1/labels", get(labels).post(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/status/buildinfo", get(buildinfo))
        .with_state(shared)
}

/// Most bytes of a form body.
const MAX_FORM: usize = 1 << 20;

/// The request's parameters: the query string, then the form body.
fn params(raw: Option<String>, body: &Bytes) -> Result<Vec<(String, String)>, Error> {
    let bad = |e: serde_urlencoded::de::Error| Error::BadData(format!("invalid parameters: {e}"));
    let mut out: Vec<(String, String)> = match raw {
        Some(q) => serde_urlencoded::from_str(&q).map_err(bad)?,
        None => Vec::new(),
    };
    if !body.is_empty() {
        if body.len() > MAX_FORM {
            return Err(Error::BadData(format!("form body over {MAX_FORM} bytes")));
        }
        out.extend(serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).map_err(bad)?);
    }
    Ok(out)
}

fn param<'a>(p: &'a [(String, String)], name: &str) -> Option<&'a str> {
    p.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A time parameter: Unix seconds (fractions allowed) or RFC 3339; milliseconds.
pub fn parse_time(s: &str, what: &str) -> Result<i64, Error> {
    if let Ok(f) = s.parse::<f64>() {
        if f.is_finite() && f.abs() < 9.0e12 {
            return Ok((f * 1000.0).round() as i64);
        }
    }
    match gma_core::time::parse_rfc3339(s) {
        Some(Some(ns)) => Ok(ns.div_euclid(1_000_000)),
        _ => Err(Error::BadData(format!(
            "invalid parameter \"{what}\": cannot parse \"{s}\" to a valid timestamp"
        ))),
    }
}

/// A duration parameter: seconds (fractions allowed) or a Prometheus duration (`1m30s`); ms.
pub fn parse_duration(s: &str, what: &str) -> Result<i64, Error> {
    if let Ok(f) = s.parse::<f64>() {
        if f.is_finite() && f.abs() < 9.0e12 {
            return Ok((f * 1000.0).round() as i64);
        }
    }
    promql_parser::util::parse_duration(s)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .map_err(|_| {
            Error::BadData(format!(
                "invalid parameter \"{what}\": cannot parse \"{s}\" to a valid duration"
            ))
        })
}

fn now_ms() -> i64 {
    gma_core::time::now_ns().div_euclid(1_000_000)
}

/// A Prometheus answer.
fn success(data: Json) -> Response {
    json_response(StatusCode::OK, json!({"status": "success", "data": data}))
}

fn json_response(code: StatusCode, body: Json) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (code, kind) = self.status();
        let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(
            code,
            json!({"status": "error", "errorType": kind, "error": self.to_string()}),
        )
    }
}

/// A sample value as Prometheus prints it (Go's `FormatFloat(v, 'f', -1, 64)`).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

fn point(t: i64, v: f64) -> Json {
    json!([t as f64 / 1000.0, format_value(v)])
}

fn metric(labels: &[(String, String)]) -> Json {
    Json::Object(
        labels
            .iter()
            .map(|(k, v)| (k.clone(), Json::String(v.clone())))
            .collect(),
    )
}

/// Runs the blocking evaluation `f` off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("query task failed: {e}")))?
}

/// The archive as one reader sees it.
struct Reader {
    shared: Arc<Shared>,
    who: Identity,
}

impl Reader {
    /// The numeric series matching `matchers` with samples in `[from, to]` (ms) that the
    /// reader may read (see the module documentation).
    fn list(&self, matchers: &[LabelMatcher], from: i64, to: i64) -> Result<Vec<SeriesRef>, Error> {
        let st = &self.shared;
        // An exact event name narrows the listing.
        let name = matchers
            .iter()
            .find(|m| m.name == crate::promlabels::EVENT_LABEL)
            .and_then(|m| m.exact())
            .and_then(|e| Pattern::event(e).ok())
            .unwrap_or_else(Pattern::any);
        let mut by_event: BTreeMap<String, Vec<SeriesRef>> = BTreeMap::new();
        for s in st.store.series(&name, None) {
            if s.is_string || s.last_ts.div_euclid(1_000_000) < from || s.first_ts.div_euclid(1_000_000) > to
            {
                continue;
            }
            let labels: Vec<(String, String)> = crate::promlabels::labels(&s.name, &s.source, &s.field)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            if eval::matches_all(&labels, matchers) {
                by_event.entry(s.name.clone()).or_default().push(SeriesRef {
                    event: s.name,
                    source: s.source,
                    field: s.field,
                    labels,
                });
            }
        }
        let mut out = Vec::new();
        let mut refused = None;
        for (event, series) in by_event {
            let p = Pattern::event(&event).map_err(|e| Error::Internal(e.to_string()))?;
            match crate::service::readable(&st.store, &st.gate, &self.who, &p, None) {
                Ok(None) => out.extend(series),
                Ok(Some(names)) => out.extend(series.into_iter().filter(|s| names.contains(&s.event))),
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        match refused {
            Some(e) if out.is_empty() => Err(e.into()),
            _ => Ok(out),
        }
    }
}

impl Archive for Reader {
    fn select(&self, matchers: &[LabelMatcher]) -> Result<Vec<SeriesRef>, Error> {
        self.list(matchers, i64::MIN, i64::MAX)
    }

    fn samples(
        &self,
        s: &SeriesRef,
        from_ms: i64,
        to_ms: i64,
        out: &mut dyn FnMut(i64, f64) -> bool,
    ) -> Result<(), Error> {
        let from_ns = from_ms.saturating_mul(1_000_000).max(0);
        let to_ns = to_ms.saturating_add(1).saturating_mul(1_000_000);
        if to_ns <= from_ns {
            return Ok(());
        }
        let source = Pattern::source(&s.source).ok().filter(Pattern::is_exact);
        let spec = QuerySpec {
            name: Pattern::event(&s.event).map_err(|e| Error::Internal(e.to_string()))?,
            names: None,
            source,
            field: Some(s.field.clone()),
            from_ns,
            to_ns,
            step_ns: None,
            agg: Agg::Raw,
            max_points: 4096,
        };
        self.shared.store.query(&spec, &mut |p| {
            if p.source != s.source || p.name != s.event {
                return true;
            }
            p.timestamps
                .iter()
                .zip(&p.values)
                .all(|(ts, v)| out(ts.div_euclid(1_000_000), *v))
        })?;
        Ok(())
    }
}

/// The reader, and the query's budget (`timeout` may shorten the configured one).
fn reader(shared: &Arc<Shared>, peer: &Peer, p: &[(String, String)]) -> Result<(Reader, Budget), Error> {
    let mut timeout = shared.config.timeout();
    if let Some(t) = param(p, "timeout") {
        let ms = parse_duration(t, "timeout")?;
        timeout = timeout.min(Duration::from_millis(ms.max(1) as u64));
    }
    Ok((
        Reader {
            shared: shared.clone(),
            who: peer.identity(),
        },
        Budget::new(shared.config.max_samples, timeout),
    ))
}

fn parse_query(p: &[(String, String)]) -> Result<promql_parser::parser::Expr, Error> {
    let q = param(p, "query").ok_or_else(|| Error::BadData("invalid parameter \"query\": missing".into()))?;
    promql_parser::parser::parse(q).map_err(|e| Error::BadData(format!("invalid parameter \"query\": {e}")))
}

/// A request to a data route: the routes' shared state, who asks, and the parameters (query
/// string, then form body).
struct Req {
    st: Arc<Shared>,
    peer: Peer,
    p: Vec<(String, String)>,
}

impl FromRequest<Arc<Shared>> for Req {
    type Rejection = Response;

    async fn from_request(req: Request, st: &Arc<Shared>) -> Result<Req, Response> {
        let peer = req
            .extensions()
            .get::<Peer>()
            .cloned()
            .ok_or_else(|| Error::Internal("request without its peer".into()).into_response())?;
        // The per-identity request rate of `[limits]`, as on the gRPC doors.
        st.gate
            .admit_peer(&peer.identity(), Some(peer.addr))
            .map_err(|r| Error::Refused(r).into_response())?;
        let raw = req.uri().query().map(str::to_string);
        let body = Bytes::from_request(req, st)
            .await
            .map_err(IntoResponse::into_response)?;
        let p = params(raw, &body).map_err(IntoResponse::into_response)?;
        Ok(Req {
            st: st.clone(),
            peer,
            p,
        })
    }
}

impl Req {
    fn reader(&self) -> Result<(Reader, Budget), Error> {
        reader(&self.st, &self.peer, &self.p)
    }
}

fn respond(r: Result<Json, Error>) -> Response {
    match r {
        Ok(data) => success(data),
        Err(e) => e.into_response(),
    }
}

async fn query(r: Req) -> Response {
    respond(instant_query(r).await)
}

async fn instant_query(r: Req) -> Result<Json, Error> {
    let expr = parse_query(&r.p)?;
    let t = match param(&r.p, "time") {
        Some(t) => parse_time(t, "time")?,
        None => now_ms(),
    };
    let (reader, mut budget) = r.reader()?;
    let v = blocking(move || eval::evaluate(&reader, &expr, Steps::instant(t), &mut budget)).await?;
    Ok(match v {
        Value::Scalar(s) => json!({"resultType": "scalar", "result": point(t, s[0])}),
        Value::Vector(rows) => {
            let result: Vec<Json> = rows
                .iter()
                .filter_map(|r| {
                    r.values[0].map(|v| json!({"metric": metric(&r.labels), "value": point(t, v)}))
                })
                .collect();
            json!({"resultType": "vector", "result": result})
        }
        Value::Matrix(m) => {
            let result: Vec<Json> = m
                .iter()
                .map(|s| {
                    json!({
                        "metric": metric(&s.labels),
                        "values": s.samples.iter().map(|(t, v)| point(*t, *v)).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({"resultType": "matrix", "result": result})
        }
    })
}

async fn query_range(r: Req) -> Response {
    respond(range_query(r).await)
}

async fn range_query(r: Req) -> Result<Json, Error> {
    let need =
        |n: &str| param(&r.p, n).ok_or_else(|| Error::BadData(format!("invalid parameter \"{n}\": missing")));
    let start = parse_time(need("start")?, "start")?;
    let end = parse_time(need("end")?, "end")?;
    let step = parse_duration(need("step")?, "step")?;
    let steps = Steps::range(start, end, step)?;
    let expr = parse_query(&r.p)?;
    let (reader, mut budget) = r.reader()?;
    let v = blocking(move || eval::evaluate(&reader, &expr, steps, &mut budget)).await?;
    let rows = match v {
        Value::Scalar(s) => vec![eval::Row {
            labels: Vec::new(),
            values: s.into_iter().map(Some).collect(),
        }],
        Value::Vector(rows) => rows,
        Value::Matrix(_) => return Err(Error::BadData(eval::RANGE_VECTOR_IN_RANGE_QUERY.into())),
    };
    let mut result: Vec<(Vec<(String, String)>, Json)> = rows
        .into_iter()
        .map(|r| {
            let values: Vec<Json> = r
                .values
                .iter()
                .enumerate()
                .filter_map(|(k, v)| v.map(|v| point(steps.at(k), v)))
                .collect();
            let m = json!({"metric": metric(&r.labels), "values": values});
            (r.labels, m)
        })
        .collect();
    result.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(json!({"resultType": "matrix", "result": result.into_iter().map(|r| r.1).collect::<Vec<_>>()}))
}

/// The series selected by every `match[]` (all series without one, when `required` is
/// false), in `[start, end]`.
async fn matched(r: &Req, required: bool) -> Result<Vec<SeriesRef>, Error> {
    let p = &r.p;
    let start = param(p, "start").map(|t| parse_time(t, "start")).transpose()?;
    let end = param(p, "end").map(|t| parse_time(t, "end")).transpose()?;
    let mut selectors = Vec::new();
    for (_, m) in p.iter().filter(|(k, _)| k == "match[]") {
        match promql_parser::parser::parse(m) {
            Ok(promql_parser::parser::Expr::VectorSelector(vs)) => {
                selectors.push(eval::selector_matchers(&vs)?)
            }
            Ok(_) => {
                return Err(Error::BadData(format!(
                    "invalid parameter \"match[]\": {m:?} is not a series selector"
                )))
            }
            Err(e) => return Err(Error::BadData(format!("invalid parameter \"match[]\": {e}"))),
        }
    }
    if selectors.is_empty() {
        if required {
            return Err(Error::BadData("no match[] parameter provided".into()));
        }
        selectors.push(Vec::new());
    }
    let (reader, _) = r.reader()?;
    blocking(move || {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for m in selectors {
            for s in reader.list(&m, start.unwrap_or(i64::MIN), end.unwrap_or(i64::MAX))? {
                if seen.insert(s.labels.clone()) {
                    out.push(s);
                }
            }
        }
        Ok(out)
    })
    .await
}

async fn series(r: Req) -> Response {
    respond(
        matched(&r, true)
            .await
            .map(|s| Json::Array(s.iter().map(|s| metric(&s.labels)).collect())),
    )
}

/// The values of label `name` (`None`: the label names) among the matched series.
async fn label_set(r: Req, name: Option<String>) -> Result<Json, Error> {
    let set: BTreeSet<String> = matched(&r, false)
        .await?
        .into_iter()
        .flat_map(|s| s.labels)
        .filter_map(|(k, v)| match &name {
            None => Some(k),
            Some(n) => (*n == k).then_some(v),
        })
        .collect();
    Ok(json!(set))
}

async fn labels(r: Req) -> Response {
    respond(label_set(r, None).await)
}

async fn label_values(Path(name): Path<String>, r: Req) -> Response {
    respond(label_set(r, Some(name)).await)
}

async fn buildinfo() -> Response {
    success(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "revision": "",
        "branch": "",
        "buildUser": "",
        "buildDate": "",
        "goVersion": "",
        "application": "gma archiver",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_times_print_like_prometheus() {
        assert_eq!(format_value(1.0), "1");
        assert_eq!(format_value(0.1), "0.1");
        assert_eq!(format_value(-2.5), "-2.5");
        assert_eq!(format_value(1e21), "1000000000000000000000");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(point(1_435_781_451_781, 1.0), json!([1435781451.781, "1"]));
        assert_eq!(parse_time("1435781451.781", "t"), Ok(1_435_781_451_781));
        assert_eq!(parse_time("2015-07-01T20:10:51.781Z", "t"), Ok(1_435_781_451_781));
        assert!(matches!(parse_time("yesterday", "t"), Err(Error::BadData(_))));
        assert_eq!(parse_duration("15", "step"), Ok(15_000));
        assert_eq!(parse_duration("0.5", "step"), Ok(500));
        assert_eq!(parse_duration("1m30s", "step"), Ok(90_000));
        assert!(matches!(parse_duration("soon", "step"), Err(Error::BadData(_))));
    }

    #[test]
    fn parameters_merge_the_query_string_and_the_form() {
        let p = params(
            Some("query=up&match%5B%5D=a".into()),
            &Bytes::from_static(b"match[]=b&time=1"),
        )
        .unwrap_or_default();
        assert_eq!(param(&p, "query"), Some("up"));
        assert_eq!(p.iter().filter(|(k, _)| k == "match[]").count(), 2);
        assert_eq!(param(&p, "time"), Some("1"));
    }

    #[test]
    fn every_route_has_a_door() {
        let r = routes();
        assert_eq!(r.len(), DOORS.len());
        assert!(r.contains(&("POST", "/api/v1/query_range")));
    }
}
