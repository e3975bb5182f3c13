//! The raft log's records on disk: openraft entries as protobuf (`gma.raft.v1.LogEntry`), and
//! votes, log ids and log operations in a fixed little-endian layout. One tag byte first.
//!
//! | tag | record      | body                                                               |
//! |-----|-------------|--------------------------------------------------------------------|
//! | 1   | entry       | `LogEntry` (protobuf)                                              |
//! | 2   | vote        | term u64, node u64, committed u8                                   |
//! | 3   | committed   | log id option                                                      |
//! | 4   | truncate    | index u64: entries from it on are gone                             |
//! | 5   | purge       | log id: entries up to it are gone, it is the last purged           |
//! | 6   | state       | vote option, committed option, last purged option (segment start)  |
//!
//! A log id option is one byte (0 none, 1 some) then term u64, node u64, index u64.

use std::collections::{BTreeMap, BTreeSet};

use gma_proto::raft as rpb;
use openraft::{CommittedLeaderId, Entry, EntryPayload, Membership, Vote};
use prost::Message;

use super::types::{LogId, Node, NodeId, TypeConfig};
use crate::state::{Command, Kind};

/// Why a log record does not decode (the storage reports it with the record's position as a
/// [`crate::error::DirError::Storage`]).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("empty record")]
    Empty,
    #[error("record cut short")]
    CutShort,
    #[error("{0} trailing bytes")]
    Trailing(usize),
    #[error("unknown record tag {0}")]
    Tag(u8),
    /// A flag byte outside its values (`what`: log id flag, vote flag, vote option).
    #[error("bad {0} {1}")]
    Flag(&'static str, u8),
    /// A part the record must have is missing (`what` names it).
    #[error("{0}")]
    Missing(&'static str),
    #[error("entry: {0}")]
    Entry(#[from] prost::DecodeError),
    #[error("remove of unknown record kind {0}")]
    Kind(i32),
}

pub const T_ENTRY: u8 = 1;
pub const T_VOTE: u8 = 2;
pub const T_COMMITTED: u8 = 3;
pub const T_TRUNCATE: u8 = 4;
pub const T_PURGE: u8 = 5;
pub const T_STATE: u8 = 6;

/// A decoded log record.
#[derive(Debug, Clone, PartialEq)]
pub enum LogRecord {
    Entry(Entry<TypeConfig>),
    Vote(Vote<NodeId>),
    Committed(Option<LogId>),
    Truncate(u64),
    Purge(LogId),
    State {
        vote: Option<Vote<NodeId>>,
        committed: Option<LogId>,
        purged: Option<LogId>,
    },
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_log_id(out: &mut Vec<u8>, id: Option<&LogId>) {
    match id {
        None => out.push(0),
        Some(id) => {
            out.push(1);
            put_u64(out, id.leader_id.term);
            put_u64(out, id.leader_id.node_id);
            put_u64(out, id.index);
        }
    }
}

fn put_vote(out: &mut Vec<u8>, v: &Vote<NodeId>) {
    put_u64(out, v.leader_id.term);
    put_u64(out, v.leader_id.node_id);
    out.push(v.committed as u8);
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], RecordError> {
        if self.b.len() < n {
            return Err(RecordError::CutShort);
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, RecordError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn log_id(&mut self) -> Result<Option<LogId>, RecordError> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let (term, node, index) = (self.u64()?, self.u64()?, self.u64()?);
                Ok(Some(LogId::new(CommittedLeaderId::new(term, node), index)))
            }
            t => Err(RecordError::Flag("log id flag", t)),
        }
    }

    fn vote(&mut self) -> Result<Vote<NodeId>, RecordError> {
        let (term, node) = (self.u64()?, self.u64()?);
        Ok(match self.u8()? {
            0 => Vote::new(term, node),
            1 => Vote::new_committed(term, node),
            c => return Err(RecordError::Flag("vote flag", c)),
        })
    }

    fn end(&self) -> Result<(), RecordError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(RecordError::Trailing(self.b.len()))
        }
    }
}

impl LogRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            LogRecord::Entry(e) => {
                out.push(T_ENTRY);
                entry_to_pb(e).encode(&mut out).unwrap_or_default();
            }
            LogRecord::Vote(v) => {
                out.push(T_VOTE);
                put_vote(&mut out, v);
            }
            LogRecord::Committed(c) => {
                out.push(T_COMMITTED);
                put_log_id(&mut out, c.as_ref());
            }
            LogRecord::Truncate(i) => {
                out.push(T_TRUNCATE);
                put_u64(&mut out, *i);
            }
            LogRecord::Purge(id) => {
                out.push(T_PURGE);
                put_log_id(&mut out, Some(id));
            }
            LogRecord::State {
                vote,
                committed,
                purged,
            } => {
                out.push(T_STATE);
                match vote {
                    None => out.push(0),
                    Some(v) => {
                        out.push(1);
                        put_vote(&mut out, v);
                    }
                }
                put_log_id(&mut out, committed.as_ref());
                put_log_id(&mut out, purged.as_ref());
            }
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<LogRecord, RecordError> {
        let (&tag, body) = b.split_first().ok_or(RecordError::Empty)?;
        let mut r = Reader { b: body };
        let rec = match tag {
            T_ENTRY => {
                let m = rpb::LogEntry::decode(body)?;
                return entry_from_pb(m).map(LogRecord::Entry);
            }
            T_VOTE => LogRecord::Vote(r.vote()?),
            T_COMMITTED => LogRecord::Committed(r.log_id()?),
            T_TRUNCATE => LogRecord::Truncate(r.u64()?),
            T_PURGE => LogRecord::Purge(
                r.log_id()?
                    .ok_or(RecordError::Missing("purge without a log id"))?,
            ),
            T_STATE => {
                let vote = match r.u8()? {
                    0 => None,
                    1 => Some(r.vote()?),
                    f => return Err(RecordError::Flag("vote option", f)),
                };
                LogRecord::State {
                    vote,
                    committed: r.log_id()?,
                    purged: r.log_id()?,
                }
            }
            t => return Err(RecordError::Tag(t)),
        };
        r.end()?;
        Ok(rec)
    }
}

fn entry_to_pb(e: &Entry<TypeConfig>) -> rpb::LogEntry {
    use rpb::log_entry::Payload;
    let payload = match &e.payload {
        EntryPayload::Blank => Payload::Blank(rpb::Blank {}),
        EntryPayload::Membership(m) => Payload::Membership(rpb::Membership {
            configs: m
                .get_joint_config()
                .iter()
                .map(|s| rpb::VoterSet {
                    voters: s.iter().copied().collect(),
                })
                .collect(),
            nodes: m
                .nodes()
                .map(|(id, n)| rpb::Member {
                    id: *id,
                    rpc_addr: n.rpc_addr.clone(),
                    api_addr: n.api_addr.clone(),
                })
                .collect(),
        }),
        EntryPayload::Normal(c) => Payload::Command(command_to_pb(c)),
    };
    rpb::LogEntry {
        term: e.log_id.leader_id.term,
        leader: e.log_id.leader_id.node_id,
        index: e.log_id.index,
        payload: Some(payload),
    }
}

fn entry_from_pb(m: rpb::LogEntry) -> Result<Entry<TypeConfig>, RecordError> {
    use rpb::log_entry::Payload;
    let log_id = LogId::new(CommittedLeaderId::new(m.term, m.leader), m.index);
    let payload = match m.payload.ok_or(RecordError::Missing("entry without payload"))? {
        Payload::Blank(_) => EntryPayload::Blank,
        Payload::Membership(mm) => {
            let configs: Vec<BTreeSet<NodeId>> = mm
                .configs
                .into_iter()
                .map(|s| s.voters.into_iter().collect())
                .collect();
            let nodes: BTreeMap<NodeId, Node> = mm
                .nodes
                .into_iter()
                .map(|n| {
                    (
                        n.id,
                        Node {
                            rpc_addr: n.rpc_addr,
                            api_addr: n.api_addr,
                        },
                    )
                })
                .collect();
            EntryPayload::Membership(Membership::new(configs, nodes))
        }
        Payload::Command(c) => EntryPayload::Normal(command_from_pb(c)?),
    };
    Ok(Entry { log_id, payload })
}

fn command_to_pb(c: &Command) -> rpb::Command {
    use rpb::command::Command as C;
    let c = match c.clone() {
        Command::Register {
            record,
            schemas,
            lease_id,
            ttl_ms,
            now_ms,
        } => C::Register(rpb::Register {
            record: Some(record),
            schemas,
            lease_id,
            ttl_ms,
            now_ms,
        }),
        Command::Update {
            record,
            schemas,
            ttl_ms,
            now_ms,
        } => C::Update(rpb::Update {
            record: Some(record),
            schemas,
            ttl_ms,
            now_ms,
        }),
        Command::Remove { kind, id } => C::Remove(rpb::Remove {
            kind: kind.to_pb() as i32,
            id,
        }),
        Command::KeepAlive {
            lease_id,
            now_ms,
            checked,
        } => C::KeepAlive(rpb::KeepAlive {
            lease_id,
            now_ms,
            checked: checked.map(|ids| rpb::CheckedIds { ids }),
        }),
        Command::Expire { now_ms } => C::Expire(rpb::Expire { now_ms }),
        Command::ExtendAll { now_ms } => C::ExtendAll(rpb::ExtendAll { now_ms }),
        Command::Batch(cs) => C::Batch(rpb::Batch {
            commands: cs.iter().map(command_to_pb).collect(),
        }),
    };
    rpb::Command { command: Some(c) }
}

fn command_from_pb(c: rpb::Command) -> Result<Command, RecordError> {
    use rpb::command::Command as C;
    Ok(
        match c.command.ok_or(RecordError::Missing("command without a body"))? {
            C::Register(r) => Command::Register {
                record: r
                    .record
                    .ok_or(RecordError::Missing("register without a record"))?,
                schemas: r.schemas,
                lease_id: r.lease_id,
                ttl_ms: r.ttl_ms,
                now_ms: r.now_ms,
            },
            C::Update(u) => Command::Update {
                record: u.record.ok_or(RecordError::Missing("update without a record"))?,
                schemas: u.schemas,
                ttl_ms: u.ttl_ms,
                now_ms: u.now_ms,
            },
            C::Remove(r) => Command::Remove {
                kind: match Kind::from_pb(r.kind) {
                    Ok(Some(k)) => k,
                    _ => return Err(RecordError::Kind(r.kind)),
                },
                id: r.id,
            },
            C::KeepAlive(k) => Command::KeepAlive {
                lease_id: k.lease_id,
                now_ms: k.now_ms,
                checked: k.checked.map(|c| c.ids),
            },
            C::Expire(e) => Command::Expire { now_ms: e.now_ms },
            C::ExtendAll(e) => Command::ExtendAll { now_ms: e.now_ms },
            C::Batch(b) => Command::Batch(
                b.commands
                    .into_iter()
                    .map(command_from_pb)
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        },
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gma_proto::v1::{self as pb, record::Record as Body};

    fn id(t: u64, n: u64, i: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(t, n), i)
    }

    #[test]
    fn every_record_round_trips_and_garbage_is_an_error() {
        let node = |a: &str| Node {
            rpc_addr: a.into(),
            api_addr: a.into(),
        };
        let record = pb::Record {
            record: Some(Body::Producer(pb::ProducerRecord {
                id: "p1".into(),
                address: "http://127.0.0.1:1".into(),
                events: vec!["host.cpu".into()],
                ..Default::default()
            })),
        };
        let cmds = vec![
            Command::Register {
                record: record.clone(),
                schemas: vec![],
                lease_id: 3,
                ttl_ms: 10_000,
                now_ms: 7,
            },
            Command::Update {
                record,
                schemas: vec![],
                ttl_ms: 0,
                now_ms: 8,
            },
            Command::Remove {
                kind: Kind::Consumer,
                id: "c".into(),
            },
            Command::KeepAlive {
                lease_id: 1,
                now_ms: 2,
                checked: Some(vec!["a".into()]),
            },
            Command::KeepAlive {
                lease_id: 1,
                now_ms: 2,
                checked: None,
            },
            Command::Expire { now_ms: 9 },
            Command::ExtendAll { now_ms: 10 },
            Command::Batch(vec![
                Command::Expire { now_ms: 1 },
                Command::ExtendAll { now_ms: 2 },
            ]),
        ];
        let mut recs: Vec<LogRecord> = cmds
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                LogRecord::Entry(Entry {
                    log_id: id(2, 1, i as u64),
                    payload: EntryPayload::Normal(c),
                })
            })
            .collect();
        recs.push(LogRecord::Entry(Entry {
            log_id: id(1, 1, 0),
            payload: EntryPayload::Blank,
        }));
        recs.push(LogRecord::Entry(Entry {
            log_id: id(1, 1, 1),
            payload: EntryPayload::Membership(Membership::new(
                vec![BTreeSet::from([1, 2]), BTreeSet::from([2, 3])],
                BTreeMap::from([
                    (1, node("a:1")),
                    (2, node("b:2")),
                    (3, node("c:3")),
                    (4, node("d:4")),
                ]),
            )),
        }));
        recs.extend([
            LogRecord::Vote(Vote::new(3, 2)),
            LogRecord::Vote(Vote::new_committed(4, 1)),
            LogRecord::Committed(None),
            LogRecord::Committed(Some(id(4, 1, 99))),
            LogRecord::Truncate(17),
            LogRecord::Purge(id(1, 1, 5)),
            LogRecord::State {
                vote: Some(Vote::new_committed(4, 1)),
                committed: Some(id(4, 1, 9)),
                purged: None,
            },
            LogRecord::State {
                vote: None,
                committed: None,
                purged: Some(id(1, 1, 5)),
            },
        ]);
        for r in recs {
            let b = r.encode();
            assert_eq!(LogRecord::decode(&b).unwrap(), r);
            if !matches!(r, LogRecord::Entry(_)) {
                for cut in 0..b.len() {
                    assert!(LogRecord::decode(&b[..cut]).is_err(), "{r:?} cut at {cut}");
                }
                let mut long = b.clone();
                long.push(0);
                assert!(LogRecord::decode(&long).is_err());
            }
        }
        assert!(LogRecord::decode(&[99]).is_err());
        assert!(LogRecord::decode(&[T_ENTRY, 0xff, 0xff]).is_err());
    }
}
