//! Measurements: the `Probe` service a netprobe answers for its peers (the target side) and the
//! prober side that measures one peer.
//!
//! A probe of one peer is: `echoes` small round trips (latency = the minimum; the first one
//! also reserves the transfer in the target's byte budget), then, when both this host's and the
//! target's budgets allow, one timed transfer of `transfer_bytes` streamed to the target — the
//! clock stops when the target's answer arrives, after its last byte (throughput = payload
//! bits over that time: goodput, below the line rate by the TCP/IP and HTTP/2 headers, about
//! 5 % at an MTU of 1500).

use gma_core::Refuse;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_core::authz::Action;
use gma_core::guard::Gate;
use gma_core::time::now_ns;
use gma_proto::v1::{self as pb, probe_client::ProbeClient};
use parking_lot::Mutex;
use prost::bytes::Bytes;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::budget::Bucket;
use crate::config::{NetprobeConfig, MAX_ECHO_BYTES, MAX_TRANSFER_BYTES};
use crate::error::Error;
use crate::events::{Kind, Measurement, RTT};
use crate::telemetry::Counters;

/// Most prober reservations a target remembers.
const MAX_RESERVATIONS: usize = 1024;
/// Transfers of one pair refused in a row before the next one is asked for as overdue.
pub const OVERDUE_SKIPS: u32 = 2;
const MAX_ID: usize = 256;

/// This host's side of probing, shared by the prober and the Probe service.
pub struct Local {
    pub id: String,
    pub host: String,
    pub budget: Mutex<Bucket>,
    /// Transfer bytes granted to each prober by its last Echo.
    reservations: Mutex<HashMap<String, u64>>,
    /// Per target: transfers refused in a row (for want of budget at either end).
    refused: Mutex<HashMap<String, u32>>,
    pub counters: Counters,
    start: Instant,
    /// Zeros to slice payloads from (one allocation).
    zeros: Bytes,
}

impl Local {
    pub fn new(id: &str, host: &str, cfg: &NetprobeConfig) -> Local {
        Local {
            id: id.to_string(),
            host: host.to_string(),
            budget: Mutex::new(Bucket::new(cfg.max_bytes_per_s, cfg.burst_bytes(), 0)),
            reservations: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            start: Instant::now(),
            zeros: Bytes::from(vec![0u8; cfg.chunk_bytes.max(cfg.echo_bytes)]),
        }
    }

    /// One more transfer toward `peer` refused for want of budget.
    fn refused_once(&self, peer: &str) {
        let mut r = self.refused.lock();
        if r.len() >= MAX_RESERVATIONS && !r.contains_key(peer) {
            r.clear();
        }
        *r.entry(peer.to_string()).or_default() += 1;
    }

    /// Milliseconds since this netprobe started (the clique's clock).
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn instant_of(&self, ms: u64) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.start + Duration::from_millis(ms))
    }
}

/// The target side.
/// The way out named to a summary-only identity on the clique's and probe's messages: taking
/// part in the measurements publishes them.
pub(crate) const INGEST_ONLY: &str =
    "taking part in the measurements is ingest of net.*: an allow grant is needed";

pub struct ProbeService {
    pub local: Arc<Local>,
    pub gate: Arc<Gate>,
}

fn check_id(what: &str, id: &str) -> Result<(), Error> {
    if id.is_empty() || id.len() > MAX_ID {
        return Err(Error::invalid_argument(format!(
            "{what}: the prober's member id (1..={MAX_ID} bytes)"
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl pb::probe_server::Probe for ProbeService {
    #[tracing::instrument(skip_all, level = "debug")]
    async fn echo(&self, req: Request<pb::EchoRequest>) -> Result<Response<pb::EchoResponse>, Status> {
        // Taking part in this host's network measurements is ingest of net.* events.
        self.gate.check_raw(&req, Action::Ingest, &[RTT], INGEST_ONLY)?;
        let r = req.into_inner();
        if r.payload.len() > MAX_ECHO_BYTES {
            return Err(Error::invalid_argument(format!("payload: at most {MAX_ECHO_BYTES} bytes")).into());
        }
        check_id("from", &r.from)?;
        if r.reserve_bytes > MAX_TRANSFER_BYTES {
            return Err(
                Error::invalid_argument(format!("reserve_bytes: at most {MAX_TRANSFER_BYTES}")).into(),
            );
        }
        let local = &self.local;
        let n = r.payload.len() as u64;
        local.counters.received(n);
        local.counters.sent(n);
        let now = local.now_ms();
        let granted = {
            let mut b = local.budget.lock();
            let taken = match (r.reserve_bytes, r.overdue) {
                (0, _) => false,
                (n, false) => b.try_take(n, now),
                (n, true) => b.try_take_borrowing(n, now),
            };
            let granted = if taken { r.reserve_bytes } else { 0 };
            b.charge(2 * n, now);
            granted
        };
        if granted > 0 {
            let mut res = local.reservations.lock();
            if res.len() >= MAX_RESERVATIONS && !res.contains_key(&r.from) {
                res.clear();
            }
            res.insert(r.from, granted);
        }
        Ok(Response::new(pb::EchoResponse {
            payload: r.payload,
            host: local.host.clone(),
            granted_bytes: granted,
        }))
    }

    #[tracing::instrument(skip_all, level = "debug")]
    async fn bulk(
        &self,
        req: Request<Streaming<pb::BulkChunk>>,
    ) -> Result<Response<pb::BulkResponse>, Status> {
        self.gate.check_raw(&req, Action::Ingest, &[RTT], INGEST_ONLY)?;
        let mut stream = req.into_inner();
        let Some(first) = stream.message().await? else {
            return Err(
                Error::invalid_argument("empty transfer: the first chunk names from and total").into(),
            );
        };
        check_id("from", &first.from)?;
        let reserved = self.local.reservations.lock().remove(&first.from).unwrap_or(0);
        if first.total == 0 || first.total > reserved {
            return Err(Error::failed_precondition(format!(
                "transfer of {} bytes from {:?} without a reservation (reserved: {reserved}); \
                 call Echo with reserve_bytes first",
                first.total, first.from
            ))
            .into());
        }
        let t0 = Instant::now();
        let mut got = first.data.len() as u64;
        let mut last = t0;
        while let Some(c) = stream.next().await {
            let c = c?;
            got += c.data.len() as u64;
            last = Instant::now();
            if got > first.total {
                return Err(Error::invalid_argument(format!(
                    "transfer longer than its total of {} bytes",
                    first.total
                ))
                .into());
            }
        }
        self.local.counters.received(got);
        Ok(Response::new(pb::BulkResponse {
            bytes: got,
            receive_ns: last.duration_since(t0).as_nanos() as u64,
        }))
    }
}

/// What [`probe_peer`] fails with: [`Error::Echo`] or [`Error::Transfer`].
pub use crate::error::Error as ProbeError;

/// What measuring one peer gave.
#[derive(Debug, Default)]
pub struct Outcome {
    pub measurements: Vec<Measurement>,
}

/// Measures the peer behind `channel`: latency, then (budget allowing) throughput. Each
/// measurement is handed to `publish` as soon as it is made.
pub async fn probe_peer(
    local: &Local,
    cfg: &NetprobeConfig,
    channel: Channel,
    peer: &str,
    mut publish: impl FnMut(Measurement),
) -> Result<(), ProbeError> {
    let mut client = ProbeClient::new(channel).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
    let want = cfg.transfer_bytes;
    let overdue = local.refused.lock().get(peer).copied().unwrap_or(0) >= OVERDUE_SKIPS;
    let own = {
        let (mut b, now) = (local.budget.lock(), local.now_ms());
        if overdue {
            b.try_take_borrowing(want, now)
        } else {
            b.try_take(want, now)
        }
    };
    if !own {
        local.counters.skipped("own");
        local.refused_once(peer);
    }
    let payload = local.zeros.slice(..cfg.echo_bytes);
    let start_ns = now_ns();
    let t0 = Instant::now();
    let mut best = Duration::MAX;
    let mut host = String::new();
    let mut granted = 0;
    for i in 0..cfg.echoes {
        let req = pb::EchoRequest {
            payload: payload.clone(),
            from: local.id.clone(),
            reserve_bytes: if i == 0 && own { want } else { 0 },
            overdue: i == 0 && own && overdue,
        };
        let t = Instant::now();
        let r = match client.echo(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => {
                if own {
                    local.budget.lock().refund(want, local.now_ms());
                }
                local.counters.failed(false);
                return Err(ProbeError::Echo(peer.to_string(), s.message().to_string()));
            }
        };
        best = best.min(t.elapsed());
        let n = payload.len() as u64;
        local.counters.sent(n);
        local.counters.received(r.payload.len() as u64);
        local
            .budget
            .lock()
            .charge(n + r.payload.len() as u64, local.now_ms());
        if i == 0 {
            granted = r.granted_bytes;
            host = r.host;
        }
    }
    if gma_core::pattern::validate_source(&host).is_err() || host.contains('/') {
        // A target that does not name itself usably is measured under its member id.
        host = peer.replace('/', "_");
    }
    publish(Measurement {
        src: local.host.clone(),
        dst: host.clone(),
        start_ns,
        duration_ns: t0.elapsed().as_nanos() as u64,
        kind: Kind::Rtt {
            rtt_ms: best.as_secs_f64() * 1e3,
        },
    });
    local.counters.probed(false);
    if !own {
        return Ok(());
    }
    if granted < want {
        local.budget.lock().refund(want, local.now_ms());
        local.counters.skipped("target");
        local.refused_once(peer);
        return Ok(());
    }
    local.refused.lock().remove(peer);
    let chunk = cfg.chunk_bytes as u64;
    let n = want.div_ceil(chunk);
    let zeros = local.zeros.clone();
    let from = local.id.clone();
    let chunks = (0..n).map(move |i| {
        let len = chunk.min(want - i * chunk) as usize;
        pb::BulkChunk {
            data: zeros.slice(..len),
            from: if i == 0 { from.clone() } else { String::new() },
            total: if i == 0 { want } else { 0 },
        }
    });
    let start_ns = now_ns();
    let t = Instant::now();
    let r = client.bulk(tokio_stream::iter(chunks)).await;
    let took = t.elapsed();
    let r = match r {
        Ok(r) => r.into_inner(),
        Err(s) => {
            local.counters.failed(true);
            return Err(ProbeError::Transfer(peer.to_string(), s.message().to_string()));
        }
    };
    local.counters.sent(want);
    if r.bytes != want {
        local.counters.failed(true);
        return Err(ProbeError::Transfer(
            peer.to_string(),
            format!("the target received {} of {want} bytes", r.bytes),
        ));
    }
    publish(Measurement {
        src: local.host.clone(),
        dst: host,
        start_ns,
        duration_ns: took.as_nanos() as u64,
        kind: Kind::Bw {
            mbps: want as f64 * 8.0 / took.as_secs_f64().max(1e-9) / 1e6,
            bytes: want,
        },
    });
    local.counters.probed(true);
    Ok(())
}
