//! Clique membership from the directory: the producers of `net.rtt` in this site.
//!
//! A Watch from revision 0 lists every current record, then streams changes; a netprobe whose
//! lease expires is deleted and leaves the clique, a new one joins when it registers. After a
//! directory outage the watch starts over from a full listing; meanwhile the last membership
//! stays in force (the clique keeps probing without the directory).

use gma_core::Refuse;
use std::collections::BTreeMap;
use std::time::Duration;

use gma_consumer::directory;
use gma_proto::v1 as pb;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::events::RTT;

/// Member id -> address.
pub type Members = BTreeMap<String, String>;

/// Sends the membership of `site` to `tx` whenever it changes, until `tx` closes.
pub async fn follow(dir: String, site: String, tx: mpsc::Sender<Members>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match watch_once(&dir, &site, &tx).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "directory watch for clique members failed; retrying");
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn watch_once(dir: &str, site: &str, tx: &mpsc::Sender<Members>) -> Result<(), Error> {
    let mut client = directory::client(dir)
        .await
        .map_err(|e| Error::unavailable(e.to_string()))?;
    let mut stream = client
        .watch(pb::WatchRequest {
            from_revision: 0,
            kind: pb::RecordKind::Producer as i32,
            event_pattern: RTT.into(),
        })
        .await
        .map_err(|s| Error::unavailable(s.message().to_string()))?
        .into_inner();
    let mut members = Members::new();
    let mut synced = false;
    loop {
        let ev = match stream.message().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return Err(Error::unavailable("directory watch ended")),
            Err(s) => return Err(Error::unavailable(s.message().to_string())),
        };
        let ty = pb::WatchEventType::try_from(ev.r#type).unwrap_or(pb::WatchEventType::Unspecified);
        let before = members.clone();
        match ty {
            pb::WatchEventType::Synced => synced = true,
            pb::WatchEventType::Put | pb::WatchEventType::Delete => {
                let Some(p) = ev.entry.and_then(directory::producer_of) else {
                    continue;
                };
                let ours = p.site == site && p.events.iter().any(|e| e == RTT);
                if ty == pb::WatchEventType::Put && ours {
                    members.insert(p.id, p.address);
                } else {
                    members.remove(&p.id);
                }
            }
            _ => continue,
        }
        if synced
            && (ty == pb::WatchEventType::Synced || members != before)
            && tx.send(members.clone()).await.is_err()
        {
            return Ok(());
        }
    }
}
