//! Raft storage on sled: the log ([`LogStore`], openraft's `RaftLogStorage`) and the state
//! machine ([`StateMachineStore`], openraft's `RaftStateMachine`).
//!
//! Layout: one sled database, three trees. Values are serde_json (openraft's types carry serde
//! attributes that bincode-like formats mishandle).
//!
//! | tree            | key                          | value                                     |
//! |-----------------|------------------------------|-------------------------------------------|
//! | `raft_log`      | log index (u64 BE)           | `Entry<TypeConfig>`                       |
//! | `raft_meta`     | `format`                     | u64 BE: layout version                    |
//! |                 | `vote`                       | `Vote`                                    |
//! |                 | `committed`                  | `Option<LogId>`                           |
//! |                 | `last_purged`                | `LogId`                                   |
//! | `raft_snapshot` | `meta`                       | `SnapshotMeta`                            |
//! |                 | `data`                       | the snapshot bytes (see [`SnapshotBody`]) |
//!
//! To ensure correctness (openraft's storage contract):
//! - The log has no holes: `append` writes contiguous entries, `truncate(id)` removes
//!   `[id.index, +inf)` and `purge(id)` removes `[0, id.index]` in one batch each.
//! - Every write runs inside a `&mut self` method, so vote and log writes are serialized.
//! - `save_vote` and `append` return / report completion only after `flush_async`: durable as
//!   far as sled 0.34 promises. On Linux that flush is `sync_file_range`, not `fsync`, so it
//!   survives a process crash but after a power loss up to about the last 500 ms (sled's
//!   periodic `sync_all`) may be lost (../shared/notes/reliability.md §4.1). `truncate`
//!   flushes too.
//!   `purge` flushes the new `last_purged` before deleting entries, and `open` finishes a purge
//!   that a crash interrupted, so the log never starts with a gap after `last_purged`.
//!   `save_committed` is written but not flushed: losing it means re-applying less on
//!   restart, and a member restored as leader in its old term makes reads wait until its log
//!   is applied (`Shared::read_barrier`), since its stored commit index may trail what it
//!   acknowledged.
//! - The state machine lives in memory ([`SmShared`]) and is persisted only as snapshots: a
//!   snapshot (meta and data in one batch) is flushed before `build_snapshot` or
//!   `install_snapshot` returns, and `open` rebuilds the state from it. openraft then re-applies
//!   the committed entries after the snapshot from the log (it purges only what a snapshot
//!   covers).
//! - The stored snapshot never goes backwards: a built snapshot older than the stored one (an
//!   install overtook a concurrent build) is returned but not stored.

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gma_proto::v1 as pb;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageIOError,
    StoredMembership, Vote,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, Mutex, RwLock};

use super::types::{Ack, LogId, Node, NodeId, Reply, StorageError, TypeConfig};
use crate::error::DirError;
use crate::state::{proto_serde, Change, DirectoryState, Limits, Persisted, RecordFilter};

const TREE_LOG: &str = "raft_log";
const TREE_META: &str = "raft_meta";
const TREE_SNAPSHOT: &str = "raft_snapshot";

const KEY_FORMAT: &[u8] = b"format";
const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"last_purged";
const KEY_SNAP_META: &[u8] = b"meta";
const KEY_SNAP_DATA: &[u8] = b"data";

/// On-disk layout version of the raft trees; bump on incompatible change.
const FORMAT: u64 = 1;
/// Version of [`SnapshotBody`]; a node refuses a snapshot of another version.
const SNAPSHOT_FORMAT: u32 = 1;

/// How long `open` retries while another handle in this process still holds sled's file lock.
const LOCK_RETRY: Duration = Duration::from_secs(5);

/// Everything the state machine shares with the gRPC service on this node.
pub struct SmShared {
    pub state: RwLock<SmState>,
    /// Every record change applied on this node, in revision order (for Watch). Sent while
    /// the `state` write lock is held: a watcher that reads under the read lock and subscribes
    /// before releasing it never misses or repeats a change.
    pub changes: broadcast::Sender<Arc<pb::WatchEvent>>,
}

/// The in-memory state machine.
pub struct SmState {
    pub dir: DirectoryState,
    /// The last log entry applied to `dir` (or covered by the installed snapshot).
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership<NodeId, Node>,
}

/// The raft log and vote. Cloning shares the same trees (the clone is the log reader).
#[derive(Clone)]
pub struct LogStore {
    log: sled::Tree,
    meta: sled::Tree,
}

/// The state machine: [`SmShared`] in memory, snapshots in sled.
pub struct StateMachineStore {
    shared: Arc<SmShared>,
    snapshots: Arc<SnapshotStore>,
    limits: Limits,
}

/// Builds snapshots of the state machine; openraft runs it in its own task.
pub struct SnapshotBuilder {
    shared: Arc<SmShared>,
    snapshots: Arc<SnapshotStore>,
}

/// The stored current snapshot.
struct SnapshotStore {
    tree: sled::Tree,
    /// Serializes "compare with the stored snapshot, then replace it" between a build (in its
    /// own task) and an install.
    write: Mutex<()>,
    /// Last counter used in a snapshot id.
    counter: AtomicU64,
}

/// The snapshot data: the state machine at `last_applied`.
#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    format: u32,
    last_applied: Option<LogId>,
    last_membership: StoredMembership<NodeId, Node>,
    state: StateImage,
}

/// [`Persisted`] in serde form: protobuf messages as their encoding, history as WatchEvents.
#[derive(Serialize, Deserialize)]
struct StateImage {
    #[serde(with = "proto_serde::vec")]
    records: Vec<pb::RecordEntry>,
    #[serde(with = "proto_serde::vec")]
    schemas: Vec<pb::EventSchema>,
    /// (lease id, ttl_ms, expires_at_ms).
    leases: Vec<(u64, u64, u64)>,
    #[serde(with = "proto_serde::vec")]
    history: Vec<pb::WatchEvent>,
    revision: u64,
    next_lease_id: u64,
    compacted: u64,
}

impl StateImage {
    fn from_persisted(p: Persisted) -> StateImage {
        StateImage {
            records: p.records,
            schemas: p.schemas,
            leases: p.leases,
            history: p.history.iter().map(Change::to_pb).collect(),
            revision: p.revision,
            next_lease_id: p.next_lease_id,
            compacted: p.compacted,
        }
    }

    fn into_persisted(self) -> Result<Persisted, DirError> {
        let history = self
            .history
            .into_iter()
            .map(|ev| {
                let rev = ev.revision;
                Change::from_pb(ev).ok_or_else(|| {
                    DirError::Storage(format!("snapshot history event at revision {rev} has no record"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Persisted {
            records: self.records,
            schemas: self.schemas,
            leases: self.leases,
            history,
            revision: self.revision,
            next_lease_id: self.next_lease_id,
            compacted: self.compacted,
        })
    }
}

/// Opens (or creates) the raft storage in `dir` (one sled db; trees for the log, the
/// vote/committed/purged metadata and the snapshot) and rebuilds the in-memory state from the
/// latest stored snapshot. Blocking (disk I/O, snapshot decoding, and up to a few seconds of
/// waiting for sled's file lock): call it before serving or from `spawn_blocking`.
pub fn open(
    dir: &Path,
    limits: Limits,
    broadcast_capacity: usize,
) -> Result<(LogStore, StateMachineStore, Arc<SmShared>), DirError> {
    let db = open_db(dir)?;
    let log = db.open_tree(TREE_LOG)?;
    let meta = db.open_tree(TREE_META)?;
    let snap = db.open_tree(TREE_SNAPSHOT)?;

    match meta.get(KEY_FORMAT)? {
        Some(v) => {
            let format = be_u64(&v)?;
            if format != FORMAT {
                return Err(DirError::Storage(format!(
                    "the raft data in {} has format {format}, this build reads format {FORMAT}: use a matching gma version or a new data_dir",
                    dir.display()
                )));
            }
        }
        None => {
            meta.insert(KEY_FORMAT, &FORMAT.to_be_bytes())?;
            db.flush()?;
        }
    }

    // Finish a purge that a crash interrupted (last_purged is written and flushed first).
    if let Some(v) = meta.get(KEY_PURGED)? {
        let purged: LogId = decode(&v).map_err(|e| corrupt("last purged log id", e))?;
        let batch = range_removal(&log, ..=index_key(purged.index))?;
        log.apply_batch(batch)?;
    }

    let mut counter = 0;
    let state = match load_snapshot(&snap)? {
        Some((snap_meta, data)) => {
            counter = snap_meta
                .snapshot_id
                .rsplit('-')
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body: SnapshotBody = decode(&data).map_err(|e| corrupt("snapshot", e))?;
            let dir = restore(limits, body)?;
            tracing::info!(
                snapshot = %snap_meta.snapshot_id,
                revision = dir.revision(),
                "raft state machine restored from the stored snapshot"
            );
            SmState {
                dir,
                last_applied: snap_meta.last_log_id,
                last_membership: snap_meta.last_membership,
            }
        }
        None => SmState {
            dir: DirectoryState::new(limits),
            last_applied: None,
            last_membership: StoredMembership::default(),
        },
    };

    let shared = Arc::new(SmShared {
        state: RwLock::new(state),
        changes: broadcast::channel(broadcast_capacity.max(1)).0,
    });
    let snapshots = Arc::new(SnapshotStore {
        tree: snap,
        write: Mutex::new(()),
        counter: AtomicU64::new(counter),
    });
    let sm = StateMachineStore {
        shared: shared.clone(),
        snapshots,
        limits,
    };
    Ok((LogStore { log, meta }, sm, shared))
}

fn open_db(dir: &Path) -> Result<sled::Db, DirError> {
    let deadline = std::time::Instant::now() + LOCK_RETRY;
    loop {
        match sled::Config::new().path(dir).open() {
            Ok(db) => return Ok(db),
            // sled holds an exclusive file lock per open database; a previous handle in this
            // process may still be closing (a restart inside one process, as tests do).
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(DirError::Storage(format!("cannot open {}: {e}", dir.display()))),
        }
    }
}

fn restore(limits: Limits, body: SnapshotBody) -> Result<DirectoryState, DirError> {
    if body.format != SNAPSHOT_FORMAT {
        return Err(DirError::Storage(format!(
            "snapshot format {} is not {SNAPSHOT_FORMAT}: every member must run a matching gma version",
            body.format
        )));
    }
    DirectoryState::restore(limits, body.state.into_persisted()?)
}

/// The stored snapshot's meta and data.
type StoredSnapshot = (SnapshotMeta<NodeId, Node>, Vec<u8>);

fn load_snapshot(tree: &sled::Tree) -> Result<Option<StoredSnapshot>, DirError> {
    let (meta, data) = (tree.get(KEY_SNAP_META)?, tree.get(KEY_SNAP_DATA)?);
    match (meta, data) {
        (None, None) => Ok(None),
        (Some(meta), Some(data)) => {
            let meta = decode(&meta).map_err(|e| corrupt("snapshot meta", e))?;
            Ok(Some((meta, data.to_vec())))
        }
        _ => Err(DirError::Storage(
            "the stored snapshot has meta without data or data without meta".into(),
        )),
    }
}

fn corrupt(what: &str, e: serde_json::Error) -> DirError {
    DirError::Storage(format!("the stored raft {what} cannot be decoded: {e}"))
}

fn be_u64(b: &[u8]) -> Result<u64, DirError> {
    let arr: [u8; 8] = b
        .try_into()
        .map_err(|_| DirError::Storage(format!("expected an 8-byte number, found {} bytes", b.len())))?;
    Ok(u64::from_be_bytes(arr))
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(v)
}

fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(b)
}

/// A batch removing every key of `tree` in `range`.
fn range_removal<R: RangeBounds<[u8; 8]>>(tree: &sled::Tree, range: R) -> Result<sled::Batch, sled::Error> {
    let mut batch = sled::Batch::default();
    for item in tree.range(range) {
        let (k, _) = item?;
        batch.remove(k);
    }
    Ok(batch)
}

/// An inclusive index range, or `None` when `range` is empty.
fn index_bounds<RB: RangeBounds<u64>>(range: &RB) -> Option<(u64, u64)> {
    let lo = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let hi = match range.end_bound() {
        Bound::Included(e) => *e,
        Bound::Excluded(e) => e.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (lo <= hi).then_some((lo, hi))
}

// ---- error adapters ---------------------------------------------------------------------------

fn read_logs_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_logs(&e).into()
}

fn write_logs_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_logs(&e).into()
}

fn read_vote_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_vote(&e).into()
}

fn write_vote_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_vote(&e).into()
}

fn read_snapshot_err(
    meta: Option<&SnapshotMeta<NodeId, Node>>,
    e: impl std::error::Error + 'static,
) -> StorageError {
    StorageIOError::read_snapshot(meta.map(|m| m.signature()), &e).into()
}

fn write_snapshot_err(
    meta: Option<&SnapshotMeta<NodeId, Node>>,
    e: impl std::error::Error + 'static,
) -> StorageError {
    StorageIOError::write_snapshot(meta.map(|m| m.signature()), &e).into()
}

/// Only the log id of a stored entry (serde_json skips the payload).
#[derive(Deserialize)]
struct StoredLogId {
    log_id: LogId,
}

// ---- log ----------------------------------------------------------------------------------------

// openraft's StorageError is large; these helpers feed trait methods that return it anyway.
#[allow(clippy::result_large_err)]
impl LogStore {
    fn get_meta<T: DeserializeOwned>(
        &self,
        key: &[u8],
        err: fn(sled::Error) -> StorageError,
        derr: fn(serde_json::Error) -> StorageError,
    ) -> Result<Option<T>, StorageError> {
        match self.meta.get(key).map_err(err)? {
            Some(v) => decode(&v).map(Some).map_err(derr),
            None => Ok(None),
        }
    }

    fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        self.get_meta(KEY_PURGED, read_logs_err, read_logs_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let Some((lo, hi)) = index_bounds(&range) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for item in self.log.range(index_key(lo)..=index_key(hi)) {
            let (_, v) = item.map_err(read_logs_err)?;
            out.push(decode::<Entry<TypeConfig>>(&v).map_err(read_logs_err)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.last_purged()?;
        let last_log_id = match self.log.last().map_err(read_logs_err)? {
            Some((_, v)) => Some(decode::<StoredLogId>(&v).map_err(read_logs_err)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let v = encode(vote).map_err(write_vote_err)?;
        self.meta.insert(KEY_VOTE, v).map_err(write_vote_err)?;
        self.meta.flush_async().await.map_err(write_vote_err)?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.get_meta(KEY_VOTE, read_vote_err, read_vote_err)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let v = encode(&committed).map_err(write_logs_err)?;
        self.meta.insert(KEY_COMMITTED, v).map_err(write_logs_err)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .get_meta::<Option<LogId>>(KEY_COMMITTED, read_logs_err, read_logs_err)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let v = encode(&entry).map_err(write_logs_err)?;
            batch.insert(&index_key(entry.log_id.index), v);
        }
        self.log.apply_batch(batch).map_err(write_logs_err)?;
        match self.log.flush_async().await {
            Ok(_) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(write_logs_err(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let batch = range_removal(&self.log, index_key(log_id.index)..).map_err(write_logs_err)?;
        self.log.apply_batch(batch).map_err(write_logs_err)?;
        self.log.flush_async().await.map_err(write_logs_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // last_purged first and durable: a crash before the deletion leaves extra entries that
        // `open` removes, never a log whose first entry is beyond last_purged + 1.
        let v = encode(&log_id).map_err(write_logs_err)?;
        self.meta.insert(KEY_PURGED, v).map_err(write_logs_err)?;
        self.meta.flush_async().await.map_err(write_logs_err)?;
        let batch = range_removal(&self.log, ..=index_key(log_id.index)).map_err(write_logs_err)?;
        self.log.apply_batch(batch).map_err(write_logs_err)?;
        Ok(())
    }
}

// ---- state machine ------------------------------------------------------------------------------

#[allow(clippy::result_large_err)]
impl SnapshotStore {
    fn current(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let meta = self
            .tree
            .get(KEY_SNAP_META)
            .map_err(|e| read_snapshot_err(None, e))?;
        let data = self
            .tree
            .get(KEY_SNAP_DATA)
            .map_err(|e| read_snapshot_err(None, e))?;
        match (meta, data) {
            (None, None) => Ok(None),
            (Some(meta), Some(data)) => {
                let meta: SnapshotMeta<NodeId, Node> =
                    decode(&meta).map_err(|e| read_snapshot_err(None, e))?;
                Ok(Some(Snapshot {
                    meta,
                    snapshot: Box::new(Cursor::new(data.to_vec())),
                }))
            }
            _ => Err(read_snapshot_err(
                None,
                DirError::Storage("the stored snapshot has meta without data or data without meta".into()),
            )),
        }
    }

    fn stored_last_log_id(&self) -> Result<Option<LogId>, StorageError> {
        match self
            .tree
            .get(KEY_SNAP_META)
            .map_err(|e| read_snapshot_err(None, e))?
        {
            Some(v) => {
                let meta: SnapshotMeta<NodeId, Node> = decode(&v).map_err(|e| read_snapshot_err(None, e))?;
                Ok(meta.last_log_id)
            }
            None => Ok(None),
        }
    }

    /// Replaces the stored snapshot (meta and data in one batch) and flushes. With
    /// `only_if_newer`, keeps a stored snapshot that is newer than `meta`; returns whether it
    /// wrote. Callers hold `self.write`.
    async fn store(
        &self,
        meta: &SnapshotMeta<NodeId, Node>,
        data: &[u8],
        only_if_newer: bool,
    ) -> Result<bool, StorageError> {
        if only_if_newer {
            let stored = self.stored_last_log_id()?;
            if stored > meta.last_log_id {
                return Ok(false);
            }
        }
        let m = encode(meta).map_err(|e| write_snapshot_err(Some(meta), e))?;
        let mut batch = sled::Batch::default();
        batch.insert(KEY_SNAP_META, m);
        batch.insert(KEY_SNAP_DATA, data);
        self.tree
            .apply_batch(batch)
            .map_err(|e| write_snapshot_err(Some(meta), e))?;
        self.tree
            .flush_async()
            .await
            .map_err(|e| write_snapshot_err(Some(meta), e))?;
        Ok(true)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // A consistent view: copy under the read lock, serialize after releasing it.
        let (last_applied, last_membership, persisted) = {
            let st = self.shared.state.read().await;
            (st.last_applied, st.last_membership.clone(), st.dir.export())
        };
        let body = SnapshotBody {
            format: SNAPSHOT_FORMAT,
            last_applied,
            last_membership: last_membership.clone(),
            state: StateImage::from_persisted(persisted),
        };
        let counter = self.snapshots.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot_id = match last_applied {
            Some(id) => format!("{}-{}-{counter}", id.leader_id.term, id.index),
            None => format!("0-0-{counter}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership,
            snapshot_id,
        };
        let data = encode(&body).map_err(|e| write_snapshot_err(Some(&meta), e))?;
        {
            let _write = self.snapshots.write.lock().await;
            if !self.snapshots.store(&meta, &data, true).await? {
                tracing::info!(snapshot = %meta.snapshot_id, "a newer snapshot is stored; not replacing it");
            }
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, Node>), StorageError> {
        let st = self.shared.state.read().await;
        Ok((st.last_applied, st.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries = entries.into_iter();
        let mut replies = Vec::with_capacity(entries.size_hint().0);
        let mut guard = self.shared.state.write().await;
        let st = &mut *guard;
        for entry in entries {
            st.last_applied = Some(entry.log_id);
            let reply = match entry.payload {
                EntryPayload::Blank => Reply::default(),
                EntryPayload::Membership(m) => {
                    st.last_membership = StoredMembership::new(Some(entry.log_id), m);
                    Reply::default()
                }
                EntryPayload::Normal(cmd) => Reply(st.dir.apply(cmd).map(|a| {
                    for c in &a.changes {
                        // No receivers (no watchers) is fine.
                        let _ = self.shared.changes.send(Arc::new(c.to_pb()));
                    }
                    Ack {
                        lease_id: a.lease_id,
                        ttl_ms: a.ttl_ms,
                        revision: a.revision,
                    }
                })),
            };
            replies.push(reply);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let body: SnapshotBody = decode(&data).map_err(|e| read_snapshot_err(Some(meta), e))?;
        let dir = restore(self.limits, body).map_err(|e| read_snapshot_err(Some(meta), e))?;
        {
            let _write = self.snapshots.write.lock().await;
            self.snapshots.store(meta, &data, false).await?;
        }

        let mut guard = self.shared.state.write().await;
        let st = &mut *guard;
        let before = st.dir.revision();
        st.dir = dir;
        st.last_applied = meta.last_log_id;
        st.last_membership = meta.last_membership.clone();
        // Keep watchers on this node gap-free: replay the changes the snapshot brought. If the
        // snapshot's history does not reach back to `before + 1`, a watcher sees a jump, reads
        // the history itself and gets OUT_OF_RANGE (re-list), as a lagging watcher would.
        let from = before.max(st.dir.compacted()) + 1;
        if let Ok(events) = st.dir.changes_since(from, &RecordFilter::default()) {
            for ev in events {
                let _ = self.shared.changes.send(Arc::new(ev));
            }
        }
        tracing::info!(
            snapshot = %meta.snapshot_id,
            revision_before = before,
            revision = st.dir.revision(),
            "installed a raft snapshot"
        );
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        self.snapshots.current()
    }
}
