//! The on-disk layout: sled keys, the stream dictionary entry and the chunk index value.

use gma_consumer::stream::ResumePoint;
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::chunk::ChunkReader;

pub(super) const K_STREAM: u8 = b'S';
pub(super) const K_CHUNK: u8 = b'C';
pub(super) const K_RESUME: u8 = b'R';
pub(super) const META_FORMAT: &[u8] = b"Mformat";
pub(super) const META_NEXT_WAL: &[u8] = b"Mnext_wal";
pub(super) const META_APPLIED: &[u8] = b"Mapplied";
pub(super) const META_OLDEST: &[u8] = b"Moldest";
/// Store format version (`Mformat`): 3 = chunks in the chunk log, sled the index.
pub(super) const FORMAT: u64 = 3;

/// A stream's persisted dictionary entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct StreamMeta {
    pub(super) id: u32,
    pub(super) name: String,
    pub(super) source: String,
    pub(super) schema_version: u32,
    pub(super) fields: Vec<FieldMeta>,
    /// The last write-ahead record whose rows of this stream are (partly, see `sealed_rows`)
    /// inside sealed chunks; 0 = none (records start at 1).
    pub(super) sealed_wal: u64,
    /// Of record `sealed_wal`, how many rows of this stream are sealed.
    #[serde(default)]
    pub(super) sealed_rows: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct FieldMeta {
    pub(super) name: String,
    #[serde(rename = "type")]
    pub(super) kind: FieldKind,
    #[serde(default)]
    pub(super) unit: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum FieldKind {
    Double,
    String,
}

/// In-memory figures of a sealed chunk, and where it lies (index value in sled).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ChunkMeta {
    pub(super) min_ts: i64,
    pub(super) max_ts: i64,
    pub(super) rows: u32,
    pub(super) bytes: u32,
    /// (chunk-log segment, byte offset) once durable; `None` while pending.
    pub(super) loc: Option<(u64, u64)>,
}

impl ChunkMeta {
    /// The sled index value: segment, offset, bytes, min_ts, max_ts, rows (LE).
    pub(super) fn encode(&self) -> Option<[u8; 40]> {
        let (seg, off) = self.loc?;
        let mut v = [0u8; 40];
        v[0..8].copy_from_slice(&seg.to_le_bytes());
        v[8..16].copy_from_slice(&off.to_le_bytes());
        v[16..20].copy_from_slice(&self.bytes.to_le_bytes());
        v[20..28].copy_from_slice(&self.min_ts.to_le_bytes());
        v[28..36].copy_from_slice(&self.max_ts.to_le_bytes());
        v[36..40].copy_from_slice(&self.rows.to_le_bytes());
        Some(v)
    }

    pub(super) fn decode(v: &[u8]) -> Option<ChunkMeta> {
        if v.len() != 40 {
            return None;
        }
        let u64_at = |i: usize| v[i..i + 8].try_into().ok().map(u64::from_le_bytes);
        let u32_at = |i: usize| v[i..i + 4].try_into().ok().map(u32::from_le_bytes);
        Some(ChunkMeta {
            loc: Some((u64_at(0)?, u64_at(8)?)),
            bytes: u32_at(16)?,
            min_ts: u64_at(20)? as i64,
            max_ts: u64_at(28)? as i64,
            rows: u32_at(36)?,
        })
    }
}

pub(super) fn encode_meta(m: &StreamMeta) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(m).map_err(|e| StoreError::Storage(format!("stream entry: {e}")))
}

/// The figures of a chunk from its bytes (no location).
pub(super) fn figures(bytes: &[u8]) -> Result<ChunkMeta, StoreError> {
    let r = ChunkReader::new(bytes)?;
    Ok(ChunkMeta {
        min_ts: r.min_ts(),
        max_ts: r.max_ts(),
        rows: r.rows() as u32,
        bytes: bytes.len() as u32,
        loc: None,
    })
}

// ---- keys ----

pub(super) fn ts_key(ts: i64) -> u64 {
    (ts as u64) ^ (1 << 63)
}

pub(super) fn ts_of_key(k: u64) -> i64 {
    (k ^ (1 << 63)) as i64
}

pub(super) fn stream_key(name: &str, source: &str, version: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + source.len() + 7);
    k.push(K_STREAM);
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(source.as_bytes());
    k.push(0);
    k.extend_from_slice(&version.to_be_bytes());
    k
}

pub(super) fn chunk_key(sid: u32, tk: u64, ctr: u32) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = K_CHUNK;
    k[1..5].copy_from_slice(&ctr.to_be_bytes());
    k[5..9].copy_from_slice(&sid.to_be_bytes());
    k[9..17].copy_from_slice(&tk.to_be_bytes());
    k
}

pub(super) fn parse_chunk_key(k: &[u8]) -> Option<(u32, u64, u32)> {
    if k.len() != 17 || k[0] != K_CHUNK {
        return None;
    }
    Some((
        u32::from_be_bytes(k[5..9].try_into().ok()?),
        u64::from_be_bytes(k[9..17].try_into().ok()?),
        u32::from_be_bytes(k[1..5].try_into().ok()?),
    ))
}

pub(super) fn describe_chunk_key(k: &[u8]) -> String {
    match parse_chunk_key(k) {
        Some((sid, tk, ctr)) => format!("stream {sid} first_ts {} #{ctr}", ts_of_key(tk)),
        None => "(malformed key)".into(),
    }
}

pub(super) fn resume_key(producer: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(producer.len() + 1);
    k.push(K_RESUME);
    k.extend_from_slice(producer.as_bytes());
    k
}

pub(super) fn resume_value(r: ResumePoint) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&r.epoch.to_be_bytes());
    v[8..].copy_from_slice(&r.next_seq.to_be_bytes());
    v
}

pub(super) fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}
