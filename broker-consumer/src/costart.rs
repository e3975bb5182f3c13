//! Starting a coallocated set in its reservations (`gma broker coallocate --submit`, the
//! `runs` of `Coallocate`).
//!
//! Once the coallocator holds one reservation per job, each job is claimed into its
//! reservation at its manager (`gma slurm`: `sbatch --reservation`, the job pends until the
//! reservation starts; `gma simres`: a simulated job that starts exactly at the reserved
//! start, crate::simjobs). Then every job's state is read until all have started: the actual
//! start of each is its manager's `start_s` (Slurm's StartTime). The set has started when the
//! spread of the (offset-corrected) actual starts is at most ε.
//!
//! It has not when a claim is refused, a job ends failed or cancelled before all started, a
//! job has still not started ε after the first one did (its start could no longer be within
//! ε), none has started [`START_GRACE_S`] after the latest reserved start plus ε, or the
//! spread of the starts exceeds ε. Then every job is cancelled and every reservation released
//! (a manager's release cancels its job first); a release the manager cannot carry out now
//! (slurmctld down) is kept and retried by the manager (docs/slurm.md, Recovery).

use std::path::Path;
use std::time::Duration;

use gma_proto::v1 as pb;

use crate::error::JobError;
use crate::job::CoallocFile;
use crate::jobrun::{call, read_text, take_run};
use crate::remote::RemoteReserver;
use crate::reserve::{Reservation, ReserveError, Reserver};

/// Reads a coallocation file whose every `[[job]]` also says what it runs (`script`,
/// `script_file` relative to the file, or `command`; `disk_mb`, `workdir`), as in a run file
/// of `gma job submit`. The runs are in job order.
pub fn load_with_runs(path: &Path) -> Result<(CoallocFile, Vec<pb::CoallocRun>), JobError> {
    let (text, origin) = read_text(path)?;
    parse_with_runs(&text, &origin, path.parent())
}

/// [`load_with_runs`] of text (`dir`: where `script_file` is relative to).
pub fn parse_with_runs(
    text: &str,
    origin: &str,
    dir: Option<&Path>,
) -> Result<(CoallocFile, Vec<pb::CoallocRun>), JobError> {
    let parse = |m: String| JobError::Parse {
        path: origin.to_string(),
        message: m,
    };
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| parse(e.message().to_string()))?;
    let mut runs = Vec::new();
    if let Some(toml::Value::Array(jobs)) = table.get_mut("job") {
        for (i, j) in jobs.iter_mut().enumerate() {
            let toml::Value::Table(t) = j else {
                return Err(parse(format!("job[{i}] must be a table")));
            };
            let (run, window) = take_run(t, dir, &format!("job[{i}]."))?;
            if let Some(w) = window {
                // window_s belongs to the file, not to a job of the set.
                t.insert("window_s".into(), w);
            }
            runs.push(run);
        }
    }
    let file: CoallocFile = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| parse(e.message().to_string()))?;
    file.validate()?;
    Ok((file, runs))
}

/// How often the jobs' states are read while the set starts.
const POLL: Duration = Duration::from_millis(200);
/// Seconds past (latest reserved start + ε) after which a set none of whose jobs started is
/// given up (a batch system may start a job a few seconds after its reservation begins).
pub const START_GRACE_S: i64 = 60;

/// One member: its reservation, what it runs, its start offset.
pub struct Member {
    pub job: String,
    pub res: Reservation,
    pub offset_s: i64,
    pub spec: pb::BatchJobSpec,
}

/// How starting the set ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    /// `started`, or the stage that failed: `claim`, `start`, `spread`.
    pub stage: String,
    /// Empty when started.
    pub reason: String,
    /// Each member's job as last seen (None: never claimed), in member order.
    pub jobs: Vec<Option<pb::BatchJob>>,
    /// Spread of the offset-corrected actual starts (0 unless every job started).
    pub spread_s: i64,
}

fn now_s() -> i64 {
    gma_core::time::now_ns() / 1_000_000_000
}

/// Where the set stands after one read of every job.
#[derive(Debug, PartialEq)]
pub(crate) enum Progress {
    Waiting,
    Started { spread_s: i64 },
    Failed { stage: &'static str, reason: String },
}

/// Judges the set at `now`: `jobs` as last read (member order), `commons` each member's
/// reserved start minus its offset, `offsets` the offsets.
pub(crate) fn judge(
    names: &[String],
    jobs: &[pb::BatchJob],
    offsets: &[i64],
    reserved_commons: &[i64],
    eps: i64,
    now: i64,
) -> Progress {
    for (n, j) in names.iter().zip(jobs) {
        if j.start_s == 0 && (j.done || matches!(j.state.as_str(), "failed" | "cancelled")) {
            return Progress::Failed {
                stage: "start",
                reason: format!("job {n} ended {} before it started: {}", j.state, j.reason),
            };
        }
    }
    let started: Vec<i64> = jobs
        .iter()
        .zip(offsets)
        .filter(|(j, _)| j.start_s > 0)
        .map(|(j, o)| j.start_s - o)
        .collect();
    if started.len() == jobs.len() {
        let spread = started.iter().max().copied().unwrap_or(0) - started.iter().min().copied().unwrap_or(0);
        if spread > eps {
            return Progress::Failed {
                stage: "spread",
                reason: format!("the jobs started {spread} s apart, more than epsilon {eps} s"),
            };
        }
        return Progress::Started { spread_s: spread };
    }
    let waiting: Vec<&str> = names
        .iter()
        .zip(jobs)
        .filter(|(_, j)| j.start_s == 0)
        .map(|(n, _)| n.as_str())
        .collect();
    if let Some(first) = started.iter().min() {
        // Seconds are whole: one more before a late start is certain.
        if now > first + eps + 1 {
            return Progress::Failed {
                stage: "start",
                reason: format!(
                    "{} had not started {} s after the first job started (epsilon {eps} s)",
                    waiting.join(", "),
                    now - first
                ),
            };
        }
    } else if let Some(latest) = reserved_commons.iter().max() {
        if now > latest + eps + START_GRACE_S {
            return Progress::Failed {
                stage: "start",
                reason: format!(
                    "no job started within {} s of the reserved start (waiting: {}; last states: {})",
                    now - latest,
                    waiting.join(", "),
                    jobs.iter()
                        .map(|j| format!("{} {}", j.state, j.reason))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            };
        }
    }
    Progress::Waiting
}

/// Claims every member into its reservation and follows the jobs until the set started or
/// could not; on failure everything is cancelled and released before this returns.
pub async fn start_set(reserver: &RemoteReserver, members: &[Member], owner: &str, eps: i64) -> Started {
    let mut jobs: Vec<Option<pb::BatchJob>> = vec![None; members.len()];
    let mut failure: Option<(&'static str, String)> = None;
    for (i, m) in members.iter().enumerate() {
        let Some(client) = reserver.client_of(&m.res.resource) else {
            failure = Some((
                "claim",
                format!("job {}: no manager for {}", m.job, m.res.resource),
            ));
            break;
        };
        let req = pb::ClaimRequest {
            reservation_id: m.res.id.clone(),
            owner: owner.to_string(),
            job: Some(m.spec.clone()),
        };
        match call(&client, |mut c| async move { c.claim(req).await }).await {
            Ok(j) => jobs[i] = Some(j),
            Err(s) => {
                failure = Some((
                    "claim",
                    format!(
                        "claim of job {} into reservation {} on {} refused: {} ({:?})",
                        m.job,
                        m.res.id,
                        m.res.resource,
                        s.message(),
                        s.code()
                    ),
                ));
                break;
            }
        }
    }
    let names: Vec<String> = members.iter().map(|m| m.job.clone()).collect();
    let offsets: Vec<i64> = members.iter().map(|m| m.offset_s).collect();
    let commons: Vec<i64> = members.iter().map(|m| m.res.start_s - m.offset_s).collect();
    let mut last_error: Vec<Option<String>> = vec![None; members.len()];
    let mut spread_s = 0;
    while failure.is_none() {
        for (i, m) in members.iter().enumerate() {
            let (Some(client), Some(j)) = (reserver.client_of(&m.res.resource), jobs[i].clone()) else {
                continue;
            };
            if j.done {
                continue;
            }
            let req = pb::BatchJobRequest {
                job_id: j.job_id.clone(),
                owner: owner.to_string(),
            };
            match call(&client, |mut c| async move { c.job_status(req).await }).await {
                Ok(now) => {
                    jobs[i] = Some(now);
                    last_error[i] = None;
                }
                Err(s) => last_error[i] = Some(format!("{} ({:?})", s.message(), s.code())),
            }
        }
        let seen: Vec<pb::BatchJob> = jobs.iter().map(|j| j.clone().unwrap_or_default()).collect();
        match judge(&names, &seen, &offsets, &commons, eps, now_s()) {
            Progress::Waiting => tokio::time::sleep(POLL).await,
            Progress::Started { spread_s: s } => {
                spread_s = s;
                break;
            }
            Progress::Failed { stage, mut reason } => {
                for (n, e) in names.iter().zip(&last_error) {
                    if let Some(e) = e {
                        reason.push_str(&format!("; {n}'s manager: {e}"));
                    }
                }
                failure = Some((stage, reason));
            }
        }
    }
    let Some((stage, mut reason)) = failure else {
        return Started {
            stage: "started".into(),
            reason: String::new(),
            jobs,
            spread_s,
        };
    };
    // Nothing left reserved or running: each release cancels the reservation's job first.
    let mut pending = Vec::new();
    for m in members {
        match reserver.release(&m.res.id, owner).await {
            Ok(()) | Err(ReserveError::NotFound { .. }) => {}
            Err(e) => pending.push(format!("{} ({e})", m.res.id)),
        }
    }
    if !pending.is_empty() {
        reason.push_str(&format!(
            "; releases not confirmed yet (a manager that cannot reach its batch system keeps and retries them; one that is down releases them when it restarts): {}",
            pending.join(", ")
        ));
    }
    tracing::warn!(stage, reason = %reason, "the coallocated set did not start");
    Started {
        stage: stage.into(),
        reason,
        jobs,
        spread_s: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: &str, start_s: i64) -> pb::BatchJob {
        pb::BatchJob {
            state: state.into(),
            done: matches!(state, "completed" | "failed" | "cancelled"),
            start_s,
            ..Default::default()
        }
    }

    #[test]
    fn coallocation_files_with_runs_carry_one_script_per_job() {
        let text = "window_s = 600\nepsilon_s = 30\n\
                    [[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 60\ncommand = \"hostname\"\n\
                    [[job]]\nname = \"b\"\ncpus = 1\nreference_time_s = 60\nscript = \"#!/bin/sh\\ntrue\\n\"\ndisk_mb = 5\n";
        let (f, runs) = parse_with_runs(text, "set.toml", None).unwrap();
        assert_eq!((f.job.len(), f.epsilon_s), (2, Some(30)));
        assert_eq!(runs[0].script, "#!/bin/sh\nhostname\n");
        assert_eq!(
            (runs[1].script.as_str(), runs[1].disk_mb),
            ("#!/bin/sh\ntrue\n", 5.0)
        );
        let missing = text.replace("command = \"hostname\"\n", "");
        let e = parse_with_runs(&missing, "set.toml", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("job[0].script: give script"), "{e}");
        let bad = text.replace("#!/bin/sh\\ntrue", "true");
        let e = parse_with_runs(&bad, "set.toml", None).unwrap_err().to_string();
        assert!(e.starts_with("job[1].script: must start with #!"), "{e}");
        let e = parse_with_runs(
            "[[job]]\nname = \"a\"\ncpus = 1\nreference_time_s = 60\ncommand = \"x\"\nbogus = 1\n",
            "s",
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    #[test]
    fn the_set_starts_when_every_job_started_within_epsilon() {
        let j = [job("running", 1000), job("completed", 1003)];
        assert_eq!(
            judge(&names(), &j, &[0, 0], &[1000, 1000], 5, 1004),
            Progress::Started { spread_s: 3 }
        );
        // Offsets are taken out: 1000 and 1610 with offset 600 are 10 s apart.
        let j = [job("running", 1000), job("running", 1610)];
        assert_eq!(
            judge(&names(), &j, &[0, 600], &[1000, 1000], 10, 1620),
            Progress::Started { spread_s: 10 }
        );
        assert!(matches!(
            judge(&names(), &j, &[0, 600], &[1000, 1000], 9, 1620),
            Progress::Failed { stage: "spread", .. }
        ));
    }

    #[test]
    fn a_late_or_failed_job_fails_the_set_and_waiting_is_bounded() {
        let j = [job("running", 1000), job("pending", 0)];
        assert_eq!(
            judge(&names(), &j, &[0, 0], &[1000, 1000], 5, 1006),
            Progress::Waiting
        );
        match judge(&names(), &j, &[0, 0], &[1000, 1000], 5, 1007) {
            Progress::Failed {
                stage: "start",
                reason,
            } => assert!(reason.starts_with("b had not started"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let j = [job("pending", 0), job("failed", 0)];
        assert!(matches!(
            judge(&names(), &j, &[0, 0], &[1000, 1000], 5, 900),
            Progress::Failed { stage: "start", .. }
        ));
        let j = [job("pending", 0), job("pending", 0)];
        assert_eq!(
            judge(&names(), &j, &[0, 0], &[1000, 1000], 5, 1000 + 5 + START_GRACE_S),
            Progress::Waiting
        );
        assert!(matches!(
            judge(&names(), &j, &[0, 0], &[1000, 1000], 5, 1001 + 5 + START_GRACE_S),
            Progress::Failed { stage: "start", .. }
        ));
    }
}
