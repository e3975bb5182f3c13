//! OTLP/gRPC metrics into a producer (`gma producer --otlp-listen ADDR`, docs/otlp.md): the
//! OpenTelemetry `MetricsService/Export` on its own listener, behind the producer's TLS and
//! access policy (`ingest` on each event name). Each data point becomes one event of a schema
//! made from its metric and registered in the hub (and so in the directory):
//!
//! - event name `otel.<metric name>` (characters other than letters, digits, `_`, `-`, `.`
//!   become `_`);
//! - source: the resource's `service.name` and `host.name` (`checkout@node1`, either alone
//!   when the other is missing, `unknown_service` when both are), then the data point's
//!   attributes sorted by key in braces (`checkout@node1{route=/a,status=200}`): every
//!   attribute set is its own series, as in OpenTelemetry;
//! - gauge and sum: one double field `value` (an integer point is converted); a sum's
//!   temporality and monotonicity are in the schema's description, the value is stored as
//!   sent (a cumulative counter stays cumulative);
//! - histogram: `count`, `sum`, `min`, `max` (NaN when the point has none) and one field per
//!   bucket, `bucket_0` .. `bucket_N` (the per-bucket counts as sent, not cumulative; the
//!   upper bounds are in the fields' descriptions, the last is +Inf).
//!
//! Exponential histograms and summaries are not converted. Bad input never stops the
//! producer: bytes that are not an `ExportMetricsServiceRequest` get INVALID_ARGUMENT (our
//! codec), a request over [`gma_core::MAX_MESSAGE_BYTES`] is refused by the transport, and
//! points that cannot be converted (no value, a bad name or time, a metric whose shape changed,
//! past [`MAX_POINTS`]) are counted in `partial_success` with the first reason, as OTLP clients
//! expect; the rest are published.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::task::{Context, Poll};

use gma_core::authz::{Action, Door};
use gma_core::event::EventData;
use gma_core::guard::Gate;
use gma_core::Refuse;
use gma_proto::v1 as pb;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point, Metric};
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::hub::Hub;

/// The OTLP metrics service's full name.
pub const SERVICE_NAME: &str = "opentelemetry.proto.collector.metrics.v1.MetricsService";
/// Its one RPC.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// The door of `--otlp-listen` (docs/security.md).
pub const DOORS: &[Door] = &[Door::policy(
    EXPORT_PATH,
    &[Action::Ingest],
    "PERMISSION_DENIED: only allow lets an identity publish (ingest on otel.<metric>)",
)];

/// Most data points converted from one request; the rest are rejected in `partial_success`.
pub const MAX_POINTS: usize = crate::service::MAX_INGEST_EVENTS;
/// Prefix of every event name made from an OTLP metric.
pub const PREFIX: &str = "otel.";
/// Most buckets of a histogram point (the fields of a schema are bounded).
pub const MAX_BUCKETS: usize = gma_core::event::MAX_FIELDS - 4;

/// The OTLP `MetricsService`, publishing into the producer's hub.
#[derive(Clone)]
pub struct OtlpMetrics {
    pub hub: Arc<Hub>,
    pub gate: Arc<Gate>,
}

/// What one request converts to.
#[derive(Default)]
struct Converted {
    schemas: BTreeMap<String, pb::EventSchema>,
    events: Vec<EventData>,
    rejected: i64,
    first_error: Option<String>,
}

impl Converted {
    fn reject(&mut self, n: usize, why: impl FnOnce() -> String) {
        self.rejected += n as i64;
        if self.first_error.is_none() {
            self.first_error = Some(why());
        }
    }
}

/// The event name of a metric.
fn event_name(metric: &str) -> Result<String, Error> {
    let clean: String = metric
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!("{PREFIX}{clean}");
    gma_core::pattern::validate_event_name(&name)
        .map_err(|e| Error::invalid_argument(format!("metric {:?}: {e}", gma_core::clip(metric, 80))))?;
    Ok(name)
}

/// An attribute value as text (no spaces or control characters: a source is printable ASCII).
fn attr_text(v: Option<&any_value::Value>) -> String {
    let s = match v {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BytesValue(b)) => format!("{} bytes", b.len()),
        Some(any_value::Value::ArrayValue(_)) => "array".into(),
        Some(any_value::Value::KvlistValue(_)) => "kvlist".into(),
        Some(any_value::Value::StringValueStrindex(i)) => format!("strindex{i}"),
        None => String::new(),
    };
    s.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect()
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// The source part from a resource: `service.name@host.name`.
fn resource_source(attrs: &[KeyValue]) -> String {
    let service = attr(attrs, "service.name").map(|v| attr_text(Some(v)));
    let host = attr(attrs, "host.name").map(|v| attr_text(Some(v)));
    match (service, host) {
        (Some(s), Some(h)) if !s.is_empty() && !h.is_empty() => format!("{s}@{h}"),
        (Some(s), _) if !s.is_empty() => s,
        (_, Some(h)) if !h.is_empty() => h,
        _ => "unknown_service".into(),
    }
}

/// The series' source: the resource's, then the point's attributes sorted by key.
fn point_source(base: &str, attrs: &[KeyValue]) -> Result<String, Error> {
    let mut source = base.to_string();
    if !attrs.is_empty() {
        let mut kv: Vec<(String, String)> = attrs
            .iter()
            .map(|a| {
                (
                    attr_text(Some(&any_value::Value::StringValue(a.key.clone()))),
                    attr_text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                )
            })
            .collect();
        kv.sort();
        let inner: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        source.push('{');
        source.push_str(&inner.join(","));
        source.push('}');
    }
    gma_core::pattern::validate_source(&source).map_err(|e| Error::invalid_argument(e.to_string()))?;
    Ok(source)
}

/// A point's time: OTLP's unsigned ns, 0 = now.
fn point_time(ns: u64, now: i64) -> Result<i64, Error> {
    if ns == 0 {
        return Ok(now);
    }
    let t = i64::try_from(ns)
        .map_err(|_| Error::invalid_argument(format!("time_unix_nano {ns} is out of range")))?;
    gma_core::time::check_timestamp_ns(t).map_err(|e| Error::invalid_argument(e.to_string()))?;
    Ok(t)
}

fn temporality(t: i32) -> &'static str {
    match t {
        1 => "delta",
        2 => "cumulative",
        _ => "unspecified",
    }
}

/// The schema of a gauge or sum.
fn value_schema(name: &str, m: &Metric, kind: String) -> pb::EventSchema {
    let mut s = gma_core::event::schema(
        name,
        &format!("OTLP {kind}: {}", m.description),
        vec![gma_core::event::dbl("value", &m.unit, "the data point's value")],
    );
    s.description = s.description.trim_end_matches(": ").to_string();
    s
}

/// The schema of a histogram with `bounds`.
fn histogram_schema(name: &str, m: &Metric, t: i32, bounds: &[f64], buckets: usize) -> pb::EventSchema {
    let mut fields = vec![
        gma_core::event::dbl("count", "", "number of values recorded"),
        gma_core::event::dbl("sum", &m.unit, "sum of the values recorded (NaN if not sent)"),
        gma_core::event::dbl("min", &m.unit, "smallest value (NaN if not sent)"),
        gma_core::event::dbl("max", &m.unit, "largest value (NaN if not sent)"),
    ];
    for i in 0..buckets {
        let le = bounds
            .get(i)
            .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
        fields.push(gma_core::event::dbl(
            &format!("bucket_{i}"),
            "",
            &format!("values in this bucket (upper bound {le})"),
        ));
    }
    gma_core::event::schema(
        name,
        &format!(
            "OTLP histogram, {} temporality: {}",
            temporality(t),
            m.description
        ),
        fields,
    )
}

impl Converted {
    /// Adds `schema` for this request, or says why it cannot be (another shape already).
    fn schema(&mut self, hub: &Hub, schema: pb::EventSchema) -> Result<(), Error> {
        let known = hub.lock().schema(&schema.name).cloned();
        let here = self.schemas.get(&schema.name);
        for old in known.iter().chain(here) {
            if old.fields != schema.fields {
                return Err(Error::invalid_argument(format!(
                    "metric {} changed its shape (fields or histogram bounds); a producer keeps one per metric",
                    schema.name
                )));
            }
        }
        if known.is_none() {
            self.schemas.insert(schema.name.clone(), schema);
        }
        Ok(())
    }

    fn push(
        &mut self,
        name: &str,
        source: Result<String, Error>,
        time: Result<i64, Error>,
        numbers: Vec<f64>,
    ) {
        if self.events.len() >= MAX_POINTS {
            return self.reject(1, || format!("more than {MAX_POINTS} data points in one request"));
        }
        match (source, time) {
            (Ok(source), Ok(timestamp_ns)) => self.events.push(EventData {
                name: name.to_string(),
                source,
                timestamp_ns,
                numbers,
                strings: Vec::new(),
            }),
            (Err(e), _) | (_, Err(e)) => self.reject(1, || e.to_string()),
        }
    }

    fn metric(&mut self, hub: &Hub, base: &str, m: &Metric, now: i64) {
        let points = match &m.data {
            Some(Data::Gauge(g)) => g.data_points.len(),
            Some(Data::Sum(s)) => s.data_points.len(),
            Some(Data::Histogram(h)) => h.data_points.len(),
            Some(Data::ExponentialHistogram(h)) => h.data_points.len(),
            Some(Data::Summary(s)) => s.data_points.len(),
            None => 0,
        };
        let name = match event_name(&m.name) {
            Ok(n) => n,
            Err(e) => return self.reject(points, || e.to_string()),
        };
        let numbers = |pts: &[opentelemetry_proto::tonic::metrics::v1::NumberDataPoint],
                       this: &mut Converted| {
            for p in pts {
                let v = match p.value {
                    Some(number_data_point::Value::AsDouble(d)) => d,
                    Some(number_data_point::Value::AsInt(i)) => i as f64,
                    None => {
                        this.reject(1, || format!("a point of {} has no value", m.name));
                        continue;
                    }
                };
                this.push(
                    &name,
                    point_source(base, &p.attributes),
                    point_time(p.time_unix_nano, now),
                    vec![v],
                );
            }
        };
        match &m.data {
            None => self.reject(1, || format!("metric {} has no data", m.name)),
            Some(Data::Gauge(g)) => {
                if let Err(e) = self.schema(hub, value_schema(&name, m, "gauge".into())) {
                    return self.reject(points, || e.to_string());
                }
                numbers(&g.data_points, self);
            }
            Some(Data::Sum(s)) => {
                let kind = format!(
                    "sum, {}, {} temporality",
                    if s.is_monotonic {
                        "monotonic"
                    } else {
                        "not monotonic"
                    },
                    temporality(s.aggregation_temporality)
                );
                if let Err(e) = self.schema(hub, value_schema(&name, m, kind)) {
                    return self.reject(points, || e.to_string());
                }
                numbers(&s.data_points, self);
            }
            Some(Data::Histogram(h)) => {
                for p in &h.data_points {
                    let buckets = p.bucket_counts.len();
                    if buckets != 0 && buckets != p.explicit_bounds.len() + 1 {
                        self.reject(1, || {
                            format!(
                                "a point of {} has {buckets} bucket counts for {} bounds (want bounds + 1)",
                                m.name,
                                p.explicit_bounds.len()
                            )
                        });
                        continue;
                    }
                    if buckets > MAX_BUCKETS {
                        self.reject(1, || {
                            format!("a point of {} has more than {MAX_BUCKETS} buckets", m.name)
                        });
                        continue;
                    }
                    let schema =
                        histogram_schema(&name, m, h.aggregation_temporality, &p.explicit_bounds, buckets);
                    if let Err(e) = self.schema(hub, schema) {
                        self.reject(1, || e.to_string());
                        continue;
                    }
                    let mut values = vec![
                        p.count as f64,
                        p.sum.unwrap_or(f64::NAN),
                        p.min.unwrap_or(f64::NAN),
                        p.max.unwrap_or(f64::NAN),
                    ];
                    values.extend(p.bucket_counts.iter().map(|c| *c as f64));
                    self.push(
                        &name,
                        point_source(base, &p.attributes),
                        point_time(p.time_unix_nano, now),
                        values,
                    );
                }
            }
            Some(Data::ExponentialHistogram(_)) => self.reject(points, || {
                format!(
                    "metric {}: exponential histograms are not accepted (docs/otlp.md)",
                    m.name
                )
            }),
            Some(Data::Summary(_)) => self.reject(points, || {
                format!("metric {}: summaries are not accepted (docs/otlp.md)", m.name)
            }),
        }
    }
}

/// Converts a request into schemas and events (and the points it rejects).
fn convert(hub: &Hub, req: &ExportMetricsServiceRequest, now: i64) -> Converted {
    let mut out = Converted::default();
    for rm in &req.resource_metrics {
        let attrs = rm.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
        let base = resource_source(attrs);
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                out.metric(hub, &base, m, now);
            }
        }
    }
    out
}

impl OtlpMetrics {
    async fn export(
        &self,
        req: Request<ExportMetricsServiceRequest>,
    ) -> Result<ExportMetricsServiceResponse, Status> {
        let who = self.gate.admit(&req)?;
        let req = req.into_inner();
        let mut c = convert(&self.hub, &req, gma_core::time::now_ns());
        let mut names: Vec<&str> = c.events.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        if !names.is_empty() {
            crate::service::authorize_ingest(&self.gate, &who, &names)?;
        }
        let schemas: Vec<pb::EventSchema> = std::mem::take(&mut c.schemas).into_values().collect();
        if !schemas.is_empty() {
            self.hub.add_schemas(&schemas).map_err(Error::from)?;
        }
        let (_, published) = self.hub.publish(&c.events);
        if let Err(e) = published {
            // The hub skipped the events it refused; counted as one rejection with its reason
            // (the hub names only the first).
            c.reject(1, || e.to_string());
        }
        metrics::counter!(crate::telemetry::OTLP_POINTS).increment(c.events.len() as u64);
        let partial_success = (c.rejected > 0).then(|| ExportMetricsPartialSuccess {
            rejected_data_points: c.rejected,
            error_message: c.first_error.unwrap_or_default(),
        });
        Ok(ExportMetricsServiceResponse { partial_success })
    }
}

/// The tonic server of [`OtlpMetrics`]: the generated one of `opentelemetry-proto`, except
/// for its codec, ours (`gma_proto::codec`), so bytes that are not a request get
/// INVALID_ARGUMENT (what OTLP clients expect for a malformed request: not retried), where
/// tonic-prost answers INTERNAL.
#[derive(Clone)]
pub struct OtlpMetricsServer {
    inner: Arc<OtlpMetrics>,
}

impl OtlpMetricsServer {
    pub fn new(inner: OtlpMetrics) -> Self {
        OtlpMetricsServer {
            inner: Arc::new(inner),
        }
    }
}

impl tonic::server::NamedService for OtlpMetricsServer {
    const NAME: &'static str = SERVICE_NAME;
}

struct ExportSvc(Arc<OtlpMetrics>);

impl tonic::server::UnaryService<ExportMetricsServiceRequest> for ExportSvc {
    type Response = ExportMetricsServiceResponse;
    type Future = BoxFuture<Response<Self::Response>, Status>;

    fn call(&mut self, req: Request<ExportMetricsServiceRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.export(req).await.map(Response::new) })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for OtlpMetricsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        if req.uri().path() != EXPORT_PATH {
            return Box::pin(async move {
                Ok(Status::unimplemented(format!(
                    "{SERVICE_NAME} serves Export only (metrics; traces and logs are not accepted)"
                ))
                .into_http())
            });
        }
        Box::pin(async move {
            let codec = gma_proto::codec::ProstCodec::<
                ExportMetricsServiceResponse,
                ExportMetricsServiceRequest,
            >::default();
            let mut grpc = tonic::server::Grpc::new(codec)
                .apply_max_message_size_config(Some(gma_core::MAX_MESSAGE_BYTES), None);
            Ok(grpc.unary(ExportSvc(inner), req).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Histogram, HistogramDataPoint, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.into())),
            }),
            ..Default::default()
        }
    }

    fn request(metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "svc"), kv("host.name", "n1")],
                    ..Default::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn gauge(name: &str, v: Option<f64>, attrs: Vec<KeyValue>) -> Metric {
        Metric {
            name: name.into(),
            data: Some(Data::Gauge(Gauge {
                data_points: vec![NumberDataPoint {
                    attributes: attrs,
                    time_unix_nano: 1_700_000_000_000_000_000,
                    value: v.map(number_data_point::Value::AsDouble),
                    ..Default::default()
                }],
            })),
            ..Default::default()
        }
    }

    fn hist(bounds: Vec<f64>, counts: Vec<u64>) -> Metric {
        Metric {
            name: "lat".into(),
            unit: "ms".into(),
            data: Some(Data::Histogram(Histogram {
                data_points: vec![HistogramDataPoint {
                    count: counts.iter().sum(),
                    sum: Some(12.5),
                    bucket_counts: counts,
                    explicit_bounds: bounds,
                    ..Default::default()
                }],
                aggregation_temporality: 2,
            })),
            ..Default::default()
        }
    }

    #[test]
    fn gauges_and_histograms_become_events_and_bad_points_are_counted() {
        let hub = Hub::new(1, 1024);
        let req = request(vec![
            gauge("rp gauge/x", Some(4.5), vec![kv("node", "a b")]),
            gauge("nov", None, vec![]),
            gauge("a..b", Some(1.0), vec![]),
            hist(vec![1.0, 5.0], vec![1, 2, 3]),
            hist(vec![1.0], vec![1, 2, 3]),
        ]);
        let c = convert(&hub, &req, 5);
        assert_eq!(c.events.len(), 2);
        let g = &c.events[0];
        assert_eq!(g.name, "otel.rp_gauge_x");
        assert_eq!(g.source, "svc@n1{node=a_b}");
        assert_eq!(g.numbers, vec![4.5]);
        let h = &c.events[1];
        assert_eq!(h.name, "otel.lat");
        assert_eq!(h.source, "svc@n1");
        assert_eq!(h.timestamp_ns, 5, "time 0 is the producer's now");
        assert_eq!(h.numbers[..2], [6.0, 12.5]);
        assert!(h.numbers[2].is_nan() && h.numbers[3].is_nan());
        assert_eq!(h.numbers[4..], [1.0, 2.0, 3.0]);
        // No value, a name that cannot be an event name, a histogram with the wrong number of
        // buckets.
        assert_eq!(c.rejected, 3);
        assert!(c.first_error.unwrap_or_default().contains("no value"));
        let fields: Vec<&str> = c.schemas["otel.lat"]
            .fields
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(
            fields,
            ["count", "sum", "min", "max", "bucket_0", "bucket_1", "bucket_2"]
        );
    }

    #[test]
    fn a_metric_that_changes_shape_is_rejected() {
        let hub = Hub::new(1, 1024);
        let c = convert(&hub, &request(vec![hist(vec![1.0], vec![1, 2])]), 5);
        hub.add_schemas(&c.schemas.into_values().collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("{e}"));
        let c = convert(&hub, &request(vec![hist(vec![1.0, 2.0], vec![1, 2, 3])]), 5);
        assert_eq!((c.events.len(), c.rejected), (0, 1));
        assert!(c.first_error.unwrap_or_default().contains("changed its shape"));
    }
}
