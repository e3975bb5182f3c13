//! Migration actions: how a decision is applied to an application.
//!
//! `Grpc` calls the application's own `AppControl` service (its address comes from its
//! `app.state` events); `Commands` runs configured shell commands with `{app_id}`, `{hosts}`
//! (comma-separated) and `{control}` substituted. Stop must return once the application has
//! checkpointed and stopped; resume starts it on the new hosts.

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
}

/// What an action needs to know of an application.
#[derive(Debug, Clone)]
pub struct Target {
    pub app_id: String,
    /// `http(s)://host:port` of its AppControl service ("" when it has none).
    pub control: String,
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
        }
    }

    /// Tells the application's contract monitor the request was declined.
    pub async fn declined(&self, t: &Target, gain: f64) -> Result<(), Error> {
        match self {
            ActionConfig::Grpc => {
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
}
