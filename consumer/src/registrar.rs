//! Keeps one record (a producer's or a consumer's) in the directory under a lease.
//!
//! Register (or, when a record with our id survives from a previous run, Update it onto a fresh
//! lease), then renew the lease over a KeepAlive stream every TTL/3. Whenever the directory is
//! unreachable or says the lease is gone, start over with backoff. When the [`Catalog`]'s
//! version changes (new event names, sources, accepted patterns) the record is updated. None of
//! this blocks the role's real work: streams flow whether or not the directory is up. On stop
//! the record is removed, so others learn at once rather than after the TTL.

use std::sync::Arc;
use std::time::Duration;

use gma_proto::v1 as pb;
use pb::directory_client::DirectoryClient;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Code;

use crate::ConsumerError;

/// What a role registers: its record and the schemas of its events, with a version that
/// changes whenever either does.
pub trait Catalog: Send + Sync + 'static {
    fn version(&self) -> u64;
    fn record(&self) -> (pb::Record, Vec<pb::EventSchema>, u64);
}

/// Where and how long.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Directory members, `a:1,b:2` (tried in turn).
    pub directory: String,
    pub kind: pb::RecordKind,
    pub id: String,
    pub ttl_ms: u64,
}

enum Outcome {
    Stop,
    Retry(String),
    /// The directory refused the registration ([`crate::is_refusal`]).
    Refused(String),
}

/// Runs until `stop` flips; then removes the record (best effort). A refusal of the first
/// registration (PERMISSION_DENIED, UNAUTHENTICATED, INVALID_ARGUMENT — a lease TTL outside the
/// directory's range, a record it does not accept) ends it at once with the directory's
/// message: asking again would get the same answer, and the role should stop and say so. Once
/// registered, a refusal is retried like an outage (the role keeps serving).
pub async fn run(
    reg: Registration,
    catalog: Arc<dyn Catalog>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ConsumerError> {
    let mut backoff = Duration::from_millis(100);
    let mut registered_once = false;
    loop {
        match session(&reg, &*catalog, &mut stop, &mut registered_once).await {
            Outcome::Stop => break,
            Outcome::Refused(why) if !registered_once => {
                tracing::error!(id = %reg.id, error = %why, "the directory refused the registration");
                return Err(ConsumerError::Registration(why));
            }
            Outcome::Retry(why) | Outcome::Refused(why) => {
                metrics::counter!(crate::telemetry::REGISTRATION_RETRIES).increment(1);
                tracing::debug!(error = %why, "directory session ended; retrying");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => break,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
        if registered_once {
            // After a working session, retry quickly: the directory probably just restarted.
            backoff = backoff.min(Duration::from_millis(500));
        }
    }
    if let Ok(mut client) = connect(&reg.directory).await {
        let mut req = tonic::Request::new(pb::RemoveRequest {
            kind: reg.kind as i32,
            id: reg.id.clone(),
        });
        req.set_timeout(Duration::from_secs(1));
        let _ = client.remove(req).await;
    }
    Ok(())
}

/// Connects to the first reachable member of `addrs` (`a:1,b:2`), starting after the one
/// used last time so a dead member is not always tried first.
pub async fn connect(addrs: &str) -> Result<DirectoryClient<Channel>, ConsumerError> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let list: Vec<&str> = addrs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if list.is_empty() {
        return Err(ConsumerError::Directory("no directory address given".into()));
    }
    let start = NEXT.load(std::sync::atomic::Ordering::Relaxed);
    let mut errors = Vec::new();
    for i in 0..list.len() {
        let k = (start + i) % list.len();
        let ep = gma_core::tls::endpoint(list[k])
            .map_err(|e| ConsumerError::Directory(format!("bad directory address: {e}")))?;
        let uri = ep.uri().to_string();
        match ep.connect_timeout(Duration::from_secs(2)).connect().await {
            Ok(ch) => {
                NEXT.store(k, std::sync::atomic::Ordering::Relaxed);
                return Ok(DirectoryClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES));
            }
            Err(e) => errors.push(format!("{uri}: {e}")),
        }
    }
    NEXT.store(start + 1, std::sync::atomic::Ordering::Relaxed);
    Err(ConsumerError::Directory(format!(
        "cannot connect to the directory ({})",
        errors.join("; ")
    )))
}

/// Registers, or takes over an existing record with our id, returning (lease, ttl, version).
async fn register(
    client: &mut DirectoryClient<Channel>,
    reg: &Registration,
    catalog: &dyn Catalog,
) -> Result<(u64, u64, u64), Outcome> {
    let failed = |what: &str, s: tonic::Status| {
        let msg = format!("{what}: {:?}: {}", s.code(), s.message());
        if crate::is_refusal(s.code()) {
            Outcome::Refused(msg)
        } else {
            Outcome::Retry(msg)
        }
    };
    let (record, schemas, version) = catalog.record();
    let update = pb::UpdateRequest {
        record: Some(record.clone()),
        schemas: schemas.clone(),
        lease_ttl_ms: reg.ttl_ms,
    };
    let req = pb::RegisterRequest {
        record: Some(record),
        schemas,
        lease_ttl_ms: reg.ttl_ms,
    };
    match client.register(req).await {
        Ok(r) => {
            let r = r.into_inner();
            Ok((r.lease_id, r.lease_ttl_ms, version))
        }
        Err(s) if s.code() == Code::AlreadyExists && s.message().contains(&reg.id) => {
            let r = client
                .update(update)
                .await
                .map_err(|s| failed("update", s))?
                .into_inner();
            Ok((r.lease_id, r.lease_ttl_ms, version))
        }
        Err(s) => Err(failed("register", s)),
    }
}

async fn session(
    reg: &Registration,
    catalog: &dyn Catalog,
    stop: &mut watch::Receiver<bool>,
    registered_once: &mut bool,
) -> Outcome {
    let mut client = match connect(&reg.directory).await {
        Ok(c) => c,
        Err(e) => return Outcome::Retry(e.to_string()),
    };
    let (mut lease, ttl_ms, mut version) = match register(&mut client, reg, catalog).await {
        Ok(v) => v,
        Err(Outcome::Retry(e)) => {
            tracing::warn!(error = %e, "directory registration failed");
            return Outcome::Retry(e);
        }
        Err(other) => return other,
    };
    if !*registered_once {
        tracing::info!(id = %reg.id, lease, "registered in the directory");
    } else {
        tracing::info!(id = %reg.id, lease, "re-registered in the directory");
    }
    *registered_once = true;
    metrics::counter!(crate::telemetry::REGISTRATIONS).increment(1);
    let (tx, rx) = mpsc::channel(4);
    let mut responses = match client.keep_alive(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Outcome::Retry(format!("keepalive: {}", s.message())),
    };
    let period = Duration::from_millis((ttl_ms / 3).max(50));
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return Outcome::Stop,
        }
        // The record changed since we registered: refresh it.
        if catalog.version() != version {
            let (record, schemas, v) = catalog.record();
            let upd = pb::UpdateRequest {
                record: Some(record),
                schemas,
                lease_ttl_ms: 0,
            };
            match client.update(upd).await {
                Ok(_) => version = v,
                Err(s) if s.code() == Code::NotFound => return Outcome::Retry("record vanished".into()),
                Err(s) => return Outcome::Retry(format!("update: {}", s.message())),
            }
        }
        if tx.send(pb::KeepAliveRequest { lease_id: lease }).await.is_err() {
            return Outcome::Retry("keepalive stream closed".into());
        }
        match tokio::time::timeout(period.max(Duration::from_secs(1)), responses.message()).await {
            Ok(Ok(Some(r))) if r.ttl_ms > 0 => {}
            Ok(Ok(Some(_))) => {
                tracing::warn!(lease, "directory lease lost; registering again");
                match register(&mut client, reg, catalog).await {
                    Ok((l, _, v)) => {
                        lease = l;
                        version = v;
                    }
                    Err(other) => return other,
                }
            }
            Ok(Ok(None)) => return Outcome::Retry("keepalive stream ended".into()),
            Ok(Err(s)) => return Outcome::Retry(format!("keepalive: {}", s.message())),
            Err(_) => return Outcome::Retry("keepalive timed out".into()),
        }
    }
}
