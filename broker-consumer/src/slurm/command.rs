//! Slurm's commands (`scontrol`, `sbatch`, `squeue`, `scancel`) run as child processes with a
//! timeout, in UTC (`TZ=UTC`, so the times they print and read are Unix seconds without a
//! time-zone database), and the parsers of what they print.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;

/// Most bytes read from one command's standard output (a `squeue --json` of many jobs).
const MAX_OUTPUT: usize = 32 << 20;

/// A failed command: it could not start, ran past its timeout (killed), or exited non-zero.
/// The message carries the command and its standard error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdError {
    #[error("cannot run {cmd}: {message} (is Slurm installed? set bin_dir)")]
    Spawn { cmd: String, message: String },
    #[error("{cmd} did not finish within {timeout_ms} ms (killed): is slurmctld up?")]
    Timeout { cmd: String, timeout_ms: u64 },
    #[error("{cmd} failed (exit {code}): {stderr}")]
    Failed { cmd: String, code: i32, stderr: String },
    #[error("{cmd} printed something unexpected: {message}")]
    Output { cmd: String, message: String },
}

impl CmdError {
    /// The command's standard error (or the whole message).
    pub fn stderr(&self) -> String {
        match self {
            CmdError::Failed { stderr, .. } => stderr.clone(),
            other => other.to_string(),
        }
    }

    /// The controller could not be reached (as opposed to a refusal of the request).
    pub fn unreachable(&self) -> bool {
        match self {
            CmdError::Spawn { .. } | CmdError::Timeout { .. } | CmdError::Output { .. } => true,
            CmdError::Failed { stderr, .. } => {
                let s = stderr.to_ascii_lowercase();
                s.contains("unable to contact slurm controller")
                    || s.contains("connection refused")
                    || s.contains("communication connection failure")
                    || s.contains("munge")
                    || s.contains("socket timed out")
                    // What `scontrol create reservation` says when slurmctld is down (22.05).
                    || s.contains("unexpected message received")
            }
        }
    }
}

/// How to run Slurm's commands.
#[derive(Debug, Clone)]
pub struct Slurm {
    /// Directory of the commands ("" = the PATH).
    pub bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` for the commands (None = Slurm's default).
    pub conf: Option<PathBuf>,
    pub timeout: Duration,
}

impl Slurm {
    /// Runs `prog args...` and returns its standard output.
    pub async fn run(&self, prog: &str, args: &[String]) -> Result<String, CmdError> {
        let path = match &self.bin_dir {
            Some(d) => d.join(prog),
            None => PathBuf::from(prog),
        };
        let shown = format!("{prog} {}", args.join(" "));
        let cmd_name = gma_core::clip(&shown, 200).to_string();
        let mut cmd = tokio::process::Command::new(&path);
        cmd.args(args)
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(c) = &self.conf {
            cmd.env("SLURM_CONF", c);
        }
        let child = cmd.spawn().map_err(|e| CmdError::Spawn {
            cmd: cmd_name.clone(),
            message: e.to_string(),
        })?;
        let out = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Err(_) => {
                return Err(CmdError::Timeout {
                    cmd: cmd_name,
                    timeout_ms: self.timeout.as_millis() as u64,
                })
            }
            Ok(Err(e)) => {
                return Err(CmdError::Spawn {
                    cmd: cmd_name,
                    message: e.to_string(),
                })
            }
            Ok(Ok(o)) => o,
        };
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let text = if stderr.trim().is_empty() { stdout } else { stderr };
            return Err(CmdError::Failed {
                cmd: cmd_name,
                code: out.status.code().unwrap_or(-1),
                stderr: gma_core::clip(text.trim(), 2000).to_string(),
            });
        }
        if out.stdout.len() > MAX_OUTPUT {
            return Err(CmdError::Output {
                cmd: cmd_name,
                message: format!("more than {MAX_OUTPUT} bytes"),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The `Key=Value` pairs of one line of `scontrol show ... -o`. A token without `=` belongs
/// to the value before it (values such as `OS=Linux 6.1 #1 SMP` hold spaces).
pub fn pairs(line: &str) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    let mut last: Option<String> = None;
    for tok in line.split_whitespace() {
        match tok.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '/' || c == '_' || c == ':') =>
            {
                out.insert(k.to_string(), v.to_string());
                last = Some(k.to_string());
            }
            _ => {
                if let Some(v) = last.as_ref().and_then(|k| out.get_mut(k)) {
                    v.push(' ');
                    v.push_str(tok);
                }
            }
        }
    }
    out
}

/// One reservation of `scontrol show reservation -o`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmReservation {
    pub name: String,
    pub start_s: i64,
    pub end_s: i64,
    pub nodes: String,
    pub cores: u32,
    /// INACTIVE or ACTIVE.
    pub state: String,
}

/// The reservations of `scontrol show reservation -o` (the output "No reservations in the
/// system" is none).
pub fn parse_reservations(text: &str) -> Vec<SlurmReservation> {
    records(text, "ReservationName=", |p| {
        Some(SlurmReservation {
            name: p.get("ReservationName")?.clone(),
            start_s: parse_time(p.get("StartTime")?)?,
            end_s: parse_time(p.get("EndTime")?)?,
            nodes: p.get("Nodes").cloned().unwrap_or_default(),
            cores: p.get("CoreCnt").and_then(|c| c.parse().ok()).unwrap_or(0),
            state: p.get("State").cloned().unwrap_or_default(),
        })
    })
}

/// The records of a `scontrol show … -o` listing: its lines that start with `first` (one
/// record each), read by `read` from the line's [`pairs`]; a record `read` cannot use
/// (`None`: a field missing or malformed) is left out.
fn records<T>(text: &str, first: &str, read: impl Fn(&HashMap<String, String>) -> Option<T>) -> Vec<T> {
    text.lines()
        .filter(|l| l.starts_with(first))
        .filter_map(|l| read(&pairs(l)))
        .collect()
}

/// One node of `scontrol show node -o`.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmNode {
    pub name: String,
    pub cpus: u32,
    pub memory_mb: f64,
    pub arch: String,
    pub state: String,
    pub partitions: String,
}

/// The nodes of `scontrol show node -o`.
pub fn parse_nodes(text: &str) -> Vec<SlurmNode> {
    records(text, "NodeName=", |p| {
        Some(SlurmNode {
            name: p.get("NodeName")?.clone(),
            cpus: p.get("CPUTot")?.parse().ok()?,
            memory_mb: p.get("RealMemory").and_then(|m| m.parse().ok()).unwrap_or(0.0),
            arch: p.get("Arch").cloned().unwrap_or_default(),
            state: p.get("State").cloned().unwrap_or_default(),
            partitions: p.get("Partitions").cloned().unwrap_or_default(),
        })
    })
}

/// One job of `squeue --json` (the fields used; Slurm 22.05, openapi v0.0.38).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SqueueJob {
    pub job_id: u64,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub job_state: String,
    #[serde(default)]
    pub state_reason: String,
    /// The wait status: exit code << 8 | signal.
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub submit_time: i64,
    #[serde(default)]
    pub start_time: i64,
    #[serde(default)]
    pub end_time: i64,
    #[serde(default)]
    pub nodes: String,
    #[serde(default)]
    pub standard_output: String,
}

#[derive(Deserialize)]
struct Squeue {
    #[serde(default)]
    jobs: Vec<SqueueJob>,
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

/// The jobs of `squeue --json`; its `errors` without jobs are an error (the controller
/// could not be asked).
pub fn parse_squeue(text: &str) -> Result<Vec<SqueueJob>, CmdError> {
    let unexpected = |message: String| CmdError::Output {
        cmd: "squeue --json".into(),
        message,
    };
    let s = serde_json::from_str::<Squeue>(text).map_err(|e| unexpected(e.to_string()))?;
    if s.jobs.is_empty() && !s.errors.is_empty() {
        let errors: Vec<String> = s.errors.iter().map(|e| e.to_string()).collect();
        return Err(unexpected(gma_core::clip(&errors.join("; "), 1000)));
    }
    Ok(s.jobs)
}

/// How a Slurm job state reads in `job.batch`: (state, done).
pub fn job_state(slurm: &str) -> (&'static str, bool) {
    match slurm {
        "COMPLETED" => ("completed", true),
        "CANCELLED" => ("cancelled", true),
        "FAILED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE" | "PREEMPTED" => {
            ("failed", true)
        }
        "RUNNING" | "COMPLETING" | "SUSPENDED" | "STAGE_OUT" | "SIGNALING" => ("running", false),
        _ => ("pending", false),
    }
}

/// Exit code and signal of a wait status.
pub fn exit_of(status: i64) -> (i32, i32) {
    (((status >> 8) & 0xff) as i32, (status & 0x7f) as i32)
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC (how Slurm prints times under `TZ=UTC`) to Unix seconds.
pub fn parse_time(s: &str) -> Option<i64> {
    if s.len() != 19 {
        return None;
    }
    match gma_core::time::parse_rfc3339(&format!("{s}Z")) {
        Some(Some(ns)) => Some(ns.div_euclid(1_000_000_000)),
        _ => None,
    }
}

/// Unix seconds to `YYYY-MM-DDTHH:MM:SS` in UTC (what Slurm reads under `TZ=UTC`).
pub fn format_time(unix_s: i64) -> String {
    let mut t = gma_core::time::format_rfc3339(unix_s.saturating_mul(1_000_000_000));
    t.truncate(19);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_in_utc() {
        assert_eq!(parse_time("1970-01-01T00:00:00"), Some(0));
        assert_eq!(parse_time("2026-11-26T18:58:10"), Some(1_795_719_490));
        for t in [0, 951_782_400, 1_795_719_490, 4_102_444_799] {
            assert_eq!(parse_time(&format_time(t)), Some(t), "{t}");
        }
        assert_eq!(format_time(951_868_800), "2000-03-01T00:00:00");
        assert_eq!(parse_time("2026-13-01T00:00:00"), None);
        assert_eq!(parse_time("Unknown"), None);
        assert_eq!(parse_time("2026-11-26"), None);
    }

    #[test]
    fn scontrol_lines_parse_with_spaces_in_values() {
        let res = "ReservationName=g1 StartTime=2026-11-26T18:58:10 EndTime=2026-11-26T19:08:10 Duration=00:10:00 Nodes=vm NodeCnt=1 CoreCnt=1 Features=(null) PartitionName=debug Flags=SPEC_NODES   NodeName=vm CoreIDs=0 TRES=cpu=1 Users=root Groups=(null) State=INACTIVE BurstBuffer=(null)\n";
        let r = parse_reservations(res);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0],
            SlurmReservation {
                name: "g1".into(),
                start_s: 1_795_719_490,
                end_s: 1_795_720_090,
                nodes: "vm".into(),
                cores: 1,
                state: "INACTIVE".into()
            }
        );
        assert!(parse_reservations("No reservations in the system\n").is_empty());
        let node = "NodeName=vm Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUTot=2 NodeAddr=127.0.0.1 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 State=IDLE+RESERVED TmpDisk=0 Partitions=debug  BootTime=2026-11-26T12:19:38";
        let n = parse_nodes(node);
        assert_eq!(n.len(), 1);
        assert_eq!((n[0].cpus, n[0].memory_mb), (2, 1000.0));
        assert_eq!(n[0].state, "IDLE+RESERVED");
        assert_eq!(n[0].partitions, "debug");
        assert_eq!(pairs(node)["OS"], "Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0");
    }

    #[test]
    fn squeue_json_and_states() {
        let text = r#"{"meta":{},"errors":[],"jobs":[{"job_id":1,"name":"x1","job_state":"FAILED","state_reason":"NonZeroExitCode","exit_code":768,"submit_time":5,"start_time":6,"end_time":7,"nodes":"vm","standard_output":"/tmp/x1.out","other":{"a":1}}]}"#;
        let j = parse_squeue(text).unwrap();
        assert_eq!(j[0].job_id, 1);
        assert_eq!(exit_of(j[0].exit_code.unwrap()), (3, 0));
        assert_eq!(exit_of(9), (0, 9));
        assert_eq!(job_state("FAILED"), ("failed", true));
        assert_eq!(job_state("TIMEOUT"), ("failed", true));
        assert_eq!(job_state("COMPLETING"), ("running", false));
        assert_eq!(job_state("PENDING"), ("pending", false));
        assert!(parse_squeue("not json").is_err());
        let down = parse_squeue(r#"{"errors":[{"error":"Unable to contact slurm controller"}],"jobs":[]}"#)
            .unwrap_err();
        assert!(down.unreachable(), "{down}");
        assert!(
            down.to_string()
                .starts_with("squeue --json printed something unexpected: {\"error\":\"Unable to contact"),
            "{down}"
        );
        assert!(parse_squeue(r#"{"errors":[],"jobs":[]}"#).unwrap().is_empty());
    }
}
