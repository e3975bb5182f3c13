//! gRPC services of a producer: `Producer` (Query, Subscribe, Unsubscribe, Version), `Ingest`
//! (application and remote sensors push events) and `Simulator` (change simulated hosts).

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use gma_core::event::from_wire;
use gma_core::pattern::{event_patterns, source_patterns};
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use gma_sensors::sim::SimHandle;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::hub::{Hub, PublishError};
use crate::subscription::{self, Cursor, Registry, Selector, Start, DEFAULT_MAX_BATCH};

/// Most events one Ingest request may carry.
pub const MAX_INGEST_EVENTS: usize = 10_000;

#[derive(Clone)]
pub struct ProducerService {
    pub hub: Arc<Hub>,
    pub registry: Arc<Registry>,
}

fn invalid(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

fn selector(patterns: &[String], sources: &[String]) -> Result<Selector, Status> {
    Ok(Selector {
        patterns: event_patterns(patterns).map_err(invalid)?,
        sources: source_patterns(sources).map_err(invalid)?,
    })
}

type SubscribeStream = Pin<Box<dyn Stream<Item = Result<pb::SubscribeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::producer_server::Producer for ProducerService {
    async fn query(&self, req: Request<pb::QueryRequest>) -> Result<Response<pb::QueryResponse>, Status> {
        let req = req.into_inner();
        let sel = selector(&req.patterns, &req.sources)?;
        let max_age =
            (req.max_age_ms > 0).then(|| (req.max_age_ms.min(u64::MAX / 2_000_000) * 1_000_000) as i64);
        let inner = self.hub.lock();
        let events = subscription::query(&inner, &sel, max_age, now_ns());
        let epoch = inner.epoch;
        let mut names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let schemas = names.iter().filter_map(|n| inner.schema(n).cloned()).collect();
        drop(inner);
        if events.is_empty() {
            let age = if req.max_age_ms > 0 {
                format!(" within max age {} ms", req.max_age_ms)
            } else {
                String::new()
            };
            return Err(Status::not_found(format!(
                "no event available for {}{}{age}",
                req.patterns.join(","),
                if req.sources.is_empty() {
                    String::new()
                } else {
                    format!(" from {}", req.sources.join(","))
                }
            )));
        }
        Ok(Response::new(pb::QueryResponse {
            events,
            epoch,
            schemas,
        }))
    }

    type SubscribeStream = SubscribeStream;

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<SubscribeStream>, Status> {
        let req = req.into_inner();
        let sel = selector(&req.patterns, &req.sources)?;
        if req.consumer_id.len() > 256 {
            return Err(invalid("consumer_id longer than 256 bytes"));
        }
        let max_batch = if req.max_batch == 0 {
            DEFAULT_MAX_BATCH
        } else {
            req.max_batch as usize
        };
        let epoch = self.hub.epoch();
        let start = if req.resume_from_seq == 0 {
            Start::Latest
        } else if req.epoch == 0 || req.epoch == epoch {
            Start::From(req.resume_from_seq)
        } else {
            Start::OtherEpoch {
                epoch: req.epoch,
                from_seq: req.resume_from_seq,
            }
        };
        let cursor = Cursor::new(sel, max_batch, req.min_interval_ms);
        let (id, cancel, guard) = self.registry.add(&req.consumer_id);
        // Two batches in flight at most: memory per subscriber stays bounded and latency low.
        let (tx, mut rx) = mpsc::channel(2);
        tokio::spawn(subscription::run(
            self.hub.clone(),
            cursor,
            start,
            id,
            cancel.clone(),
            guard,
            tx,
        ));
        // The stream ends as soon as the subscription is cancelled: nothing is sent after an
        // Unsubscribe has been confirmed.
        let stream = futures::stream::poll_fn(move |cx| {
            if cancel.is_cancelled() {
                return std::task::Poll::Ready(None);
            }
            rx.poll_recv(cx)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn unsubscribe(
        &self,
        req: Request<pb::UnsubscribeRequest>,
    ) -> Result<Response<pb::UnsubscribeResponse>, Status> {
        let req = req.into_inner();
        let removed = if req.all {
            if req.consumer_id.is_empty() {
                return Err(invalid("unsubscribe all needs the consumer_id used to subscribe"));
            }
            self.registry.cancel_all(&req.consumer_id)
        } else {
            if req.subscription_id == 0 {
                return Err(invalid(
                    "give a subscription_id, or all = true with a consumer_id",
                ));
            }
            self.registry.cancel_one(req.subscription_id, &req.consumer_id)?
        };
        Ok(Response::new(pb::UnsubscribeResponse { removed }))
    }

    async fn version(&self, _: Request<pb::VersionRequest>) -> Result<Response<pb::VersionResponse>, Status> {
        Ok(Response::new(pb::VersionResponse {
            interface: gma_proto::INTERFACE_VERSION.into(),
            server: gma_core::SERVER_VERSION.into(),
            role: "producer".into(),
        }))
    }
}

fn publish_status(e: PublishError) -> Status {
    match e {
        PublishError::TooManySeries => Status::resource_exhausted(e.to_string()),
        _ => Status::invalid_argument(e.to_string()),
    }
}

#[derive(Clone)]
pub struct IngestService {
    pub hub: Arc<Hub>,
}

#[tonic::async_trait]
impl pb::ingest_server::Ingest for IngestService {
    async fn push(&self, req: Request<pb::IngestRequest>) -> Result<Response<pb::IngestResponse>, Status> {
        let req = req.into_inner();
        if req.events.len() > MAX_INGEST_EVENTS {
            return Err(Status::resource_exhausted(format!(
                "{} events in one request; send at most {MAX_INGEST_EVENTS}",
                req.events.len()
            )));
        }
        if !req.schemas.is_empty() {
            self.hub.add_schemas(&req.schemas).map_err(publish_status)?;
        }
        // Validate everything first: a request is accepted whole or not at all.
        let now = now_ns();
        let mut data = Vec::with_capacity(req.events.len());
        {
            let inner = self.hub.lock();
            for (i, e) in req.events.iter().enumerate() {
                let schema = inner.schema(&e.name).ok_or_else(|| {
                    invalid(format!(
                        "event {i}: {}",
                        PublishError::UnknownSchema(e.name.clone())
                    ))
                })?;
                let mut d = from_wire(e, schema).map_err(|err| invalid(format!("event {i}: {err}")))?;
                if d.timestamp_ns == 0 {
                    d.timestamp_ns = now;
                }
                data.push(d);
            }
        }
        let (last_seq, r) = self.hub.publish(&data);
        r.map_err(publish_status)?;
        Ok(Response::new(pb::IngestResponse {
            accepted: data.len() as u32,
            last_seq,
        }))
    }
}

#[derive(Clone)]
pub struct SimulatorService {
    pub sim: Option<SimHandle>,
}

#[tonic::async_trait]
impl pb::simulator_server::Simulator for SimulatorService {
    async fn set(&self, req: Request<pb::SimSetRequest>) -> Result<Response<pb::SimSetResponse>, Status> {
        let Some(sim) = &self.sim else {
            return Err(Status::failed_precondition(
                "this producer runs no simulated hosts (start it with --simulate FILE)",
            ));
        };
        let req = req.into_inner();
        if req.values.is_empty() {
            return Err(invalid("give at least one key=value to set"));
        }
        let mut values: Vec<(String, f64)> = req.values.into_iter().collect();
        values.sort_by(|a, b| a.0.cmp(&b.0));
        if sim.get(&req.host).is_none() {
            return Err(Status::not_found(format!(
                "no simulated host {:?} on this producer",
                req.host
            )));
        }
        sim.set(&req.host, &values)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(pb::SimSetResponse {
            hosts: vec![req.host],
        }))
    }
}
