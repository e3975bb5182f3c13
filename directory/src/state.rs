//! The directory's deterministic state machine.
//!
//! To ensure correctness (this is what a raft state machine will replay on every member):
//! - [`DirectoryState::apply`] is a pure function of the state and the [`Command`]: no I/O, no
//!   clock, no randomness, no hash-order iteration. Times travel inside commands (`now_ms`,
//!   stamped by the one writer), lease ids come from a counter in the state.
//! - A command either fails with a [`DirError`] and leaves the state untouched (every check runs
//!   before the first mutation), or succeeds and returns an [`Applied`]: the response values,
//!   the [`Change`]s it made (one revision each, in order) and the keys to persist.
//! - Queries ([`DirectoryState::search`], [`DirectoryState::get_schema`], ...) never mutate.
//!
//! Revisions: every record PUT or DELETE takes the next revision, starting at 1; schemas and
//! leases carry none. The last `history_limit` changes, and at most `history_bytes` of their
//! records (protobuf-encoded), are kept so watchers can resume; older ones are compacted and a
//! resume before them is OUT_OF_RANGE.

use gma_core::Refuse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::{Bound, RangeInclusive};

use gma_core::event::same_definition;
use gma_core::pattern::Pattern;
use gma_proto::v1::{self as pb, record::Record as Body};
use serde::{Deserialize, Serialize};

use crate::error::DirError;
pub use crate::kind::Kind;
use crate::validate;

/// DELETE reason of an explicit Remove.
pub const REASON_REMOVED: &str = "removed";
/// DELETE reason of a record whose lease expired.
pub const REASON_EXPIRED: &str = "lease expired";
/// Search page size when the request gives 0.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest Search page.
pub const MAX_PAGE_SIZE: usize = 1000;

/// Identity of a record: unique per kind.
pub type RecordKey = (Kind, String);

/// The record inside an entry, if any.
pub fn body_of(entry: &pb::RecordEntry) -> Option<&Body> {
    entry.record.as_ref().and_then(|r| r.record.as_ref())
}

fn id_of(body: &Body) -> &str {
    match body {
        Body::Producer(p) => &p.id,
        Body::Consumer(c) => &c.id,
    }
}

/// The key of an entry, if it holds a record.
pub fn key_of(entry: &pb::RecordEntry) -> Option<RecordKey> {
    body_of(entry).map(|b| (Kind::of(b), id_of(b).to_string()))
}

/// A lease: records attached to it live while it is renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    pub records: BTreeSet<RecordKey>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Put,
    Delete,
}

/// One change to the directory, at one revision. Becomes one `WatchEvent`.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub revision: u64,
    pub kind: ChangeKind,
    /// For PUT the new entry; for DELETE the entry as it was.
    pub entry: pb::RecordEntry,
    /// For DELETE: [`REASON_REMOVED`] or [`REASON_EXPIRED`]; empty for PUT.
    pub reason: String,
}

impl Change {
    /// What this change counts against `history_bytes`: its record's protobuf size.
    pub fn bytes(&self) -> usize {
        prost::Message::encoded_len(&self.entry)
    }

    pub fn to_pb(&self) -> pb::WatchEvent {
        let r#type = match self.kind {
            ChangeKind::Put => pb::WatchEventType::Put,
            ChangeKind::Delete => pb::WatchEventType::Delete,
        };
        pb::WatchEvent {
            r#type: r#type as i32,
            revision: self.revision,
            entry: Some(self.entry.clone()),
            reason: self.reason.clone(),
        }
    }

    /// The inverse of [`Change::to_pb`]; `None` for SYNCED or an event without a record.
    pub fn from_pb(ev: pb::WatchEvent) -> Option<Change> {
        let kind = match ev.r#type() {
            pb::WatchEventType::Put => ChangeKind::Put,
            pb::WatchEventType::Delete => ChangeKind::Delete,
            _ => return None,
        };
        let entry = ev.entry?;
        body_of(&entry)?;
        Some(Change {
            revision: ev.revision,
            kind,
            entry,
            reason: ev.reason,
        })
    }
}

/// A state-machine command. Serializable so a replicated log can carry it; protobuf messages
/// inside travel as their protobuf encoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// GMA Add. `lease_id` 0 grants a new lease of `ttl_ms`; otherwise the record joins that
    /// live lease (and `ttl_ms` is ignored).
    Register {
        #[serde(with = "proto_serde")]
        record: pb::Record,
        #[serde(with = "proto_serde::vec")]
        schemas: Vec<pb::EventSchema>,
        lease_id: u64,
        ttl_ms: u64,
        now_ms: u64,
    },
    /// Replace the record matching (kind, id). `ttl_ms` > 0 moves it to a fresh lease.
    Update {
        #[serde(with = "proto_serde")]
        record: pb::Record,
        #[serde(with = "proto_serde::vec")]
        schemas: Vec<pb::EventSchema>,
        ttl_ms: u64,
        now_ms: u64,
    },
    Remove {
        kind: Kind,
        id: String,
    },
    /// Renew a live lease to `now + ttl`. Unknown or expired leases answer ttl 0. With
    /// `checked` (a policy is enforced), the renewal happens only if every record the lease
    /// holds is among the ids the renewer was authorized for; a member whose state lagged
    /// behind the leader's when it authorized gets UNAVAILABLE (retry) instead.
    KeepAlive {
        lease_id: u64,
        now_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checked: Option<Vec<String>>,
    },
    /// Remove every lease with `expires_at_ms <= now_ms` and its records.
    Expire {
        now_ms: u64,
    },
    /// On start or leader change: every lease gets `expires_at = max(expires_at, now + ttl)`.
    ExtendAll {
        now_ms: u64,
    },
    /// Commands proposed together as one raft entry (see `crate::batch`): the raft state
    /// machine applies them one by one, in order, each with its own reply. Never nested.
    Batch(Vec<Command>),
}

/// The result of a successful command.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// The lease the record now holds (Register, Update) or the renewed lease (KeepAlive).
    pub lease_id: u64,
    /// The lease's TTL; 0 from KeepAlive means the lease does not exist.
    pub ttl_ms: u64,
    /// The directory revision after the command.
    pub revision: u64,
    /// Record changes, in revision order.
    pub changes: Vec<Change>,
    /// Keys touched besides the record changes.
    pub effects: Effects,
}

impl Applied {
    /// True when the command changed records, schemas, leases or history, not only lease
    /// expiry times (KeepAlive, ExtendAll). Every command is durable in the raft log either
    /// way; this tells observers whether anything visible changed.
    pub fn is_durable(&self) -> bool {
        !self.changes.is_empty()
            || !self.effects.schemas.is_empty()
            || !self.effects.leases.is_empty()
            || self.effects.compacted.is_some()
    }
}

/// Keys touched by a command besides the record changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    /// Schemas added, as (name, version).
    pub schemas: Vec<(String, u32)>,
    /// Leases granted or revoked: persist each from the state, or delete it if gone.
    pub leases: Vec<u64>,
    /// History revisions dropped by compaction.
    pub compacted: Option<RangeInclusive<u64>>,
}

/// Bounds that every member of a replicated directory must share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_records: usize,
    /// Most changes kept in the history.
    pub history_limit: usize,
    /// Most bytes of records (protobuf-encoded) kept in the history: a change of a producer
    /// with 2,500 sources carries ~50 KB, so a count alone does not bound its memory.
    pub history_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_records: 1_000_000,
            history_limit: 10_000,
            history_bytes: 16 << 20,
        }
    }
}

/// Sizes reported by ClusterStatus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub producers: u64,
    pub consumers: u64,
    pub schemas: u64,
    pub leases: u64,
}

/// Everything a store keeps, to rebuild a [`DirectoryState`] with [`DirectoryState::restore`].
#[derive(Debug, Clone, Default)]
pub struct Persisted {
    pub records: Vec<pb::RecordEntry>,
    pub schemas: Vec<pb::EventSchema>,
    /// (lease id, ttl_ms, expires_at_ms).
    pub leases: Vec<(u64, u64, u64)>,
    /// Retained history, any order.
    pub history: Vec<Change>,
    pub revision: u64,
    pub next_lease_id: u64,
    pub compacted: u64,
}

/// The whole directory in memory.
#[derive(Debug, Clone)]
pub struct DirectoryState {
    limits: Limits,
    records: BTreeMap<RecordKey, pb::RecordEntry>,
    producers: usize,
    schemas: BTreeMap<(String, u32), pb::EventSchema>,
    leases: BTreeMap<u64, Lease>,
    /// (expires_at_ms, lease id): the expiry order.
    expiry: BTreeSet<(u64, u64)>,
    revision: u64,
    next_lease_id: u64,
    history: VecDeque<Change>,
    /// Sum of [`Change::bytes`] over `history`.
    history_bytes: usize,
    /// Highest revision dropped from the history (0: none).
    compacted: u64,
}

impl DirectoryState {
    pub fn new(limits: Limits) -> DirectoryState {
        DirectoryState {
            limits,
            records: BTreeMap::new(),
            producers: 0,
            schemas: BTreeMap::new(),
            leases: BTreeMap::new(),
            expiry: BTreeSet::new(),
            revision: 0,
            next_lease_id: 1,
            history: VecDeque::new(),
            history_bytes: 0,
            compacted: 0,
        }
    }

    /// Rebuilds the state from storage. History that is not a contiguous run ending at the
    /// current revision, or longer than `limits.history_limit`, counts as compacted; the store
    /// deletes history at or below [`DirectoryState::compacted`] after loading.
    pub fn restore(limits: Limits, p: Persisted) -> Result<DirectoryState, DirError> {
        let mut s = DirectoryState::new(limits);
        s.revision = p.revision;
        s.next_lease_id = p.next_lease_id.max(1);
        for (id, ttl_ms, expires_at_ms) in p.leases {
            s.next_lease_id = s.next_lease_id.max(id.saturating_add(1));
            s.leases.insert(
                id,
                Lease {
                    ttl_ms,
                    expires_at_ms,
                    records: BTreeSet::new(),
                },
            );
            s.expiry.insert((expires_at_ms, id));
        }
        for schema in p.schemas {
            s.schemas.insert((schema.name.clone(), schema.version), schema);
        }
        for entry in p.records {
            let key = key_of(&entry).ok_or_else(|| DirError::Storage("a stored record is empty".into()))?;
            let lease = s.leases.get_mut(&entry.lease_id).ok_or_else(|| {
                DirError::Storage(format!(
                    "{} {} refers to missing lease {}; the data directory is inconsistent",
                    key.0, key.1, entry.lease_id
                ))
            })?;
            lease.records.insert(key.clone());
            s.revision = s.revision.max(entry.mod_revision);
            s.insert_record(key, entry);
        }
        // Leases never outlive their records; drop any that did (a crash cannot cause this,
        // since a command's keys are written in one batch, but stay safe).
        let empty: Vec<u64> = s
            .leases
            .iter()
            .filter(|(_, l)| l.records.is_empty())
            .map(|(id, _)| *id)
            .collect();
        for id in empty {
            if let Some(l) = s.leases.remove(&id) {
                s.expiry.remove(&(l.expires_at_ms, id));
            }
        }
        let mut history = p.history;
        history.sort_by_key(|c| c.revision);
        // Keep only the contiguous run ending at the current revision.
        let mut start = history.len();
        while start > 0 && history[start - 1].revision + (history.len() - start) as u64 == s.revision {
            start -= 1;
        }
        s.history = history.into_iter().skip(start).collect();
        s.history_bytes = s.history.iter().map(Change::bytes).sum();
        s.compacted = match s.history.front() {
            Some(first) => p.compacted.max(first.revision.saturating_sub(1)),
            None => p.compacted.max(s.revision),
        };
        s.trim_history(&mut Effects::default());
        Ok(s)
    }

    /// Everything [`DirectoryState::restore`] needs to rebuild this state: its exact inverse
    /// (`restore(limits, s.export())` behaves like `s`). Records, schemas and leases in key
    /// order, history in revision order.
    pub fn export(&self) -> Persisted {
        Persisted {
            records: self.records.values().cloned().collect(),
            schemas: self.schemas.values().cloned().collect(),
            leases: self
                .leases
                .iter()
                .map(|(id, l)| (*id, l.ttl_ms, l.expires_at_ms))
                .collect(),
            history: self.history.iter().cloned().collect(),
            revision: self.revision,
            next_lease_id: self.next_lease_id,
            compacted: self.compacted,
        }
    }

    /// Applies one command. On error the state is unchanged.
    pub fn apply(&mut self, cmd: Command) -> Result<Applied, DirError> {
        match cmd {
            Command::Register {
                record,
                schemas,
                lease_id,
                ttl_ms,
                now_ms,
            } => self.register(record, schemas, lease_id, ttl_ms, now_ms),
            Command::Update {
                record,
                schemas,
                ttl_ms,
                now_ms,
            } => self.update(record, schemas, ttl_ms, now_ms),
            Command::Remove { kind, id } => self.remove(kind, id),
            Command::Batch(_) => Err(DirError::invalid_argument(
                "a batch is applied command by command by the raft state machine",
            )),
            Command::KeepAlive {
                lease_id,
                now_ms,
                checked,
            } => {
                if let Some(ok) = checked {
                    let unchecked = self
                        .lease_record_ids(lease_id)
                        .into_iter()
                        .find(|id| !ok.contains(id));
                    if let Some(id) = unchecked {
                        return Err(DirError::unavailable(format!(
                            "lease {lease_id} holds {id:?}, which the member that took this renewal had not seen when it authorized it: retry"
                        )));
                    }
                }
                Ok(self.keep_alive(lease_id, now_ms))
            }
            Command::Expire { now_ms } => Ok(self.expire(now_ms)),
            Command::ExtendAll { now_ms } => Ok(self.extend_all(now_ms)),
        }
    }

    fn register(
        &mut self,
        record: pb::Record,
        schemas: Vec<pb::EventSchema>,
        lease_id: u64,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<Applied, DirError> {
        let (kind, body) = validate::record(Some(&record))?;
        let key = (kind, id_of(body).to_string());
        if self.records.contains_key(&key) {
            return Err(DirError::already_exists(format!(
                "{kind} {} is already registered: use Update to change it, or Remove it first",
                key.1
            )));
        }
        self.check_schemas(body, &schemas)?;
        if self.records.len() >= self.limits.max_records {
            return Err(DirError::resource_exhausted(format!(
                "the directory is full ({} records, max_records): remove stale records or raise max_records",
                self.records.len()
            )));
        }
        let existing_ttl = if lease_id == 0 {
            if ttl_ms == 0 {
                return Err(DirError::invalid_argument("lease ttl must be greater than 0"));
            }
            None
        } else {
            match self.leases.get(&lease_id) {
                Some(l) if l.expires_at_ms > now_ms => Some(l.ttl_ms),
                _ => {
                    return Err(DirError::not_found(format!(
                        "lease {lease_id} does not exist or has expired: register without a lease id"
                    )))
                }
            }
        };

        let mut applied = Applied::default();
        self.add_schemas(schemas, &mut applied);
        let (lease_id, ttl_ms) = match existing_ttl {
            Some(ttl) => (lease_id, ttl),
            None => (self.grant(ttl_ms, now_ms, &mut applied), ttl_ms),
        };
        self.attach(lease_id, &key);
        let revision = self.next_revision();
        let entry = pb::RecordEntry {
            record: Some(record),
            lease_id,
            create_revision: revision,
            mod_revision: revision,
        };
        self.insert_record(key, entry.clone());
        self.push_change(revision, ChangeKind::Put, entry, "", &mut applied);
        applied.lease_id = lease_id;
        applied.ttl_ms = ttl_ms;
        applied.revision = self.revision;
        Ok(applied)
    }

    fn update(
        &mut self,
        record: pb::Record,
        schemas: Vec<pb::EventSchema>,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<Applied, DirError> {
        let (kind, body) = validate::record(Some(&record))?;
        let key = (kind, id_of(body).to_string());
        let Some(old) = self.records.get(&key) else {
            return Err(DirError::not_found(format!("no {kind} record with id {}", key.1)));
        };
        let (old_lease, create_revision) = (old.lease_id, old.create_revision);
        self.check_schemas(body, &schemas)?;

        let mut applied = Applied::default();
        self.add_schemas(schemas, &mut applied);
        let lease_id = if ttl_ms > 0 {
            let new = self.grant(ttl_ms, now_ms, &mut applied);
            self.detach(old_lease, &key, &mut applied);
            self.attach(new, &key);
            new
        } else {
            old_lease
        };
        let revision = self.next_revision();
        let entry = pb::RecordEntry {
            record: Some(record),
            lease_id,
            create_revision,
            mod_revision: revision,
        };
        self.insert_record(key, entry.clone());
        self.push_change(revision, ChangeKind::Put, entry, "", &mut applied);
        applied.lease_id = lease_id;
        applied.ttl_ms = self.leases.get(&lease_id).map_or(0, |l| l.ttl_ms);
        applied.revision = self.revision;
        Ok(applied)
    }

    fn remove(&mut self, kind: Kind, id: String) -> Result<Applied, DirError> {
        validate::id(kind, &id)?;
        let key = (kind, id);
        let Some(entry) = self.remove_record(&key) else {
            return Err(DirError::not_found(format!("no {kind} record with id {}", key.1)));
        };
        let mut applied = Applied::default();
        self.detach(entry.lease_id, &key, &mut applied);
        let revision = self.next_revision();
        self.push_change(revision, ChangeKind::Delete, entry, REASON_REMOVED, &mut applied);
        applied.revision = self.revision;
        Ok(applied)
    }

    fn keep_alive(&mut self, lease_id: u64, now_ms: u64) -> Applied {
        let mut applied = Applied {
            lease_id,
            revision: self.revision,
            ..Applied::default()
        };
        if let Some(l) = self.leases.get_mut(&lease_id) {
            if l.expires_at_ms > now_ms {
                let renewed = l.expires_at_ms.max(now_ms.saturating_add(l.ttl_ms));
                self.expiry.remove(&(l.expires_at_ms, lease_id));
                self.expiry.insert((renewed, lease_id));
                l.expires_at_ms = renewed;
                applied.ttl_ms = l.ttl_ms;
            }
        }
        applied
    }

    fn expire(&mut self, now_ms: u64) -> Applied {
        let mut applied = Applied::default();
        let due: Vec<(u64, u64)> = self
            .expiry
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .copied()
            .collect();
        for (at, lease_id) in due {
            self.expiry.remove(&(at, lease_id));
            let Some(lease) = self.leases.remove(&lease_id) else {
                continue;
            };
            applied.effects.leases.push(lease_id);
            for key in lease.records {
                if let Some(entry) = self.remove_record(&key) {
                    let revision = self.next_revision();
                    self.push_change(revision, ChangeKind::Delete, entry, REASON_EXPIRED, &mut applied);
                }
            }
        }
        applied.revision = self.revision;
        applied
    }

    fn extend_all(&mut self, now_ms: u64) -> Applied {
        let mut expiry = BTreeSet::new();
        for (id, l) in self.leases.iter_mut() {
            l.expires_at_ms = l.expires_at_ms.max(now_ms.saturating_add(l.ttl_ms));
            expiry.insert((l.expires_at_ms, *id));
        }
        self.expiry = expiry;
        Applied {
            revision: self.revision,
            ..Applied::default()
        }
    }

    /// Checks the schemas sent with a record against the stored ones, and that every event a
    /// producer offers has a schema.
    fn check_schemas(&self, body: &Body, schemas: &[pb::EventSchema]) -> Result<(), DirError> {
        validate::schemas(schemas)?;
        for s in schemas {
            if let Some(old) = self.schemas.get(&(s.name.clone(), s.version)) {
                if !same_definition(old, s) {
                    let next = self
                        .latest_schema(&s.name)
                        .map_or(s.version, |l| l.version)
                        .saturating_add(1);
                    return Err(DirError::already_exists(format!(
                        "schema {} version {} exists with different fields; register it as version {next}",
                        s.name, s.version
                    )));
                }
            }
        }
        if let Body::Producer(p) = body {
            let sent: HashSet<&str> = schemas.iter().map(|s| s.name.as_str()).collect();
            if let Some(e) = p
                .events
                .iter()
                .find(|e| !sent.contains(e.as_str()) && self.latest_schema(e).is_none())
            {
                return Err(DirError::invalid_argument(format!(
                    "event {e} has no schema: send it in schemas"
                )));
            }
        }
        Ok(())
    }

    fn add_schemas(&mut self, schemas: Vec<pb::EventSchema>, applied: &mut Applied) {
        for s in schemas {
            let key = (s.name.clone(), s.version);
            if let std::collections::btree_map::Entry::Vacant(slot) = self.schemas.entry(key.clone()) {
                slot.insert(s);
                applied.effects.schemas.push(key);
            }
        }
    }

    fn grant(&mut self, ttl_ms: u64, now_ms: u64, applied: &mut Applied) -> u64 {
        let id = self.next_lease_id;
        self.next_lease_id += 1;
        let expires_at_ms = now_ms.saturating_add(ttl_ms);
        self.leases.insert(
            id,
            Lease {
                ttl_ms,
                expires_at_ms,
                records: BTreeSet::new(),
            },
        );
        self.expiry.insert((expires_at_ms, id));
        applied.effects.leases.push(id);
        id
    }

    fn attach(&mut self, lease_id: u64, key: &RecordKey) {
        if let Some(l) = self.leases.get_mut(&lease_id) {
            l.records.insert(key.clone());
        }
    }

    /// Detaches a record from its lease and revokes the lease once it holds nothing.
    fn detach(&mut self, lease_id: u64, key: &RecordKey, applied: &mut Applied) {
        let Some(l) = self.leases.get_mut(&lease_id) else {
            return;
        };
        l.records.remove(key);
        if l.records.is_empty() {
            self.expiry.remove(&(l.expires_at_ms, lease_id));
            self.leases.remove(&lease_id);
            applied.effects.leases.push(lease_id);
        }
    }

    fn insert_record(&mut self, key: RecordKey, entry: pb::RecordEntry) {
        let kind = key.0;
        if self.records.insert(key, entry).is_none() && kind == Kind::Producer {
            self.producers += 1;
        }
    }

    fn remove_record(&mut self, key: &RecordKey) -> Option<pb::RecordEntry> {
        let entry = self.records.remove(key)?;
        if key.0 == Kind::Producer {
            self.producers -= 1;
        }
        Some(entry)
    }

    fn next_revision(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    fn push_change(
        &mut self,
        revision: u64,
        kind: ChangeKind,
        entry: pb::RecordEntry,
        reason: &str,
        applied: &mut Applied,
    ) {
        let change = Change {
            revision,
            kind,
            entry,
            reason: reason.to_string(),
        };
        self.history_bytes += change.bytes();
        self.history.push_back(change.clone());
        applied.changes.push(change);
        self.trim_history(&mut applied.effects);
    }

    /// Drops the oldest changes while the history holds more than `history_limit` changes or
    /// `history_bytes` bytes (a single change larger than that is dropped too: the live watchers
    /// got it; a resume from it answers OUT_OF_RANGE).
    fn trim_history(&mut self, effects: &mut Effects) {
        while self.history.len() > self.limits.history_limit || self.history_bytes > self.limits.history_bytes
        {
            let Some(old) = self.history.pop_front() else {
                break;
            };
            self.history_bytes = self.history_bytes.saturating_sub(old.bytes());
            self.compacted = old.revision;
            let start = effects.compacted.as_ref().map_or(old.revision, |r| *r.start());
            effects.compacted = Some(start..=old.revision);
        }
    }

    // ---- queries -------------------------------------------------------------------------

    /// The revision of the last change (0 for an empty directory).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The highest compacted revision; watches may resume from `compacted() + 1` on.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The history kept for Watch resumption: (changes, bytes counted against `history_bytes`).
    pub fn history_size(&self) -> (usize, usize) {
        (self.history.len(), self.history_bytes)
    }

    pub fn next_lease_id(&self) -> u64 {
        self.next_lease_id
    }

    /// Ids of the records held by a lease (empty for an unknown lease).
    pub fn lease_record_ids(&self, lease_id: u64) -> Vec<String> {
        self.leases
            .get(&lease_id)
            .map(|l| l.records.iter().map(|(_, id)| id.clone()).collect())
            .unwrap_or_default()
    }

    pub fn counts(&self) -> Counts {
        Counts {
            producers: self.producers as u64,
            consumers: (self.records.len() - self.producers) as u64,
            schemas: self.schemas.len() as u64,
            leases: self.leases.len() as u64,
        }
    }

    /// When the next lease expires, if any.
    pub fn next_expiry(&self) -> Option<u64> {
        self.expiry.first().map(|(at, _)| *at)
    }

    pub fn lease(&self, id: u64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub fn record(&self, kind: Kind, id: &str) -> Option<&pb::RecordEntry> {
        self.records.get(&(kind, id.to_string()))
    }

    pub fn schema(&self, name: &str, version: u32) -> Option<&pb::EventSchema> {
        self.schemas.get(&(name.to_string(), version))
    }

    fn latest_schema(&self, name: &str) -> Option<&pb::EventSchema> {
        self.schemas
            .range((name.to_string(), 0)..=(name.to_string(), u32::MAX))
            .next_back()
            .map(|(_, s)| s)
    }

    /// GetSchema: version 0 is the latest.
    pub fn get_schema(&self, name: &str, version: u32) -> Result<pb::EventSchema, DirError> {
        validate::schema_name(name)?;
        let Some(latest) = self.latest_schema(name) else {
            return Err(DirError::not_found(format!(
                "no schema named {name}: a producer registers it with its record"
            )));
        };
        if version == 0 {
            return Ok(latest.clone());
        }
        self.schema(name, version).cloned().ok_or_else(|| {
            DirError::not_found(format!(
                "schema {name} has no version {version}; the latest is {}",
                latest.version
            ))
        })
    }

    /// Search: one page of matching records in (kind, id) order.
    pub fn search(&self, q: &SearchQuery) -> pb::SearchResponse {
        let limit = if q.single { 1 } else { q.page_size };
        let start = match &q.after {
            Some(after) => Bound::Excluded(after.clone()),
            None => Bound::Unbounded,
        };
        let candidates: Box<dyn Iterator<Item = (&RecordKey, &pb::RecordEntry)>> = if q.id.is_empty() {
            Box::new(self.records.range((start, Bound::Unbounded)))
        } else {
            let after = q.after.clone();
            Box::new(
                [Kind::Producer, Kind::Consumer]
                    .into_iter()
                    .filter_map(|k| self.records.get_key_value(&(k, q.id.clone())))
                    .filter(move |(key, _)| after.as_ref().is_none_or(|a| *key > a)),
            )
        };
        let mut entries = Vec::new();
        let mut last = None;
        let mut more = false;
        for (key, entry) in candidates {
            if !q.matches(entry) {
                continue;
            }
            if entries.len() == limit {
                more = true;
                break;
            }
            entries.push(entry.clone());
            last = Some(key);
        }
        let next_page_token = match (more && !q.single, last) {
            (true, Some(key)) => encode_token(key),
            _ => String::new(),
        };
        pb::SearchResponse {
            entries,
            next_page_token,
            revision: self.revision,
        }
    }

    /// Every current record matching `filter` as a PUT at its mod revision, in (kind, id) order.
    pub fn snapshot(&self, filter: &RecordFilter) -> Vec<pb::WatchEvent> {
        self.records
            .values()
            .filter(|e| filter.matches(e))
            .map(|e| pb::WatchEvent {
                r#type: pb::WatchEventType::Put as i32,
                revision: e.mod_revision,
                entry: Some(e.clone()),
                reason: String::new(),
            })
            .collect()
    }

    /// Every retained change with revision >= `from` matching `filter`. OUT_OF_RANGE when
    /// changes at or after `from` were compacted away.
    pub fn changes_since(&self, from: u64, filter: &RecordFilter) -> Result<Vec<pb::WatchEvent>, DirError> {
        if from <= self.compacted {
            return Err(DirError::out_of_range(format!(
                "revision {from} was compacted; oldest available is {}; watch from 0 to re-list",
                self.compacted + 1
            )));
        }
        let start = self.history.partition_point(|c| c.revision < from);
        Ok(self
            .history
            .range(start..)
            .filter(|c| filter.matches(&c.entry))
            .map(Change::to_pb)
            .collect())
    }

    /// Iterates all records (for storage snapshots and tests).
    pub fn records(&self) -> impl Iterator<Item = &pb::RecordEntry> {
        self.records.values()
    }
}

/// Which records a Watch (and a Search) wants: a kind and an event-name pattern.
#[derive(Debug, Clone, Default)]
pub struct RecordFilter {
    pub kind: Option<Kind>,
    pub event: Option<Pattern>,
}

impl RecordFilter {
    /// From request fields: kind as the proto enum value, `""` pattern for any.
    pub fn new(kind: i32, event_pattern: &str) -> Result<RecordFilter, DirError> {
        let event = if event_pattern.is_empty() {
            None
        } else {
            Some(Pattern::event(event_pattern).map_err(|e| DirError::invalid_argument(e.to_string()))?)
        };
        Ok(RecordFilter {
            kind: Kind::from_pb(kind)?,
            event,
        })
    }

    /// A producer matches when one of its events matches the pattern; a consumer when one of
    /// its accepted patterns overlaps it.
    pub fn matches(&self, entry: &pb::RecordEntry) -> bool {
        let Some(body) = body_of(entry) else {
            return false;
        };
        if self.kind.is_some_and(|k| k != Kind::of(body)) {
            return false;
        }
        match (&self.event, body) {
            (None, _) => true,
            (Some(p), Body::Producer(r)) => r.events.iter().any(|e| p.matches(e)),
            (Some(p), Body::Consumer(r)) => r.accepts.iter().any(|a| patterns_intersect(a, p.as_str())),
        }
    }
}

/// True when some name matches both glob patterns (`*` any run, `?` one character).
///
pub use gma_core::pattern::patterns_intersect;

/// A parsed Search request.
///
/// Source filter: `""` matches every record. Otherwise it is a source pattern and matches a
/// producer that lists a matching source; a producer with an empty sources list (sources not
/// advertised) and every consumer (which have no sources) do not match it.
#[derive(Debug, Clone, Default)]
pub struct SearchQuery {
    pub filter: RecordFilter,
    pub source: Option<Pattern>,
    pub id: String,
    pub site: String,
    pub attributes: Vec<(String, String)>,
    pub single: bool,
    pub page_size: usize,
    /// Resume after this key (from the page token).
    pub after: Option<RecordKey>,
}

impl SearchQuery {
    pub fn from_pb(req: &pb::SearchRequest) -> Result<SearchQuery, DirError> {
        let filter = RecordFilter::new(req.kind, &req.event_pattern)?;
        let source = if req.source.is_empty() {
            None
        } else {
            Some(Pattern::source(&req.source).map_err(|e| DirError::invalid_argument(e.to_string()))?)
        };
        let page_size = match req.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(decode_token(&req.page_token)?)
        };
        let mut attributes: Vec<(String, String)> = req
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        attributes.sort();
        Ok(SearchQuery {
            filter,
            source,
            id: req.id.clone(),
            site: req.site.clone(),
            attributes,
            single: req.single,
            page_size,
            after,
        })
    }

    pub fn matches(&self, entry: &pb::RecordEntry) -> bool {
        if !self.filter.matches(entry) {
            return false;
        }
        let Some(body) = body_of(entry) else {
            return false;
        };
        let (id, site, attrs): (&str, &str, &HashMap<String, String>) = match body {
            Body::Producer(p) => (&p.id, &p.site, &p.attributes),
            Body::Consumer(c) => (&c.id, &c.site, &c.attributes),
        };
        if !self.id.is_empty() && self.id != id {
            return false;
        }
        if !self.site.is_empty() && self.site != site {
            return false;
        }
        if !self.attributes.iter().all(|(k, v)| attrs.get(k) == Some(v)) {
            return false;
        }
        match (&self.source, body) {
            (None, _) => true,
            (Some(p), Body::Producer(r)) => r.sources.iter().any(|s| p.matches(s)),
            (Some(_), Body::Consumer(_)) => false,
        }
    }
}

/// Page tokens are the hex of the last returned key: kind tag byte, then the id.
fn encode_token(key: &RecordKey) -> String {
    let mut out = String::with_capacity(2 + 2 * key.1.len());
    for b in std::iter::once(key.0.tag()).chain(key.1.bytes()) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

fn decode_token(token: &str) -> Result<RecordKey, DirError> {
    let bad = || {
        DirError::invalid_argument(
            "invalid page_token: pass next_page_token from the previous response unchanged",
        )
    };
    let pairs = token.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() || token.len() > 2 * 512 {
        return Err(bad());
    }
    let bytes = pairs
        .map(|h| {
            let h = std::str::from_utf8(h)
                .ok()
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))?;
            u8::from_str_radix(h, 16).ok()
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    let (tag, id) = bytes.split_first().ok_or_else(bad)?;
    let kind = Kind::from_tag(*tag).ok_or_else(bad)?;
    let id = String::from_utf8(id.to_vec()).map_err(|_| bad())?;
    Ok((kind, id))
}

/// Serde for prost messages: their protobuf encoding, as bytes.
pub(crate) mod proto_serde {
    use std::fmt;
    use std::marker::PhantomData;

    use prost::Message;
    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use serde::ser::Serializer;
    use serde::{Deserialize, Serialize};

    pub fn serialize<T: Message, S: Serializer>(msg: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&msg.encode_to_vec())
    }

    pub fn deserialize<'de, T: Message + Default, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        let bytes = d.deserialize_byte_buf(BytesVisitor)?;
        T::decode(bytes.as_slice()).map_err(de::Error::custom)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("protobuf bytes")
        }

        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }

    struct Wrap<T>(T);

    impl<T: Message> Serialize for Wrap<&T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            serialize(self.0, s)
        }
    }

    impl<'de, T: Message + Default> Deserialize<'de> for Wrap<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            deserialize(d).map(Wrap)
        }
    }

    pub mod vec {
        use super::*;

        pub fn serialize<T: Message, S: Serializer>(list: &[T], s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(list.iter().map(Wrap))
        }

        pub fn deserialize<'de, T: Message + Default, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<T>, D::Error> {
            struct SeqVisitor<T>(PhantomData<T>);
            impl<'de, T: Message + Default> Visitor<'de> for SeqVisitor<T> {
                type Value = Vec<T>;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a list of protobuf messages")
                }

                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
                    let mut out = Vec::new();
                    while let Some(Wrap(m)) = seq.next_element::<Wrap<T>>()? {
                        out.push(m);
                    }
                    Ok(out)
                }
            }
            d.deserialize_seq(SeqVisitor(PhantomData))
        }
    }
}

#[cfg(test)]
mod tests;
