//! `gma bench stream`, and the producer set-up the other in-process
//! scenarios share.
//!
//! - `stream`: one producer -> one consumer over loopback gRPC, in this process. Phase 1 pushes
//!   as many 3-value events as the consumer can take (the publisher keeps at most half the
//!   resume buffer in flight, so nothing is dropped) and reports events/s and events/s per core
//!   (process CPU time / wall time). Phase 2 publishes at a fixed rate and reports
//!   sample -> consumer latency percentiles (hdrhistogram). With `--tls` both phases run over
//!   mTLS (a throwaway CA, server and client certificate made for the run, as `gma certs`
//!   makes them), for the cost of TLS against the plaintext figures.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_consumer::stream::{ProducerStream, StreamOptions};
use gma_core::codec::{BatchEncoder, SeriesInfo};
use gma_core::event::{dbl, EventData};
use gma_core::time::now_ns;
use gma_core::tls::{ClientTls, ServerTls};
use gma_producer::{Producer, ProducerConfig};
use gma_proto::v1 as pb;
use hdrhistogram::Histogram;

use crate::args::Output;
use crate::report::{cores, emit, proc_usage};

pub fn bench_schema() -> pb::EventSchema {
    pb::EventSchema {
        name: "bench.x".into(),
        version: 1,
        fields: vec![dbl("a", "", ""), dbl("b", "", ""), dbl("c", "", "")],
        description: "benchmark event".into(),
    }
}

pub fn bench_events(n: usize, sources: usize) -> Vec<EventData> {
    (0..n)
        .map(|i| EventData {
            name: "bench.x".into(),
            source: format!("s{}", i % sources),
            timestamp_ns: 0,
            numbers: vec![i as f64, 0.5, 1.0],
            strings: vec![],
        })
        .collect()
}

pub async fn start_producer(
    buffer: usize,
) -> anyhow::Result<(Arc<gma_producer::Hub>, String, tokio::sync::oneshot::Sender<()>)> {
    start_producer_with(buffer, ServerTls::default()).await
}

/// [`start_producer`] serving with `tls`.
async fn start_producer_with(
    buffer: usize,
    tls: ServerTls,
) -> anyhow::Result<(Arc<gma_producer::Hub>, String, tokio::sync::oneshot::Sender<()>)> {
    let p = Producer::new(ProducerConfig {
        host_sensors: false,
        buffer_events: buffer,
        source: Some("bench".into()),
        endpoint: gma_core::endpoint::Endpoint {
            tls,
            ..Default::default()
        },
        ..ProducerConfig::default()
    })
    .map_err(|e| anyhow!("{e}"))?;
    p.hub.add_schemas(&[bench_schema()]).map_err(|e| anyhow!("{e}"))?;
    let hub = p.hub.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(p.run(listener, async {
        let _ = rx.await;
    }));
    Ok((hub, addr, tx))
}

/// Stamps every event with now (the sample time latency is measured from) and publishes.
pub fn stamp_and_publish(hub: &gma_producer::Hub, batch: &mut [EventData]) {
    let ts = now_ns();
    for e in batch.iter_mut() {
        e.timestamp_ns = ts;
    }
    let _ = hub.publish(batch);
}

/// The consumer side: batches of up to 1,000, no reconnect (a broken stream is a failed run).
fn bench_stream(addr: &str) -> ProducerStream {
    ProducerStream::new(
        addr,
        StreamOptions {
            patterns: vec!["bench.*".into()],
            max_batch: 1000,
            reconnect: false,
            ..StreamOptions::default()
        },
    )
}

/// Throwaway mTLS material for a bench run: a CA, a server certificate for 127.0.0.1 and
/// localhost, a client certificate, all ECDSA P-256 like `gma certs` makes them, written as PEM
/// into `dir`. Returns the server settings (mTLS: client certificates of the CA required) and
/// the client settings.
fn bench_pki(dir: &Path) -> anyhow::Result<(ServerTls, ClientTls)> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    ca.distinguished_name.push(DnType::CommonName, "gma bench CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().context("cannot generate the CA key")?;
    let ca_cert = ca
        .self_signed(&ca_key)
        .context("cannot sign the CA certificate")?;
    let ca_pem = write("ca.pem", &ca_cert.pem())?;
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |name: &str| -> anyhow::Result<(PathBuf, PathBuf)> {
        let mut p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .context("certificate parameters")?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("cannot generate a key")?;
        let cert = p
            .signed_by(&key, &issuer)
            .with_context(|| format!("cannot sign the {name} certificate"))?;
        Ok((
            write(&format!("{name}.pem"), &cert.pem())?,
            write(&format!("{name}.key"), &key.serialize_pem())?,
        ))
    };
    let (server_cert, server_key) = leaf("bench-server")?;
    let (client_cert, client_key) = leaf("bench-client")?;
    Ok((
        ServerTls {
            cert: Some(server_cert),
            key: Some(server_key),
            client_ca: Some(ca_pem.clone()),
            ..ServerTls::default()
        },
        ClientTls {
            ca: Some(ca_pem),
            cert: Some(client_cert),
            key: Some(client_key),
        },
    ))
}

struct StreamFigures {
    /// "mtls" or "none".
    tls: &'static str,
    events: u64,
    seconds: f64,
    cpu_seconds: f64,
    dropped: u64,
    bytes_per_event: f64,
    latency_rate: u64,
    latency: Histogram<u64>,
}

pub async fn stream(duration: u64, rate: u64, tls: bool, output: Output) -> anyhow::Result<()> {
    if duration == 0 || rate == 0 {
        bail!("--duration and --rate must be positive");
    }
    if gma_core::tls::client_tls_on() {
        bail!(
            "bench stream makes its own connections (and, with --tls, its own certificates): leave out \
             --tls-ca/GMA_TLS_CA"
        );
    }
    // Kept until the end of the run (removed on drop).
    let mut pki_dir = None;
    let server_tls = if tls {
        let dir = tempfile::Builder::new()
            .prefix("gma-bench-tls-")
            .tempdir()
            .context("cannot create a temp dir")?;
        let (server, client) = bench_pki(dir.path())?;
        pki_dir = Some(dir);
        // Before the first connection: every outgoing connection of the process uses it.
        gma_core::tls::install_client_if_unset(&client)?;
        server
    } else {
        ServerTls::default()
    };
    let buffer = 1 << 20;
    let (hub, addr, stop) = start_producer_with(buffer, server_tls).await?;

    // Phase 1: throughput.
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let hub = hub.clone();
        let received = received.clone();
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            let mut batch = bench_events(1000, 100);
            while !done.load(Ordering::Relaxed) {
                let head = hub.lock().head();
                if head.saturating_sub(received.load(Ordering::Relaxed)) > (buffer as u64) / 2 {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                stamp_and_publish(&hub, &mut batch);
            }
        })
    };
    let mut s = bench_stream(&addr);
    let mut events = 0u64;
    let mut dropped = 0u64;
    let warmup = Instant::now() + Duration::from_secs(1);
    let mut started: Option<(Instant, u64, f64)> = None;
    let me = std::process::id().to_string();
    loop {
        let mut last = 0;
        let mut n = 0u64;
        let p = s
            .next_with(|e| {
                last = e.seq;
                n += 1;
            })
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if let Some(gma_consumer::stream::Progress::Batch { gaps, .. }) = &p {
            dropped += gaps.iter().map(|g| g.dropped).sum::<u64>();
        }
        if last > 0 {
            received.store(last, Ordering::Relaxed);
        }
        let now = Instant::now();
        match started {
            None if now >= warmup => started = Some((now, 0, proc_usage(&me)?.0)),
            Some((t0, ..)) => {
                events += n;
                if now.duration_since(t0) >= Duration::from_secs(duration) {
                    break;
                }
            }
            None => {}
        }
    }
    let (t0, _, cpu0) = started.ok_or_else(|| anyhow!("no measurement"))?;
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_seconds = proc_usage(&me)?.0 - cpu0;
    done.store(true, Ordering::Relaxed);
    let _ = publisher.await;
    drop(s);

    // Phase 2: latency at a fixed rate.
    let mut lat = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let stop_pub = Arc::new(AtomicBool::new(false));
    let per_ms = (rate / 1000).max(1) as usize;
    let rate_pub = {
        let hub = hub.clone();
        let stop_pub = stop_pub.clone();
        tokio::spawn(async move {
            let mut batch = bench_events(per_ms, 100);
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while !stop_pub.load(Ordering::Relaxed) {
                tick.tick().await;
                stamp_and_publish(&hub, &mut batch);
            }
        })
    };
    let mut s = bench_stream(&addr);
    let end = Instant::now() + Duration::from_secs(duration + 1);
    let record_from = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        let now = now_ns();
        let record = Instant::now() >= record_from;
        s.next_with(|e| {
            if record {
                let us = ((now_ns().max(now) - e.timestamp_ns) / 1000).max(1) as u64;
                let _ = lat.record(us);
            }
        })
        .await
        .map_err(|e| anyhow!("{e}"))?;
    }
    stop_pub.store(true, Ordering::Relaxed);
    let _ = rate_pub.await;
    let _ = stop.send(());

    // Wire size of the encoding for this event shape (1,000-event batch, series declared once).
    let info = SeriesInfo::new(0, "bench.x", "s0", &bench_schema());
    let mut enc = BatchEncoder::new();
    enc.push(&info, 1, 0, &[0.0, 0.5, 1.0], &[]);
    let _ = enc.finish(1);
    for i in 0..1000u64 {
        enc.push(&info, 2 + i, 1_000_000 * i as i64, &[i as f64, 0.5, 1.0], &[]);
    }
    let bytes_per_event = prost::Message::encoded_len(&enc.finish(1)) as f64 / 1000.0;

    drop(pki_dir);
    print_stream(
        &StreamFigures {
            tls: if tls { "mtls" } else { "none" },
            events,
            seconds,
            cpu_seconds,
            dropped,
            bytes_per_event,
            latency_rate: rate,
            latency: lat,
        },
        output,
    );
    Ok(())
}

fn print_stream(f: &StreamFigures, output: Output) {
    let eps = f.events as f64 / f.seconds;
    let cores_used = (f.cpu_seconds / f.seconds).max(0.01);
    let q = |p: f64| f.latency.value_at_quantile(p) as f64 / 1000.0;
    match output {
        Output::Json => emit(serde_json::json!({
            "scenario": "stream",
            "tls": f.tls,
            "machine_cores": cores(),
            "events": f.events,
            "seconds": f.seconds,
            "events_per_s": eps,
            "cpu_cores_used": cores_used,
            "events_per_s_per_core": eps / cores_used,
            "dropped": f.dropped,
            "wire_bytes_per_event": f.bytes_per_event,
            "latency_rate_events_per_s": f.latency_rate,
            "latency_samples": f.latency.len(),
            "latency_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999), "max": f.latency.max() as f64 / 1000.0},
        })),
        Output::Table => {
            println!("stream: one producer -> one consumer, loopback gRPC, 3-value events, batches of 1000");
            println!("  tls                      {}", f.tls);
            println!("  machine cores            {}", cores());
            println!("  events                   {} in {:.1} s", f.events, f.seconds);
            println!("  throughput               {:.0} events/s", eps);
            println!("  cpu used (both ends)     {:.2} cores", cores_used);
            println!("  per core                 {:.0} events/s", eps / cores_used);
            println!("  dropped                  {}", f.dropped);
            println!("  wire size                {:.1} bytes/event", f.bytes_per_event);
            println!(
                "  latency @ {} ev/s       p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms ({} samples)",
                f.latency_rate,
                q(0.5),
                q(0.9),
                q(0.99),
                q(0.999),
                f.latency.max() as f64 / 1000.0,
                f.latency.len()
            );
        }
    }
}
