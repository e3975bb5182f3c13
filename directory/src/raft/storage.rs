//! Raft storage: the log ([`LogStore`], openraft's `RaftLogStorage`) on a
//! [`gma_durable::Log`], and the state machine ([`StateMachineStore`], openraft's
//! `RaftStateMachine`) in memory with its snapshot in a file.
//!
//! Layout of `DIR` (`data_dir/raft`):
//!
//! | path              | what                                                                   |
//! |-------------------|------------------------------------------------------------------------|
//! | `LOCK`            | held while a process has the storage open                              |
//! | `log/*.log`       | the raft log: entries, votes, committed, truncations, purges ([`codec`]) |
//! | `snapshot`        | the current snapshot: header, meta (JSON), data ([`SnapshotBody`]), CRC |
//!
//! To ensure correctness (openraft's storage contract):
//! - Every write (entry, vote, committed, truncate, purge) is one record appended to one log in
//!   call order, so vote and log writes are serialized and a durable record implies every
//!   record before it is durable.
//! - `append` makes the entries readable at once (in memory) and calls `log_io_completed` only
//!   after an fdatasync covering them returned; `save_vote`, `truncate` and `purge` return only
//!   after theirs returned. Concurrent work shares fdatasyncs (group commit in the log's
//!   writer), and nothing acknowledged ever depends on sled or on the page cache.
//! - `save_committed` is appended without waiting: losing it means re-applying less on
//!   restart, and a member restored as leader in its old term makes reads wait until its log
//!   is applied (`Shared::read_barrier`), since its stored commit index may trail what it
//!   acknowledged.
//! - The log has no holes: `open` replays the records (a truncation removes `[i, +inf)`, a
//!   purge `[0, i]`) and refuses a log whose entries are not contiguous after the last purge.
//! - Segments: when the current segment passes `segment_bytes` the next write starts a new one,
//!   which opens with a `state` record (vote, committed, last purged). After a purge is durable,
//!   the oldest segments whose entries are all purged are deleted (the folder fsynced): what
//!   they held of the vote and purge state is in the `state` record of a later segment.
//! - The state machine lives in memory ([`SmShared`]) and is persisted only as snapshots: a
//!   snapshot is written to `snapshot.tmp`, fdatasynced, renamed over `snapshot` and the folder
//!   fsynced before `build_snapshot` or `install_snapshot` returns; `open` rebuilds the state
//!   from it, and openraft then re-applies the committed entries after it from the log (it
//!   purges only what a snapshot covers).
//! - The stored snapshot never goes backwards: a built snapshot older than the stored one (an
//!   install overtook a concurrent build) is returned but not stored.
//!
//! Memory: the log's entries stay in memory ([`Mem`]) from their append until a purge after the
//! next snapshot (`snapshot_logs`, `snapshot_log_bytes` and `snapshot_keep_logs` bound them;
//! [`LogStore::appended_bytes`] lets the server trigger a snapshot by bytes). The snapshot's
//! data is not kept: only its meta is; [`RaftStateMachine::get_current_snapshot`] (a lagging
//! follower's catch-up) reads the file again.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gma_durable::{Fs, Log, LogOptions, OsFs};
use gma_proto::v1 as pb;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageIOError,
    StoredMembership, Vote,
};
use parking_lot::RwLock as SyncRwLock;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, Mutex, RwLock};

use super::codec::LogRecord;
use super::types::{Ack, LogId, Node, NodeId, Reply, StorageError, TypeConfig};
use crate::error::DirError;
use crate::state::{proto_serde, Change, Command, DirectoryState, Limits, Persisted, RecordFilter};

/// Version of [`SnapshotBody`]; a node refuses a snapshot of another version.
const SNAPSHOT_FORMAT: u32 = 1;
/// First bytes of the snapshot file (its layout version in the last byte).
const SNAPSHOT_MAGIC: &[u8; 8] = b"GMASNAP1";
/// How long `open` waits for the folder's lock held by a handle this process is dropping.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Extension of the raft log's segment files.
const LOG_EXT: &str = "log";

/// Tuning of the raft storage (tests shrink segments and use the storage-fault simulator).
#[derive(Debug, Clone)]
pub struct StorageOptions {
    /// A segment of the log is closed once it holds this many bytes.
    pub segment_bytes: u64,
    /// The log's options (its test-only knobs included).
    pub log: LogOptions,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            segment_bytes: 4 << 20,
            log: LogOptions::new(LOG_EXT),
        }
    }
}

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

/// The state machine: [`SmShared`] in memory, snapshots in a file.
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

/// The raft log and vote. Cloning shares the same log (the clone is the log reader).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<LogInner>,
}

struct LogInner {
    log: Log,
    mem: SyncRwLock<Mem>,
    /// Bytes of entry records appended since `open` (as encoded in the log), never decreasing.
    appended: AtomicU64,
    segment_bytes: u64,
    /// Held while the storage is open.
    _lock: Box<dyn Send + Sync + Debug>,
}

/// What the log holds, in memory (readable at once; durable as the log says).
#[derive(Default)]
struct Mem {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    /// Per segment (its first record seq): the highest entry index it holds (0 = none).
    seg_max: BTreeMap<u64, u64>,
}

impl Mem {
    /// Applies one record (replay and live writes alike).
    fn apply(&mut self, rec: LogRecord, segment: u64) {
        match rec {
            LogRecord::Entry(e) => {
                let m = self.seg_max.entry(segment).or_default();
                *m = (*m).max(e.log_id.index);
                self.entries.insert(e.log_id.index, e);
            }
            LogRecord::Vote(v) => self.vote = Some(v),
            LogRecord::Committed(c) => self.committed = c,
            LogRecord::Truncate(i) => {
                self.entries.split_off(&i);
            }
            LogRecord::Purge(id) => self.purge(id),
            LogRecord::State {
                vote,
                committed,
                purged,
            } => {
                self.vote = vote;
                self.committed = committed;
                if let Some(p) = purged {
                    self.purge(p);
                }
            }
        }
        self.seg_max.entry(segment).or_default();
    }

    fn purge(&mut self, id: LogId) {
        if self.purged.is_none_or(|p| p < id) {
            self.purged = Some(id);
        }
        self.entries = self.entries.split_off(&(id.index + 1));
    }

    fn state_record(&self) -> LogRecord {
        LogRecord::State {
            vote: self.vote,
            committed: self.committed,
            purged: self.purged,
        }
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(self.purged)
    }
}

/// A snapshot's meta and data as read from its file.
type StoredSnapshot = (SnapshotMeta<NodeId, Node>, Vec<u8>);

/// The snapshot on disk and its meta.
struct SnapshotStore {
    fs: Arc<dyn Fs>,
    path: PathBuf,
    /// The meta of the stored snapshot. Its data stays on disk (as large as the whole state):
    /// `get_current_snapshot` reads the file.
    current: SyncRwLock<Option<SnapshotMeta<NodeId, Node>>>,
    /// Serializes "compare with the stored snapshot, then replace it" between a build (in its
    /// own task) and an install.
    write: Mutex<()>,
    /// Last counter used in a snapshot id.
    counter: AtomicU64,
}

/// Opens (or creates) the raft storage in `dir` on the real file system. See [`open_on`].
pub fn open(
    dir: &Path,
    limits: Limits,
    broadcast_capacity: usize,
) -> Result<(LogStore, StateMachineStore, Arc<SmShared>), DirError> {
    open_on(
        OsFs::new(),
        dir,
        limits,
        broadcast_capacity,
        StorageOptions::default(),
    )
}

/// Opens (or creates) the raft storage in `dir` on `fs`: takes the folder's lock, replays the
/// log (repairing a torn tail), and rebuilds the in-memory state from the stored snapshot.
/// Blocking (disk I/O and snapshot decoding): call it before serving or from `spawn_blocking`.
pub fn open_on(
    fs: Arc<dyn Fs>,
    dir: &Path,
    limits: Limits,
    broadcast_capacity: usize,
    opts: StorageOptions,
) -> Result<(LogStore, StateMachineStore, Arc<SmShared>), DirError> {
    let st =
        |what: &str, e: &dyn std::fmt::Display| DirError::Storage(format!("{what} {}: {e}", dir.display()));
    fs.create_dir_all(dir).map_err(|e| st("cannot create", &e))?;
    refuse_sled_layout(&*fs, dir)?;
    // A member restarted inside one process (as tests do) may still be dropping the previous
    // handle: retry the lock for a few seconds before refusing.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let lock = loop {
        match fs.lock(dir) {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(st("cannot lock", &e)),
        }
    };

    let (log, recovered) = Log::open(fs.clone(), &dir.join("log"), opts.log.clone())
        .map_err(|e| st("cannot open the raft log in", &e))?;
    let mut mem = Mem::default();
    for r in recovered.records {
        let rec = LogRecord::decode(&r.payload).map_err(|e| {
            DirError::Storage(format!(
                "raft log record {} in {} cannot be decoded: {e}",
                r.pos.seq,
                dir.display()
            ))
        })?;
        mem.apply(rec, r.pos.segment);
    }
    // No holes: the entries follow the last purged one without a gap.
    let mut expect = mem.purged.map(|p| p.index + 1);
    for &i in mem.entries.keys() {
        if expect.is_some_and(|x| x != i) {
            return Err(DirError::Storage(format!(
                "the raft log in {} has a hole before entry {i}: the disk lost synced data; move the folder aside and re-add this member with a new id",
                dir.display()
            )));
        }
        expect = Some(i + 1);
    }
    // Every segment this process writes opens with a state record, the only thing that lets
    // older segments go: continue in a new segment (or in the empty tail segment a crash left
    // right after its creation, whose state record was lost).
    log.rotate()
        .and_then(|_| log.append(&mem.state_record().encode()))
        .map(|p| mem.seg_max.entry(p.segment).or_default())
        .map_err(|e| st("cannot write the raft log in", &e))?;

    let snapshots = SnapshotStore {
        fs: fs.clone(),
        path: dir.join("snapshot"),
        current: SyncRwLock::new(None),
        write: Mutex::new(()),
        counter: AtomicU64::new(0),
    };
    let mut counter = 0;
    let state = match snapshots.load()? {
        Some((snap_meta, data)) => {
            counter = snap_meta
                .snapshot_id
                .rsplit('-')
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body: SnapshotBody = serde_json::from_slice(&data).map_err(|e| corrupt("snapshot", e))?;
            let dir = restore(limits, body)?;
            tracing::info!(
                snapshot = %snap_meta.snapshot_id,
                revision = dir.revision(),
                "raft state machine restored from the stored snapshot"
            );
            let st = SmState {
                dir,
                last_applied: snap_meta.last_log_id,
                last_membership: snap_meta.last_membership.clone(),
            };
            *snapshots.current.write() = Some(snap_meta);
            st
        }
        None => SmState {
            dir: DirectoryState::new(limits),
            last_applied: None,
            last_membership: StoredMembership::default(),
        },
    };
    snapshots.counter.store(counter, Ordering::Relaxed);

    let shared = Arc::new(SmShared {
        state: RwLock::new(state),
        changes: broadcast::channel(broadcast_capacity.max(1)).0,
    });
    let sm = StateMachineStore {
        shared: shared.clone(),
        snapshots: Arc::new(snapshots),
        limits,
    };
    let store = LogStore {
        inner: Arc::new(LogInner {
            log,
            mem: SyncRwLock::new(mem),
            appended: AtomicU64::new(0),
            segment_bytes: opts.segment_bytes.max(1),
            _lock: lock,
        }),
    };
    Ok((store, sm, shared))
}

/// Refuses the sled layout of earlier builds (whose flush was not an fsync) with what to do.
fn refuse_sled_layout(fs: &dyn Fs, dir: &Path) -> Result<(), DirError> {
    let sled_files = ["db", "conf"];
    for f in sled_files {
        if fs.len(&dir.join(f)).ok().flatten().is_some() {
            return Err(DirError::Storage(format!(
                "{} holds raft data in the sled layout of an earlier gma build, which this build does not read \
                 (the raft log is now kept in fsynced segment files): stop this member, move {} aside and start it \
                 again — a single-node directory starts empty and producers and consumers register again within \
                 their lease TTL; a cluster member must be re-added with a new id (docs/directory.md, Durability)",
                dir.display(),
                dir.display()
            )));
        }
    }
    Ok(())
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

fn corrupt(what: &str, e: serde_json::Error) -> DirError {
    DirError::Storage(format!("the stored raft {what} cannot be decoded: {e}"))
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

fn write_logs_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_logs(&e).into()
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

// ---- log ----------------------------------------------------------------------------------------

#[allow(clippy::result_large_err)]
impl LogStore {
    /// Appends records (applied to the in-memory log at once, in order); returns the seq of the
    /// last. Starts a new segment, opened by a state record, when the current one is full.
    fn write(&self, recs: Vec<LogRecord>) -> Result<u64, gma_durable::LogError> {
        let inner = &self.inner;
        let mut mem = inner.mem.write();
        if inner.log.tail_len() >= inner.segment_bytes {
            inner.log.rotate()?;
            let p = inner.log.append(&mem.state_record().encode())?;
            mem.seg_max.entry(p.segment).or_default();
        }
        let mut last = 0;
        for r in recs {
            let bytes = r.encode();
            let p = inner.log.append(&bytes)?;
            if matches!(r, LogRecord::Entry(_)) {
                inner.appended.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            mem.apply(r, p.segment);
            last = p.seq;
        }
        Ok(last)
    }

    /// Bytes of entries appended since the storage was opened (as written to the log); the
    /// server compares it across snapshots to trigger one by size (`snapshot_log_bytes`).
    pub fn appended_bytes(&self) -> u64 {
        self.inner.appended.load(Ordering::Relaxed)
    }

    /// Entries held in memory (appended and not yet purged).
    pub fn entries_in_memory(&self) -> usize {
        self.mem().entries.len()
    }

    /// Waits until everything written so far (a `save_committed` included) is durable.
    pub async fn sync(&self) -> Result<(), DirError> {
        self.inner
            .log
            .sync_all()
            .await
            .map_err(|e| DirError::Storage(format!("raft log: {e}")))
    }

    /// The in-memory log a reader sees.
    fn mem(&self) -> parking_lot::RwLockReadGuard<'_, Mem> {
        self.inner.mem.read()
    }

    /// Deletes the oldest segments whose entries are all purged (after the purge is durable).
    async fn drop_purged_segments(&self) -> Result<(), gma_durable::LogError> {
        let keep_from = {
            let mem = self.mem();
            let purged = mem.purged.map_or(0, |p| p.index);
            // The first segment that still holds an unpurged entry, or the newest one.
            let segs: Vec<(u64, u64)> = mem.seg_max.iter().map(|(s, m)| (*s, *m)).collect();
            let Some(&(last, _)) = segs.last() else {
                return Ok(());
            };
            segs.iter().find(|(_, m)| *m > purged).map_or(last, |(s, _)| *s)
        };
        let gone = self.inner.log.remove_before(keep_from).await?;
        if !gone.is_empty() {
            let mut mem = self.inner.mem.write();
            for g in &gone {
                mem.seg_max.remove(g);
            }
            tracing::debug!(segments = gone.len(), "purged raft log segments removed");
        }
        Ok(())
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
        Ok(self
            .mem()
            .entries
            .range(lo..=hi)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let mem = self.mem();
        Ok(LogState {
            last_purged_log_id: mem.purged,
            last_log_id: mem.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let seq = self.write(vec![LogRecord::Vote(*vote)]).map_err(write_vote_err)?;
        self.inner.log.sync(seq).await.map_err(write_vote_err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.mem().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not waited for: losing it only means re-applying less after a restart.
        self.write(vec![LogRecord::Committed(committed)])
            .map_err(write_logs_err)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.mem().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let recs: Vec<LogRecord> = entries.into_iter().map(LogRecord::Entry).collect();
        match self.write(recs) {
            Ok(seq) => {
                // Completed by the log's writer after the fdatasync that covers `seq`.
                self.inner.log.on_durable(
                    seq,
                    Box::new(move |r| callback.log_io_completed(r.map_err(std::io::Error::other))),
                );
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(write_logs_err(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let seq = self
            .write(vec![LogRecord::Truncate(log_id.index)])
            .map_err(write_logs_err)?;
        self.inner.log.sync(seq).await.map_err(write_logs_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let seq = self
            .write(vec![LogRecord::Purge(log_id)])
            .map_err(write_logs_err)?;
        self.inner.log.sync(seq).await.map_err(write_logs_err)?;
        self.drop_purged_segments().await.map_err(write_logs_err)
    }
}

// ---- snapshot file ------------------------------------------------------------------------------

impl SnapshotStore {
    /// Reads the snapshot file: `magic | meta len u32 LE | meta JSON | data | crc32 u32 LE` (the
    /// CRC over everything before it).
    fn load(&self) -> Result<Option<StoredSnapshot>, DirError> {
        let bad = |m: String| DirError::Storage(format!("the snapshot {}: {m}", self.path.display()));
        let b = match self.fs.len(&self.path) {
            Ok(Some(_)) => self.fs.read(&self.path).map_err(|e| bad(e.to_string()))?,
            Ok(None) => return Ok(None),
            Err(e) => return Err(bad(e.to_string())),
        };
        if b.len() < 16 || &b[..8] != SNAPSHOT_MAGIC {
            return Err(bad("not a snapshot file of this gma version".into()));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32fast::hash(body) != crc {
            return Err(bad("checksum mismatch (the disk corrupted it)".into()));
        }
        let mlen = u32::from_le_bytes([body[8], body[9], body[10], body[11]]) as usize;
        let meta = body.get(12..12 + mlen).ok_or_else(|| bad("cut short".into()))?;
        let meta = serde_json::from_slice(meta).map_err(|e| corrupt("snapshot meta", e))?;
        Ok(Some((meta, body[12 + mlen..].to_vec())))
    }

    /// The stored snapshot, read from its file (blocking).
    fn current(&self) -> Result<Option<Snapshot<TypeConfig>>, DirError> {
        if self.current.read().is_none() {
            return Ok(None);
        }
        Ok(self.load()?.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }

    fn stored_last_log_id(&self) -> Option<LogId> {
        self.current.read().as_ref().and_then(|m| m.last_log_id)
    }

    /// Replaces the stored snapshot durably (temporary file, fdatasync, rename, folder fsync).
    /// With `only_if_newer`, keeps a stored snapshot that is newer than `meta`; returns whether
    /// it wrote. Callers hold `self.write`.
    async fn store(
        &self,
        meta: &SnapshotMeta<NodeId, Node>,
        data: &[u8],
        only_if_newer: bool,
    ) -> Result<bool, StorageError> {
        if only_if_newer && self.stored_last_log_id() > meta.last_log_id {
            return Ok(false);
        }
        let m = serde_json::to_vec(meta).map_err(|e| write_snapshot_err(Some(meta), e))?;
        let mut file = Vec::with_capacity(16 + m.len() + data.len());
        file.extend_from_slice(SNAPSHOT_MAGIC);
        file.extend_from_slice(&(m.len() as u32).to_le_bytes());
        file.extend_from_slice(&m);
        file.extend_from_slice(data);
        let crc = crc32fast::hash(&file);
        file.extend_from_slice(&crc.to_le_bytes());
        let (fs, path) = (self.fs.clone(), self.path.clone());
        tokio::task::spawn_blocking(move || gma_durable::fs::write_atomic(&*fs, &path, &file))
            .await
            .map_err(|e| write_snapshot_err(Some(meta), std::io::Error::other(e.to_string())))?
            .map_err(|e| write_snapshot_err(Some(meta), e))?;
        *self.current.write() = Some(meta.clone());
        Ok(true)
    }
}

/// Applies one command and broadcasts its changes (to watchers on this node).
fn apply_one(
    dir: &mut DirectoryState,
    cmd: Command,
    changes: &broadcast::Sender<Arc<pb::WatchEvent>>,
) -> Result<Ack, DirError> {
    dir.apply(cmd).map(|a| {
        for c in &a.changes {
            // No receivers (no watchers) is fine.
            let _ = changes.send(Arc::new(c.to_pb()));
        }
        Ack {
            lease_id: a.lease_id,
            ttl_ms: a.ttl_ms,
            revision: a.revision,
        }
    })
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
        let data = serde_json::to_vec(&body).map_err(|e| write_snapshot_err(Some(&meta), e))?;
        drop(body);
        {
            let _write = self.snapshots.write.lock().await;
            if !self.snapshots.store(&meta, &data, true).await? {
                tracing::info!(snapshot = %meta.snapshot_id, "a newer snapshot is stored; not replacing it");
            }
        }
        tracing::debug!(snapshot = %meta.snapshot_id, bytes = data.len(), "raft snapshot built");
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
                EntryPayload::Normal(Command::Batch(cmds)) => {
                    let each = cmds
                        .into_iter()
                        .map(|c| apply_one(&mut st.dir, c, &self.shared.changes))
                        .collect();
                    Reply(Ok(Ack::default()), each)
                }
                EntryPayload::Normal(cmd) => Reply::one(apply_one(&mut st.dir, cmd, &self.shared.changes)),
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
        let body: SnapshotBody =
            serde_json::from_slice(&data).map_err(|e| read_snapshot_err(Some(meta), e))?;
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
        let snapshots = self.snapshots.clone();
        let meta = snapshots.current.read().clone();
        tokio::task::spawn_blocking(move || snapshots.current())
            .await
            .map_err(|e| read_snapshot_err(meta.as_ref(), std::io::Error::other(e.to_string())))?
            .map_err(|e| read_snapshot_err(meta.as_ref(), e))
    }
}
