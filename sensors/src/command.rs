//! Host commands a sensor reads (`df`, `dpkg-query`, `squeue`), bounded in time and output.
//!
//! [`run`] starts the command with `LC_ALL=C` (stable, untranslated output), no standard input,
//! and kills it at its timeout. At most `max_out` bytes of its standard output are kept (and
//! 4 KiB of its standard error, for the message of a failure); the rest is read and dropped,
//! so a chatty command never blocks on a full pipe. The output readers are waited for only
//! until the timeout too, so a grandchild holding a pipe open cannot hang the sensor.
//!
//! A program that is not installed is [`Ran::Missing`], not an error: a sensor whose command
//! is absent is off on that host, and says so once.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use wait_timeout::ChildExt;

use crate::SensorError;

/// Linux's "text file busy".
const ETXTBSY: i32 = 26;
/// Standard error kept for the message of a failed command.
const MAX_ERR: usize = 4096;

/// What a command that ran left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Output {
    /// The exit code; `None` when a signal ended it.
    pub(crate) code: Option<i32>,
    /// Standard output (lossy UTF-8), at most `max_out` bytes.
    pub(crate) stdout: String,
    /// More output than `max_out` was dropped.
    pub(crate) truncated: bool,
    /// Standard error, trimmed, at most 4 KiB.
    pub(crate) stderr: String,
}

impl Output {
    /// Exited with code 0.
    pub(crate) fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Itself when `program` exited with code 0; else the error naming its exit code and what
    /// it said on standard error.
    pub(crate) fn succeeded(self, program: &Path) -> Result<Output, SensorError> {
        if self.success() {
            return Ok(self);
        }
        Err(command_error(
            program,
            std::io::ErrorKind::Other,
            format!("exit code {:?}: {}", self.code, self.stderr),
        ))
    }
}

/// How a command went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ran {
    /// It ran to its end (whatever its exit code).
    Done(Output),
    /// The program is not installed.
    Missing,
}

/// An error about `program` (`cannot read <program>: <message>`).
pub(crate) fn command_error(program: &Path, kind: std::io::ErrorKind, message: String) -> SensorError {
    SensorError::Io {
        path: program.to_path_buf(),
        source: std::io::Error::new(kind, message),
    }
}

/// Where the host commands are and how long each may run (from the host sensor config).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Commands {
    /// `None` = `PATH`.
    pub(crate) bin_dir: Option<PathBuf>,
    /// Each is killed after this.
    pub(crate) timeout: Duration,
}

impl Commands {
    /// Runs command `name` with `args` and `env` added ([`run`]): its path, and how it went.
    pub(crate) fn run(
        &self,
        name: &str,
        args: &[&str],
        env: &[(&str, &OsStr)],
        max_out: usize,
    ) -> (PathBuf, Result<Ran, SensorError>) {
        let program = program(self.bin_dir.as_deref(), name);
        let ran = run(&program, args, env, self.timeout, max_out);
        (program, ran)
    }
}

/// Runs `program args` with these variables added to its environment (see the module doc).
pub(crate) fn run(
    program: &Path,
    args: &[&str],
    env: &[(&str, &OsStr)],
    timeout: Duration,
    max_out: usize,
) -> Result<Ran, SensorError> {
    let started = Instant::now();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut spawned = cmd.spawn();
    // ETXTBSY: the program is being replaced (a package upgrade) or was just written and a
    // process forked meanwhile still holds it open for a moment. Worth a few short retries.
    for _ in 0..5 {
        match &spawned {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(20));
                spawned = cmd.spawn();
            }
            _ => break,
        }
    }
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ran::Missing),
        Err(source) => {
            return Err(SensorError::Io {
                path: program.to_path_buf(),
                source,
            })
        }
    };
    let out_rx = child.stdout.take().map(|s| reader(s, max_out));
    let err_rx = child.stderr.take().map(|s| reader(s, MAX_ERR));
    let status = match child.wait_timeout(timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            // Killing a process that just exited fails harmlessly; reap it either way.
            let _ = child.kill();
            let _ = child.wait();
            return Err(command_error(
                program,
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {} ms (killed); raise the command timeout if the host is slow",
                    timeout.as_millis()
                ),
            ));
        }
        Err(source) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SensorError::Io {
                path: program.to_path_buf(),
                source,
            });
        }
    };
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(100));
    let collect = |rx: Option<mpsc::Receiver<(Vec<u8>, bool)>>| {
        rx.and_then(|rx| rx.recv_timeout(left).ok()).unwrap_or_default()
    };
    let (stdout, truncated) = collect(out_rx);
    let (stderr, _) = collect(err_rx);
    Ok(Ran::Done(Output {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        truncated,
        stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
    }))
}

/// Reads `from` to its end on a thread of its own, keeping the first `max` bytes; the result
/// (bytes, whether any were dropped) arrives on the channel.
fn reader(mut from: impl Read + Send + 'static, max: usize) -> mpsc::Receiver<(Vec<u8>, bool)> {
    let (tx, rx) = mpsc::sync_channel(1);
    // A thread that cannot be made leaves the channel empty: no output, and a command that
    // blocks on its full pipe meets its timeout.
    let _ = std::thread::Builder::new()
        .name("gma-command".into())
        .spawn(move || {
            let mut kept = Vec::new();
            let mut truncated = false;
            let mut chunk = [0u8; 8192];
            loop {
                match from.read(&mut chunk) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = max.saturating_sub(kept.len());
                        kept.extend_from_slice(&chunk[..n.min(room)]);
                        truncated |= n > room;
                    }
                }
            }
            let _ = tx.send((kept, truncated));
        });
    rx
}

/// Where a command is: `bin_dir/name` when a directory is configured, else `name` (found on
/// `PATH`).
fn program(bin_dir: Option<&Path>, name: &str) -> PathBuf {
    bin_dir.map_or_else(|| PathBuf::from(name), |d| d.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(10);

    fn sh(script: &str, timeout: Duration, max: usize) -> Result<Ran, SensorError> {
        run(Path::new("/bin/sh"), &["-c", script], &[], timeout, max)
    }

    #[test]
    fn output_code_and_stderr() {
        let Ran::Done(o) = sh("echo hello; echo oops >&2; exit 3", SEC, 100).unwrap() else {
            panic!("sh is missing")
        };
        assert_eq!(o.stdout, "hello\n");
        assert_eq!(o.stderr, "oops");
        assert_eq!(o.code, Some(3));
        assert!(!o.success() && !o.truncated);
    }

    #[test]
    fn output_is_bounded_and_the_rest_drained() {
        // 1 MiB of output through a 64 KiB pipe: the command must not block on it.
        let Ran::Done(o) = sh("head -c 1048576 /dev/zero | tr '\\0' x", SEC, 1000).unwrap() else {
            panic!("sh is missing")
        };
        assert!(o.success(), "{o:?}");
        assert_eq!(o.stdout.len(), 1000);
        assert!(o.truncated);
    }

    #[test]
    fn a_missing_program_is_missing() {
        let r = run(Path::new("/nonexistent/gma-no-such-command"), &[], &[], SEC, 10).unwrap();
        assert_eq!(r, Ran::Missing);
        assert_eq!(program(None, "df"), PathBuf::from("df"));
        assert_eq!(
            program(Some(Path::new("/usr/bin")), "df"),
            PathBuf::from("/usr/bin/df")
        );
    }

    #[test]
    fn a_hung_command_is_killed_at_its_timeout() {
        // `exec` so the shell itself is the sleeping process that gets killed.
        let e = sh("exec sleep 600", Duration::from_millis(200), 10).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("cannot read /bin/sh: no answer within 200 ms"),
            "{msg}"
        );
    }
}
