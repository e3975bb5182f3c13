//! `gma app-sim`: a sample application for the migration loop.
//!
//! It runs `phases` phases whose duration is `predicted_s × slowdown`, where the slowdown comes
//! from the (simulated) load of the host it is placed on (`max(1, load1 / cpus)`, read from the
//! producer's cache each phase). It reports each phase to an in-process contract monitor and
//! publishes `app.contract` and `app.state` events through the producer's `Ingest`. It serves
//! `AppControl`: Stop (checkpoint at the next phase boundary and wait), Resume (continue on the
//! new hosts from the checkpoint), Declined (raise the contract limits), Status. With
//! `--access-policy` each is the `job` action on its operation (`app.stop`, `app.resume`,
//! `app.declined`, `app.status`), allowed outright ([`DOORS`]); a summary rule denies.
//!
//! As a batch job (under Slurm: `SLURM_JOB_ID` and `SLURMD_NODENAME` set) it publishes its job
//! id in `app.state` (`batch_job`) and runs on its node by default; on SIGTERM (what Slurm
//! sends a job it requeues or cancels) it writes its checkpoint at once (the phase in progress
//! is redone) and exits; started again with `--resume` and a checkpoint of its `--app-id` in
//! `--checkpoint-dir`, it resumes from it — so the rescheduler's `slurm` action moves it by
//! requeueing the job onto another node. The checkpoint is removed when it completes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use gma_core::authz::{Action, Door};
use gma_core::event::EventData;
use gma_core::guard::Gate;
use gma_core::time::now_ns;
use gma_core::Refusal;
use gma_proto::v1 as pb;
use gma_sensors::contract::{contract_schema, ContractConfig, ContractMonitor, ContractOutput};
use tokio::sync::{oneshot, Mutex};
use tonic::{Request, Response, Status};

use clap::Args;
use std::path::PathBuf;

/// The doors of `gma app-sim`'s `AppControl` endpoint: `job` on the operation.
pub const DOORS: &[Door] = &[
    Door::policy(
        "/gma.v1.AppControl/Stop",
        &[Action::Job],
        "PERMISSION_DENIED: a summary rule denies job (app.stop)",
    ),
    Door::policy(
        "/gma.v1.AppControl/Resume",
        &[Action::Job],
        "PERMISSION_DENIED: a summary rule denies job (app.resume)",
    ),
    Door::policy(
        "/gma.v1.AppControl/Declined",
        &[Action::Job],
        "PERMISSION_DENIED: a summary rule denies job (app.declined)",
    ),
    Door::policy(
        "/gma.v1.AppControl/Status",
        &[Action::Job],
        "PERMISSION_DENIED: a summary rule denies job (app.status); the status is the raw \
         app.state of the application",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunState {
    Running,
    Stopping,
    Stopped,
    Resuming,
    Completed,
}

impl RunState {
    fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Stopping => "stopping",
            RunState::Stopped => "stopped",
            RunState::Resuming => "resuming",
            RunState::Completed => "completed",
        }
    }
}

struct App {
    app_id: String,
    phases: u32,
    predicted_s: f64,
    state: RunState,
    hosts: Vec<String>,
    phase: u32,
    monitor: ContractMonitor,
    stop_waiter: Option<oneshot::Sender<pb::AppStopResponse>>,
    resume_to: Option<Vec<String>>,
    checkpoint_dir: std::path::PathBuf,
    /// The batch system's job id it runs as ("" outside one).
    batch_job: String,
    /// Contract events produced outside the run loop (LimitsAdjusted), published next phase.
    pending: Vec<EventData>,
}

impl App {
    /// A request for `app_id` that needs the application in `state`: refused otherwise.
    fn expect(&self, app_id: &str, state: RunState) -> Result<(), ControlError> {
        if app_id != self.app_id {
            return Err(ControlError::OtherApp(self.app_id.clone()));
        }
        if self.state != state {
            return Err(ControlError::State {
                state: self.state.as_str(),
                needed: state.as_str(),
            });
        }
        Ok(())
    }
}

#[derive(Clone)]
/// What `AppControl` refuses; `impl From<ControlError> for Status` picks the code.
#[derive(Debug, thiserror::Error)]
enum ControlError {
    /// The request names another application. NOT_FOUND.
    #[error("this is application {0:?}")]
    OtherApp(String),
    /// The application is not in the state the request needs. FAILED_PRECONDITION.
    #[error("application is {state}, not {needed}")]
    State {
        state: &'static str,
        needed: &'static str,
    },
    /// Resume without hosts. INVALID_ARGUMENT.
    #[error("give the hosts to resume on")]
    NoHosts,
    /// The run loop ended before it answered the stop. ABORTED.
    #[error("the application ended before it could stop")]
    Ended,
    /// The gate's refusal, with its code.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

impl From<ControlError> for Status {
    fn from(e: ControlError) -> Status {
        let msg = e.to_string();
        match e {
            ControlError::OtherApp(_) => Status::not_found(msg),
            ControlError::State { .. } => Status::failed_precondition(msg),
            ControlError::NoHosts => Status::invalid_argument(msg),
            ControlError::Ended => Status::aborted(msg),
            ControlError::Refused(r) => r.into(),
        }
    }
}

struct Control {
    app: Arc<Mutex<App>>,
    wake: Arc<tokio::sync::Notify>,
    /// `--access-policy` (allow-all without one) and the default limits.
    gate: Arc<Gate>,
}

impl Control {
    /// `job` on `op`, allowed outright.
    fn check<T>(&self, req: &Request<T>, op: &str) -> Result<(), ControlError> {
        self.gate.check_raw(
            req,
            Action::Job,
            &[op],
            "application control needs an allow grant of job",
        )?;
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::app_control_server::AppControl for Control {
    async fn stop(&self, req: Request<pb::AppStopRequest>) -> Result<Response<pb::AppStopResponse>, Status> {
        self.check(&req, "app.stop")?;
        let req = req.into_inner();
        let rx = {
            let mut app = self.app.lock().await;
            app.expect(&req.app_id, RunState::Running)?;
            app.state = RunState::Stopping;
            app.monitor.stopped();
            let (tx, rx) = oneshot::channel();
            app.stop_waiter = Some(tx);
            rx
        };
        // Answered once the run loop has checkpointed at the phase boundary.
        rx.await
            .map(Response::new)
            .map_err(|_| ControlError::Ended.into())
    }

    async fn resume(
        &self,
        req: Request<pb::AppResumeRequest>,
    ) -> Result<Response<pb::AppResumeResponse>, Status> {
        self.check(&req, "app.resume")?;
        let req = req.into_inner();
        if req.hosts.is_empty() {
            return Err(ControlError::NoHosts.into());
        }
        let mut app = self.app.lock().await;
        app.expect(&req.app_id, RunState::Stopped)?;
        app.state = RunState::Resuming;
        app.resume_to = Some(req.hosts);
        self.wake.notify_one();
        Ok(Response::new(pb::AppResumeResponse {
            state: "resuming".into(),
        }))
    }

    async fn declined(
        &self,
        req: Request<pb::AppDeclinedRequest>,
    ) -> Result<Response<pb::AppDeclinedResponse>, Status> {
        self.check(&req, "app.declined")?;
        let mut app = self.app.lock().await;
        // The LimitsAdjusted event is published with the next phase's events.
        let adjusted = app.monitor.declined(now_ns());
        app.pending.extend(adjusted.into_iter().filter_map(|o| match o {
            ContractOutput::Event(e) => Some(e),
            _ => None,
        }));
        let (upper, lower) = app.monitor.limits();
        Ok(Response::new(pb::AppDeclinedResponse { upper, lower }))
    }

    async fn status(
        &self,
        req: Request<pb::AppStatusRequest>,
    ) -> Result<Response<pb::AppStatusResponse>, Status> {
        self.check(&req, "app.status")?;
        let app = self.app.lock().await;
        Ok(Response::new(pb::AppStatusResponse {
            app_id: app.app_id.clone(),
            state: app.state.as_str().into(),
            hosts: app.hosts.clone(),
            phase: app.phase,
            phases: app.phases,
            fraction_completed: app.monitor.fraction_completed(),
        }))
    }
}

/// The load slowdown of a host: max(1, load1 / cpus) from its latest `host.load`.
async fn slowdown(
    producer: &mut pb::producer_client::ProducerClient<tonic::transport::Channel>,
    host: &str,
) -> f64 {
    let req = pb::QueryRequest {
        patterns: vec!["host.load".into()],
        sources: vec![host.to_string()],
        max_age_ms: 0,
        ..Default::default()
    };
    let Ok(r) = producer.query(req).await else {
        return 1.0;
    };
    let r = r.into_inner();
    let num = |e: &pb::Event, i: usize| match e.values.get(i).and_then(|v| v.kind.as_ref()) {
        Some(pb::value::Kind::Number(n)) => *n,
        _ => f64::NAN,
    };
    match r.events.first() {
        // host.load: load1, free_cpus, total_cpus, ...
        Some(e) => {
            let (load, cpus) = (num(e, 0), num(e, 2));
            if load.is_finite() && cpus > 0.0 {
                (load / cpus).max(1.0)
            } else {
                1.0
            }
        }
        None => 1.0,
    }
}

/// Publishes `events` through the producer's `Ingest`.
async fn publish(ingest: &mut Ingest, events: Vec<pb::Event>) -> anyhow::Result<()> {
    ingest
        .push(pb::IngestRequest {
            events,
            schemas: vec![],
        })
        .await
        .map(|_| ())
        .map_err(|s| anyhow!("publish: {}", s.message()))
}

type Ingest = pb::ingest_client::IngestClient<tonic::transport::Channel>;

/// SIGTERM: checkpoint now (the phase in progress is redone), say so, and end the run.
async fn checkpoint_and_exit(
    app: &Mutex<App>,
    ingest: &mut Ingest,
    publish_state: &impl Fn(&App) -> pb::Event,
) -> anyhow::Result<()> {
    let ev = {
        let mut app = app.lock().await;
        let (path, _) = write_checkpoint(&app)?;
        app.state = RunState::Stopped;
        app.monitor.stopped();
        eprintln!(
            "app-sim {}: SIGTERM: checkpointed at phase {} ({}); exiting",
            app.app_id,
            app.phase,
            path.display()
        );
        publish_state(&app)
    };
    publish(ingest, vec![ev]).await?;
    Ok(())
}

/// Where the checkpoint of `app_id` lives in `dir`.
fn checkpoint_path(dir: &std::path::Path, app_id: &str) -> PathBuf {
    dir.join(format!("{app_id}.checkpoint.json"))
}

/// Writes the checkpoint of `app`: the phase to start from. Its path and size.
fn write_checkpoint(app: &App) -> anyhow::Result<(PathBuf, usize)> {
    let path = checkpoint_path(&app.checkpoint_dir, &app.app_id);
    let body = serde_json::json!({"app_id": app.app_id, "next_phase": app.phase}).to_string();
    // Written aside and renamed, so a kill mid-write never leaves half a checkpoint.
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, &body).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot rename {}", tmp.display()))?;
    Ok((path, body.len()))
}

/// The phase to start from: the checkpoint's, or 0 without one. A checkpoint of another
/// application, or with no phase left to run, is an error.
fn read_checkpoint(dir: &std::path::Path, app_id: &str, phases: u32) -> anyhow::Result<u32> {
    let path = checkpoint_path(dir, app_id);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => bail!("cannot read checkpoint {}: {e}", path.display()),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("checkpoint {} is not JSON", path.display()))?;
    if v["app_id"].as_str() != Some(app_id) {
        bail!("checkpoint {} is not of application {app_id:?}", path.display());
    }
    match v["next_phase"].as_u64() {
        Some(n) if n < u64::from(phases) => Ok(n as u32),
        _ => bail!(
            "checkpoint {} has next_phase {}, not a phase of 0..{phases}: remove it to start over",
            path.display(),
            v["next_phase"]
        ),
    }
}

pub async fn run(a: AppSimArgs) -> anyhow::Result<()> {
    if a.phases == 0 || !a.predicted_s.is_finite() || a.predicted_s <= 0.0 {
        bail!("--phases and --predicted-s must be positive");
    }
    let cfg = ContractConfig {
        app_id: a.app_id.clone(),
        upper: a.upper,
        lower: a.lower,
        predicted_s: vec![a.predicted_s; a.phases as usize],
    };
    let checkpoint_dir = a.checkpoint_dir.clone().unwrap_or_else(std::env::temp_dir);
    let first_phase = if a.resume {
        read_checkpoint(&checkpoint_dir, &a.app_id, a.phases)?
    } else {
        0
    };
    let monitor = if first_phase > 0 {
        ContractMonitor::from_checkpoint(cfg, &a.app_id, first_phase)
    } else {
        ContractMonitor::new(cfg, &a.app_id)
    }
    .map_err(|e| anyhow!("{e}"))?;
    // Under a batch system: its job id, and its node as the host by default.
    let batch_job = std::env::var("SLURM_JOB_ID").unwrap_or_default();
    let host = match (&a.host, std::env::var("SLURMD_NODENAME")) {
        (Some(h), _) => h.clone(),
        (None, Ok(node)) if !node.is_empty() => node,
        _ => bail!("give --host (under Slurm it defaults to the job's node, SLURMD_NODENAME)"),
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot catch SIGTERM")?;
    // The flags are its endpoint's settings (it has no config file).
    a.endpoint.refuse_rpc_events("app-sim")?;
    let mut endpoint = gma_core::endpoint::Endpoint::default();
    a.endpoint.apply(&mut endpoint)?;
    // A bad policy file is a startup error, before anything is connected or bound.
    let policy = gma_core::guard::load_policy(endpoint.access_policy.as_ref())
        .map_err(|e| anyhow!("--access-policy: {e}"))?;
    let limits = endpoint.limits.clone();
    let gate = Arc::new(Gate::new(policy, limits.clone()));
    let ch = gma_consumer::connect(&a.producer)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let mut ingest = pb::ingest_client::IngestClient::new(ch.clone());
    let mut producer = pb::producer_client::ProducerClient::new(ch);
    let cschema = contract_schema();
    let sschema = gma_rescheduler::app_state_schema();
    ingest
        .push(pb::IngestRequest {
            events: vec![],
            schemas: vec![cschema.clone(), sschema.clone()],
        })
        .await
        .map_err(|s| anyhow!("register schemas with {}: {}", a.producer, s.message()))?;

    // AppControl serves TLS with --tls-cert/--tls-key (mTLS with --tls-client-ca: then only
    // holders of a certificate of that CA, e.g. the rescheduler, may stop and resume it);
    // plaintext only on loopback unless --allow-plaintext.
    let listener = crate::runtime::open_endpoint("app-sim", &a.listen, &endpoint).await?;
    let bound = listener.local_addr()?;
    let tls = endpoint.tls.rustls_config(bound)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let control_addr = bound.to_string();
    let app = Arc::new(Mutex::new(App {
        app_id: a.app_id.clone(),
        phases: a.phases,
        predicted_s: a.predicted_s,
        state: RunState::Running,
        hosts: vec![host],
        phase: first_phase,
        monitor,
        stop_waiter: None,
        resume_to: None,
        checkpoint_dir,
        batch_job,
        pending: Vec::new(),
    }));
    let wake = Arc::new(tokio::sync::Notify::new());
    let control = Control {
        app: app.clone(),
        wake: wake.clone(),
        gate,
    };
    let services =
        gma_core::conn::Services::new().add_service(pb::app_control_server::AppControlServer::new(control));
    let incoming = gma_core::conn::Incoming::grpc(listener, tls, &limits, "app-sim");
    let server = tokio::spawn(gma_core::conn::serve_grpc(
        gma_core::conn::grpc_server(&limits),
        services,
        incoming,
        std::future::pending::<()>(),
    ));

    let total_predicted = a.predicted_s * a.phases as f64;
    let publish_state = |app: &App| -> pb::Event {
        let e = EventData {
            name: "app.state".into(),
            source: app.app_id.clone(),
            timestamp_ns: now_ns(),
            numbers: vec![
                app.phase as f64,
                app.phases as f64,
                app.monitor.fraction_completed(),
                total_predicted,
                app.monitor.average(),
            ],
            strings: vec![
                app.app_id.clone(),
                app.state.as_str().into(),
                app.hosts.join(","),
                format!("{scheme}://{control_addr}"),
                app.batch_job.clone(),
            ],
        };
        e.to_wire(0, &sschema.fields)
    };
    if first_phase > 0 {
        let app = app.lock().await;
        eprintln!(
            "app-sim {}: resumed from checkpoint at phase {} on {}",
            app.app_id,
            first_phase,
            app.hosts.join(",")
        );
    }
    let first = publish_state(&*app.lock().await);
    publish(&mut ingest, vec![first]).await?;

    loop {
        let (phase, host, predicted) = {
            let app = app.lock().await;
            if app.phase >= app.phases {
                break;
            }
            (app.phase, app.hosts[0].clone(), app.predicted_s)
        };
        let factor = slowdown(&mut producer, &host).await;
        let started = Instant::now();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(predicted * factor)) => {}
            _ = term.recv() => return checkpoint_and_exit(&app, &mut ingest, &publish_state).await,
        }
        let actual = started.elapsed().as_secs_f64();
        let mut events = Vec::new();
        {
            let mut app = app.lock().await;
            for e in std::mem::take(&mut app.pending) {
                events.push(e.to_wire(0, &cschema.fields));
            }
            let outputs = app
                .monitor
                .report(phase, actual, now_ns())
                .map_err(|e| anyhow!("contract monitor: {e}"))?;
            for o in outputs {
                if let ContractOutput::Event(e) = o {
                    events.push(e.to_wire(0, &cschema.fields));
                }
            }
            app.phase = phase + 1;
            // Check_Stop at the phase boundary.
            if app.state == RunState::Stopping {
                let (path, bytes) = write_checkpoint(&app)?;
                app.state = RunState::Stopped;
                if let Some(w) = app.stop_waiter.take() {
                    let _ = w.send(pb::AppStopResponse {
                        next_phase: app.phase,
                        checkpoint: path.display().to_string(),
                        checkpoint_bytes: bytes as u64,
                    });
                }
                eprintln!(
                    "app-sim {}: stopped after phase {} (checkpoint {})",
                    app.app_id,
                    app.phase,
                    path.display()
                );
            }
            events.push(publish_state(&app));
        }
        publish(&mut ingest, events).await?;
        // Stopped: wait for Resume, then continue on the new hosts.
        loop {
            let mut guard = app.lock().await;
            match guard.state {
                RunState::Stopped => {
                    drop(guard);
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = term.recv() => return checkpoint_and_exit(&app, &mut ingest, &publish_state).await,
                    }
                }
                RunState::Resuming => {
                    let hosts = guard.resume_to.take().unwrap_or_else(|| guard.hosts.clone());
                    let remaining = (guard.phases - guard.phase) as usize;
                    let predicted = guard.predicted_s;
                    guard.hosts = hosts;
                    if remaining > 0 {
                        guard
                            .monitor
                            .restarted(vec![predicted; remaining])
                            .map_err(|e| anyhow!("contract monitor: {e}"))?;
                    }
                    guard.state = RunState::Running;
                    eprintln!(
                        "app-sim {}: resumed on {} at phase {}",
                        guard.app_id,
                        guard.hosts.join(","),
                        guard.phase
                    );
                    let ev = publish_state(&guard);
                    drop(guard);
                    publish(&mut ingest, vec![ev]).await?;
                    break;
                }
                _ => break,
            }
        }
    }
    let done = {
        let mut app = app.lock().await;
        app.state = RunState::Completed;
        publish_state(&app)
    };
    publish(&mut ingest, vec![done]).await?;
    let app = app.lock().await;
    match std::fs::remove_file(checkpoint_path(&app.checkpoint_dir, &app.app_id)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            eprintln!("app-sim {}: cannot remove its checkpoint: {e}", app.app_id)
        }
        _ => {}
    }
    println!(
        "app-sim {} completed {} phases on {}",
        app.app_id,
        app.phases,
        app.hosts.join(",")
    );
    server.abort();
    Ok(())
}

#[derive(Args, Debug)]
pub struct AppSimArgs {
    #[arg(long, default_value = "app1")]
    pub app_id: String,
    #[arg(long, default_value_t = 20)]
    pub phases: u32,
    /// Predicted time of each phase on an unloaded host, in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub predicted_s: f64,
    /// The host it starts on (a simulated host's name; under Slurm, default: the job's node).
    #[arg(long)]
    pub host: Option<String>,
    /// Producer to publish through (Ingest) and to read host load from.
    #[arg(long)]
    pub producer: String,
    /// Listen address of its AppControl service.
    #[arg(long, default_value = "127.0.0.1:0", help_heading = crate::args::SERVING_HEADING)]
    pub listen: String,
    /// Contract tolerance band on actual/predicted.
    #[arg(long, default_value_t = 1.5)]
    pub upper: f64,
    #[arg(long, default_value_t = 0.5)]
    pub lower: f64,
    /// Where its checkpoint `<app-id>.checkpoint.json` is written, and read at start to resume
    /// (default: the temp dir).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Start from the checkpoint of --app-id in --checkpoint-dir when there is one (a batch
    /// job's script passes it, so a job requeued by the rescheduler resumes where it stopped).
    #[arg(long)]
    pub resume: bool,
    #[command(flatten)]
    pub endpoint: crate::args::EndpointArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use gma_core::Refuse;
    use tonic::Code;

    #[test]
    fn a_checkpoint_is_read_only_when_it_is_this_applications_and_leaves_work() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(read_checkpoint(d, "a", 10).unwrap(), 0, "none: from the start");
        let write = |body: &str| std::fs::write(checkpoint_path(d, "a"), body).unwrap();
        write(r#"{"app_id":"a","next_phase":4}"#);
        assert_eq!(read_checkpoint(d, "a", 10).unwrap(), 4);
        for (body, says) in [
            (r#"{"app_id":"b","next_phase":4}"#, "not of application"),
            (r#"{"app_id":"a","next_phase":10}"#, "not a phase of 0..10"),
            (r#"{"app_id":"a","next_phase":-1}"#, "not a phase of 0..10"),
            ("{half", "is not JSON"),
        ] {
            write(body);
            let e = format!("{:#}", read_checkpoint(d, "a", 10).unwrap_err());
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn each_refusal_maps_to_its_code_and_keeps_its_message() {
        let cases = [
            (
                ControlError::OtherApp("app1".into()),
                Code::NotFound,
                "this is application \"app1\"",
            ),
            (
                ControlError::State {
                    state: "stopping",
                    needed: "running",
                },
                Code::FailedPrecondition,
                "application is stopping, not running",
            ),
            (
                ControlError::NoHosts,
                Code::InvalidArgument,
                "give the hosts to resume on",
            ),
            (
                ControlError::Ended,
                Code::Aborted,
                "the application ended before it could stop",
            ),
            (
                ControlError::from(Refusal::permission_denied("denied by rule 2")),
                Code::PermissionDenied,
                "denied by rule 2",
            ),
        ];
        for (e, code, msg) in cases {
            let s = Status::from(e);
            assert_eq!((s.code(), s.message()), (code, msg));
        }
    }
}
