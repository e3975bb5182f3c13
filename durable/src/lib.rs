//! gma-durable: the storage every acknowledged write of the fabric goes through.
//!
//! - [`fs`]: the small file-system trait ([`fs::Fs`]) and the real one ([`fs::OsFs`]); also
//!   [`fs::write_atomic`] (temporary file, fsync, rename, folder fsync).
//! - [`log`]: the segmented append-only log with a CRC per record, torn-tail repair and group
//!   commit — the directory's raft log and the archiver's write-ahead and chunk logs.
//! - `sim` (feature `sim`): the storage-fault simulator, an in-memory [`fs::Fs`] that loses
//!   power at a chosen operation and keeps only what a disk may have kept.
//!
//! A separate crate, not part of `gma-core`: it has no gRPC dependency, and the simulator
//! feature stays out of every binary.

pub mod fs;
pub mod log;
#[cfg(any(test, feature = "sim"))]
pub mod sim;

pub use fs::{Fs, FsFile, OsFs};
pub use log::{Log, LogError, LogOptions, Pos, Record, Recovered};
