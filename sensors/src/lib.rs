//! gma-sensors: where events come from.
//!
//! Every probe is a pure parser over `/proc` (or `/sys`) text, unit-tested on fixture strings,
//! wrapped in a [`Sensor`] that the producer drives from an interval loop. A failing sample
//! is an error for that sensor only: the producer counts it and samples the rest.
//!
//! - [`cpu`]: `host.cpu` from `/proc/stat` deltas and `/proc/loadavg`.
//! - [`mem`]: `host.mem` from `/proc/meminfo`.
//! - [`net`]: `host.net`, one event per interface, from `/proc/net/dev` deltas.
//! - [`disk`]: `host.disk`, one event per whole block device, from `/proc/diskstats` deltas.
//! - [`tcp`]: `net.tcp` from the `Tcp:` lines of `/proc/net/snmp`.
//! - [`info`]: `host.info` (OS, kernel, size, free disk per mount, selected package versions),
//!   sent at start and every info period.
//! - [`load`]: `host.load`, the capacity summary a broker ranks hosts by.
//! - [`batch`]: `batch.queue`, one event per Slurm partition (jobs pending and running, node
//!   states); its pending jobs are `host.load`'s `queue_waiting`. Off without a batch system.
//! - [`bench`]: `host.bench`, a short CPU and memory benchmark at start and when idle; its
//!   scores are `host.load`'s `bench_specint` / `bench_specfp`.
//! - [`auth`]: `host.auth`, logins, logouts, authentications, sudo and password changes from
//!   the auth log or the journal (nothing secret). Off without either.
//! - [`snmp`]: `net.snmp.if`, `net.snmp.device`, `net.snmp.change`, network devices polled
//!   over SNMPv2c or SNMPv3 ([[snmp]] in the producer config).
//! - [`agent`]: `gma.agent`, the agent's own cost, with the [`AgentCounters`] the producer bumps.
//! - [`schemas`]: the schema of every event above, the contract of field order and units.
//! - [`sim`]: simulated hosts from a TOML file (demos, brokering, scale tests), changeable at
//!   run time through a [`sim::SimHandle`].
//! - [`process`]: `proc.event` and `proc.usage`, watched and supervised processes ([[process]]).
//! - [`SensorError`]: the one error type.

// Tests unwrap freely: a panic there is the failure report. Library code never unwraps.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod agent;
pub mod auth;
pub mod batch;
pub mod bench;
mod command;
pub mod contract;
pub mod cpu;
pub mod disk;
mod error;
pub mod info;
pub mod load;
pub mod mem;
pub mod net;
pub mod process;
mod procfs;
pub mod schemas;
pub mod sim;
pub mod snmp;
pub mod tcp;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use agent::AgentCounters;
pub use error::SensorError;
pub use gma_core::event::EventData;
pub use schemas::builtin_schemas;

/// A source of events, sampled periodically by the producer.
pub trait Sensor: Send {
    /// Stable short name for logs/metrics ("host.cpu", "sim").
    fn name(&self) -> &str;
    /// Schemas of every event name this sensor emits (registered in the directory).
    fn schemas(&self) -> Vec<gma_proto::v1::EventSchema>;
    /// Sampling period.
    fn period(&self) -> Duration;
    /// Whether the next sample may block for a while (it runs host commands, each bounded by
    /// a timeout, or a benchmark): the producer then samples it off its async workers. Asked
    /// before every sample: it may change (a sensor that turned itself off, a benchmark not
    /// due yet), and a sample after `false` must not block.
    fn blocking(&self) -> bool {
        false
    }
    /// Takes one sample at `now_ns` (UTC ns), pushing events into `out`. A delta-based sensor
    /// may push nothing on its first call (baseline). Rates divide by the time between the
    /// `now_ns` of consecutive calls; a call whose `now_ns` is not later than the previous one
    /// re-baselines and pushes nothing for the rate-based events.
    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) -> Result<(), SensorError>;
}

/// Where and how often the host sensors read.
#[derive(Debug, Clone, PartialEq)]
pub struct HostSensorConfig {
    /// The event source: the host name (`host.net`/`host.disk` append `/<iface>`, `/<device>`).
    pub source: String,
    /// Default `/proc`; tests point it at fixture files.
    pub proc_root: PathBuf,
    /// Default `/sys` (only `<sys_root>/block` is read).
    pub sys_root: PathBuf,
    /// Default `/etc/os-release`; when missing, `host.info` says os `"unknown"`.
    pub os_release: PathBuf,
    /// Period of every host sensor but `host.info`. Default 1 s.
    pub period: Duration,
    /// Period of `host.info`. Default 60 s.
    pub info_period: Duration,
    /// Where the host commands are (`df`, `dpkg-query`); `None` (the default) = `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// Every host command is killed after this. Default 5 s.
    pub command_timeout: Duration,
    /// The packages whose versions `host.info` reports in `software` (checked by
    /// [`info::validate_packages`]). Default [`info::DEFAULT_PACKAGES`].
    pub packages: Vec<String>,
    /// Run the batch-queue sensor (`batch.queue`; it turns itself off without a batch
    /// system). Default true.
    pub batch: bool,
    /// Period of `batch.queue`. Default 10 s.
    pub batch_period: Duration,
    /// The slurm.conf of the batch sensor; `None` = `$SLURM_CONF`, else `/etc/slurm`.
    pub slurm_conf: Option<PathBuf>,
    /// Run the benchmark sensor (`host.bench`). Default true.
    pub bench: bool,
    /// Run time of each benchmark kernel (three of them). Default 100 ms.
    pub bench_budget: Duration,
    /// A later benchmark run waits this long after the last, and for an idle host. Default 1 h.
    pub bench_every: Duration,
    /// Run the security-event sensor (`host.auth`; off by itself without a journal or an
    /// auth log). Default true.
    pub auth: bool,
    /// The auth log it reads; `None` = the journal when the host runs one, else
    /// `/var/log/auth.log` or `/var/log/secure`.
    pub auth_log: Option<PathBuf>,
}

impl HostSensorConfig {
    /// Defaults for the real host, publishing as `source`.
    pub fn new(source: impl Into<String>) -> HostSensorConfig {
        HostSensorConfig {
            source: source.into(),
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            os_release: PathBuf::from("/etc/os-release"),
            period: Duration::from_secs(1),
            info_period: Duration::from_secs(60),
            bin_dir: None,
            command_timeout: Duration::from_secs(5),
            packages: info::DEFAULT_PACKAGES.iter().map(|p| p.to_string()).collect(),
            batch: true,
            batch_period: Duration::from_secs(10),
            slurm_conf: None,
            bench: true,
            bench_budget: Duration::from_millis(100),
            bench_every: Duration::from_secs(3600),
            auth: true,
            auth_log: None,
        }
    }
}

impl Default for HostSensorConfig {
    /// Defaults, with the kernel's host name as the source.
    fn default() -> HostSensorConfig {
        HostSensorConfig::new(local_hostname())
    }
}

/// The kernel's host name (`/proc/sys/kernel/hostname`), or `"localhost"` if it cannot be read.
pub fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// All host sensors: `host.cpu`, `host.mem`, `host.net`, `host.disk`, `net.tcp`, `host.info`,
/// `batch.queue` (unless `cfg.batch` is off), `host.auth` (unless `cfg.auth` is off),
/// `host.bench` (unless `cfg.bench` is off), `host.load`. Nothing is read until the first sample, so a missing file shows up as that
/// sensor's sample error, never as a failure here.
pub fn host_sensors(cfg: &HostSensorConfig) -> Vec<Box<dyn Sensor>> {
    use procfs::ProcSensor;
    let commands = command::Commands {
        bin_dir: cfg.bin_dir.clone(),
        timeout: cfg.command_timeout,
    };
    let info = info::Info::new(&cfg.os_release, commands.clone(), cfg.packages.clone());
    let loadavg = cpu::LoadavgShare::default();
    let mut sensors: Vec<Box<dyn Sensor>> = vec![
        Box::new(ProcSensor::host(
            cfg,
            schemas::host_cpu(),
            cpu::Cpu::new(loadavg.clone()),
        )),
        Box::new(ProcSensor::host(cfg, schemas::host_mem(), mem::Mem)),
        Box::new(ProcSensor::host(cfg, schemas::host_net(), net::Net::default())),
        Box::new(ProcSensor::host(
            cfg,
            schemas::host_disk(),
            disk::Disk::new(&cfg.sys_root),
        )),
        Box::new(ProcSensor::host(cfg, schemas::net_tcp(), tcp::Tcp::default())),
        // Sampled every info period: the producer need not wake it more often.
        Box::new(ProcSensor::new(
            &cfg.source,
            cfg.info_period,
            &cfg.proc_root,
            schemas::host_info(),
            info,
        )),
    ];
    let queue = batch::QueueShare::default();
    if cfg.batch {
        let b = batch::Batch::new(commands.clone(), cfg.slurm_conf.clone(), queue.clone());
        sensors.push(Box::new(ProcSensor::new(
            &cfg.source,
            cfg.batch_period,
            &cfg.proc_root,
            schemas::batch_queue(),
            b,
        )));
    }
    if cfg.auth {
        let a = auth::Auth::new(commands, cfg.auth_log.clone());
        sensors.push(Box::new(ProcSensor::host(cfg, schemas::host_auth(), a)));
    }
    let scores = bench::BenchShare::default();
    if cfg.bench {
        let b = bench::Bench::new(cfg.bench_budget, cfg.bench_every, scores.clone());
        sensors.push(Box::new(ProcSensor::host(cfg, schemas::host_bench(), b)));
    }
    let load = load::Load::new(queue, scores, loadavg);
    sensors.push(Box::new(ProcSensor::host(cfg, schemas::host_load(), load)));
    sensors
}

/// The agent's own cost as `gma.agent` events from `source`; see [`agent`] for how each field
/// is measured. `counters` is shared with the producer, which adds every event and value it
/// samples.
pub fn agent_sensor(source: &str, period: Duration, counters: Arc<AgentCounters>) -> Box<dyn Sensor> {
    Box::new(agent::sensor(source, period, counters, Path::new("/proc/self")))
}

#[cfg(test)]
mod real_host_tests;
