//! `host.info`: what the host is — OS, kernel, architecture, name, size, boot time, free disk
//! per mount and the versions of selected installed packages. Sent on the first sample and then
//! every `info_period`, since it rarely changes.
//!
//! What a job's requirements can match: `cores`, `memory_mb`, `arch`, `os_id`/`os_version`
//! (os-release `ID`, `VERSION_ID`), `disk_free_mb` (the root filesystem) and `software`, the
//! installed packages among the configured list (`packages`, [`DEFAULT_PACKAGES`]) as
//! `name=version` joined by `,` — the broker's live view takes each `name` and each
//! `name=version` as a software entry a job's `software = [...]` can ask for.
//!
//! The disk figures come from `df -P -k` and the packages from `dpkg-query -W` (Debian and
//! derivatives), both run with the command timeout and bounded output (see
//! [`crate::command`]). A host without one of them publishes that part empty (NaN for
//! `disk_free_mb`) and logs it once; a failing command is logged and leaves its part empty: the
//! rest of `host.info` is still worth sending. The packages' versions change only when dpkg's
//! database does: `dpkg-query` runs again only when `/var/lib/dpkg/status` changed (its inode,
//! size or modification time) since the last answer, else that answer is sent again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::{self, Commands, Ran};
use crate::mem::parse_meminfo;
use crate::procfs::{kib_to_mib, parse_num, Emit, Files, Probe};
use crate::SensorError;

const STAT: &str = "/proc/stat";

/// dpkg's database of installed packages.
pub const DPKG_STATUS: &str = "/var/lib/dpkg/status";

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

/// One os-release value (`ID`, `VERSION_ID`), unquoted; `None` when absent or empty.
pub fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| unquote(v))
        .filter(|v| !v.is_empty())
}

/// Most mounts listed in `mounts`.
pub const MAX_MOUNTS: usize = 32;
/// Most packages in the configured list.
pub const MAX_PACKAGES: usize = 64;
/// Longest package name (and longest version kept).
pub const MAX_PACKAGE_LEN: usize = 64;
/// Output kept of `df` and `dpkg-query`.
const MAX_COMMAND_OUTPUT: usize = 64 * 1024;

/// The packages `host.info` reports when the config names none: language runtimes,
/// compilers, MPI, containers and batch clients a job commonly requires.
pub const DEFAULT_PACKAGES: &[&str] = &[
    "python3",
    "perl",
    "gcc",
    "g++",
    "gfortran",
    "make",
    "cmake",
    "openmpi-bin",
    "mpich",
    "default-jre-headless",
    "r-base-core",
    "apptainer",
    "singularity-container",
    "docker.io",
    "podman",
    "slurm-client",
];

/// Checks a configured package list: at most [`MAX_PACKAGES`] Debian package names
/// (`[a-z0-9][a-z0-9+.-]+`, at most [`MAX_PACKAGE_LEN`] bytes). The names go to `dpkg-query` as
/// arguments, so nothing else may pass (a leading `-` would be an option).
pub fn validate_packages(packages: &[String]) -> Result<(), SensorError> {
    let origin = "packages";
    if packages.len() > MAX_PACKAGES {
        return Err(SensorError::config(
            origin,
            format!("{} packages; list at most {MAX_PACKAGES}", packages.len()),
        ));
    }
    for p in packages {
        let b = p.as_bytes();
        let ok = b.len() >= 2
            && b.len() <= MAX_PACKAGE_LEN
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"+.-".contains(c));
        if !ok {
            let shown: String = p.chars().take(MAX_PACKAGE_LEN).collect();
            return Err(SensorError::config(
                origin,
                format!("{shown:?} is not a Debian package name (lowercase letters, digits, + . -; 2 to {MAX_PACKAGE_LEN} long, starting with a letter or digit)"),
            ));
        }
    }
    Ok(())
}

/// One mounted filesystem as `df -P -k` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    /// Where it is mounted.
    pub mount: String,
    /// Size, MiB.
    pub size_mb: f64,
    /// Space available to unprivileged users, MiB.
    pub avail_mb: f64,
}

/// Parses `df -P -k`: a header, then `filesystem blocks used available capacity% mountpoint`
/// in KiB. A filesystem name or mount point with spaces is read around the `capacity%`
/// column; lines with unknown sizes (`-`) are skipped.
pub fn parse_df(text: &str) -> Result<Vec<Mount>, SensorError> {
    const DF: &str = "df -P -k";
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let toks: Vec<&str> = line.split_ascii_whitespace().collect();
        if toks.is_empty() || (i == 0 && toks[0] == "Filesystem") {
            continue;
        }
        // The capacity column: `NN%` (or `-`) after three size columns, before the mount.
        let Some(cap) = (4..toks.len().saturating_sub(1))
            .find(|&k| toks[k].ends_with('%') || (toks[k] == "-" && toks[k - 1] == "-"))
        else {
            return Err(SensorError::parse(
                DF,
                i + 1,
                "no capacity column (NN%) followed by a mount point",
            ));
        };
        if toks[cap - 3..cap].contains(&"-") {
            continue;
        }
        let size: u64 = parse_num(Some(toks[cap - 3]), DF, i + 1, "size")?;
        let avail: u64 = parse_num(Some(toks[cap - 1]), DF, i + 1, "available space")?;
        out.push(Mount {
            mount: toks[cap + 1..].join(" "),
            size_mb: kib_to_mib(size),
            avail_mb: kib_to_mib(avail),
        });
    }
    Ok(out)
}

/// The mounts `host.info` lists: real storage a job could write to. Kernel and runtime
/// filesystems (under `/proc`, `/sys`, `/dev`, `/run`), those under 1 MiB and mount points that
/// cannot be written in the list (`,` or `=`) are left out; the first [`MAX_MOUNTS`] kept.
pub fn listed_mounts(all: &[Mount]) -> impl Iterator<Item = &Mount> {
    let system = |m: &str| {
        ["/proc", "/sys", "/dev", "/run"]
            .iter()
            .any(|p| m == *p || m.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
    };
    all.iter()
        .filter(move |m| {
            m.mount.starts_with('/') && m.size_mb >= 1.0 && !system(&m.mount) && !m.mount.contains([',', '='])
        })
        .take(MAX_MOUNTS)
}

/// The `mounts` field: `<mount>=<available MiB>/<size MiB>` (whole MiB) joined by `,`.
pub fn format_mounts<'a>(mounts: impl IntoIterator<Item = &'a Mount>) -> String {
    let list: Vec<String> = mounts
        .into_iter()
        .map(|m| format!("{}={}/{}", m.mount, m.avail_mb.floor(), m.size_mb.floor()))
        .collect();
    list.join(",")
}

/// Parses `dpkg-query -W -f '${Package}\t${Version}\t${db:Status-Abbrev}\n'`: the installed
/// packages (status `ii`) with their versions, sorted by name, each once (a package installed
/// for several architectures has one version per architecture; the first is kept). Lines of
/// another shape are ignored: dpkg-query's errors go to standard error.
pub fn parse_dpkg(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (name, version, status) = (f.next()?, f.next()?, f.next()?);
            let ok = status.starts_with("ii")
                && !name.is_empty()
                && !version.is_empty()
                && name.len() <= MAX_PACKAGE_LEN
                && !name.contains([',', '=', ' '])
                && !version.contains([',', ' ']);
            ok.then(|| {
                let v: String = version.chars().take(MAX_PACKAGE_LEN).collect();
                (name.to_string(), v)
            })
        })
        .collect();
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// The `software` field: `name=version` joined by `,`.
pub fn format_software(packages: &[(String, String)]) -> String {
    let list: Vec<String> = packages.iter().map(|(n, v)| format!("{n}={v}")).collect();
    list.join(",")
}

/// The software entries a `software` field offers to a job's requirements: each `name` and
/// each `name=version`.
pub fn software_entries(field: &str) -> impl Iterator<Item = &str> {
    field
        .split(',')
        .filter(|e| !e.is_empty() && !e.starts_with('='))
        .flat_map(|e| match e.split_once('=') {
            Some((name, _)) => [Some(name), Some(e)],
            None => [Some(e), None],
        })
        .flatten()
}

/// Emits `host.info`; see the module doc for when. Its sensor's period is the info period:
/// the producer need not wake it more often.
pub(crate) struct Info {
    os_release: PathBuf,
    commands: Commands,
    /// Packages reported in `software` (validated by [`validate_packages`]).
    packages: Vec<String>,
    last_ns: Option<i64>,
    /// Why `df` / `dpkg-query` gave nothing was logged (see [`tell_once`]).
    told_df: bool,
    told_dpkg: bool,
    /// dpkg's database (`/var/lib/dpkg/status`), and the last `software` with the database's
    /// state it was read from.
    dpkg_status: PathBuf,
    software: Option<(FileState, String)>,
}

/// What tells that a file changed: device, inode, size, modification time (s, ns).
type FileState = (u64, u64, u64, i64, i64);

fn file_state(path: &Path) -> Option<FileState> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

impl Info {
    /// `os_release` is normally `/etc/os-release`; `df` and `dpkg-query` run as `commands` says.
    pub(crate) fn new(os_release: &Path, commands: Commands, packages: Vec<String>) -> Info {
        Info {
            os_release: os_release.to_path_buf(),
            commands,
            packages,
            last_ns: None,
            told_df: false,
            told_dpkg: false,
            dpkg_status: PathBuf::from(DPKG_STATUS),
            software: None,
        }
    }

    /// Another dpkg database than [`DPKG_STATUS`] (tests).
    #[cfg(test)]
    fn with_dpkg_status(mut self, path: &Path) -> Info {
        self.dpkg_status = path.to_path_buf();
        self
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

    /// Runs `name args`: its output, or why not (not installed, timed out).
    fn output(&self, name: &str, args: &[&str]) -> Result<command::Output, SensorError> {
        let (program, ran) = self.commands.run(name, args, &[], MAX_COMMAND_OUTPUT);
        match ran {
            Ok(Ran::Done(o)) => {
                if o.truncated {
                    tracing::debug!(command = %program.display(), "host.info: output over {MAX_COMMAND_OUTPUT} bytes; the rest is left out");
                }
                Ok(o)
            }
            Ok(Ran::Missing) => Err(SensorError::Command(format!(
                "{} is not installed",
                program.display()
            ))),
            Err(e) => Err(e),
        }
    }

    /// `disk_free_mb` (of `/`) and `mounts`.
    fn disks(&mut self) -> (f64, String) {
        let mounts = self.output("df", &["-P", "-k"]).and_then(|o| {
            // df exits 1 when one mount cannot be read and still lists the others.
            if !o.success() && o.stdout.is_empty() {
                return Err(SensorError::Command(format!(
                    "df printed nothing (exit code {:?}): {}",
                    o.code, o.stderr
                )));
            }
            parse_df(&o.stdout)
        });
        let mounts = tell_once(&mut self.told_df, "disk_free_mb and mounts", mounts);
        let root = mounts
            .iter()
            .find(|m| m.mount == "/")
            .map_or(f64::NAN, |m| m.avail_mb);
        (root, format_mounts(listed_mounts(&mounts)))
    }

    /// `software`: the last answer while dpkg's database is unchanged, else `dpkg-query`'s.
    fn software(&mut self) -> String {
        if self.packages.is_empty() {
            return String::new();
        }
        let state = file_state(&self.dpkg_status);
        if let (Some(now), Some((then, software))) = (state, &self.software) {
            if now == *then {
                return software.clone();
            }
        }
        let mut args = vec!["-W", "-f", "${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"];
        args.extend(self.packages.iter().map(String::as_str));
        let found = self.output("dpkg-query", &args).and_then(|o| match o.code {
            // 1: some of the packages are not installed (or none is).
            Some(0 | 1) => Ok(parse_dpkg(&o.stdout)),
            code => Err(SensorError::Command(format!(
                "dpkg-query exit code {code:?}: {}",
                o.stderr
            ))),
        });
        let answered = found.is_ok();
        let software = format_software(&tell_once(&mut self.told_dpkg, "software", found));
        self.software = match state {
            Some(s) if answered => Some((s, software.clone())),
            _ => None,
        };
        software
    }
}

/// The value, or its type's empty value when there is none; why there is none is logged the
/// first time (and again only after it worked in between), never every info period.
fn tell_once<T: Default>(told: &mut bool, part: &str, r: Result<T, SensorError>) -> T {
    match r {
        Ok(v) => {
            *told = false;
            v
        }
        Err(why) => {
            if !std::mem::replace(told, true) {
                tracing::info!(
                    part,
                    "host.info: {why}; this part of host.info is empty until it works"
                );
            }
            T::default()
        }
    }
}

/// A one-line file such as `/proc/sys/kernel/hostname`, without its newline.
fn trimmed(text: &str) -> Result<String, SensorError> {
    Ok(text.trim().to_string())
}

impl Probe for Info {
    fn blocking(&self) -> bool {
        true
    }

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
        let read_os = |t: &str| {
            Ok((
                parse_os_release(t),
                os_release_value(t, "ID"),
                os_release_value(t, "VERSION_ID"),
            ))
        };
        let (os, os_id, os_version) = match files.read_at(&self.os_release, read_os) {
            Ok((os, id, version)) => (
                os.unwrap_or_else(|| UNKNOWN_OS.to_string()),
                id.unwrap_or_else(|| UNKNOWN_OS.to_string()),
                version.unwrap_or_default(),
            ),
            Err(e) => {
                tracing::debug!(error = %e, "no os-release; host.info os is {UNKNOWN_OS:?}");
                (UNKNOWN_OS.to_string(), UNKNOWN_OS.to_string(), String::new())
            }
        };
        let (disk_free_mb, mounts) = self.disks();
        let software = self.software();
        let strings = vec![
            os,
            kernel,
            std::env::consts::ARCH.to_string(),
            hostname,
            os_id,
            os_version,
            mounts,
            software,
        ];
        let numbers = vec![
            stat.cores as f64,
            kib_to_mib(mem.total_kb),
            stat.boot_time_s as f64,
            disk_free_mb,
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

    /// A `/proc` with what host.info reads, and an empty `bin` for fake commands.
    fn fixture_root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("sys/kernel")).unwrap();
        std::fs::create_dir_all(p.join("bin")).unwrap();
        std::fs::write(p.join("stat"), STAT_FIXTURE).unwrap();
        std::fs::write(p.join("meminfo"), "MemTotal: 2048 kB\nMemFree: 1024 kB\n").unwrap();
        std::fs::write(p.join("sys/kernel/osrelease"), "6.1.0-18-amd64\n").unwrap();
        std::fs::write(p.join("sys/kernel/hostname"), "node7\n").unwrap();
        dir
    }

    fn info_sensor(p: &Path, os_release: &Path, packages: &[&str]) -> impl Sensor {
        crate::procfs::ProcSensor::new(
            "node7",
            Duration::from_secs(60),
            p,
            crate::schemas::host_info(),
            Info::new(
                os_release,
                Commands {
                    bin_dir: Some(p.join("bin")),
                    timeout: Duration::from_secs(10),
                },
                packages.iter().map(|s| s.to_string()).collect(),
            )
            .with_dpkg_status(&p.join("dpkg-status")),
        )
    }

    #[test]
    fn emits_first_then_every_info_period() {
        let dir = fixture_root();
        let p = dir.path();
        // No os-release, no df, no dpkg-query: those parts are empty, the rest is sent.
        let mut s = info_sensor(p, &p.join("no-such-os-release"), &["python3"]);
        assert!(s.blocking(), "host.info runs commands");
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
            [
                "unknown",
                "6.1.0-18-amd64",
                std::env::consts::ARCH,
                "node7",
                "unknown",
                "",
                "",
                ""
            ]
        );
        assert_eq!(&e.numbers[..3], [4.0, 2.0, 1699999123.0]);
        assert!(e.numbers[3].is_nan(), "no df: free disk unknown");

        std::fs::remove_file(p.join("sys/kernel/osrelease")).unwrap();
        let err = s.sample(1000 * sec, &mut out).unwrap_err();
        assert!(err.to_string().contains("osrelease"), "{err}");
    }

    const DF_FIXTURE: &str = "\
Filesystem     1024-blocks     Used Available Capacity Mounted on
devtmpfs          12334460        0  12334460       0% /dev
/dev/vda         264212084 81883368  13402520      86% /
/dev/vdb1          1048576   524288    524288      50% /scratch dir
tmpfs             12342040        0  12342040       0% /sys/fs/cgroup
tmpfs              1024000     1024   1022976       1% /run/user/1000
/dev/vdc1          2097152        0   2097152       0% /data,odd
nfs:/export              -        -         -        - /mnt/unknown
";

    #[test]
    fn parses_df() {
        let m = parse_df(DF_FIXTURE).unwrap();
        let names: Vec<&str> = m.iter().map(|m| m.mount.as_str()).collect();
        assert_eq!(
            names,
            [
                "/dev",
                "/",
                "/scratch dir",
                "/sys/fs/cgroup",
                "/run/user/1000",
                "/data,odd"
            ]
        );
        assert_eq!(m[1].size_mb, 264212084.0 / 1024.0);
        assert_eq!(m[1].avail_mb, 13402520.0 / 1024.0);
        // Kernel and runtime mounts, and names the list cannot carry, are left out.
        assert_eq!(
            format_mounts(listed_mounts(&m)),
            "/=13088/258019,/scratch dir=512/1024"
        );
        assert!(parse_df("").unwrap().is_empty());
        for bad in [
            "Filesystem x\n/dev/sda 1 2 3\n",
            "/dev/sda 1 2 three 50% /\n",
            "a b c d e\n",
        ] {
            assert!(parse_df(bad).is_err(), "{bad:?}");
        }
        let many: Vec<Mount> = (0..100)
            .map(|i| Mount {
                mount: format!("/m{i}"),
                size_mb: 1.0,
                avail_mb: 1.0,
            })
            .collect();
        assert_eq!(listed_mounts(&many).count(), MAX_MOUNTS);
    }

    #[test]
    fn parses_dpkg_and_offers_names_and_versions() {
        let text = "python3\t3.11.2-1+b1\tii \n\
                    gcc\t4:12.2.0-3\tii \n\
                    libc6\t2.36-9\tii \n\
                    libc6\t2.36-9\tii \n\
                    perl\t\tun \n\
                    mpich\t4.0.2-3\trc \n\
                    garbage line\n";
        let p = parse_dpkg(text);
        assert_eq!(
            format_software(&p),
            "gcc=4:12.2.0-3,libc6=2.36-9,python3=3.11.2-1+b1"
        );
        let entries: Vec<&str> = software_entries("gcc=4:12.2.0-3,python3=3.11.2-1+b1").collect();
        assert_eq!(
            entries,
            ["gcc", "gcc=4:12.2.0-3", "python3", "python3=3.11.2-1+b1"]
        );
        assert_eq!(software_entries("").count(), 0);
        assert_eq!(software_entries(",,=x").count(), 0);
        assert_eq!(software_entries("mpi").collect::<Vec<_>>(), ["mpi"]);
    }

    #[test]
    fn package_list_is_checked() {
        let ok: Vec<String> = DEFAULT_PACKAGES.iter().map(|s| s.to_string()).collect();
        validate_packages(&ok).unwrap();
        for bad in ["-x", "Python3", "a", "py thon", "x;rm", "", &"a".repeat(65)] {
            let e = validate_packages(&[bad.to_string()]).unwrap_err();
            assert!(e.to_string().contains("not a Debian package name"), "{e}");
        }
        let many: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
        assert!(validate_packages(&many)
            .unwrap_err()
            .to_string()
            .contains("at most 64"));
    }

    #[test]
    fn os_release_ids() {
        let t = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n";
        assert_eq!(os_release_value(t, "ID").as_deref(), Some("debian"));
        assert_eq!(os_release_value(t, "VERSION_ID").as_deref(), Some("12"));
        assert_eq!(os_release_value("ID=\n", "ID"), None);
        assert_eq!(os_release_value(t, "VERSION_CODENAME"), None);
    }

    fn script(path: &Path, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn disk_and_software_from_the_commands() {
        let dir = fixture_root();
        let p = dir.path();
        std::fs::write(p.join("df.out"), DF_FIXTURE).unwrap();
        // df exits 1 when one mount cannot be read: what it printed still counts.
        script(
            &p.join("bin/df"),
            &format!("cat '{}'; exit 1", p.join("df.out").display()),
        );
        // dpkg-query exits 1 when a package is not installed; it records its arguments.
        script(
            &p.join("bin/dpkg-query"),
            &format!(
                "printf '%s\\n' \"$@\" > '{}'\nprintf 'python3\\t3.11.2-1+b1\\tii \\n'\necho 'dpkg-query: no packages found matching nosuch' >&2\nexit 1",
                p.join("args").display()
            ),
        );
        std::fs::write(
            p.join("os-release"),
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n",
        )
        .unwrap();
        let mut s = info_sensor(p, &p.join("os-release"), &["python3", "nosuch"]);
        let mut out = Vec::new();
        s.sample(0, &mut out).unwrap();
        let e = &out[0];
        assert_eq!(
            e.strings[4..],
            [
                "debian",
                "12",
                "/=13088/258019,/scratch dir=512/1024",
                "python3=3.11.2-1+b1"
            ]
        );
        assert_eq!(e.numbers[3], 13402520.0 / 1024.0);
        let args = std::fs::read_to_string(p.join("args")).unwrap();
        let args: Vec<&str> = args.lines().collect();
        assert_eq!(
            args,
            [
                "-W",
                "-f",
                "${Package}\\t${Version}\\t${db:Status-Abbrev}\\n",
                "python3",
                "nosuch"
            ]
        );

        // A dpkg-query that fails otherwise, a df printing nothing: empty parts, no error.
        script(&p.join("bin/dpkg-query"), "echo broken >&2; exit 2");
        script(&p.join("bin/df"), "exit 1");
        s.sample(3600 * 1_000_000_000, &mut out).unwrap();
        assert_eq!(out[1].strings[6..], ["", ""]);
        assert!(out[1].numbers[3].is_nan());
    }

    #[test]
    fn dpkg_query_runs_again_only_when_the_database_changed() {
        let dir = fixture_root();
        let p = dir.path();
        script(&p.join("bin/df"), "exit 1");
        let answer = |version: &str| {
            script(
                &p.join("bin/dpkg-query"),
                &format!(
                    "touch '{}'\nprintf 'python3\\t{version}\\tii \\n'",
                    p.join("ran").display()
                ),
            )
        };
        let status = p.join("dpkg-status");
        std::fs::write(&status, "Package: python3\n").unwrap();
        answer("3.11");
        let mut s = info_sensor(p, &p.join("os-release"), &["python3"]);
        let mut out = Vec::new();
        let minute = 60_000_000_000i64;
        s.sample(0, &mut out).unwrap();
        assert!(std::fs::remove_file(p.join("ran")).is_ok(), "dpkg-query ran");
        answer("3.12");
        s.sample(minute, &mut out).unwrap();
        assert!(
            !p.join("ran").exists(),
            "the database did not change: no dpkg-query"
        );
        assert_eq!(out[1].strings[7], "python3=3.11");
        std::fs::write(&status, "Package: python3\nVersion: 3.12\n").unwrap();
        s.sample(2 * minute, &mut out).unwrap();
        assert!(p.join("ran").exists(), "the database changed");
        assert_eq!(out[2].strings[7], "python3=3.12");
        // Without the database file, dpkg-query runs every time.
        std::fs::remove_file(&status).unwrap();
        std::fs::remove_file(p.join("ran")).unwrap();
        s.sample(3 * minute, &mut out).unwrap();
        assert!(p.join("ran").exists());
    }
}
