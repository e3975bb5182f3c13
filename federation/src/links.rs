//! Peer links as directory records.
//!
//! A link of a site to another is a consumer record in the site's own directory: id
//! `federation-peer/<site>`, manner `federation-peer`, address = the other site's federation
//! endpoint, `accepts = ["site.summary"]` (what the link brings in), attributes `peer_site`,
//! `role` (peer | parent | child), `hops` and `gma.pull = "true"` (producers never push to it).
//! `gma federation add` registers one, `gma federation remove` removes it.
//!
//! The site's endpoint **adopts** every link record: it moves each onto a lease of its own and
//! keeps it alive ([`keep`]), so a link lives as long as the endpoint (and comes back from its
//! state file when the endpoint restarts), not as long as the command that added it. It
//! follows the records with Watch: a new record adds a session, a removed one ends it.

use gma_core::Refuse;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use gma_proto::v1 as pb;
use pb::directory_client::DirectoryClient;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::error::Error;
use crate::site::{Link, Role};
use crate::summary::SUMMARY_EVENT;

pub const MANNER: &str = "federation-peer";
pub const ID_PREFIX: &str = "federation-peer/";

pub fn record_id(site: &str) -> String {
    format!("{ID_PREFIX}{site}")
}

pub fn record(link: &Link) -> pb::ConsumerRecord {
    pb::ConsumerRecord {
        id: record_id(&link.site),
        address: gma_core::addr::endpoint_uri(&link.endpoint),
        accepts: vec![SUMMARY_EVENT.into()],
        manner: MANNER.into(),
        site: String::new(),
        org: String::new(),
        attributes: [
            ("peer_site".to_string(), link.site.clone()),
            ("role".to_string(), link.role.as_str().to_string()),
            ("hops".to_string(), link.hops.to_string()),
            ("endpoint".to_string(), link.endpoint.clone()),
            (gma_consumer::PULL_ATTRIBUTE.to_string(), "true".to_string()),
        ]
        .into_iter()
        .collect(),
    }
}

/// The link a record describes, if it is a link record.
pub fn parse(r: &pb::ConsumerRecord) -> Option<Link> {
    if r.manner != MANNER || !r.id.starts_with(ID_PREFIX) {
        return None;
    }
    let a = &r.attributes;
    Some(Link {
        site: a.get("peer_site")?.clone(),
        endpoint: a.get("endpoint").cloned().unwrap_or_else(|| r.address.clone()),
        role: Role::parse(a.get("role").map_or("peer", String::as_str))?,
        hops: a.get("hops").and_then(|h| h.parse().ok()).unwrap_or(0),
    })
}

fn consumer_of(e: &pb::RecordEntry) -> Option<&pb::ConsumerRecord> {
    match e.record.as_ref()?.record.as_ref()? {
        pb::record::Record::Consumer(c) => Some(c),
        _ => None,
    }
}

async fn client(dir: &str) -> Result<DirectoryClient<Channel>, Error> {
    gma_consumer::directory::client(dir)
        .await
        .map_err(|e| Error::unavailable(e.to_string()))
}

fn reg(link: &Link, ttl_ms: u64) -> pb::RegisterRequest {
    pb::RegisterRequest {
        record: Some(pb::Record {
            record: Some(pb::record::Record::Consumer(record(link))),
        }),
        schemas: Vec::new(),
        lease_ttl_ms: ttl_ms,
    }
}

/// Registers `link` (or moves an existing record of the same site onto a fresh lease with the
/// new values); returns the lease.
pub async fn put(c: &mut DirectoryClient<Channel>, link: &Link, ttl_ms: u64) -> Result<u64, tonic::Status> {
    match c.register(reg(link, ttl_ms)).await {
        Ok(r) => Ok(r.into_inner().lease_id),
        Err(s) if s.code() == tonic::Code::AlreadyExists => {
            let r = c
                .update(pb::UpdateRequest {
                    record: reg(link, ttl_ms).record,
                    schemas: Vec::new(),
                    lease_ttl_ms: ttl_ms,
                })
                .await?;
            Ok(r.into_inner().lease_id)
        }
        Err(s) => Err(s),
    }
}

/// `gma federation add`.
pub async fn add(dir: &str, link: &Link) -> Result<(), Error> {
    let mut c = client(dir).await?;
    // Long enough for the endpoint to adopt it; the endpoint then keeps it.
    put(&mut c, link, 60_000)
        .await
        .map(|_| ())
        .map_err(|s| Error::unavailable(format!("{} ({:?})", s.message(), s.code())))
}

/// `gma federation remove`.
pub async fn remove(dir: &str, site: &str) -> Result<(), Error> {
    let mut c = client(dir).await?;
    c.remove(pb::RemoveRequest {
        kind: pb::RecordKind::Consumer as i32,
        id: record_id(site),
    })
    .await
    .map(|_| ())
    .map_err(|s| Error::unavailable(format!("{} ({:?})", s.message(), s.code())))
}

/// The links recorded in the directory.
pub async fn list(dir: &str) -> Result<Vec<Link>, Error> {
    let mut c = client(dir).await?;
    let (entries, _) = gma_consumer::directory::search_all(
        &mut c,
        pb::SearchRequest {
            kind: pb::RecordKind::Consumer as i32,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| Error::unavailable(e.to_string()))?;
    let mut out: Vec<Link> = entries.iter().filter_map(consumer_of).filter_map(parse).collect();
    out.sort_by(|a, b| a.site.cmp(&b.site));
    Ok(out)
}

/// Keeps the site's link records (see the module doc) until `stop`; sends the current set of
/// links on `tx` whenever it changes. `initial`: the links from the config and the state file.
pub async fn keep(
    dir: String,
    own_site: String,
    initial: Vec<Link>,
    ttl_ms: u64,
    tx: mpsc::UnboundedSender<Vec<Link>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut links: BTreeMap<String, Link> = initial.into_iter().map(|l| (l.site.clone(), l)).collect();
    let _ = tx.send(links.values().cloned().collect());
    let mut leases: HashMap<String, u64> = HashMap::new();
    let mut backoff = Duration::from_millis(100);
    loop {
        let r = tokio::select! {
            r = session(&dir, &own_site, &mut links, &mut leases, ttl_ms, &tx) => r,
            _ = stop.changed() => return,
        };
        if let Err(e) = r {
            tracing::debug!(error = %e, "link records: directory session ended; retrying");
        }
        leases.clear();
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn session(
    dir: &str,
    own_site: &str,
    links: &mut BTreeMap<String, Link>,
    leases: &mut HashMap<String, u64>,
    ttl_ms: u64,
    tx: &mpsc::UnboundedSender<Vec<Link>>,
) -> Result<(), Error> {
    let mut c = client(dir).await?;
    for l in links.values() {
        let lease = put(&mut c, l, ttl_ms)
            .await
            .map_err(|s| Error::unavailable(s.message().to_string()))?;
        leases.insert(l.site.clone(), lease);
    }
    let mut watch = c
        .watch(pb::WatchRequest {
            from_revision: 0,
            kind: pb::RecordKind::Consumer as i32,
            event_pattern: String::new(),
        })
        .await
        .map_err(|s| Error::unavailable(s.message().to_string()))?
        .into_inner();
    let (ka_tx, ka_rx) = mpsc::channel(64);
    let mut ka = c
        .keep_alive(ReceiverStream::new(ka_rx))
        .await
        .map_err(|s| Error::unavailable(s.message().to_string()))?
        .into_inner();
    let mut tick = tokio::time::interval(Duration::from_millis((ttl_ms / 3).max(100)));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                for lease in leases.values() {
                    if ka_tx.send(pb::KeepAliveRequest { lease_id: *lease }).await.is_err() {
                        return Err(Error::unavailable("keepalive stream closed"));
                    }
                }
            }
            r = ka.message() => match r {
                Ok(Some(_)) => {}
                Ok(None) => return Err(Error::unavailable("keepalive stream ended")),
                Err(s) => return Err(Error::unavailable(s.message().to_string())),
            },
            ev = watch.message() => {
                let ev = match ev {
                    Ok(Some(ev)) => ev,
                    Ok(None) => return Err(Error::unavailable("watch ended")),
                    Err(s) => return Err(Error::unavailable(s.message().to_string())),
                };
                let Some(entry) = ev.entry.as_ref() else { continue };
                let Some(rec) = consumer_of(entry) else { continue };
                let Some(link) = parse(rec) else { continue };
                if link.site == own_site {
                    continue;
                }
                match pb::WatchEventType::try_from(ev.r#type) {
                    Ok(pb::WatchEventType::Put) => {
                        if leases.get(&link.site) == Some(&entry.lease_id) && links.get(&link.site) == Some(&link) {
                            continue; // our own
                        }
                        let lease = put(&mut c, &link, ttl_ms).await.map_err(|s| Error::unavailable(s.message().to_string()))?;
                        leases.insert(link.site.clone(), lease);
                        tracing::info!(site = %link.site, endpoint = %link.endpoint, role = link.role.as_str(), "federation link");
                        links.insert(link.site.clone(), link);
                        let _ = tx.send(links.values().cloned().collect());
                    }
                    Ok(pb::WatchEventType::Delete) => {
                        if leases.get(&link.site) != Some(&entry.lease_id) {
                            continue; // an older incarnation of the record
                        }
                        if ev.reason.contains("expired") {
                            // Our lease lapsed (we were stopped): put it back.
                            if let Some(l) = links.get(&link.site).cloned() {
                                let lease = put(&mut c, &l, ttl_ms).await.map_err(|s| Error::unavailable(s.message().to_string()))?;
                                leases.insert(l.site.clone(), lease);
                            }
                        } else {
                            tracing::info!(site = %link.site, "federation link removed");
                            leases.remove(&link.site);
                            links.remove(&link.site);
                            let _ = tx.send(links.values().cloned().collect());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
