//! The throw-away single-machine Slurm cluster of the tests: [`Cluster`] lives in the broker's
//! Slurm module (`gma bench slurm` starts it too); here, [`cluster_or_skip`] turns a cluster
//! that cannot start into a failure under `CI=true` and a skip message elsewhere.

pub use gma_broker::slurm::cluster::{which, Cluster};

use crate::netns::in_ci;

/// A cluster for `test`, or None with a skip message; under `CI=true` a cluster that cannot
/// start fails the test with its reason.
pub fn cluster_or_skip(test: &str) -> Option<Cluster> {
    nodes_or_skip(test, 1)
}

/// A cluster of `n` nodes for `test`, as [`cluster_or_skip`].
pub fn nodes_or_skip(test: &str, n: usize) -> Option<Cluster> {
    match Cluster::start_nodes(n) {
        Ok(c) => Some(c),
        Err(e) if in_ci() => panic!("CI=true and {test} needs a Slurm cluster, which cannot start here: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: a Slurm cluster cannot start here ({e}); under CI=true this fails");
            None
        }
    }
}
