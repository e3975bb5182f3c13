//! `batch.queue`: the local batch system's queues, one event per Slurm partition (source
//! `<host>/<partition>`): jobs pending and running, node states and CPUs, and the backfill
//! window. The pending jobs of every partition (each job once) are `queue_waiting` of
//! `host.load`, through [`QueueShare`].
//!
//! Slurm is read with `squeue -h -r -a -t PENDING,RUNNING -o %P|%T|%S` (one line per job, array
//! elements expanded; `%S` is a pending job's expected start, Slurm's backfill estimate) and
//! `sinfo -h -a -o %R|%a|%T|%D|%C|%l` (per partition and node state: the partition's
//! availability, the state, the node count, CPUs as allocated/idle/other/total, and the
//! partition's time limit), each with the command timeout and bounded output (see
//! [`crate::command`]), `SLURM_CONF` set to the slurm.conf found and `TZ=UTC`.
//!
//! The backfill window (`backfill_window_s`) is how long the partition's idle CPUs stay free
//! for a job that starts now: 0 without an idle CPU; else until the earliest expected start of
//! a job pending in the partition (a lower bound: that job may be bound for other nodes, and a
//! reservation that starts on the idle nodes is not counted); else the partition's time limit;
//! NaN when nothing bounds it (no pending job with an expected start, time limit `infinite`).
//!
//! The sensor is on when the batch system is there: a `slurm.conf` (the configured one, else
//! `$SLURM_CONF`, else `/etc/slurm/slurm.conf` or `/etc/slurm-llnl/slurm.conf`; without one,
//! Slurm's clients would go looking for a controller in DNS) and the `sinfo` and `squeue`
//! commands. Otherwise it is off: it says so once in the log and never runs a command again,
//! and `queue_waiting` stays 0. A controller that does not answer is a sample error (the
//! producer counts it and logs the first and every hundredth); `queue_waiting` then keeps its
//! last value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::command::{Commands, Ran};
use crate::procfs::{Emit, Files, Probe};
use crate::SensorError;

/// Most partitions reported.
pub const MAX_PARTITIONS: usize = 256;
/// Output kept of `squeue` (about 800,000 jobs; beyond, the counts are of the jobs read).
const MAX_SQUEUE_OUTPUT: usize = 16 << 20;
/// Output kept of `sinfo`.
const MAX_SINFO_OUTPUT: usize = 1 << 20;

/// slurm.conf paths tried when none is configured and `SLURM_CONF` is not set.
pub const SLURM_CONF_PATHS: [&str; 2] = ["/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"];

/// The jobs waiting in the local batch system, as the batch sensor last read them, for
/// `host.load`: 0 until it has read any (or without a batch system).
#[derive(Debug, Default, Clone)]
pub struct QueueShare(Arc<AtomicU64>);

impl QueueShare {
    pub fn set(&self, waiting: f64) {
        self.0.store(waiting.to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// One partition's figures, in `batch.queue` order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Partition {
    pub jobs_pending: f64,
    pub jobs_running: f64,
    pub nodes_total: f64,
    pub nodes_idle: f64,
    pub nodes_busy: f64,
    pub nodes_down: f64,
    pub cpus_total: f64,
    pub cpus_idle: f64,
    /// `up`, `down`, `drain`, `inact`; empty when sinfo does not list it.
    pub state: String,
    /// The partition's time limit in seconds; `None` when `infinite` (or not listed).
    pub time_limit_s: Option<f64>,
    /// The earliest expected start of a job pending here, Unix seconds.
    pub next_start_s: Option<f64>,
}

impl Partition {
    /// See the module doc; `now_s` in Unix seconds.
    pub fn backfill_window_s(&self, now_s: f64) -> f64 {
        if self.cpus_idle <= 0.0 {
            return 0.0;
        }
        match (self.next_start_s, self.time_limit_s) {
            (Some(start), _) => (start - now_s).max(0.0),
            (None, Some(limit)) => limit,
            (None, None) => f64::NAN,
        }
    }
}

/// A Slurm time (`%S` with `TZ=UTC`: `2026-11-26T22:03:06`) in Unix seconds; `None` for `N/A`,
/// `Unknown` and anything else.
pub fn parse_slurm_time(s: &str) -> Option<f64> {
    let ns = gma_core::time::parse_rfc3339(&format!("{}Z", s.trim()))??;
    Some(ns as f64 / 1e9)
}

/// A Slurm duration (`%l`: `infinite`, `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
/// `D-HH:MM:SS`) in seconds; `None` for `infinite`, `UNLIMITED` and anything unreadable.
pub fn parse_slurm_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, Some(r)),
        None => (0, Some(s)),
    };
    let parts: Vec<u64> = rest?
        .split(':')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let (h, m, sec) = match (s.contains('-'), parts.as_slice()) {
        (false, &[m]) => (0, m, 0),
        (false, &[m, sec]) => (0, m, sec),
        (_, &[h, m, sec]) => (h, m, sec),
        (true, &[h]) => (h, 0, 0),
        (true, &[h, m]) => (h, m, 0),
        _ => return None,
    };
    Some((((days * 24 + h) * 60 + m) * 60 + sec) as f64)
}

/// Counts `squeue -o %P|%T|%S` lines into `parts` (a job pending in several partitions,
/// `p1,p2`, counts in each, and its expected start bounds each one's backfill window); returns
/// the pending jobs, each once.
pub fn count_squeue(text: &str, parts: &mut BTreeMap<String, Partition>) -> f64 {
    let mut pending = 0.0;
    for line in text.lines() {
        let mut f = line.trim().split('|');
        let (Some(partitions), Some(state)) = (f.next(), f.next()) else {
            continue;
        };
        let start = f.next().and_then(parse_slurm_time);
        let is_pending = match state {
            "PENDING" => true,
            "RUNNING" => false,
            _ => continue,
        };
        if is_pending {
            pending += 1.0;
        }
        for p in partitions.split(',').filter(|p| !p.is_empty()) {
            let Some(part) = partition(parts, p) else {
                continue;
            };
            if is_pending {
                part.jobs_pending += 1.0;
                if let Some(t) = start {
                    part.next_start_s = Some(part.next_start_s.map_or(t, |n| n.min(t)));
                }
            } else {
                part.jobs_running += 1.0;
            }
        }
    }
    pending
}

/// The entry of partition `name`, or `None` past [`MAX_PARTITIONS`].
fn partition<'a>(parts: &'a mut BTreeMap<String, Partition>, name: &str) -> Option<&'a mut Partition> {
    if !parts.contains_key(name) && parts.len() >= MAX_PARTITIONS {
        return None;
    }
    Some(parts.entry(name.to_string()).or_default())
}

/// Whether a node state (sinfo `%T`, its flag suffixes `*~#!%$@^-` removed) is idle, busy or
/// down; `None` for the others (reserved, planned, maint, unknown, ...).
pub fn node_class(state: &str) -> Option<NodeClass> {
    let s = state.trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-', '+']);
    match s {
        "idle" => Some(NodeClass::Idle),
        "allocated" | "mixed" | "completing" => Some(NodeClass::Busy),
        "down" | "drained" | "draining" | "fail" | "failing" | "not_responding" => Some(NodeClass::Down),
        _ => None,
    }
}

/// See [`node_class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeClass {
    Idle,
    Busy,
    Down,
}

/// Adds `sinfo -o %R|%a|%T|%D|%C|%l` lines to `parts`.
pub fn parse_sinfo(text: &str, parts: &mut BTreeMap<String, Partition>) -> Result<(), SensorError> {
    const SINFO: &str = "sinfo";
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('|').collect();
        let [name, avail, state, nodes, cpus, limit] = f[..] else {
            return Err(SensorError::parse(
                SINFO,
                i + 1,
                "expected partition|avail|state|nodes|cpus|timelimit",
            ));
        };
        let nodes: f64 = crate::procfs::parse_num(Some(nodes), SINFO, i + 1, "node count")?;
        let c: Vec<&str> = cpus.split('/').collect();
        let [_, idle, _, total] = c[..] else {
            return Err(SensorError::parse(
                SINFO,
                i + 1,
                "CPUs not as allocated/idle/other/total",
            ));
        };
        let idle: f64 = crate::procfs::parse_num(Some(idle), SINFO, i + 1, "idle CPUs")?;
        let total: f64 = crate::procfs::parse_num(Some(total), SINFO, i + 1, "total CPUs")?;
        let Some(p) = partition(parts, name) else {
            continue;
        };
        p.state = avail.to_string();
        p.time_limit_s = parse_slurm_duration(limit);
        p.nodes_total += nodes;
        p.cpus_total += total;
        p.cpus_idle += idle;
        match node_class(state) {
            Some(NodeClass::Idle) => p.nodes_idle += nodes,
            Some(NodeClass::Busy) => p.nodes_busy += nodes,
            Some(NodeClass::Down) => p.nodes_down += nodes,
            None => {}
        }
    }
    Ok(())
}

/// The slurm.conf the sensor uses: `configured`, else `$SLURM_CONF`, else the first of
/// [`SLURM_CONF_PATHS`] that exists; `None` when there is none.
pub fn find_slurm_conf(configured: Option<&Path>) -> Option<PathBuf> {
    if let Some(c) = configured {
        return Some(c.to_path_buf());
    }
    if let Some(c) = std::env::var_os("SLURM_CONF").filter(|c| !c.is_empty()) {
        return Some(PathBuf::from(c));
    }
    SLURM_CONF_PATHS.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Emits `batch.queue`; see the module doc.
pub(crate) struct Batch {
    commands: Commands,
    /// slurm.conf; `None` = found by [`find_slurm_conf`].
    slurm_conf: Option<PathBuf>,
    queue: QueueShare,
    /// Off: the batch system is not there (said once).
    off: bool,
    /// The slurm.conf in use, found on the first sample.
    conf: Option<PathBuf>,
}

impl Batch {
    /// `sinfo` and `squeue` run as `commands` says, with `slurm_conf` (`None`: found by
    /// [`find_slurm_conf`]).
    pub(crate) fn new(commands: Commands, slurm_conf: Option<PathBuf>, queue: QueueShare) -> Batch {
        Batch {
            commands,
            slurm_conf,
            queue,
            off: false,
            conf: None,
        }
    }

    /// Runs a Slurm client; `Ok(None)` when it is not installed.
    fn slurm(
        &self,
        conf: &Path,
        name: &str,
        args: &[&str],
        max: usize,
    ) -> Result<Option<String>, SensorError> {
        let mut all = vec!["-h"];
        all.extend_from_slice(args);
        let env = [
            ("SLURM_CONF", conf.as_os_str()),
            ("TZ", std::ffi::OsStr::new("UTC")),
        ];
        let (program, ran) = self.commands.run(name, &all, &env, max);
        let o = match ran? {
            Ran::Missing => return Ok(None),
            Ran::Done(o) => o.succeeded(&program)?,
        };
        if o.truncated {
            tracing::warn!(command = %program.display(), "batch.queue: output over {max} bytes; the counts are of what was read");
        }
        Ok(Some(o.stdout))
    }

    fn turn_off(&mut self, why: &str) {
        self.off = true;
        tracing::info!("batch.queue sensor off: {why}");
    }
}

impl Probe for Batch {
    /// Off (no batch system): nothing to run.
    fn blocking(&self) -> bool {
        !self.off
    }

    fn sample(&mut self, _files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        if self.off {
            return Ok(());
        }
        let conf = match &self.conf {
            Some(c) => c.clone(),
            None => match find_slurm_conf(self.slurm_conf.as_deref()) {
                Some(c) => {
                    self.conf = Some(c.clone());
                    c
                }
                None => {
                    self.turn_off(
                        "no batch system here (no slurm.conf: SLURM_CONF unset and none in /etc/slurm)",
                    );
                    return Ok(());
                }
            },
        };
        let mut parts = BTreeMap::new();
        let Some(sinfo) = self.slurm(
            &conf,
            "sinfo",
            &["-a", "-o", "%R|%a|%T|%D|%C|%l"],
            MAX_SINFO_OUTPUT,
        )?
        else {
            self.turn_off("Slurm's sinfo is not installed");
            return Ok(());
        };
        parse_sinfo(&sinfo, &mut parts)?;
        let Some(squeue) = self.slurm(
            &conf,
            "squeue",
            &["-r", "-a", "-t", "PENDING,RUNNING", "-o", "%P|%T|%S"],
            MAX_SQUEUE_OUTPUT,
        )?
        else {
            self.turn_off("Slurm's squeue is not installed");
            return Ok(());
        };
        let pending = count_squeue(&squeue, &mut parts);
        self.queue.set(pending);
        let now_s = out.now_ns as f64 / 1e9;
        for (name, p) in parts {
            let source = format!("{}/{}", out.source, name);
            let window = p.backfill_window_s(now_s);
            let numbers = vec![
                p.jobs_pending,
                p.jobs_running,
                p.nodes_total,
                p.nodes_idle,
                p.nodes_busy,
                p.nodes_down,
                p.cpus_total,
                p.cpus_idle,
                window,
            ];
            out.push_from(&source, numbers, vec![name, "slurm".to_string(), p.state]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;
    use std::time::Duration;

    const SINFO: &str = "\
debug|up|idle|1|0/2/0/2|1:00:00
debug|up|mixed|2|3/1/0/4|1:00:00
debug|up|down*|1|0/0/2/2|1:00:00
long|up|allocated|3|12/0/0/12|2-00:00:00
long|up|drained|1|0/0/4/4|2-00:00:00
gpu|down|reserved|1|0/4/0/4|infinite
";

    #[test]
    fn parses_sinfo_and_squeue() {
        let mut parts = BTreeMap::new();
        parse_sinfo(SINFO, &mut parts).unwrap();
        let squeue =
            "debug|PENDING|2026-11-26T22:10:00\ndebug|RUNNING|2026-11-26T21:00:00\ndebug,long|PENDING|N/A\nlong|RUNNING|N/A\nlong|COMPLETING|N/A\njunk\n";
        assert_eq!(count_squeue(squeue, &mut parts), 2.0, "each pending job once");
        let d = &parts["debug"];
        assert_eq!(
            (
                d.jobs_pending,
                d.jobs_running,
                d.nodes_total,
                d.nodes_idle,
                d.nodes_busy,
                d.nodes_down
            ),
            (2.0, 1.0, 4.0, 1.0, 2.0, 1.0)
        );
        assert_eq!((d.cpus_total, d.cpus_idle, d.state.as_str()), (8.0, 3.0, "up"));
        let l = &parts["long"];
        assert_eq!(
            (l.jobs_pending, l.jobs_running, l.nodes_busy, l.nodes_down),
            (1.0, 1.0, 3.0, 1.0)
        );
        let g = &parts["gpu"];
        assert_eq!(
            (g.nodes_total, g.nodes_idle, g.nodes_busy, g.state.as_str()),
            (1.0, 0.0, 0.0, "down")
        );
        // The backfill window: until the pending job's expected start (22:10:00 UTC), the
        // partition's limit without one, 0 without an idle CPU, NaN when nothing bounds it.
        let now = parse_slurm_time("2026-11-26T22:00:00").unwrap();
        assert_eq!(d.backfill_window_s(now), 600.0);
        assert_eq!(d.backfill_window_s(now + 3600.0), 0.0, "expected start passed");
        assert_eq!(l.backfill_window_s(now), 0.0, "no idle CPU");
        assert!(g.backfill_window_s(now).is_nan());
        let idle_long = Partition {
            cpus_idle: 4.0,
            ..l.clone()
        };
        assert_eq!(idle_long.backfill_window_s(now), 2.0 * 86_400.0);
        for bad in [
            "debug|up|idle|1|0/1/0/1\n",
            "debug|up|idle|x|0/1/0/1|1:00\n",
            "debug|up|idle|1|0/1/0|1:00\n",
        ] {
            assert!(parse_sinfo(bad, &mut BTreeMap::new()).is_err(), "{bad:?}");
        }
        assert_eq!(node_class("idle~"), Some(NodeClass::Idle));
        assert_eq!(node_class("planned"), None);
    }

    #[test]
    fn slurm_times_and_durations() {
        assert_eq!(parse_slurm_time("1970-01-01T00:01:00"), Some(60.0));
        for na in ["N/A", "Unknown", "", "2026-13-01T00:00:00"] {
            assert_eq!(parse_slurm_time(na), None, "{na:?}");
        }
        for (text, secs) in [
            ("5", 300.0),
            ("5:30", 330.0),
            ("1:00:00", 3600.0),
            ("2-00:00:00", 172_800.0),
            ("1-2", 93_600.0),
            ("1-2:03", 93_780.0),
        ] {
            assert_eq!(parse_slurm_duration(text), Some(secs), "{text}");
        }
        for bad in ["infinite", "UNLIMITED", "", "1:2:3:4", "x-1", "-"] {
            assert_eq!(parse_slurm_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn partitions_are_bounded() {
        let mut parts = BTreeMap::new();
        let text: String = (0..300).map(|i| format!("p{i}|RUNNING|N/A\n")).collect();
        count_squeue(&text, &mut parts);
        assert_eq!(parts.len(), MAX_PARTITIONS);
    }

    fn script(path: &Path, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn sensor(dir: &Path, conf: Option<PathBuf>, queue: QueueShare) -> impl Sensor {
        crate::procfs::ProcSensor::new(
            "h",
            Duration::from_secs(10),
            dir,
            crate::schemas::batch_queue(),
            Batch::new(
                Commands {
                    bin_dir: Some(dir.to_path_buf()),
                    timeout: Duration::from_secs(10),
                },
                conf,
                queue,
            ),
        )
    }

    #[test]
    fn events_from_the_commands_and_the_queue_for_host_load() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("sinfo.out"), SINFO).unwrap();
        // The fake clients check they were given the slurm.conf.
        let conf = p.join("slurm.conf");
        script(
            &p.join("sinfo"),
            &format!(
                "[ \"$SLURM_CONF\" = '{}' ] || exit 9\ncat '{}'",
                conf.display(),
                p.join("sinfo.out").display()
            ),
        );
        script(
            &p.join("squeue"),
            "printf 'debug|PENDING|N/A\\nlong|RUNNING|N/A\\n'",
        );
        let queue = QueueShare::default();
        let mut s = sensor(p, Some(conf), queue.clone());
        assert!(s.blocking());
        let mut out = Vec::new();
        s.sample(1, &mut out).unwrap();
        let sources: Vec<&str> = out.iter().map(|e| e.source.as_str()).collect();
        assert_eq!(sources, ["h/debug", "h/gpu", "h/long"]);
        assert_eq!(out[0].numbers, [1.0, 0.0, 4.0, 1.0, 2.0, 1.0, 8.0, 3.0, 3600.0]);
        assert_eq!(out[0].strings, ["debug", "slurm", "up"]);
        assert_eq!(queue.get(), 1.0);

        // A controller that does not answer: an error naming the command; the queue stays.
        script(
            &p.join("squeue"),
            "echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1",
        );
        let e = s.sample(2, &mut out).unwrap_err().to_string();
        assert!(e.contains("squeue") && e.contains("Unable to contact"), "{e}");
        assert_eq!(queue.get(), 1.0);
    }

    #[test]
    fn off_without_slurm() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        // A slurm.conf but no commands: off, quietly, for good.
        let queue = QueueShare::default();
        let mut s = sensor(p, Some(p.join("slurm.conf")), queue.clone());
        let mut out = Vec::new();
        s.sample(1, &mut out).unwrap();
        script(&p.join("sinfo"), "exit 1");
        s.sample(2, &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(queue.get(), 0.0);
    }
}
