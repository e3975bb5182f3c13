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
