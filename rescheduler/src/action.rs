//! Migration actions: how a decision is applied to an application.
//!
//! `Grpc` calls the application's own `AppControl` service (its address comes from its
//! `app.state` events); `Commands` runs configured shell commands with `{app_id}`, `{hosts}`
//! (comma-separated) and `{control}` substituted; `Slurm` moves a batch job (its id comes from
//! the `batch_job` of its `app.state`): stop is `scontrol requeuehold` (Slurm sends the job
//! SIGTERM, on which the application checkpoints and exits) and returns once the job is back
//! in the queue, held; resume points the job at the target nodes (`scontrol update
//! NodeList=… StartTime=now`) and releases it, and the application resumes from its checkpoint
//! there. Stop must return once the application has checkpointed and stopped; resume starts it
//! on the new hosts.

use std::time::Duration;

use gma_proto::v1 as pb;
use serde::Deserialize;

use crate::error::Error;

/// `[action]` in the rescheduler config.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ActionConfig {
    /// Call the application's AppControl service (default).
    #[default]
    Grpc,
    /// Run commands (`sh -c`).
    Commands {
        stop: String,
        resume: String,
        #[serde(default)]
        declined: Option<String>,
    },
    /// Requeue the application's Slurm job onto the target nodes (host names are Slurm node
    /// names). Declined goes to its `AppControl` service, as with `Grpc`.
    Slurm {
        /// `SLURM_CONF` of the `scontrol`/`squeue` it runs (the environment's when unset).
        #[serde(default)]
        slurm_conf: Option<std::path::PathBuf>,
        /// How long a requeued job may take to leave its node (its KillWait and the
        /// application's checkpoint), in seconds.
        #[serde(default = "default_requeue_timeout_s")]
        requeue_timeout_s: u64,
    },
}

fn default_requeue_timeout_s() -> u64 {
    120
}

/// What an action needs to know of an application.
#[derive(Debug, Clone)]
pub struct Target {
    pub app_id: String,
    /// `http(s)://host:port` of its AppControl service ("" when it has none).
    pub control: String,
    /// The batch system's job id it runs as ("" when it runs outside one).
    pub batch_job: String,
}

fn fill(template: &str, t: &Target, hosts: &[String]) -> String {
    template
        .replace("{app_id}", &t.app_id)
        .replace("{hosts}", &hosts.join(","))
        .replace("{control}", &t.control)
}

async fn run_command(cmd: &str) -> Result<(), Error> {
    let out = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new("sh").arg("-c").arg(cmd).output(),
    )
    .await
    .map_err(|_| Error::Action(format!("command timed out: {cmd}")))?
    .map_err(|e| Error::Action(format!("cannot run {cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Action(format!(
            "command {cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

async fn control(
    t: &Target,
) -> Result<pb::app_control_client::AppControlClient<tonic::transport::Channel>, Error> {
    if t.control.is_empty() {
        return Err(Error::Unreachable(format!(
            "application {} published no AppControl address",
            t.app_id
        )));
    }
    // With client TLS installed the connection is https and verified (and presents this
    // process's certificate), whatever scheme the application published.
    let ch = gma_core::tls::endpoint(&t.control)
        .map_err(|e| Error::Unreachable(format!("AppControl of {}: {e}", t.app_id)))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| {
            Error::Unreachable(format!(
                "cannot reach {} at {}: {}",
                t.app_id,
                t.control,
                gma_consumer::error_chain(&e)
            ))
        })?;
    Ok(pb::app_control_client::AppControlClient::new(ch))
}

/// Runs a Slurm client command; its stdout, or what it said on failure.
async fn slurm(conf: Option<&std::path::Path>, prog: &str, args: &[&str]) -> Result<String, Error> {
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args).kill_on_drop(true);
    if let Some(c) = conf {
        cmd.env("SLURM_CONF", c);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .map_err(|_| Error::Action(format!("{prog} {} timed out after 30 s", args.join(" "))))?
        .map_err(|e| Error::Action(format!("cannot run {prog}: {e} (is the Slurm client installed?)")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Action(format!(
            "{prog} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The job id of a target that runs under Slurm: digits only, as Slurm writes it.
fn batch_job(t: &Target) -> Result<&str, Error> {
    let j = t.batch_job.as_str();
    if j.is_empty() {
        return Err(Error::Action(format!(
            "application {} runs as no batch job (its app.state has no batch_job): the slurm \
             action moves Slurm jobs only",
            t.app_id
        )));
    }
    if !j.bytes().all(|b| b.is_ascii_digit()) || j.len() > 20 {
        return Err(Error::Action(format!(
            "application {} published batch_job {j:?}, not a Slurm job id",
            t.app_id
        )));
    }
    Ok(j)
}

/// A Slurm node list: names of letters, digits, `-`, `_` and `.`, comma-separated.
fn node_list(hosts: &[String]) -> Result<String, Error> {
    let ok = |h: &String| {
        !h.is_empty()
            && h.len() <= 64
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    match hosts.iter().find(|h| !ok(h)) {
        _ if hosts.is_empty() => Err(Error::Action("no target nodes to resume on".into())),
        Some(h) => Err(Error::Action(format!("{h:?} is not a Slurm node name"))),
        None => Ok(hosts.join(",")),
    }
}

/// Requeues `job` held and waits until it has left its node (pending again), so the
/// application has checkpointed and exited.
async fn requeue_held(conf: Option<&std::path::Path>, job: &str, timeout: Duration) -> Result<(), Error> {
    slurm(conf, "scontrol", &["requeuehold", job]).await?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let state = slurm(conf, "squeue", &["-h", "-j", job, "-o", "%T"]).await?;
        let state = state.trim();
        if state == "PENDING" {
            return Ok(());
        }
        if state.is_empty() {
            return Err(Error::Action(format!(
                "slurm job {job} left the queue instead of being requeued (it ended?)"
            )));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Action(format!(
                "slurm job {job} still {state} {} s after requeuehold",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl ActionConfig {
    /// Stops the application at its next phase boundary, with a checkpoint.
    pub async fn stop(&self, t: &Target) -> Result<(), Error> {
        match self {
            ActionConfig::Grpc => {
                let mut c = control(t).await?;
                let mut req = tonic::Request::new(pb::AppStopRequest {
                    app_id: t.app_id.clone(),
                    reason: "rescheduler: migration".into(),
                });
                req.set_timeout(Duration::from_secs(600));
                c.stop(req).await.map(|_| ()).map_err(|s| {
                    Error::Unreachable(format!("stop {}: {}", t.app_id, gma_core::tls::explain(&s)))
                })
            }
            ActionConfig::Commands { stop, .. } => run_command(&fill(stop, t, &[])).await,
            ActionConfig::Slurm {
                slurm_conf,
                requeue_timeout_s,
            } => {
                let job = batch_job(t)?;
                let timeout = Duration::from_secs(*requeue_timeout_s);
                requeue_held(slurm_conf.as_deref(), job, timeout).await
            }
        }
    }

    /// Resumes the application on `hosts`.
    pub async fn resume(&self, t: &Target, hosts: &[String]) -> Result<(), Error> {
        match self {
            ActionConfig::Grpc => {
                let mut c = control(t).await?;
                c.resume(pb::AppResumeRequest {
                    app_id: t.app_id.clone(),
                    hosts: hosts.to_vec(),
                })
                .await
                .map(|_| ())
                .map_err(|s| {
                    Error::Unreachable(format!("resume {}: {}", t.app_id, gma_core::tls::explain(&s)))
                })
            }
            ActionConfig::Commands { resume, .. } => run_command(&fill(resume, t, hosts)).await,
            ActionConfig::Slurm { slurm_conf, .. } => {
                let job = batch_job(t)?;
                let conf = slurm_conf.as_deref();
                let nodes = format!("NodeList={}", node_list(hosts)?);
                let id = format!("JobId={job}");
                // A requeued job waits ~2 minutes before it is eligible again: now.
                slurm(conf, "scontrol", &["update", &id, &nodes, "StartTime=now"]).await?;
                slurm(conf, "scontrol", &["release", job]).await.map(|_| ())
            }
        }
    }

    /// Tells the application's contract monitor the request was declined.
    pub async fn declined(&self, t: &Target, gain: f64) -> Result<(), Error> {
        match self {
            ActionConfig::Grpc | ActionConfig::Slurm { .. } => {
                let mut c = control(t).await?;
                c.declined(pb::AppDeclinedRequest {
                    app_id: t.app_id.clone(),
                    gain: if gain.is_finite() { gain } else { -1.0 },
                })
                .await
                .map(|_| ())
                .map_err(|s| {
                    Error::Unreachable(format!("declined {}: {}", t.app_id, gma_core::tls::explain(&s)))
                })
            }
            ActionConfig::Commands { declined, .. } => match declined {
                Some(cmd) => run_command(&fill(cmd, t, &[])).await,
                None => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            app_id: "app1".into(),
            control: "http://127.0.0.1:9".into(),
            batch_job: String::new(),
        }
    }

    #[test]
    fn templates_are_filled() {
        let t = target();
        assert_eq!(
            fill(
                "mv {app_id} to {hosts} via {control}",
                &t,
                &["b".into(), "c".into()]
            ),
            "mv app1 to b,c via http://127.0.0.1:9"
        );
    }

    #[tokio::test]
    async fn commands_run_and_failures_are_reported() {
        let dir = std::env::temp_dir().join(format!("gma-action-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let log = dir.join("log");
        let action = ActionConfig::Commands {
            stop: format!("echo stop {{app_id}} >> {}", log.display()),
            resume: format!("echo resume {{app_id}} {{hosts}} >> {}", log.display()),
            declined: Some("exit 3".into()),
        };
        let t = target();
        action.stop(&t).await.unwrap();
        action.resume(&t, &["hostB".into()]).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "stop app1\nresume app1 hostB\n"
        );
        let e = action.declined(&t, 0.1).await.unwrap_err().to_string();
        assert!(e.contains("failed"), "{e}");
        // gRPC to an application that is not there: an error, not a hang or a panic.
        let e = ActionConfig::Grpc.stop(&t).await.unwrap_err().to_string();
        assert!(e.contains("cannot reach"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_slurm_action_refuses_what_is_not_a_slurm_job_or_node() {
        let slurm = ActionConfig::Slurm {
            slurm_conf: None,
            requeue_timeout_s: 1,
        };
        let mut t = target();
        let e = slurm.stop(&t).await.unwrap_err().to_string();
        assert!(e.contains("runs as no batch job"), "{e}");
        t.batch_job = "12; rm -rf /".into();
        let e = slurm.stop(&t).await.unwrap_err().to_string();
        assert!(e.contains("not a Slurm job id"), "{e}");
        t.batch_job = "12".into();
        let e = slurm.resume(&t, &["a b".into()]).await.unwrap_err().to_string();
        assert!(e.contains("not a Slurm node name"), "{e}");
        let e = slurm.resume(&t, &[]).await.unwrap_err().to_string();
        assert!(e.contains("no target nodes"), "{e}");
        let cfg: ActionConfig =
            serde_json::from_str(r#"{"kind": "slurm", "slurm_conf": "/etc/slurm/slurm.conf"}"#).unwrap();
        assert_eq!(
            cfg,
            ActionConfig::Slurm {
                slurm_conf: Some("/etc/slurm/slurm.conf".into()),
                requeue_timeout_s: 120
            }
        );
    }
}
