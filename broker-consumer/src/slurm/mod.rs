//! `gma slurm`: the Slurm adapter, a resource manager serving the same `Reservations`
//! interface as `gma simres` on top of a real Slurm controller (docs/slurm.md).
//!
//! - [`config`]: its TOML configuration.
//! - [`cluster`]: a throw-away single-machine Slurm cluster (`gma bench slurm`, the tests).
//! - [`command`]: `scontrol`, `sbatch`, `squeue`, `scancel` with timeouts, and their parsers.
//! - [`manager`]: reservations (`scontrol create/update/delete reservation`, the three-way
//!   answer found by trying after whatever is in the way), claims (`sbatch --reservation`),
//!   job states (`squeue --json`), and the read-back loop that publishes `reservation.state`
//!   (requested, granted, confirmed, modified, claimed, released, expired) and `job.batch`
//!   (pending, running, completed, failed, cancelled, with the exit code), and the free slots
//!   (`rm.slots`) computed from Slurm's nodes and reservations.
//! - [`service`]: its side of the `Reservations` service ([`crate::simres::ResourceManager`]).
//!
//! Only the creator of a reservation (its owner: the caller's certificate CN, as in simres)
//! may modify, claim or release it; a reservation ends with its job.

pub mod cluster;
pub mod command;
pub mod config;
pub mod manager;
pub mod service;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gma_producer::Identity;
use tokio::net::TcpListener;

pub use config::SlurmConfig;
pub use manager::{job_schema, SlurmManager, JOB_EVENT};

use crate::error::Error;

/// Runs the adapter until `shutdown`; then cancels its jobs and deletes its reservations.
pub async fn run(
    config: SlurmConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (tx, _rx) = tokio::sync::oneshot::channel();
    run_notify(config, listener, shutdown, tx).await
}

/// [`run`], telling `ready` once Slurm's nodes are read and the service is about to serve.
pub async fn run_notify(
    config: SlurmConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Result<(), Error> {
    config.validate()?;
    let producer = crate::simres::manager_producer(
        "slurm",
        &config.endpoint,
        Identity::new(&config.source, config.registration.clone()),
        &[
            crate::simres::reservation_schema(),
            job_schema(),
            crate::simres::slots_schema(),
        ],
    )
    .map_err(|e| Error::Producer(e.to_string()))?;
    let manager = Arc::new(SlurmManager::start(&config, Some(producer.hub.clone())).await?);
    let poller = {
        let m = manager.clone();
        let period = Duration::from_millis(config.poll_ms);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                m.tick().await;
            }
        })
    };
    let _ = ready.send(());
    let r = crate::simres::serve(producer, manager.clone(), listener, shutdown).await;
    poller.abort();
    manager.release_all().await;
    r.map_err(|e| Error::Producer(e.to_string()))
}
