//! In-process directory servers for the directory's server tests: start a real server on a
//! port-0 listener, connect a client, wait on conditions with a deadline, build records.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use gma_core::event::dbl;
use gma_directory::{DirError, DirectoryConfig};
use gma_proto::v1::{self as pb, directory_client::DirectoryClient, record::Record as Body};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Upper bound for anything a test waits for; reaching it is a failure, never a pass.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), DirError>>,
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> DirectoryClient<Channel> {
        DirectoryClient::connect(self.url())
            .await
            .expect("connect to the directory")
    }

    /// Signals shutdown and waits for `run` to return.
    pub async fn stop(mut self) -> Result<(), DirError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(DEADLINE, &mut self.handle)
            .await
            .expect("directory stops in time")
            .expect("directory task did not panic")
    }
}

/// Config for a test directory in `dir`.
pub fn config(dir: &Path) -> DirectoryConfig {
    DirectoryConfig {
        expiry_tick_ms: 50,
        ..DirectoryConfig::new(dir)
    }
}

/// Starts `gma_directory::run` on 127.0.0.1:0.
pub async fn start(config: DirectoryConfig) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(gma_directory::run(config, listener, async move {
        let _ = rx.await;
    }));
    Server {
        addr,
        stop: Some(tx),
        handle,
    }
}

/// Polls `pred` until it holds; fails naming `what` after [`DEADLINE`] ([`crate::wait_for`]).
pub async fn wait_until<F, Fut>(what: &str, mut pred: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    crate::wait_for(what, DEADLINE, || {
        let f = pred();
        async move {
            if f.await {
                Ok(())
            } else {
                Err("not yet")
            }
        }
    })
    .await
}

/// The next item of a stream, failing the test after [`DEADLINE`].
pub async fn next<T>(stream: &mut tonic::Streaming<T>) -> Result<Option<T>, tonic::Status> {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("stream item in time")
}

/// Reads watch events until SYNCED; returns the events before it and SYNCED's revision.
pub async fn until_synced(stream: &mut tonic::Streaming<pb::WatchEvent>) -> (Vec<pb::WatchEvent>, u64) {
    let mut events = Vec::new();
    loop {
        let ev = next(stream).await.expect("watch ok").expect("watch open");
        if ev.r#type() == pb::WatchEventType::Synced {
            return (events, ev.revision);
        }
        events.push(ev);
    }
}

pub fn schema(name: &str) -> pb::EventSchema {
    pb::EventSchema {
        name: name.into(),
        version: 1,
        fields: vec![dbl("value", "", "")],
        description: String::new(),
    }
}

pub fn producer(id: &str, address: &str, events: &[&str]) -> pb::Record {
    pb::Record {
        record: Some(Body::Producer(pb::ProducerRecord {
            id: id.into(),
            address: address.into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            services: vec!["query".into(), "subscribe".into()],
            ..Default::default()
        })),
    }
}

pub fn consumer(id: &str, accepts: &[&str]) -> pb::Record {
    pb::Record {
        record: Some(Body::Consumer(pb::ConsumerRecord {
            id: id.into(),
            address: "http://127.0.0.1:9100".into(),
            accepts: accepts.iter().map(|e| e.to_string()).collect(),
            manner: "archive".into(),
            ..Default::default()
        })),
    }
}

/// Registers a record with `schemas` and a TTL; panics on error.
pub async fn register(
    client: &mut DirectoryClient<Channel>,
    record: pb::Record,
    schemas: Vec<pb::EventSchema>,
    lease_ttl_ms: u64,
) -> pb::RegisterResponse {
    client
        .register(pb::RegisterRequest {
            record: Some(record),
            schemas,
            lease_ttl_ms,
        })
        .await
        .expect("register")
        .into_inner()
}

/// Ids of a search's entries, in order.
pub fn ids(resp: &pb::SearchResponse) -> Vec<String> {
    resp.entries
        .iter()
        .filter_map(|e| match e.record.as_ref()?.record.as_ref()? {
            Body::Producer(p) => Some(p.id.clone()),
            Body::Consumer(c) => Some(c.id.clone()),
        })
        .collect()
}

/// Searches for an exact id.
pub async fn search_id(client: &mut DirectoryClient<Channel>, id: &str) -> pb::SearchResponse {
    client
        .search(pb::SearchRequest {
            id: id.into(),
            ..Default::default()
        })
        .await
        .expect("search")
        .into_inner()
}

/// A small deterministic byte generator (xorshift) for garbage input.
pub fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
