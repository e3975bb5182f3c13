//! The tonic `Directory` service over the state machine and the store.
//!
//! Concurrency: one `tokio::sync::RwLock` guards the state and the store. A write holds it
//! (exclusively) from `apply` through `persist` (batch + flush) to the broadcast of its
//! changes, so apply order = disk order = revision order = broadcast order, and no read ever
//! sees a change that is not yet on disk. Reads (Search, GetSchema, a new Watch's snapshot)
//! share the lock.
//!
//! Watch: a new watcher reads its snapshot (or history) and subscribes to the change
//! broadcast under the same read lock, so nothing is missed or repeated between the two. A
//! watcher that lags the broadcast re-reads the missed revisions from the history, so its
//! stream stays ordered, unique and gap-free (etcd's guarantees); if they were compacted it
//! ends with OUT_OF_RANGE. Each watcher feeds its client through a small bounded channel.

use std::sync::Arc;
use std::time::Instant;

use gma_core::time::now_ms;
use gma_proto::v1::{self as pb, directory_server::Directory};
use tokio::sync::{broadcast, mpsc, watch, RwLock};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::DirError;
use crate::server::DirectoryConfig;
use crate::state::{Applied, Command, DirectoryState, Kind, RecordFilter, SearchQuery};
use crate::store::Store;

/// Changes buffered for watchers before a slow one lags (and catches up from history).
pub(crate) const BROADCAST_CAPACITY: usize = 1024;
/// Events queued per watch stream.
const WATCH_BUFFER: usize = 64;
/// Responses queued per KeepAlive stream.
const KEEPALIVE_BUFFER: usize = 16;

/// Milliseconds since the Unix epoch that never go backwards: wall time at start plus a
/// monotonic elapsed time. A wall-clock step does not expire or extend leases.
pub(crate) struct Clock {
    wall_ms: u64,
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            wall_ms: now_ms(),
            start: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.wall_ms
            .saturating_add(self.start.elapsed().as_millis() as u64)
    }
}

struct Inner {
    state: DirectoryState,
    /// `None` once the directory has shut down.
    store: Option<Store>,
    /// Set when a write could not be persisted: the in-memory state is ahead of the disk, so
    /// no further write is accepted.
    failed: Option<String>,
}

/// What every handler and background task shares.
pub(crate) struct Shared {
    inner: RwLock<Inner>,
    changes: broadcast::Sender<Arc<pb::WatchEvent>>,
    config: DirectoryConfig,
    clock: Clock,
    stop: watch::Sender<bool>,
    advertised: String,
}

impl Shared {
    pub fn new(
        config: DirectoryConfig,
        state: DirectoryState,
        store: Store,
        advertised: String,
        broadcast_capacity: usize,
    ) -> Shared {
        Shared {
            inner: RwLock::new(Inner {
                state,
                store: Some(store),
                failed: None,
            }),
            changes: broadcast::channel(broadcast_capacity).0,
            config,
            clock: Clock::new(),
            stop: watch::channel(false).0,
            advertised,
        }
    }

    /// Applies a command built with the current time, persists it, then publishes its changes.
    /// The time is read under the write lock, so commands carry non-decreasing times.
    pub async fn write(&self, make: impl FnOnce(u64) -> Command) -> Result<Applied, DirError> {
        let mut guard = self.inner.write().await;
        let inner = &mut *guard;
        if let Some(why) = &inner.failed {
            return Err(DirError::Unavailable(format!(
                "directory storage failed earlier ({why}): restart the directory"
            )));
        }
        let Some(store) = inner.store.as_ref() else {
            return Err(DirError::Unavailable(
                "the directory is shutting down: retry once it is back".into(),
            ));
        };
        let applied = inner.state.apply(make(self.clock.now_ms()))?;
        if let Err(e) = store.persist(&inner.state, &applied).await {
            tracing::error!(error = %e, "cannot persist a directory change; refusing further writes");
            inner.failed = Some(e.to_string());
            return Err(e);
        }
        for c in &applied.changes {
            // No receivers is fine: nobody is watching.
            let _ = self.changes.send(Arc::new(c.to_pb()));
        }
        Ok(applied)
    }

    /// Applies `Expire` if a lease is due. Returns how many records it removed.
    pub async fn expire_due(&self) -> Result<usize, DirError> {
        let now = self.clock.now_ms();
        let due = self
            .inner
            .read()
            .await
            .state
            .next_expiry()
            .is_some_and(|at| at <= now);
        if !due {
            return Ok(0);
        }
        let applied = self.write(|now_ms| Command::Expire { now_ms }).await?;
        Ok(applied.changes.len())
    }

    /// Asks every stream task and the expiry ticker to end.
    pub fn begin_shutdown(&self) {
        self.stop.send_replace(true);
    }

    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Waits for in-flight writes, then flushes and closes the store. Later writes answer
    /// UNAVAILABLE.
    pub async fn close(&self) -> Result<(), DirError> {
        let store = self.inner.write().await.store.take();
        match store {
            Some(s) => s.close().await,
            None => Ok(()),
        }
    }

    fn resolve_ttl(&self, requested: u64) -> Result<u64, DirError> {
        let c = &self.config;
        if requested == 0 {
            return Ok(c.default_ttl_ms);
        }
        if requested < c.min_ttl_ms || requested > c.max_ttl_ms {
            return Err(DirError::invalid(format!(
                "lease_ttl_ms {requested} is outside [{}, {}]: pick a value in range, or 0 for the default ({} ms)",
                c.min_ttl_ms, c.max_ttl_ms, c.default_ttl_ms
            )));
        }
        Ok(requested)
    }
}

/// The gRPC service.
#[derive(Clone)]
pub(crate) struct DirectoryService {
    shared: Arc<Shared>,
}

impl DirectoryService {
    pub fn new(shared: Arc<Shared>) -> DirectoryService {
        DirectoryService { shared }
    }
}

#[tonic::async_trait]
impl Directory for DirectoryService {
    #[tracing::instrument(skip_all)]
    async fn register(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let req = req.into_inner();
        let ttl_ms = self.shared.resolve_ttl(req.lease_ttl_ms)?;
        let record = req.record.unwrap_or_default();
        let schemas = req.schemas;
        let a = self
            .shared
            .write(|now_ms| Command::Register {
                record,
                schemas,
                lease_id: 0,
                ttl_ms,
                now_ms,
            })
            .await?;
        tracing::debug!(lease = a.lease_id, revision = a.revision, "registered");
        Ok(Response::new(pb::RegisterResponse {
            lease_id: a.lease_id,
            lease_ttl_ms: a.ttl_ms,
            revision: a.revision,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn update(&self, req: Request<pb::UpdateRequest>) -> Result<Response<pb::UpdateResponse>, Status> {
        let req = req.into_inner();
        // 0 keeps the record's lease; anything else is a new lease, checked like Register's.
        let ttl_ms = match req.lease_ttl_ms {
            0 => 0,
            n => self.shared.resolve_ttl(n)?,
        };
        let record = req.record.unwrap_or_default();
        let schemas = req.schemas;
        let a = self
            .shared
            .write(|now_ms| Command::Update {
                record,
                schemas,
                ttl_ms,
                now_ms,
            })
            .await?;
        Ok(Response::new(pb::UpdateResponse {
            lease_id: a.lease_id,
            lease_ttl_ms: a.ttl_ms,
            revision: a.revision,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn remove(&self, req: Request<pb::RemoveRequest>) -> Result<Response<pb::RemoveResponse>, Status> {
        let req = req.into_inner();
        let Some(kind) = Kind::from_pb(req.kind)? else {
            return Err(
                DirError::invalid("kind is required: RECORD_KIND_PRODUCER or RECORD_KIND_CONSUMER").into(),
            );
        };
        let id = req.id;
        let a = self.shared.write(|_| Command::Remove { kind, id }).await?;
        Ok(Response::new(pb::RemoveResponse { revision: a.revision }))
    }

    type KeepAliveStream = ReceiverStream<Result<pb::KeepAliveResponse, Status>>;

    #[tracing::instrument(skip_all)]
    async fn keep_alive(
        &self,
        req: Request<Streaming<pb::KeepAliveRequest>>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(KEEPALIVE_BUFFER);
        let shared = self.shared.clone();
        let mut stop = shared.stop_signal();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    m = inbound.message() => m,
                };
                let lease_id = match msg {
                    Ok(Some(r)) => r.lease_id,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%status, "keepalive stream ended");
                        break;
                    }
                };
                let reply = match shared
                    .write(|now_ms| Command::KeepAlive { lease_id, now_ms })
                    .await
                {
                    Ok(a) => Ok(pb::KeepAliveResponse {
                        lease_id,
                        ttl_ms: a.ttl_ms,
                    }),
                    Err(e) => Err(Status::from(e)),
                };
                let fatal = reply.is_err();
                if tx.send(reply).await.is_err() || fatal {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    #[tracing::instrument(skip_all)]
    async fn search(&self, req: Request<pb::SearchRequest>) -> Result<Response<pb::SearchResponse>, Status> {
        let q = SearchQuery::from_pb(req.get_ref())?;
        let inner = self.shared.inner.read().await;
        Ok(Response::new(inner.state.search(&q)))
    }

    #[tracing::instrument(skip_all)]
    async fn get_schema(
        &self,
        req: Request<pb::GetSchemaRequest>,
    ) -> Result<Response<pb::GetSchemaResponse>, Status> {
        let req = req.into_inner();
        let schema = self
            .shared
            .inner
            .read()
            .await
            .state
            .get_schema(&req.name, req.version)?;
        Ok(Response::new(pb::GetSchemaResponse { schema: Some(schema) }))
    }

    type WatchStream = ReceiverStream<Result<pb::WatchEvent, Status>>;

    #[tracing::instrument(skip_all)]
    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let req = req.into_inner();
        let filter = RecordFilter::new(req.kind, &req.event_pattern)?;
        let from = req.from_revision;
        let (initial, current, changes) = {
            let inner = self.shared.inner.read().await;
            // Subscribing under the read lock: every change after `current` reaches `changes`.
            let changes = self.shared.changes.subscribe();
            let initial = if from == 0 {
                inner.state.snapshot(&filter)
            } else {
                inner.state.changes_since(from, &filter)?
            };
            (initial, inner.state.revision(), changes)
        };
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let watcher = Watcher {
            shared: self.shared.clone(),
            filter,
            min: from,
            cursor: current + 1,
            tx,
            stop: self.shared.stop_signal(),
        };
        tokio::spawn(watcher.run(initial, current, changes));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn version(
        &self,
        _req: Request<pb::VersionRequest>,
    ) -> Result<Response<pb::VersionResponse>, Status> {
        Ok(Response::new(pb::VersionResponse {
            interface: gma_proto::INTERFACE_VERSION.to_string(),
            server: gma_core::SERVER_VERSION.to_string(),
            role: "directory".to_string(),
        }))
    }

    async fn cluster_status(
        &self,
        _req: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let inner = self.shared.inner.read().await;
        let counts = inner.state.counts();
        Ok(Response::new(pb::ClusterStatusResponse {
            members: vec![pb::ClusterMember {
                id: 1,
                address: self.shared.advertised.clone(),
                leader: true,
            }],
            leader_id: 1,
            revision: inner.state.revision(),
            producers: counts.producers,
            consumers: counts.consumers,
            schemas: counts.schemas,
            leases: counts.leases,
        }))
    }
}

/// One Watch stream's task.
struct Watcher {
    shared: Arc<Shared>,
    filter: RecordFilter,
    /// Changes below this revision are not delivered (the request's from_revision).
    min: u64,
    /// The next revision this watcher has to account for.
    cursor: u64,
    tx: mpsc::Sender<Result<pb::WatchEvent, Status>>,
    stop: watch::Receiver<bool>,
}

impl Watcher {
    async fn run(
        mut self,
        initial: Vec<pb::WatchEvent>,
        synced_at: u64,
        mut changes: broadcast::Receiver<Arc<pb::WatchEvent>>,
    ) {
        for ev in initial {
            if !self.send(Ok(ev)).await {
                return;
            }
        }
        let synced = pb::WatchEvent {
            r#type: pb::WatchEventType::Synced as i32,
            revision: synced_at,
            entry: None,
            reason: String::new(),
        };
        if !self.send(Ok(synced)).await {
            return;
        }
        loop {
            let msg = tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return,
                _ = self.tx.closed() => return,
                m = changes.recv() => m,
            };
            match msg {
                Ok(ev) => {
                    if ev.revision > self.cursor && !self.catch_up().await {
                        return;
                    }
                    if ev.revision < self.cursor {
                        continue;
                    }
                    self.cursor = ev.revision + 1;
                    if ev.revision >= self.min
                        && ev.entry.as_ref().is_some_and(|e| self.filter.matches(e))
                        && !self.send(Ok((*ev).clone())).await
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::debug!(skipped, cursor = self.cursor, "watcher lagged; reading history");
                    if !self.catch_up().await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Delivers every change from `cursor` to the current revision from the history.
    async fn catch_up(&mut self) -> bool {
        let (events, current) = {
            let inner = self.shared.inner.read().await;
            (
                inner.state.changes_since(self.cursor, &self.filter),
                inner.state.revision(),
            )
        };
        match events {
            Ok(events) => {
                for ev in events {
                    if ev.revision >= self.min && !self.send(Ok(ev)).await {
                        return false;
                    }
                }
                self.cursor = current + 1;
                true
            }
            Err(e) => {
                let e = match e {
                    DirError::OutOfRange(m) => DirError::OutOfRange(format!("watch fell behind: {m}")),
                    other => other,
                };
                self.send(Err(e.into())).await;
                false
            }
        }
    }

    /// False when the client left or the directory is stopping.
    async fn send(&mut self, item: Result<pb::WatchEvent, Status>) -> bool {
        tokio::select! {
            r = self.tx.send(item) => r.is_ok(),
            _ = self.stop.wait_for(|s| *s) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Limits;
    use gma_core::event::dbl;
    use gma_proto::v1::record::Record as Body;
    use tokio_stream::StreamExt;

    async fn shared(dir: &std::path::Path, history_limit: usize, capacity: usize) -> Arc<Shared> {
        let config = DirectoryConfig {
            history_limit,
            ..DirectoryConfig::new(dir)
        };
        let limits = Limits {
            max_records: config.max_records,
            history_limit,
        };
        let (store, state) = Store::open(dir, limits).await.unwrap();
        Arc::new(Shared::new(
            config,
            state,
            store,
            "http://127.0.0.1:1".into(),
            capacity,
        ))
    }

    async fn register(shared: &Shared, i: usize) {
        let record = pb::Record {
            record: Some(Body::Producer(pb::ProducerRecord {
                id: format!("p{i}"),
                address: "http://127.0.0.1:7001".into(),
                events: vec!["host.cpu".into()],
                ..Default::default()
            })),
        };
        let schemas = vec![pb::EventSchema {
            name: "host.cpu".into(),
            version: 1,
            fields: vec![dbl("load", "", "")],
            description: String::new(),
        }];
        shared
            .write(|now_ms| Command::Register {
                record,
                schemas,
                lease_id: 0,
                ttl_ms: 60_000,
                now_ms,
            })
            .await
            .unwrap();
    }

    async fn watch(
        shared: &Arc<Shared>,
        from_revision: u64,
    ) -> ReceiverStream<Result<pb::WatchEvent, Status>> {
        let svc = DirectoryService::new(shared.clone());
        let req = pb::WatchRequest {
            from_revision,
            ..Default::default()
        };
        svc.watch(Request::new(req)).await.unwrap().into_inner()
    }

    #[tokio::test]
    async fn a_lagging_watcher_catches_up_from_history_without_gaps_or_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path(), 10_000, 4).await;
        let mut stream = watch(&shared, 0).await;
        let synced = stream.next().await.unwrap().unwrap();
        assert_eq!(synced.r#type(), pb::WatchEventType::Synced);
        // Nobody reads the stream: the watcher's queue fills and the broadcast (4) lags.
        let n = 3 * WATCH_BUFFER;
        for i in 0..n {
            register(&shared, i).await;
        }
        let mut revisions = Vec::new();
        while revisions.len() < n {
            let ev = stream.next().await.unwrap().unwrap();
            assert_eq!(ev.r#type(), pb::WatchEventType::Put);
            revisions.push(ev.revision);
        }
        assert_eq!(revisions, (1..=n as u64).collect::<Vec<_>>());
        // And it is live again afterwards.
        register(&shared, n).await;
        assert_eq!(stream.next().await.unwrap().unwrap().revision, n as u64 + 1);
        shared.begin_shutdown();
        assert!(stream.next().await.is_none(), "shutdown ends the stream");
        shared.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_watcher_lagging_past_the_history_gets_out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path(), 8, 4).await;
        let mut stream = watch(&shared, 0).await;
        stream.next().await.unwrap().unwrap();
        let n = 2 * WATCH_BUFFER;
        for i in 0..n {
            register(&shared, i).await;
        }
        let mut last = 0;
        let status = loop {
            match stream.next().await.unwrap() {
                Ok(ev) => {
                    assert_eq!(ev.revision, last + 1, "in order, no gaps");
                    last = ev.revision;
                }
                Err(status) => break status,
            }
        };
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert!(
            status.message().starts_with("watch fell behind: revision"),
            "{}",
            status.message()
        );
        assert!(stream.next().await.is_none());
        shared.close().await.unwrap();
        // Writes after close are refused, reads still work.
        let e = shared
            .write(|now_ms| Command::Expire { now_ms })
            .await
            .unwrap_err();
        assert!(matches!(e, DirError::Unavailable(_)), "{e:?}");
    }
}
