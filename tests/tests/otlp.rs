//! OpenTelemetry metrics into a producer (issue 23, item 4), with real processes: the Python
//! OpenTelemetry SDK (from the kit's venv) exports a gauge, a counter and a histogram over
//! OTLP/gRPC to `gma producer --otlp-listen`; `gma subscribe` reads the events back with the
//! values sent, and their schemas are in the directory. Bytes that are not an OTLP request
//! get INVALID_ARGUMENT, a request over 4 MiB OUT_OF_RANGE, a point without a value is counted
//! in `partial_success`, and the producer keeps serving after all three.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::python::{python, run_py};
use common::*;
use gma_proto::v1 as pb;

/// argv: OTLP address, step ("bad" or "sdk"). "bad": a malformed request and a request with a
/// point without a value, by hand. "sdk": the SDK's exporter sends a gauge, a counter and a
/// histogram.
const CLIENT: &str = r#"
import json, sys
import grpc

addr, step = sys.argv[1], sys.argv[2]
out = {}
if step == "bad":
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as ms
    from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
    ch = grpc.insecure_channel(addr)
    raw = ch.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
    try:
        raw(b"\xff\xff\xff\xff not protobuf", timeout=10)
        out["malformed"] = "OK"
    except grpc.RpcError as e:
        out["malformed"] = e.code().name
        out["malformed_message"] = e.details()
    try:
        raw(b"\x00" * (5 << 20), timeout=20)
        out["oversized"] = "OK"
    except grpc.RpcError as e:
        out["oversized"] = e.code().name
    export = ch.unary_unary(
        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        request_serializer=ms.ExportMetricsServiceRequest.SerializeToString,
        response_deserializer=ms.ExportMetricsServiceResponse.FromString)
    req = ms.ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    g = sm.metrics.add(name="shop.novalue")
    g.gauge.data_points.add(time_unix_nano=1)
    ok = sm.metrics.add(name="shop.bad_ok")
    ok.gauge.data_points.add(as_double=1.0)
    resp = export(req, timeout=10)
    out["rejected"] = resp.partial_success.rejected_data_points
    out["rejected_message"] = resp.partial_success.error_message
else:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    exp = OTLPMetricExporter(endpoint=addr, insecure=True, timeout=10)
    reader = PeriodicExportingMetricReader(exp, export_interval_millis=3_600_000)
    mp = MeterProvider(resource=Resource.create({"service.name": "shop", "host.name": "n1"}),
                       metric_readers=[reader])
    meter = mp.get_meter("gma-test")
    meter.create_gauge("shop.temperature", unit="Cel").set(42.5, {"room": "a"})
    c = meter.create_counter("shop.orders")
    c.add(3)
    c.add(4)
    h = meter.create_histogram("shop.latency", unit="ms")
    for v in (1, 7, 30):
        h.record(v)
    # The exporter logs a failed export instead of raising: ask it directly.
    out["flushed"] = reader.force_flush(timeout_millis=10_000)
    mp.shutdown()
print(json.dumps(out))
"#;

/// `gma subscribe PATTERN --producer ADDR --count N` resumed from the producer's first event
/// (a `--state` file with seq 1 of its run), so it reads what was sent before it started.
fn subscribe(
    prod: &Proc,
    state: &std::path::Path,
    pattern: &str,
    count: usize,
) -> Result<Vec<serde_json::Value>, String> {
    let epoch: u64 = prod
        .stderr_text()
        .lines()
        .find_map(|l| l.strip_prefix("gma producer run: epoch "))
        .and_then(|e| e.trim().parse().ok())
        .ok_or("the producer printed no epoch")?;
    let file = serde_json::json!({"producers": {prod.addr.clone(): {"epoch": epoch, "next_seq": 1}}});
    std::fs::write(state, file.to_string()).map_err(|e| e.to_string())?;
    let n = count.to_string();
    let r = gma(
        &[
            "subscribe",
            pattern,
            "--producer",
            &prod.addr,
            "--state",
            state.to_str().unwrap(),
            "--count",
            &n,
            "--output",
            "json",
        ],
        Duration::from_secs(30),
    );
    if r.code != 0 {
        return Err(r.stderr);
    }
    Ok(json_lines(&r.stdout))
}

#[test]
fn the_python_opentelemetry_sdk_exports_metrics_that_gma_subscribe_reads_back() {
    let py = python();
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let prod = Proc::producer(&[
        "--no-host-sensors",
        "--directory",
        &dir.addr,
        "--otlp-listen",
        "127.0.0.1:0",
    ]);
    let otlp = printed_addr(&prod, "producer", "otlp");

    // Bad input first: the producer must still serve the SDK afterwards.
    let bad = run_py(&py, tmp.path(), "otlp_client.py", CLIENT, &[&otlp, "bad"]);
    assert_eq!(bad["malformed"], "INVALID_ARGUMENT", "{bad}");
    // Over gma_core::MAX_MESSAGE_BYTES (4 MiB): refused by the transport before decoding.
    assert_eq!(bad["oversized"], "OUT_OF_RANGE", "{bad}");
    assert_eq!(bad["rejected"].as_i64(), Some(1), "{bad}");
    assert!(
        bad["rejected_message"].as_str().unwrap().contains("has no value"),
        "{bad}"
    );

    let sdk = run_py(&py, tmp.path(), "otlp_client.py", CLIENT, &[&otlp, "sdk"]);
    assert_eq!(sdk["flushed"], true, "{sdk}");

    // The SDK exports twice (force_flush, then shutdown collects again): the latest of each
    // series holds the values sent. The last gauge of the well-formed "bad" request is there
    // too, from its own source.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let events = rt.block_on(wait_for(
        "gma subscribe to read 7 otel.shop events",
        Duration::from_secs(30),
        || async { subscribe(&prod, &tmp.path().join("sub.state"), "otel.shop.*", 7) },
    ));
    let last = |name: &str| {
        events
            .iter()
            .rev()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {events:?}"))
            .clone()
    };
    let g = last("otel.shop.temperature");
    assert_eq!(g["source"], "shop@n1{room=a}", "{g}");
    assert_eq!(g["values"]["value"], 42.5, "{g}");
    let c = last("otel.shop.orders");
    assert_eq!(c["source"], "shop@n1", "{c}");
    assert_eq!(c["values"]["value"], 7.0, "a cumulative sum of 3 + 4: {c}");
    let h = last("otel.shop.latency");
    assert_eq!(h["values"]["count"], 3.0, "{h}");
    assert_eq!(h["values"]["sum"], 38.0, "{h}");
    assert_eq!(h["values"]["min"], 1.0, "{h}");
    assert_eq!(h["values"]["max"], 30.0, "{h}");
    // The SDK's default bounds are 0, 5, 10, 25, ...: 1 in (0, 5], 7 in (5, 10], 30 in (25, 50].
    let buckets: Vec<f64> = (0..16)
        .map(|i| h["values"][format!("bucket_{i}")].as_f64().unwrap())
        .collect();
    let mut want = vec![0.0; 16];
    want[1] = 1.0;
    want[2] = 1.0;
    want[4] = 1.0;
    assert_eq!(buckets, want, "{h}");

    // The schemas are in the directory (the producer registered them).
    let schema = rt.block_on(async {
        let c = gma_consumer::directory::client(&dir.addr).await.unwrap();
        wait_for(
            "otel.shop.latency in the directory",
            Duration::from_secs(30),
            || {
                let mut c = c.clone();
                async move {
                    c.get_schema(pb::GetSchemaRequest {
                        name: "otel.shop.latency".into(),
                        version: 0,
                    })
                    .await
                    .map_err(|s| s.to_string())?
                    .into_inner()
                    .schema
                    .ok_or_else(|| "no schema in the answer".to_string())
                }
            },
        )
        .await
    });
    let fields: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(fields[..5], ["count", "sum", "min", "max", "bucket_0"]);
    assert_eq!(fields.len(), 4 + 16);
    assert!(
        schema.description.contains("cumulative"),
        "{}",
        schema.description
    );
    assert!(
        schema.fields[4 + 15].description.contains("+Inf"),
        "{:?}",
        schema.fields[19]
    );
}
