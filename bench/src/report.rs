//! What every scenario reports besides its own figures: the machine's cores and the CPU time
//! and RSS of processes (from /proc), and the one JSON line of `--output json`.

use anyhow::{anyhow, Context};

/// Clock ticks per second of /proc/<pid>/stat times (USER_HZ; 100 on Linux x86_64 and arm64).
const CLK_TCK: f64 = 100.0;

/// Prints one scenario's JSON object (one line) with the fields every scenario has:
/// `machine_cores`, and `processes` — the scenario's own list when it runs several processes,
/// else this process (the scenario ran in it): CPU seconds, peak and final RSS.
pub fn emit(mut v: serde_json::Value) {
    if let Some(o) = v.as_object_mut() {
        o.entry("machine_cores").or_insert(serde_json::json!(cores()));
        o.entry("processes").or_insert_with(|| {
            let me = std::process::id().to_string();
            let (cpu, rss) = proc_usage(&me).unwrap_or((f64::NAN, f64::NAN));
            serde_json::json!([{
                "name": "gma bench (every role of the scenario, in process)",
                "cpu_seconds": cpu,
                "rss_mib_peak": peak_rss_mib(&me),
                "rss_mib_end": rss,
            }])
        });
    }
    println!("{v}");
}

/// Peak RSS (VmHWM) of a process, MiB.
pub fn peak_rss_mib(pid: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// (utime + stime) in seconds of a process, and its RSS in MiB, from /proc.
pub fn proc_usage(pid: &str) -> anyhow::Result<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("cannot read /proc stat")?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("bad /proc stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f
        .get(11)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("bad utime"))?;
    let stime: f64 = f
        .get(12)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("bad stime"))?;
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("cannot read /proc status")?;
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    Ok(((utime + stime) / CLK_TCK, rss_kb / 1024.0))
}

/// The sum of some clock-tick fields of /proc/PID/stat, in seconds; `fields` index the fields
/// after the command name (0 = state, 11 = utime, 12 = stime, 13 = cutime, 14 = cstime).
pub fn proc_stat_seconds(pid: &str, fields: &[usize]) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let mut ticks = 0.0;
    for &i in fields {
        ticks += f.get(i)?.parse::<f64>().ok()?;
    }
    Some(ticks / CLK_TCK)
}

/// One sample of a process: seconds since the run began, its CPU seconds so far, its RSS.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub t_s: f64,
    pub cpu_s: f64,
    pub rss_mib: f64,
}

/// RSS and CPU of a run's processes sampled at a fixed interval (`--sample-every`), per
/// process name, in the order the names were first recorded.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub every_s: f64,
    pub series: Vec<(String, Vec<Point>)>,
}

/// How much a process's RSS grew over the last half of a run: from its first sample at or
/// after half the run to its last sample (and to its highest one in that half).
#[derive(Debug, Clone, PartialEq)]
pub struct Growth {
    pub name: String,
    pub rss_mib_at_half: f64,
    pub rss_mib_end: f64,
    pub rss_mib_max: f64,
    pub growth_pct: f64,
    pub max_growth_pct: f64,
    pub samples: usize,
}

impl Timeline {
    pub fn new(every_s: f64) -> Timeline {
        Timeline {
            every_s,
            series: Vec::new(),
        }
    }

    pub fn record(&mut self, name: &str, p: Point) {
        match self.series.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push(p),
            None => self.series.push((name.to_string(), vec![p])),
        }
    }

    /// The RSS growth of every process over the last half of the run (the run ends at the
    /// latest sample of any process). A process with no sample in that half is left out.
    pub fn growth_last_half(&self) -> Vec<Growth> {
        let end = self
            .series
            .iter()
            .flat_map(|(_, v)| v.iter().map(|p| p.t_s))
            .fold(0.0, f64::max);
        self.series
            .iter()
            .filter_map(|(name, v)| {
                let half: Vec<&Point> = v.iter().filter(|p| p.t_s >= end / 2.0).collect();
                let (first, last) = (half.first()?, half.last()?);
                let max = half.iter().map(|p| p.rss_mib).fold(0.0, f64::max);
                let pct = |x: f64| 100.0 * (x - first.rss_mib) / first.rss_mib.max(1e-9);
                Some(Growth {
                    name: name.clone(),
                    rss_mib_at_half: first.rss_mib,
                    rss_mib_end: last.rss_mib,
                    rss_mib_max: max,
                    growth_pct: pct(last.rss_mib),
                    max_growth_pct: pct(max),
                    samples: half.len(),
                })
            })
            .collect()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let series: Vec<serde_json::Value> = self
            .series
            .iter()
            .map(|(name, v)| {
                serde_json::json!({
                    "name": name,
                    "t_s": v.iter().map(|p| p.t_s).collect::<Vec<_>>(),
                    "cpu_s": v.iter().map(|p| p.cpu_s).collect::<Vec<_>>(),
                    "rss_mib": v.iter().map(|p| p.rss_mib).collect::<Vec<_>>(),
                })
            })
            .collect();
        let growth: Vec<serde_json::Value> = self
            .growth_last_half()
            .iter()
            .map(|g| {
                serde_json::json!({
                    "name": g.name, "rss_mib_at_half": g.rss_mib_at_half, "rss_mib_end": g.rss_mib_end,
                    "rss_mib_max": g.rss_mib_max, "growth_pct": g.growth_pct,
                    "max_growth_pct": g.max_growth_pct, "samples": g.samples,
                })
            })
            .collect();
        serde_json::json!({"sample_every_s": self.every_s, "series": series, "rss_growth_last_half": growth})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_summed_and_a_missing_one_is_none() {
        let me = std::process::id().to_string();
        // The fields parse; utime + stime is at least each of them (read a moment apart).
        let u = proc_stat_seconds(&me, &[11]).unwrap();
        let s = proc_stat_seconds(&me, &[12]).unwrap();
        let both = proc_stat_seconds(&me, &[11, 12]).unwrap();
        assert!(u >= 0.0 && s >= 0.0 && both >= u.max(s), "{u} {s} {both}");
        assert_eq!(proc_stat_seconds(&me, &[10_000]), None);
        assert_eq!(proc_stat_seconds("no-such-pid", &[11]), None);
    }

    fn p(t_s: f64, rss_mib: f64) -> Point {
        Point {
            t_s,
            cpu_s: 0.0,
            rss_mib,
        }
    }

    #[test]
    fn growth_is_measured_over_the_last_half_only() {
        let mut t = Timeline::new(1.0);
        // Grows 10 -> 100 in the first half, then 100 -> 104 with a peak of 110.
        for (s, r) in [
            (0.0, 10.0),
            (4.0, 100.0),
            (5.0, 100.0),
            (7.0, 110.0),
            (10.0, 104.0),
        ] {
            t.record("archiver", p(s, r));
        }
        // Only samples in the first half: left out.
        t.record("gone", p(1.0, 5.0));
        let g = t.growth_last_half();
        assert_eq!(g.len(), 1);
        let a = &g[0];
        assert_eq!(
            (a.rss_mib_at_half, a.rss_mib_end, a.rss_mib_max, a.samples),
            (100.0, 104.0, 110.0, 3)
        );
        assert!((a.growth_pct - 4.0).abs() < 1e-9 && (a.max_growth_pct - 10.0).abs() < 1e-9);
        let j = t.to_json();
        assert_eq!(j["series"][0]["rss_mib"].as_array().map(Vec::len), Some(5));
        assert_eq!(j["rss_growth_last_half"][0]["name"], "archiver");
    }
}
