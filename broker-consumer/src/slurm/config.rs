//! `gma slurm --config FILE`: the Slurm adapter's configuration.
//!
//! ```toml
//! listen = "127.0.0.1:7410"        # optional (flag --listen wins)
//! directory = "127.0.0.1:7000"     # optional: register as a producer of reservation.state, job.batch
//! source = "slurm"                 # source of the events; also in the reservation names
//! slurm_conf = "/etc/slurm/slurm.conf"  # SLURM_CONF of the commands (default: Slurm's own)
//! bin_dir = "/usr/bin"             # where scontrol, sbatch, squeue, scancel are (default: PATH)
//! command_timeout_ms = 10000       # every Slurm command is killed after this
//! poll_ms = 500                    # how often jobs and reservations are read back
//! job_dir = "/var/spool/gma-slurm" # scripts and default outputs (default: a temp dir)
//! user = "root"                    # the Unix user the reservations admit (default: the adapter's)
//! nodes = ["n1"]                   # the nodes offered for reservation (default: every node)
//! software = ["python3"]           # software installed for jobs (a job's requirements match it)
//! max_jobs = 10000                 # jobs tracked at once (done jobs are forgotten after an hour)
//! slots_poll_ms = 5000             # rm.slots: how often nodes and reservations are read for the
//!                                  # free slots (published when they change; 0 = publish none)
//! slot_s = 3600                    # rm.slots: free time is offered in slots of at most this
//! price = 1.0                      # rm.slots: service units per processor-hour
//! [prices]                         # rm.slots: per node (default: price)
//! n1 = 2.0
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::Error;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    pub listen: Option<String>,
    /// The registration keys of the manager's record ([`gma_core::registration::Registration`]):
    /// `directory` (none = not registered), `id`, `advertise`, `site`, `org`, `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    pub source: String,
    pub slurm_conf: Option<PathBuf>,
    pub bin_dir: Option<PathBuf>,
    pub command_timeout_ms: u64,
    pub poll_ms: u64,
    pub job_dir: Option<PathBuf>,
    pub user: String,
    pub nodes: Vec<String>,
    pub software: Vec<String>,
    pub max_jobs: usize,
    /// `rm.slots`: how often Slurm's nodes and reservations are read for the free slots
    /// (0 = no slots published).
    pub slots_poll_ms: u64,
    /// `rm.slots`: free time is offered in slots of at most this many seconds.
    pub slot_s: i64,
    /// `rm.slots`: service units per processor-hour.
    pub price: f64,
    /// `rm.slots`: the price per node.
    pub prices: std::collections::BTreeMap<String, f64>,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            listen: None,
            registration: Default::default(),
            source: "slurm".into(),
            slurm_conf: None,
            bin_dir: None,
            command_timeout_ms: 10_000,
            poll_ms: 500,
            job_dir: None,
            user: String::new(),
            nodes: Vec::new(),
            software: Vec::new(),
            max_jobs: 10_000,
            slots_poll_ms: 5000,
            slot_s: 3600,
            price: 1.0,
            prices: Default::default(),
            endpoint: Default::default(),
        }
    }
}

impl SlurmConfig {
    /// Checks every field; the message names the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::Simres(m.to_string()));
        gma_core::pattern::validate_source(&self.source)
            .map_err(|e| Error::Simres(format!("source: {e}")))?;
        if !(100..=600_000).contains(&self.command_timeout_ms) {
            return bad("command_timeout_ms: must be within 100..=600000");
        }
        if !(10..=60_000).contains(&self.poll_ms) {
            return bad("poll_ms: must be within 10..=60000");
        }
        if !(1..=1_000_000).contains(&self.max_jobs) {
            return bad("max_jobs: must be within 1..=1000000");
        }
        if self.user.len() > 64 || self.user.contains(|c: char| c.is_whitespace() || c == ',') {
            return bad("user: one Unix user name (no spaces or commas)");
        }
        if let Some(d) = &self.job_dir {
            if !d.is_absolute() {
                return bad("job_dir: must be an absolute path");
            }
        }
        if self.slots_poll_ms != 0 && !(100..=3_600_000).contains(&self.slots_poll_ms) {
            return bad("slots_poll_ms: must be 0 (no slots) or within 100..=3600000");
        }
        if !(60..=86_400).contains(&self.slot_s) {
            return bad("slot_s: must be within 60..=86400");
        }
        if !(self.price.is_finite() && self.price >= 0.0) {
            return bad("price: must be a finite number >= 0");
        }
        if let Some((name, _)) = self.prices.iter().find(|(_, p)| !(p.is_finite() && **p >= 0.0)) {
            return bad(&format!("prices.{name}: must be a finite number >= 0"));
        }
        if self.prices.len() > 10_000 {
            return bad("prices: at most 10000 nodes");
        }
        for (what, list) in [("nodes", &self.nodes), ("software", &self.software)] {
            if list.len() > 10_000 || list.iter().any(|s| s.is_empty() || s.len() > 256) {
                return bad(&format!("{what}: at most 10000 entries of 1..=256 bytes"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configs_name_the_field() {
        for (text, want) in [
            ("poll_ms = 1\n", "poll_ms"),
            ("command_timeout_ms = 0\n", "command_timeout_ms"),
            ("job_dir = \"rel\"\n", "job_dir"),
            ("user = \"a,b\"\n", "user"),
            ("nodes = [\"\"]\n", "nodes"),
            ("slot_s = 5\n", "slot_s"),
            ("slots_poll_ms = 5\n", "slots_poll_ms"),
            ("price = -1\n", "price"),
            ("[prices]\nn1 = nan\n", "prices.n1"),
        ] {
            let c: SlurmConfig = gma_core::config::parse_toml(text, "slurm.toml").unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let e = gma_core::config::parse_toml::<SlurmConfig>("pol_ms = 5\n", "s").unwrap_err();
        assert!(e.to_string().contains("unknown field `pol_ms`"), "{e}");
        let ok: SlurmConfig = gma_core::config::parse_toml("", "s").unwrap();
        ok.validate().unwrap();
    }
}
