//! The storage-fault simulator: an in-memory [`Fs`] that remembers which bytes and names were
//! made durable, loses power at a chosen operation, and then keeps only what a real disk may
//! have kept.
//!
//! Model (the weakest the POSIX promises of [`crate::fs`] allow):
//! - every file holds its *durable* bytes plus the data operations (writes, cuts) done since
//!   its last `sync_data`; every folder holds its durable names plus the name operations
//!   (create, remove, rename) done since its last `sync_dir`;
//! - [`SimFs::arm`]`(n)`: the `n`-th mutating operation from now fails and the power is off:
//!   every later operation fails too, as if the machine had stopped;
//! - [`SimFs::crash`] brings the power back with what survived, by one of the [`Crash`] modes:
//!   every unsynced operation lost; all kept but the last write torn; or an arbitrary subset,
//!   applied in arbitrary order, some torn.
//!
//! Handles opened before a crash are dead afterwards (their operations fail).

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Debug};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore};

use crate::fs::{Fs, FsFile};

/// What survives a power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// Every write, cut and name operation not yet synced is lost.
    LoseUnsynced,
    /// Every unsynced operation reached the disk but the last write of each file, which is
    /// torn (a prefix of it).
    TearLast,
    /// An arbitrary subset of the unsynced operations reached the disk, in arbitrary order,
    /// some of the writes only in part.
    Partial,
}

impl Crash {
    pub const ALL: [Crash; 3] = [Crash::LoseUnsynced, Crash::TearLast, Crash::Partial];
}

#[derive(Debug, Clone)]
enum DataOp {
    Write { at: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<DataOp>,
}

#[derive(Debug, Clone)]
enum NameOp {
    Link(PathBuf, u64),
    Unlink(PathBuf),
    Rename(PathBuf, PathBuf),
}

#[derive(Debug, Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    /// (folder, operation), oldest first.
    pending_names: Vec<(PathBuf, NameOp)>,
    /// Mutating operations left before the power fails.
    countdown: Option<u64>,
    down: bool,
    /// Bumped by every crash: handles of an older epoch are dead.
    epoch: u64,
    locks: Vec<PathBuf>,
    /// Mutating operations done (for choosing crash points).
    ops: u64,
}

/// The simulated file system. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct SimFs {
    st: Arc<Mutex<State>>,
    /// A handle of one "boot" ([`SimFs::handle`]): dead after the next crash, like the process
    /// that used it (a task left over from before the power loss must not write after it).
    epoch: Option<u64>,
}

impl Debug for SimFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.st.lock();
        f.debug_struct("SimFs")
            .field("files", &st.names.len())
            .field("ops", &st.ops)
            .field("down", &st.down)
            .finish()
    }
}

fn power_off() -> io::Error {
    io::Error::other("simulated power loss")
}

fn apply(buf: &mut Vec<u8>, op: &DataOp) {
    match op {
        DataOp::Write { at, data } => {
            let at = *at as usize;
            if buf.len() < at + data.len() {
                buf.resize(at + data.len(), 0);
            }
            buf[at..at + data.len()].copy_from_slice(data);
        }
        DataOp::SetLen(n) => buf.resize(*n as usize, 0),
    }
}

fn apply_name(names: &mut BTreeMap<PathBuf, u64>, op: &NameOp) {
    match op {
        NameOp::Link(p, ino) => {
            names.insert(p.clone(), *ino);
        }
        NameOp::Unlink(p) => {
            names.remove(p);
        }
        NameOp::Rename(from, to) => {
            if let Some(ino) = names.remove(from) {
                names.insert(to.clone(), ino);
            }
        }
    }
}

/// A write cut to a random prefix.
fn torn(op: &DataOp, rng: &mut dyn RngCore) -> DataOp {
    match op {
        DataOp::Write { at, data } if !data.is_empty() => DataOp::Write {
            at: *at,
            data: data[..rng.random_range(0..data.len())].to_vec(),
        },
        other => other.clone(),
    }
}

impl State {
    /// Counts a mutating operation; fails once the power is off.
    fn tick(&mut self) -> io::Result<()> {
        if self.down {
            return Err(power_off());
        }
        if let Some(n) = self.countdown.as_mut() {
            if *n <= 1 {
                self.down = true;
                self.countdown = None;
                return Err(power_off());
            }
            *n -= 1;
        }
        self.ops += 1;
        Ok(())
    }

    fn alive(&self, epoch: u64) -> io::Result<()> {
        if self.down || epoch != self.epoch {
            return Err(power_off());
        }
        Ok(())
    }

    fn ino(&self, path: &Path) -> io::Result<u64> {
        self.names
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display())))
    }

    fn folder(path: &Path) -> PathBuf {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    fn new_file(&mut self, path: &Path) -> u64 {
        self.next_ino += 1;
        let ino = self.next_ino;
        self.inodes.insert(ino, Inode::default());
        self.names.insert(path.to_path_buf(), ino);
        self.pending_names
            .push((Self::folder(path), NameOp::Link(path.to_path_buf(), ino)));
        ino
    }
}

impl SimFs {
    pub fn new() -> SimFs {
        SimFs::default()
    }

    /// A handle for the storage of one run between crashes: every operation through it fails
    /// once the power failed, also after the power is back.
    pub fn handle(&self) -> SimFs {
        let epoch = self.st.lock().epoch;
        SimFs {
            st: self.st.clone(),
            epoch: Some(epoch),
        }
    }

    /// The epoch this handle works in.
    fn my_epoch(&self, st: &State) -> u64 {
        self.epoch.unwrap_or(st.epoch)
    }

    /// The power fails at the `n`-th mutating operation from now (`n >= 1`): it and every later
    /// operation fail.
    pub fn arm(&self, n: u64) {
        self.st.lock().countdown = Some(n.max(1));
    }

    /// Cancels an armed power failure that has not happened.
    pub fn disarm(&self) {
        self.st.lock().countdown = None;
    }

    /// True once the power failed.
    pub fn is_down(&self) -> bool {
        self.st.lock().down
    }

    /// Mutating operations done so far.
    pub fn ops(&self) -> u64 {
        self.st.lock().ops
    }

    /// Cuts the power now (if it is not already off).
    pub fn power_off(&self) {
        let mut st = self.st.lock();
        st.down = true;
        st.countdown = None;
    }

    /// Brings the power back: what was not synced survives as `mode` says. Every handle
    /// opened before is dead.
    pub fn crash(&self, mode: Crash, rng: &mut dyn RngCore) {
        let mut st = self.st.lock();
        let st = &mut *st;
        // Folders: which name operations reached the disk.
        let mut names = st.durable_names.clone();
        let pending = std::mem::take(&mut st.pending_names);
        match mode {
            Crash::LoseUnsynced => {}
            Crash::TearLast => pending.iter().for_each(|(_, op)| apply_name(&mut names, op)),
            Crash::Partial => {
                for (_, op) in &pending {
                    if rng.random_bool(0.5) {
                        apply_name(&mut names, op);
                    }
                }
            }
        }
        // Files: which data operations reached the disk.
        for inode in st.inodes.values_mut() {
            let mut data = std::mem::take(&mut inode.durable);
            let ops = std::mem::take(&mut inode.pending);
            match mode {
                Crash::LoseUnsynced => {}
                Crash::TearLast => {
                    let last_write = ops.iter().rposition(|o| matches!(o, DataOp::Write { .. }));
                    for (i, op) in ops.iter().enumerate() {
                        if Some(i) == last_write {
                            apply(&mut data, &torn(op, rng));
                        } else {
                            apply(&mut data, op);
                        }
                    }
                }
                Crash::Partial => {
                    let mut chosen: Vec<DataOp> = ops.into_iter().filter(|_| rng.random_bool(0.5)).collect();
                    chosen.shuffle(rng);
                    for op in &chosen {
                        if rng.random_bool(0.25) {
                            apply(&mut data, &torn(op, rng));
                        } else {
                            apply(&mut data, op);
                        }
                    }
                }
            }
            inode.current = data.clone();
            inode.durable = data;
        }
        let live: std::collections::HashSet<u64> = names.values().copied().collect();
        st.inodes.retain(|ino, _| live.contains(ino));
        st.names = names.clone();
        st.durable_names = names;
        st.down = false;
        st.countdown = None;
        st.epoch += 1;
        st.locks.clear();
    }

    /// Every durable file and its bytes (for checks and debugging).
    pub fn files(&self) -> BTreeMap<PathBuf, usize> {
        let st = self.st.lock();
        st.names
            .iter()
            .map(|(p, ino)| (p.clone(), st.inodes.get(ino).map_or(0, |i| i.current.len())))
            .collect()
    }
}

#[derive(Debug)]
struct SimFile {
    fs: SimFs,
    ino: u64,
    epoch: u64,
}

impl FsFile for SimFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut st = self.fs.st.lock();
        st.alive(self.epoch)?;
        st.tick()?;
        let inode = st.inodes.get_mut(&self.ino).ok_or_else(power_off)?;
        let op = DataOp::Write {
            at: inode.current.len() as u64,
            data: buf.to_vec(),
        };
        apply(&mut inode.current, &op);
        inode.pending.push(op);
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let mut st = self.fs.st.lock();
        st.alive(self.epoch)?;
        st.tick()?;
        let inode = st.inodes.get_mut(&self.ino).ok_or_else(power_off)?;
        inode.durable = inode.current.clone();
        inode.pending.clear();
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut st = self.fs.st.lock();
        st.alive(self.epoch)?;
        st.tick()?;
        let inode = st.inodes.get_mut(&self.ino).ok_or_else(power_off)?;
        let op = DataOp::SetLen(len);
        apply(&mut inode.current, &op);
        inode.pending.push(op);
        Ok(())
    }
}

#[derive(Debug)]
struct SimLock {
    fs: SimFs,
    dir: PathBuf,
    epoch: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut st = self.fs.st.lock();
        if st.epoch == self.epoch {
            st.locks.retain(|d| *d != self.dir);
        }
    }
}

impl Fs for SimFs {
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        // Folders always exist (and are durable): the simulator models files and names.
        let st = self.st.lock();
        st.alive(self.my_epoch(&st))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        Ok(st
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
            .collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        let ino = st.ino(path)?;
        Ok(st.inodes.get(&ino).map(|i| i.current.clone()).unwrap_or_default())
    }

    fn read_at(&self, path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        let ino = st.ino(path)?;
        let data = st.inodes.get(&ino).map(|i| &i.current[..]).unwrap_or_default();
        data.get(offset as usize..offset as usize + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))
    }

    fn len(&self, path: &Path) -> io::Result<Option<u64>> {
        let st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        Ok(st
            .names
            .get(path)
            .and_then(|ino| st.inodes.get(ino))
            .map(|i| i.current.len() as u64))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn FsFile>> {
        let mut st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        let ino = match st.names.get(path) {
            Some(ino) => *ino,
            None => {
                st.tick()?;
                st.new_file(path)
            }
        };
        Ok(Box::new(SimFile {
            fs: self.clone(),
            ino,
            epoch: self.my_epoch(&st),
        }))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn FsFile>> {
        let mut st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        st.tick()?;
        let ino = match st.names.get(path).copied() {
            Some(ino) => {
                let inode = st.inodes.get_mut(&ino).ok_or_else(power_off)?;
                let op = DataOp::SetLen(0);
                apply(&mut inode.current, &op);
                inode.pending.push(op);
                ino
            }
            None => st.new_file(path),
        };
        Ok(Box::new(SimFile {
            fs: self.clone(),
            ino,
            epoch: self.my_epoch(&st),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        st.ino(path)?;
        st.tick()?;
        st.names.remove(path);
        st.pending_names
            .push((State::folder(path), NameOp::Unlink(path.to_path_buf())));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        let ino = st.ino(from)?;
        st.tick()?;
        st.names.remove(from);
        st.names.insert(to.to_path_buf(), ino);
        st.pending_names.push((
            State::folder(to),
            NameOp::Rename(from.to_path_buf(), to.to_path_buf()),
        ));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        st.tick()?;
        let pending = std::mem::take(&mut st.pending_names);
        let mut rest = Vec::new();
        for (folder, op) in pending {
            if folder == dir {
                apply_name(&mut st.durable_names, &op);
            } else {
                rest.push((folder, op));
            }
        }
        st.pending_names = rest;
        Ok(())
    }

    fn lock(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync + Debug>> {
        let mut st = self.st.lock();
        st.alive(self.my_epoch(&st))?;
        if st.locks.iter().any(|d| d == dir) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is locked by another handle", dir.display()),
            ));
        }
        st.locks.push(dir.to_path_buf());
        Ok(Box::new(SimLock {
            fs: self.clone(),
            dir: dir.to_path_buf(),
            epoch: st.epoch,
        }))
    }
}

/// The seed of a fault-simulation run: `GMA_FAULT_SEED` when set (replay one failing run),
/// else `default`.
pub fn seed_from_env(default: u64) -> u64 {
    std::env::var("GMA_FAULT_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn synced_bytes_and_names_survive_and_unsynced_ones_may_not() {
        let fs = SimFs::new();
        let dir = Path::new("/d");
        let mut f = fs.open_append(&dir.join("a")).unwrap();
        f.write_all(b"hello").unwrap();
        f.sync_data().unwrap();
        // The name is not durable yet: a crash that loses the unsynced drops the file.
        fs.crash(Crash::LoseUnsynced, &mut ChaCha8Rng::seed_from_u64(1));
        assert!(fs.len(&dir.join("a")).unwrap().is_none());

        let mut f = fs.open_append(&dir.join("a")).unwrap();
        fs.sync_dir(dir).unwrap();
        f.write_all(b"hello").unwrap();
        f.sync_data().unwrap();
        f.write_all(b" world").unwrap();
        fs.crash(Crash::LoseUnsynced, &mut ChaCha8Rng::seed_from_u64(1));
        assert_eq!(fs.read(&dir.join("a")).unwrap(), b"hello");
        assert!(
            f.write_all(b"x").is_err(),
            "a handle from before the crash is dead"
        );

        let mut f = fs.open_append(&dir.join("a")).unwrap();
        f.write_all(b" world").unwrap();
        fs.crash(Crash::TearLast, &mut ChaCha8Rng::seed_from_u64(2));
        let got = fs.read(&dir.join("a")).unwrap();
        assert!(got.starts_with(b"hello") && got.len() < 11, "{got:?}");
    }

    #[test]
    fn the_power_fails_at_the_armed_operation() {
        let fs = SimFs::new();
        let mut f = fs.open_append(Path::new("/d/a")).unwrap();
        fs.arm(2);
        f.write_all(b"1").unwrap();
        assert!(f.write_all(b"2").is_err());
        assert!(fs.is_down());
        assert!(f.sync_data().is_err());
        fs.crash(Crash::TearLast, &mut ChaCha8Rng::seed_from_u64(3));
        assert!(!fs.is_down());
    }
}
