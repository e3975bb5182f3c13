//! Batch jobs as resource managers report them (`job.batch`), and the jobs `gma simres`
//! simulates in its reservations.
//!
//! simres runs nothing: a job claimed into a simulated reservation is `pending` until the
//! reservation's start, `running` from exactly that start (a simulated resource starts on
//! time), and `completed` (exit code 0) at the reservation's end, unless it is cancelled (or
//! its reservation released) first. Each transition is published as `job.batch` when the
//! manager's clock passes it ([`SimJobs::advance`]), so a coallocation started across `gma
//! slurm` and `gma simres` sees the same lifecycle from both.

use std::collections::HashMap;

use gma_core::event::{dbl, text, EventData};
use gma_core::time::now_ns;
use gma_producer::Hub;
use gma_proto::v1 as pb;

use crate::reserve::Reservation;

/// The job lifecycle events of a batch system.
pub const JOB_EVENT: &str = "job.batch";
/// Most simulated jobs followed at once.
pub const MAX_SIM_JOBS: usize = 10_000;
/// Done simulated jobs are forgotten this long after they ended.
const FORGET_AFTER_S: i64 = 3600;

/// `job.batch`: every state change of a job started in a reservation.
pub fn job_schema() -> pb::EventSchema {
    pb::EventSchema {
        name: JOB_EVENT.into(),
        version: 1,
        fields: vec![
            dbl("exit_code", "", "the job's exit code (NaN until it ended)"),
            dbl("signal", "", "the signal that ended it (0 = none)"),
            dbl("cpus", "cpus", "CPUs of the job"),
            dbl("submit_s", "s", "submitted, Unix seconds"),
            dbl("start_s", "s", "started, Unix seconds (0 = not yet)"),
            dbl("end_s", "s", "ended, Unix seconds (0 = not yet)"),
            text("job", "the batch system's job id"),
            text("name", "the job's name"),
            text("reservation", "the reservation it runs in"),
            text("resource", "the node"),
            text("owner", "who claimed the reservation"),
            text("state", "pending, running, completed, failed or cancelled"),
            text("reason", "the batch system's state or reason"),
            text("output", "path of its standard output"),
        ],
        description: "a batch job in an advance reservation changed state (gma slurm)".into(),
    }
}

/// Publishes one `job.batch` event; nothing without a hub, a warning when the hub refuses it.
pub(crate) fn publish_job(hub: Option<&Hub>, source: &str, j: &pb::BatchJob, cpus: u32) {
    let Some(hub) = hub else { return };
    let e = EventData {
        name: JOB_EVENT.into(),
        source: source.to_string(),
        timestamp_ns: now_ns(),
        numbers: vec![
            if j.exit_code < 0 {
                f64::NAN
            } else {
                f64::from(j.exit_code)
            },
            f64::from(j.signal),
            f64::from(cpus),
            j.submit_s as f64,
            j.start_s as f64,
            j.end_s as f64,
        ],
        strings: vec![
            j.job_id.clone(),
            j.name.clone(),
            j.reservation_id.clone(),
            j.resource.clone(),
            j.owner.clone(),
            j.state.clone(),
            gma_core::clip(&j.reason, 1024).to_string(),
            j.output.clone(),
        ],
    };
    if let (_, Err(err)) = hub.publish(&[e]) {
        tracing::warn!(error = %err, "cannot publish job.batch");
    }
}

struct SimJob {
    info: pb::BatchJob,
    cpus: u32,
    /// The reservation's span: the job runs over exactly `[start_s, end_s)`.
    start_s: i64,
    end_s: i64,
}

/// The simulated jobs of one `gma simres`.
#[derive(Default)]
pub struct SimJobs {
    jobs: HashMap<String, SimJob>,
    next: u64,
}

/// Why a claim is refused (the caller maps it to a status).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimRefused {
    #[error("reservation {0:?} is already claimed by job {1}")]
    Claimed(String, String),
    #[error("job.cpus: {0} CPUs do not fit the reservation's {1}")]
    Cpus(u32, u32),
    #[error("job.name: give the job a name")]
    Name,
    #[error("the reservation ended at {0}: nothing can start in it")]
    Ended(i64),
    #[error("this manager follows {MAX_SIM_JOBS} jobs already: wait for some to end")]
    Full,
}

impl SimJobs {
    /// The job claimed into reservation `id`, if any and not done.
    pub fn of_reservation(&self, id: &str) -> Option<String> {
        self.jobs
            .values()
            .find(|j| j.info.reservation_id == id && !j.info.done)
            .map(|j| j.info.job_id.clone())
    }

    /// Starts `spec` in `res` (already checked to be held by `owner`), pending until its start.
    pub fn claim(
        &mut self,
        res: &Reservation,
        owner: &str,
        spec: &pb::BatchJobSpec,
        now_s: i64,
    ) -> Result<pb::BatchJob, ClaimRefused> {
        if let Some(j) = self.of_reservation(&res.id) {
            return Err(ClaimRefused::Claimed(gma_core::clip(&res.id, 64).to_string(), j));
        }
        if spec.name.is_empty() {
            return Err(ClaimRefused::Name);
        }
        if spec.cpus < 1 || spec.cpus > res.cpus {
            return Err(ClaimRefused::Cpus(spec.cpus, res.cpus));
        }
        if now_s >= res.end_s {
            return Err(ClaimRefused::Ended(res.end_s));
        }
        if self.jobs.len() >= MAX_SIM_JOBS {
            return Err(ClaimRefused::Full);
        }
        self.next += 1;
        let info = pb::BatchJob {
            job_id: format!("sim-{}", self.next),
            reservation_id: res.id.clone(),
            resource: res.resource.clone(),
            owner: owner.to_string(),
            name: gma_core::clip(&spec.name, 256).to_string(),
            state: "pending".into(),
            done: false,
            exit_code: -1,
            signal: 0,
            reason: "simulated: waits for the reservation's start".into(),
            submit_s: now_s,
            start_s: 0,
            end_s: 0,
            output: String::new(),
        };
        self.jobs.insert(
            info.job_id.clone(),
            SimJob {
                info: info.clone(),
                cpus: spec.cpus,
                start_s: res.start_s,
                end_s: res.end_s,
            },
        );
        Ok(info)
    }

    /// Moves every job to its state at `now_s`; returns the changes (to publish) and the
    /// reservations whose jobs just ended (to release), and forgets jobs long done.
    pub fn advance(&mut self, now_s: i64) -> (Vec<(pb::BatchJob, u32)>, Vec<String>) {
        let mut changed = Vec::new();
        let mut ended = Vec::new();
        for j in self.jobs.values_mut().filter(|j| !j.info.done) {
            // Both steps at once when a whole run passed between two calls: each is published.
            if j.info.state == "pending" && now_s >= j.start_s {
                j.info.state = "running".into();
                j.info.start_s = j.start_s;
                j.info.reason = "simulated: started at the reservation's start".into();
                changed.push((j.info.clone(), j.cpus));
            }
            if j.info.state == "running" && now_s >= j.end_s {
                j.info.state = "completed".into();
                j.info.done = true;
                j.info.exit_code = 0;
                j.info.end_s = j.end_s;
                j.info.reason = "simulated: the reservation ended".into();
                changed.push((j.info.clone(), j.cpus));
                ended.push(j.info.reservation_id.clone());
            }
        }
        self.jobs
            .retain(|_, j| !j.info.done || j.info.end_s + FORGET_AFTER_S > now_s);
        (changed, ended)
    }

    pub fn get(&self, job_id: &str) -> Option<&pb::BatchJob> {
        self.jobs.get(job_id).map(|j| &j.info)
    }

    /// Cancels `job_id` (a done job stays as it is); the change to publish, if any.
    pub fn cancel(&mut self, job_id: &str, now_s: i64, why: &str) -> Option<(pb::BatchJob, u32)> {
        let j = self.jobs.get_mut(job_id)?;
        if j.info.done {
            return None;
        }
        j.info.state = "cancelled".into();
        j.info.done = true;
        j.info.end_s = now_s;
        j.info.reason = why.to_string();
        Some((j.info.clone(), j.cpus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res() -> Reservation {
        Reservation {
            id: "r1".into(),
            resource: "simA".into(),
            cpus: 2,
            start_s: 100,
            end_s: 200,
            owner: "me".into(),
        }
    }

    fn spec(cpus: u32) -> pb::BatchJobSpec {
        pb::BatchJobSpec {
            name: "part".into(),
            script: "#!/bin/sh\ntrue\n".into(),
            cpus,
            ..Default::default()
        }
    }

    #[test]
    fn a_simulated_job_starts_at_the_reserved_start_and_ends_with_the_reservation() {
        let mut jobs = SimJobs::default();
        let j = jobs.claim(&res(), "me", &spec(2), 50).unwrap();
        assert_eq!((j.state.as_str(), j.start_s, j.submit_s), ("pending", 0, 50));
        assert_eq!(
            jobs.claim(&res(), "me", &spec(1), 50),
            Err(ClaimRefused::Claimed("r1".into(), j.job_id.clone()))
        );
        assert!(jobs.advance(99).0.is_empty());
        let (changed, ended) = jobs.advance(100);
        assert_eq!(changed.len(), 1);
        assert_eq!(
            (changed[0].0.state.as_str(), changed[0].0.start_s),
            ("running", 100)
        );
        assert!(ended.is_empty());
        let (changed, ended) = jobs.advance(250);
        assert_eq!(
            (
                changed[0].0.state.as_str(),
                changed[0].0.end_s,
                changed[0].0.exit_code
            ),
            ("completed", 200, 0)
        );
        assert_eq!(ended, ["r1"]);
        assert!(jobs.of_reservation("r1").is_none());
    }

    #[test]
    fn a_claim_that_does_not_fit_is_refused_and_a_cancel_ends_the_job() {
        let mut jobs = SimJobs::default();
        assert_eq!(
            jobs.claim(&res(), "me", &spec(3), 50),
            Err(ClaimRefused::Cpus(3, 2))
        );
        assert_eq!(
            jobs.claim(&res(), "me", &spec(1), 200),
            Err(ClaimRefused::Ended(200))
        );
        let j = jobs.claim(&res(), "me", &spec(1), 50).unwrap();
        let (c, _) = jobs.cancel(&j.job_id, 120, "cancelled by its owner").unwrap();
        assert_eq!((c.state.as_str(), c.done, c.end_s), ("cancelled", true, 120));
        assert!(jobs.cancel(&j.job_id, 130, "again").is_none());
        assert!(jobs.advance(300).0.is_empty());
    }
}
