//! gma-broker: the resource broker of Elmroth & Tordsson, built as a consumer of the fabric.
//!
//! - [`job`]: job files (TOML) and the `JobSpec` message, validated with errors naming the field.
//! - [`rank`]: the ranking, a pure function of (snapshot, job, policy): requirement filter,
//!   benchmark-scaled execution time, load-based queue wait, stage-in/out; policies ttd, tts,
//!   utility and cost; stale data never used as fresh.
//! - [`utility`]: partial-utility step functions and the four user classes.
//! - [`batch`]: Min-min, Max-min and Sufferage for a set of waiting jobs over the predicted
//!   completion times (`gma broker select --batch`).
//! - [`reserve`]: the advance-reservation interface (create / modify / release with the
//!   three-way answer granted / never / retry-from) as the coallocator sees it.
//! - [`calendar`]: per-resource reservation calendars (the simulated resource manager's
//!   state, and the in-memory manager used by tests and replays).
//! - [`coalloc`]: the coallocation algorithm (sliding ε start window, reservations per job,
//!   exchange along shortest augmenting paths, no hold-and-wait, no leaked reservations).
//! - [`costart`]: starting a coallocated set in its reservations (`coallocate --submit`):
//!   claims, the actual starts and their spread, everything released when the set cannot start.
//! - [`remote`]: resource managers over gRPC (the `Reservations` client side).
//! - [`view`]: the live resource table fed by `host.load` / `host.info` / `host.cpu` /
//!   `site.load`, with static annotations; snapshots are shared, never copied per decision.
//! - [`service`]: the running broker: follows the streams, serves `Broker` (Select,
//!   Coallocate, View), publishes `broker.decision` events.
//! - [`simres`]: `gma simres`, a simulated resource manager serving `Reservations` over
//!   per-resource calendars and publishing `reservation.state` events.
//! - [`simjobs`]: the `job.batch` event, and the jobs simres simulates in claimed reservations.
//! - [`placement`]: placement quality: a discrete-event simulation of a synthetic workload
//!   placed by `ttd`, at random and round-robin.
//! - [`replay`]: the paper's randomized coallocation experiment (§5.2.2).
//! - [`provision`]: Singh, Kesselman and Deelman's slot provisioning for workflows: slot-aware
//!   HEFT, MOGA over (allocation cost, makespan), the α trade-off.
//!
//! # Ranking API
//!
//! What another role (the federation) uses to rank resources the way the broker does, from the
//! crate root and nothing deeper: a [`LiveView`] fed with the resource events
//! ([`LiveView::apply`], configured with [`Annotation`]s), a [`Snapshot`] of it
//! ([`LiveView::snapshot`], or [`Snapshot::new`] over [`Resource`]s of one's own), and
//! [`rank_candidates`] for a [`Job`] under a [`Policy`] and a [`RankConfig`], which returns the
//! [`Ranked`] candidates best first; [`scaled_exec_s`] is its benchmark-scaled execution time
//! over scores of one's own (a class of hosts). The modules behind it may change; this surface
//! is what other crates build on.

// Tests unwrap freely: a panic there is the failure report. Library code never unwraps.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod batch;
pub mod calendar;
pub mod coalloc;
pub mod costart;
pub mod error;
pub mod job;
pub mod jobrun;
pub mod placement;
pub mod provision;
pub mod rank;
pub mod remote;
pub mod replay;
pub mod reserve;
pub mod service;
pub mod simjobs;
pub mod simres;
pub mod slurm;
pub mod utility;
pub mod view;

pub use job::{Job, JobError};
pub use rank::{scaled_exec_s, Policy, RankConfig, Ranked, Resource, Snapshot};
pub use view::{Annotation, LiveView};

/// Ranks the resources of `snapshot` for `job` under `policy`, as the broker's `Select` does:
/// the candidates that meet the job's requirements (and are fresh, or estimated
/// conservatively when `cfg.stale` says so), best first, in a total order (ties by predicted
/// completion, then name), each with its predicted start, execution, wait and completion
/// times. Empty when no resource fits. Errors only for an invalid job.
pub fn rank_candidates(
    snapshot: &Snapshot,
    job: &Job,
    policy: Policy,
    cfg: &RankConfig,
) -> Result<Vec<Ranked>, JobError> {
    rank::rank(snapshot, job, policy, cfg, rank::Limits::default()).map(|r| r.ranked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, total: f64, free: f64, specint: f64) -> Resource {
        let mut r = Resource::unknown(name);
        r.total_cpus = total;
        r.free_cpus = free;
        r.queue_waiting = 0.0;
        r.memory_mb = 4096.0;
        r.benchmarks.insert("specint".into(), specint);
        r.updated_ns = 1_000_000_000;
        r
    }

    #[test]
    fn rank_candidates_orders_the_fitting_resources_best_first() {
        let snap = Snapshot::new(
            1_500_000_000,
            vec![
                host("slow", 8.0, 8.0, 10.0),
                host("fast", 8.0, 8.0, 40.0),
                host("small", 1.0, 1.0, 80.0),
                host("busy", 8.0, 0.0, 40.0),
            ],
        );
        let job = Job {
            name: "j".into(),
            cpus: 4,
            reference_time_s: 100.0,
            reference: [("specint".to_string(), 20.0)].into(),
            ..Job::default()
        };
        let got = rank_candidates(&snap, &job, Policy::Ttd, &RankConfig::default()).unwrap();
        let names: Vec<&str> = got.iter().map(|r| r.resource.as_str()).collect();
        // "small" has too few CPUs; "fast" runs 4x faster than "slow"; "busy" is as fast as
        // "fast" but waits for its CPUs (600 s typical job / 2 slots).
        assert_eq!(names, ["fast", "slow", "busy"]);
        assert_eq!((got[0].exec_s, got[0].wait_s), (50.0, 0.0));
        assert_eq!((got[1].exec_s, got[1].wait_s), (200.0, 0.0));
        assert_eq!((got[2].exec_s, got[2].wait_s), (50.0, 300.0));
        assert!(got.windows(2).all(|w| w[0].completion_s <= w[1].completion_s));
        // The same answer as the broker's own ranking, and an invalid job is an error.
        let full = rank::rank(
            &snap,
            &job,
            Policy::Ttd,
            &RankConfig::default(),
            rank::Limits::default(),
        );
        let key = |r: &Ranked| {
            (
                r.resource.clone(),
                r.rank,
                r.score.to_bits(),
                r.completion_s.to_bits(),
            )
        };
        let full: Vec<_> = full.unwrap().ranked.iter().map(key).collect();
        assert_eq!(full, got.iter().map(key).collect::<Vec<_>>());
        let bad = Job { cpus: 0, ..job };
        assert!(rank_candidates(&snap, &bad, Policy::Ttd, &RankConfig::default()).is_err());
    }
}
