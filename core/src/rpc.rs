//! The fabric monitoring itself (GMA "middleware sensors"): per-RPC-method request counts,
//! errors and latency, kept by a tower layer around a role's tonic server.
//!
//! [`RpcLayer`] wraps every gRPC server of a role. For each call it records, under the method
//! (`Directory.Register`), one request, an error when the answer's `grpc-status` is not OK, and
//! the latency from the request to the response head: for unary calls the whole call, for
//! streaming calls the time to open the stream (errors inside a stream are not counted here).
//! Two consumers read the figures:
//!
//! - Prometheus: `gma_<role>_rpc_requests_total{method}`, `gma_<role>_rpc_errors_total{method}`
//!   and the histogram `gma_<role>_rpc_duration_seconds{method}`, through the `metrics` facade;
//! - `gma.rpc` events: every period, [`RpcStats::events`] turns the period's figures into one
//!   event per method (requests, errors, latency percentiles from an hdrhistogram), which the
//!   role publishes through its producer hub like any other sensor.
//!
//! Bounded: at most [`MAX_METHODS`] methods are tracked; calls to paths the server does not
//! serve (answered UNIMPLEMENTED) count under `other`, so a client cannot grow the table.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use gma_proto::v1 as pb;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use tonic::codegen::{http, Service};

use crate::event::{dbl, schema, text, EventData};

/// The Prometheus endpoint of every role (`--metrics-listen`, served by the `gma` binary with
/// the role's TLS, client CA and policy; docs/dashboard.md).
pub const METRICS_DOORS: &[crate::authz::Door] = &[crate::authz::Door::policy(
    "GET /metrics (--metrics-listen)",
    &[crate::authz::Action::MetricsRead],
    "served with metrics.read on the role (counters and latencies, no host data)",
)];

/// Name of the events.
pub const RPC_EVENT: &str = "gma.rpc";
/// Methods tracked per role; more count under [`OTHER`].
pub const MAX_METHODS: usize = 128;
/// The method key of calls to unknown paths (and of methods past [`MAX_METHODS`]).
pub const OTHER: &str = "other";
/// Default period of `gma.rpc` events.
pub const DEFAULT_PERIOD_MS: u64 = 10_000;
/// Highest latency the histogram keeps exactly (longer calls count as this), microseconds.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// The `gma.rpc` schema.
pub fn rpc_schema() -> pb::EventSchema {
    schema(
        RPC_EVENT,
        "the fabric's own RPC figures per method and period (middleware sensor)",
        vec![
            dbl("requests", "calls", "calls answered during the period"),
            dbl("errors", "calls", "calls answered with a status other than OK"),
            dbl(
                "p50_ms",
                "ms",
                "median latency to the response head (NaN without calls)",
            ),
            dbl("p99_ms", "ms", "99th percentile latency (NaN without calls)"),
            dbl("max_ms", "ms", "largest latency (NaN without calls)"),
            dbl("period_s", "s", "length of the period"),
            dbl("total_requests", "calls", "calls since the role started"),
            text(
                "role",
                "the role serving the calls: directory, producer, archiver, ...",
            ),
            text("method", "Service.Method"),
        ],
    )
}

/// One method's figures over one period.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodSummary {
    pub method: String,
    pub requests: u64,
    pub errors: u64,
    /// Milliseconds; NaN without calls.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub total_requests: u64,
}

struct Method {
    requests: u64,
    errors: u64,
    total: u64,
    latency_us: Histogram<u64>,
    prom_requests: metrics::Counter,
    prom_errors: metrics::Counter,
    prom_latency: metrics::Histogram,
}

struct Inner {
    methods: BTreeMap<String, Method>,
    since: Instant,
}

/// Per-method RPC figures of one role.
pub struct RpcStats {
    role: String,
    requests_name: String,
    errors_name: String,
    duration_name: String,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for RpcStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcStats")
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The Prometheus names of a role's RPC figures (`gma_<role>_rpc_...`).
pub fn metric_names(role: &str) -> [String; 3] {
    [
        format!("gma_{role}_rpc_requests_total"),
        format!("gma_{role}_rpc_errors_total"),
        format!("gma_{role}_rpc_duration_seconds"),
    ]
}

impl RpcStats {
    /// Figures for `role` (`directory`, `producer`, ...: lowercase letters and `_`, the
    /// metric prefix `gma_<role>_`).
    pub fn new(role: &str) -> Arc<RpcStats> {
        let [requests_name, errors_name, duration_name] = metric_names(role);
        metrics::describe_counter!(requests_name.clone(), "gRPC calls answered, by method");
        metrics::describe_counter!(
            errors_name.clone(),
            "gRPC calls answered with a status other than OK"
        );
        metrics::describe_histogram!(
            duration_name.clone(),
            metrics::Unit::Seconds,
            "gRPC latency to the response head (streams: to the stream opening), by method"
        );
        Arc::new(RpcStats {
            role: role.to_string(),
            requests_name,
            errors_name,
            duration_name,
            inner: Mutex::new(Inner {
                methods: BTreeMap::new(),
                since: Instant::now(),
            }),
        })
    }

    pub fn role(&self) -> &str {
        &self.role
    }

    /// Records one call of `method` (a key such as `Directory.Register`).
    pub fn record(&self, method: &str, ok: bool, latency: Duration) {
        let mut inner = self.inner.lock();
        let key = if inner.methods.contains_key(method) || inner.methods.len() < MAX_METHODS - 1 {
            method
        } else {
            OTHER
        };
        if !inner.methods.contains_key(key) {
            let label = [("method", key.to_string())];
            let m = Method {
                requests: 0,
                errors: 0,
                total: 0,
                latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 2)
                    .unwrap_or_else(|_| Histogram::new(2).unwrap_or_else(|_| unreachable!())),
                prom_requests: metrics::counter!(self.requests_name.clone(), &label),
                prom_errors: metrics::counter!(self.errors_name.clone(), &label),
                prom_latency: metrics::histogram!(self.duration_name.clone(), &label),
            };
            inner.methods.insert(key.to_string(), m);
        }
        let Some(m) = inner.methods.get_mut(key) else {
            return;
        };
        m.requests += 1;
        m.total += 1;
        m.prom_requests.increment(1);
        if !ok {
            m.errors += 1;
            m.prom_errors.increment(1);
        }
        let us = (latency.as_micros() as u64).clamp(1, MAX_LATENCY_US);
        m.latency_us.saturating_record(us);
        m.prom_latency.record(latency.as_secs_f64());
    }

    /// The figures since the last call (or since the start), every method seen so far, and
    /// the length of that period; starts a new period.
    pub fn take(&self) -> (Duration, Vec<MethodSummary>) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let period = now.duration_since(inner.since);
        inner.since = now;
        let out = inner
            .methods
            .iter_mut()
            .map(|(name, m)| {
                let ms = |q: f64| {
                    if m.requests == 0 {
                        f64::NAN
                    } else {
                        m.latency_us.value_at_quantile(q) as f64 / 1000.0
                    }
                };
                let s = MethodSummary {
                    method: name.clone(),
                    requests: m.requests,
                    errors: m.errors,
                    p50_ms: ms(0.5),
                    p99_ms: ms(0.99),
                    max_ms: if m.requests == 0 {
                        f64::NAN
                    } else {
                        m.latency_us.max() as f64 / 1000.0
                    },
                    total_requests: m.total,
                };
                m.requests = 0;
                m.errors = 0;
                // Empty when the method was not called this period: clearing its counts (every
                // bucket of the histogram) would be most of an idle agent's work here.
                if s.requests > 0 {
                    m.latency_us.reset();
                }
                s
            })
            .collect();
        (period, out)
    }

    /// One `gma.rpc` event per method for the period just ended (see [`RpcStats::take`]),
    /// with source `<source>/<method>` (one series per method).
    pub fn events(&self, source: &str, timestamp_ns: i64) -> Vec<EventData> {
        let (period, methods) = self.take();
        methods
            .into_iter()
            .map(|m| EventData {
                name: RPC_EVENT.into(),
                source: format!("{source}/{}", m.method),
                timestamp_ns,
                numbers: vec![
                    m.requests as f64,
                    m.errors as f64,
                    m.p50_ms,
                    m.p99_ms,
                    m.max_ms,
                    period.as_secs_f64(),
                    m.total_requests as f64,
                ],
                strings: vec![self.role.clone(), m.method],
            })
            .collect()
    }

    fn record_call(&self, path: &str, status: Option<i32>, latency: Duration) {
        let ok = status.unwrap_or(0) == 0;
        let method = method_key(path);
        // An unknown path is answered UNIMPLEMENTED by the router: count it as `other` unless
        // it names a method already known (a real method may answer UNIMPLEMENTED too).
        if status == Some(tonic::Code::Unimplemented as i32)
            && !self.inner.lock().methods.contains_key(&method)
        {
            self.record(OTHER, false, latency);
            return;
        }
        self.record(&method, ok, latency);
    }
}

/// `/gma.v1.Directory/Register` -> `Directory.Register`; anything unexpected -> [`OTHER`].
pub fn method_key(path: &str) -> String {
    let Some((service, method)) = path.trim_start_matches('/').split_once('/') else {
        return OTHER.into();
    };
    let service = service.rsplit('.').next().unwrap_or(service);
    let ok =
        |s: &str| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok(service) && ok(method) {
        format!("{service}.{method}")
    } else {
        OTHER.into()
    }
}

/// The `grpc-status` of a response head, if it carries one (trailers-only answers: errors).
fn grpc_status(headers: &http::HeaderMap) -> Option<i32> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse().ok())
}

/// The tower layer that records every call of a server into an [`RpcStats`]:
/// `Server::builder().layer(RpcLayer::new(stats))`.
#[derive(Clone)]
pub struct RpcLayer {
    stats: Arc<RpcStats>,
}

impl RpcLayer {
    pub fn new(stats: Arc<RpcStats>) -> RpcLayer {
        RpcLayer { stats }
    }
}

impl<S> tower_layer::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> RpcService<S> {
        RpcService {
            inner,
            stats: self.stats.clone(),
        }
    }
}

/// See [`RpcLayer`].
#[derive(Clone)]
pub struct RpcService<S> {
    inner: S,
    stats: Arc<RpcStats>,
}

impl<S, B, RB> Service<http::Request<B>> for RpcService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_string();
        let stats = self.stats.clone();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            let status = match &r {
                Ok(resp) => grpc_status(resp.headers()),
                Err(_) => Some(tonic::Code::Internal as i32),
            };
            stats.record_call(&path, status, start.elapsed());
            r
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn method_keys() {
        assert_eq!(method_key("/gma.v1.Directory/Register"), "Directory.Register");
        assert_eq!(method_key("/grpc.health.v1.Health/Check"), "Health.Check");
        assert_eq!(method_key("/"), OTHER);
        assert_eq!(method_key("/a/b/c"), OTHER);
        assert_eq!(method_key("/x y/z"), OTHER);
    }

    #[test]
    fn a_period_reports_counts_and_percentiles_then_resets() {
        let s = RpcStats::new("test");
        for ms in 1..=100u64 {
            s.record("Svc.A", ms % 10 != 0, Duration::from_millis(ms));
        }
        s.record("Svc.B", true, Duration::from_micros(500));
        let ev = s.events("node1", 42);
        assert_eq!(ev.len(), 2);
        let a = &ev[0];
        assert_eq!(a.source, "node1/Svc.A");
        assert_eq!(a.strings, vec!["test".to_string(), "Svc.A".to_string()]);
        assert_eq!(a.numbers[0], 100.0);
        assert_eq!(a.numbers[1], 10.0);
        assert!((a.numbers[2] - 50.0).abs() < 1.0, "{}", a.numbers[2]);
        assert!((a.numbers[3] - 99.0).abs() < 1.5, "{}", a.numbers[3]);
        assert!((a.numbers[4] - 100.0).abs() < 1.0, "{}", a.numbers[4]);
        assert_eq!(a.numbers[6], 100.0);
        crate::event::validate_schema(&rpc_schema()).unwrap();
        let layout = crate::event::Layout::of(&rpc_schema().fields);
        assert_eq!(
            (layout.doubles, layout.strings),
            (a.numbers.len(), a.strings.len())
        );
        // The next period: nothing happened, every known method reports zero.
        let ev = s.events("node1", 43);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].numbers[0], 0.0);
        assert!(ev[0].numbers[2].is_nan());
        assert_eq!(ev[0].numbers[6], 100.0);
    }

    #[test]
    fn the_method_table_is_bounded() {
        let s = RpcStats::new("test");
        for i in 0..1000 {
            s.record(&format!("Svc.M{i}"), true, Duration::from_millis(1));
        }
        let (_, m) = s.take();
        assert_eq!(m.len(), MAX_METHODS);
        let other = m.iter().find(|m| m.method == OTHER).unwrap();
        assert_eq!(other.requests, 1000 - (MAX_METHODS as u64 - 1));
        // Unknown paths (UNIMPLEMENTED) never make a new entry.
        let s = RpcStats::new("test");
        s.record_call("/x.Y/Nope", Some(12), Duration::from_millis(1));
        let (_, m) = s.take();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].method, OTHER);
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn rpc_schema_is_pinned() {
        assert_eq!(
            crate::event::signature(&rpc_schema()),
            "gma.rpc v1: requests double calls, errors double calls, p50_ms double ms, p99_ms double ms, max_ms double ms, period_s double s, total_requests double calls, role string, method string"
        );
    }
}
