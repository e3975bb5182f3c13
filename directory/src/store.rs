//! Durable storage of the directory: the only module that touches sled.
//!
//! Layout: one sled tree (the default one), every key prefixed by one byte.
//!
//! | key                                   | value                                    |
//! |---------------------------------------|------------------------------------------|
//! | `r` kind tag (1 byte) id              | `RecordEntry` (protobuf)                 |
//! | `s` name `0x00` version (u32 BE)      | `EventSchema` (protobuf)                 |
//! | `l` lease id (u64 BE)                 | ttl_ms (u64 BE), expires_at_ms (u64 BE)  |
//! | `h` revision (u64 BE)                 | `WatchEvent` (protobuf): the history     |
//! | `m` name                              | u64 BE: format, revision, next_lease, compacted |
//!
//! Durability: the keys one command changed are written in one `apply_batch` (atomic: after a
//! crash either all of them or none are there), then `flush_async().await` runs before the
//! client gets its answer, so an acknowledged write is on disk as far as sled can promise.
//! Caveat (../shared/notes/reliability.md §4.1): on Linux sled 0.34 flushes its log with
//! `sync_file_range(WAIT_BEFORE|WRITE|WAIT_AFTER)`, not `fsync`; that survives a process crash
//! (kill -9) but not necessarily a power loss or kernel crash, because file metadata and the
//! drive's volatile cache are not flushed. Only sled's periodic flusher calls `sync_all`
//! (every 500 ms). So: acknowledged writes survive a process crash; after a power loss up to
//! about the last 500 ms of acknowledged writes may be lost.
//!
//! Leases: a lease is written when granted (with its first `expires_at_ms`) and deleted when
//! revoked or expired. Renewals (KeepAlive) and the start-up extension are not written: on
//! every start the directory applies `ExtendAll{now}`, which gives each stored lease at least
//! one full TTL from the restart, so a stale stored `expires_at_ms` never expires a record
//! early, and a holder that died while the directory was down disappears one TTL after the
//! restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gma_proto::v1 as pb;
use prost::Message;

use crate::error::DirError;
use crate::state::{Applied, Change, ChangeKind, DirectoryState, Limits, Persisted, RecordKey};

const P_RECORD: u8 = b'r';
const P_SCHEMA: u8 = b's';
const P_LEASE: u8 = b'l';
const P_HISTORY: u8 = b'h';

// Meta keys: prefix `m`, then the name.
const META_FORMAT: &[u8] = b"mformat";
const META_REVISION: &[u8] = b"mrevision";
const META_NEXT_LEASE: &[u8] = b"mnext_lease";
const META_COMPACTED: &[u8] = b"mcompacted";

/// On-disk layout version; bump on incompatible change.
const FORMAT: u64 = 1;

/// How long `open` retries while another handle in this process still holds sled's file lock
/// (a restart inside one process, as tests do).
const LOCK_RETRY: Duration = Duration::from_secs(5);

/// The directory's sled database.
pub(crate) struct Store {
    db: sled::Db,
}

impl Store {
    /// Opens (creating if needed) the database in `dir` and loads the state from it.
    pub async fn open(dir: &Path, limits: Limits) -> Result<(Store, DirectoryState), DirError> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let db = open_db(&dir)?;
            let store = Store { db };
            let state = store.load(limits)?;
            Ok((store, state))
        })
        .await
        .map_err(|e| DirError::Storage(format!("open task failed: {e}")))?
    }

    fn load(&self, limits: Limits) -> Result<DirectoryState, DirError> {
        if let Some(v) = self.db.get(META_FORMAT)? {
            let format = be_u64(&v)?;
            if format != FORMAT {
                return Err(DirError::Storage(format!(
                    "the data directory has format {format}, this build reads format {FORMAT}: use a matching gma version or a new data_dir"
                )));
            }
        }
        let mut p = Persisted::default();
        for item in self.db.scan_prefix([P_RECORD]) {
            let (_, v) = item?;
            p.records
                .push(pb::RecordEntry::decode(&*v).map_err(corrupt("record"))?);
        }
        for item in self.db.scan_prefix([P_SCHEMA]) {
            let (_, v) = item?;
            p.schemas
                .push(pb::EventSchema::decode(&*v).map_err(corrupt("schema"))?);
        }
        for item in self.db.scan_prefix([P_LEASE]) {
            let (k, v) = item?;
            let id = be_u64(&k[1..])?;
            if v.len() != 16 {
                return Err(DirError::Storage(format!("lease {id} has a malformed value")));
            }
            p.leases.push((id, be_u64(&v[..8])?, be_u64(&v[8..])?));
        }
        for item in self.db.scan_prefix([P_HISTORY]) {
            let (_, v) = item?;
            let ev = pb::WatchEvent::decode(&*v).map_err(corrupt("history"))?;
            if let Some(c) = Change::from_pb(ev) {
                p.history.push(c);
            }
        }
        p.revision = self.meta(META_REVISION)?;
        p.next_lease_id = self.meta(META_NEXT_LEASE)?;
        p.compacted = self.meta(META_COMPACTED)?;
        let state = DirectoryState::restore(limits, p)?;

        // Drop history the state no longer keeps (e.g. history_limit was lowered).
        let mut batch = sled::Batch::default();
        let mut dropped = 0usize;
        for item in self.db.range(history_key(0)..=history_key(state.compacted())) {
            let (k, _) = item?;
            batch.remove(k);
            dropped += 1;
        }
        if dropped > 0 {
            put_meta(&mut batch, &state);
            self.db.apply_batch(batch)?;
            self.db.flush()?;
            tracing::info!(dropped, compacted = state.compacted(), "compacted stored history");
        }
        Ok(state)
    }

    fn meta(&self, key: &[u8]) -> Result<u64, DirError> {
        match self.db.get(key)? {
            Some(v) => be_u64(&v),
            None => Ok(0),
        }
    }

    /// Writes what `applied` changed (read back from `state`, which it was applied to) in one
    /// batch and waits until sled has flushed it. A no-op for non-durable commands.
    pub async fn persist(&self, state: &DirectoryState, applied: &Applied) -> Result<(), DirError> {
        if !applied.is_durable() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for c in &applied.changes {
            let Some(key) = crate::state::key_of(&c.entry) else {
                continue;
            };
            match c.kind {
                ChangeKind::Put => batch.insert(record_key(&key), c.entry.encode_to_vec()),
                ChangeKind::Delete => batch.remove(record_key(&key)),
            }
            batch.insert(history_key(c.revision).to_vec(), c.to_pb().encode_to_vec());
        }
        for (name, version) in &applied.effects.schemas {
            if let Some(s) = state.schema(name, *version) {
                batch.insert(schema_key(name, *version), s.encode_to_vec());
            }
        }
        for id in &applied.effects.leases {
            match state.lease(*id) {
                Some(l) => {
                    let mut v = Vec::with_capacity(16);
                    v.extend_from_slice(&l.ttl_ms.to_be_bytes());
                    v.extend_from_slice(&l.expires_at_ms.to_be_bytes());
                    batch.insert(lease_key(*id).to_vec(), v);
                }
                None => batch.remove(lease_key(*id).to_vec()),
            }
        }
        // After the history inserts: a change compacted by its own command is not kept.
        if let Some(range) = &applied.effects.compacted {
            for rev in range.clone() {
                batch.remove(history_key(rev).to_vec());
            }
        }
        put_meta(&mut batch, state);
        self.db.apply_batch(batch)?;
        self.db.flush_async().await?;
        Ok(())
    }

    /// Flushes everything and releases the database (and its file lock).
    pub async fn close(self) -> Result<(), DirError> {
        let db = self.db;
        tokio::task::spawn_blocking(move || {
            let r = db.flush().map(|_| ());
            drop(db);
            r
        })
        .await
        .map_err(|e| DirError::Storage(format!("close task failed: {e}")))??;
        Ok(())
    }
}

fn open_db(dir: &PathBuf) -> Result<sled::Db, DirError> {
    let deadline = std::time::Instant::now() + LOCK_RETRY;
    loop {
        match sled::Config::new().path(dir).open() {
            Ok(db) => return Ok(db),
            // sled holds an exclusive file lock per open database; a previous handle in this
            // process may still be closing.
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

fn put_meta(batch: &mut sled::Batch, state: &DirectoryState) {
    batch.insert(META_FORMAT, &FORMAT.to_be_bytes());
    batch.insert(META_REVISION, &state.revision().to_be_bytes());
    batch.insert(META_NEXT_LEASE, &state.next_lease_id().to_be_bytes());
    batch.insert(META_COMPACTED, &state.compacted().to_be_bytes());
}

fn record_key((kind, id): &RecordKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + id.len());
    k.push(P_RECORD);
    k.push(kind.tag());
    k.extend_from_slice(id.as_bytes());
    k
}

fn schema_key(name: &str, version: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(6 + name.len());
    k.push(P_SCHEMA);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(&version.to_be_bytes());
    k
}

fn lease_key(id: u64) -> [u8; 9] {
    prefixed(P_LEASE, id)
}

fn history_key(rev: u64) -> [u8; 9] {
    prefixed(P_HISTORY, rev)
}

fn prefixed(prefix: u8, n: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(&n.to_be_bytes());
    k
}

fn be_u64(b: &[u8]) -> Result<u64, DirError> {
    let arr: [u8; 8] = b
        .try_into()
        .map_err(|_| DirError::Storage(format!("expected an 8-byte number, found {} bytes", b.len())))?;
    Ok(u64::from_be_bytes(arr))
}

fn corrupt(what: &'static str) -> impl Fn(prost::DecodeError) -> DirError {
    move |e| DirError::Storage(format!("a stored {what} cannot be decoded: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, Kind, RecordFilter};
    use gma_core::event::dbl;
    use gma_proto::v1::record::Record as Body;

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

    fn schema() -> pb::EventSchema {
        pb::EventSchema {
            name: "host.cpu".into(),
            version: 1,
            fields: vec![dbl("load", "", "")],
            description: String::new(),
        }
    }

    async fn apply(store: &Store, state: &mut DirectoryState, cmd: Command) -> Applied {
        let a = state.apply(cmd).unwrap();
        store.persist(state, &a).await.unwrap();
        a
    }

    #[tokio::test]
    async fn state_survives_reopen_and_history_is_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_records: 100,
            history_limit: 3,
        };
        let (store, mut state) = Store::open(dir.path(), limits).await.unwrap();
        for i in 0..4 {
            let cmd = Command::Register {
                record: producer(&format!("p{i}")),
                schemas: vec![schema()],
                lease_id: 0,
                ttl_ms: 1000,
                now_ms: 10,
            };
            apply(&store, &mut state, cmd).await;
        }
        apply(
            &store,
            &mut state,
            Command::Remove {
                kind: Kind::Producer,
                id: "p0".into(),
            },
        )
        .await;
        apply(&store, &mut state, Command::Expire { now_ms: 10_000 }).await;
        // Re-register one so a live lease exists.
        let a = apply(
            &store,
            &mut state,
            Command::Register {
                record: producer("p9"),
                schemas: vec![],
                lease_id: 0,
                ttl_ms: 500,
                now_ms: 20_000,
            },
        )
        .await;
        assert_eq!(state.revision(), 9);
        assert_eq!(state.compacted(), 6);
        store.close().await.unwrap();

        let (store, reopened) = Store::open(dir.path(), limits).await.unwrap();
        assert_eq!(reopened.revision(), 9);
        assert_eq!(reopened.compacted(), 6);
        assert_eq!(reopened.counts(), state.counts());
        assert_eq!(reopened.lease(a.lease_id), state.lease(a.lease_id));
        assert_eq!(reopened.next_lease_id(), state.next_lease_id());
        assert_eq!(reopened.schema("host.cpu", 1), Some(&schema()));
        let all = RecordFilter::default();
        assert_eq!(
            reopened.changes_since(7, &all).unwrap(),
            state.changes_since(7, &all).unwrap()
        );
        assert!(reopened.changes_since(6, &all).is_err());
        assert_eq!(
            reopened.records().collect::<Vec<_>>(),
            state.records().collect::<Vec<_>>()
        );
        let stored_history = store.db.scan_prefix([P_HISTORY]).count();
        assert_eq!(stored_history, 3);
        store.close().await.unwrap();

        // A lower history limit compacts on open.
        let lower = Limits {
            history_limit: 1,
            ..limits
        };
        let (store, s) = Store::open(dir.path(), lower).await.unwrap();
        assert_eq!(s.compacted(), 8);
        assert_eq!(store.db.scan_prefix([P_HISTORY]).count(), 1);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn keepalive_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut state) = Store::open(dir.path(), Limits::default()).await.unwrap();
        let a = state
            .apply(Command::KeepAlive {
                lease_id: 1,
                now_ms: 0,
            })
            .unwrap();
        assert!(!a.is_durable());
        store.persist(&state, &a).await.unwrap();
        assert!(store.db.is_empty());
        store.close().await.unwrap();
    }
}
