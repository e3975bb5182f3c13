//! The `gma` child processes of the scenarios: the running executable (`gma`, or the tests'
//! `gma-e2e`) started with a role subcommand, killed when dropped (also on error), found ready
//! by the line it prints on stderr (`gma producer listening on ADDR`).

use std::time::Duration;

use anyhow::{anyhow, Context};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStderr, Command};

/// How long [`spawn`] waits for a child's marker line.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `gma` as a child: killed on drop, no stdin, stdout dropped, stderr piped (where it says its
/// addresses; [`drain`] it once read). A caller sets other stdio on the command it gets.
pub(crate) fn command() -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("cannot find the gma binary")?;
    let mut cmd = Command::new(exe);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    Ok(cmd)
}

/// The pid of a started child (for its CPU and RSS in /proc).
pub(crate) fn pid(child: &tokio::process::Child, name: &str) -> anyhow::Result<String> {
    Ok(child
        .id()
        .ok_or_else(|| anyhow!("{name} exited at once"))?
        .to_string())
}

/// The piped stderr of a child, line by line.
pub(crate) fn stderr_lines(
    child: &mut tokio::process::Child,
    name: &str,
) -> anyhow::Result<Lines<BufReader<ChildStderr>>> {
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow!("no stderr from {name}"))?;
    Ok(BufReader::new(stderr).lines())
}

/// Keeps reading `lines` in a task until the child closes them, so it never blocks on a full
/// pipe.
pub(crate) fn drain<R: AsyncBufRead + Unpin + Send + 'static>(mut lines: Lines<R>) {
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
}

/// Reads `lines` until one starts with `prefix` (within `timeout`); returns the rest of it.
pub(crate) async fn wait_line<R: AsyncBufRead + Unpin>(
    lines: &mut Lines<R>,
    prefix: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .with_context(|| format!("{what}: no {prefix:?} line within {timeout:?}"))??
            .ok_or_else(|| anyhow!("{what} exited before printing {prefix:?}"))?;
        if let Some(rest) = line.strip_prefix(prefix) {
            return Ok(rest.trim().to_string());
        }
    }
}

/// A started `gma` role and the address it listens on.
pub(crate) struct Child {
    pub(crate) child: tokio::process::Child,
    pub(crate) addr: String,
    pub(crate) pid: String,
}

/// Starts `gma ARGS` and waits (30 s at most) for its line `MARKER ADDR` on stderr.
pub(crate) async fn spawn(args: &[&str], marker: &str) -> anyhow::Result<Child> {
    let name = format!("gma {}", args.first().copied().unwrap_or_default());
    let mut child = command()?
        .args(args)
        .spawn()
        .with_context(|| format!("cannot start {name}"))?;
    let pid = pid(&child, &name)?;
    let mut lines = stderr_lines(&mut child, &name)?;
    let addr = wait_line(&mut lines, &format!("{marker} "), &name, START_TIMEOUT).await?;
    drain(lines);
    Ok(Child { child, addr, pid })
}
