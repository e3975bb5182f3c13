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

use gma_core::filter::Filter;
use gma_proto::wire;
use prost::bytes::Bytes;

use crate::derive::Deriver;
use crate::hub::{Hub, PublishError};
use crate::subscription::{
    self, Cursor, Policy, Registry, Selector, Spec, Start, DEFAULT_MAX_BATCH, MAX_MAX_BATCH,
};

/// Most events one Ingest request may carry.
pub const MAX_INGEST_EVENTS: usize = 10_000;

#[derive(Clone)]
pub struct ProducerService {
    pub hub: Arc<Hub>,
    pub registry: Arc<Registry>,
    pub deriver: Arc<Deriver>,
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

/// Longest `when` expression accepted.
pub const MAX_WHEN_BYTES: usize = 4096;

/// Validates a subscription request into a [`Spec`] (activating derived series it asks for).
pub fn spec_of(hub: &Hub, deriver: &Deriver, req: &pb::SubscribeRequest) -> Result<Spec, Status> {
    let base = selector(&req.patterns, &req.sources)?;
    if req.consumer_id.len() > 256 {
        return Err(invalid("consumer_id longer than 256 bytes"));
    }
    let max_batch = if req.max_batch == 0 {
        DEFAULT_MAX_BATCH
    } else {
        (req.max_batch as usize).min(MAX_MAX_BATCH)
    };
    let policy = match pb::SlowPolicy::try_from(req.policy) {
        Ok(pb::SlowPolicy::Latest) => Policy::Latest,
        Ok(pb::SlowPolicy::DropOldest) => Policy::DropOldest,
        Ok(pb::SlowPolicy::Block) => Policy::Block,
        Ok(pb::SlowPolicy::Unspecified) => {
            // Load streams (what brokers and dashboards follow) only need the newest value.
            if base
                .patterns
                .iter()
                .all(|p| p.is_exact() && p.as_str().ends_with(".load"))
            {
                Policy::Latest
            } else {
                Policy::DropOldest
            }
        }
        Err(_) => {
            return Err(invalid(format!(
                "policy {} is unknown: use LATEST, DROP_OLDEST or BLOCK",
                req.policy
            )))
        }
    };
    let queue_events = match (req.queue_events, policy) {
        (0, Policy::Latest) => max_batch as u64,
        (0, _) => u64::MAX,
        (n, _) => u64::from(n),
    };
    if req.delta_pct != 0.0 && !(req.delta_pct.is_finite() && req.delta_pct > 0.0 && req.delta_pct <= 1e9) {
        return Err(invalid(format!(
            "delta_pct {} must be a positive number of percent (or 0 for off)",
            req.delta_pct
        )));
    }
    let mut windows = Vec::new();
    for w in &req.summaries {
        let window = gma_core::rolling::window(w)
            .ok_or_else(|| invalid(format!("summary window {w:?} is unknown: use 1m, 10m or 60m")))?;
        if !windows
            .iter()
            .any(|x: &gma_core::rolling::Window| x.name == window.name)
        {
            windows.push(window);
        }
    }
    let selector = if windows.is_empty() && !req.forecast {
        base
    } else {
        deriver
            .activate(hub, &base, &windows, req.forecast)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?
    };
    let when = if req.when.trim().is_empty() {
        None
    } else {
        if req.when.len() > MAX_WHEN_BYTES {
            return Err(invalid(format!("when: longer than {MAX_WHEN_BYTES} bytes")));
        }
        let f = Filter::parse(&req.when).map_err(|e| invalid(format!("when: {e}")))?;
        let schemas: Vec<pb::EventSchema> = {
            let inner = hub.lock();
            inner
                .schemas()
                .filter(|s| selector.patterns.iter().any(|p| p.matches(&s.name)))
                .cloned()
                .collect()
        };
        f.validate(&schemas).map_err(|e| invalid(format!("when: {e}")))?;
        Some(f)
    };
    Ok(Spec {
        selector,
        max_batch,
        min_interval_ms: req.min_interval_ms,
        policy,
        queue_events,
        when,
        delta_pct: (req.delta_pct != 0.0).then_some(req.delta_pct),
    })
}

/// Where a subscription with this resume point starts.
pub fn start_of(epoch: u64, resume_from_seq: u64, resume_epoch: u64) -> Start {
    if resume_from_seq == 0 {
        Start::Latest
    } else if resume_epoch == 0 || resume_epoch == epoch {
        Start::From(resume_from_seq)
    } else {
        Start::OtherEpoch {
            epoch: resume_epoch,
            from_seq: resume_from_seq,
        }
    }
}

type SubscribeStream = Pin<Box<dyn Stream<Item = Result<wire::SubscribeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl wire::producer_server::Producer for ProducerService {
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
        let spec = spec_of(&self.hub, &self.deriver, &req)?;
        let start = start_of(self.hub.epoch(), req.resume_from_seq, req.epoch);
        let cursor = Cursor::new(spec);
        let handle = self.registry.add(&req.consumer_id);
        let (id, cancel) = (handle.id, handle.cancel.clone());
        // Two batches in flight at most: memory per subscriber stays bounded and latency low.
        let (tx, mut rx) = mpsc::channel::<Bytes>(2);
        tokio::spawn(subscription::run(
            self.hub.clone(),
            self.registry.clone(),
            cursor,
            start,
            handle,
            tx,
        ));
        // The first message carries the subscription id. The stream ends as soon as the
        // subscription is cancelled: nothing is sent after an Unsubscribe has been confirmed.
        let mut first = Some(wire::SubscribeResponse {
            subscription_id: id,
            batch: Bytes::new(),
        });
        let stream = futures::stream::poll_fn(move |cx| {
            if cancel.is_cancelled() {
                return std::task::Poll::Ready(None);
            }
            if let Some(f) = first.take() {
                return std::task::Poll::Ready(Some(Ok(f)));
            }
            rx.poll_recv(cx).map(|b| {
                b.map(|batch| {
                    Ok(wire::SubscribeResponse {
                        subscription_id: id,
                        batch,
                    })
                })
            })
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
    async fn schema(
        &self,
        req: Request<pb::GetSchemaRequest>,
    ) -> Result<Response<pb::GetSchemaResponse>, Status> {
        let req = req.into_inner();
        gma_core::pattern::validate_event_name(&req.name).map_err(invalid)?;
        let inner = self.hub.lock();
        match inner.schema(&req.name) {
            Some(s) if req.version == 0 || req.version == s.version => {
                Ok(Response::new(pb::GetSchemaResponse {
                    schema: Some(s.clone()),
                }))
            }
            Some(s) => Err(Status::not_found(format!(
                "this producer holds {} version {}, not version {}",
                req.name, s.version, req.version
            ))),
            None => Err(Status::not_found(format!(
                "this producer has no schema for {}",
                req.name
            ))),
        }
    }

    async fn push(&self, req: Request<pb::IngestRequest>) -> Result<Response<pb::IngestResponse>, Status> {
        let req = req.into_inner();
        if req.events.len() > MAX_INGEST_EVENTS {
            return Err(Status::resource_exhausted(format!(
                "{} events in one request; send at most {MAX_INGEST_EVENTS}",
                req.events.len()
            )));
        }
        for (i, sc) in req.schemas.iter().enumerate() {
            gma_core::event::validate_schema(sc).map_err(|e| invalid(format!("schema {i}: {e}")))?;
        }
        // Validate everything first: a request is accepted whole or not at all (its schemas
        // are added only when every event conforms).
        let now = now_ns();
        let mut data = Vec::with_capacity(req.events.len());
        {
            let inner = self.hub.lock();
            for (i, e) in req.events.iter().enumerate() {
                let schema = req
                    .schemas
                    .iter()
                    .find(|s| s.name == e.name)
                    .or_else(|| inner.schema(&e.name))
                    .ok_or_else(|| {
                        invalid(format!(
                            "event {i}: {}",
                            PublishError::UnknownSchema(e.name.clone())
                        ))
                    })?;
                let mut d = from_wire(e, schema).map_err(|err| invalid(format!("event {i}: {err}")))?;
                if let Some(layout) = inner.series_layout(&d.name, &d.source) {
                    if layout.doubles != d.numbers.len() || layout.strings != d.strings.len() {
                        return Err(invalid(format!(
                            "event {i}: series ({}, {}) was created with {} numbers and {} strings; \
                             a new schema version applies to new series only",
                            d.name, d.source, layout.doubles, layout.strings
                        )));
                    }
                }
                if d.timestamp_ns == 0 {
                    d.timestamp_ns = now;
                }
                data.push(d);
            }
        }
        if !req.schemas.is_empty() {
            self.hub.add_schemas(&req.schemas).map_err(publish_status)?;
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
