//! A Slurm adapter in a fabric, for tests that run jobs through the broker: a directory, the
//! adapter of a throw-away [`Cluster`] and a broker ([`SlurmFabric`]), a job file whose script
//! runs until the test lets it finish ([`job_waiting_for`]), and waiting for a background
//! command's exit ([`wait_exit`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::slurm::Cluster;
use crate::wait_until;

/// A directory, the Slurm adapter of a [`Cluster`] (registered there as the producer of
/// `reservation.state` and `job.batch`) and a broker using it: what `gma job submit --broker`
/// needs.
pub struct SlurmFabric {
    pub tmp: tempfile::TempDir,
    pub dir: crate::Proc,
    pub adapter: crate::Proc,
    pub broker: crate::Proc,
    /// The adapter's producer id in the directory.
    pub adapter_id: String,
}

impl SlurmFabric {
    /// Starts the three and waits until the adapter is registered; `extra` is appended to the
    /// adapter's config.
    pub fn start(cluster: &Cluster, extra: &str) -> SlurmFabric {
        let tmp = crate::tempdir();
        let dir = crate::Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
        let adapter = crate::Proc::role(
            "slurm",
            &dir.addr,
            &cluster.adapter_config(extra).expect("adapter config"),
        );
        let bcfg = tmp.path().join("broker.toml");
        std::fs::write(
            &bcfg,
            format!("listen = \"127.0.0.1:0\"\ndirectory = \"{}\"\n", dir.addr),
        )
        .unwrap();
        let broker = crate::Proc::start(
            &["broker", "--config", bcfg.to_str().unwrap()],
            "gma broker listening on",
        );
        let mut adapter_id = None;
        let found = wait_until(Duration::from_secs(30), || {
            adapter_id = crate::search_ids(&dir.addr, "job.batch")
                .and_then(|ids| ids.into_iter().find(|(_, a)| a.ends_with(&adapter.addr)))
                .map(|(id, _)| id);
            adapter_id.is_some()
        });
        assert!(found, "the adapter never registered: {}", adapter.stderr_text());
        SlurmFabric {
            tmp,
            dir,
            adapter,
            broker,
            adapter_id: adapter_id.unwrap_or_default(),
        }
    }

    /// `gma job submit --job FILE --broker B --output json`, in the background.
    pub fn submit(&self, job_file: &Path) -> crate::Proc {
        crate::Proc::start(
            &[
                "job",
                "submit",
                "--job",
                job_file.to_str().unwrap(),
                "--broker",
                &self.broker.addr,
                "--output",
                "json",
            ],
            "",
        )
    }
}

/// A job file `NAME.toml` in `dir` whose script runs until the file `go` exists (so a test
/// sees it running for as long as it needs, then releases it).
pub fn job_waiting_for(dir: &Path, name: &str, go: &Path) -> PathBuf {
    let script = format!(
        "#!/bin/sh\necho \"job $SLURM_JOB_ID started\"\nwhile [ ! -e {go} ]; do sleep 0.1; done\necho done\n",
        go = go.display()
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(
        &p,
        format!("name = \"{name}\"\ncpus = 1\nmemory_mb = 100\nwalltime_s = 300\nscript = '''{script}'''\n"),
    )
    .unwrap();
    p
}

/// Waits (up to 2 minutes) for a background `gma` command to exit; its exit code.
pub fn wait_exit(p: &mut crate::Proc) -> i32 {
    let mut code = None;
    let ended = wait_until(Duration::from_secs(120), || {
        code = p.child.try_wait().ok().flatten().map(|s| s.code().unwrap_or(-1));
        code.is_some()
    });
    assert!(ended, "the command never ended: {}", p.stderr_text());
    code.unwrap_or(-1)
}
