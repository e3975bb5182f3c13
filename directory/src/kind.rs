//! The two kinds of directory records (producer, consumer): what the state machine, the
//! validation and the raft log codec all name.

use gma_core::Refuse;
use std::fmt;

use gma_proto::v1::{self as pb, record::Record as Body};
use serde::{Deserialize, Serialize};

use crate::error::DirError;

/// The two kinds of records. Ordered producer first: Search results sort by (kind, id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    Producer,
    Consumer,
}

impl Kind {
    pub fn of(body: &Body) -> Kind {
        match body {
            Body::Producer(_) => Kind::Producer,
            Body::Consumer(_) => Kind::Consumer,
        }
    }

    /// The kind of a request field: `None` for RECORD_KIND_UNSPECIFIED (any).
    pub fn from_pb(kind: i32) -> Result<Option<Kind>, DirError> {
        match pb::RecordKind::try_from(kind) {
            Ok(pb::RecordKind::Unspecified) => Ok(None),
            Ok(pb::RecordKind::Producer) => Ok(Some(Kind::Producer)),
            Ok(pb::RecordKind::Consumer) => Ok(Some(Kind::Consumer)),
            Err(_) => Err(DirError::invalid_argument(format!(
                "unknown record kind {kind}: use RECORD_KIND_PRODUCER (1) or RECORD_KIND_CONSUMER (2)"
            ))),
        }
    }

    pub fn to_pb(self) -> pb::RecordKind {
        match self {
            Kind::Producer => pb::RecordKind::Producer,
            Kind::Consumer => pb::RecordKind::Consumer,
        }
    }

    /// One-byte tag used in storage keys and page tokens.
    pub(crate) fn tag(self) -> u8 {
        match self {
            Kind::Producer => 1,
            Kind::Consumer => 2,
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Option<Kind> {
        match tag {
            1 => Some(Kind::Producer),
            2 => Some(Kind::Consumer),
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Producer => "producer",
            Kind::Consumer => "consumer",
        })
    }
}
