//! The small file-system interface every durable byte goes through.
//!
//! [`OsFs`] is the real one. The storage-fault simulator (`crate::sim::SimFs`, feature `sim`)
//! implements the same trait and remembers which bytes were made durable, so the code above can
//! be crashed at any point in tests.
//!
//! To ensure correctness, callers rely on exactly these promises (POSIX, as Linux gives them):
//! - [`FsFile::write_all`] makes bytes readable, not durable.
//! - [`FsFile::sync_data`] (fdatasync) makes every byte written to that file before it durable,
//!   including the file's size; it does not make the file's name durable.
//! - [`Fs::sync_dir`] makes every create, remove and rename in that folder durable.
//! - Nothing else is ordered: after a power loss any subset of the writes not yet synced may
//!   have reached the disk, the last one possibly in part.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

/// A file opened for appending (created when missing).
pub trait FsFile: Send + Debug {
    /// Appends `buf` at the end of the file.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// fdatasync: every byte written so far, and the file size, are durable when it returns.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (durable only after [`FsFile::sync_data`]).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

/// The folder operations durable storage needs.
pub trait Fs: Send + Sync + Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the files in `dir` (not sorted).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// `len` bytes at `offset` (an error when the file is shorter).
    fn read_at(&self, path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>>;
    /// The file's size, `None` when it does not exist.
    fn len(&self, path: &Path) -> io::Result<Option<u64>>;
    /// Opens `path` for appending, creating it (empty) when missing.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn FsFile>>;
    /// Creates `path` empty (truncating it when it exists) for writing.
    fn create(&self, path: &Path) -> io::Result<Box<dyn FsFile>>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Replaces `to` by `from` atomically.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// fsync of the folder: its creates, removes and renames are durable when it returns.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes the exclusive lock of a data folder (a `LOCK` file in it) until the guard drops; an
    /// error when another process (or handle) holds it.
    fn lock(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync + Debug>>;
}

/// The operating system's file system.
#[derive(Debug, Default)]
pub struct OsFs {
    /// Read handles kept open (chunk reads are small and frequent); dropped on remove/rename.
    readers: Mutex<Vec<(PathBuf, Arc<File>)>>,
}

/// Read handles [`OsFs`] keeps open at most.
const MAX_READERS: usize = 64;

impl OsFs {
    pub fn new() -> Arc<OsFs> {
        Arc::new(OsFs::default())
    }

    fn reader(&self, path: &Path) -> io::Result<Arc<File>> {
        let mut r = self.readers.lock();
        if let Some((_, f)) = r.iter().find(|(p, _)| p == path) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(path)?);
        if r.len() >= MAX_READERS {
            r.remove(0);
        }
        r.push((path.to_path_buf(), f.clone()));
        Ok(f)
    }

    fn forget(&self, path: &Path) {
        self.readers.lock().retain(|(p, _)| p != path);
    }
}

#[derive(Debug)]
struct OsFile(File);

impl FsFile for OsFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Fs for OsFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            if let Some(name) = e?.file_name().to_str() {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut b = Vec::new();
        File::open(path)?.read_to_end(&mut b)?;
        Ok(b)
    }

    fn read_at(&self, path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let f = self.reader(path)?;
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, offset)?;
        Ok(b)
    }

    fn len(&self, path: &Path) -> io::Result<Option<u64>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn FsFile>> {
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Box::new(OsFile(f)))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn FsFile>> {
        self.forget(path);
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)?;
        Ok(Box::new(OsFile(f)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.forget(path);
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.forget(from);
        self.forget(to);
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync + Debug>> {
        let path = dir.join("LOCK");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        match f.try_lock() {
            Ok(()) => Ok(Box::new(f)),
            Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{} is locked by another process: stop it or use another data folder",
                    dir.display()
                ),
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// Writes `data` to `path` durably and atomically: a temporary file beside it is written and
/// fsynced, renamed over `path`, and the folder fsynced. After a crash `path` holds either the
/// old or the new content, never a mix.
pub fn write_atomic(fs: &dyn Fs, path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no folder"))?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut f = fs.create(&tmp)?;
    f.write_all(data)?;
    f.sync_data()?;
    drop(f);
    fs.rename(&tmp, path)?;
    fs.sync_dir(dir)
}
