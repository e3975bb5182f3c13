//! Directory lookups for consumers and tools.

use gma_proto::v1 as pb;
use pb::directory_client::DirectoryClient;
use tonic::transport::Channel;

use crate::{connect, ConsumerError};

/// A directory client with the fabric's message size limit. `addrs` may list several members
/// of a replicated directory (`a:1,b:2,c:3`): the first that accepts a connection is used. Any
/// member serves every call (writes and linearizable reads are passed to the leader).
pub async fn client(addrs: &str) -> Result<DirectoryClient<Channel>, ConsumerError> {
    let mut last = None;
    for addr in addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match connect(addr).await {
            Ok(ch) => {
                return Ok(DirectoryClient::new(ch).max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| ConsumerError::Address(addrs.to_string(), "no directory address given".into())))
}

/// Runs a search to the end, following page tokens ("get next").
pub async fn search_all(
    client: &mut DirectoryClient<Channel>,
    mut req: pb::SearchRequest,
) -> Result<(Vec<pb::RecordEntry>, u64), ConsumerError> {
    let mut out = Vec::new();
    loop {
        let r = client
            .search(req.clone())
            .await
            .map_err(|s| ConsumerError::Rpc("search".into(), s))?
            .into_inner();
        out.extend(r.entries);
        if r.next_page_token.is_empty() || req.single {
            return Ok((out, r.revision));
        }
        req.page_token = r.next_page_token;
    }
}

/// Producer records offering events that match `pattern` (and `source`, if not empty).
pub async fn producers(
    client: &mut DirectoryClient<Channel>,
    pattern: &str,
    source: &str,
) -> Result<Vec<pb::ProducerRecord>, ConsumerError> {
    let req = pb::SearchRequest {
        kind: pb::RecordKind::Producer as i32,
        event_pattern: pattern.to_string(),
        source: source.to_string(),
        ..Default::default()
    };
    let (entries, _) = search_all(client, req).await?;
    Ok(entries.into_iter().filter_map(producer_of).collect())
}

/// The producer record inside an entry, if it is one.
pub fn producer_of(e: pb::RecordEntry) -> Option<pb::ProducerRecord> {
    match e.record?.record? {
        pb::record::Record::Producer(p) => Some(p),
        _ => None,
    }
}
