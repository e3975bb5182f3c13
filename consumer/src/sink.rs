//! The consumer side of producer-initiated streams (GMA: a consumer that accepts pushed
//! subscriptions, e.g. an archiver).
//!
//! A [`Sink`] serves the `Consumer` service and keeps a consumer record in the directory saying
//! which events it accepts and how (`manner`, e.g. "archive"). Producers that offer matching
//! events find the record and open `Deliver`: the producer says hello, the sink answers what to
//! send (its accepted patterns and sources, its slow-consumer policy) and where to resume this
//! producer's stream, then batches flow exactly as on a Subscribe stream. The sink decodes them,
//! hands the events to its [`SinkHandler`] and acks each batch the handler accepted. Either side
//! ends a stream: the producer by closing it, the sink with [`Sink::end`] (the producer does
//! not come back until the consumer record changes).
//!
//! Who may push: the endpoint's client CA (`tls.client_ca`) decides who may connect, and with a
//! policy (`access_policy`) `Deliver` is the `ingest` action, allowed outright, on every
//! pattern the sink accepts when the stream opens and on every event name it carries
//! ([`DOORS`]); a refused name ends the stream with `PERMISSION_DENIED`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use gma_core::authz::{Action, Decision, Door};
use gma_core::codec::{BatchDecoder, OwnedEvent};
use gma_core::guard::Gate;
use gma_core::Refuse;
use gma_proto::v1 as pb;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Request, Response, Status, Streaming};

use crate::registrar::{self, Catalog};
use crate::stream::ResumePoint;
use crate::ConsumerError;

/// The doors of a sink's `Consumer` endpoint.
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Consumer/Deliver",
        &[Action::Ingest],
        "PERMISSION_DENIED naming the rule: pushing events is ingest, allowed outright (on the \
         accepted patterns and every event name); the sink serves no data back",
    ),
    Door::open("/gma.v1.Consumer/Version", "served (versions only, no data)"),
];

/// Event names one Deliver stream remembers as authorized (more are asked again per batch).
const AUTHORIZED_NAMES: usize = 4096;

/// What a sink accepts and where it registers.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// Where and as what the sink is registered ([`gma_core::registration::Registration`]):
    /// `directory` (none = not registered: producers must be told otherwise), `id` (unique;
    /// default `sink@<advertised address>`), `advertise` (the address given to producers;
    /// default: the bound address), `site`, `org`, `lease_ttl_ms`.
    pub registration: gma_core::registration::Registration,
    /// Event-name patterns accepted.
    pub accepts: Vec<String>,
    /// Source patterns (empty = any).
    pub sources: Vec<String>,
    /// How the events are consumed ("archive", "print", ...).
    pub manner: String,
    /// What producers do when this sink falls behind.
    pub policy: pb::SlowPolicy,
    /// The shared endpoint section ([`gma_core::endpoint::Endpoint`]) as the sink reads it:
    /// `tls` of the `Consumer` endpoint (`cert`, `key`, `client_ca` for mTLS,
    /// `allow_plaintext`; without a certificate it serves plaintext, refused on a non-loopback
    /// address); `limits`, the connection caps and timeouts of the endpoint
    /// ([`gma_core::conn`]) and the rate limit of `Deliver` streams opened; `access_policy`,
    /// the authorization of `Deliver` (`ingest`; none: every peer the endpoint accepts may
    /// push). `metrics_listen` is the binary's; the sink publishes no `gma.rpc` events.
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            registration: Default::default(),
            accepts: vec!["*".into()],
            sources: Vec::new(),
            manner: String::new(),
            policy: pb::SlowPolicy::DropOldest,
            endpoint: Default::default(),
        }
    }
}

/// Why a [`SinkHandler`] ends a stream: its own error, whatever the owner's type is.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// What the sink's owner does with pushed events.
pub trait SinkHandler: Send + Sync + 'static {
    /// Where this producer's stream should resume (None: the sink's own memory of it, or the
    /// latest values for a producer never seen).
    fn resume_point(&self, _producer_id: &str) -> Option<ResumePoint> {
        None
    }
    /// A producer started (or restarted) its stream.
    fn opened(&self, _hello: &pb::DeliverHello) {}
    /// The events of one batch in seq order, and the gaps it reported. `Ok` acknowledges the
    /// batch to the producer (return only once the events are as safe as the sink promises);
    /// `Err` ends the stream with the error's message as the reason.
    fn events(
        &self,
        producer_id: &str,
        events: Vec<OwnedEvent>,
        gaps: &[pb::Gap],
    ) -> Result<(), HandlerError>;
    /// The stream ended (by either side, or broke).
    fn closed(&self, _producer_id: &str, _reason: &str) {}
}

struct Session {
    generation: u64,
    end: Option<oneshot::Sender<String>>,
}

/// A running sink (cheap to clone handles via `Arc`).
pub struct Sink {
    config: SinkConfig,
    handler: Arc<dyn SinkHandler>,
    sessions: Mutex<HashMap<String, Session>>,
    resume: Mutex<HashMap<String, ResumePoint>>,
    generation: std::sync::atomic::AtomicU64,
}

impl Sink {
    pub fn new(config: SinkConfig, handler: Arc<dyn SinkHandler>) -> Arc<Sink> {
        Arc::new(Sink {
            config,
            handler,
            sessions: Mutex::new(HashMap::new()),
            resume: Mutex::new(HashMap::new()),
            generation: Default::default(),
        })
    }

    /// Producers currently pushing to this sink.
    pub fn producers(&self) -> Vec<String> {
        let mut v: Vec<String> = self.sessions.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// Ends the stream from `producer_id`; false if there is none.
    pub fn end(&self, producer_id: &str, reason: &str) -> bool {
        let tx = self
            .sessions
            .lock()
            .get_mut(producer_id)
            .and_then(|s| s.end.take());
        match tx {
            Some(tx) => tx.send(reason.to_string()).is_ok(),
            None => false,
        }
    }

    /// Serves until `shutdown` resolves, registered in the directory when one is configured.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ConsumerError> {
        let bound = listener
            .local_addr()
            .map_err(|e| ConsumerError::Address(String::new(), e.to_string()))?;
        let policy = gma_core::guard::load_policy(self.config.endpoint.access_policy.as_ref())?;
        let gate = Arc::new(Gate::new(policy, self.config.endpoint.limits.clone()));
        let tls = self
            .config
            .endpoint
            .tls
            .rustls_config(bound)
            .map_err(|e| ConsumerError::Invalid(e.to_string()))?;
        let registration = &self.config.registration;
        registration
            .validate()
            .map_err(|e| ConsumerError::Invalid(e.to_string()))?;
        let address = registration.address(bound);
        let id = registration.record_id("sink", &address);
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut registrar_task = None;
        if let Some(dir) = &registration.directory {
            let reg = registrar::Registration {
                directory: dir.clone(),
                kind: pb::RecordKind::Consumer,
                id: id.clone(),
                ttl_ms: registration.lease_ttl_ms,
            };
            let catalog = Arc::new(SinkCatalog {
                config: self.config.clone(),
                id,
                address,
            });
            registrar_task = Some(tokio::spawn(registrar::run(reg, catalog, stop_rx)));
        }
        let shutdown = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        };
        let server = gma_core::conn::grpc_server(&self.config.endpoint.limits)
            .layer(gma_core::rpc::RpcLayer::new(gma_core::rpc::RpcStats::new("sink")));
        let services = gma_core::conn::Services::new().add_service(
            pb::consumer_server::ConsumerServer::new(Service {
                sink: self.clone(),
                gate,
            })
            .max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES),
        );
        let incoming = gma_core::conn::Incoming::grpc(listener, tls, &self.config.endpoint.limits, "sink");
        let result = gma_core::conn::serve_grpc(server, services, incoming, shutdown).await;
        if let Some(t) = registrar_task {
            let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
        }
        result.map_err(|e| ConsumerError::Connect(bound.to_string(), crate::error_chain(&e)))
    }
}

struct SinkCatalog {
    config: SinkConfig,
    id: String,
    address: String,
}

impl Catalog for SinkCatalog {
    fn version(&self) -> u64 {
        1
    }

    fn record(&self) -> (pb::Record, Vec<pb::EventSchema>, u64) {
        let c = &self.config;
        let rec = pb::ConsumerRecord {
            id: self.id.clone(),
            address: self.address.clone(),
            accepts: c.accepts.clone(),
            manner: c.manner.clone(),
            site: c.registration.site.clone(),
            org: c.registration.org.clone(),
            attributes: Default::default(),
        };
        (
            pb::Record {
                record: Some(pb::record::Record::Consumer(rec)),
            },
            Vec::new(),
            1,
        )
    }
}

struct Service {
    sink: Arc<Sink>,
    gate: Arc<Gate>,
}

/// Pushing is ingest, allowed outright: the way out named to a summary-only identity.
const INGEST_ONLY: &str = "pushing events to a sink is ingest: an allow grant is needed";

type DeliverStream = Pin<Box<dyn Stream<Item = Result<pb::DeliverResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::consumer_server::Consumer for Service {
    type DeliverStream = DeliverStream;

    async fn deliver(
        &self,
        req: Request<Streaming<pb::DeliverRequest>>,
    ) -> Result<Response<DeliverStream>, Status> {
        let who = self.gate.admit(&req)?;
        let accepts: Vec<&str> = self.sink.config.accepts.iter().map(String::as_str).collect();
        let grant = self.gate.authorize(&who, Action::Ingest, &accepts)?;
        if grant.decision != Decision::Allow {
            let first = accepts.first().copied().unwrap_or("*");
            return Err(self.gate.summary_only(&who, first, &grant, INGEST_ONLY).into());
        }
        let gate = self.gate.clone();
        let mut inbound = req.into_inner();
        let hello = match inbound.message().await? {
            Some(pb::DeliverRequest {
                msg: Some(pb::deliver_request::Msg::Hello(h)),
            }) => h,
            Some(_) => {
                return Err(
                    ConsumerError::invalid_argument("the first Deliver message must be a hello").into(),
                )
            }
            None => {
                return Err(ConsumerError::invalid_argument("Deliver stream ended before its hello").into())
            }
        };
        if hello.producer_id.is_empty() || hello.producer_id.len() > 512 {
            return Err(ConsumerError::invalid_argument("hello.producer_id must be 1..=512 bytes").into());
        }
        let sink = self.sink.clone();
        let producer = hello.producer_id.clone();
        let resume = sink
            .handler
            .resume_point(&producer)
            .or_else(|| sink.resume.lock().get(&producer).copied())
            .unwrap_or_default();
        let (end_tx, mut end_rx) = oneshot::channel();
        let generation = sink.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = Session {
            generation,
            end: Some(end_tx),
        };
        if let Some(old) = sink.sessions.lock().insert(producer.clone(), session) {
            // A producer reconnecting replaces its old stream.
            if let Some(tx) = old.end {
                let _ = tx.send("replaced by a new stream from the same producer".into());
            }
        }
        sink.handler.opened(&hello);
        metrics::gauge!(crate::telemetry::SINK_STREAMS).increment(1.0);
        let (tx, rx) = mpsc::channel(16);
        let first = pb::DeliverResponse {
            patterns: sink.config.accepts.clone(),
            sources: sink.config.sources.clone(),
            resume_from_seq: resume.next_seq,
            epoch: resume.epoch,
            policy: sink.config.policy as i32,
            ..Default::default()
        };
        let _ = tx.send(Ok(first)).await;
        tokio::spawn(async move {
            let mut decoder = BatchDecoder::new();
            let mut authorized: std::collections::HashSet<String> = Default::default();
            let reason = loop {
                // Biased, the end first: once the sink has ended the stream, no batch still
                // in flight is handed to the handler.
                tokio::select! {
                    biased;
                    why = &mut end_rx => {
                        let reason = why.unwrap_or_else(|_| "sink stopped".into());
                        let _ = tx.send(Ok(pb::DeliverResponse { end: true, reason: reason.clone(), ..Default::default() })).await;
                        break reason;
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(pb::DeliverRequest { msg: Some(pb::deliver_request::Msg::Batch(b)) })) => {
                            let events = match decoder.decode(&b) {
                                Ok(e) => e,
                                Err(e) => break format!("malformed batch: {e}"),
                            };
                            let refused = events.iter().find(|e| {
                                let name = &e.series.name;
                                if authorized.contains(name) {
                                    return false;
                                }
                                if !gate.raw_allowed(&who, Action::Ingest, name) {
                                    return true;
                                }
                                if authorized.len() < AUTHORIZED_NAMES {
                                    authorized.insert(name.clone());
                                }
                                false
                            });
                            if let Some(e) = refused {
                                let name = e.series.name.clone();
                                let status = match gate.authorize(&who, Action::Ingest, &[&name]) {
                                    Err(s) => s,
                                    Ok(g) => gate.summary_only(&who, &name, &g, INGEST_ONLY),
                                };
                                let why = status.message().to_string();
                                let _ = tx.send(Err(Status::from(ConsumerError::from(status)))).await;
                                break why;
                            }
                            let last = events.last().map(|e| e.seq);
                            metrics::counter!(crate::telemetry::SINK_EVENTS).increment(events.len() as u64);
                            if let Err(e) = sink.handler.events(&producer, events, &b.gaps) {
                                let e = e.to_string();
                                let _ = tx.send(Ok(pb::DeliverResponse { end: true, reason: e.clone(), ..Default::default() })).await;
                                break e;
                            }
                            if let Some(seq) = last {
                                sink.resume.lock().insert(producer.clone(), ResumePoint { epoch: b.epoch, next_seq: seq + 1 });
                                // Acks are progress reports: skipping one when the channel is full loses nothing.
                                let _ = tx.try_send(Ok(pb::DeliverResponse { acked_seq: seq, ..Default::default() }));
                            }
                        }
                        Ok(Some(_)) => break "unexpected message after the hello".to_string(),
                        Ok(None) => break "the producer ended the stream".to_string(),
                        Err(s) => break format!("stream broke: {}", s.message()),
                    },
                }
            };
            {
                let mut sessions = sink.sessions.lock();
                if sessions
                    .get(&producer)
                    .is_some_and(|s| s.generation == generation)
                {
                    sessions.remove(&producer);
                }
            }
            sink.handler.closed(&producer, &reason);
            metrics::gauge!(crate::telemetry::SINK_STREAMS).decrement(1.0);
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn version(&self, _: Request<pb::VersionRequest>) -> Result<Response<pb::VersionResponse>, Status> {
        gma_core::endpoint::version("consumer")
    }
}
