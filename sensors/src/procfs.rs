//! Reading `/proc` text into reused buffers, and the small helpers every probe shares.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use gma_core::event::EventData;
use gma_proto::v1::EventSchema;

use crate::{HostSensorConfig, Sensor, SensorError};

/// What sets one `/proc` sensor apart: what a sample reads and makes of it. The rest — the
/// source, the period, the schema, the files' root and the reused read buffer, the [`Sensor`]
/// impl — is [`ProcSensor`].
pub(crate) trait Probe: Send {
    /// Starting capacity of the read buffer (the largest file read, roughly).
    const BUF_CAPACITY: usize = 4096;
    /// Whether the next sample runs host commands and may wait up to their timeouts
    /// ([`Sensor::blocking`], asked before every sample): a probe that found nothing to run on
    /// this host, or whose next run is not due, samples on the producer's own thread instead
    /// of a blocking thread's (no thread hand-off per sample).
    fn blocking(&self) -> bool {
        false
    }
    /// One sample (see [`Sensor::sample`]): read through `files`, push events through `out`.
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError>;
}

/// The files a probe reads: paths below one root, read into one reused buffer. Each file is
/// opened once and kept open: a sample reads it again from offset 0 (`pread`), which makes the
/// kernel generate a `/proc` file afresh without the path walk, open and close of every read
/// (docs/PERFORMANCE.md, "The host agent"). Below another root than `/proc` (test fixtures), a
/// kept file that has been unlinked since (replaced, rotated away) is opened again by path; a
/// `/proc` file is never unlinked while open. A file that fails to read is closed: a read sees
/// what a fresh open would.
pub(crate) struct Files {
    root: PathBuf,
    /// `root` is `/proc` or below it.
    in_proc: bool,
    /// Read room: its length is the room, zero-filled once (see [`pread_whole`]); empty until
    /// the first read (a sensor that reads no file holds none).
    buf: Vec<u8>,
    /// The room of the first read.
    capacity: usize,
    kept: Vec<Kept>,
}

/// A file below the root, open while it reads well.
struct Kept {
    name: String,
    path: PathBuf,
    file: Option<std::fs::File>,
}

/// Largest file a probe reads whole (a `/proc/net/dev` of many thousand interfaces fits).
const MAX_FILE_BYTES: usize = 64 << 20;

impl Files {
    /// Reads files below `root` into a buffer of `capacity` bytes to start with.
    pub(crate) fn new(root: &Path, capacity: usize) -> Files {
        Files {
            root: root.to_path_buf(),
            in_proc: root.starts_with("/proc"),
            buf: Vec::new(),
            capacity,
            kept: Vec::new(),
        }
    }

    /// Reads `file` below the root and parses it with `parse`, naming the path in any error.
    /// What `parse` returns may borrow the text.
    pub(crate) fn read<'b, T>(
        &'b mut self,
        file: &str,
        parse: impl FnOnce(&'b str) -> Result<T, SensorError>,
    ) -> Result<T, SensorError> {
        let (text, path) = self.read_text(file)?;
        parse(text).map_err(|e| e.in_file(path))
    }

    /// The text of `file` and its path. One copy of this code for every probe, not one inlined
    /// into each probe's sample: the sensors of a tick run one after the other, and the first
    /// brings this code into the cache for the rest (the agent's CPU a tick is mostly cache
    /// misses after a second of idling; docs/PERFORMANCE.md, "Code a tick touches").
    #[inline(never)]
    fn read_text(&mut self, file: &str) -> Result<(&str, &Path), SensorError> {
        let i = match self.kept.iter().position(|k| k.name == file) {
            Some(i) => i,
            None => {
                self.kept.push(Kept {
                    name: file.to_string(),
                    path: self.root.join(file),
                    file: None,
                });
                self.kept.len() - 1
            }
        };
        let kept = &mut self.kept[i];
        let io = |source| SensorError::Io {
            path: kept.path.clone(),
            source,
        };
        let gone = !self.in_proc
            && kept
                .file
                .as_ref()
                .is_some_and(|f| f.metadata().map_or(true, |m| m.nlink() == 0));
        if gone || kept.file.is_none() {
            kept.file = Some(std::fs::File::open(&kept.path).map_err(io)?);
        }
        if self.buf.len() < self.capacity {
            self.buf.resize(self.capacity, 0);
        }
        let in_proc = self.in_proc;
        let read = match &kept.file {
            Some(f) => pread_whole(f, &mut self.buf, in_proc),
            None => Ok(0),
        };
        let n = match read {
            Ok(n) => n,
            Err(source) => {
                kept.file = None;
                return Err(io(source));
            }
        };
        let text = std::str::from_utf8(&self.buf[..n])
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        Ok((text, &kept.path))
    }

    /// [`Files::read`] of a file anywhere (`/etc/os-release`), opened for this read only.
    pub(crate) fn read_at<'b, T>(
        &'b mut self,
        path: &Path,
        parse: impl FnOnce(&'b str) -> Result<T, SensorError>,
    ) -> Result<T, SensorError> {
        let io = |source| SensorError::Io {
            path: path.to_path_buf(),
            source,
        };
        self.buf.clear();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut self.buf))
            .map_err(io)?;
        let text = std::str::from_utf8(&self.buf)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        parse(text).map_err(|e| e.in_file(path))
    }
}

/// Reads all of `f` from offset 0 into `buf`, returning how many bytes it holds: `pread`s at
/// the offsets read so far until one returns nothing, as `read` would (a multi-record `/proc`
/// file comes a page or so at a time; the kernel continues where the last read ended) — or, for
/// a `/proc` file (`in_proc`), until one read is short enough to be the end ([`ends_proc_file`]:
/// one `pread` a file instead of two). `buf`'s length is its room, zero-filled once as it grows
/// and never again: a read does not clear or fill the bytes it will overwrite (that `memset`
/// was 3 % of the agent's CPU).
fn pread_whole(f: &std::fs::File, buf: &mut Vec<u8>, in_proc: bool) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut at = 0;
    loop {
        if buf.len() - at < 1024 {
            if buf.len() >= MAX_FILE_BYTES {
                return Err(std::io::Error::other(format!(
                    "larger than {} MiB",
                    MAX_FILE_BYTES >> 20
                )));
            }
            buf.resize(buf.len() + buf.len().max(4096), 0);
        }
        match f.read_at(&mut buf[at..], at as u64) {
            Ok(0) => return Ok(at),
            Ok(n) if in_proc && at == 0 && ends_proc_file(n, buf.len()) => return Ok(n),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The longest line of the multi-record `/proc` files the sensors read (`/proc/diskstats`,
/// `/proc/net/dev`: a name and at most twenty 20-digit counters), with room to spare.
const PROC_MAX_LINE: usize = 1024;

/// Whether a first read of a `/proc` file that returned `n` bytes into `room` bytes holds the
/// whole file, so the read that would return nothing can be left out. A `/proc` text file is a
/// kernel `seq_file` (or, below `/proc/sys`, one value): a read fills the caller's room unless
/// the file ended or the kernel's own buffer (a page at least, 4096 bytes) cannot take the next
/// record, a line here. So a read that stopped short of the room with at least
/// [`PROC_MAX_LINE`] of that page left over stopped at the end. A longer file (a `/proc/stat`
/// of many CPUs) is read on until a read returns nothing, as before.
fn ends_proc_file(n: usize, room: usize) -> bool {
    n < room && n + PROC_MAX_LINE <= 4096
}

/// Where a probe's sample goes: the sensor's source and period, the sample time, the events.
pub(crate) struct Emit<'a> {
    name: &'a str,
    /// The sensor's source (per-interface and per-device events append `/<name>` to it).
    pub(crate) source: &'a str,
    /// The sensor's period.
    pub(crate) period: Duration,
    /// The sample time, UTC ns.
    pub(crate) now_ns: i64,
    out: &'a mut Vec<EventData>,
}

impl Emit<'_> {
    /// Pushes one event from the sensor's source.
    pub(crate) fn push(&mut self, numbers: Vec<f64>, strings: Vec<String>) {
        let e = event(self.name, self.source, self.now_ns, numbers, strings);
        self.out.push(e);
    }

    /// Pushes one event from `source` (a `<host>/<iface>` or `<host>/<device>`).
    pub(crate) fn push_from(&mut self, source: &str, numbers: Vec<f64>, strings: Vec<String>) {
        let e = event(self.name, source, self.now_ns, numbers, strings);
        self.out.push(e);
    }
}

/// A [`Sensor`] made of a [`Probe`] and what every `/proc` sensor has.
pub(crate) struct ProcSensor<P> {
    source: String,
    period: Duration,
    schema: EventSchema,
    files: Files,
    probe: P,
}

impl<P: Probe> ProcSensor<P> {
    /// Emits `schema`'s events from `source` every `period`, reading files below `root`.
    pub(crate) fn new(
        source: &str,
        period: Duration,
        root: &Path,
        schema: EventSchema,
        probe: P,
    ) -> ProcSensor<P> {
        ProcSensor {
            source: source.to_string(),
            period,
            schema,
            files: Files::new(root, P::BUF_CAPACITY),
            probe,
        }
    }

    /// A host sensor: the config's source, sampled every `cfg.period`, reading below `/proc`.
    pub(crate) fn host(cfg: &HostSensorConfig, schema: EventSchema, probe: P) -> ProcSensor<P> {
        ProcSensor::new(&cfg.source, cfg.period, &cfg.proc_root, schema, probe)
    }

    /// The probe's state, for tests.
    #[cfg(test)]
    pub(crate) fn probe(&self) -> &P {
        &self.probe
    }
}

impl<P: Probe> Sensor for ProcSensor<P> {
    fn name(&self) -> &str {
        &self.schema.name
    }

    fn schemas(&self) -> Vec<EventSchema> {
        vec![self.schema.clone()]
    }

    fn period(&self) -> Duration {
        self.period
    }

    fn blocking(&self) -> bool {
        self.probe.blocking()
    }

    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
        let mut emit = Emit {
            name: &self.schema.name,
            source: &self.source,
            period: self.period,
            now_ns,
            out,
        };
        self.probe.sample(&mut self.files, &mut emit)
    }
}

/// Rates of the counters of named parts of a host (interfaces, block devices): a part's first
/// sighting is its baseline; later sightings give one event each, from `<source>/<part>` with
/// the part's name as its one string; a part missing from a sample is forgotten.
pub(crate) struct PartRates<C> {
    parts: HashMap<String, PartState<C>>,
    prev_ns: Option<i64>,
    /// Sample generation; a part whose `seen` is older has gone away.
    generation: u64,
}

struct PartState<C> {
    /// `<host>/<part>`, formatted once when the part first appears.
    source: String,
    prev: C,
    seen: u64,
}

impl<C> Default for PartRates<C> {
    fn default() -> PartRates<C> {
        PartRates {
            parts: HashMap::new(),
            prev_ns: None,
            generation: 0,
        }
    }
}

impl<C: Copy> PartRates<C> {
    /// One sample of `parts` (name, counters); `rates(prev, cur, seconds)` makes the numbers.
    pub(crate) fn sample<'t, const N: usize>(
        &mut self,
        parts: impl IntoIterator<Item = (&'t str, C)>,
        out: &mut Emit<'_>,
        rates: impl Fn(&C, &C, f64) -> [f64; N],
    ) {
        let dt = self.prev_ns.and_then(|p| elapsed_s(p, out.now_ns));
        self.generation += 1;
        for (name, counters) in parts {
            match self.parts.get_mut(name) {
                Some(st) => {
                    if let Some(dt) = dt {
                        let numbers = rates(&st.prev, &counters, dt).to_vec();
                        out.push_from(&st.source, numbers, vec![name.to_string()]);
                    }
                    st.prev = counters;
                    st.seen = self.generation;
                }
                None => {
                    let st = PartState {
                        source: format!("{}/{}", out.source, name),
                        prev: counters,
                        seen: self.generation,
                    };
                    self.parts.insert(name.to_string(), st);
                }
            }
        }
        let generation = self.generation;
        self.parts.retain(|_, st| st.seen == generation);
        self.prev_ns = Some(out.now_ns);
    }

    /// The parts known now, for tests.
    #[cfg(test)]
    pub(crate) fn names(&self) -> std::collections::HashSet<&str> {
        self.parts.keys().map(String::as_str).collect()
    }
}

/// Parses one whitespace-separated token; `what` names it in the error.
#[inline(never)]
pub(crate) fn parse_num<T: FromStr>(
    tok: Option<&str>,
    file: &str,
    line: usize,
    what: &str,
) -> Result<T, SensorError> {
    let Some(tok) = tok else {
        return Err(missing(file, line, what));
    };
    tok.parse().map_err(|_| not_a_number(tok, file, line, what))
}

// The errors of `parse_num`, out of line: its callers' hot code stays short (fewer cache lines
// a sample touches).
#[cold]
#[inline(never)]
fn missing(file: &str, line: usize, what: &str) -> SensorError {
    SensorError::parse(file, line, format!("missing {what}"))
}

#[cold]
#[inline(never)]
fn not_a_number(tok: &str, file: &str, line: usize, what: &str) -> SensorError {
    let shown: String = tok.chars().take(40).collect();
    SensorError::parse(file, line, format!("{what} {shown:?} is not a valid number"))
}

/// Per-second rate of a monotonic counter. A counter that went backwards (wrapped, or the
/// device was reset or re-created) gives 0 for this sample rather than a negative or huge rate.
pub(crate) fn rate(prev: u64, cur: u64, dt_s: f64) -> f64 {
    cur.checked_sub(prev).map_or(0.0, |d| d as f64 / dt_s)
}

/// Seconds between two samples, or `None` when the clock did not move forward (a rate over a
/// zero or negative interval means nothing; the caller re-baselines instead).
pub(crate) fn elapsed_s(prev_ns: i64, now_ns: i64) -> Option<f64> {
    let d = now_ns.checked_sub(prev_ns)?;
    (d > 0).then(|| d as f64 / 1e9)
}

/// Kibibytes to mebibytes (the `_mb` fields are MiB, as `/proc/meminfo`'s "kB" are KiB).
pub(crate) fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub(crate) fn event(
    name: &str,
    source: &str,
    timestamp_ns: i64,
    numbers: Vec<f64>,
    strings: Vec<String>,
) -> EventData {
    EventData {
        name: name.to_string(),
        source: source.to_string(),
        timestamp_ns,
        numbers,
        strings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_never_go_negative() {
        assert_eq!(rate(10, 30, 2.0), 10.0);
        assert_eq!(rate(30, 10, 2.0), 0.0);
        assert_eq!(rate(u64::MAX, 0, 1.0), 0.0);
        assert_eq!(elapsed_s(5, 5), None);
        assert_eq!(elapsed_s(10, 5), None);
        assert_eq!(elapsed_s(i64::MIN, i64::MAX), None);
        assert_eq!(elapsed_s(0, 1_500_000_000), Some(1.5));
    }

    #[test]
    fn a_short_first_read_of_a_proc_file_is_its_end_only_well_inside_a_page() {
        assert!(ends_proc_file(1233, 4096), "a /proc/stat of two CPUs");
        assert!(ends_proc_file(0, 4096));
        assert!(!ends_proc_file(4096, 4096), "the room filled: read on");
        assert!(
            !ends_proc_file(3500, 8192),
            "the kernel's page may have been full"
        );
        assert!(ends_proc_file(4096 - PROC_MAX_LINE, 8192));
        assert!(!ends_proc_file(4097 - PROC_MAX_LINE, 8192));
    }

    /// Below `/proc` a read ends early; what it reads is the whole file all the same.
    #[test]
    fn proc_files_read_whole() {
        let Ok(want) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
            return; // no procfs here
        };
        let mut files = Files::new(Path::new("/proc"), 8);
        for _ in 0..2 {
            let got = files.read("sys/kernel/osrelease", |t| Ok(t.to_string())).unwrap();
            assert_eq!(got, want);
        }
        // A multi-record file longer than a page comes in several reads, up to its end.
        let mounts = files.read("self/mountinfo", |t| Ok(t.lines().count())).unwrap();
        assert!(mounts > 0);
    }

    #[test]
    fn missing_file_names_the_path() {
        let mut files = Files::new(Path::new("/nonexistent/gma"), 64);
        let err = files.read("stat", |t| Ok(t.len())).unwrap_err();
        assert!(
            err.to_string().starts_with("cannot read /nonexistent/gma/stat"),
            "{err}"
        );
        let err = files.read_at(Path::new("/nonexistent/os-release"), |t| Ok(t.len()));
        assert!(err.is_err());
    }

    /// A kept file reads what is in it now: rewritten in place, replaced by another file,
    /// removed, back again, and larger than the buffer.
    #[test]
    fn kept_files_read_what_a_fresh_open_would() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut files = Files::new(dir.path(), 8);
        let read = |files: &mut Files| files.read("f", |t| Ok(t.to_string()));
        assert!(read(&mut files).is_err(), "missing");
        std::fs::write(&p, "one").unwrap();
        assert_eq!(read(&mut files).unwrap(), "one");
        std::fs::write(&p, "two, longer than the first buffer").unwrap();
        assert_eq!(read(&mut files).unwrap(), "two, longer than the first buffer");
        let other = dir.path().join("g");
        std::fs::write(&other, "three").unwrap();
        std::fs::rename(&other, &p).unwrap();
        assert_eq!(read(&mut files).unwrap(), "three", "replaced by rename");
        std::fs::remove_file(&p).unwrap();
        assert!(read(&mut files).is_err(), "removed");
        let big = "x".repeat(100_000);
        std::fs::write(&p, &big).unwrap();
        assert_eq!(read(&mut files).unwrap(), big);
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        let err = read(&mut files).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }

    /// The real `/proc` files, read twice through kept handles, give whole texts.
    #[test]
    fn proc_files_read_whole_twice() {
        let mut files = Files::new(Path::new("/proc"), 16);
        for _ in 0..2 {
            let stat = files.read("stat", |t| Ok(t.to_string())).unwrap();
            assert!(stat.starts_with("cpu ") && stat.contains("\nbtime "), "{stat}");
            let status = files.read("self/status", |t| Ok(t.to_string())).unwrap();
            assert!(
                status.starts_with("Name:") && status.contains("\nVmRSS:"),
                "{status}"
            );
        }
    }
}
