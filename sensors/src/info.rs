//! `host.info`: what the host is — OS, kernel, architecture, name, size, boot time. Sent on the
//! first sample and then every `info_period`, since it rarely changes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::mem::parse_meminfo;
use crate::procfs::{kib_to_mib, parse_num, Emit, Files, Probe};
use crate::SensorError;

const STAT: &str = "/proc/stat";

/// The `os` value when os-release is missing or names nothing.
pub const UNKNOWN_OS: &str = "unknown";

/// Facts from `/proc/stat` that `host.info` and `host.load` need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatInfo {
    /// Online logical CPUs: the `cpuN` lines.
    pub cores: u32,
    /// `btime`: boot time in seconds since the Unix epoch.
    pub boot_time_s: u64,
}

/// Counts the per-CPU `cpuN` lines of `/proc/stat` (the aggregate `cpu ` line excluded).
pub fn count_cpus(text: &str) -> u32 {
    text.lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count() as u32
}

/// Parses the CPU count and `btime` of `/proc/stat`; both are required.
pub fn parse_stat_info(text: &str) -> Result<StatInfo, SensorError> {
    let cores = count_cpus(text);
    if cores == 0 {
        return Err(SensorError::parse(STAT, 0, "no per-cpu \"cpuN\" lines"));
    }
    for (i, line) in text.lines().enumerate() {
        if let Some(rest) = line.strip_prefix("btime ") {
            let boot_time_s = parse_num(rest.split_ascii_whitespace().next(), STAT, i + 1, "btime")?;
            return Ok(StatInfo { cores, boot_time_s });
        }
    }
    Err(SensorError::parse(STAT, 0, "no btime line"))
}

/// The OS name of an os-release file: `PRETTY_NAME`, else `NAME`, unquoted. `None` when
/// neither is there.
pub fn parse_os_release(text: &str) -> Option<String> {
    let mut name = None;
    for line in text.lines() {
        let Some((key, value)) = line.trim().split_once('=') else {
            continue;
        };
        match key {
            "PRETTY_NAME" => return Some(unquote(value)).filter(|s| !s.is_empty()),
            "NAME" => name = Some(unquote(value)),
            _ => {}
        }
    }
    name.filter(|s| !s.is_empty())
}

/// os-release values are shell-style: optionally in single or double quotes, with `\`
/// escaping inside double quotes.
fn unquote(v: &str) -> String {
    let v = v.trim();
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            if q == '\'' {
                return inner.to_string();
            }
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        out.push(n);
                    }
                } else {
                    out.push(c);
                }
            }
            return out;
        }
    }
    v.to_string()
}

/// Emits `host.info`; see the module doc for when. Its sensor's period is the info period:
/// the producer need not wake it more often.
pub(crate) struct Info {
    os_release: PathBuf,
    last_ns: Option<i64>,
}

impl Info {
    /// `os_release` is normally `/etc/os-release`.
    pub(crate) fn new(os_release: &Path) -> Info {
        Info {
            os_release: os_release.to_path_buf(),
            last_ns: None,
        }
    }

    /// Due on the first sample, then once `period` (the info period) has passed. A tenth of
    /// the period is allowed as slack so a loop ticking at exactly `info_period` with a little
    /// jitter does not skip every other tick.
    fn due(&self, period: Duration, now_ns: i64) -> bool {
        let Some(last) = self.last_ns else {
            return true;
        };
        let period = i64::try_from(period.as_nanos()).unwrap_or(i64::MAX);
        now_ns.saturating_sub(last) >= period - period / 10
    }
}

/// A one-line file such as `/proc/sys/kernel/hostname`, without its newline.
fn trimmed(text: &str) -> Result<String, SensorError> {
    Ok(text.trim().to_string())
}

impl Probe for Info {
    fn sample(&mut self, files: &mut Files, out: &mut Emit<'_>) -> Result<(), SensorError> {
        if !self.due(out.period, out.now_ns) {
            return Ok(());
        }
        let stat = files.read("stat", parse_stat_info)?;
        let mem = files.read("meminfo", parse_meminfo)?;
        let kernel = files.read("sys/kernel/osrelease", trimmed)?;
        let hostname = files.read("sys/kernel/hostname", trimmed)?;
        // os-release is not in /proc and minimal containers lack it; the rest of host.info is
        // still worth sending, so its absence degrades to "unknown" instead of failing.
        let os = match files.read_at(&self.os_release, |t| Ok(parse_os_release(t))) {
            Ok(os) => os.unwrap_or_else(|| UNKNOWN_OS.to_string()),
            Err(e) => {
                tracing::debug!(error = %e, "no os-release; host.info os is {UNKNOWN_OS:?}");
                UNKNOWN_OS.to_string()
            }
        };
        let strings = vec![os, kernel, std::env::consts::ARCH.to_string(), hostname];
        let numbers = vec![
            stat.cores as f64,
            kib_to_mib(mem.total_kb),
            stat.boot_time_s as f64,
        ];
        out.push(numbers, strings);
        self.last_ns = Some(out.now_ns);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sensor;

    const STAT_FIXTURE: &str = "\
cpu  10132153 290696 3084719 46828483 16683 0 25195 0 175628 0
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0
cpu1 1335389 32994 491004 13385190 3473 0 4082 0 23618 0
cpu2 1301234 31000 480000 13390000 3400 0 4000 0 23000 0
cpu3 1290000 30000 470000 13400000 3300 0 3900 0 22000 0
intr 199292311 43 0 0 0
ctxt 322975046
btime 1699999123
processes 1045873
cpufreq_whatever 1
";

    #[test]
    fn parses_stat_info() {
        let s = parse_stat_info(STAT_FIXTURE).unwrap();
        assert_eq!(
            s,
            StatInfo {
                cores: 4,
                boot_time_s: 1699999123
            }
        );
        assert!(
            parse_stat_info("cpu  1 2 3 4\nbtime 5\n").is_err(),
            "no cpuN lines"
        );
        assert!(parse_stat_info("cpu0 1 2 3 4\n").is_err(), "no btime");
        let e = parse_stat_info("cpu0 1 2 3 4\nbtime soon\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(parse_stat_info("").is_err());
    }

    #[test]
    fn parses_os_release() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nID=debian\n";
        assert_eq!(
            parse_os_release(debian).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(
            parse_os_release("NAME=Alpine\nID=alpine\n").as_deref(),
            Some("Alpine")
        );
        assert_eq!(
            parse_os_release("PRETTY_NAME='It''s'\n").as_deref(),
            Some("It''s")
        );
        assert_eq!(
            parse_os_release("PRETTY_NAME=\"say \\\"hi\\\"\"\n").as_deref(),
            Some("say \"hi\"")
        );
        assert_eq!(parse_os_release("ID=x\n"), None);
        assert_eq!(parse_os_release("PRETTY_NAME=\"\"\n"), None);
        assert_eq!(parse_os_release("\u{0}garbage"), None);
    }

    #[test]
    fn emits_first_then_every_info_period() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("sys/kernel")).unwrap();
        std::fs::write(p.join("stat"), STAT_FIXTURE).unwrap();
        std::fs::write(p.join("meminfo"), "MemTotal: 2048 kB\nMemFree: 1024 kB\n").unwrap();
        std::fs::write(p.join("sys/kernel/osrelease"), "6.1.0-18-amd64\n").unwrap();
        std::fs::write(p.join("sys/kernel/hostname"), "node7\n").unwrap();
        let cfg = crate::HostSensorConfig {
            proc_root: p.to_path_buf(),
            os_release: p.join("no-such-os-release"),
            info_period: Duration::from_secs(60),
            ..crate::HostSensorConfig::new("node7")
        };
        let mut s = crate::procfs::ProcSensor::new(
            &cfg.source,
            cfg.info_period,
            &cfg.proc_root,
            crate::schemas::host_info(),
            Info::new(&cfg.os_release),
        );
        let mut out = Vec::new();
        let sec = 1_000_000_000i64;
        // 10 % slack: 115 s is close enough to 60 s + 60 s
        for t in [0, 1, 30, 50, 60, 61, 115, 125] {
            s.sample(t * sec, &mut out).unwrap();
        }
        let times: Vec<i64> = out.iter().map(|e| e.timestamp_ns / sec).collect();
        assert_eq!(times, [0, 60, 115]);
        let e = &out[0];
        assert_eq!(
            e.strings,
            ["unknown", "6.1.0-18-amd64", std::env::consts::ARCH, "node7"]
        );
        assert_eq!(e.numbers, [4.0, 2.0, 1699999123.0]);

        std::fs::remove_file(p.join("sys/kernel/osrelease")).unwrap();
        let err = s.sample(1000 * sec, &mut out).unwrap_err();
        assert!(err.to_string().contains("osrelease"), "{err}");
    }
}
