//! Producer-initiated streams: the producer finds consumers that accept pushed events and
//! streams to their `Consumer.Deliver` endpoint.
//!
//! The pusher watches the directory's consumer records. For each consumer whose accepted
//! patterns match an event this producer offers, one session: connect, say hello (our id,
//! address, epoch, the matching event names, and the subscription id the consumer may cancel
//! with `Producer.Unsubscribe`), read the consumer's answer (what to send, from which seq, with
//! which slow-consumer policy), then run an ordinary subscription (same cursor, filters,
//! policies and shared encodings as `Subscribe`) whose batches go out on the Deliver stream.
//!
//! A session that breaks is retried with backoff while the consumer's record exists. A
//! consumer that ends the stream (`end = true`) or refuses it is left alone until its record
//! changes (a new revision); a removed record ends its session at once.

use gma_core::Refuse;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gma_consumer::registrar;
use gma_core::pattern::Pattern;
use gma_proto::v1 as pb;
use gma_proto::wire;
use parking_lot::Mutex;
use prost::bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::derive::Deriver;
use crate::error::Error;
use crate::hub::Hub;
use crate::service::{authorize_subscribe, granted_spec, start_of};
use crate::subscription::{self, Cursor, Registry};

/// Who we are, for the hello.
#[derive(Debug, Clone)]
pub struct PushConfig {
    pub directory: String,
    pub producer_id: String,
    pub address: String,
}

#[derive(Clone)]
pub struct Pusher {
    /// The producer's policy: a pushed stream is authorized for the consumer record's owner.
    pub gate: Arc<gma_core::guard::Gate>,
    pub hub: Arc<Hub>,
    pub registry: Arc<Registry>,
    pub deriver: Arc<Deriver>,
    pub config: PushConfig,
}

enum Ended {
    /// The consumer ended or refused the stream: do not come back for this record revision.
    ByConsumer(String),
    /// Broken; retry.
    Broken(String),
    Stopped,
}

struct Target {
    revision: u64,
    record: pb::ConsumerRecord,
    task: Option<JoinHandle<()>>,
    /// The consumer ended the stream at this record revision.
    refused: Arc<Mutex<Option<u64>>>,
}

/// The identity that registered a consumer record, as stamped by the directory
/// (`gma.owner.cn`, `gma.owner.org`); anonymous when it registered without a certificate.
fn record_owner(c: &pb::ConsumerRecord) -> gma_core::authz::Identity {
    let get = |k: &str| c.attributes.get(k).cloned().unwrap_or_default();
    gma_core::authz::Identity::new(get(OWNER_CN), get(OWNER_ORG))
}

/// Record attributes the directory sets to the registering identity (see docs/security.md).
pub const OWNER_CN: &str = "gma.owner.cn";
pub const OWNER_ORG: &str = "gma.owner.org";

/// Event names this producer offers that `accepts` matches.
fn matching(hub: &Hub, accepts: &[String]) -> Vec<String> {
    let patterns: Vec<Pattern> = accepts.iter().filter_map(|p| Pattern::event(p).ok()).collect();
    let inner = hub.lock();
    let mut names: Vec<String> = inner
        .schemas()
        .map(|s| s.name.clone())
        .filter(|n| patterns.iter().any(|p| p.matches(n)))
        .collect();
    names.sort();
    names
}

impl Pusher {
    /// Follows the directory's consumer records until `stop` flips.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut targets: HashMap<String, Target> = HashMap::new();
        let mut backoff = Duration::from_millis(200);
        loop {
            let r = self.follow(&mut targets, &mut stop).await;
            if *stop.borrow() {
                break;
            }
            if let Err(e) = r {
                tracing::debug!(error = %e, "consumer watch ended; retrying");
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => break,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        for (_, t) in targets.drain() {
            if let Some(task) = t.task {
                task.abort();
            }
        }
    }

    async fn follow(
        &self,
        targets: &mut HashMap<String, Target>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), Error> {
        let mut client = registrar::connect(&self.config.directory)
            .await
            .map_err(|e| Error::unavailable(e.to_string()))?;
        let mut watch = client
            .watch(pb::WatchRequest {
                from_revision: 0,
                kind: pb::RecordKind::Consumer as i32,
                event_pattern: String::new(),
            })
            .await
            .map_err(|s| Error::unavailable(format!("watch: {}", s.message())))?
            .into_inner();
        let mut seen = Vec::new();
        let mut synced = false;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                ev = watch.message() => {
                    let ev = ev
                        .map_err(|s| Error::unavailable(format!("watch: {}", s.message())))?
                        .ok_or_else(|| Error::unavailable("watch ended"))?;
                    let kind = pb::WatchEventType::try_from(ev.r#type).unwrap_or_default();
                    let consumer = ev.entry.as_ref().and_then(|e| e.record.as_ref()).and_then(|r| match &r.record {
                        Some(pb::record::Record::Consumer(c)) => Some(c.clone()),
                        _ => None,
                    });
                    match (kind, consumer) {
                        (pb::WatchEventType::Put, Some(c)) => {
                            let rev = ev.entry.as_ref().map(|e| e.mod_revision).unwrap_or_default();
                            if !synced {
                                seen.push(c.id.clone());
                            }
                            self.put(targets, c, rev);
                        }
                        (pb::WatchEventType::Delete, Some(c)) => {
                            if let Some(t) = targets.remove(&c.id) {
                                if let Some(task) = t.task {
                                    task.abort();
                                }
                            }
                        }
                        (pb::WatchEventType::Synced, _) if !synced => {
                            synced = true;
                            // Consumers that vanished while we were not watching.
                            targets.retain(|id, t| {
                                let keep = seen.contains(id);
                                if !keep {
                                    if let Some(task) = t.task.take() {
                                        task.abort();
                                    }
                                }
                                keep
                            });
                        }
                        _ => {}
                    }
                }
                _ = tick.tick() => {
                    // Start sessions for consumers that match events we began offering since.
                    let idle: Vec<(pb::ConsumerRecord, u64)> = targets
                        .values()
                        .filter(|t| t.task.as_ref().is_none_or(|h| h.is_finished()))
                        .map(|t| (t.record.clone(), t.revision))
                        .collect();
                    for (c, rev) in idle {
                        self.put(targets, c, rev);
                    }
                }
                _ = stop.changed() => return Ok(()),
            }
        }
    }

    /// A consumer record appeared or changed: (re)start its session if it should run.
    fn put(&self, targets: &mut HashMap<String, Target>, c: pb::ConsumerRecord, revision: u64) {
        let refused = match targets.get(&c.id) {
            Some(t) if t.revision == revision && t.task.as_ref().is_some_and(|h| !h.is_finished()) => return,
            Some(t) if *t.refused.lock() == Some(revision) => return,
            Some(t) => t.refused.clone(),
            None => Arc::new(Mutex::new(None)),
        };
        if let Some(old) = targets.get_mut(&c.id).and_then(|t| t.task.take()) {
            old.abort();
        }
        let events = matching(&self.hub, &c.accepts);
        let pulls = c
            .attributes
            .get(gma_consumer::PULL_ATTRIBUTE)
            .is_some_and(|v| v == "true");
        let task = if c.address.is_empty() || events.is_empty() || pulls {
            None
        } else {
            let me = self.clone();
            let record = c.clone();
            let refused = refused.clone();
            Some(tokio::spawn(async move {
                me.session_loop(record, events, revision, refused).await;
            }))
        };
        targets.insert(
            c.id.clone(),
            Target {
                revision,
                record: c,
                task,
                refused,
            },
        );
    }

    async fn session_loop(
        self,
        c: pb::ConsumerRecord,
        events: Vec<String>,
        revision: u64,
        refused: Arc<Mutex<Option<u64>>>,
    ) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.session(&c, &events).await {
                Ended::ByConsumer(why) => {
                    tracing::info!(consumer = %c.id, reason = %why, "consumer ended the pushed stream");
                    *refused.lock() = Some(revision);
                    return;
                }
                Ended::Stopped => return,
                Ended::Broken(why) => {
                    metrics::counter!(crate::telemetry::PUSH_RETRIES).increment(1);
                    tracing::debug!(consumer = %c.id, error = %why, "pushed stream broke; retrying");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn session(&self, c: &pb::ConsumerRecord, events: &[String]) -> Ended {
        let channel = match gma_consumer::connect(&c.address).await {
            Ok(ch) => ch,
            Err(e) => return Ended::Broken(e.to_string()),
        };
        let mut client = wire::consumer_client::ConsumerClient::new(channel)
            .max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
        let handle = self.registry.add(&c.id, &record_owner(c));
        let cancel = handle.cancel.clone();
        let (req_tx, req_rx) = mpsc::channel::<wire::DeliverRequest>(2);
        let hello = pb::DeliverHello {
            producer_id: self.config.producer_id.clone(),
            address: self.config.address.clone(),
            epoch: self.hub.epoch(),
            events: events.to_vec(),
            subscription_id: handle.id,
        };
        let _ = req_tx
            .send(wire::DeliverRequest {
                msg: Some(wire::deliver_request::Msg::Hello(hello)),
            })
            .await;
        let mut responses = match client.deliver(ReceiverStream::new(req_rx)).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == tonic::Code::InvalidArgument => {
                return Ended::ByConsumer(format!("refused: {}", s.message()))
            }
            Err(s) => return Ended::Broken(format!("deliver: {}", s.message())),
        };
        let first = match responses.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Ended::Broken("consumer closed before answering".into()),
            Err(s) => return Ended::Broken(format!("deliver: {}", s.message())),
        };
        if first.end {
            return Ended::ByConsumer(first.reason);
        }
        let req = pb::SubscribeRequest {
            patterns: if first.patterns.is_empty() {
                c.accepts.clone()
            } else {
                first.patterns.clone()
            },
            sources: first.sources.clone(),
            resume_from_seq: first.resume_from_seq,
            epoch: first.epoch,
            consumer_id: c.id.clone(),
            policy: first.policy,
            ..Default::default()
        };
        // The directory stamps every record with the identity that registered it: push only
        // what that identity may subscribe to.
        let owner = record_owner(c);
        let spec = match authorize_subscribe(&self.gate, &owner, &req)
            .and_then(|grant| granted_spec(&self.hub, &self.deriver, &owner, &grant, &req))
            .map_err(tonic::Status::from)
        {
            Ok(s) => s,
            Err(s) if s.code() == tonic::Code::PermissionDenied => {
                tracing::warn!(consumer = %c.id, reason = %s.message(), "not pushing: not authorized");
                return Ended::ByConsumer(format!("not authorized: {}", s.message()));
            }
            Err(s) => return Ended::ByConsumer(format!("its subscription is invalid: {}", s.message())),
        };
        tracing::info!(consumer = %c.id, address = %c.address, "pushing events to consumer");
        metrics::counter!(crate::telemetry::PUSH_SESSIONS).increment(1);
        let start = start_of(self.hub.epoch(), req.resume_from_seq, req.epoch);
        let (btx, mut brx) = mpsc::channel::<Bytes>(2);
        let task = tokio::spawn(subscription::run(
            self.hub.clone(),
            self.registry.clone(),
            Cursor::new(spec),
            start,
            handle,
            btx,
        ));
        let _abort = AbortOnDrop(task);
        loop {
            tokio::select! {
                b = brx.recv() => match b {
                    Some(batch) => {
                        let msg = wire::DeliverRequest { msg: Some(wire::deliver_request::Msg::Batch(batch)) };
                        if req_tx.send(msg).await.is_err() {
                            // The call is over: if the consumer ended it, its last answer says so
                            // (a batch may be ready before that answer is read).
                            return ended_by(&mut responses).await;
                        }
                    }
                    // The subscription ended: cancelled (Unsubscribe by the consumer, or shutdown).
                    None => return if cancel.is_cancelled() { Ended::ByConsumer("unsubscribed".into()) } else { Ended::Stopped },
                },
                r = responses.message() => match r {
                    Ok(Some(r)) if r.end => return Ended::ByConsumer(r.reason),
                    Ok(Some(_ack)) => {}
                    Ok(None) => return Ended::Broken("consumer closed the stream".into()),
                    Err(s) => return Ended::Broken(format!("deliver: {}", s.message())),
                },
            }
        }
    }
}

/// Why a call whose request side closed ended: the consumer's `end` answer if it sent one
/// (read within a second), else a broken stream.
async fn ended_by(responses: &mut tonic::Streaming<pb::DeliverResponse>) -> Ended {
    let end = async {
        loop {
            match responses.message().await {
                Ok(Some(r)) if r.end => return Some(r.reason),
                Ok(Some(_ack)) => {}
                Ok(None) | Err(_) => return None,
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(1), end).await {
        Ok(Some(reason)) => Ended::ByConsumer(reason),
        _ => Ended::Broken("request stream closed".into()),
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
