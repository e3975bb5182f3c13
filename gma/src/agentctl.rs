//! `gma agent ...`: steer a running producer's sensors through its `Control` service
//! (docs/control.md). Each call is the policy action `producer.control`, audited by the
//! producer as `gma.audit`.

use std::future::Future;

use clap::{Args, Subcommand};
use gma_proto::v1 as pb;
use serde_json::json;

use crate::args::Output;
use crate::tools::rpc_err;

/// The producer a `gma agent` command steers, and how it prints: every subcommand takes them.
#[derive(Args, Debug)]
pub struct Agent {
    #[arg(long)]
    producer: String,
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
}

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// The sensors with their periods, state and measured cost.
    Sensors {
        #[command(flatten)]
        at: Agent,
    },
    /// Set a sensor's period: gma agent set host.cpu 250 --producer ADDR
    Set {
        sensor: String,
        /// Milliseconds, 1..=3600000.
        period_ms: u64,
        #[command(flatten)]
        at: Agent,
    },
    /// Resume a disabled sensor.
    Enable {
        sensor: String,
        #[command(flatten)]
        at: Agent,
    },
    /// Stop sampling a sensor (until enabled again).
    Disable {
        sensor: String,
        #[command(flatten)]
        at: Agent,
    },
    /// Watch processes (proc.event, proc.usage): exactly one of --comm, --cmdline, --pid.
    Watch {
        name: String,
        #[arg(long)]
        comm: Option<String>,
        #[arg(long)]
        cmdline: Option<String>,
        #[arg(long)]
        pid: Option<u32>,
        /// Milliseconds (default: the producer's period).
        #[arg(long)]
        period_ms: Option<u64>,
        #[arg(long)]
        cpu_pct_max: Option<f64>,
        #[arg(long)]
        rss_mb_max: Option<f64>,
        #[command(flatten)]
        at: Agent,
    },
    /// A monitor's rules (`gma monitor`), runtime ones marked.
    Rules {
        #[command(flatten)]
        at: Agent,
    },
    /// Add a rule to a running monitor: FILE holds one `[[rule]]` table (docs/monitor.md).
    RuleAdd {
        file: std::path::PathBuf,
        #[command(flatten)]
        at: Agent,
    },
    /// Remove a rule added with `gma agent rule-add`.
    RuleRemove {
        name: String,
        #[command(flatten)]
        at: Agent,
    },
    /// Remove a process watch added with `gma agent watch`.
    Unwatch {
        name: String,
        #[command(flatten)]
        at: Agent,
    },
}

type Client = pb::control_client::ControlClient<tonic::transport::Channel>;

impl Agent {
    async fn client(&self) -> anyhow::Result<Client> {
        let ch = gma_consumer::connect(&self.producer).await.map_err(rpc_err)?;
        Ok(pb::control_client::ControlClient::new(ch))
    }

    /// Makes one change through the producer's `Control` service (`call` names it in a
    /// refusal) and prints what it changed on `what`.
    async fn change<F, Fut>(&self, what: &str, call: &'static str, rpc: F) -> anyhow::Result<()>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<pb::ControlResponse>, tonic::Status>>,
    {
        let r = rpc(self.client().await?)
            .await
            .map_err(refused(call))?
            .into_inner();
        match self.output {
            Output::Json => println!("{}", json!({"what": what, "before": r.before, "after": r.after})),
            Output::Table => println!("{what}: before [{}] after [{}]", r.before, r.after),
        }
        Ok(())
    }

    /// The producer's sensors, its rules and its CPU (`call` names the command in a refusal).
    async fn sensors(&self, call: &'static str) -> anyhow::Result<pb::ListSensorsResponse> {
        let r = self
            .client()
            .await?
            .list_sensors(pb::ListSensorsRequest {})
            .await
            .map_err(refused(call))?;
        Ok(r.into_inner())
    }
}

pub async fn run(cmd: AgentCommand) -> anyhow::Result<()> {
    match cmd {
        AgentCommand::Sensors { at } => {
            let r = at.sensors("sensors").await?;
            match at.output {
                Output::Json => {
                    for s in &r.sensors {
                        println!(
                            "{}",
                            json!({"name": s.name, "period_ms": s.period_ms,
                                "configured_period_ms": s.configured_period_ms, "enabled": s.enabled,
                                "samples": s.samples, "mean_sample_us": s.mean_sample_us,
                                "cost_pct": s.cost_pct, "runtime_watch": s.runtime_watch,
                                "slowed_from_ms": s.slowed_from_ms,
                                "agent_cpu_pct": r.agent_cpu_pct, "cpu_budget_pct": r.cpu_budget_pct})
                        );
                    }
                }
                Output::Table => {
                    if r.cpu_budget_pct > 0.0 {
                        println!(
                            "agent CPU {:.2}% of one CPU (budget {:.2}%)",
                            r.agent_cpu_pct, r.cpu_budget_pct
                        );
                    }
                    println!(
                        "{:<24} {:>10} {:>12} {:>8} {:>9} {:>12} {:>9}",
                        "SENSOR", "PERIOD_MS", "CONFIGURED", "ENABLED", "SAMPLES", "MEAN_US", "COST_%"
                    );
                    for s in &r.sensors {
                        println!(
                            "{:<24} {:>10} {:>12} {:>8} {:>9} {:>12.1} {:>9.4}",
                            s.name,
                            s.period_ms,
                            s.configured_period_ms,
                            s.enabled,
                            s.samples,
                            s.mean_sample_us,
                            s.cost_pct
                        );
                    }
                }
            }
            Ok(())
        }
        AgentCommand::Set {
            sensor,
            period_ms,
            at,
        } => {
            let req = pb::SetPeriodRequest {
                sensor: sensor.clone(),
                period_ms,
            };
            at.change(&sensor, "set", |mut c| async move { c.set_period(req).await })
                .await
        }
        AgentCommand::Enable { sensor, at } => set_enabled(&at, sensor, true).await,
        AgentCommand::Disable { sensor, at } => set_enabled(&at, sensor, false).await,
        AgentCommand::Watch {
            name,
            comm,
            cmdline,
            pid,
            period_ms,
            cpu_pct_max,
            rss_mb_max,
            at,
        } => {
            let req = pb::ProcessWatchRequest {
                name: name.clone(),
                comm: comm.unwrap_or_default(),
                cmdline: cmdline.unwrap_or_default(),
                pid: pid.unwrap_or(0),
                period_ms: period_ms.unwrap_or(0),
                cpu_pct_max: cpu_pct_max.unwrap_or(0.0),
                rss_mb_max: rss_mb_max.unwrap_or(0.0),
            };
            at.change(&name, "watch", |mut c| async move { c.watch(req).await })
                .await
        }
        AgentCommand::Rules { at } => {
            for rule in at.sensors("rules").await?.rules {
                match at.output {
                    Output::Json => println!("{}", json!({ "rule": rule })),
                    Output::Table => println!("{rule}"),
                }
            }
            Ok(())
        }
        AgentCommand::RuleAdd { file, at } => {
            let toml = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            let req = pb::AddRuleRequest { toml };
            at.change("rule", "rule-add", |mut c| async move { c.add_rule(req).await })
                .await
        }
        AgentCommand::RuleRemove { name, at } => {
            let req = pb::RemoveRuleRequest { name: name.clone() };
            at.change(
                &name,
                "rule-remove",
                |mut c| async move { c.remove_rule(req).await },
            )
            .await
        }
        AgentCommand::Unwatch { name, at } => {
            let req = pb::RemoveWatchRequest { name: name.clone() };
            at.change(&name, "unwatch", |mut c| async move { c.unwatch(req).await })
                .await
        }
    }
}

async fn set_enabled(at: &Agent, sensor: String, enabled: bool) -> anyhow::Result<()> {
    let req = pb::SetEnabledRequest {
        sensor: sensor.clone(),
        enabled,
    };
    let call = if enabled { "enable" } else { "disable" };
    at.change(&sensor, call, |mut c| async move { c.set_enabled(req).await })
        .await
}

/// A refusal as an error naming the call and the gRPC code (`PermissionDenied: ...`).
fn refused(what: &'static str) -> impl Fn(tonic::Status) -> anyhow::Error {
    move |s| anyhow::anyhow!("{what}: {:?}: {}", s.code(), s.message())
}
