//! The dashboard's inputs from the fabric, each a task that updates the [`Model`] and
//! broadcasts what changed:
//!
//! - [`records`]: the directory's Watch over every record (producers and consumers), resumed from
//!   the last revision after an outage, re-listed from scratch when history was compacted;
//! - [`cluster`]: `ClusterStatus` polled from the directory, and from every member it lists (each
//!   member's own state and applied index; unreachable members are shown as such);
//! - [`events`]: one [`Subscriber`] for every event the page shows (host load, CPU, memory,
//!   network, decisions, `gma.rpc`, federation status, batch jobs), however many browsers watch;
//! - [`hierarchy`]: the tree around each configured federation endpoint, walked every period.
//!
//! [`Model`]: crate::model::Model

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber};
use gma_proto::v1 as pb;
use pb::directory_client::DirectoryClient;
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::{now_ms, DashboardError, Shared};

async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = stop.wait_for(|s| *s) => false,
    }
}

/// Follows every record of the directory until `stop`.
pub async fn records(shared: Arc<Shared>, directory: String, mut stop: watch::Receiver<bool>) {
    let mut from = 0u64;
    let mut first_listing = true;
    let mut backoff = Duration::from_millis(100);
    loop {
        match watch_once(&shared, &directory, &mut from, &mut first_listing, &mut stop).await {
            Ok(()) => return,
            Err(e) => {
                tracing::info!(error = %e, "directory watch interrupted; resuming");
                shared.send_status("directory", Some(&e.to_string()));
            }
        }
        if !pause(&mut stop, backoff).await {
            return;
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn watch_once(
    shared: &Shared,
    directory: &str,
    from: &mut u64,
    first_listing: &mut bool,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), DashboardError> {
    let down = |m: String| DashboardError::Directory(m);
    let mut client = gma_consumer::directory::client(directory)
        .await
        .map_err(|e| down(e.to_string()))?;
    let req = |from_revision| pb::WatchRequest {
        from_revision,
        kind: pb::RecordKind::Unspecified as i32,
        event_pattern: String::new(),
    };
    let mut stream = match client.watch(req(*from)).await {
        Ok(s) => s.into_inner(),
        Err(s) if s.code() == tonic::Code::OutOfRange => {
            *from = 0;
            client
                .watch(req(0))
                .await
                .map_err(|s| down(s.message().to_string()))?
                .into_inner()
        }
        Err(s) => return Err(down(s.message().to_string())),
    };
    shared.send_status("directory", None);
    let relisting = *from == 0;
    let mut seen: HashSet<(&'static str, String)> = HashSet::new();
    loop {
        let msg = tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            m = stream.message() => m,
        };
        let ev = match msg {
            Ok(Some(ev)) => ev,
            Ok(None) => return Err(down("directory watch ended".into())),
            Err(s) => return Err(down(s.message().to_string())),
        };
        *from = (*from).max(ev.revision + 1);
        let ty = pb::WatchEventType::try_from(ev.r#type).unwrap_or(pb::WatchEventType::Unspecified);
        let now = now_ms();
        match ty {
            pb::WatchEventType::Synced => {
                if relisting {
                    shared.update(|m| m.retain_records(&seen));
                }
                *first_listing = false;
            }
            pb::WatchEventType::Put => {
                if let Some(entry) = &ev.entry {
                    if let Some(v) = crate::model::record_view(entry, 0, false) {
                        seen.insert((v.kind, v.id));
                    }
                    let before_start = *first_listing;
                    shared.update(|m| m.put_record(entry, now, before_start).into_iter().collect());
                }
            }
            pb::WatchEventType::Delete => {
                if let Some(entry) = &ev.entry {
                    let reason = if ev.reason.is_empty() {
                        "removed"
                    } else {
                        ev.reason.as_str()
                    };
                    shared.update(|m| m.delete_record(entry, reason).into_iter().collect());
                }
            }
            pb::WatchEventType::Unspecified => {}
        }
    }
}

/// A member's own `ClusterStatus`, bounded in time.
async fn member_status(
    clients: &mut HashMap<String, DirectoryClient<Channel>>,
    address: &str,
) -> Result<pb::ClusterStatusResponse, DashboardError> {
    let down = |m: String| DashboardError::Directory(m);
    if !clients.contains_key(address) {
        let ep = gma_core::tls::endpoint(address).map_err(|e| down(e.to_string()))?;
        let ch = ep
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await
            .map_err(|e| down(gma_consumer::error_chain(&e)))?;
        clients.insert(address.to_string(), DirectoryClient::new(ch));
    }
    let Some(c) = clients.get_mut(address) else {
        return Err(down("no client".into()));
    };
    let mut req = tonic::Request::new(pb::ClusterStatusRequest {});
    req.set_timeout(Duration::from_secs(1));
    match c.cluster_status(req).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) => {
            clients.remove(address);
            Err(down(s.message().to_string()))
        }
    }
}

/// Polls the cluster's membership and leader every `period` until `stop`.
pub async fn cluster(
    shared: Arc<Shared>,
    directory: String,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut clients: HashMap<String, DirectoryClient<Channel>> = HashMap::new();
    let addrs: Vec<String> = directory
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // Ask the configured members in turn until one answers.
        let mut status = Err(DashboardError::Directory("no directory address".into()));
        for a in &addrs {
            status = member_status(&mut clients, a).await;
            if status.is_ok() {
                break;
            }
        }
        let json = match status {
            Ok(s) => {
                let mut own = HashMap::new();
                for m in &s.members {
                    let r = if m.id == s.node_id {
                        Ok(s.clone())
                    } else {
                        member_status(&mut clients, &m.address).await
                    };
                    own.insert(m.id, r);
                }
                let mut j = crate::model::cluster_json(&s, &own);
                j["answered_by"] = serde_json::json!(s.node_id);
                j
            }
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        shared.update(|m| m.set_cluster(json).into_iter().collect());
    }
}

/// Subscribes to `patterns` at every producer of the directory until `stop`; one subscriber
/// for the whole dashboard.
pub async fn events(
    shared: Arc<Shared>,
    directory: String,
    patterns: Vec<String>,
    consumer_id: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut sub = Subscriber::follow(
        directory,
        StreamOptions {
            patterns,
            consumer_id,
            ..StreamOptions::default()
        },
    );
    loop {
        let d = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            d = sub.recv() => d,
        };
        match d {
            None => return,
            Some(Delivery::Events { producer, events, .. }) => {
                metrics::counter!(crate::telemetry::EVENTS).increment(events.len() as u64);
                shared.update(|m| m.events(&producer, &events));
            }
            Some(Delivery::Gone { producer, reason }) => {
                tracing::info!(%producer, %reason, "producer left");
                shared.update(|m| m.producer_gone(&producer).into_iter().collect());
            }
            Some(Delivery::Gap { producer, gap }) => {
                tracing::debug!(%producer, dropped = gap.dropped, "gap");
            }
            Some(Delivery::DirectoryDown { error }) => {
                tracing::debug!(%error, "directory down; streams continue");
            }
            Some(Delivery::DirectoryRefused { error }) => {
                tracing::error!(%error, "the directory refused the dashboard's watch: no live events (allow it and restart)");
                shared.send_status("directory", Some(&error));
                return;
            }
            Some(Delivery::Refused { producer, error }) => {
                tracing::warn!(%producer, %error, "a producer refused the dashboard's subscription");
            }
            Some(
                Delivery::Discovered { .. } | Delivery::Subscribed { .. } | Delivery::Reconnecting { .. },
            ) => {}
        }
    }
}

/// Walks the hierarchy around each of `endpoints` every `period` until `stop`: one tree each,
/// or `{"endpoint", "error"}` for one that does not answer.
pub async fn hierarchy(
    shared: Arc<Shared>,
    endpoints: Vec<String>,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let mut trees = Vec::with_capacity(endpoints.len());
        for e in &endpoints {
            let walked = tokio::select! {
                t = gma_federation::tree::walk(e, gma_federation::tree::MAX_DEPTH) => t,
                _ = stop.wait_for(|s| *s) => return,
            };
            trees.push(
                walked.unwrap_or_else(|error| serde_json::json!({"endpoint": e, "error": error.to_string()})),
            );
        }
        shared.update(|m| vec![m.set_hierarchy(trees)]);
        if !pause(&mut stop, period).await {
            return;
        }
    }
}
