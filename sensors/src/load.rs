//! `host.load`: the capacity summary a broker ranks hosts by. On a real host `queue_waiting` is
//! the jobs pending in the local batch system as the batch sensor last read them
//! ([`crate::batch`]; 0 without one) and the benchmark scores are the agent's last
//! `host.bench` run ([`crate::bench`]; NaN before one, or with the benchmark off); the
//! simulator fills them in for its virtual hosts. `total_cpus` and `memory_mb` are read again
//! every [`SIZE_REFRESH`] (a minute), `load1` every sample.

use crate::batch::QueueShare;
use crate::bench::BenchShare;
use crate::cpu::LoadavgShare;
use crate::info::count_cpus;
use crate::mem::parse_meminfo;
use crate::procfs::{kib_to_mib, Emit, Files, Probe};
use crate::SensorError;

/// CPUs free for new work: `max(0, cpus - load1)` rounded down. Equals `cpus - ceil(load1)`
/// for whole `cpus`, the rule the simulator uses too.
pub fn free_cpus(cpus: f64, load1: f64) -> f64 {
    (cpus - load1).max(0.0).floor()
}

/// How long `host.load` keeps the host's size (CPUs from `/proc/stat`, memory from
/// `/proc/meminfo`) before reading it again: it changes only when CPUs or memory are
/// hot-plugged, and those two files are among the costliest `/proc` files the agent reads (the
/// kernel generates every line of them; docs/PERFORMANCE.md, the agent's CPU). A hot-plugged
/// CPU shows in `cpus` and `free_cpus` within this time.
pub const SIZE_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// Emits `host.load` every sample.
pub(crate) struct Load {
    /// Jobs waiting in the batch system (written by the batch sensor).
    pub(crate) queue: QueueShare,
    /// The benchmark scores (written by the benchmark sensor).
    pub(crate) bench: BenchShare,
    /// The host's size as last read: CPUs, MemTotal in MiB, and the sample time (UTC ns).
    size: Option<(f64, f64, i64)>,
    /// `/proc/loadavg`, read once a tick with `host.cpu`.
    loadavg: LoadavgShare,
}

impl Load {
    pub(crate) fn new(queue: QueueShare, bench: BenchShare, loadavg: LoadavgShare) -> Load {
        Load {
            queue,
            bench,
            size: None,
            loadavg,
        }
    }

    /// CPUs and MemTotal (MiB): kept from an earlier sample less than [`SIZE_REFRESH`] ago,
    /// else read again.
    fn size(&mut self, files: &mut Files, now_ns: i64) -> Result<(f64, f64), SensorError> {
        let refresh = SIZE_REFRESH.as_nanos() as i64;
        if let Some((cores, mem_mb, at)) = self.size {
            // A clock that went backwards reads again.
            if now_ns >= at && now_ns - at < refresh {
                return Ok((cores, mem_mb));
            }
        }
        let cores = files.read("stat", |t| match count_cpus(t) {
            0 => Err(SensorError::parse("/proc/stat", 0, "no per-cpu \"cpuN\" lines")),
            n => Ok(n as f64),
        })?;
        let mem_mb = kib_to_mib(files.read("meminfo", parse_meminfo)?.total_kb);
        self.size = Some((cores, mem_mb, now_ns));
        Ok((cores, mem_mb))
    }
}

impl Probe for Load {
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let load = self.loadavg.read(files, out.now_ns)?;
        let (cores, mem_mb) = self.size(files, out.now_ns)?;
        let bench = self.bench.get();
        let numbers = vec![
            load.load1,
            free_cpus(cores, load.load1),
            cores,
            self.queue.get(),
            mem_mb,
            bench.map_or(f64::NAN, |b| b.specint),
            bench.map_or(f64::NAN, |b| b.specfp),
        ];
        out.push(numbers, Vec::new());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;

    #[test]
    fn free_cpus_rule() {
        assert_eq!(free_cpus(8.0, 0.0), 8.0);
        assert_eq!(free_cpus(8.0, 0.5), 7.0);
        assert_eq!(free_cpus(8.0, 3.0), 5.0);
        assert_eq!(free_cpus(8.0, 12.0), 0.0);
    }

    #[test]
    fn sensor_from_fixture_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("loadavg"), "2.50 1.00 0.50 3/200 999\n").unwrap();
        std::fs::write(
            p.join("stat"),
            "cpu  1 1 1 1\ncpu0 1 1 1 1\ncpu1 0 0 0 0\ncpu2 0 0 0 0\ncpu3 0 0 0 0\n",
        )
        .unwrap();
        std::fs::write(p.join("meminfo"), "MemTotal: 1048576 kB\nMemFree: 1 kB\n").unwrap();
        let cfg = crate::HostSensorConfig {
            proc_root: p.to_path_buf(),
            ..crate::HostSensorConfig::new("h")
        };
        let queue = QueueShare::default();
        let bench = BenchShare::default();
        let load = Load::new(queue.clone(), bench.clone(), LoadavgShare::default());
        let mut s = crate::procfs::ProcSensor::host(&cfg, crate::schemas::host_load(), load);
        let mut out = Vec::new();
        s.sample(7, &mut out).unwrap();
        let n = &out[0].numbers;
        assert_eq!(&n[..5], &[2.5, 1.0, 4.0, 0.0, 1024.0]);
        assert!(n[5].is_nan() && n[6].is_nan());
        // What the batch sensor read is the queue.
        queue.set(3.0);
        s.sample(8, &mut out).unwrap();
        assert_eq!(out[1].numbers[3], 3.0);
        // And the benchmark's last scores are the bench fields.
        let scores = crate::bench::Scores {
            specint: 1500.0,
            specfp: 1200.0,
            mem_mbps: 9000.0,
            seconds: 0.3,
        };
        bench.set(scores);
        s.sample(9, &mut out).unwrap();
        assert_eq!(out[2].numbers[5..], [1500.0, 1200.0]);
        // The size is kept for SIZE_REFRESH: a hot-plugged CPU shows after it.
        let refresh = SIZE_REFRESH.as_nanos() as i64;
        std::fs::write(
            p.join("stat"),
            "cpu  1 1 1 1\ncpu0 1 1 1 1\ncpu1 0 0 0 0\ncpu2 0 0 0 0\ncpu3 0 0 0 0\ncpu4 0 0 0 0\n",
        )
        .unwrap();
        s.sample(7 + refresh - 1, &mut out).unwrap();
        assert_eq!(out[3].numbers[2], 4.0, "kept");
        s.sample(7 + refresh, &mut out).unwrap();
        assert_eq!(out[4].numbers[2], 5.0, "read again");
        // A clock that went backwards reads again too; a stat without CPUs is an error then.
        std::fs::write(p.join("stat"), "cpu  1 1 1 1\n").unwrap();
        assert!(s.sample(10, &mut out).is_err());
    }
}
