//! `host.disk`: per-device I/O rates from `/proc/diskstats` deltas, whole devices only.
//!
//! Which devices count as whole: those listed in `<sys_root>/block` (the kernel lists disks
//! there, not partitions), minus `loop*` and `ram*` (pseudo devices that would only add noise).
//! If `<sys_root>/block` cannot be read (no /sys in a container), a device is taken as a
//! partition when another listed device's name is its prefix followed by digits or `p` and
//! digits (`sda` -> `sda1`, `nvme0n1` -> `nvme0n1p2`, `mmcblk0` -> `mmcblk0p1`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::procfs::{parse_num, rate, Emit, Files, PartRates, Probe};
use crate::SensorError;

const DISKSTATS: &str = "/proc/diskstats";
/// `/proc/diskstats` counts sectors of 512 bytes whatever the device's real sector size.
const SECTOR_BYTES: f64 = 512.0;

/// The cumulative counters of one device that `host.disk` publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskCounters {
    pub reads: u64,
    pub sectors_read: u64,
    pub writes: u64,
    pub sectors_written: u64,
    pub io_ms: u64,
}

/// One device line; the name borrows from the parsed text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStat<'a> {
    pub device: &'a str,
    pub counters: DiskCounters,
}

/// Parses `/proc/diskstats`: `major minor name` then at least 11 counters (kernels since 4.18
/// and 5.5 append discard and flush columns, which we ignore).
pub fn parse_diskstats(text: &str) -> Result<Vec<DiskStat<'_>>, SensorError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let mut toks = line.split_ascii_whitespace();
        let Some(major) = toks.next() else {
            continue; // blank line
        };
        parse_num::<u32>(Some(major), DISKSTATS, n, "major number")?;
        parse_num::<u32>(toks.next(), DISKSTATS, n, "minor number")?;
        let device = toks
            .next()
            .ok_or_else(|| SensorError::parse(DISKSTATS, n, "missing device name"))?;
        let mut v = [0u64; 11];
        for (k, slot) in v.iter_mut().enumerate() {
            *slot = parse_num(toks.next(), DISKSTATS, n, COLUMNS[k])?;
        }
        out.push(DiskStat {
            device,
            counters: DiskCounters {
                reads: v[0],
                sectors_read: v[2],
                writes: v[4],
                sectors_written: v[6],
                io_ms: v[9],
            },
        });
    }
    Ok(out)
}

const COLUMNS: [&str; 11] = [
    "reads completed",
    "reads merged",
    "sectors read",
    "ms reading",
    "writes completed",
    "writes merged",
    "sectors written",
    "ms writing",
    "I/Os in progress",
    "ms doing I/O",
    "weighted ms doing I/O",
];

/// The `host.disk` numbers for one device, in schema order.
pub fn disk_rates(prev: &DiskCounters, cur: &DiskCounters, dt_s: f64) -> [f64; 5] {
    [
        rate(prev.reads, cur.reads, dt_s),
        rate(prev.writes, cur.writes, dt_s),
        rate(prev.sectors_read, cur.sectors_read, dt_s) * SECTOR_BYTES,
        rate(prev.sectors_written, cur.sectors_written, dt_s) * SECTOR_BYTES,
        rate(prev.io_ms, cur.io_ms, dt_s),
    ]
}

/// Pseudo devices never reported.
pub fn is_pseudo(device: &str) -> bool {
    device.starts_with("loop") || device.starts_with("ram")
}

/// The fallback partition test (see the module doc): `device` is `other` + digits, or
/// `other` + `p` + digits, for some other listed device.
pub fn looks_like_partition<'a>(device: &str, all: impl IntoIterator<Item = &'a str>) -> bool {
    all.into_iter().any(|other| {
        device.len() > other.len() && device.starts_with(other) && {
            let rest = &device[other.len()..];
            let digits = rest.strip_prefix('p').unwrap_or(rest);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }
    })
}

/// `/sys/block` spells a `/` in a device name as `!` (`cciss!c0d0` for `cciss/c0d0`).
fn sys_block_name(device: &str) -> std::borrow::Cow<'_, str> {
    if device.contains('/') {
        device.replace('/', "!").into()
    } else {
        device.into()
    }
}

/// Emits one `host.disk` per whole device. A device's first sighting is its baseline.
pub(crate) struct Disk {
    sys_block: PathBuf,
    whole: HashSet<String>,
    /// `<sys_root>/block` could be read at the last refresh.
    have_sys: bool,
    /// The devices `/proc/diskstats` listed when `<sys_root>/block` was last read: while it
    /// lists the same, which are whole is known (a device is added to both at once).
    listed: Vec<String>,
    /// `<sys_root>/block` has been read once.
    refreshed: bool,
    devices: PartRates<DiskCounters>,
}

impl Disk {
    /// Whole devices are those listed in `<sys_root>/block`.
    pub(crate) fn new(sys_root: &Path) -> Disk {
        Disk {
            sys_block: sys_root.join("block"),
            whole: HashSet::new(),
            have_sys: false,
            listed: Vec::new(),
            refreshed: false,
            devices: PartRates::default(),
        }
    }

    /// Re-reads `<sys_root>/block` (devices come and go); `false` when it cannot be read.
    fn refresh_whole(&mut self) -> bool {
        let Ok(dir) = std::fs::read_dir(&self.sys_block) else {
            return false;
        };
        self.whole.clear();
        for entry in dir.flatten() {
            if let Ok(name) = entry.file_name().into_string() {
                self.whole.insert(name);
            }
        }
        true
    }
}

impl Probe for Disk {
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let stats = files.read("diskstats", parse_diskstats)?;
        // Devices came or went (or the first sample): read `<sys_root>/block` again.
        let same = self.refreshed
            && stats.len() == self.listed.len()
            && stats.iter().zip(&self.listed).all(|(d, n)| d.device == n);
        if !same {
            self.have_sys = self.refresh_whole();
            self.refreshed = true;
            self.listed.clear();
            self.listed.extend(stats.iter().map(|d| d.device.to_string()));
        }
        let have_sys = self.have_sys;
        let whole = &self.whole;
        let keep = |d: &&DiskStat<'_>| {
            !is_pseudo(d.device)
                && if have_sys {
                    whole.contains(sys_block_name(d.device).as_ref())
                } else {
                    !looks_like_partition(d.device, stats.iter().map(|s| s.device))
                }
        };
        let parts = stats.iter().filter(keep).map(|d| (d.device, d.counters));
        self.devices.sample(parts, out, disk_rates);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;

    const DISKSTATS_A: &str = "\
   7       0 loop0 55 0 2144 21 0 0 0 0 0 48 21 0 0 0 0
   8       0 sda 231470 61340 18406746 79633 598302 630163 37453424 1026420 0 611236 1126702 0 0 0 0 20547 20648
   8       1 sda1 230982 61340 18387290 79477 598300 630163 37453416 1026419 0 611136 1106396 0 0 0 0 0 0
 259       0 nvme0n1 84523 2 6540234 9834 120312 88765 9812345 80123 0 98712 90234
 259       1 nvme0n1p1 84000 2 6530000 9800 120000 88765 9800000 80000 0 98600 90100
   1       0 ram0 0 0 0 0 0 0 0 0 0 0 0
 253       0 dm-0 1000 0 8000 10 2000 0 16000 20 0 30 30
";

    const DISKSTATS_B: &str = "\
   7       0 loop0 55 0 2144 21 0 0 0 0 0 48 21 0 0 0 0
   8       0 sda 231570 61340 18408746 79633 598502 630163 37463424 1026420 0 611736 1126702 0 0 0 0 20547 20648
   8       1 sda1 231082 61340 18389290 79477 598500 630163 37463416 1026419 0 612136 1106396 0 0 0 0 0 0
 259       0 nvme0n1 84523 2 6540234 9834 120312 88765 9812345 80123 0 98712 90234
 259       1 nvme0n1p1 84000 2 6530000 9800 120000 88765 9800000 80000 0 98600 90100
 253       0 dm-0 1000 0 8000 10 2000 0 16000 20 0 30 30
";

    #[test]
    fn parses_diskstats() {
        let d = parse_diskstats(DISKSTATS_A).unwrap();
        assert_eq!(d.len(), 7);
        assert_eq!(d[1].device, "sda");
        assert_eq!(
            d[1].counters,
            DiskCounters {
                reads: 231470,
                sectors_read: 18406746,
                writes: 598302,
                sectors_written: 37453424,
                io_ms: 611236
            }
        );
        assert_eq!(d[3].device, "nvme0n1");
        assert_eq!(d[3].counters.io_ms, 98712);
    }

    #[test]
    fn malformed_diskstats_is_an_error() {
        for bad in [
            "8 0\n",
            "8 0 sda 1 2 3\n",
            "x 0 sda 1 2 3 4 5 6 7 8 9 10 11\n",
            "8 0 sda 1 2 3 4 5 6 7 8 9 ten 11\n",
            "8 0 sda 1 2 3 4 5 6 7 8 9 10 11\ngarbage\n",
        ] {
            assert!(parse_diskstats(bad).is_err(), "{bad:?}");
        }
        assert!(parse_diskstats("").unwrap().is_empty());
    }

    #[test]
    fn rates_and_wrap() {
        let a = parse_diskstats(DISKSTATS_A).unwrap();
        let b = parse_diskstats(DISKSTATS_B).unwrap();
        let r = disk_rates(&a[1].counters, &b[1].counters, 2.0);
        assert_eq!(r, [50.0, 100.0, 1000.0 * 512.0, 5000.0 * 512.0, 250.0]);
        assert!(disk_rates(&b[1].counters, &a[1].counters, 1.0)
            .iter()
            .all(|&x| x == 0.0));
    }

    #[test]
    fn partition_heuristic() {
        let all = [
            "sda",
            "sda1",
            "sdaa",
            "nvme0n1",
            "nvme0n1p1",
            "mmcblk0",
            "mmcblk0p2",
            "vda",
            "dm-0",
        ];
        let parts: Vec<&str> = all
            .iter()
            .copied()
            .filter(|d| looks_like_partition(d, all))
            .collect();
        assert_eq!(parts, ["sda1", "nvme0n1p1", "mmcblk0p2"]);
        assert!(is_pseudo("loop3") && is_pseudo("ram0") && !is_pseudo("sda"));
    }

    fn sensor_run(with_sys: bool) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        let sys_root = dir.path().join("sys");
        std::fs::create_dir_all(&proc_root).unwrap();
        if with_sys {
            for d in ["loop0", "sda", "ram0", "dm-0"] {
                std::fs::create_dir_all(sys_root.join("block").join(d)).unwrap();
            }
        }
        let cfg = crate::HostSensorConfig {
            proc_root: proc_root.clone(),
            sys_root,
            ..crate::HostSensorConfig::new("h")
        };
        let mut s =
            crate::procfs::ProcSensor::host(&cfg, crate::schemas::host_disk(), Disk::new(&cfg.sys_root));
        let mut out = Vec::new();
        std::fs::write(proc_root.join("diskstats"), DISKSTATS_A).unwrap();
        s.sample(0, &mut out).unwrap();
        assert!(out.is_empty());
        std::fs::write(proc_root.join("diskstats"), DISKSTATS_B).unwrap();
        s.sample(2_000_000_000, &mut out).unwrap();
        out.iter().map(|e| e.source.clone()).collect()
    }

    #[test]
    fn sensor_reports_whole_devices_only() {
        assert_eq!(sensor_run(true), ["h/sda", "h/dm-0"]);
        assert_eq!(sensor_run(false), ["h/sda", "h/nvme0n1", "h/dm-0"]);
    }

    #[test]
    fn a_device_added_later_is_classified_when_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_root, sys_root) = (dir.path().join("proc"), dir.path().join("sys"));
        std::fs::create_dir_all(&proc_root).unwrap();
        std::fs::create_dir_all(sys_root.join("block/sda")).unwrap();
        let cfg = crate::HostSensorConfig {
            proc_root: proc_root.clone(),
            sys_root: sys_root.clone(),
            ..crate::HostSensorConfig::new("h")
        };
        let mut s =
            crate::procfs::ProcSensor::host(&cfg, crate::schemas::host_disk(), Disk::new(&cfg.sys_root));
        let sda = " 8 0 sda 1 0 8 0 1 0 8 0 0 1 1\n 8 1 sda1 1 0 8 0 1 0 8 0 0 1 1\n";
        let sdb = " 8 16 sdb 1 0 8 0 1 0 8 0 0 1 1\n 8 17 sdb1 1 0 8 0 1 0 8 0 0 1 1\n";
        let mut out = Vec::new();
        let sec = 1_000_000_000;
        for (i, text) in [sda, sda, &format!("{sda}{sdb}"), &format!("{sda}{sdb}")]
            .into_iter()
            .enumerate()
        {
            if i == 2 {
                std::fs::create_dir_all(sys_root.join("block/sdb")).unwrap();
            }
            std::fs::write(proc_root.join("diskstats"), text).unwrap();
            s.sample(i as i64 * sec, &mut out).unwrap();
        }
        let sources: Vec<&str> = out.iter().map(|e| e.source.as_str()).collect();
        assert_eq!(sources, ["h/sda", "h/sda", "h/sda", "h/sdb"]);
    }
}
