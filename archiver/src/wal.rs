//! The archive's write-ahead log: append-only segment files beside the sled database.
//!
//! sled 0.34 does not give back the space of deleted keys for a long time (its segment
//! cleaner lags far behind a write-then-delete log), so the log that every append writes and
//! every checkpoint throws away lives in plain files instead: `wal/<first seq, 20 digits>.wal`.
//!
//! A record on disk is `len: u32 LE | crc32(seq ‖ payload): u32 LE | seq: u64 LE | payload`.
//! [`Wal::push`] only buffers; [`Wal::write_out`] writes the buffer to the current segment and
//! hands back a handle to `fsync` outside the store's lock. [`Wal::rotate`] starts a new
//! segment (at a checkpoint) and returns the old ones, which are deleted once the sled state
//! that covers them is durable. [`read_all`] reads every segment in order; a torn or corrupt
//! tail of a segment (a crash in the middle of a write) ends that segment's records.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Header bytes per record (length, checksum, sequence number).
pub const HEADER: usize = 16;
/// Largest payload accepted on reading (a corrupt length must not allocate gigabytes).
const MAX_PAYLOAD: usize = 256 << 20;

/// One record read back.
#[derive(Debug, PartialEq)]
pub struct Record {
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// What [`read_all`] found.
#[derive(Debug, Default)]
pub struct Recovered {
    pub records: Vec<Record>,
    /// Every segment file, oldest first.
    pub segments: Vec<PathBuf>,
    /// Total size of the segments.
    pub bytes: u64,
    /// Segments whose tail was torn or corrupt (the rest of that file was ignored).
    pub torn: Vec<PathBuf>,
}

/// The open log: one segment being appended to plus the older ones not yet checkpointed.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    file: File,
    path: PathBuf,
    buf: Vec<u8>,
    /// Older segments, deleted at the next checkpoint.
    older: Vec<PathBuf>,
}

fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}.wal"))
}

fn segments(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let is_segment = p.extension().is_some_and(|x| x == "wal")
            && p.file_stem()
                .and_then(|s| s.to_str())
                .is_some_and(|s| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()));
        if is_segment {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Reads every record of every segment in `dir` (created when missing), oldest first.
pub fn read_all(dir: &Path) -> io::Result<Recovered> {
    std::fs::create_dir_all(dir)?;
    let mut out = Recovered::default();
    for path in segments(dir)? {
        let mut bytes = Vec::new();
        File::open(&path)?.read_to_end(&mut bytes)?;
        out.bytes += bytes.len() as u64;
        let mut at = 0usize;
        while at < bytes.len() {
            let Some(h) = bytes.get(at..at + HEADER) else {
                out.torn.push(path.clone());
                break;
            };
            let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
            let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            let mut seq8 = [0u8; 8];
            seq8.copy_from_slice(&h[8..16]);
            let seq = u64::from_le_bytes(seq8);
            let payload = (len <= MAX_PAYLOAD)
                .then(|| bytes.get(at + HEADER..at + HEADER + len))
                .flatten();
            match payload {
                Some(p) if checksum(seq, p) == crc => {
                    out.records.push(Record {
                        seq,
                        payload: p.to_vec(),
                    });
                    at += HEADER + len;
                }
                _ => {
                    out.torn.push(path.clone());
                    break;
                }
            }
        }
        out.segments.push(path);
    }
    Ok(out)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Wal {
    /// Starts a new segment whose first record will be `first_seq`; `older` are the segments
    /// found on disk (kept until the next checkpoint).
    pub fn start(dir: &Path, first_seq: u64, older: Vec<PathBuf>) -> io::Result<Wal> {
        let path = segment_path(dir, first_seq);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        sync_dir(dir)?;
        let older = older.into_iter().filter(|p| *p != path).collect();
        Ok(Wal {
            dir: dir.to_path_buf(),
            file,
            path,
            buf: Vec::new(),
            older,
        })
    }

    /// Buffers one record; returns its size on disk.
    pub fn push(&mut self, seq: u64, payload: &[u8]) -> u64 {
        self.buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&checksum(seq, payload).to_le_bytes());
        self.buf.extend_from_slice(&seq.to_le_bytes());
        self.buf.extend_from_slice(payload);
        (HEADER + payload.len()) as u64
    }

    /// Writes the buffered records to the current segment (no fsync) and returns a handle on
    /// it to `sync_data` without holding the caller's lock.
    pub fn write_out(&mut self) -> io::Result<File> {
        if !self.buf.is_empty() {
            self.file.write_all(&self.buf)?;
            self.buf.clear();
        }
        self.file.try_clone()
    }

    /// Writes out the buffer, then starts a new segment for records from `next_seq` on.
    /// Returns a handle on the old segment (to fsync) and every segment that the next
    /// durable checkpoint makes obsolete.
    pub fn rotate(&mut self, next_seq: u64) -> io::Result<(File, Vec<PathBuf>)> {
        let old = self.write_out()?;
        let path = segment_path(&self.dir, next_seq);
        if path == self.path {
            // Nothing was appended since the segment started: keep using it.
            return Ok((old, std::mem::take(&mut self.older)));
        }
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        sync_dir(&self.dir)?;
        let mut obsolete = std::mem::take(&mut self.older);
        obsolete.push(std::mem::replace(&mut self.path, path));
        self.file = file;
        Ok((old, obsolete))
    }

    /// Writes out and fsyncs the buffer (tests simulating a crash right after it).
    #[cfg(test)]
    pub fn write_out_for_test(&self) {
        let mut f = self.file.try_clone().unwrap();
        f.write_all(&self.buf).unwrap();
        f.sync_data().unwrap();
    }

    /// Bytes of every segment file on disk (the buffer not included).
    pub fn bytes_on_disk(&self) -> u64 {
        std::iter::once(&self.path)
            .chain(&self.older)
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }
}

/// Deletes obsolete segments (after the state covering them was made durable).
pub fn remove(dir: &Path, obsolete: &[PathBuf]) -> io::Result<()> {
    for p in obsolete {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_across_segments_and_a_torn_tail_is_cut() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let r = read_all(dir).unwrap();
        assert!(r.records.is_empty() && r.segments.is_empty());
        let mut w = Wal::start(dir, 1, r.segments).unwrap();
        w.push(1, b"one");
        w.push(2, b"");
        w.write_out().unwrap().sync_data().unwrap();
        let (old, obsolete) = w.rotate(3).unwrap();
        old.sync_data().unwrap();
        assert_eq!(obsolete.len(), 1);
        w.push(3, b"three");
        w.write_out().unwrap();
        // A crash in the middle of the next write: half a record at the end.
        w.push(4, b"four-four");
        let mut half = w.buf.clone();
        half.truncate(HEADER + 2);
        std::fs::OpenOptions::new()
            .append(true)
            .open(segment_path(dir, 3))
            .unwrap()
            .write_all(&half)
            .unwrap();
        let r = read_all(dir).unwrap();
        let got: Vec<(u64, &[u8])> = r.records.iter().map(|r| (r.seq, &r.payload[..])).collect();
        assert_eq!(got, vec![(1, &b"one"[..]), (2, &b""[..]), (3, &b"three"[..])]);
        assert_eq!(r.segments.len(), 2);
        assert_eq!(r.torn, vec![segment_path(dir, 3)]);
        remove(dir, &obsolete).unwrap();
        assert_eq!(read_all(dir).unwrap().segments, vec![segment_path(dir, 3)]);
    }

    #[test]
    fn a_flipped_bit_ends_the_segment() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut w = Wal::start(dir, 7, Vec::new()).unwrap();
        w.push(7, b"abc");
        w.push(8, b"def");
        w.write_out().unwrap();
        let p = segment_path(dir, 7);
        let mut b = std::fs::read(&p).unwrap();
        let last = b.len() - 1;
        b[last] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let r = read_all(dir).unwrap();
        assert_eq!(r.records.len(), 1);
        assert_eq!(r.records[0].seq, 7);
        assert_eq!(r.torn.len(), 1);
    }
}
