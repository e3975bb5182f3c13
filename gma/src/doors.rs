//! `gma doors`: every door of every role — each RPC of each gRPC service it serves and each
//! route of each HTTP endpoint — with who may knock, the actions the policy is asked and what an
//! identity granted only summaries gets there. The lists are the roles' own (`DOORS` beside
//! each service, `gma_core::authz::Door`); this command gathers them for operators writing a
//! policy, for the door census (tests/tests/census.rs, which checks them against every RPC of
//! `gma_proto::FILE_DESCRIPTOR_SET` and every route, and knocks on each) and for the table of
//! docs/security.md (`gma doors --output markdown`, checked by the census).

use clap::{Args, ValueEnum};
use gma_core::authz::Door;
use serde_json::json;

/// One group of doors: a service set served together, or an HTTP endpoint.
pub struct Group {
    /// `directory`, `producer`, `dashboard`, ...
    pub name: &'static str,
    /// `grpc` or `http`.
    pub kind: &'static str,
    /// Who serves these doors.
    pub served_by: &'static str,
    pub doors: &'static [Door],
    /// HTTP endpoints: the routes their router serves, `(method, path)`; empty for gRPC.
    pub routes: Vec<(&'static str, &'static str)>,
}

/// Every group of doors of the `gma` binary.
pub fn groups() -> Vec<Group> {
    let grpc = |name, served_by, doors| Group {
        name,
        kind: "grpc",
        served_by,
        doors,
        routes: Vec::new(),
    };
    vec![
        grpc(
            "directory",
            "gma directory (client API and raft)",
            gma_directory::DOORS,
        ),
        grpc(
            "producer",
            "gma producer, and every role built on a producer: relay, monitor, rescheduler, \
             netprobe, simres, federation, the gma.rpc companions of the directory and archiver",
            gma_producer::service::DOORS,
        ),
        grpc(
            "otlp",
            "gma producer --otlp-listen (OpenTelemetry metrics in)",
            gma_producer::otlp::DOORS,
        ),
        grpc("sink", "gma sink", gma_consumer::sink::DOORS),
        grpc("archiver", "gma archiver", gma_archiver::service::DOORS),
        grpc("broker", "gma broker", gma_broker::service::DOORS),
        grpc(
            "simres",
            "gma simres and gma slurm (the Reservations interface)",
            gma_broker::simres::DOORS,
        ),
        grpc("netprobe", "gma netprobe", gma_netprobe::service::DOORS),
        grpc("federation", "gma federation", gma_federation::service::DOORS),
        grpc(
            "grid",
            "gma federation (grid queries and reservations)",
            gma_federation::grid::DOORS,
        ),
        grpc("app-sim", "gma app-sim (AppControl)", crate::appsim::DOORS),
        grpc(
            "every gRPC role",
            "every role above that serves gRPC: health (grpc.health.v1) and server reflection",
            gma_core::conn::DOORS,
        ),
        Group {
            name: "dashboard",
            kind: "http",
            served_by: "gma dashboard",
            doors: gma_dashboard::http::DOORS,
            routes: gma_dashboard::http::routes(),
        },
        Group {
            name: "metrics",
            kind: "http",
            served_by: "every role's --metrics-listen",
            doors: gma_core::rpc::METRICS_DOORS,
            routes: crate::telemetry::METRICS_ROUTES.to_vec(),
        },
        Group {
            name: "prometheus",
            kind: "http",
            served_by: "gma producer --prometheus",
            doors: gma_producer::prometheus::DOORS,
            routes: crate::telemetry::PROMETHEUS_ROUTES.to_vec(),
        },
        Group {
            name: "promql",
            kind: "http",
            served_by: "gma archiver --http-listen (the Prometheus query API)",
            doors: gma_archiver::promql::http::DOORS,
            routes: gma_archiver::promql::http::routes(),
        },
    ]
}

#[derive(Args, Debug)]
pub struct DoorsArgs {
    /// table (for reading), json (for tools), markdown (the table of docs/security.md).
    #[arg(long, value_enum, default_value = "table")]
    pub output: DoorsOutput,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DoorsOutput {
    Table,
    Json,
    Markdown,
}

fn actions(d: &Door) -> String {
    if d.actions.is_empty() {
        return "none".into();
    }
    d.actions
        .iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The door table of docs/security.md.
pub fn markdown(groups: &[Group]) -> String {
    let mut out = String::from(
        "| role | door | who may knock | actions | a summary-only identity gets |\n|---|---|---|---|---|\n",
    );
    for g in groups {
        for d in g.doors {
            let actions = if d.actions.is_empty() {
                "none".to_string()
            } else {
                d.actions
                    .iter()
                    .map(|a| format!("`{a}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            out.push_str(&format!(
                "| {} | `{}` | {} | {} | {} |\n",
                g.name,
                d.door,
                d.peers.as_str(),
                actions,
                d.summary_only.replace('|', "\\|")
            ));
        }
    }
    out
}

pub fn json(groups: &[Group]) -> serde_json::Value {
    serde_json::Value::Array(
        groups
            .iter()
            .map(|g| {
                json!({
                    "group": g.name,
                    "kind": g.kind,
                    "served_by": g.served_by,
                    "routes": g.routes.iter().map(|(m, p)| format!("{m} {p}")).collect::<Vec<_>>(),
                    "doors": g.doors.iter().map(|d| json!({
                        "door": d.door,
                        "peers": d.peers.as_str(),
                        "actions": d.actions.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
                        "summary_only": d.summary_only,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

pub fn run(a: DoorsArgs) -> anyhow::Result<()> {
    let groups = groups();
    match a.output {
        DoorsOutput::Json => println!("{}", serde_json::to_string_pretty(&json(&groups))?),
        DoorsOutput::Markdown => print!("{}", markdown(&groups)),
        DoorsOutput::Table => {
            for g in &groups {
                println!("{} ({}; {}):", g.name, g.kind, g.served_by);
                for d in g.doors {
                    println!(
                        "  {:<40} peers: {:<12} actions: {}\n  {:<40} summary-only: {}",
                        d.door,
                        d.peers.as_str(),
                        actions(d),
                        "",
                        d.summary_only
                    );
                }
            }
        }
    }
    Ok(())
}
