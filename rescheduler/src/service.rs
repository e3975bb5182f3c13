//! The rescheduler as a running GMA consumer (and producer of its decisions).
//!
//! It follows `host.load`, `app.state` and `app.contract` from every producer (discovered
//! through the directory), keeps a live view, and evaluates an application when its contract
//! monitor asks (`app.contract` kind `migration_request`; one evaluation in flight per
//! application) or, in opportunistic mode, when another application completes. Each
//! evaluation waits (bounded by `max_age_ms`) for fresh load data of the candidate hosts, calls
//! the pure [`crate::plan()`], publishes a `resched.decision` event, then applies it: MIGRATE =
//! stop (checkpoint) then resume on the targets, never leaving the application stopped (a failed
//! resume is retried, then resumed where it was); STAY on request = tell the contract monitor
//! to raise its limits.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber};
use gma_core::codec::OwnedEvent;
use gma_core::event::{dbl, schema, text, EventData};
use gma_core::time::now_ns;
use gma_producer::{Identity, Producer};
use gma_proto::v1 as pb;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use crate::action::{ActionConfig, Target};
use crate::plan::{plan, AppState, Decision, HostLoad, Mode, Plan, Policy};

/// `gma rescheduler --config FILE`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReschedulerConfig {
    pub listen: String,
    /// The registration keys of the rescheduler's record
    /// ([`gma_core::registration::Registration`]): `directory` (required), `id`, `advertise`,
    /// `site`, `org`, `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    /// Source name of the decision events.
    pub source: String,
    /// C, seconds (paper: 900).
    pub cost_s: f64,
    /// Migrate only if gain > threshold (paper: 0.30).
    pub threshold: f64,
    /// Load data older than this is refreshed (waited for) or the host excluded.
    pub max_age_ms: u64,
    /// Evaluate running applications when another completes.
    pub opportunistic: bool,
    /// Benchmark score of the reference host the predictions are for (bench_specint); hosts
    /// without a score count as reference speed.
    pub reference_specint: f64,
    pub action: ActionConfig,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for ReschedulerConfig {
    fn default() -> Self {
        ReschedulerConfig {
            listen: "127.0.0.1:0".into(),
            registration: Default::default(),
            source: "rescheduler".into(),
            cost_s: crate::plan::DEFAULT_COST_S,
            threshold: crate::plan::DEFAULT_THRESHOLD,
            max_age_ms: crate::plan::DEFAULT_MAX_AGE_MS,
            opportunistic: true,
            reference_specint: f64::NAN,
            action: ActionConfig::Grpc,
            endpoint: Default::default(),
        }
    }
}

/// `resched.decision`: every evaluation, with its inputs.
pub fn decision_schema() -> pb::EventSchema {
    schema(
        "resched.decision",
        "a job-migration rescheduler decision",
        vec![
            dbl("gain", "", "(ret_current - (ret_new + cost)) / ret_current"),
            dbl("ret_current_s", "s", "predicted remaining time where it runs"),
            dbl("ret_new_s", "s", "predicted remaining time on the target"),
            dbl("cost_s", "s", "assumed migration cost C"),
            dbl("threshold", "", "migrate iff gain > threshold"),
            dbl("fraction_completed", "", "progress when evaluated"),
            dbl("decide_ms", "ms", "time from the trigger event to the decision"),
            text("app_id", "application"),
            text("mode", "ON_REQUEST or OPPORTUNISTIC"),
            text("decision", "MIGRATE or STAY"),
            text("natural", "the rule's own decision (differs when forced)"),
            text("current_hosts", "comma-separated"),
            text("target_hosts", "comma-separated"),
            text("reason", "why"),
        ],
    )
}

/// The rescheduler's one error type ([`crate::error::Error`]) under the name `run` has always
/// used.
pub use crate::error::Error as ReschedulerError;

struct HostSample {
    load: HostLoad,
    at_ns: i64,
}

struct AppInfo {
    state: AppState,
    run_state: String,
    /// How an action reaches it.
    target: Target,
}

#[derive(Default)]
struct View {
    hosts: HashMap<String, HostSample>,
    apps: HashMap<String, AppInfo>,
    in_flight: HashSet<String>,
}

struct Ctx {
    view: Mutex<View>,
    policy: Policy,
    reference_specint: f64,
    action: ActionConfig,
    hub: Arc<gma_producer::Hub>,
    source: String,
    fresh: tokio::sync::Notify,
}

/// Runs the rescheduler until `shutdown`.
pub async fn run(
    config: ReschedulerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ReschedulerError> {
    let policy = Policy {
        cost_s: config.cost_s,
        threshold: config.threshold,
        max_age_ms: config.max_age_ms,
        force: None,
    };
    policy
        .validate()
        .map_err(|e| ReschedulerError::Config(e.to_string()))?;
    let directory = config
        .registration
        .required_directory()
        .map_err(|e| ReschedulerError::Config(e.to_string()))?;
    let producer = Producer::embedded(
        "rescheduler",
        &config.endpoint,
        Identity::new(&config.source, config.registration.clone()),
        &[decision_schema()],
    )
    .map_err(|e| ReschedulerError::Producer(e.to_string()))?;
    let ctx = Arc::new(Ctx {
        view: Mutex::new(View::default()),
        policy,
        reference_specint: config.reference_specint,
        action: config.action.clone(),
        hub: producer.hub.clone(),
        source: config.source.clone(),
        fresh: tokio::sync::Notify::new(),
    });
    let mut sub = Subscriber::follow(
        directory,
        StreamOptions {
            patterns: vec!["host.load".into(), "app.state".into(), "app.contract".into()],
            consumer_id: format!("{}-{}", config.source, std::process::id()),
            ..StreamOptions::default()
        },
    );
    let opportunistic = config.opportunistic;
    let follow = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while let Some(d) = sub.recv().await {
                if let Delivery::DirectoryRefused { error } = &d {
                    tracing::error!(%error, "the directory refused the rescheduler's watch (allow it and restart)");
                }
                if let Delivery::Events { events, .. } = d {
                    for e in &events {
                        on_event(&ctx, e, opportunistic).await;
                    }
                    ctx.fresh.notify_waiters();
                }
            }
        })
    };
    let r = producer.run(listener, shutdown).await;
    follow.abort();
    r.map_err(|e| ReschedulerError::Producer(e.to_string()))
}

async fn on_event(ctx: &Arc<Ctx>, e: &OwnedEvent, opportunistic: bool) {
    let r = e.as_ref();
    let num = |f: &str| r.number(f).unwrap_or(f64::NAN);
    match e.series.name.as_str() {
        "host.load" => {
            let spec = num("bench_specint");
            let bench =
                if spec.is_finite() && ctx.reference_specint.is_finite() && ctx.reference_specint > 0.0 {
                    spec / ctx.reference_specint
                } else {
                    f64::NAN
                };
            let load = HostLoad {
                host: e.series.source.clone(),
                cpus: num("total_cpus"),
                free_cpus: num("free_cpus"),
                load1: num("load1"),
                bench,
                age_ms: 0,
            };
            ctx.view.lock().await.hosts.insert(
                e.series.source.clone(),
                HostSample {
                    load,
                    at_ns: e.timestamp_ns,
                },
            );
        }
        "app.state" => {
            let Some(app_id) = r.text("app_id").map(str::to_string) else {
                return;
            };
            let run_state = r.text("state").unwrap_or("").to_string();
            let hosts: Vec<String> = r
                .text("hosts")
                .unwrap_or("")
                .split(',')
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect();
            let info = AppInfo {
                state: AppState {
                    app_id: app_id.clone(),
                    hosts,
                    cpus_needed: 1,
                    fraction_completed: num("fraction_completed"),
                    total_predicted_s: num("total_predicted_s"),
                    observed_avg_ratio: num("avg_ratio"),
                },
                run_state: run_state.clone(),
                target: Target {
                    app_id: app_id.clone(),
                    control: r.text("control").unwrap_or("").to_string(),
                    batch_job: r.text("batch_job").unwrap_or("").to_string(),
                },
            };
            let completed = run_state == "completed";
            let others: Vec<String> = {
                let mut v = ctx.view.lock().await;
                v.apps.insert(app_id.clone(), info);
                v.apps
                    .iter()
                    .filter(|(id, a)| **id != app_id && a.run_state == "running")
                    .map(|(id, _)| id.clone())
                    .collect()
            };
            if completed && opportunistic {
                for other in others {
                    spawn_evaluation(ctx.clone(), other, Mode::Opportunistic, e.timestamp_ns);
                }
            }
        }
        "app.contract" if r.text("kind") == Some("migration_request") => {
            if let Some(app_id) = r.text("app_id") {
                spawn_evaluation(ctx.clone(), app_id.to_string(), Mode::OnRequest, e.timestamp_ns);
            }
        }
        _ => {}
    }
}

fn spawn_evaluation(ctx: Arc<Ctx>, app_id: String, mode: Mode, trigger_ns: i64) {
    tokio::spawn(async move {
        {
            let mut v = ctx.view.lock().await;
            // One evaluation in flight per application: later requests merge into it.
            if !v.in_flight.insert(app_id.clone()) {
                return;
            }
        }
        evaluate(&ctx, &app_id, mode, trigger_ns).await;
        ctx.view.lock().await.in_flight.remove(&app_id);
    });
}

/// The view with ages as of now; `None` if the application is unknown.
async fn snapshot(ctx: &Ctx, app_id: &str) -> Option<(AppState, Target, Vec<HostLoad>)> {
    let v = ctx.view.lock().await;
    let app = v.apps.get(app_id)?;
    let now = now_ns();
    let view = v
        .hosts
        .values()
        .map(|s| HostLoad {
            age_ms: (now.saturating_sub(s.at_ns).max(0) / 1_000_000) as u64,
            ..s.load.clone()
        })
        .collect();
    Some((app.state.clone(), app.target.clone(), view))
}

async fn evaluate(ctx: &Ctx, app_id: &str, mode: Mode, trigger_ns: i64) {
    // Fresh data first: wait (at most max_age_ms) until every known host has a sample newer
    // than the bound; hosts still stale are then excluded by the plan.
    let deadline = Instant::now() + Duration::from_millis(ctx.policy.max_age_ms);
    let (app, target, view) = loop {
        let Some(s) = snapshot(ctx, app_id).await else {
            tracing::warn!(app_id, "evaluation for an application with no app.state; ignored");
            return;
        };
        let stale = s.2.iter().any(|h| h.age_ms > ctx.policy.max_age_ms);
        if !stale || Instant::now() >= deadline {
            break s;
        }
        let _ = tokio::time::timeout(deadline - Instant::now(), ctx.fresh.notified()).await;
    };
    let p = plan(&app, &view, mode, &ctx.policy);
    let decide_ms = (now_ns() - trigger_ns).max(0) as f64 / 1e6;
    publish(ctx, &p, app.fraction_completed, decide_ms);
    metrics::counter!(crate::telemetry::DECISIONS, "decision" => decision_str(p.decision)).increment(1);
    metrics::histogram!(crate::telemetry::DECIDE_SECONDS).record(decide_ms / 1000.0);
    tracing::info!(app_id, decision = ?p.decision, gain = p.gain, targets = ?p.target_hosts, "rescheduler decision");
    match p.decision {
        Decision::Migrate => migrate(ctx, &target, &p).await,
        Decision::Stay if p.adjust_tolerance() => {
            if let Err(e) = ctx.action.declined(&target, p.gain).await {
                tracing::warn!(app_id, error = %e, "could not tell the contract monitor");
            }
        }
        Decision::Stay => {}
    }
}

async fn migrate(ctx: &Ctx, t: &Target, p: &Plan) {
    if let Err(e) = ctx.action.stop(t).await {
        metrics::counter!(crate::telemetry::MIGRATIONS_FAILED).increment(1);
        tracing::warn!(app_id = %t.app_id, error = %e, "stop failed; the application keeps running where it is");
        return;
    }
    // Stopped: it must be resumed, on the targets if possible, else where it was.
    for attempt in 0..3u32 {
        match ctx.action.resume(t, &p.target_hosts).await {
            Ok(()) => return,
            Err(e) => {
                metrics::counter!(crate::telemetry::MIGRATIONS_FAILED).increment(1);
                tracing::warn!(app_id = %t.app_id, attempt, error = %e, "resume on the targets failed");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
    loop {
        match ctx.action.resume(t, &p.current_hosts).await {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(app_id = %t.app_id, error = %e, "cannot resume the application; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

fn publish(ctx: &Ctx, p: &Plan, fraction: f64, decide_ms: f64) {
    let e = EventData {
        name: "resched.decision".into(),
        source: ctx.source.clone(),
        timestamp_ns: now_ns(),
        numbers: vec![
            p.gain,
            p.ret_current_s,
            p.ret_new_s,
            p.cost_s,
            p.threshold,
            fraction,
            decide_ms,
        ],
        strings: vec![
            p.app_id.clone(),
            match p.mode {
                Mode::OnRequest => "ON_REQUEST".into(),
                Mode::Opportunistic => "OPPORTUNISTIC".into(),
            },
            decision_str(p.decision).into(),
            decision_str(p.natural).into(),
            p.current_hosts.join(","),
            p.target_hosts.join(","),
            p.reason.clone(),
        ],
    };
    if let (_, Err(err)) = ctx.hub.publish(&[e]) {
        tracing::warn!(error = %err, "cannot publish the decision");
    }
}

pub fn decision_str(d: Decision) -> &'static str {
    match d {
        Decision::Migrate => "MIGRATE",
        Decision::Stay => "STAY",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn decision_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&decision_schema()),
            "resched.decision v1: gain double, ret_current_s double s, ret_new_s double s, cost_s double s, threshold double, fraction_completed double, decide_ms double ms, app_id string, mode string, decision string, natural string, current_hosts string, target_hosts string, reason string"
        );
    }
}
