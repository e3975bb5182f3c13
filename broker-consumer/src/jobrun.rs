//! The broker runs jobs (`RunJob`, `gma job submit --broker`): rank the resources of the
//! resource managers that run jobs (`gma slurm`), reserve on the best that grants, claim the
//! reservation with the job (the manager submits it into the reservation), follow it to its
//! end. Every failure before the end is the stream's error status, and leaves nothing
//! reserved: a reservation that cannot be claimed is released, a manager lost while the job
//! runs is asked to release it (and ends it with the job itself).
//!
//! The run file (TOML) is the broker's job file plus what to run:
//!
//! ```toml
//! name = "hello"
//! cpus = 1
//! memory_mb = 100            # 0 / absent = any
//! software = ["python3"]     # the resource must declare each
//! walltime_s = 60            # the reservation length and the job's time limit (required)
//! disk_mb = 10               # free disk the job needs where it runs (absent = none)
//! workdir = "/tmp/work"      # absolute, on the resource (absent = the manager's job directory)
//! window_s = 3600            # latest start, seconds from now (absent = 3600)
//! script = """#!/bin/sh
//! echo hello
//! """                        # or command = "echo hello" (run by /bin/sh), or script_file = "run.sh"
//! ```
//! `reference_time_s` defaults to `walltime_s`; every other key of the job file applies.

use gma_core::{Refusal, Refuse};
use std::path::Path;
use std::time::Duration;

use gma_proto::v1::{self as pb, reservations_client::ReservationsClient};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Status;

use crate::error::{Error, JobError};
use crate::job::Job;
use crate::rank::{rank, Limits, Policy, RankConfig, Resource, Snapshot, StaleMode};
use crate::remote::{reservation_to_proto, RemoteReserver, CALL_TIMEOUT};
use crate::reserve::{Answer, ReserveError, ReserveRequest, Reserver};

/// Largest script.
const MAX_SCRIPT: usize = 1 << 20;
/// Default latest start, seconds from now.
pub const DEFAULT_RUN_WINDOW_S: i64 = 3600;
/// How often a running job's state is read from its manager.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// A manager unreachable this long while its job runs is given up on.
const FOLLOW_GRACE: Duration = Duration::from_secs(30);

/// Reads a run file (see the module doc) into the request of `RunJob`.
pub fn load_run_file(path: &Path) -> Result<pb::RunJobRequest, JobError> {
    let (text, origin) = read_text(path)?;
    parse_run_file(&text, &origin, path.parent())
}

/// A job file's text and its name for errors.
pub(crate) fn read_text(path: &Path) -> Result<(String, String), JobError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| JobError::Read {
        path: origin.clone(),
        message: e.to_string(),
    })?;
    Ok((text, origin))
}

/// Parses run-file text (`dir`: where `script_file` is relative to).
pub fn parse_run_file(text: &str, origin: &str, dir: Option<&Path>) -> Result<pb::RunJobRequest, JobError> {
    let parse = |m: String| JobError::Parse {
        path: origin.to_string(),
        message: m,
    };
    let field = |f: &str, m: &str| JobError::Field {
        field: f.into(),
        message: m.into(),
    };
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| parse(e.message().to_string()))?;
    let (run, window) = take_run(&mut table, dir, "")?;
    let window_s = match window {
        None => 0.0,
        Some(toml::Value::Integer(i)) => i as f64,
        Some(toml::Value::Float(x)) => x,
        Some(_) => return Err(field("window_s", "must be a number")),
    };
    let Some(walltime) = table.get("walltime_s").cloned() else {
        return Err(field(
            "walltime_s",
            "give the job's walltime in seconds (the reservation length)",
        ));
    };
    table.entry("reference_time_s").or_insert(walltime);
    let job: Job = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| parse(e.message().to_string()))?;
    job.validate()?;
    let req = pb::RunJobRequest {
        job: Some(job.to_proto()),
        script: run.script,
        disk_mb: run.disk_mb,
        workdir: run.workdir,
        policy: 0,
        window_s: window_s as i64,
    };
    check(&req).map_err(|e| match &e {
        Error::Refused(r) if r.code() == tonic::Code::InvalidArgument => match r.message().split_once(": ") {
            Some((f, msg)) => field(f, msg),
            None => field("job", r.message()),
        },
        other => field("job", &other.to_string()),
    })?;
    Ok(req)
}

/// Takes what to run out of a run file's (or a coallocation file's `[[job]]`) table: one of
/// `script`, `script_file` (relative to `dir`) and `command`, and `disk_mb`, `workdir`; also
/// `window_s` (returned as it is). `at` prefixes field names in errors (e.g. `job[1].`).
pub fn take_run(
    table: &mut toml::Table,
    dir: Option<&Path>,
    at: &str,
) -> Result<(pb::CoallocRun, Option<toml::Value>), JobError> {
    let field = |f: &str, m: &str| JobError::Field {
        field: format!("{at}{f}"),
        message: m.into(),
    };
    let mut take = |k: &str| table.remove(k);
    let (script, script_file, command) = (take("script"), take("script_file"), take("command"));
    let (disk, workdir, window) = (take("disk_mb"), take("workdir"), take("window_s"));
    let as_str = |v: Option<toml::Value>, f: &str| -> Result<Option<String>, JobError> {
        match v {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(field(f, "must be a string")),
        }
    };
    let script = match (
        as_str(script, "script")?,
        as_str(script_file, "script_file")?,
        as_str(command, "command")?,
    ) {
        (Some(s), None, None) => s,
        (None, Some(f), None) => {
            let p = dir.map_or_else(|| Path::new(&f).to_path_buf(), |d| d.join(&f));
            std::fs::read_to_string(&p).map_err(|e| JobError::Read {
                path: p.display().to_string(),
                message: e.to_string(),
            })?
        }
        (None, None, Some(c)) => format!("#!/bin/sh\n{c}\n"),
        (None, None, None) => return Err(field("script", "give script, script_file or command")),
        _ => return Err(field("script", "give one of script, script_file and command")),
    };
    let disk_mb = match disk {
        None => 0.0,
        Some(toml::Value::Integer(i)) => i as f64,
        Some(toml::Value::Float(x)) => x,
        Some(_) => return Err(field("disk_mb", "must be a number")),
    };
    let workdir = as_str(workdir, "workdir")?.unwrap_or_default();
    let run = pb::CoallocRun {
        script,
        disk_mb,
        workdir,
    };
    check_run(&run).map_err(|(f, m)| field(f, &m))?;
    Ok((run, window))
}

/// Checks what to run: (field, message) of the first problem.
pub fn check_run(run: &pb::CoallocRun) -> Result<(), (&'static str, String)> {
    if run.script.len() > MAX_SCRIPT {
        return Err(("script", format!("at most {MAX_SCRIPT} bytes")));
    }
    if !run.script.starts_with("#!") {
        return Err((
            "script",
            "must start with #! and an interpreter (e.g. #!/bin/sh)".into(),
        ));
    }
    if !run.disk_mb.is_finite() || run.disk_mb < 0.0 {
        return Err(("disk_mb", "must be a finite number >= 0".into()));
    }
    if run.workdir.len() > 4096 || (!run.workdir.is_empty() && !run.workdir.starts_with('/')) {
        return Err(("workdir", "an absolute path of at most 4096 bytes".into()));
    }
    Ok(())
}

/// What `RunJob` checks before it starts: the job and what to run.
pub struct Plan {
    pub job: Job,
    pub policy: Policy,
    pub spec: pb::BatchJobSpec,
    pub window_s: i64,
}

fn check(req: &pb::RunJobRequest) -> Result<(), Error> {
    let bad = |m: &str| Err(Error::invalid_argument(m.to_string()));
    check_run(&pb::CoallocRun {
        script: req.script.clone(),
        disk_mb: req.disk_mb,
        workdir: req.workdir.clone(),
    })
    .map_err(|(f, m)| Error::invalid_argument(format!("{f}: {m}")))?;
    if !(0..=366 * 86_400).contains(&req.window_s) {
        return bad("window_s: must be within 0..=31622400 seconds (0 = 3600)");
    }
    Ok(())
}

/// Validates a `RunJob` request (ranked under `policy`).
pub fn plan(req: &pb::RunJobRequest, policy: Policy) -> Result<Plan, Error> {
    let spec = req
        .job
        .as_ref()
        .ok_or_else(|| Error::invalid_argument("job: give the job to run"))?;
    let job = Job::from_proto(spec, "job.")?;
    check(req)?;
    let spec = pb::BatchJobSpec {
        name: job.name.clone(),
        script: req.script.clone(),
        cpus: job.cpus,
        memory_mb: job.memory_mb,
        disk_mb: req.disk_mb,
        software: job.software.clone(),
        time_limit_s: job.walltime(),
        workdir: req.workdir.clone(),
    };
    Ok(Plan {
        job,
        policy,
        spec,
        window_s: if req.window_s == 0 {
            DEFAULT_RUN_WINDOW_S
        } else {
            req.window_s
        },
    })
}

/// How a run ended, for the broker's decision event.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// completed, failed, cancelled, refused (before the job started), unavailable.
    pub outcome: String,
    pub resource: String,
    pub job_id: String,
    pub exit_code: i32,
    pub reason: String,
}

type Tx = mpsc::Sender<Result<pb::RunJobUpdate, Status>>;

/// Sends, ignoring a caller that went away: the run goes on to its end (and its clean-up).
async fn send(tx: &Tx, m: Result<pb::RunJobUpdate, Status>) {
    let _ = tx.send(m).await;
}

/// Ends the run with an error (the stream's status) and the outcome for the event.
async fn fail(tx: &Tx, error: Error, outcome: &str, resource: &str) -> Outcome {
    let status = Status::from(error);
    let reason = status.message().to_string();
    send(tx, Err(status)).await;
    Outcome {
        outcome: outcome.into(),
        resource: resource.into(),
        exit_code: -1,
        reason,
        ..Default::default()
    }
}

/// The candidates (best first) among the resources that run jobs; or why there are none.
fn candidates(
    plan: &Plan,
    reserver: &RemoteReserver,
    snap: &Snapshot,
    policy: Policy,
    rank_cfg: &RankConfig,
) -> Result<Vec<String>, Error> {
    let runners: Vec<_> = reserver.offered().iter().filter(|o| o.runs_jobs).collect();
    if runners.is_empty() {
        return Err(Error::failed_precondition("no resource manager that runs jobs is known (start gma slurm on the batch system's controller, registered in the broker's directory or listed in reservations = [...])"));
    }
    let mut reasons = Vec::new();
    let mut resources = Vec::new();
    for o in runners {
        if plan.spec.disk_mb > 0.0 && o.disk_mb < plan.spec.disk_mb {
            reasons.push(format!(
                "{}: {:.0} MB of disk free, {:.0} needed",
                o.name, o.disk_mb, plan.spec.disk_mb
            ));
            continue;
        }
        let mut r = match snap.resources.iter().find(|r| r.name == o.name) {
            Some(r) => Resource::clone(r),
            None => {
                let mut r = Resource::unknown(&o.name);
                r.memory_mb = if o.memory_mb > 0.0 { o.memory_mb } else { f64::NAN };
                r.arch.clone_from(&o.arch);
                r.updated_ns = i64::MIN / 2;
                r
            }
        };
        r.total_cpus = f64::from(o.cpus);
        for s in &o.software {
            if !r.software.contains(s) {
                r.software.push(s.clone());
            }
        }
        resources.push(r);
    }
    let sub = Snapshot::new(snap.now_ns, resources);
    let cfg = RankConfig {
        stale: StaleMode::Conservative,
        ..rank_cfg.clone()
    };
    let ranking = rank(
        &sub,
        &plan.job,
        policy,
        &cfg,
        Limits {
            limit: 0,
            rejected: true,
        },
    )
    .map_err(|e| Error::failed_precondition(e.to_string()))?;
    reasons.extend(
        ranking
            .rejected
            .iter()
            .map(|r| format!("{}: {}", r.resource, r.reason)),
    );
    if ranking.ranked.is_empty() {
        return Err(Error::failed_precondition(format!(
            "no resource that runs jobs meets the job's requirements: {}",
            reasons.join("; ")
        )));
    }
    Ok(ranking.ranked.into_iter().map(|r| r.resource).collect())
}

/// Runs a planned job for `owner` at the `managers`, streaming its progress to `tx`.
pub async fn run(
    plan: Plan,
    snap: &Snapshot,
    rank_cfg: &RankConfig,
    managers: &[String],
    owner: &str,
    decision_id: u64,
    tx: Tx,
) -> Outcome {
    let reserver = match RemoteReserver::connect(managers).await {
        Ok(r) => r,
        Err(e) => {
            return fail(
                &tx,
                Error::unavailable(format!("resource manager down: {e}")),
                "unavailable",
                "",
            )
            .await
        }
    };
    let cands = match candidates(&plan, &reserver, snap, plan.policy, rank_cfg) {
        Ok(c) => c,
        Err(e) => return fail(&tx, e, "refused", "").await,
    };
    // Reserve on the best candidate that grants; a whole number of minutes (Slurm's time
    // limits) plus one for the start.
    let now = gma_core::time::now_ns() / 1_000_000_000;
    let duration_s = (plan.job.walltime() + 59) / 60 * 60 + 60;
    let mut why = Vec::new();
    let mut all_down = true;
    let mut held = None;
    for c in &cands {
        let req = ReserveRequest {
            resource: c.clone(),
            cpus: plan.job.cpus,
            duration_s,
            earliest_s: now,
            latest_s: now + plan.window_s,
            flexible: false,
            owner: owner.to_string(),
        };
        match reserver.reserve(&req).await {
            Ok(Answer::Granted(r)) => {
                held = Some(r);
                break;
            }
            Ok(Answer::Never(m)) => {
                all_down = false;
                why.push(format!("{c}: never ({m})"));
            }
            Ok(Answer::Retry { from_s, reason }) => {
                all_down = false;
                why.push(format!("{c}: not before {}s from now ({reason})", from_s - now));
            }
            Err(e) => {
                all_down &= matches!(e, ReserveError::Unavailable { .. });
                why.push(format!("{c}: {e}"));
            }
        }
    }
    let Some(res) = held else {
        let m = format!(
            "no reservation in the window of {} s: {}",
            plan.window_s,
            why.join("; ")
        );
        return if all_down {
            fail(
                &tx,
                Error::unavailable(format!("resource manager down: {m}")),
                "unavailable",
                "",
            )
            .await
        } else {
            fail(&tx, Error::failed_precondition(m), "refused", "").await
        };
    };
    let manager = reserver.manager_of(&res.resource).unwrap_or("").to_string();
    let update = |stage: &str, job: Option<pb::BatchJob>, message: String| pb::RunJobUpdate {
        stage: stage.into(),
        resource: res.resource.clone(),
        manager: manager.clone(),
        reservation: Some(reservation_to_proto(&res)),
        job,
        message,
        decision_id,
    };
    send(
        &tx,
        Ok(update(
            "reserved",
            None,
            format!("reservation {} on {}", res.id, res.resource),
        )),
    )
    .await;
    let Some(client) = reserver.client_of(&res.resource) else {
        release(&reserver, &res.id, owner).await;
        return fail(
            &tx,
            Error::internal("the reserving manager has no client"),
            "refused",
            &res.resource,
        )
        .await;
    };
    let claimed = call(&client, |mut c| {
        let req = pb::ClaimRequest {
            reservation_id: res.id.clone(),
            owner: owner.to_string(),
            job: Some(plan.spec.clone()),
        };
        async move { c.claim(req).await }
    })
    .await;
    let mut job = match claimed {
        Ok(j) => j,
        Err(s) => {
            // Nothing left reserved: the claim failed, so the reservation goes.
            release(&reserver, &res.id, owner).await;
            let error = Error::from(Refusal::new(
                s.code(),
                format!(
                    "claim of reservation {} on {} refused (released it): {}",
                    res.id,
                    res.resource,
                    s.message()
                ),
            ));
            let what = if s.code() == tonic::Code::Unavailable {
                "unavailable"
            } else {
                "refused"
            };
            return fail(&tx, error, what, &res.resource).await;
        }
    };
    send(
        &tx,
        Ok(update(
            "claimed",
            Some(job.clone()),
            format!("in reservation {}", res.id),
        )),
    )
    .await;
    let mut last_state = String::new();
    let mut unreachable_since: Option<tokio::time::Instant> = None;
    loop {
        if job.state != last_state {
            if job.done && job.start_s > 0 && last_state != "running" {
                // It started and ended between two reads: it did run.
                let started = format!("started at {} (Unix seconds)", job.start_s);
                let mut running = job.clone();
                running.state = "running".into();
                running.done = false;
                running.exit_code = -1;
                send(&tx, Ok(update("running", Some(running), started))).await;
            }
            last_state.clone_from(&job.state);
            let msg = if job.done {
                format!("exit code {}", job.exit_code)
            } else {
                job.reason.clone()
            };
            send(&tx, Ok(update(&job.state, Some(job.clone()), msg))).await;
        }
        if job.done {
            break;
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
        let got = call(&client, |mut c| {
            let req = pb::BatchJobRequest {
                job_id: job.job_id.clone(),
                owner: owner.to_string(),
            };
            async move { c.job_status(req).await }
        })
        .await;
        match got {
            Ok(j) => {
                unreachable_since = None;
                job = j;
            }
            Err(s) => {
                let since = *unreachable_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= FOLLOW_GRACE || s.code() != tonic::Code::Unavailable {
                    release(&reserver, &res.id, owner).await;
                    let m = format!(
                        "lost job {} at {} (asked the manager to release reservation {}): {}",
                        job.job_id,
                        res.resource,
                        res.id,
                        s.message()
                    );
                    return fail(&tx, Error::unavailable(m), "unavailable", &res.resource).await;
                }
            }
        }
    }
    // The manager ends the reservation with the job; this makes sure of it.
    release(&reserver, &res.id, owner).await;
    Outcome {
        outcome: job.state.clone(),
        resource: res.resource.clone(),
        job_id: job.job_id.clone(),
        exit_code: job.exit_code,
        reason: job.reason.clone(),
    }
}

/// Releases, ignoring a reservation already gone; other failures are logged (the manager
/// ends the reservation with its job, or at its end time).
async fn release(reserver: &RemoteReserver, id: &str, owner: &str) {
    match reserver.release(id, owner).await {
        Ok(()) | Err(ReserveError::NotFound { .. }) => {}
        Err(e) => tracing::warn!(reservation = %id, error = %e, "cannot release a reservation"),
    }
}

/// One call bounded by [`CALL_TIMEOUT`]; its refusal (code and message) or UNAVAILABLE when
/// the manager does not answer in time.
pub(crate) async fn call<T, F, Fut>(client: &ReservationsClient<Channel>, f: F) -> Result<T, Refusal>
where
    F: FnOnce(ReservationsClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    match tokio::time::timeout(CALL_TIMEOUT, f(client.clone())).await {
        Err(_) => Err(Refusal::unavailable(
            "the resource manager did not answer in time",
        )),
        Ok(r) => r.map(tonic::Response::into_inner).map_err(Refusal::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_files_carry_a_script_and_the_job_requirements() {
        let r = parse_run_file(
            "name = \"hello\"\ncpus = 1\nwalltime_s = 30\ndisk_mb = 5\nsoftware = [\"sh\"]\ncommand = \"echo hi\"\n",
            "run.toml",
            None,
        )
        .unwrap();
        assert_eq!(r.script, "#!/bin/sh\necho hi\n");
        assert_eq!(r.disk_mb, 5.0);
        let j = r.job.unwrap();
        assert_eq!((j.cpus, j.reference_time_s, j.walltime_s), (1, 30.0, Some(30.0)));
        assert_eq!(j.software, vec!["sh".to_string()]);
        for (text, want) in [
            ("name = \"a\"\ncpus = 1\ncommand = \"x\"\n", "walltime_s"),
            ("name = \"a\"\ncpus = 1\nwalltime_s = 5\n", "script: give script"),
            (
                "name = \"a\"\ncpus = 1\nwalltime_s = 5\ncommand = \"x\"\nscript = \"#!/bin/sh\"\n",
                "give one of",
            ),
            (
                "name = \"a\"\ncpus = 1\nwalltime_s = 5\nscript = \"echo\"\n",
                "script: must start with #!",
            ),
            (
                "name = \"a\"\ncpus = 0\nwalltime_s = 5\ncommand = \"x\"\n",
                "cpus",
            ),
            (
                "name = \"a\"\ncpus = 1\nwalltime_s = 5\ncommand = \"x\"\nworkdir = \"rel\"\n",
                "workdir",
            ),
            (
                "name = \"a\"\ncpus = 1\nwalltime_s = 5\ncommand = \"x\"\ncpu = 2\n",
                "unknown field `cpu`",
            ),
        ] {
            let e = parse_run_file(text, "run.toml", None).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_plan_needs_a_job() {
        let e = plan(&pb::RunJobRequest::default(), Policy::Ttd).err().unwrap();
        assert!(e.to_string().starts_with("job:"), "{e}");
    }
}
