//! `gma agent ...`: steer a running producer's sensors through its `Control` service
//! (docs/control.md). Each call is the policy action `producer.control`, audited by the
//! producer as `gma.audit`.

use clap::Subcommand;
use gma_proto::v1 as pb;
use serde_json::json;

use crate::args::Output;
use crate::tools::rpc_err;

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// The sensors with their periods, state and measured cost.
    Sensors {
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Set a sensor's period: gma agent set host.cpu 250 --producer ADDR
    Set {
        sensor: String,
        /// Milliseconds, 1..=3600000.
        period_ms: u64,
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Resume a disabled sensor.
    Enable {
        sensor: String,
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Stop sampling a sensor (until enabled again).
    Disable {
        sensor: String,
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
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
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// A monitor's rules (`gma monitor`), runtime ones marked.
    Rules {
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Add a rule to a running monitor: FILE holds one `[[rule]]` table (docs/monitor.md).
    RuleAdd {
        file: std::path::PathBuf,
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Remove a rule added with `gma agent rule-add`.
    RuleRemove {
        name: String,
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Remove a process watch added with `gma agent watch`.
    Unwatch {
        name: String,
        #[arg(long)]
        producer: String,
        #[arg(long, value_enum, default_value = "table")]
        output: Output,
    },
}

type Client = pb::control_client::ControlClient<tonic::transport::Channel>;

async fn client(producer: &str) -> anyhow::Result<Client> {
    let ch = gma_consumer::connect(producer).await.map_err(rpc_err)?;
    Ok(pb::control_client::ControlClient::new(ch))
}

fn changed(what: &str, r: pb::ControlResponse, output: Output) {
    match output {
        Output::Json => println!("{}", json!({"what": what, "before": r.before, "after": r.after})),
        Output::Table => println!("{what}: before [{}] after [{}]", r.before, r.after),
    }
}

pub async fn run(cmd: AgentCommand) -> anyhow::Result<()> {
    let status = refused;
    match cmd {
        AgentCommand::Sensors { producer, output } => {
            let r = client(&producer)
                .await?
                .list_sensors(pb::ListSensorsRequest {})
                .await
                .map_err(status("sensors"))?
                .into_inner();
            match output {
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
        }
        AgentCommand::Set {
            sensor,
            period_ms,
            producer,
            output,
        } => {
            let r = client(&producer)
                .await?
                .set_period(pb::SetPeriodRequest {
                    sensor: sensor.clone(),
                    period_ms,
                })
                .await
                .map_err(status("set"))?;
            changed(&sensor, r.into_inner(), output);
        }
        AgentCommand::Enable {
            sensor,
            producer,
            output,
        } => set_enabled(&producer, sensor, true, output).await?,
        AgentCommand::Disable {
            sensor,
            producer,
            output,
        } => set_enabled(&producer, sensor, false, output).await?,
        AgentCommand::Watch {
            name,
            comm,
            cmdline,
            pid,
            period_ms,
            cpu_pct_max,
            rss_mb_max,
            producer,
            output,
        } => {
            let r = client(&producer)
                .await?
                .watch(pb::ProcessWatchRequest {
                    name: name.clone(),
                    comm: comm.unwrap_or_default(),
                    cmdline: cmdline.unwrap_or_default(),
                    pid: pid.unwrap_or(0),
                    period_ms: period_ms.unwrap_or(0),
                    cpu_pct_max: cpu_pct_max.unwrap_or(0.0),
                    rss_mb_max: rss_mb_max.unwrap_or(0.0),
                })
                .await
                .map_err(status("watch"))?;
            changed(&name, r.into_inner(), output);
        }
        AgentCommand::Rules { producer, output } => {
            let r = client(&producer)
                .await?
                .list_sensors(pb::ListSensorsRequest {})
                .await
                .map_err(status("rules"))?
                .into_inner();
            for rule in r.rules {
                match output {
                    Output::Json => println!("{}", json!({ "rule": rule })),
                    Output::Table => println!("{rule}"),
                }
            }
        }
        AgentCommand::RuleAdd {
            file,
            producer,
            output,
        } => {
            let toml = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            let r = client(&producer)
                .await?
                .add_rule(pb::AddRuleRequest { toml })
                .await
                .map_err(status("rule-add"))?;
            changed("rule", r.into_inner(), output);
        }
        AgentCommand::RuleRemove {
            name,
            producer,
            output,
        } => {
            let r = client(&producer)
                .await?
                .remove_rule(pb::RemoveRuleRequest { name: name.clone() })
                .await
                .map_err(status("rule-remove"))?;
            changed(&name, r.into_inner(), output);
        }
        AgentCommand::Unwatch {
            name,
            producer,
            output,
        } => {
            let r = client(&producer)
                .await?
                .unwatch(pb::RemoveWatchRequest { name: name.clone() })
                .await
                .map_err(status("unwatch"))?;
            changed(&name, r.into_inner(), output);
        }
    }
    Ok(())
}

async fn set_enabled(producer: &str, sensor: String, enabled: bool, output: Output) -> anyhow::Result<()> {
    let r = client(producer)
        .await?
        .set_enabled(pb::SetEnabledRequest {
            sensor: sensor.clone(),
            enabled,
        })
        .await
        .map_err(refused(if enabled { "enable" } else { "disable" }))?;
    changed(&sensor, r.into_inner(), output);
    Ok(())
}

/// A refusal as an error naming the call and the gRPC code (`PermissionDenied: ...`).
fn refused(what: &'static str) -> impl Fn(tonic::Status) -> anyhow::Error {
    move |s| anyhow::anyhow!("{what}: {:?}: {}", s.code(), s.message())
}
