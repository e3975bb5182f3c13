//! `proc.event` and `proc.usage`: watched processes — their starts, exits and resource use.
//!
//! A [`ProcessWatch`] (a `[[process]]` table of the producer's TOML) selects processes in one of
//! four ways: by `comm` (the kernel's 15-byte command name), by a `cmdline` substring, by `pid`,
//! or by a `command` the sensor starts and supervises itself. [`ProcessSensor`] samples every
//! watch each period and emits:
//!
//! - `proc.event`, one per state change: `start`, `exit`, `abnormal_exit`, `vanished`,
//!   `cpu_high`, `rss_high` (see [`process_schemas`] for the fields);
//! - `proc.usage`, one per live matched process per sample.
//!
//! # Matching (comm, cmdline, pid)
//!
//! Each sample lists the numeric directories of `/proc` (threads are not listed there, so a
//! multi-threaded process is one match). A process seen for the first time gives `start`; on a
//! watch's very first sample the processes already running give `start` too (detail
//! "already running"), so consumers learn the state. A process is identified by its pid *and*
//! its start time (field 22 of `stat`), so a pid reused between two samples reads as an exit
//! followed by a start. A zombie (state `Z`/`X`) or a process in its exit path (`PF_EXITING`)
//! has exited and counts as gone. A process that vanishes while its files are read is normal
//! and is simply not matched in that sample. A process that stops matching but still runs (it
//! exec'd another program or rewrote its command line) gives `vanished` with the detail
//! "no longer matches (still running; ...)". (A process whose main thread ended early while
//! other threads run shows as a zombie in `/proc` and reads as exited.)
//!
//! When a matched process is gone, its exit status can only be read by its parent. The sensor
//! asks the Linux **proc connector** (netlink `NETLINK_CONNECTOR`, group `CN_IDX_PROC`,
//! `PROC_EVENT_EXIT`), which reports the wait status of every process that exits on the host:
//! with it a gone process gives `exit` (status 0) or `abnormal_exit` (non-zero status or a
//! signal) like a supervised command. It needs `CAP_NET_ADMIN` and the initial pid and user
//! namespaces, and the sensor uses it only when `proc_root` is `/proc` (its pids are the
//! initial namespace's); [`ProcessSensor::proc_connector_active`] says whether it is on. It was
//! checked to work on the development machine (Linux 6.18, root, `CONFIG_PROC_EVENTS=y`):
//! `exit 3` arrives as wait status `0x300`, a SIGKILL as `0x9`. On Linux >= 6.6 the
//! subscription asks for exit events only; older kernels send every process event and the
//! sensor skips the others, and the exits of threads other than a process's main one. The
//! kernel notifies only after the process became a zombie (and its command line is empty even
//! earlier), so a process seen gone without a notification yet is reported one sample later,
//! when the notification has come. Without the connector (not root, a container's pid
//! namespace, an old or stripped kernel), or when its queue overflowed and the notification was
//! lost, a gone process gives `vanished` with status and signal NaN and the detail
//! "exited (status unknown: ...)".
//!
//! # Supervised commands
//!
//! A `command` watch is spawned by [`ProcessSensor::new`] (so a command that cannot start fails
//! the configuration), with stdin, stdout and stderr on `/dev/null`, in a process group of its
//! own. Its `start` is emitted by the first sample; each sample then calls `try_wait`: status 0
//! gives `exit`, another status or a signal gives `abnormal_exit` (the detail names the common
//! signals: "killed by signal 9 (SIGKILL)"). With `restart = true` the command is started again
//! on a later sample (never the one that saw it exit) and at most once per period, so a command
//! that keeps failing is retried once a period; a failed re-spawn is logged and retried.
//! Dropping the sensor kills (SIGKILL) the process group of every running command (with the
//! `kill` program, the one safe way to signal a group; failing that, the child alone) and reaps
//! the child: no zombie, and no grandchild left running. A command that exits on its own
//! leaves what it started alone. If the agent itself dies without dropping the sensor (SIGKILL,
//! abort), running commands are left to init.
//!
//! # Usage and thresholds
//!
//! `cpu_pct` is the share of one CPU over the last sample: the utime + stime delta of
//! `/proc/<pid>/stat` in clock ticks, divided by the tick rate and the time between samples.
//! The tick rate and the page size come from `AT_CLKTCK` and `AT_PAGESZ` of
//! `<proc_root>/self/auxv` (what `sysconf` returns, without libc), else 100 Hz and 4096 bytes.
//! `rss_mb` is the resident pages of `/proc/<pid>/statm` times the page size, in MiB. A process
//! has no `cpu_pct` (NaN) on its first sample, and after a sample whose `now_ns` did not move
//! forward. `cpu_high`/`rss_high` fire once when the value goes above the watch's limit and
//! re-arm when it drops below it.
//!
//! # Cost and bounds
//!
//! A watch tracks at most [`MAX_TRACKED_PER_WATCH`] processes; further matches are ignored
//! (logged once). With comm or cmdline watches a sample reads the `/proc` directory and, for
//! every process on the host, `comm` (if any comm watch) and `cmdline` (if any cmdline watch),
//! whatever the number of such watches: one open and read each. Every matched process then costs
//! a read of `stat` and `statm`. pid and command watches read only their process's files and
//! need no scan. The proc connector costs one non-blocking drain of its socket per sample.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use gma_core::event::{dbl, schema, text, EventData, MAX_STRING_VALUE};
use gma_core::pattern::validate_source;
use gma_proto::v1::EventSchema;

use crate::procfs::{elapsed_s, event, parse_num};
use crate::{Sensor, SensorError};

/// Event name of the state changes.
pub const PROC_EVENT: &str = "proc.event";
/// Event name of the per-process resource use.
pub const PROC_USAGE: &str = "proc.usage";
/// The version of both schemas.
pub const VERSION: u32 = gma_core::event::SCHEMA_VERSION;

/// `kind`: a matched process appeared (or was running at the first sample), or a command was
/// started.
pub const KIND_START: &str = "start";
/// `kind`: the process exited with status 0.
pub const KIND_EXIT: &str = "exit";
/// `kind`: the process exited with a non-zero status or was killed by a signal.
pub const KIND_ABNORMAL_EXIT: &str = "abnormal_exit";
/// `kind`: the process is gone and its exit status is unknown.
pub const KIND_VANISHED: &str = "vanished";
/// `kind`: CPU use went above `cpu_pct_max`.
pub const KIND_CPU_HIGH: &str = "cpu_high";
/// `kind`: resident memory went above `rss_mb_max`.
pub const KIND_RSS_HIGH: &str = "rss_high";

/// Most processes one watch tracks; further matches are ignored.
pub const MAX_TRACKED_PER_WATCH: usize = 1024;
/// Clock ticks per second assumed when `AT_CLKTCK` cannot be read (USER_HZ of every mainstream
/// Linux architecture).
pub const DEFAULT_CLOCK_TICKS: u64 = 100;
/// Page size assumed when `AT_PAGESZ` cannot be read.
pub const DEFAULT_PAGE_SIZE: u64 = 4096;
/// The longest `comm` the kernel keeps (`TASK_COMM_LEN` - 1).
pub const MAX_COMM_LEN: usize = 15;

/// `vanished` details.
const NOT_A_CHILD: &str = "exited (status unknown: not a child of the agent)";
const NO_NOTIFICATION: &str = "exited (status unknown: no exit notification from the proc connector)";
const NO_LONGER_MATCHES: &str = "no longer matches (still running; its comm or cmdline changed)";

/// Configuration errors name this origin.
const CONFIG_ORIGIN: &str = "[[process]]";
/// `AT_PAGESZ` and `AT_CLKTCK` of `<linux/auxvec.h>`.
const AT_PAGESZ: usize = 6;
const AT_CLKTCK: usize = 17;
/// `PF_EXITING` of `<linux/sched.h>`.
const PF_EXITING: u64 = 0x4;
/// Longest command line quoted in a `start` detail.
const MAX_DETAIL_ARGV: usize = 200;

/// The schemas (version 1) of `proc.event` and `proc.usage` (source = the host). Strings and
/// doubles each in the order listed.
pub fn process_schemas() -> Vec<EventSchema> {
    vec![
        schema(
            PROC_EVENT,
            "state changes of watched processes: starts, exits with their status or \
                          signal, disappearances, CPU and memory threshold crossings",
            vec![
                text("watch", "name of the [[process]] watch"),
                text(
                    "kind",
                    "start, exit (status 0), abnormal_exit (non-zero status or killed by a signal), \
                     vanished (gone, status unknown), cpu_high or rss_high",
                ),
                text(
                    "detail",
                    "human-readable explanation, e.g. \"killed by signal 9 (SIGKILL)\", \"exit status 3\", \
                     \"cpu 93.0% > 80%\"",
                ),
                dbl("pid", "pid", "process id"),
                dbl(
                    "status",
                    "status",
                    "exit status (0-255) on exit and abnormal_exit; NaN when not an exit, killed by a \
                     signal, or unknown",
                ),
                dbl(
                    "signal",
                    "signal",
                    "number of the signal that killed the process; NaN when none or unknown",
                ),
                dbl(
                    "cpu_pct",
                    "%",
                    "CPU use over the last period, percent of one CPU (on an exit: the last measured; \
                     NaN when not measured yet)",
                ),
                dbl(
                    "rss_mb",
                    "MiB",
                    "resident memory (on an exit: the last measured; NaN when not measured)",
                ),
                dbl(
                    "running",
                    "processes",
                    "processes this watch matches after this sample's changes",
                ),
            ],
        ),
        schema(
            PROC_USAGE,
            "resource use of every live watched process, each sample",
            vec![
                text("watch", "name of the [[process]] watch"),
                dbl("pid", "pid", "process id"),
                dbl(
                    "cpu_pct",
                    "%",
                    "CPU use over the last period (utime + stime deltas of /proc/<pid>/stat), percent \
                     of one CPU; NaN on the process's first sample",
                ),
                dbl(
                    "rss_mb",
                    "MiB",
                    "resident memory (resident pages of /proc/<pid>/statm times the page size)",
                ),
                dbl("threads", "threads", "threads of the process"),
                dbl(
                    "running",
                    "processes",
                    "processes this watch matches in this sample",
                ),
            ],
        ),
    ]
}

/// One `[[process]]` table: which processes to watch and their limits. Exactly one of `comm`,
/// `cmdline`, `pid` and `command` selects the processes (see [`ProcessWatch::validate`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessWatch {
    /// The watch's name, sent as `watch` in every event (required, non-empty, unique).
    pub name: String,
    /// Match processes whose `/proc/<pid>/comm` equals this (at most 15 bytes, as the kernel
    /// truncates command names to that).
    pub comm: Option<String>,
    /// ... or whose command line (arguments joined by `' '`) contains this substring ...
    pub cmdline: Option<String>,
    /// ... or exactly this pid ...
    pub pid: Option<u32>,
    /// ... or start and supervise this command (program and arguments).
    pub command: Option<Vec<String>>,
    /// For `command`: start it again after it exits, at most once per period.
    #[serde(default)]
    pub restart: bool,
    /// `cpu_high` when CPU use goes above this, percent of one CPU (may exceed 100).
    pub cpu_pct_max: Option<f64>,
    /// `rss_high` when resident memory goes above this, MiB.
    pub rss_mb_max: Option<f64>,
}

impl ProcessWatch {
    /// Checks the watch: a name, exactly one selector, sensible values. The message names the
    /// watch and says what to change.
    pub fn validate(&self) -> Result<(), SensorError> {
        let invalid = |message: String| SensorError::config(CONFIG_ORIGIN, message);
        if self.name.trim().is_empty() {
            return Err(invalid(
                "process watch: name must not be empty (it is sent as `watch` in every event)".to_string(),
            ));
        }
        if self.name.len() > MAX_STRING_VALUE {
            return Err(invalid(format!(
                "process watch name is {} bytes, at most {MAX_STRING_VALUE}",
                self.name.len()
            )));
        }
        let who = format!("process watch {:?}", self.name);
        let set: Vec<&str> = [
            ("comm", self.comm.is_some()),
            ("cmdline", self.cmdline.is_some()),
            ("pid", self.pid.is_some()),
            ("command", self.command.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, on)| on.then_some(k))
        .collect();
        match set.len() {
            1 => {}
            0 => {
                return Err(invalid(format!(
                    "{who}: set exactly one of comm, cmdline, pid or command (none is set)"
                )))
            }
            _ => {
                return Err(invalid(format!(
                    "{who}: set exactly one of comm, cmdline, pid or command ({} are set)",
                    set.join(" and ")
                )))
            }
        }
        if let Some(c) = &self.comm {
            if c.is_empty() {
                return Err(invalid(format!("{who}: comm is empty")));
            }
            if c.len() > MAX_COMM_LEN {
                return Err(invalid(format!(
                    "{who}: comm {c:?} is {} bytes but the kernel keeps at most {MAX_COMM_LEN} in \
                     /proc/<pid>/comm, so it could never match: give the first {MAX_COMM_LEN} bytes or \
                     use cmdline",
                    c.len()
                )));
            }
        }
        if self.cmdline.as_deref() == Some("") {
            return Err(invalid(format!(
                "{who}: cmdline is empty (it would match every process)"
            )));
        }
        if self.pid == Some(0) {
            return Err(invalid(format!("{who}: pid must be > 0")));
        }
        if let Some(argv) = &self.command {
            match argv.first() {
                None => {
                    return Err(invalid(format!(
                        "{who}: command is empty: give the program and its arguments, e.g. \
                         [\"sleep\", \"30\"]"
                    )))
                }
                Some(p) if p.is_empty() => {
                    return Err(invalid(format!("{who}: command[0] (the program) is empty")))
                }
                Some(_) => {}
            }
            if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
                return Err(invalid(format!("{who}: command[{i}] contains a NUL byte")));
            }
        }
        if self.restart && self.command.is_none() {
            return Err(invalid(format!(
                "{who}: restart applies only to command watches (the agent restarts only what it started)"
            )));
        }
        if let Some(v) = self.cpu_pct_max {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(format!(
                    "{who}: cpu_pct_max {v} must be a finite number > 0 (percent of one CPU; above 100 \
                     for multi-threaded processes)"
                )));
            }
        }
        if let Some(v) = self.rss_mb_max {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(format!(
                    "{who}: rss_mb_max {v} must be a finite number > 0 (MiB)"
                )));
            }
        }
        Ok(())
    }
}

/// What the sensor needs from `/proc/<pid>/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    /// Command name (field 2), without the parentheses; may contain spaces and `)`.
    pub comm: String,
    /// State letter (field 3): `R`, `S`, `D`, `Z` (zombie), ...
    pub state: char,
    /// Kernel `PF_*` flags (field 9).
    pub flags: u64,
    /// User CPU time, clock ticks (field 14).
    pub utime: u64,
    /// System CPU time, clock ticks (field 15).
    pub stime: u64,
    /// Threads (field 20).
    pub threads: u64,
    /// Start time after boot, clock ticks (field 22): with the pid, the process's identity.
    pub start_time: u64,
}

impl Stat {
    /// The process has exited or is exiting: a zombie (`Z`), dead (`X`, `x`), or its (main)
    /// thread is in its exit path (`PF_EXITING`, set before the address space and with it the
    /// command line go away).
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x') || self.flags & PF_EXITING != 0
    }
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may itself contain spaces
/// and parentheses, so it runs from the first `(` to the **last** `)`, and the other fields are
/// counted from there.
pub fn parse_stat(text: &str) -> Result<Stat, SensorError> {
    const FILE: &str = "/proc/<pid>/stat";
    let (open, close) = match (text.find('('), text.rfind(')')) {
        (Some(o), Some(c)) if o < c => (o, c),
        _ => return Err(SensorError::parse(FILE, 1, "no \"(comm)\" field")),
    };
    let pid = parse_num::<u32>(Some(text[..open].trim()), FILE, 1, "pid")?;
    // After ")": field 3 (state) is index 0, so field n is index n - 3.
    let rest: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    let mut state_chars = rest.first().map(|s| s.chars());
    let state = match state_chars.as_mut().map(|c| (c.next(), c.next())) {
        Some((Some(c), None)) => c,
        _ => return Err(SensorError::parse(FILE, 1, "missing or invalid state")),
    };
    let field = |n: usize, what: &str| parse_num::<u64>(rest.get(n - 3).copied(), FILE, 1, what);
    Ok(Stat {
        pid,
        comm: text[open + 1..close].to_string(),
        state,
        flags: field(9, "flags")?,
        utime: field(14, "utime")?,
        stime: field(15, "stime")?,
        threads: field(20, "num_threads")?,
        start_time: field(22, "starttime")?,
    })
}

/// The first three fields of `/proc/<pid>/statm`, in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statm {
    pub size_pages: u64,
    pub resident_pages: u64,
    pub shared_pages: u64,
}

/// Parses `/proc/<pid>/statm`.
pub fn parse_statm(text: &str) -> Result<Statm, SensorError> {
    const FILE: &str = "/proc/<pid>/statm";
    let mut it = text.split_ascii_whitespace();
    Ok(Statm {
        size_pages: parse_num(it.next(), FILE, 1, "size")?,
        resident_pages: parse_num(it.next(), FILE, 1, "resident")?,
        shared_pages: parse_num(it.next(), FILE, 1, "shared")?,
    })
}

/// `/proc/<pid>/cmdline` (NUL-terminated arguments) as the arguments joined by `' '`. Invalid
/// UTF-8 is replaced; a kernel thread's empty cmdline gives `""`.
pub fn cmdline_text(raw: &[u8]) -> String {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    let joined: Vec<u8> = raw.iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
    String::from_utf8_lossy(&joined).into_owned()
}

/// The value of `key` in an auxiliary vector (`/proc/self/auxv`: native-endian word pairs of
/// key and value, ended by key 0). `None` when absent, zero or truncated.
pub fn auxv_value(auxv: &[u8], key: usize) -> Option<u64> {
    const W: usize = std::mem::size_of::<usize>();
    for pair in auxv.chunks_exact(2 * W) {
        let k = usize::from_ne_bytes(pair[..W].try_into().ok()?);
        let v = usize::from_ne_bytes(pair[W..].try_into().ok()?);
        match k {
            0 => return None,
            _ if k == key => return (v > 0).then_some(v as u64),
            _ => {}
        }
    }
    None
}

/// Name of a signal whose number is the same on every Linux architecture.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// How a process ended, as the `kind`, `detail`, `status` and `signal` of its `proc.event`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExitReport {
    pub kind: &'static str,
    pub detail: String,
    /// Exit status, NaN when killed by a signal or unknown.
    pub status: f64,
    /// Killing signal, NaN when none or unknown.
    pub signal: f64,
}

/// Describes a wait status: status 0 is `exit`, another status or a signal `abnormal_exit`.
/// (A raw wait status, e.g. from the proc connector, converts with `ExitStatus::from_raw`.)
pub fn describe_exit(status: ExitStatus) -> ExitReport {
    if let Some(code) = status.code() {
        return ExitReport {
            kind: if code == 0 { KIND_EXIT } else { KIND_ABNORMAL_EXIT },
            detail: format!("exit status {code}"),
            status: f64::from(code),
            signal: f64::NAN,
        };
    }
    if let Some(sig) = status.signal() {
        let mut detail = match signal_name(sig) {
            Some(name) => format!("killed by signal {sig} ({name})"),
            None => format!("killed by signal {sig}"),
        };
        if status.core_dumped() {
            detail.push_str(", core dumped");
        }
        return ExitReport {
            kind: KIND_ABNORMAL_EXIT,
            detail,
            status: f64::NAN,
            signal: f64::from(sig),
        };
    }
    vanished(format!(
        "exited (status unknown: wait status {:#x})",
        status.into_raw()
    ))
}

fn vanished(detail: String) -> ExitReport {
    ExitReport {
        kind: KIND_VANISHED,
        detail,
        status: f64::NAN,
        signal: f64::NAN,
    }
}

/// One state change, before the watch's `running` count is known.
struct Change {
    kind: &'static str,
    detail: String,
    pid: u32,
    status: f64,
    signal: f64,
    cpu_pct: f64,
    rss_mb: f64,
}

impl Change {
    fn exit(pid: u32, report: ExitReport, last: &Tracked) -> Change {
        Change {
            kind: report.kind,
            detail: report.detail,
            pid,
            status: report.status,
            signal: report.signal,
            cpu_pct: last.cpu_pct,
            rss_mb: last.rss_mb,
        }
    }

    fn other(kind: &'static str, detail: String, pid: u32, t: &Tracked) -> Change {
        Change {
            kind,
            detail,
            pid,
            status: f64::NAN,
            signal: f64::NAN,
            cpu_pct: t.cpu_pct,
            rss_mb: t.rss_mb,
        }
    }
}

/// What one sample read of a live process.
#[derive(Debug, Clone)]
struct Reading {
    stat: Stat,
    rss_pages: u64,
}

/// A process a watch follows.
#[derive(Debug, Clone)]
struct Tracked {
    start_time: u64,
    /// `now_ns` and utime + stime of the previous reading.
    last: Option<(i64, u64)>,
    cpu_pct: f64,
    rss_mb: f64,
    threads: f64,
    cpu_high: bool,
    rss_high: bool,
}

impl Tracked {
    fn new(start_time: u64) -> Tracked {
        Tracked {
            start_time,
            last: None,
            cpu_pct: f64::NAN,
            rss_mb: f64::NAN,
            threads: f64::NAN,
            cpu_high: false,
            rss_high: false,
        }
    }

    /// Takes a new reading; pushes a threshold change when a limit is crossed upwards.
    fn update(
        &mut self,
        now_ns: i64,
        r: &Reading,
        units: Units,
        cfg: &ProcessWatch,
        pid: u32,
    ) -> Vec<Change> {
        let ticks = r.stat.utime.saturating_add(r.stat.stime);
        self.cpu_pct = match self
            .last
            .and_then(|(t, prev)| Some((elapsed_s(t, now_ns)?, prev)))
        {
            Some((dt, prev)) => ticks.saturating_sub(prev) as f64 / units.ticks_per_s / dt * 100.0,
            None => f64::NAN,
        };
        self.last = Some((now_ns, ticks));
        self.rss_mb = r.rss_pages.saturating_mul(units.page_bytes) as f64 / (1024.0 * 1024.0);
        self.threads = r.stat.threads as f64;
        let mut out = Vec::new();
        if let Some(max) = cfg.cpu_pct_max {
            if crossed(&mut self.cpu_high, self.cpu_pct, max) {
                let d = format!("cpu {:.1}% > {max}%", self.cpu_pct);
                out.push(Change::other(KIND_CPU_HIGH, d, pid, self));
            }
        }
        if let Some(max) = cfg.rss_mb_max {
            if crossed(&mut self.rss_high, self.rss_mb, max) {
                let d = format!("rss {:.1} MiB > {max} MiB", self.rss_mb);
                out.push(Change::other(KIND_RSS_HIGH, d, pid, self));
            }
        }
        out
    }
}

/// Threshold state machine: true once when `value` goes above `max`; re-armed when it drops
/// below. NaN changes nothing.
fn crossed(high: &mut bool, value: f64, max: f64) -> bool {
    if value > max && !*high {
        *high = true;
        return true;
    }
    if value < max {
        *high = false;
    }
    false
}

#[derive(Debug, Clone, Copy)]
struct Units {
    ticks_per_s: f64,
    page_bytes: u64,
}

/// A supervised command's lifecycle.
enum Run {
    /// `announced`: its `start` was emitted.
    Running { child: Child, announced: bool },
    /// Exited during sample number `sample`; restarted later if `restart`.
    Exited { sample: u64 },
}

struct Supervisor {
    argv: Vec<String>,
    restart: bool,
    run: Run,
    last_spawn: Instant,
    /// Successful spawns so far.
    starts: u64,
    /// A re-spawn failure was logged (until the next success).
    failing: bool,
}

impl Supervisor {
    fn spawn(argv: &[String]) -> io::Result<Child> {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // A group of its own, so that Drop can kill what it started too.
            .process_group(0);
        cmd.spawn()
    }

    fn argv_text(&self) -> String {
        truncate(self.argv.join(" "), MAX_DETAIL_ARGV)
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Run::Running { child, .. } = &mut self.run {
            // The child is not reaped yet, so its pid (= its group id) cannot have been reused.
            let group = format!("-{}", child.id());
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &group])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

enum Target {
    Comm(String),
    Cmdline(String),
    Pid(u32),
    Command(Box<Supervisor>),
}

struct Watch {
    cfg: ProcessWatch,
    target: Target,
    /// Matched live processes (for a command: its running child).
    procs: BTreeMap<u32, Tracked>,
    /// Processes seen exited whose exit notification had not come yet: reported next sample.
    departing: BTreeMap<u32, Tracked>,
    /// The first sample was taken (later starts are "started", not "already running").
    sampled: bool,
    /// The tracking bound was hit and logged.
    capped: bool,
}

impl Watch {
    fn is_match(&self) -> bool {
        !matches!(self.target, Target::Command(_))
    }

    /// Whether an exit notification for `pid` concerns this watch.
    fn awaits_exit(&self, pid: u32) -> bool {
        self.is_match() && (self.procs.contains_key(&pid) || self.departing.contains_key(&pid))
    }
}

/// Samples the watches; see the module docs.
pub struct ProcessSensor {
    source: String,
    period: Duration,
    proc_root: PathBuf,
    watches: Vec<Watch>,
    units: Units,
    /// Samples taken so far.
    samples: u64,
    connector: Option<connector::ExitListener>,
    /// Exit notifications are expected (the connector is on): a process seen exited without
    /// one yet is reported a sample later rather than as vanished.
    notified: bool,
    /// Raw wait status of exited processes that a match watch tracks, by pid, from the
    /// connector; kept until the exit is reported.
    exits: HashMap<u32, i32>,
    bytes: Vec<u8>,
}

impl ProcessSensor {
    /// Validates `watches` (each, and unique names), starts the `command` watches and, when
    /// `proc_root` is `/proc` and some watch matches processes, subscribes to the proc
    /// connector. A command that cannot be started is an error (the ones already started are
    /// killed again).
    pub fn new(
        source: &str,
        period: Duration,
        watches: Vec<ProcessWatch>,
        proc_root: PathBuf,
    ) -> Result<ProcessSensor, SensorError> {
        let config = |message: String| SensorError::config(CONFIG_ORIGIN, message);
        validate_source(source).map_err(|e| config(e.to_string()))?;
        if period.is_zero() {
            return Err(config("the process sensor period must be > 0".to_string()));
        }
        let mut names = HashSet::new();
        for w in &watches {
            w.validate()?;
            if !names.insert(w.name.as_str()) {
                return Err(config(format!(
                    "two process watches are named {:?}: names must be unique",
                    w.name
                )));
            }
        }
        let auxv = std::fs::read(proc_root.join("self/auxv")).unwrap_or_default();
        let units = Units {
            ticks_per_s: auxv_value(&auxv, AT_CLKTCK).unwrap_or(DEFAULT_CLOCK_TICKS) as f64,
            page_bytes: auxv_value(&auxv, AT_PAGESZ).unwrap_or(DEFAULT_PAGE_SIZE),
        };
        let mut sensor = ProcessSensor {
            source: source.to_string(),
            period,
            watches: Vec::with_capacity(watches.len()),
            units,
            samples: 0,
            connector: None,
            notified: false,
            exits: HashMap::new(),
            bytes: Vec::with_capacity(4096),
            proc_root,
        };
        for cfg in watches {
            let target = if let Some(c) = &cfg.comm {
                Target::Comm(c.clone())
            } else if let Some(c) = &cfg.cmdline {
                Target::Cmdline(c.clone())
            } else if let Some(p) = cfg.pid {
                Target::Pid(p)
            } else {
                let argv = cfg.command.clone().unwrap_or_default();
                // On error `sensor` drops here, killing the commands already started.
                let child = Supervisor::spawn(&argv).map_err(|e| {
                    config(format!(
                        "process watch {:?}: cannot start {:?}: {e}",
                        cfg.name, argv[0]
                    ))
                })?;
                Target::Command(Box::new(Supervisor {
                    argv,
                    restart: cfg.restart,
                    run: Run::Running {
                        child,
                        announced: false,
                    },
                    last_spawn: Instant::now(),
                    starts: 1,
                    failing: false,
                }))
            };
            sensor.watches.push(Watch {
                cfg,
                target,
                procs: BTreeMap::new(),
                departing: BTreeMap::new(),
                sampled: false,
                capped: false,
            });
        }
        if sensor.watches.iter().any(Watch::is_match) && sensor.proc_root == Path::new("/proc") {
            match connector::ExitListener::open() {
                Ok(l) => {
                    sensor.connector = Some(l);
                    sensor.notified = true;
                }
                Err(e) => tracing::info!(
                    error = %e,
                    "proc connector unavailable: exits of watched processes the agent did not start \
                     are reported as vanished"
                ),
            }
        }
        Ok(sensor)
    }

    /// Whether exit statuses of watched processes that are not the agent's children come from
    /// the proc connector (else they are reported as `vanished`).
    pub fn proc_connector_active(&self) -> bool {
        self.connector.is_some()
    }

    /// Reads `stat` and `statm` of `pid`; `None` when it is gone (or a zombie) or unreadable.
    fn read_process(proc_root: &Path, pid: u32, bytes: &mut Vec<u8>) -> Option<Reading> {
        let stat = read_stat(proc_root, pid, bytes)?;
        if stat.exited() {
            return None;
        }
        read_bytes(&proc_root.join(pid.to_string()).join("statm"), bytes).ok()?;
        let statm = parse_statm(&String::from_utf8_lossy(bytes)).ok()?;
        Some(Reading {
            stat,
            rss_pages: statm.resident_pages,
        })
    }

    /// The pids each match watch selects now (bounded), by watch index.
    fn select(&mut self) -> Result<Vec<Vec<u32>>, SensorError> {
        let mut selected: Vec<Vec<u32>> = vec![Vec::new(); self.watches.len()];
        let comm = self.watches.iter().any(|w| matches!(w.target, Target::Comm(_)));
        let cmdline = self
            .watches
            .iter()
            .any(|w| matches!(w.target, Target::Cmdline(_)));
        if comm || cmdline {
            let entries = std::fs::read_dir(&self.proc_root).map_err(|source| SensorError::Io {
                path: self.proc_root.clone(),
                source,
            })?;
            let mut path = self.proc_root.clone();
            let mut cmd_text = String::new();
            for entry in entries {
                // A process that exits is just not listed; an error here would silently cut the
                // listing short, so it fails the sample instead.
                let name = entry
                    .map_err(|source| SensorError::Io {
                        path: self.proc_root.clone(),
                        source,
                    })?
                    .file_name();
                let Some(pid) = name.to_str().and_then(parse_pid) else {
                    continue;
                };
                path.push(&name);
                let mut comm_ok = false;
                if comm {
                    path.push("comm");
                    comm_ok = read_bytes(&path, &mut self.bytes).is_ok();
                    path.pop();
                }
                let comm_bytes = self.bytes.strip_suffix(b"\n").unwrap_or(&self.bytes);
                let comm_hits: Vec<usize> = self
                    .watches
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| {
                        comm_ok && matches!(&w.target, Target::Comm(c) if c.as_bytes() == comm_bytes)
                    })
                    .map(|(i, _)| i)
                    .collect();
                let mut cmd_ok = false;
                if cmdline {
                    path.push("cmdline");
                    cmd_ok = read_bytes(&path, &mut self.bytes).is_ok();
                    path.pop();
                    cmd_text = cmdline_text(&self.bytes);
                }
                path.pop();
                for (i, w) in self.watches.iter().enumerate() {
                    let hit = match &w.target {
                        Target::Comm(_) => comm_hits.contains(&i),
                        Target::Cmdline(s) => cmd_ok && cmd_text.contains(s.as_str()),
                        _ => false,
                    };
                    if hit {
                        selected[i].push(pid);
                    }
                }
            }
        }
        for (i, w) in self.watches.iter_mut().enumerate() {
            if let Target::Pid(p) = w.target {
                selected[i].push(p);
            }
            // Bound: the processes already tracked first, then new ones by pid.
            let sel = &mut selected[i];
            sel.sort_unstable();
            if sel.len() > MAX_TRACKED_PER_WATCH {
                let (mut keep, new): (Vec<u32>, Vec<u32>) = sel.iter().partition(|p| w.procs.contains_key(p));
                let room = MAX_TRACKED_PER_WATCH.saturating_sub(keep.len());
                keep.extend(new.into_iter().take(room));
                keep.sort_unstable();
                *sel = keep;
                if !w.capped {
                    w.capped = true;
                    tracing::warn!(
                        watch = %w.cfg.name,
                        max = MAX_TRACKED_PER_WATCH,
                        "process watch matches more processes than it tracks; the others are ignored"
                    );
                }
            }
        }
        Ok(selected)
    }

    /// Drains the proc connector, keeping the exits of processes a match watch tracks.
    fn drain_exits(&mut self) {
        let Some(listener) = &mut self.connector else {
            return;
        };
        let watches = &self.watches;
        let exits = &mut self.exits;
        let tracked = |pid: u32| watches.iter().any(|w| w.awaits_exit(pid));
        match listener.drain(|pid, code| {
            if tracked(pid) {
                exits.insert(pid, code);
            }
        }) {
            Ok(false) => {}
            Ok(true) => {
                // Notifications were dropped: what is kept may be older than a lost one.
                tracing::warn!("proc connector queue overflowed: some exits will read as vanished");
                exits.clear();
            }
            Err(e) => {
                tracing::warn!(error = %e, "proc connector failed; exits will read as vanished from now on");
                exits.clear();
                self.connector = None;
                self.notified = false;
            }
        }
    }

    fn sample_match(
        &mut self,
        i: usize,
        pids: &[u32],
        readings: &HashMap<u32, Option<Reading>>,
        still_running: &HashSet<u32>,
        now_ns: i64,
    ) -> Vec<Change> {
        let units = self.units;
        let notified = self.notified;
        let w = &mut self.watches[i];
        let live: BTreeMap<u32, &Reading> = pids
            .iter()
            .filter_map(|p| readings.get(p)?.as_ref().map(|r| (*p, r)))
            .collect();
        let gone: Vec<u32> = w
            .procs
            .iter()
            .filter(|(p, t)| live.get(p).is_none_or(|r| r.stat.start_time != t.start_time))
            .map(|(p, _)| *p)
            .collect();
        let mut changes = Vec::new();
        // The kernel sends the exit notification only after the process turned into a zombie
        // (and its cmdline emptied even earlier), so one seen exited last sample may have had
        // none yet: its notification has arrived by now unless it was lost.
        for (pid, t) in std::mem::take(&mut w.departing) {
            let report = match self.exits.get(&pid) {
                Some(&code) => describe_exit(ExitStatus::from_raw(code)),
                None => vanished(NO_NOTIFICATION.to_string()),
            };
            changes.push(Change::exit(pid, report, &t));
        }
        for pid in gone {
            let Some(t) = w.procs.remove(&pid) else {
                continue;
            };
            let report = if still_running.contains(&pid) {
                vanished(NO_LONGER_MATCHES.to_string())
            } else {
                match self.exits.get(&pid) {
                    Some(&code) => describe_exit(ExitStatus::from_raw(code)),
                    None if notified => {
                        w.departing.insert(pid, t);
                        continue;
                    }
                    None => vanished(NOT_A_CHILD.to_string()),
                }
            };
            changes.push(Change::exit(pid, report, &t));
        }
        let mut thresholds = Vec::new();
        for (pid, r) in live {
            let t = match w.procs.get_mut(&pid) {
                Some(t) => t,
                None => {
                    let t = w.procs.entry(pid).or_insert(Tracked::new(r.stat.start_time));
                    thresholds.extend(t.update(now_ns, r, units, &w.cfg, pid));
                    let how = if w.sampled { "started" } else { "already running" };
                    let detail = truncate(format!("{how} (comm {:?})", r.stat.comm), MAX_DETAIL_ARGV);
                    changes.push(Change::other(KIND_START, detail, pid, t));
                    continue;
                }
            };
            thresholds.extend(t.update(now_ns, r, units, &w.cfg, pid));
        }
        changes.extend(thresholds);
        changes
    }

    fn sample_command(&mut self, i: usize, now_ns: i64) -> Vec<Change> {
        let (units, samples, period) = (self.units, self.samples, self.period);
        let proc_root = self.proc_root.clone();
        let w = &mut self.watches[i];
        let Target::Command(sup) = &mut w.target else {
            return Vec::new();
        };
        let mut changes = Vec::new();
        if let Run::Exited { sample } = sup.run {
            if sup.restart && sample < samples && sup.last_spawn.elapsed() >= period {
                sup.last_spawn = Instant::now();
                match Supervisor::spawn(&sup.argv) {
                    Ok(child) => {
                        sup.starts += 1;
                        sup.failing = false;
                        sup.run = Run::Running {
                            child,
                            announced: false,
                        };
                    }
                    Err(e) => {
                        if !sup.failing {
                            sup.failing = true;
                            tracing::warn!(
                                watch = %w.cfg.name,
                                error = %e,
                                "cannot restart command; retrying every period"
                            );
                        }
                    }
                }
            }
        }
        let argv_text = sup.argv_text();
        let starts = sup.starts;
        let Run::Running { child, announced } = &mut sup.run else {
            return changes;
        };
        let pid = child.id();
        let reading = Self::read_process(&proc_root, pid, &mut self.bytes);
        if !*announced {
            *announced = true;
            let mut t = Tracked::new(reading.as_ref().map_or(0, |r| r.stat.start_time));
            let mut thresholds = Vec::new();
            if let Some(r) = &reading {
                thresholds = t.update(now_ns, r, units, &w.cfg, pid);
            }
            let detail = match starts {
                1 => format!("started by the agent: {argv_text}"),
                n => format!("restarted by the agent (start {n}): {argv_text}"),
            };
            changes.push(Change::other(KIND_START, detail, pid, &t));
            changes.extend(thresholds);
            w.procs.insert(pid, t);
        } else if let (Some(r), Some(t)) = (&reading, w.procs.get_mut(&pid)) {
            changes.extend(t.update(now_ns, r, units, &w.cfg, pid));
        }
        let report = match child.try_wait() {
            Ok(None) => return changes,
            Ok(Some(status)) => describe_exit(status),
            Err(e) => vanished(format!("exited (status unknown: cannot wait for it: {e})")),
        };
        let last = w.procs.remove(&pid).unwrap_or_else(|| Tracked::new(0));
        changes.push(Change::exit(pid, report, &last));
        sup.run = Run::Exited { sample: samples };
        changes
    }

    fn push_events(&self, i: usize, changes: Vec<Change>, now_ns: i64, out: &mut Vec<EventData>) {
        let w = &self.watches[i];
        let running = w.procs.len() as f64;
        for c in changes {
            out.push(event(
                PROC_EVENT,
                &self.source,
                now_ns,
                vec![c.pid as f64, c.status, c.signal, c.cpu_pct, c.rss_mb, running],
                vec![w.cfg.name.clone(), c.kind.to_string(), c.detail],
            ));
        }
        for (pid, t) in &w.procs {
            out.push(event(
                PROC_USAGE,
                &self.source,
                now_ns,
                vec![*pid as f64, t.cpu_pct, t.rss_mb, t.threads, running],
                vec![w.cfg.name.clone()],
            ));
        }
    }
}

impl Sensor for ProcessSensor {
    fn name(&self) -> &str {
        "process"
    }

    fn schemas(&self) -> Vec<EventSchema> {
        process_schemas()
    }

    fn period(&self) -> Duration {
        self.period
    }

    /// Order: for each watch, its changes (exits, starts, thresholds) then its usage events.
    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
        self.samples += 1;
        // Scan first, drain the connector second: a process missing from the scan exited
        // before it, so its exit notification is already queued.
        let selected = self.select()?;
        // `None`: gone, a zombie or unreadable (read once even when several watches match it).
        let mut readings: HashMap<u32, Option<Reading>> = HashMap::new();
        for &pid in selected.iter().flatten() {
            readings
                .entry(pid)
                .or_insert_with(|| Self::read_process(&self.proc_root, pid, &mut self.bytes));
        }
        // Tracked processes that no longer match but still run (changed comm or cmdline, same
        // start time, not exiting) are not exits.
        let mut still_running = HashSet::new();
        for (w, pids) in self.watches.iter().zip(&selected) {
            for (&pid, t) in &w.procs {
                let matched = pids.binary_search(&pid).is_ok()
                    && readings
                        .get(&pid)
                        .is_some_and(|r| r.as_ref().is_some_and(|r| r.stat.start_time == t.start_time));
                if w.is_match() && !matched && !still_running.contains(&pid) {
                    let stat = read_stat(&self.proc_root, pid, &mut self.bytes);
                    if stat.is_some_and(|s| s.start_time == t.start_time && !s.exited()) {
                        still_running.insert(pid);
                    }
                }
            }
        }
        self.drain_exits();
        let mut reported = HashSet::new();
        for (i, pids) in selected.iter().enumerate() {
            let changes = if self.watches[i].is_match() {
                self.sample_match(i, pids, &readings, &still_running, now_ns)
            } else {
                self.sample_command(i, now_ns)
            };
            reported.extend(
                changes
                    .iter()
                    .filter(|c| matches!(c.kind, KIND_EXIT | KIND_ABNORMAL_EXIT | KIND_VANISHED))
                    .map(|c| c.pid),
            );
            self.push_events(i, changes, now_ns, out);
            self.watches[i].sampled = true;
        }
        // Keep the statuses still awaited. One reported this sample is dropped even if the pid
        // is tracked again (reused), so it cannot be taken for the new process's.
        let watches = &self.watches;
        self.exits.retain(|pid, _| {
            watches.iter().any(|w| w.departing.contains_key(pid))
                || (watches.iter().any(|w| w.awaits_exit(*pid)) && !reported.contains(pid))
        });
        Ok(())
    }
}

/// A pid directory name: ASCII digits only.
fn parse_pid(name: &str) -> Option<u32> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// `/proc/<pid>/stat`, or `None` when the process is gone (or the file is unreadable).
fn read_stat(proc_root: &Path, pid: u32, bytes: &mut Vec<u8>) -> Option<Stat> {
    read_bytes(&proc_root.join(pid.to_string()).join("stat"), bytes).ok()?;
    parse_stat(&String::from_utf8_lossy(bytes)).ok()
}

fn read_bytes(path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    std::fs::File::open(path)?.read_to_end(buf).map(|_| ())
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut with "...".
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// The Linux proc connector: exit notifications of every process on the host.
mod connector {
    use std::io;
    use std::time::{Duration, Instant};

    use netlink_sys::{protocols::NETLINK_CONNECTOR, Socket, SocketAddr};

    /// `CN_IDX_PROC` / `CN_VAL_PROC` of `<linux/connector.h>`; the index is also the netlink
    /// multicast group.
    const CN_IDX_PROC: u32 = 1;
    const CN_VAL_PROC: u32 = 1;
    /// `NLMSG_DONE`: the connector's message type.
    const NLMSG_DONE: u16 = 3;
    /// `enum proc_cn_mcast_op` and `enum what` of `<linux/cn_proc.h>`.
    const PROC_CN_MCAST_LISTEN: u32 = 1;
    const PROC_CN_MCAST_IGNORE: u32 = 2;
    const PROC_EVENT_NONE: u32 = 0;
    const PROC_EVENT_EXIT: u32 = 0x8000_0000;
    const ENOBUFS: i32 = 105;
    /// `struct nlmsghdr`, `struct cn_msg`, and the header of `struct proc_event` (what, cpu,
    /// timestamp) before its `event_data` union.
    const NLMSG_HDR: usize = 16;
    const CN_MSG: usize = 20;
    const EVENT_HDR: usize = 16;
    /// Messages handled by one drain at most, so that a storm cannot hold a sample forever.
    const MAX_DRAIN: usize = 100_000;

    /// A message of the proc connector.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Message {
        /// The answer to a subscription: `ack` is the request's ack + 1, `err` an errno.
        Ack { ack: u32, err: u32 },
        /// A task exited. `exit_code` is its wait status.
        Exit { pid: u32, tgid: u32, exit_code: u32 },
        /// Any other event, or another connector.
        Other,
    }

    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    }

    fn u16_at(b: &[u8], at: usize) -> Option<u16> {
        Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
    }

    /// Parses one datagram (one or more netlink messages) into `out`. Malformed tails are
    /// ignored.
    pub(super) fn parse_datagram(buf: &[u8], out: &mut Vec<Message>) {
        let mut off = 0;
        while let Some(len) = u32_at(buf, off) {
            let len = len as usize;
            if len < NLMSG_HDR || off + len > buf.len() {
                return;
            }
            out.push(parse_message(&buf[off + NLMSG_HDR..off + len]));
            off += (len + 3) & !3;
        }
    }

    /// One netlink payload: a `cn_msg` and its data.
    fn parse_message(m: &[u8]) -> Message {
        let (Some(idx), Some(val), Some(ack), Some(len)) =
            (u32_at(m, 0), u32_at(m, 4), u32_at(m, 12), u16_at(m, 16))
        else {
            return Message::Other;
        };
        let Some(data) = m.get(CN_MSG..CN_MSG + len as usize) else {
            return Message::Other;
        };
        if idx != CN_IDX_PROC || val != CN_VAL_PROC {
            return Message::Other;
        }
        let d = EVENT_HDR;
        match u32_at(data, 0) {
            Some(PROC_EVENT_NONE) => match u32_at(data, d) {
                Some(err) => Message::Ack { ack, err },
                None => Message::Other,
            },
            Some(PROC_EVENT_EXIT) => match (u32_at(data, d), u32_at(data, d + 4), u32_at(data, d + 8)) {
                (Some(pid), Some(tgid), Some(exit_code)) => Message::Exit { pid, tgid, exit_code },
                _ => Message::Other,
            },
            _ => Message::Other,
        }
    }

    /// A control message to the kernel: `nlmsghdr` + `cn_msg` + `payload` words.
    pub(super) fn control_message(port: u32, ack: u32, payload: &[u32]) -> Vec<u8> {
        let data_len = 4 * payload.len();
        let mut m = Vec::with_capacity(NLMSG_HDR + CN_MSG + data_len);
        m.extend_from_slice(&((NLMSG_HDR + CN_MSG + data_len) as u32).to_ne_bytes());
        m.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes()); // flags
        m.extend_from_slice(&0u32.to_ne_bytes()); // seq
        m.extend_from_slice(&port.to_ne_bytes());
        for w in [CN_IDX_PROC, CN_VAL_PROC, 0, ack] {
            m.extend_from_slice(&w.to_ne_bytes());
        }
        m.extend_from_slice(&(data_len as u16).to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes()); // flags
        for w in payload {
            m.extend_from_slice(&w.to_ne_bytes());
        }
        m
    }

    /// A subscribed, non-blocking connector socket.
    pub(super) struct ExitListener {
        sock: Socket,
        port: u32,
        buf: Vec<u8>,
        msgs: Vec<Message>,
    }

    impl ExitListener {
        /// Subscribes and waits (briefly) for the kernel's acknowledgement, which proves the
        /// connector works for us: the kernel stays silent for a requester outside the initial
        /// namespaces, and answers EPERM without CAP_NET_ADMIN.
        pub(super) fn open() -> io::Result<ExitListener> {
            let mut sock = Socket::new(NETLINK_CONNECTOR)?;
            sock.bind(&SocketAddr::new(0, CN_IDX_PROC))?;
            let mut addr = SocketAddr::new(0, 0);
            sock.get_address(&mut addr)?;
            let port = addr.port_number();
            sock.set_non_blocking(true)?;
            // Room for bursts between samples; capped by net.core.rmem_max, best effort.
            let _ = sock.set_rx_buf_sz(1i32 << 20);
            let mut l = ExitListener {
                sock,
                port,
                buf: vec![0; 8192],
                msgs: Vec::new(),
            };
            // The 1-word form subscribes to every event but is answered on every kernel; the ack
            // echoes our ack field + 1 (the port, unique on the host).
            l.send(&[PROC_CN_MCAST_LISTEN])?;
            let deadline = Instant::now() + Duration::from_millis(500);
            loop {
                let n = match l.recv() {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "no answer to the subscription (not in the initial pid and user \
                                 namespaces, or no CONFIG_PROC_EVENTS)",
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                l.msgs.clear();
                parse_datagram(&l.buf[..n], &mut l.msgs);
                let ours = l.msgs.iter().find_map(|m| match *m {
                    Message::Ack { ack, err } if ack == port.wrapping_add(1) => Some(err),
                    _ => None,
                });
                match ours {
                    Some(0) => break,
                    Some(err) => return Err(io::Error::from_raw_os_error(err as i32)),
                    None => {}
                }
            }
            // Linux >= 6.6 reads a 2-word form as "these events only" (the same subscription
            // is not counted twice); older kernels ignore it and keep sending everything.
            l.send(&[PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT])?;
            Ok(l)
        }

        fn send(&self, payload: &[u32]) -> io::Result<()> {
            let msg = control_message(self.port, self.port, payload);
            self.sock.send_to(&msg, &SocketAddr::new(0, 0), 0).map(|_| ())
        }

        fn recv(&mut self) -> io::Result<usize> {
            let mut slice = &mut self.buf[..];
            let n = self.sock.recv(&mut slice, 0)?;
            Ok(n.min(self.buf.len()))
        }

        /// Hands every queued process exit (pid, wait status) to `on_exit`: the exits of
        /// thread-group leaders, whose wait status is the process's (a group exit gives every
        /// thread the group's status; a worker thread's own exit says nothing about the process).
        /// `Ok(true)` when notifications were lost (the socket queue overflowed).
        pub(super) fn drain(&mut self, mut on_exit: impl FnMut(u32, i32)) -> io::Result<bool> {
            let mut lost = false;
            for _ in 0..MAX_DRAIN {
                let n = match self.recv() {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(lost),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.raw_os_error() == Some(ENOBUFS) => {
                        lost = true;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                self.msgs.clear();
                parse_datagram(&self.buf[..n], &mut self.msgs);
                for m in &self.msgs {
                    match *m {
                        Message::Exit { pid, tgid, exit_code } if pid == tgid => {
                            on_exit(pid, exit_code as i32)
                        }
                        _ => {}
                    }
                }
            }
            Ok(lost)
        }
    }

    impl Drop for ExitListener {
        fn drop(&mut self) {
            // Tell the kernel one listener fewer (it stops building events when none is left).
            let _ = self.send(&[PROC_CN_MCAST_IGNORE, PROC_EVENT_NONE]);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn reply(what: u32, data: &[u32], ack: u32) -> Vec<u8> {
            let mut ev = Vec::new();
            ev.extend_from_slice(&what.to_ne_bytes());
            ev.extend_from_slice(&3u32.to_ne_bytes()); // cpu
            ev.extend_from_slice(&123_456_789u64.to_ne_bytes()); // timestamp
            for w in data {
                ev.extend_from_slice(&w.to_ne_bytes());
            }
            let mut m = control_message(0, ack, &[]);
            let total = m.len() + ev.len();
            m[..4].copy_from_slice(&(total as u32).to_ne_bytes());
            m[NLMSG_HDR + 16..NLMSG_HDR + 18].copy_from_slice(&(ev.len() as u16).to_ne_bytes());
            m.extend_from_slice(&ev);
            m
        }

        #[test]
        fn parses_exit_ack_and_others() {
            let mut out = Vec::new();
            // exit of pid 41 (thread of 40) with wait status 0x300 = "exit 3", exit_signal SIGCHLD
            let mut d = reply(PROC_EVENT_EXIT, &[41, 40, 0x300, 17, 1, 1], 0);
            d.extend(reply(PROC_EVENT_NONE, &[0], 78));
            d.extend(reply(1, &[1, 1, 2, 2], 0)); // a fork event
            parse_datagram(&d, &mut out);
            assert_eq!(
                out,
                [
                    Message::Exit {
                        pid: 41,
                        tgid: 40,
                        exit_code: 0x300
                    },
                    Message::Ack { ack: 78, err: 0 },
                    Message::Other
                ]
            );
            // truncated: no panic, nothing past the damage
            out.clear();
            let whole = reply(PROC_EVENT_EXIT, &[41, 40, 9, 17, 1, 1], 0);
            parse_datagram(&whole[..whole.len() - 5], &mut out);
            assert!(out.is_empty());
            parse_datagram(&[], &mut out);
            parse_datagram(&[1, 2, 3], &mut out);
            assert!(out.is_empty());
            // an exit with too short a body, another connector
            let mut short = reply(PROC_EVENT_EXIT, &[41], 0);
            let mut other = reply(PROC_EVENT_EXIT, &[41, 40, 9, 17, 1, 1], 0);
            other[NLMSG_HDR..NLMSG_HDR + 4].copy_from_slice(&7u32.to_ne_bytes());
            short.extend(other);
            parse_datagram(&short, &mut out);
            assert_eq!(out, [Message::Other, Message::Other]);
        }

        #[test]
        fn control_message_layout() {
            let m = control_message(77, 77, &[PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT]);
            assert_eq!(m.len(), 44);
            assert_eq!(u32_at(&m, 0), Some(44));
            assert_eq!(u16_at(&m, 4), Some(NLMSG_DONE));
            assert_eq!(u32_at(&m, 12), Some(77));
            assert_eq!(u32_at(&m, 16), Some(CN_IDX_PROC));
            assert_eq!(u32_at(&m, 28), Some(77));
            assert_eq!(u16_at(&m, 32), Some(8));
            assert_eq!(u32_at(&m, 40), Some(PROC_EVENT_EXIT));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::event::{validate_schema, Layout};
    use std::time::SystemTime;

    // ---- parsers ------------------------------------------------------------------------

    /// A real line (`cat /proc/self/stat` on the development machine).
    const REAL_STAT: &str = "5509 (cat) R 5465 5465 23328 0 -1 4194304 103 0 0 0 0 0 0 0 20 0 1 0 939226 \
        3133440 416 18446744073709551615 94250838577152 94250838597033 140734868192800 0 0 0 0 0 0 0 0 0 17 \
        1 0 0 0 0 0 94250838613040 94250838614656 94250898370560 140734868199978 140734868199998 \
        140734868199998 140734868201451 0\n";

    /// A stat line with the fields the sensor reads.
    fn stat_line(
        pid: u32,
        comm: &str,
        state: char,
        utime: u64,
        stime: u64,
        threads: u64,
        start: u64,
    ) -> String {
        format!(
            "{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 {threads} \
             0 \
             {start} 1000000 500 18446744073709551615 1 1 0 0 0 0 0 4096 17133 0 0 0 17 1 0 0 0 0 0\n"
        )
    }

    #[test]
    fn parses_stat_with_awkward_comm() {
        let s = parse_stat(REAL_STAT).unwrap();
        assert_eq!(
            s,
            Stat {
                pid: 5509,
                comm: "cat".into(),
                state: 'R',
                flags: 4194304,
                utime: 0,
                stime: 0,
                threads: 1,
                start_time: 939226,
            }
        );
        // spaces and parentheses in comm: it ends at the last ')'
        let s = parse_stat(&stat_line(42, "my (odd) prog) x", 'S', 250, 50, 7, 1234)).unwrap();
        assert_eq!(s.comm, "my (odd) prog) x");
        assert_eq!(
            (s.pid, s.state, s.utime, s.stime, s.threads, s.start_time),
            (42, 'S', 250, 50, 7, 1234)
        );
        assert!(!s.exited());
        assert!(parse_stat(&stat_line(1, "z", 'Z', 0, 0, 1, 1)).unwrap().exited());
        let exiting = stat_line(1, "e", 'R', 0, 0, 1, 1).replace(" 4194560 ", " 4194564 ");
        assert!(parse_stat(&exiting).unwrap().exited(), "PF_EXITING");
        assert_eq!(parse_stat(&stat_line(1, "", 'S', 0, 0, 1, 1)).unwrap().comm, "");
        for bad in [
            "",
            "42 prog S 1",
            "42 )prog( S 1 2 3",
            "x (prog) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
            "42 (prog) S 1 2 3",
            "42 (prog) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
            "42 (prog) S 1 2 3 4 5 6 7 8 9 10 x 12 13 14 15 16 17 18 19 20",
        ] {
            let err = parse_stat(bad).unwrap_err();
            assert!(err.to_string().contains("/proc/<pid>/stat"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn parses_statm_and_cmdline() {
        assert_eq!(
            parse_statm("765 441 413 5 0 123 0\n").unwrap(),
            Statm {
                size_pages: 765,
                resident_pages: 441,
                shared_pages: 413
            }
        );
        assert!(parse_statm("765 441\n").is_err());
        assert!(parse_statm("765 x 1\n").is_err());
        assert_eq!(cmdline_text(b"nginx\0-g\0daemon off;\0"), "nginx -g daemon off;");
        assert_eq!(
            cmdline_text(b"postgres: writer process   "),
            "postgres: writer process   "
        );
        assert_eq!(cmdline_text(b""), "");
        assert_eq!(cmdline_text(b"a\0\0b\0"), "a  b");
        assert_eq!(cmdline_text(b"caf\xe9\0x\0"), "caf\u{fffd} x");
    }

    #[test]
    fn parses_auxv() {
        let mut auxv = Vec::new();
        for (k, v) in [(AT_PAGESZ, 16384usize), (AT_CLKTCK, 250), (0, 0), (99, 1)] {
            auxv.extend_from_slice(&k.to_ne_bytes());
            auxv.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(auxv_value(&auxv, AT_PAGESZ), Some(16384));
        assert_eq!(auxv_value(&auxv, AT_CLKTCK), Some(250));
        assert_eq!(auxv_value(&auxv, 99), None, "after the terminator");
        assert_eq!(
            auxv_value(&auxv[..std::mem::size_of::<usize>() * 3], AT_CLKTCK),
            None
        );
        assert_eq!(auxv_value(&[], AT_CLKTCK), None);
        if let Ok(b) = std::fs::read("/proc/self/auxv") {
            assert!(auxv_value(&b, AT_PAGESZ).is_some_and(|p| p >= 4096));
        }
    }

    #[test]
    fn describes_exits_and_signals() {
        let d = |raw: i32| describe_exit(ExitStatus::from_raw(raw));
        let e = d(0);
        assert_eq!(
            (e.kind, e.detail.as_str(), e.status),
            (KIND_EXIT, "exit status 0", 0.0)
        );
        assert!(e.signal.is_nan());
        let e = d(3 << 8);
        assert_eq!(
            (e.kind, e.detail.as_str(), e.status),
            (KIND_ABNORMAL_EXIT, "exit status 3", 3.0)
        );
        let e = d(9);
        assert_eq!(
            (e.kind, e.detail.as_str(), e.signal),
            (KIND_ABNORMAL_EXIT, "killed by signal 9 (SIGKILL)", 9.0)
        );
        assert!(e.status.is_nan());
        assert_eq!(d(11 | 0x80).detail, "killed by signal 11 (SIGSEGV), core dumped");
        assert_eq!(d(15).detail, "killed by signal 15 (SIGTERM)");
        assert_eq!(d(6).detail, "killed by signal 6 (SIGABRT)");
        assert_eq!(d(2).detail, "killed by signal 2 (SIGINT)");
        assert_eq!(d(1).detail, "killed by signal 1 (SIGHUP)");
        assert_eq!(d(42).detail, "killed by signal 42");
        // a stopped status is no exit
        assert_eq!(d(0x137f).kind, KIND_VANISHED);
        assert_eq!(
            signal_name(10),
            None,
            "SIGUSR1's number differs across architectures"
        );
    }

    #[test]
    fn truncates_on_char_boundaries() {
        assert_eq!(truncate("short".into(), 10), "short");
        assert_eq!(truncate("abcdefghij".into(), 8), "abcde...");
        assert_eq!(truncate("ééééé".into(), 8), "éé...");
    }

    // ---- configuration ------------------------------------------------------------------

    fn watch(name: &str) -> ProcessWatch {
        ProcessWatch {
            name: name.into(),
            ..ProcessWatch::default()
        }
    }

    fn comm(name: &str, c: &str) -> ProcessWatch {
        ProcessWatch {
            comm: Some(c.into()),
            ..watch(name)
        }
    }

    fn command(name: &str, argv: &[&str], restart: bool) -> ProcessWatch {
        ProcessWatch {
            command: Some(argv.iter().map(|s| s.to_string()).collect()),
            restart,
            ..watch(name)
        }
    }

    #[test]
    fn validate_messages() {
        let err = |w: ProcessWatch| match w.validate().unwrap_err() {
            SensorError::Config { origin, message } if origin == CONFIG_ORIGIN => message,
            other => panic!("not a config error: {other}"),
        };
        assert_eq!(
            err(watch("web")),
            "process watch \"web\": set exactly one of comm, cmdline, pid or command (none is set)"
        );
        assert_eq!(
            err(ProcessWatch {
                pid: Some(1),
                ..comm("web", "nginx")
            }),
            "process watch \"web\": set exactly one of comm, cmdline, pid or command (comm and pid are set)"
        );
        assert!(err(comm(" ", "nginx")).contains("name must not be empty"));
        assert!(err(comm("w", "")).contains("comm is empty"));
        let long = err(comm("w", "a-very-long-command"));
        assert!(
            long.contains("is 19 bytes but the kernel keeps at most 15"),
            "{long}"
        );
        assert!(err(ProcessWatch {
            cmdline: Some(String::new()),
            ..watch("w")
        })
        .contains("cmdline is empty"));
        assert!(err(ProcessWatch {
            pid: Some(0),
            ..watch("w")
        })
        .contains("pid must be > 0"));
        assert!(err(command("w", &[], false)).contains("command is empty"));
        assert!(err(command("w", &[""], false)).contains("command[0] (the program) is empty"));
        assert!(err(command("w", &["a", "b\0"], false)).contains("command[1] contains a NUL"));
        assert!(err(ProcessWatch {
            restart: true,
            ..comm("w", "nginx")
        })
        .contains("restart applies only to command watches"));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(err(ProcessWatch {
                cpu_pct_max: Some(bad),
                ..comm("w", "x")
            })
            .contains("cpu_pct_max"));
            assert!(err(ProcessWatch {
                rss_mb_max: Some(bad),
                ..comm("w", "x")
            })
            .contains("rss_mb_max"));
        }
        comm("w", "fifteen-bytes-x").validate().unwrap();
        command("w", &["sleep", "1"], true).validate().unwrap();
        ProcessWatch {
            cpu_pct_max: Some(250.0),
            rss_mb_max: Some(512.0),
            ..comm("w", "x")
        }
        .validate()
        .unwrap();
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        process: Vec<ProcessWatch>,
    }

    #[test]
    fn reads_process_tables_from_toml() {
        let doc: Doc = gma_core::config::parse_toml(
            r#"
            [[process]]
            name = "web"
            comm = "nginx"
            cpu_pct_max = 80
            rss_mb_max = 512.5

            [[process]]
            name = "job"
            command = ["sleep", "30"]
            restart = true
            "#,
            "test",
        )
        .unwrap();
        assert_eq!(
            doc.process,
            [
                ProcessWatch {
                    cpu_pct_max: Some(80.0),
                    rss_mb_max: Some(512.5),
                    ..comm("web", "nginx")
                },
                command("job", &["sleep", "30"], true)
            ]
        );
        let bad = gma_core::config::parse_toml::<Doc>("[[process]]\nname = \"x\"\ncom = \"y\"\n", "test");
        assert!(bad.unwrap_err().to_string().contains("com"));
    }

    #[test]
    fn new_rejects_bad_configs() {
        let new = |source: &str, period_ms: u64, w: Vec<ProcessWatch>| {
            ProcessSensor::new(
                source,
                Duration::from_millis(period_ms),
                w,
                PathBuf::from("/nonexistent"),
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
        };
        assert!(new("h", 100, vec![comm("a", "x"), comm("a", "y")])
            .contains("two process watches are named \"a\""));
        assert!(new("h", 100, vec![watch("a")]).contains("set exactly one of"));
        assert!(new("h", 0, vec![]).contains("period must be > 0"));
        assert!(new("bad source", 100, vec![]).contains("source"));
        let e = new(
            "h",
            100,
            vec![command("a", &["/nonexistent/gma-no-such-program"], false)],
        );
        assert!(
            e.contains("cannot start \"/nonexistent/gma-no-such-program\""),
            "{e}"
        );
        let s =
            ProcessSensor::new("h", Duration::from_secs(1), vec![], PathBuf::from("/nonexistent")).unwrap();
        assert_eq!((s.name(), s.period()), ("process", Duration::from_secs(1)));
        assert!(!s.proc_connector_active());
    }

    #[test]
    fn schemas_are_valid_and_documented() {
        let all = process_schemas();
        assert_eq!(
            all.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            [PROC_EVENT, PROC_USAGE]
        );
        for s in &all {
            validate_schema(s).unwrap();
            assert_eq!(s.version, 1);
            assert!(!s.description.is_empty());
            for f in &s.fields {
                assert!(!f.description.is_empty(), "{}.{}", s.name, f.name);
            }
        }
        assert_eq!(
            Layout::of(&all[0].fields),
            Layout {
                doubles: 6,
                strings: 3
            }
        );
        assert_eq!(
            Layout::of(&all[1].fields),
            Layout {
                doubles: 5,
                strings: 1
            }
        );
    }

    // ---- event helpers --------------------------------------------------------------------

    /// Every event conforms to its schema's layout and comes from the host.
    fn check_layout(events: &[EventData]) {
        let schemas = process_schemas();
        for e in events {
            let s = schemas.iter().find(|s| s.name == e.name).unwrap();
            let l = Layout::of(&s.fields);
            assert_eq!(
                (e.numbers.len(), e.strings.len()),
                (l.doubles, l.strings),
                "{e:?}"
            );
            assert_eq!(e.source, "h");
        }
    }

    /// `(watch, kind, pid)` of the `proc.event`s.
    fn changes(events: &[EventData]) -> Vec<(String, String, u32)> {
        events
            .iter()
            .filter(|e| e.name == PROC_EVENT)
            .map(|e| (e.strings[0].clone(), e.strings[1].clone(), e.numbers[0] as u32))
            .collect()
    }

    fn find<'a>(events: &'a [EventData], watch: &str, kind: &str) -> Option<&'a EventData> {
        events
            .iter()
            .find(|e| e.name == PROC_EVENT && e.strings[0] == watch && e.strings[1] == kind)
    }

    fn usage<'a>(events: &'a [EventData], watch: &str, pid: u32) -> Option<&'a EventData> {
        events
            .iter()
            .find(|e| e.name == PROC_USAGE && e.strings[0] == watch && e.numbers[0] == f64::from(pid))
    }

    fn ch(v: &[(&str, &str, u32)]) -> Vec<(String, String, u32)> {
        v.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
            .collect()
    }

    // ---- the sensor on fixture files ----------------------------------------------------------

    struct FakeProc(tempfile::TempDir);

    impl FakeProc {
        fn new() -> FakeProc {
            let d = tempfile::tempdir().unwrap();
            for other in ["self", "net", "12a", "sys"] {
                std::fs::create_dir(d.path().join(other)).unwrap();
            }
            std::fs::write(d.path().join("uptime"), "1.0 1.0\n").unwrap();
            FakeProc(d)
        }

        /// A process with `rss_pages` resident pages (of 4096 bytes: no auxv in the fixture).
        #[allow(clippy::too_many_arguments)]
        fn put(
            &self,
            pid: u32,
            comm: &str,
            cmdline: &[u8],
            ticks: u64,
            rss_pages: u64,
            start: u64,
            state: char,
        ) {
            let p = self.0.path().join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(p.join("cmdline"), cmdline).unwrap();
            std::fs::write(p.join("stat"), stat_line(pid, comm, state, ticks, 0, 3, start)).unwrap();
            std::fs::write(p.join("statm"), format!("1000 {rss_pages} 10 1 0 100 0\n")).unwrap();
        }

        fn remove(&self, pid: u32) {
            std::fs::remove_dir_all(self.0.path().join(pid.to_string())).unwrap();
        }

        fn sensor(&self, watches: Vec<ProcessWatch>) -> ProcessSensor {
            ProcessSensor::new("h", Duration::from_secs(1), watches, self.0.path().to_path_buf()).unwrap()
        }
    }

    fn take(s: &mut ProcessSensor, now_ns: i64) -> Vec<EventData> {
        let mut out = Vec::new();
        s.sample(now_ns, &mut out).unwrap();
        check_layout(&out);
        out
    }

    const SEC: i64 = 1_000_000_000;
    const MIB_PAGES: u64 = 256; // 1 MiB in 4 KiB pages

    #[test]
    fn fixture_matching_start_usage_and_vanish() {
        let fp = FakeProc::new();
        fp.put(
            100,
            "nginx",
            b"nginx: master process\0",
            1000,
            10 * MIB_PAGES,
            50,
            'S',
        );
        fp.put(
            101,
            "nginx",
            b"nginx: worker process\0",
            2000,
            20 * MIB_PAGES,
            60,
            'S',
        );
        fp.put(
            200,
            "python3",
            b"python3\0/srv/worker.py\0--queue\0jobs\0",
            0,
            MIB_PAGES,
            70,
            'R',
        );
        fp.put(300, "sshd", b"sshd: root\0", 0, MIB_PAGES, 80, 'S');
        fp.put(400, "kthread", b"", 0, 0, 5, 'S');
        let mut s = fp.sensor(vec![
            comm("web", "nginx"),
            ProcessWatch {
                cmdline: Some("worker".into()),
                ..watch("workers")
            },
            ProcessWatch {
                pid: Some(300),
                ..watch("ssh")
            },
            ProcessWatch {
                pid: Some(999),
                ..watch("ghost")
            },
        ]);
        assert!(!s.proc_connector_active(), "not under /proc");
        let out = take(&mut s, 10 * SEC);
        assert_eq!(
            changes(&out),
            ch(&[
                ("web", "start", 100),
                ("web", "start", 101),
                ("workers", "start", 101),
                ("workers", "start", 200),
                ("ssh", "start", 300),
            ])
        );
        let start = find(&out, "web", "start").unwrap();
        assert_eq!(start.strings[2], "already running (comm \"nginx\")");
        assert_eq!(start.numbers[0], 100.0);
        assert!(start.numbers[1].is_nan() && start.numbers[2].is_nan() && start.numbers[3].is_nan());
        assert_eq!((start.numbers[4], start.numbers[5]), (10.0, 2.0));
        let u = usage(&out, "web", 101).unwrap();
        assert!(u.numbers[1].is_nan(), "no cpu on the first sample");
        assert_eq!(&u.numbers[2..], &[20.0, 3.0, 2.0]);
        assert_eq!(out.iter().filter(|e| e.name == PROC_USAGE).count(), 5);

        // 2 s later: 100 more ticks for pid 100 = 1 s of CPU = 50 %; 200 is gone, 300 a zombie,
        // 101's pid was reused by a new nginx (other start time), 500 is a new worker.
        fp.put(
            100,
            "nginx",
            b"nginx: master process\0",
            1100,
            10 * MIB_PAGES,
            50,
            'S',
        );
        fp.put(101, "nginx", b"nginx: worker process\0", 0, MIB_PAGES, 90, 'S');
        fp.remove(200);
        fp.put(300, "sshd", b"", 0, 0, 80, 'Z');
        fp.put(500, "php", b"php\0worker.php\0", 0, MIB_PAGES, 95, 'S');
        let out = take(&mut s, 12 * SEC);
        assert_eq!(
            changes(&out),
            ch(&[
                ("web", "vanished", 101),
                ("web", "start", 101),
                ("workers", "vanished", 101),
                ("workers", "vanished", 200),
                ("workers", "start", 101),
                ("workers", "start", 500),
                ("ssh", "vanished", 300),
            ])
        );
        let v = find(&out, "ssh", "vanished").unwrap();
        assert_eq!(v.strings[2], "exited (status unknown: not a child of the agent)");
        assert!(v.numbers[1].is_nan() && v.numbers[2].is_nan());
        assert_eq!((v.numbers[4], v.numbers[5]), (1.0, 0.0), "last rss; none running");
        let v = find(&out, "workers", "vanished").unwrap();
        assert_eq!(
            (v.numbers[0], v.numbers[4]),
            (101.0, 20.0),
            "the old 101's last rss"
        );
        assert_eq!(
            find(&out, "workers", "start").unwrap().strings[2],
            "started (comm \"nginx\")"
        );
        assert_eq!(usage(&out, "web", 100).unwrap().numbers[1], 50.0);
        assert!(
            usage(&out, "web", 101).unwrap().numbers[1].is_nan(),
            "a new process"
        );
        assert_eq!(usage(&out, "workers", 500).unwrap().numbers[4], 2.0);
        assert!(usage(&out, "ssh", 300).is_none());

        // the ghost pid appears: a start for a pid watch
        fp.put(999, "ghost", b"ghost\0", 0, 0, 99, 'S');
        let out = take(&mut s, 13 * SEC);
        assert_eq!(changes(&out), ch(&[("ghost", "start", 999)]));
        // the clock did not move: no cpu, re-baselined
        let out = take(&mut s, 13 * SEC);
        assert!(changes(&out).is_empty());
        assert!(usage(&out, "web", 100).unwrap().numbers[1].is_nan());
    }

    #[test]
    fn fixture_thresholds_fire_once_and_rearm() {
        let fp = FakeProc::new();
        fp.put(7, "db", b"db\0", 0, 100 * MIB_PAGES, 1, 'S');
        let mut s = fp.sensor(vec![ProcessWatch {
            cpu_pct_max: Some(80.0),
            rss_mb_max: Some(512.0),
            ..comm("db", "db")
        }]);
        let kinds = |out: &[EventData]| changes(out).into_iter().map(|c| c.1).collect::<Vec<_>>();
        assert_eq!(kinds(&take(&mut s, 0)), ["start"]);
        // 93 ticks in 1 s = 93 %; rss 600 MiB
        fp.put(7, "db", b"db\0", 93, 600 * MIB_PAGES, 1, 'S');
        let out = take(&mut s, SEC);
        assert_eq!(kinds(&out), ["cpu_high", "rss_high"]);
        let c = find(&out, "db", "cpu_high").unwrap();
        assert_eq!(c.strings[2], "cpu 93.0% > 80%");
        assert_eq!((c.numbers[3], c.numbers[4], c.numbers[5]), (93.0, 600.0, 1.0));
        assert!(c.numbers[1].is_nan() && c.numbers[2].is_nan());
        assert_eq!(
            find(&out, "db", "rss_high").unwrap().strings[2],
            "rss 600.0 MiB > 512 MiB"
        );
        // still above: nothing new
        fp.put(7, "db", b"db\0", 190, 700 * MIB_PAGES, 1, 'S');
        assert!(kinds(&take(&mut s, 2 * SEC)).is_empty());
        // below: re-armed, silently; exactly at the limit: nothing either way
        fp.put(7, "db", b"db\0", 200, 512 * MIB_PAGES, 1, 'S');
        assert!(kinds(&take(&mut s, 3 * SEC)).is_empty());
        fp.put(7, "db", b"db\0", 210, 100 * MIB_PAGES, 1, 'S');
        assert!(kinds(&take(&mut s, 4 * SEC)).is_empty());
        // above again: fires again
        fp.put(7, "db", b"db\0", 310, 1000 * MIB_PAGES, 1, 'S');
        assert_eq!(kinds(&take(&mut s, 5 * SEC)), ["cpu_high", "rss_high"]);
    }

    #[test]
    fn fixture_stopped_matching_is_not_an_exit() {
        let fp = FakeProc::new();
        fp.put(10, "wrapper", b"wrapper\0--serve\0", 0, 1, 5, 'S');
        fp.put(11, "wrapper", b"wrapper\0--serve\0", 0, 1, 6, 'S');
        let mut s = fp.sensor(vec![comm("w", "wrapper")]);
        assert_eq!(changes(&take(&mut s, 0)).len(), 2);
        // 10 exec'd something else (same pid and start time, still running); 11 is exiting
        // (PF_EXITING, its cmdline already gone)
        fp.put(10, "server", b"server\0", 0, 1, 5, 'S');
        let p = fp.0.path().join("11/stat");
        let exiting = std::fs::read_to_string(&p)
            .unwrap()
            .replace(" 4194560 ", " 4194564 ");
        std::fs::write(&p, exiting).unwrap();
        let out = take(&mut s, SEC);
        assert_eq!(changes(&out), ch(&[("w", "vanished", 10), ("w", "vanished", 11)]));
        let v: Vec<&str> = out
            .iter()
            .filter(|e| e.name == PROC_EVENT)
            .map(|e| e.strings[2].as_str())
            .collect();
        assert_eq!(v, [NO_LONGER_MATCHES, NOT_A_CHILD]);
    }

    /// With exit notifications (the proc connector, simulated here), a process seen exited
    /// before its notification came is reported a sample later, with the status if it came.
    #[test]
    fn fixture_exit_notifications_are_awaited_one_sample() {
        let fp = FakeProc::new();
        for pid in [20, 21, 22] {
            fp.put(pid, "svc", b"svc\0", 0, 1, u64::from(pid), 'S');
        }
        let mut s = fp.sensor(vec![comm("svc", "svc")]);
        s.notified = true;
        assert_eq!(changes(&take(&mut s, 0)).len(), 3);
        // 20's notification is already there; 21 and 22 are gone without one
        s.exits.insert(20, 3 << 8);
        fp.remove(20);
        fp.remove(21);
        fp.put(22, "svc", b"", 0, 1, 22, 'Z');
        let out = take(&mut s, SEC);
        assert_eq!(changes(&out), ch(&[("svc", "abnormal_exit", 20)]));
        assert_eq!(out[0].numbers[5], 0.0, "the departing ones do not run");
        assert!(s.exits.is_empty(), "a reported status is dropped");
        // 21's comes late; 22's never
        s.exits.insert(21, 9);
        let out = take(&mut s, 2 * SEC);
        assert_eq!(
            changes(&out),
            ch(&[("svc", "abnormal_exit", 21), ("svc", "vanished", 22)])
        );
        assert_eq!(out[0].strings[2], "killed by signal 9 (SIGKILL)");
        assert_eq!(out[1].strings[2], NO_NOTIFICATION);
        assert!(changes(&take(&mut s, 3 * SEC)).is_empty());
    }

    #[test]
    fn fixture_tracking_is_bounded() {
        let fp = FakeProc::new();
        let n = MAX_TRACKED_PER_WATCH as u32 + 6;
        for pid in 1..=n {
            fp.put(pid, "many", b"many\0", 0, 1, 1, 'S');
        }
        let mut s = fp.sensor(vec![comm("many", "many")]);
        let out = take(&mut s, 0);
        assert_eq!(changes(&out).len(), MAX_TRACKED_PER_WATCH);
        assert_eq!(out.last().unwrap().numbers[4], MAX_TRACKED_PER_WATCH as f64);
        assert!(usage(&out, "many", n).is_none(), "the highest pids are left out");
        // one tracked exits: a vanish, and room for one of the others
        fp.remove(5);
        let c = changes(&take(&mut s, SEC));
        assert_eq!(
            c,
            ch(&[
                ("many", "vanished", 5),
                ("many", "start", MAX_TRACKED_PER_WATCH as u32 + 1)
            ])
        );
    }

    #[test]
    fn fixture_missing_proc_root_is_a_sample_error() {
        let mut s = ProcessSensor::new(
            "h",
            Duration::from_secs(1),
            vec![comm("a", "x")],
            PathBuf::from("/nonexistent/gma/proc"),
        )
        .unwrap();
        let err = s.sample(0, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/gma/proc"), "{err}");
        // a pid watch needs no scan: a missing process is just not running
        let mut s = ProcessSensor::new(
            "h",
            Duration::from_secs(1),
            vec![ProcessWatch {
                pid: Some(1),
                ..watch("p")
            }],
            PathBuf::from("/nonexistent/gma/proc"),
        )
        .unwrap();
        let mut out = Vec::new();
        s.sample(0, &mut out).unwrap();
        assert!(out.is_empty());
    }

    // ---- real processes ------------------------------------------------------------------------

    fn now_ns() -> i64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64
    }

    /// Samples every 10 ms until `done` holds for the events so far (then returns them), or
    /// panics after 10 s showing what came.
    fn sample_until(s: &mut ProcessSensor, out: &mut Vec<EventData>, done: impl Fn(&[EventData]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut samples, mut slowest) = (0, Duration::ZERO);
        loop {
            let before = out.len();
            let t0 = Instant::now();
            s.sample(now_ns(), out).unwrap();
            (samples, slowest) = (samples + 1, slowest.max(t0.elapsed()));
            check_layout(&out[before..]);
            if done(out) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {samples} samples (slowest {slowest:?}); events so far: {:#?}",
                changes(out)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn real(period_ms: u64, watches: Vec<ProcessWatch>) -> ProcessSensor {
        ProcessSensor::new(
            "h",
            Duration::from_millis(period_ms),
            watches,
            PathBuf::from("/proc"),
        )
        .unwrap()
    }

    fn pid_of(out: &[EventData], watch: &str) -> u32 {
        find(out, watch, KIND_START).unwrap().numbers[0] as u32
    }

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|t| parse_stat(&t).ok())
            .is_some_and(|s| !s.exited())
    }

    #[test]
    fn command_killed_by_sigkill_is_abnormal_exit_with_signal() {
        let mut s = real(50, vec![command("sleeper", &["sleep", "30"], false)]);
        let mut out = Vec::new();
        sample_until(&mut s, &mut out, |o| {
            usage(o, "sleeper", 0).is_some() || find(o, "sleeper", "start").is_some()
        });
        let pid = pid_of(&out, "sleeper");
        let start = find(&out, "sleeper", "start").unwrap();
        assert_eq!(start.strings[2], "started by the agent: sleep 30");
        assert_eq!(start.numbers[5], 1.0);
        assert!(start.numbers[4] > 0.0, "rss of a real process");
        let u = usage(&out, "sleeper", pid).unwrap();
        assert_eq!(
            (u.numbers[3], u.numbers[4]),
            (1.0, 1.0),
            "one thread, one running"
        );
        let st = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        sample_until(&mut s, &mut out, |o| {
            find(o, "sleeper", KIND_ABNORMAL_EXIT).is_some()
        });
        let e = find(&out, "sleeper", KIND_ABNORMAL_EXIT).unwrap();
        assert_eq!(e.strings[2], "killed by signal 9 (SIGKILL)");
        assert_eq!((e.numbers[0], e.numbers[2], e.numbers[5]), (pid as f64, 9.0, 0.0));
        assert!(e.numbers[1].is_nan());
        assert_eq!(
            changes(&out),
            ch(&[("sleeper", "start", pid), ("sleeper", "abnormal_exit", pid)])
        );
        assert!(
            !alive(pid) && !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "reaped"
        );
        // no restart: nothing more
        let mut more = Vec::new();
        s.sample(now_ns(), &mut more).unwrap();
        assert!(more.is_empty());
    }

    #[test]
    fn command_exit_status_3_and_0() {
        let mut s = real(
            50,
            vec![
                command("three", &["sh", "-c", "exit 3"], false),
                command("zero", &["true"], false),
            ],
        );
        let mut out = Vec::new();
        sample_until(&mut s, &mut out, |o| {
            find(o, "three", KIND_ABNORMAL_EXIT).is_some() && find(o, "zero", KIND_EXIT).is_some()
        });
        let e = find(&out, "three", KIND_ABNORMAL_EXIT).unwrap();
        assert_eq!((e.strings[2].as_str(), e.numbers[1]), ("exit status 3", 3.0));
        assert!(e.numbers[2].is_nan());
        let e = find(&out, "zero", KIND_EXIT).unwrap();
        assert_eq!((e.strings[2].as_str(), e.numbers[1]), ("exit status 0", 0.0));
        assert!(e.numbers[2].is_nan());
        let kinds: Vec<String> = changes(&out)
            .into_iter()
            .filter(|c| c.0 == "three")
            .map(|c| c.1)
            .collect();
        assert_eq!(kinds, ["start", "abnormal_exit"]);
    }

    #[test]
    fn command_restart_at_most_once_per_period() {
        let period_ms = 40;
        let mut s = real(period_ms, vec![command("flappy", &["sh", "-c", "exit 3"], true)]);
        let mut out = Vec::new();
        let starts = |o: &[EventData]| {
            o.iter()
                .filter(|e| e.name == PROC_EVENT && e.strings[1] == "start")
                .count()
        };
        sample_until(&mut s, &mut out, |o| starts(o) >= 3);
        let starts: Vec<&EventData> = out
            .iter()
            .filter(|e| e.name == PROC_EVENT && e.strings[1] == "start")
            .collect();
        assert_eq!(
            starts[1].strings[2],
            "restarted by the agent (start 2): sh -c exit 3"
        );
        for w in starts.windows(2) {
            assert_ne!(w[0].numbers[0], w[1].numbers[0], "a new process each time");
            let gap = w[1].timestamp_ns - w[0].timestamp_ns;
            // The backoff runs on the monotonic clock, the timestamps on the wall clock: allow
            // for the two being read microseconds apart.
            assert!(
                gap >= (period_ms as i64 - 2) * 1_000_000,
                "restarted after {gap} ns"
            );
        }
        // between two starts there is always the exit of the first, never two starts in a row
        let kinds: Vec<String> = changes(&out).into_iter().map(|c| c.1).collect();
        for w in kinds.windows(2) {
            assert_ne!(w[0], w[1], "{kinds:?}");
        }
        assert!(find(&out, "flappy", KIND_ABNORMAL_EXIT).is_some_and(|e| e.numbers[1] == 3.0));
    }

    #[test]
    fn drop_kills_and_reaps_the_command_and_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("grandchild");
        let script = format!("sleep 300 & echo $! > {}; wait", file.display());
        let mut s = real(50, vec![command("tree", &["sh", "-c", &script], false)]);
        let mut out = Vec::new();
        sample_until(&mut s, &mut out, |o| {
            find(o, "tree", "start").is_some()
                && std::fs::read_to_string(&file).is_ok_and(|t| t.trim().parse::<u32>().is_ok())
        });
        let pid = pid_of(&out, "tree");
        let grandchild: u32 = std::fs::read_to_string(&file).unwrap().trim().parse().unwrap();
        assert!(alive(pid) && alive(grandchild));
        drop(s);
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "killed and reaped"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(grandchild) {
            assert!(Instant::now() < deadline, "grandchild {grandchild} still running");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn pid_watch_of_a_process_the_agent_did_not_start() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let mut s = real(
            50,
            vec![ProcessWatch {
                pid: Some(pid),
                ..watch("other")
            }],
        );
        let mut out = Vec::new();
        sample_until(&mut s, &mut out, |o| find(o, "other", "start").is_some());
        assert_eq!(
            find(&out, "other", "start").unwrap().strings[2],
            "already running (comm \"sleep\")"
        );
        child.kill().unwrap();
        // not reaped yet: a zombie counts as gone
        let want = if s.proc_connector_active() {
            KIND_ABNORMAL_EXIT
        } else {
            KIND_VANISHED
        };
        sample_until(&mut s, &mut out, |o| find(o, "other", want).is_some());
        let e = find(&out, "other", want).unwrap();
        if s.proc_connector_active() {
            assert_eq!(e.strings[2], "killed by signal 9 (SIGKILL)");
            assert_eq!(e.numbers[2], 9.0);
        } else {
            assert_eq!(e.strings[2], "exited (status unknown: not a child of the agent)");
            assert!(e.numbers[2].is_nan());
        }
        assert_eq!(
            changes(&out),
            ch(&[("other", "start", pid), ("other", want, pid)])
        );
        child.wait().unwrap();
    }

    /// A comm watch on a program run under a unique name (a symlink to `sh`), and a cmdline
    /// watch on a unique argument, each of a process the test (not the sensor) started.
    #[test]
    fn comm_and_cmdline_watches_report_exit_status() {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("gmash{}", std::process::id() % 1_000_000);
        let sh = ["/bin/sh", "/usr/bin/sh"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap();
        let link = dir.path().join(&name);
        std::os::unix::fs::symlink(sh, &link).unwrap();
        let mut by_comm = Command::new(&link)
            .args(["-c", "read x; exit 7"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let tag = format!("{}.4242", std::process::id());
        let mut by_cmdline = Command::new("sleep").arg(&tag).spawn().unwrap();
        let mut s = real(
            50,
            vec![
                comm("c", &name),
                ProcessWatch {
                    cmdline: Some(format!("sleep {tag}")),
                    ..watch("l")
                },
            ],
        );
        let mut out = Vec::new();
        sample_until(&mut s, &mut out, |o| {
            find(o, "c", "start").is_some() && find(o, "l", "start").is_some()
        });
        assert_eq!(pid_of(&out, "c"), by_comm.id());
        assert_eq!(pid_of(&out, "l"), by_cmdline.id());
        drop(by_comm.stdin.take()); // EOF: `read` fails, `exit 7` runs
        let st = Command::new("kill")
            .args(["-9", &by_cmdline.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let connector = s.proc_connector_active();
        let want = if connector {
            KIND_ABNORMAL_EXIT
        } else {
            KIND_VANISHED
        };
        sample_until(&mut s, &mut out, |o| {
            find(o, "c", want).is_some() && find(o, "l", want).is_some()
        });
        if connector {
            let c = find(&out, "c", want).unwrap();
            assert_eq!((c.strings[2].as_str(), c.numbers[1]), ("exit status 7", 7.0));
            let l = find(&out, "l", want).unwrap();
            assert_eq!(
                (l.strings[2].as_str(), l.numbers[2]),
                ("killed by signal 9 (SIGKILL)", 9.0)
            );
        }
        assert_eq!(by_comm.wait().unwrap().code(), Some(7));
        by_cmdline.wait().unwrap();
    }

    /// Where the proc connector works (root in the initial namespaces), the sensor uses it.
    #[test]
    fn proc_connector_subscribes_where_permitted() {
        let s = real(50, vec![comm("x", "gma-no-such")]);
        let l = connector::ExitListener::open();
        assert_eq!(s.proc_connector_active(), l.is_ok(), "{:?}", l.err());
        // only under /proc, and only for match watches
        let s = real(50, vec![command("c", &["true"], false)]);
        assert!(!s.proc_connector_active());
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn process_schemas_are_pinned() {
        assert_eq!(
            gma_core::event::signature(&process_schemas()[0]),
            "proc.event v1: watch string, kind string, detail string, pid double pid, status double status, signal double signal, cpu_pct double %, rss_mb double MiB, running double processes"
        );
        assert_eq!(
            gma_core::event::signature(&process_schemas()[1]),
            "proc.usage v1: watch string, pid double pid, cpu_pct double %, rss_mb double MiB, threads double threads, running double processes"
        );
    }
}
