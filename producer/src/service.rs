//! gRPC services of a producer: `Producer` (Query, Subscribe, Unsubscribe, Version), `Ingest`
//! (application and remote sensors push events) and `Simulator` (change simulated hosts).
//!
//! Every RPC but Version goes through the producer's [`Gate`] first: the caller's identity is
//! charged one request (rate limit, `RESOURCE_EXHAUSTED`) and authorized by the policy
//! (`PERMISSION_DENIED`): Query is `producer.query` and Subscribe `producer.subscribe` on the
//! requested patterns, Ingest Push and Schema are `ingest` on the event names, Simulator.Set is
//! `admin` on `sim.set`; Unsubscribe is only charged (a subscription is ended by its
//! `consumer_id`). A `summary` grant serves only derived summaries: a subscription must ask for
//! them (`summaries`, no `forecast`) and a query must name summaries (`host.cpu.avg1m`). The
//! grant's rate class is a floor for the subscription's `min_interval_ms`, and every open
//! stream holds one of its connection's subscription slots. See docs/security.md.

use gma_core::Refuse;
use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use gma_core::authz::{is_summary_name, summary_base, Action, Decision, Door, Grant, Identity};
use gma_core::event::from_wire;
use gma_core::guard::Gate;
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
use crate::error::Error;
use crate::hub::{Hub, PublishError};
use crate::subscription::{
    self, Cursor, Policy, Registry, Selector, Spec, Start, DEFAULT_MAX_BATCH, MAX_MAX_BATCH,
};

/// The doors of a producer (and of every role built on one: relay, monitor, rescheduler,
/// netprobe, simres, federation endpoint, the companions of the directory and archiver):
/// `Producer`, `Ingest`, `Simulator` and `Control` (docs/security.md, Producers;
/// docs/control.md).
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.Producer/Query",
        &[Action::ProducerQuery],
        "only when every pattern is a summary name (host.load.avg1m); PERMISSION_DENIED naming \
         the rule and the way out otherwise",
    ),
    Door::policy(
        "/gma.v1.Producer/Subscribe",
        &[Action::ProducerSubscribe],
        "only derived summaries (summaries = [\"1m\"], or a summary name); a raw subscription is \
         PERMISSION_DENIED naming the rule and the way out (--summary 1m)",
    ),
    Door::open(
        "/gma.v1.Producer/Unsubscribe",
        "served: it ends only subscriptions the same identity opened (no data; rate-limited)",
    ),
    Door::open("/gma.v1.Producer/Version", "served (versions only, no data)"),
    Door::policy(
        "/gma.v1.Ingest/Push",
        &[Action::Ingest],
        "PERMISSION_DENIED: only allow lets an identity publish",
    ),
    Door::policy(
        "/gma.v1.Ingest/Schema",
        &[Action::Ingest],
        "PERMISSION_DENIED: schemas are fetched with events or from the directory",
    ),
    Door::policy(
        "/gma.v1.Simulator/Set",
        &[Action::Admin],
        "PERMISSION_DENIED: sim.set needs an allow admin grant",
    ),
    Door::policy(
        "/gma.v1.Control/ListSensors",
        &[Action::ProducerControl],
        "PERMISSION_DENIED: control needs an allow producer.control grant",
    ),
    Door::policy(
        "/gma.v1.Control/SetPeriod",
        &[Action::ProducerControl],
        "PERMISSION_DENIED: control needs an allow producer.control grant",
    ),
    Door::policy(
        "/gma.v1.Control/SetEnabled",
        &[Action::ProducerControl],
        "PERMISSION_DENIED: control needs an allow producer.control grant",
    ),
    Door::policy(
        "/gma.v1.Control/Watch",
        &[Action::ProducerControl],
        "PERMISSION_DENIED: control needs an allow producer.control grant",
    ),
    Door::policy(
        "/gma.v1.Control/Unwatch",
        &[Action::ProducerControl],
        "PERMISSION_DENIED: control needs an allow producer.control grant",
    ),
    Door::policy(
        "/gma.v1.Control/AddRule",
        &[Action::ProducerControl],
        "PERMISSION_DENIED: control needs an allow producer.control grant",
    ),
    Door::policy(
        "/gma.v1.Control/RemoveRule",
        &[Action::ProducerControl],
        "PERMISSION_DENIED: control needs an allow producer.control grant",
    ),
];

/// Most events one Ingest request may carry.
pub const MAX_INGEST_EVENTS: usize = 10_000;

#[derive(Clone)]
pub struct ProducerService {
    pub hub: Arc<Hub>,
    pub registry: Arc<Registry>,
    pub deriver: Arc<Deriver>,
    /// Authorization and per-identity limits (shared by the producer's services).
    pub gate: Arc<Gate>,
}

fn invalid(e: impl std::fmt::Display) -> Error {
    Error::invalid_argument(e.to_string())
}

fn selector(patterns: &[String], sources: &[String]) -> Result<Selector, Error> {
    Ok(Selector {
        patterns: event_patterns(patterns).map_err(invalid)?,
        sources: source_patterns(sources).map_err(invalid)?,
    })
}

/// The longest window a history query may ask for.
const MAX_SINCE_MS: u64 = 7 * 86_400_000;
/// Events a history query returns by default, and at most.
const DEFAULT_QUERY_LIMIT: u32 = 10_000;
const MAX_QUERY_LIMIT: u32 = 100_000;

impl ProducerService {
    /// `Query` with `since_ms`: the window's events still held in the resume buffer, authorized
    /// like a subscription (the subscribe action; its rate class thins each series; a
    /// summary-only grant gets summaries only).
    fn query_window(
        &self,
        who: &Identity,
        req: &pb::QueryRequest,
        sel: &Selector,
    ) -> Result<Response<pb::QueryResponse>, Status> {
        if req.since_ms > MAX_SINCE_MS {
            return Err(invalid(format!(
                "since_ms: at most {MAX_SINCE_MS} (7 days), not {}",
                req.since_ms
            ))
            .into());
        }
        if req.limit > MAX_QUERY_LIMIT {
            return Err(invalid(format!(
                "limit: at most {MAX_QUERY_LIMIT}, not {} (0 = {DEFAULT_QUERY_LIMIT})",
                req.limit
            ))
            .into());
        }
        let action = Action::ProducerSubscribe;
        let resources: Vec<&str> = req.patterns.iter().map(String::as_str).collect();
        let grant = self.gate.authorize(who, action, &resources)?;
        if grant.decision != Decision::Allow && !req.patterns.iter().all(|p| is_summary_name(p)) {
            return Err(summary_only(&self.gate, who, action, &req.patterns, &grant, |p| {
                format!("query {p}.avg1m --since (or subscribe with --summary 1m)")
            })
            .into());
        }
        let limit = if req.limit == 0 {
            DEFAULT_QUERY_LIMIT
        } else {
            req.limit
        } as usize;
        let window_ns = (req.since_ms * 1_000_000) as i64;
        let min_interval_ns = (grant.min_interval_ms.min(MAX_SINCE_MS) * 1_000_000) as i64;
        let now = now_ns();
        let inner = self.hub.lock();
        let w = subscription::query_window(&inner, sel, window_ns, now, limit, min_interval_ns);
        let epoch = inner.epoch;
        let mut names: Vec<&str> = w.events.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let schemas = names.iter().filter_map(|n| inner.schema(n).cloned()).collect();
        drop(inner);
        if w.events.is_empty() {
            return Err(Error::not_found(format!(
                "no event of {} in the last {} ms is held here (the buffer holds events since {})",
                gma_core::clip(&req.patterns.join(","), 200),
                req.since_ms,
                if w.held_since_ns > 0 {
                    gma_core::time::format_rfc3339(w.held_since_ns)
                } else {
                    "nothing".to_string()
                }
            ))
            .into());
        }
        Ok(Response::new(pb::QueryResponse {
            events: w.events,
            epoch,
            schemas,
            omitted: w.omitted,
            held_since_ns: w.held_since_ns,
        }))
    }
}

/// `PERMISSION_DENIED` for a summary-only identity that asked for raw events: names the first
/// pattern the policy grants only summaries of, how to ask for its summaries instead (`how`
/// gets the pattern), and the rule that decided.
fn summary_only(
    gate: &Gate,
    who: &Identity,
    action: Action,
    patterns: &[String],
    fallback: &Grant,
    how: impl Fn(&str) -> String,
) -> Error {
    let found = patterns.iter().find_map(|p| {
        let g = gate.policy().authorize(who, action, p);
        (g.decision == Decision::AllowSummaryOnly).then_some((p.as_str(), g))
    });
    let (pattern, grant) = match found {
        Some(f) => f,
        None => (
            patterns
                .iter()
                .find(|p| !is_summary_name(p))
                .map_or("*", String::as_str),
            *fallback,
        ),
    };
    Error::permission_denied(format!(
        "{who} may receive only summaries of {pattern:?}: {} (decided by {})",
        how(pattern),
        gate.policy().describe(&grant)
    ))
}

/// Authorizes a Subscribe before anything is activated or claimed: the grant, or
/// `PERMISSION_DENIED` when it is denied, or summary-only and the request is not for summaries
/// alone.
pub(crate) fn authorize_subscribe(
    gate: &Gate,
    who: &Identity,
    req: &pb::SubscribeRequest,
) -> Result<Grant, Error> {
    // Patterns are checked before the policy sees them (bounded length, no stray characters).
    selector(&req.patterns, &req.sources)?;
    let action = Action::ProducerSubscribe;
    let resources: Vec<&str> = req.patterns.iter().map(String::as_str).collect();
    let grant = gate.authorize(who, action, &resources)?;
    if grant.decision == Decision::AllowSummaryOnly {
        if req.summaries.is_empty() {
            return Err(summary_only(gate, who, action, &req.patterns, &grant, |p| {
                format!("subscribe with --summary 1m (or to {p}.avg1m)")
            }));
        }
        if req.forecast {
            return Err(summary_only(gate, who, action, &req.patterns, &grant, |_| {
                "forecasts are not summaries: subscribe with --summary 1m and without --forecast".into()
            }));
        }
    }
    Ok(grant)
}

/// The subscription `req` under `grant` (from [`authorize_subscribe`]): the rate class of the
/// grant is a floor for the interval, and a summary-only grant never selects anything else.
pub(crate) fn granted_spec(
    hub: &Hub,
    deriver: &Deriver,
    who: &Identity,
    grant: &Grant,
    req: &pb::SubscribeRequest,
) -> Result<Spec, Error> {
    let mut spec = spec_of(hub, deriver, req)?;
    // The rate class of the grant is a floor: the consumer may only ask for less.
    spec.min_interval_ms = spec.min_interval_ms.max(grant.min_interval_ms);
    if grant.decision != Decision::Allow
        && !spec.selector.patterns.iter().all(|p| is_summary_name(p.as_str()))
    {
        // authorize_subscribe let only summaries through; never serve anything else.
        return Err(Error::permission_denied(format!(
            "{who} may receive only summaries; this subscription selects other events"
        )));
    }
    Ok(spec)
}

/// Longest `when` expression accepted.
pub const MAX_WHEN_BYTES: usize = 4096;

/// Validates a subscription request into a [`Spec`] (activating derived series it asks for).
pub fn spec_of(hub: &Hub, deriver: &Deriver, req: &pb::SubscribeRequest) -> Result<Spec, Error> {
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
        let window = gma_core::rolling::window(w).ok_or_else(|| {
            invalid(format!(
                "summary window {:?} is unknown: use 1m, 10m or 60m",
                gma_core::clip(w, 80)
            ))
        })?;
        if !windows
            .iter()
            .any(|x: &gma_core::rolling::Window| x.name == window.name)
        {
            windows.push(window);
        }
    }
    let selector = if windows.is_empty() && !req.forecast {
        activate_named_summaries(hub, deriver, &base);
        base
    } else {
        deriver
            .activate(hub, &base, &windows, req.forecast)
            .map_err(|e| Error::resource_exhausted(e.to_string()))?
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

/// A summary asked for by name (`host.cpu.avg1m`, `host.*.avg10m`) activates the derivation of
/// its base for that window, as `summaries = ["1m"]` on the base would: the summary-only hint
/// ("subscribe to host.cpu.avg1m") then delivers whether or not anything else derives it.
/// Best effort: when the producer's rule table is full the subscription still selects the name
/// (whatever already derives it is delivered).
fn activate_named_summaries(hub: &Hub, deriver: &Deriver, base: &Selector) {
    for p in &base.patterns {
        let Some(stem) = summary_base(p.as_str()) else {
            continue;
        };
        let name = p.as_str()[stem.len()..].trim_start_matches(".avg");
        let (Some(window), Ok(stem)) = (
            gma_core::rolling::window(name),
            gma_core::pattern::Pattern::event(stem),
        ) else {
            continue;
        };
        let sel = Selector {
            patterns: vec![stem],
            sources: base.sources.clone(),
        };
        if let Err(e) = deriver.activate(hub, &sel, &[window], false) {
            tracing::debug!(pattern = %p, error = %e, "summary asked by name not activated");
        }
    }
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

/// An accepted subscription: its id, its cancel flag, the connection's slot it holds, and its
/// encoded `EventBatch`es as its task sends them. The first response message carries the id;
/// the stream ends as soon as the subscription is cancelled (nothing is sent after an
/// Unsubscribe has been confirmed) or its task ends.
pub struct Opened {
    pub id: u64,
    pub cancel: Arc<subscription::Cancel>,
    pub slot: gma_core::guard::Slot,
    pub rx: mpsc::Receiver<Bytes>,
}

impl ProducerService {
    /// Subscribe's checks, in order (charge, policy, the connection's subscription slot, the
    /// request's validity), then the subscription's task started.
    pub fn open_subscription(&self, req: Request<pb::SubscribeRequest>) -> Result<Opened, Status> {
        let who = self.gate.admit(&req)?;
        let grant = authorize_subscribe(&self.gate, &who, req.get_ref())?;
        // One slot of this connection's subscriptions, held by the stream: closing the stream
        // (or the connection) frees it.
        let slot = self.gate.open_subscription(&req)?;
        let req = req.into_inner();
        let spec = granted_spec(&self.hub, &self.deriver, &who, &grant, &req)?;
        let start = start_of(self.hub.epoch(), req.resume_from_seq, req.epoch);
        let cursor = Cursor::new(spec);
        let handle = self.registry.add(&req.consumer_id, &who);
        let (id, cancel) = (handle.id, handle.cancel.clone());
        // Two batches in flight at most: memory per subscriber stays bounded and latency low.
        let (tx, rx) = mpsc::channel::<Bytes>(2);
        tokio::spawn(subscription::run(
            self.hub.clone(),
            self.registry.clone(),
            cursor,
            start,
            handle,
            tx,
        ));
        Ok(Opened { id, cancel, slot, rx })
    }
}

#[tonic::async_trait]
impl wire::producer_server::Producer for ProducerService {
    async fn query(&self, req: Request<pb::QueryRequest>) -> Result<Response<pb::QueryResponse>, Status> {
        let who = self.gate.admit(&req)?;
        let req = req.into_inner();
        let sel = selector(&req.patterns, &req.sources)?;
        if req.since_ms > 0 {
            return self.query_window(&who, &req, &sel);
        }
        if req.limit > 0 {
            return Err(
                invalid("limit: give it with since_ms (the latest events are one per series)").into(),
            );
        }
        let action = Action::ProducerQuery;
        let resources: Vec<&str> = req.patterns.iter().map(String::as_str).collect();
        let grant = self.gate.authorize(&who, action, &resources)?;
        // Summary-only: every pattern must name summaries (raw events never leave).
        if grant.decision != Decision::Allow && !req.patterns.iter().all(|p| is_summary_name(p)) {
            return Err(
                summary_only(&self.gate, &who, action, &req.patterns, &grant, |p| {
                    format!("query {p}.avg1m (or subscribe with --summary 1m)")
                })
                .into(),
            );
        }
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
            return Err(Error::not_found(format!(
                "no event available for {}{}{age}",
                gma_core::clip(&req.patterns.join(","), 200),
                if req.sources.is_empty() {
                    String::new()
                } else {
                    format!(" from {}", gma_core::clip(&req.sources.join(","), 200))
                }
            ))
            .into());
        }
        Ok(Response::new(pb::QueryResponse {
            events,
            epoch,
            schemas,
            ..Default::default()
        }))
    }

    type SubscribeStream = SubscribeStream;

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<SubscribeStream>, Status> {
        // Served by `crate::send` (the batches not copied into tonic's buffer); this is the
        // same stream through tonic's encoder, for a server built from the generated one alone.
        let Opened {
            id,
            cancel,
            slot,
            mut rx,
        } = self.open_subscription(req)?;
        let mut first = Some(wire::SubscribeResponse {
            subscription_id: id,
            batch: Bytes::new(),
        });
        let stream = futures::stream::poll_fn(move |cx| {
            let _slot = &slot;
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
        // Charged only: it ends subscriptions the same identity opened, nothing to see.
        let who = self.gate.admit(&req)?;
        let req = req.into_inner();
        let removed = if req.all {
            if req.consumer_id.is_empty() {
                return Err(invalid("unsubscribe all needs the consumer_id used to subscribe").into());
            }
            self.registry.cancel_all(&req.consumer_id, &who)
        } else {
            if req.subscription_id == 0 {
                return Err(invalid("give a subscription_id, or all = true with a consumer_id").into());
            }
            self.registry
                .cancel_one(req.subscription_id, &req.consumer_id, &who)?
        };
        Ok(Response::new(pb::UnsubscribeResponse { removed }))
    }

    async fn version(&self, _: Request<pb::VersionRequest>) -> Result<Response<pb::VersionResponse>, Status> {
        gma_core::endpoint::version("producer")
    }
}

#[derive(Clone)]
pub struct IngestService {
    pub hub: Arc<Hub>,
    pub gate: Arc<Gate>,
}

/// Authorizes `ingest` on event names; a summary-only grant does not let anyone publish.
pub(crate) fn authorize_ingest(gate: &Gate, who: &Identity, names: &[&str]) -> Result<(), Error> {
    let grant = gate.authorize(who, Action::Ingest, names)?;
    if grant.decision != Decision::Allow {
        let name = names
            .iter()
            .find(|n| gate.policy().authorize(who, Action::Ingest, n).decision != Decision::Allow)
            .copied()
            .unwrap_or("*");
        return Err(Error::permission_denied(format!(
            "{who} may not ingest {name:?}: the policy grants only its summaries (decided by {})",
            gate.policy().describe(&grant)
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl pb::ingest_server::Ingest for IngestService {
    async fn schema(
        &self,
        req: Request<pb::GetSchemaRequest>,
    ) -> Result<Response<pb::GetSchemaResponse>, Status> {
        let who = self.gate.admit(&req)?;
        let req = req.into_inner();
        gma_core::pattern::validate_event_name(&req.name).map_err(invalid)?;
        authorize_ingest(&self.gate, &who, &[&req.name])?;
        let inner = self.hub.lock();
        match inner.schema(&req.name) {
            Some(s) if req.version == 0 || req.version == s.version => {
                Ok(Response::new(pb::GetSchemaResponse {
                    schema: Some(s.clone()),
                }))
            }
            Some(s) => Err(Error::not_found(format!(
                "this producer holds {} version {}, not version {}",
                req.name, s.version, req.version
            ))
            .into()),
            None => Err(Error::not_found(format!("this producer has no schema for {}", req.name)).into()),
        }
    }

    async fn push(&self, req: Request<pb::IngestRequest>) -> Result<Response<pb::IngestResponse>, Status> {
        let who = self.gate.admit(&req)?;
        let req = req.into_inner();
        if req.events.len() > MAX_INGEST_EVENTS {
            return Err(Error::resource_exhausted(format!(
                "{} events in one request; send at most {MAX_INGEST_EVENTS}",
                req.events.len()
            ))
            .into());
        }
        // Authorized on every event name (and schema name) it carries, checked first so the
        // policy only sees valid names.
        let mut names = BTreeSet::new();
        for (i, e) in req.events.iter().enumerate() {
            gma_core::pattern::validate_event_name(&e.name)
                .map_err(|err| invalid(format!("event {i}: {err}")))?;
            names.insert(e.name.as_str());
        }
        for (i, sc) in req.schemas.iter().enumerate() {
            gma_core::pattern::validate_event_name(&sc.name)
                .map_err(|err| invalid(format!("schema {i}: {err}")))?;
            names.insert(sc.name.as_str());
        }
        let names: Vec<&str> = names.into_iter().collect();
        authorize_ingest(&self.gate, &who, &names)?;
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
                        ))
                        .into());
                    }
                }
                if d.timestamp_ns == 0 {
                    d.timestamp_ns = now;
                }
                data.push(d);
            }
        }
        if !req.schemas.is_empty() {
            self.hub.add_schemas(&req.schemas).map_err(Error::from)?;
        }
        let (last_seq, r) = self.hub.publish(&data);
        r.map_err(Error::from)?;
        Ok(Response::new(pb::IngestResponse {
            accepted: data.len() as u32,
            last_seq,
        }))
    }
}

#[derive(Clone)]
pub struct SimulatorService {
    pub sim: Option<SimHandle>,
    pub gate: Arc<Gate>,
}

#[tonic::async_trait]
impl pb::simulator_server::Simulator for SimulatorService {
    async fn set(&self, req: Request<pb::SimSetRequest>) -> Result<Response<pb::SimSetResponse>, Status> {
        let (_, grant) = self.gate.check(&req, Action::Admin, &["sim.set"])?;
        if grant.decision != Decision::Allow {
            return Err(Error::permission_denied("sim.set needs an \"allow\" admin grant").into());
        }
        let Some(sim) = &self.sim else {
            return Err(Error::failed_precondition(
                "this producer runs no simulated hosts (start it with --simulate FILE)",
            )
            .into());
        };
        let req = req.into_inner();
        if req.values.is_empty() {
            return Err(invalid("give at least one key=value to set").into());
        }
        let mut values: Vec<(String, f64)> = req.values.into_iter().collect();
        values.sort_by(|a, b| a.0.cmp(&b.0));
        if sim.get(&req.host).is_none() {
            return Err(Error::not_found(format!(
                "no simulated host {:?} on this producer",
                gma_core::clip(&req.host, 80)
            ))
            .into());
        }
        sim.set(&req.host, &values).map_err(invalid)?;
        Ok(Response::new(pb::SimSetResponse {
            hosts: vec![req.host],
        }))
    }
}
