//! `host.cpu`: CPU time split from the aggregate `cpu ` line of `/proc/stat`, plus `/proc/loadavg`.

use std::sync::Arc;

use crate::procfs::{parse_num, Emit, Files, Probe};
use crate::SensorError;

const STAT: &str = "/proc/stat";
const LOADAVG: &str = "/proc/loadavg";

/// Cumulative CPU time of all CPUs by state, in clock ticks (only ratios are used, so the tick
/// rate does not matter here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// In `host.cpu` field order. Guest time is already counted in `user` by the kernel, so
    /// adding guest columns would count it twice.
    pub fn as_array(&self) -> [u64; 8] {
        [
            self.user,
            self.nice,
            self.system,
            self.idle,
            self.iowait,
            self.irq,
            self.softirq,
            self.steal,
        ]
    }
}

/// Parses the aggregate `cpu ` line of `/proc/stat`. The first four columns are required;
/// iowait, irq, softirq and steal are 0 when a kernel does not report them.
pub fn parse_proc_stat(text: &str) -> Result<CpuTimes, SensorError> {
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.strip_prefix("cpu ") else {
            continue;
        };
        const NAMES: [&str; 8] = [
            "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
        ];
        let mut v = [0u64; 8];
        let mut toks = rest.split_ascii_whitespace();
        for (k, slot) in v.iter_mut().enumerate() {
            let tok = toks.next();
            if tok.is_none() && k >= 4 {
                break;
            }
            *slot = parse_num(tok, STAT, i + 1, NAMES[k])?;
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = v;
        return Ok(CpuTimes {
            user,
            nice,
            system,
            idle,
            iowait,
            irq,
            softirq,
            steal,
        });
    }
    Err(SensorError::parse(STAT, 0, "no aggregate \"cpu \" line"))
}

/// Percent of all CPU time spent in each state between two readings, in `host.cpu` order.
/// `None` when no tick elapsed (nothing to divide by). A column that went backwards counts 0.
pub fn cpu_percentages(prev: &CpuTimes, cur: &CpuTimes) -> Option<[f64; 8]> {
    let (p, c) = (prev.as_array(), cur.as_array());
    let mut d = [0u64; 8];
    for k in 0..8 {
        d[k] = c[k].saturating_sub(p[k]);
    }
    let total: u64 = d.iter().sum();
    if total == 0 {
        return None;
    }
    Some(d.map(|x| x as f64 * 100.0 / total as f64))
}

/// `/proc/loadavg`: `1.90 1.29 0.57 1/80 6280`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadAvg {
    pub load1: f64,
    pub load5: f64,
    pub load15: f64,
    /// Runnable tasks (before the slash).
    pub running: u64,
    /// Tasks that exist (after the slash).
    pub procs: u64,
}

pub fn parse_loadavg(text: &str) -> Result<LoadAvg, SensorError> {
    let mut toks = text.split_ascii_whitespace();
    let mut load = [0f64; 3];
    for (slot, what) in load.iter_mut().zip(["load1", "load5", "load15"]) {
        *slot = parse_num(toks.next(), LOADAVG, 1, what)?;
        // "nan" and "inf" parse as f64 but are no load average.
        if !slot.is_finite() || *slot < 0.0 {
            return Err(SensorError::parse(
                LOADAVG,
                1,
                format!("{what} {slot} out of range"),
            ));
        }
    }
    let tasks = toks
        .next()
        .ok_or_else(|| SensorError::parse(LOADAVG, 1, "missing running/total tasks"))?;
    let (running, procs) = tasks
        .split_once('/')
        .ok_or_else(|| SensorError::parse(LOADAVG, 1, format!("tasks {tasks:?} is not running/total")))?;
    Ok(LoadAvg {
        load1: load[0],
        load5: load[1],
        load15: load[2],
        running: parse_num(Some(running), LOADAVG, 1, "running tasks")?,
        procs: parse_num(Some(procs), LOADAVG, 1, "total tasks")?,
    })
}

/// How far apart two samples may be and still share one `/proc/loadavg` reading
/// ([`LoadavgShare`]).
const LOADAVG_SHARED_NS: u64 = 100_000_000;

/// The `/proc/loadavg` reading of `host.cpu` and `host.load`, which both publish it and sample
/// on the same ticks: whichever samples first reads the file and the other takes its reading,
/// one read a tick rather than two. A reading is taken when it is less than 100 ms from the
/// sample's time (the kernel updates the load averages every 5 s; the running and total task
/// counts are as of that moment).
#[derive(Clone, Default)]
pub(crate) struct LoadavgShare(Arc<parking_lot::Mutex<Option<(i64, LoadAvg)>>>);

impl LoadavgShare {
    /// The shared reading if it is near `now_ns`, else a new one, shared from then on.
    pub(crate) fn read(&self, files: &mut Files, now_ns: i64) -> Result<LoadAvg, SensorError> {
        let mut last = self.0.lock();
        if let Some((at, load)) = *last {
            if now_ns.abs_diff(at) < LOADAVG_SHARED_NS {
                return Ok(load);
            }
        }
        let load = files.read("loadavg", parse_loadavg)?;
        *last = Some((now_ns, load));
        Ok(load)
    }
}

/// Emits `host.cpu`. The first sample only records the baseline.
pub(crate) struct Cpu {
    prev: Option<CpuTimes>,
    loadavg: LoadavgShare,
}

impl Cpu {
    /// Reads `/proc/loadavg` through `loadavg`, shared with `host.load`.
    pub(crate) fn new(loadavg: LoadavgShare) -> Cpu {
        Cpu { prev: None, loadavg }
    }
}

impl Probe for Cpu {
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let cur = files.read("stat", parse_proc_stat)?;
        let load = self.loadavg.read(files, out.now_ns)?;
        let Some(prev) = self.prev.replace(cur) else {
            return Ok(());
        };
        // No tick since the last sample (sampled too fast): the split is unknown, NaN says so,
        // while the load figures are still good.
        let pct = cpu_percentages(&prev, &cur).unwrap_or([f64::NAN; 8]);
        let mut numbers = Vec::with_capacity(13);
        numbers.extend_from_slice(&pct);
        numbers.extend_from_slice(&[
            load.load1,
            load.load5,
            load.load15,
            load.running as f64,
            load.procs as f64,
        ]);
        out.push(numbers, Vec::new());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str = "\
cpu  10132153 290696 3084719 46828483 16683 0 25195 0 175628 0
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0
cpu1 1335389 32994 491004 13385190 3473 0 4082 0 23618 0
intr 199292311 43 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0 0 0 0
ctxt 322975046
btime 1700000000
processes 1045873
procs_running 2
procs_blocked 0
softirq 84367226 1 24187536 1048 5061530 0 0 2157745 25137318 0 27821048
";

    const STAT_B: &str = "\
cpu  10132253 290696 3084769 46828783 16733 0 25195 100 175628 0
cpu0 1393330 32966 572081 13343442 6155 0 17875 50 23933 0
cpu1 1335439 32994 491029 13385340 3498 0 4082 50 23618 0
btime 1700000000
";

    #[test]
    fn parses_the_aggregate_line() {
        let t = parse_proc_stat(STAT_A).unwrap();
        assert_eq!(t.user, 10132153);
        assert_eq!(t.idle, 46828483);
        assert_eq!(t.softirq, 25195);
        assert_eq!(t.steal, 0);
    }

    #[test]
    fn old_kernels_without_iowait_columns() {
        let t = parse_proc_stat("cpu  1 2 3 4\n").unwrap();
        assert_eq!(t.as_array(), [1, 2, 3, 4, 0, 0, 0, 0]);
    }

    #[test]
    fn percentages_from_deltas() {
        let a = parse_proc_stat(STAT_A).unwrap();
        let b = parse_proc_stat(STAT_B).unwrap();
        // deltas: user 100, system 50, idle 300, iowait 50, steal 100 -> total 600
        let p = cpu_percentages(&a, &b).unwrap();
        let want = [
            100.0 / 6.0,
            0.0,
            50.0 / 6.0,
            50.0,
            50.0 / 6.0,
            0.0,
            0.0,
            100.0 / 6.0,
        ];
        for (got, want) in p.iter().zip(want) {
            assert!((got - want).abs() < 1e-9, "{p:?}");
        }
        assert!((p.iter().sum::<f64>() - 100.0).abs() < 1e-9);
        assert_eq!(cpu_percentages(&a, &a), None);
        // counters reset (b -> a): every column went backwards or stayed, so nothing elapsed
        assert_eq!(cpu_percentages(&b, &a), None);
    }

    #[test]
    fn malformed_stat_is_an_error() {
        for bad in [
            "",
            "intr 1 2 3\n",
            "cpu  1 2 x 4 5\n",
            "cpu  1 2 3\n",
            "cpu  -1 2 3 4\n",
            "cpu  99999999999999999999999 2 3 4\n",
        ] {
            let e = parse_proc_stat(bad).unwrap_err();
            assert!(matches!(e, SensorError::Parse { .. }), "{bad:?}: {e}");
        }
        let e = parse_proc_stat("ctxt 1\ncpu  1 2 x 4\n").unwrap_err();
        assert!(e.to_string().contains("/proc/stat line 2"), "{e}");
        assert!(e.to_string().contains("system"), "{e}");
    }

    /// One reading serves both sensors of a tick; the next tick reads again.
    #[test]
    fn loadavg_is_read_once_a_tick() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loadavg");
        std::fs::write(&path, "1.00 0.50 0.25 2/100 7\n").unwrap();
        let share = LoadavgShare::default();
        let (mut cpu_files, mut load_files) = (
            crate::procfs::Files::new(dir.path(), 64),
            crate::procfs::Files::new(dir.path(), 64),
        );
        let t = 1_000_000_000_000;
        assert_eq!(share.read(&mut cpu_files, t).unwrap().load1, 1.0);
        std::fs::write(&path, "3.00 0.50 0.25 4/100 7\n").unwrap();
        let other = share.read(&mut load_files, t + 3_000_000).unwrap();
        assert_eq!(
            (other.load1, other.running),
            (1.0, 2),
            "the other sensor 3 ms later"
        );
        let next = share.read(&mut load_files, t + 1_000_000_000).unwrap();
        assert_eq!((next.load1, next.running), (3.0, 4), "the next tick");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(share.read(&mut cpu_files, t + 1_002_000_000).unwrap().load1, 3.0);
        assert!(
            share.read(&mut cpu_files, t + 2_000_000_000).is_err(),
            "read again: gone"
        );
    }

    #[test]
    fn parses_loadavg() {
        let l = parse_loadavg("1.90 1.29 0.57 1/80 6280\n").unwrap();
        assert_eq!(
            l,
            LoadAvg {
                load1: 1.90,
                load5: 1.29,
                load15: 0.57,
                running: 1,
                procs: 80
            }
        );
        for bad in [
            "",
            "1.0 2.0",
            "1 2 3 4",
            "1 2 3 a/b",
            "nan 1 1 1/2",
            "1 2 3 1/",
            "-1 0 0 1/1",
        ] {
            assert!(parse_loadavg(bad).is_err(), "{bad:?}");
        }
    }
}
