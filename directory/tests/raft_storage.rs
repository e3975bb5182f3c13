//! The raft storage (gma-durable log + snapshot file): openraft's conformance suite, restart,
//! snapshot install, the refusal of the old sled layout.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gma_core::event::dbl;
use gma_directory::raft::storage::{open, LogStore, SmShared, StateMachineStore};
use gma_directory::raft::types::{LogId, Node, NodeId, Reply, StorageError, TypeConfig};
use gma_directory::state::{Command, Kind, Limits};
use gma_directory::DirError;
use gma_proto::v1::{self as pb, record::Record as Body};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogState, Membership, RaftLogReader, RaftSnapshotBuilder,
    StorageIOError, StoredMembership, Vote,
};
use tempfile::TempDir;
use tokio::sync::broadcast::error::TryRecvError;

const T0: u64 = 1_000_000;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let td = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let (log, sm, _) = open(td.path(), Limits::default(), 16).map_err(|e| StorageIOError::write(&e))?;
        Ok((td, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).unwrap();
}

// ---- fixtures -----------------------------------------------------------------------------------

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn membership(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(members()),
    }
}

fn members() -> Membership<NodeId, Node> {
    let node = Node {
        rpc_addr: "127.0.0.1:7100".into(),
        api_addr: "127.0.0.1:7100".into(),
    };
    Membership::new(vec![BTreeSet::from([1])], BTreeMap::from([(1, node)]))
}

fn normal(term: u64, index: u64, cmd: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(cmd),
    }
}

fn schema() -> pb::EventSchema {
    pb::EventSchema {
        name: "host.cpu".into(),
        version: 1,
        fields: vec![dbl("value", "", "")],
        description: String::new(),
    }
}

fn producer(id: &str) -> pb::Record {
    pb::Record {
        record: Some(Body::Producer(pb::ProducerRecord {
            id: id.into(),
            address: "http://127.0.0.1:7001".into(),
            events: vec!["host.cpu".into()],
            ..Default::default()
        })),
    }
}

fn consumer(id: &str) -> pb::Record {
    pb::Record {
        record: Some(Body::Consumer(pb::ConsumerRecord {
            id: id.into(),
            address: "http://127.0.0.1:9000".into(),
            accepts: vec!["host.*".into()],
            manner: "archive".into(),
            ..Default::default()
        })),
    }
}

fn register(record: pb::Record, now_ms: u64) -> Command {
    Command::Register {
        record,
        schemas: vec![schema()],
        lease_id: 0,
        ttl_ms: 10_000,
        now_ms,
    }
}

/// (kind, id) of every record, in order.
async fn keys(shared: &SmShared) -> Vec<(Kind, String)> {
    let st = shared.state.read().await;
    st.dir
        .records()
        .filter_map(gma_directory::state::key_of)
        .collect()
}

fn drain(rx: &mut tokio::sync::broadcast::Receiver<Arc<pb::WatchEvent>>) -> Vec<u64> {
    let mut revs = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(ev) => revs.push(ev.revision),
            Err(TryRecvError::Empty) => return revs,
            Err(e) => panic!("broadcast: {e}"),
        }
    }
}

// ---- tests --------------------------------------------------------------------------------------

#[tokio::test]
async fn apply_replies_and_broadcasts_in_revision_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut sm, shared) = open(dir.path(), Limits::default(), 16).unwrap();
    let mut rx = shared.changes.subscribe();
    let replies = sm
        .apply([
            blank(1, 1),
            membership(1, 2),
            normal(1, 3, register(producer("p1"), T0)),
            normal(1, 4, register(producer("p1"), T0)),
            normal(1, 5, register(consumer("c1"), T0)),
            normal(
                1,
                6,
                Command::Remove {
                    kind: Kind::Producer,
                    id: "p1".into(),
                },
            ),
        ])
        .await
        .unwrap();
    assert_eq!(replies.len(), 6);
    assert_eq!(replies[0], Reply::default());
    assert_eq!(replies[1], Reply::default());
    let ack = replies[2].0.clone().unwrap();
    assert_eq!((ack.lease_id, ack.ttl_ms, ack.revision), (1, 10_000, 1));
    assert!(
        matches!(replies[3].0, Err(DirError::Refused(ref r)) if r.code() == tonic::Code::AlreadyExists),
        "a rejected command is a reply, not a storage error"
    );
    assert_eq!(replies[4].0.clone().unwrap().revision, 2);
    assert_eq!(replies[5].0.clone().unwrap().revision, 3);
    assert_eq!(drain(&mut rx), vec![1, 2, 3]);

    let (applied, mem) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 6)));
    assert_eq!(mem, StoredMembership::new(Some(log_id(1, 2)), members()));
    assert_eq!(keys(&shared).await, vec![(Kind::Consumer, "c1".to_string())]);
}

#[tokio::test]
async fn everything_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::default();
    let entries = vec![
        blank(1, 1),
        membership(1, 2),
        normal(1, 3, register(producer("p1"), T0)),
        normal(1, 4, register(consumer("c1"), T0 + 1)),
        normal(1, 5, register(producer("p2"), T0 + 2)),
        normal(
            2,
            6,
            Command::Remove {
                kind: Kind::Consumer,
                id: "c1".into(),
            },
        ),
    ];
    let snap_meta = {
        let (mut log, mut sm, shared) = open(dir.path(), limits, 16).unwrap();
        log.save_vote(&Vote::new(2, 1)).await.unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_committed(Some(log_id(2, 6))).await.unwrap();
        sm.apply(entries[..5].to_vec()).await.unwrap();
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 5)));
        log.purge(log_id(1, 3)).await.unwrap();
        assert_eq!(shared.state.read().await.dir.revision(), 3);
        snap.meta
    };

    let (mut log, mut sm, shared) = open(dir.path(), limits, 16).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 6)));
    assert_eq!(
        log.get_log_state().await.unwrap(),
        LogState {
            last_purged_log_id: Some(log_id(1, 3)),
            last_log_id: Some(log_id(2, 6)),
        }
    );
    let ids: Vec<u64> = log
        .try_get_log_entries(0..)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(ids, vec![4, 5, 6]);

    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snap_meta);
    let (applied, mem) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 5)));
    assert_eq!(mem, StoredMembership::new(Some(log_id(1, 2)), members()));
    {
        let st = shared.state.read().await;
        assert_eq!(st.dir.revision(), 3);
        assert_eq!(st.dir.next_lease_id(), 4);
        assert!(st.dir.lease(2).is_some(), "leases come back with their records");
    }
    assert_eq!(
        keys(&shared).await,
        vec![
            (Kind::Producer, "p1".to_string()),
            (Kind::Producer, "p2".to_string()),
            (Kind::Consumer, "c1".to_string()),
        ]
    );

    // openraft re-applies the committed entries after the snapshot from the log.
    let mut rx = shared.changes.subscribe();
    let rest = log.try_get_log_entries(6..=6).await.unwrap();
    let replies = sm.apply(rest).await.unwrap();
    assert_eq!(replies[0].0.clone().unwrap().revision, 4);
    assert_eq!(drain(&mut rx), vec![4]);
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(2, 6)));
}

#[tokio::test]
async fn truncate_removes_the_tail_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _sm, _) = open(dir.path(), Limits::default(), 16).unwrap();
        log.blocking_append((1..=5).map(|i| blank(1, i))).await.unwrap();
        log.truncate(log_id(1, 3)).await.unwrap();
        log.blocking_append([blank(2, 3)]).await.unwrap();
    }
    let (mut log, _sm, _) = open(dir.path(), Limits::default(), 16).unwrap();
    let got: Vec<LogId> = log
        .try_get_log_entries(..)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.log_id)
        .collect();
    assert_eq!(got, vec![log_id(1, 1), log_id(1, 2), log_id(2, 3)]);
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(2, 3)));
    assert!(log.try_get_log_entries(3..3).await.unwrap().is_empty());
    assert!(log.try_get_log_entries(u64::MAX..).await.unwrap().is_empty());
}

#[tokio::test]
async fn installed_snapshot_replaces_the_state_and_feeds_watchers() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let limits = Limits::default();
    let first = normal(1, 3, register(producer("p1"), T0));
    let (_log_a, mut sm_a, shared_a) = open(dir_a.path(), limits, 16).unwrap();
    sm_a.apply([
        blank(1, 1),
        membership(1, 2),
        first.clone(),
        normal(1, 4, register(consumer("c1"), T0)),
        normal(1, 5, register(producer("p2"), T0)),
    ])
    .await
    .unwrap();
    let snap = sm_a.get_snapshot_builder().await.build_snapshot().await.unwrap();

    // B has applied up to revision 1 (the same first command) before the snapshot arrives.
    let (_log_b, mut sm_b, shared_b) = open(dir_b.path(), limits, 16).unwrap();
    sm_b.apply([blank(1, 1), membership(1, 2), first]).await.unwrap();
    let mut rx = shared_b.changes.subscribe();
    let mut data = sm_b.begin_receiving_snapshot().await.unwrap();
    assert!(data.get_ref().is_empty());
    *data = *snap.snapshot;
    sm_b.install_snapshot(&snap.meta, data).await.unwrap();

    assert_eq!(
        drain(&mut rx),
        vec![2, 3],
        "only the changes newer than B's revision"
    );
    assert_eq!(keys(&shared_b).await, keys(&shared_a).await);
    assert_eq!(
        sm_b.applied_state().await.unwrap(),
        sm_a.applied_state().await.unwrap()
    );
    assert_eq!(
        sm_b.get_current_snapshot().await.unwrap().unwrap().meta,
        snap.meta
    );
    {
        let (a, b) = (shared_a.state.read().await, shared_b.state.read().await);
        assert_eq!(a.dir.revision(), b.dir.revision());
        assert_eq!(a.dir.next_lease_id(), b.dir.next_lease_id());
        assert_eq!(a.dir.counts(), b.dir.counts());
    }

    // Both continue identically.
    let next = normal(
        2,
        6,
        Command::Remove {
            kind: Kind::Producer,
            id: "p2".into(),
        },
    );
    let ra = sm_a.apply([next.clone()]).await.unwrap();
    let rb = sm_b.apply([next]).await.unwrap();
    assert_eq!(ra, rb);
    assert_eq!(drain(&mut rx), vec![4]);

    // The installed snapshot is what B restarts from.
    drop((sm_b, shared_b, _log_b));
    let (_log_b, mut sm_b, shared_b) = open(dir_b.path(), limits, 16).unwrap();
    assert_eq!(sm_b.applied_state().await.unwrap().0, Some(log_id(1, 5)));
    assert_eq!(shared_b.state.read().await.dir.revision(), 3);
}

#[tokio::test]
async fn install_with_compacted_history_sends_what_it_has() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let limits = Limits {
        max_records: 100,
        history_limit: 1,
        ..Limits::default()
    };
    let (_log_a, mut sm_a, _) = open(dir_a.path(), limits, 16).unwrap();
    sm_a.apply([
        normal(1, 1, register(producer("p1"), T0)),
        normal(1, 2, register(producer("p2"), T0)),
        normal(1, 3, register(producer("p3"), T0)),
    ])
    .await
    .unwrap();
    let snap = sm_a.get_snapshot_builder().await.build_snapshot().await.unwrap();

    let (_log_b, mut sm_b, shared_b) = open(dir_b.path(), limits, 16).unwrap();
    let mut rx = shared_b.changes.subscribe();
    sm_b.install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
    // Revisions 1 and 2 were compacted: a watcher sees the jump to 3 and re-reads the history
    // (OUT_OF_RANGE there, so its client re-lists).
    assert_eq!(drain(&mut rx), vec![3]);
    let st = shared_b.state.read().await;
    assert_eq!((st.dir.revision(), st.dir.compacted()), (3, 2));
}

#[tokio::test]
async fn a_corrupt_snapshot_is_a_storage_error() {
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_log, mut sm, _) = open(dir.path(), Limits::default(), 16).unwrap();
    let (_other_log, mut other, _) = open(other_dir.path(), Limits::default(), 16).unwrap();
    other.apply([membership(1, 1)]).await.unwrap();
    let snap = other.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let bad = Box::new(std::io::Cursor::new(b"{not json".to_vec()));
    assert!(sm.install_snapshot(&snap.meta, bad).await.is_err());
    assert!(
        sm.get_current_snapshot().await.unwrap().is_none(),
        "nothing was stored"
    );
    assert_eq!(sm.applied_state().await.unwrap().0, None);
}

#[test]
fn the_sled_layout_of_earlier_builds_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conf"), b"segment_size: 524288").unwrap();
    std::fs::write(dir.path().join("db"), b"").unwrap();
    let err = open(dir.path(), Limits::default(), 16).err().unwrap().to_string();
    assert!(err.contains("sled layout") && err.contains("move"), "{err}");
}

#[test]
fn a_second_open_of_the_same_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path(), Limits::default(), 16).unwrap();
    let err = open(dir.path(), Limits::default(), 16).err().unwrap().to_string();
    assert!(err.contains("locked"), "{err}");
}
