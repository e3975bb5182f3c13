//! `host.mem`: memory and swap from `/proc/meminfo`.

use crate::procfs::{kib_to_mib, parse_num, Emit, Files, Probe};
use crate::SensorError;

const MEMINFO: &str = "/proc/meminfo";

/// The `/proc/meminfo` values we publish, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub total_kb: u64,
    pub free_kb: u64,
    /// `MemAvailable`; kernels before 3.14 lack it, then free + buffers + cached stands in.
    pub available_kb: u64,
    pub buffers_kb: u64,
    pub cached_kb: u64,
    pub swap_total_kb: u64,
    pub swap_free_kb: u64,
}

impl MemInfo {
    /// Percent of memory not available for new work.
    pub fn used_pct(&self) -> f64 {
        if self.total_kb == 0 {
            return f64::NAN;
        }
        self.total_kb.saturating_sub(self.available_kb) as f64 * 100.0 / self.total_kb as f64
    }

    /// The `host.mem` numbers, in schema order.
    pub fn numbers(&self) -> Vec<f64> {
        vec![
            kib_to_mib(self.total_kb),
            kib_to_mib(self.free_kb),
            kib_to_mib(self.available_kb),
            kib_to_mib(self.buffers_kb),
            kib_to_mib(self.cached_kb),
            kib_to_mib(self.swap_total_kb),
            kib_to_mib(self.swap_free_kb),
            self.used_pct(),
        ]
    }
}

/// Parses `/proc/meminfo`. `MemTotal` and `MemFree` are required; the rest default to 0 (or,
/// for `MemAvailable`, to free + buffers + cached). Lines we do not publish are not looked at,
/// and the parse stops once it has all seven (they are among the first twenty of the file's
/// fifty-odd lines; this parse runs every second).
pub fn parse_meminfo(text: &str) -> Result<MemInfo, SensorError> {
    let mut m = MemInfo::default();
    let (mut total, mut free, mut available) = (false, false, false);
    let mut seen = 0;
    for (i, line) in text.lines().enumerate() {
        if seen == 7 {
            break;
        }
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "MemTotal" => {
                total = true;
                &mut m.total_kb
            }
            "MemFree" => {
                free = true;
                &mut m.free_kb
            }
            "MemAvailable" => {
                available = true;
                &mut m.available_kb
            }
            "Buffers" => &mut m.buffers_kb,
            "Cached" => &mut m.cached_kb,
            "SwapTotal" => &mut m.swap_total_kb,
            "SwapFree" => &mut m.swap_free_kb,
            _ => continue,
        };
        let mut toks = rest.split_ascii_whitespace();
        *slot = parse_num(toks.next(), MEMINFO, i + 1, key)?;
        seen += 1;
        if let Some(unit) = toks.next() {
            if unit != "kB" {
                return Err(SensorError::parse(
                    MEMINFO,
                    i + 1,
                    format!("{key} has unit {unit:?}, want kB"),
                ));
            }
        }
    }
    if !total {
        return Err(SensorError::parse(MEMINFO, 0, "no MemTotal line"));
    }
    if !free {
        return Err(SensorError::parse(MEMINFO, 0, "no MemFree line"));
    }
    if !available {
        m.available_kb = m.free_kb.saturating_add(m.buffers_kb).saturating_add(m.cached_kb);
    }
    Ok(m)
}

/// Emits `host.mem` every sample (gauges need no baseline).
pub(crate) struct Mem;

impl Probe for Mem {
    const BUF_CAPACITY: usize = 2048;

    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        let m = files.read("meminfo", parse_meminfo)?;
        out.push(m.numbers(), Vec::new());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO_FIXTURE: &str = "\
MemTotal:       16303428 kB
MemFree:         1216112 kB
MemAvailable:    9710236 kB
Buffers:          523768 kB
Cached:          7886544 kB
SwapCached:        12104 kB
Active:          8001452 kB
Inactive:        5490308 kB
SwapTotal:       2097148 kB
SwapFree:        1948412 kB
Dirty:               628 kB
HugePages_Total:       0
HugePages_Free:        0
Hugepagesize:       2048 kB
DirectMap1G:     2097152 kB
";

    #[test]
    fn parses_meminfo() {
        let m = parse_meminfo(MEMINFO_FIXTURE).unwrap();
        assert_eq!(m.total_kb, 16303428);
        assert_eq!(m.available_kb, 9710236);
        assert_eq!(m.swap_free_kb, 1948412);
        let n = m.numbers();
        assert_eq!(n.len(), 8);
        assert!((n[0] - 16303428.0 / 1024.0).abs() < 1e-9);
        let used = (16303428.0 - 9710236.0) / 16303428.0 * 100.0;
        assert!((n[7] - used).abs() < 1e-9);
    }

    #[test]
    fn old_kernel_without_memavailable() {
        let m =
            parse_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n").unwrap();
        assert_eq!(m.available_kb, 400);
        assert!((m.used_pct() - 60.0).abs() < 1e-9);
        assert_eq!(m.swap_total_kb, 0);
    }

    #[test]
    fn malformed_meminfo_is_an_error() {
        for bad in [
            "",
            "garbage\n",
            "MemFree: 10 kB\n",
            "MemTotal: 10 kB\n",
            "MemTotal: x kB\nMemFree: 1 kB\n",
            "MemTotal: 10 MB\nMemFree: 1 kB\n",
            "MemTotal:\nMemFree: 1 kB\n",
        ] {
            assert!(parse_meminfo(bad).is_err(), "{bad:?}");
        }
        let e = parse_meminfo("MemTotal: 10 kB\nMemFree: -1 kB\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }
}
