//! Simulated hosts: virtual machines that publish `host.load`, `host.cpu`, `host.mem` and
//! `host.info` as if each were a real host, for demos, the broker and rescheduler, and scale
//! tests (a thousand hosts in one process cost a few hundred microseconds per tick).
//!
//! # File format
//!
//! TOML; unknown keys anywhere are errors that name the key.
//!
//! ```toml
//! period_ms = 1000          # optional, default 1000: the sampling period (>= 1)
//!
//! [[host]]                  # one virtual host; repeat the table for more
//! name = "hostA"            # required: the event source (printable ASCII, no spaces); unique
//! cpus = 8                  # required: logical CPUs, >= 1
//! memory_mb = 16384         # required: memory in MiB, >= 0
//! benchmarks = { specint = 2000, specfp = 1800 }   # optional; a missing score publishes NaN
//! load = 0.5                # optional: constant 1-min load (>= 0); default 0 unless `walk`
//! # walk = { min = 0.0, max = 4.0, step = 0.1, seed = 1 }
//! #                         # optional, instead of `load`: a random walk of the load, each tick
//! #                         # += uniform(-step, step), clamped to [min, max]; 0 <= min <= max,
//! #                         # step > 0; seed optional (default: derived from the name)
//! free_cpus = 0             # optional: published as is; default max(0, cpus - ceil(load))
//! queue_waiting = 10        # optional, default 0: jobs waiting (>= 0)
//! arch = "x86_64"           # optional, default "x86_64"
//! os = "Linux (simulated)"  # optional, default "Linux (simulated)"
//!
//! [[generate]]              # many hosts at once, named "<prefix>-<0000..count-1>"
//! count = 1000              # required: 1..=100000 hosts
//! prefix = "sim"            # required: name prefix
//! seed = 7                  # required: every per-host value derives from seed and index
//! cpus = 4                  # optional, default 4
//! memory_mb = 8192          # optional, default 8192
//! walk = { min = 0.0, max = 4.0, step = 0.2 }   # optional, default min 0, max cpus, step 0.25;
//! #                         # no seed here: each host's walk is seeded from `seed` and its index
//! benchmarks = { specint = 1000, specfp = 900 } # optional; each host gets these scaled by one
//! #                         # factor in [0.8, 1.2] drawn from its seed
//! ```
//!
//! # What is published
//!
//! Every tick, for every host in file order: `host.load`, `host.cpu`, `host.mem`; and on the
//! first tick and every [`INFO_EVERY_TICKS`] ticks after, `host.info`. The first tick
//! publishes a walk's start (drawn uniformly in `[min, max]`); each later tick steps first.
//!
//! - `host.cpu`: busy = min(100, load / cpus * 100) percent, split between user and system by
//!   a per-host share drawn from the seed (60-90 % user); idle = 100 - busy; the other states
//!   0. load1 = the load; load5 and load15 smooth it exponentially as the kernel does (time
//!   constants 5 and 15 minutes). running = the load rounded, procs a per-host constant.
//! - `host.mem`: used = 15 % + 70 % * min(1, load / cpus) of memory; of the rest, 40 % is
//!   cached and 5 % buffers; no swap.
//! - `host.info`: os, kernel `"simulated"`, arch, hostname = the name; boot time = the time of
//!   the first tick; `os_id`, `os_version`, `mounts` and `software` empty, `disk_free_mb` NaN.
//!
//! Values change at run time through [`SimHandle::set`] (the producer's `Simulator` service).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gma_core::event::EventData;
use gma_core::pattern::validate_source;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

use crate::procfs::event;
use crate::{schemas, Sensor, SensorError};

/// Most hosts one `[[generate]]` table may create.
pub const MAX_GENERATE: u32 = 100_000;
/// `host.info` is sent on the first tick and then every this many ticks.
pub const INFO_EVERY_TICKS: u64 = 60;
/// The keys [`SimHandle::set`] accepts.
pub const SET_KEYS: [&str; 7] = [
    "load",
    "free_cpus",
    "queue_waiting",
    "cpus",
    "memory_mb",
    "bench_specint",
    "bench_specfp",
];

const DEFAULT_PERIOD_MS: u64 = 1000;
const DEFAULT_ARCH: &str = "x86_64";
const DEFAULT_OS: &str = "Linux (simulated)";
const SIM_KERNEL: &str = "simulated";
const GENERATE_CPUS: u32 = 4;
const GENERATE_MEMORY_MB: f64 = 8192.0;
const GENERATE_STEP: f64 = 0.25;
/// Text given to [`SimConfig::from_toml`] is named this in errors.
const TEXT_ORIGIN: &str = "<sim config>";

fn default_period_ms() -> u64 {
    DEFAULT_PERIOD_MS
}

/// A simulation, as read from TOML (see the module doc). [`SimConfig::from_toml`] and
/// [`SimConfig::load`] validate; [`simulation`] also accepts an unvalidated value built in
/// code and then clamps what is out of range instead of failing.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    #[serde(default = "default_period_ms")]
    pub period_ms: u64,
    #[serde(default)]
    pub host: Vec<HostSpec>,
    #[serde(default)]
    pub generate: Vec<GenerateSpec>,
}

/// One `[[host]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub name: String,
    pub cpus: u32,
    pub memory_mb: f64,
    #[serde(default)]
    pub benchmarks: Benchmarks,
    pub load: Option<f64>,
    pub walk: Option<WalkSpec>,
    pub free_cpus: Option<f64>,
    #[serde(default)]
    pub queue_waiting: f64,
    pub arch: Option<String>,
    pub os: Option<String>,
}

/// Benchmark scores; the names are fixed by the `host.load` schema.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Benchmarks {
    pub specint: Option<f64>,
    pub specfp: Option<f64>,
}

/// A random walk of the 1-minute load.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WalkSpec {
    pub min: f64,
    pub max: f64,
    pub step: f64,
    pub seed: Option<u64>,
}

/// One `[[generate]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateSpec {
    pub count: u32,
    pub prefix: String,
    pub seed: u64,
    pub cpus: Option<u32>,
    pub memory_mb: Option<f64>,
    pub walk: Option<WalkSpec>,
    pub benchmarks: Option<Benchmarks>,
}

impl GenerateSpec {
    /// The name of host `index`: at least four digits, zero padded.
    pub fn host_name(&self, index: u32) -> String {
        format!("{}-{index:04}", self.prefix)
    }
}

impl SimConfig {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<SimConfig, SensorError> {
        SimConfig::parse(text, TEXT_ORIGIN)
    }

    /// Reads, parses and validates a TOML file.
    pub fn load(path: &Path) -> Result<SimConfig, SensorError> {
        let text = std::fs::read_to_string(path).map_err(|source| SensorError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        SimConfig::parse(&text, &path.display().to_string())
    }

    fn parse(text: &str, origin: &str) -> Result<SimConfig, SensorError> {
        let cfg: SimConfig = gma_core::config::parse_toml(text, origin).map_err(|e| match e {
            gma_core::config::ConfigError::Parse { path, message } => SensorError::Config {
                origin: path,
                message,
            },
            other => SensorError::Config {
                origin: origin.to_string(),
                message: other.to_string(),
            },
        })?;
        cfg.validate().map_err(|e| e.in_origin(origin))?;
        Ok(cfg)
    }

    /// Checks every rule of the module doc; the message names the host or table at fault.
    pub fn validate(&self) -> Result<(), SensorError> {
        if self.period_ms == 0 {
            return Err(invalid("period_ms must be at least 1"));
        }
        if self.host.is_empty() && self.generate.is_empty() {
            return Err(invalid("declares no hosts; add a [[host]] or [[generate]] table"));
        }
        let mut names: HashSet<&str> = HashSet::new();
        for h in &self.host {
            let at = |e: SensorError| e.within(&format!("host {:?}", h.name));
            validate_source(&h.name).map_err(|e| at(invalid(e.to_string())))?;
            if h.cpus == 0 {
                return Err(at(invalid("cpus must be at least 1")));
            }
            non_negative("memory_mb", h.memory_mb).map_err(at)?;
            validate_benchmarks(&h.benchmarks).map_err(at)?;
            if let Some(load) = h.load {
                non_negative("load", load).map_err(at)?;
                if h.walk.is_some() {
                    return Err(at(invalid("give either load (constant) or walk, not both")));
                }
            }
            if let Some(w) = &h.walk {
                validate_walk(w).map_err(at)?;
            }
            if let Some(f) = h.free_cpus {
                non_negative("free_cpus", f).map_err(at)?;
            }
            non_negative("queue_waiting", h.queue_waiting).map_err(at)?;
            if !names.insert(&h.name) {
                return Err(invalid(duplicate(&h.name)));
            }
        }
        let mut generated: HashSet<String> = HashSet::new();
        for (i, g) in self.generate.iter().enumerate() {
            let at = |e: SensorError| e.within(&format!("generate #{} (prefix {:?})", i + 1, g.prefix));
            if g.count == 0 || g.count > MAX_GENERATE {
                return Err(at(invalid(format!(
                    "count must be 1..={MAX_GENERATE}, not {}",
                    g.count
                ))));
            }
            // Every name is the prefix plus "-" and digits: checking the shortest and the
            // longest checks them all.
            for index in [0, g.count - 1] {
                validate_source(&g.host_name(index)).map_err(|e| at(invalid(e.to_string())))?;
            }
            if g.cpus == Some(0) {
                return Err(at(invalid("cpus must be at least 1")));
            }
            if let Some(m) = g.memory_mb {
                non_negative("memory_mb", m).map_err(at)?;
            }
            if let Some(w) = &g.walk {
                if w.seed.is_some() {
                    return Err(at(invalid(
                        "walk.seed is not allowed here; each host's walk is seeded from \
                                   the table's seed and the host's index",
                    )));
                }
                validate_walk(w).map_err(at)?;
            }
            if let Some(b) = &g.benchmarks {
                validate_benchmarks(b).map_err(at)?;
            }
            for index in 0..g.count {
                let name = g.host_name(index);
                if names.contains(name.as_str()) || !generated.insert(name.clone()) {
                    return Err(invalid(duplicate(&name)));
                }
            }
        }
        Ok(())
    }
}

/// A config error in simulation text; [`SimConfig::load`] names the file instead.
fn invalid(message: impl Into<String>) -> SensorError {
    SensorError::config(TEXT_ORIGIN, message)
}

fn duplicate(name: &str) -> String {
    format!("duplicate host name {name:?}; names must be unique across [[host]] and [[generate]]")
}

fn non_negative(what: &str, v: f64) -> Result<(), SensorError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(format!("{what} must be a finite number >= 0, not {v}")))
    }
}

fn validate_walk(w: &WalkSpec) -> Result<(), SensorError> {
    non_negative("walk.min", w.min)?;
    non_negative("walk.max", w.max)?;
    if w.min > w.max {
        return Err(invalid(format!(
            "walk.min ({}) must not exceed walk.max ({})",
            w.min, w.max
        )));
    }
    if !(w.step.is_finite() && w.step > 0.0) {
        return Err(invalid(format!(
            "walk.step must be a finite number > 0, not {}",
            w.step
        )));
    }
    Ok(())
}

fn validate_benchmarks(b: &Benchmarks) -> Result<(), SensorError> {
    for (what, v) in [("benchmarks.specint", b.specint), ("benchmarks.specfp", b.specfp)] {
        if let Some(v) = v {
            non_negative(what, v)?;
        }
    }
    Ok(())
}

/// `x` if it is a finite non-negative number, else `fallback` (for unvalidated configs).
fn sane(x: f64, fallback: f64) -> f64 {
    if x.is_finite() && x >= 0.0 {
        x
    } else {
        fallback
    }
}

/// Clamp that never panics (`f64::clamp` does when `lo > hi` or on NaN).
fn clamp(x: f64, lo: f64, hi: f64) -> f64 {
    x.max(lo).min(hi)
}

/// A deterministic random walk: the same seed gives the same sequence on every platform
/// (ChaCha8 is specified bit for bit; rand's `StdRng` is not promised to stay the same).
struct RandomWalk {
    min: f64,
    max: f64,
    step: f64,
    rng: ChaCha8Rng,
}

impl RandomWalk {
    /// Also returns the start, drawn uniformly in `[min, max]`.
    fn new(spec: &WalkSpec, seed: u64) -> (RandomWalk, f64) {
        let min = sane(spec.min, 0.0);
        let max = sane(spec.max, min).max(min);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let start = min + (max - min) * rng.random::<f64>();
        let walk = RandomWalk {
            min,
            max,
            step: sane(spec.step, 0.0),
            rng,
        };
        (walk, start)
    }

    fn next(&mut self, load: f64) -> f64 {
        // uniform in [-step, step); written out so a zero step cannot make an empty range
        let delta = (self.rng.random::<f64>() * 2.0 - 1.0) * self.step;
        clamp(load + delta, self.min, self.max)
    }
}

/// FNV-1a: a stable seed from a host name (std's hasher is randomised per process).
fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64 finaliser: spreads `seed + index` so neighbouring seeds give unrelated hosts.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Per-host constants (user share of busy time, task count, benchmark factor) come from their
/// own stream so they do not shift the walk's sequence.
fn traits_rng(host_seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(host_seed ^ 0x5eed_7a17))
}

/// One virtual host's state.
struct SimHost {
    /// The event source, formatted once at start.
    source: String,
    cpus: f64,
    memory_mb: f64,
    /// specint, specfp; NaN = unknown.
    bench: [f64; 2],
    load: f64,
    walk: Option<RandomWalk>,
    free_cpus: Option<f64>,
    queue_waiting: f64,
    load5: f64,
    load15: f64,
    user_share: f64,
    procs: f64,
    os: String,
    arch: String,
}

impl SimHost {
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        cpus: u32,
        memory_mb: f64,
        bench: [f64; 2],
        load: Option<f64>,
        walk: Option<(&WalkSpec, u64)>,
        host_seed: u64,
        os: &str,
        arch: &str,
    ) -> SimHost {
        let mut traits = traits_rng(host_seed);
        let user_share = 0.6 + 0.3 * traits.random::<f64>();
        let procs = traits.random_range(80..=400) as f64;
        let (walk, load) = match walk {
            Some((spec, seed)) => {
                let (w, start) = RandomWalk::new(spec, seed);
                (Some(w), start)
            }
            None => (None, sane(load.unwrap_or(0.0), 0.0)),
        };
        SimHost {
            source: name,
            cpus: f64::from(cpus.max(1)),
            memory_mb: sane(memory_mb, 0.0),
            bench,
            load,
            walk,
            free_cpus: None,
            queue_waiting: 0.0,
            load5: load,
            load15: load,
            user_share,
            procs,
            os: os.to_string(),
            arch: arch.to_string(),
        }
    }

    fn free_cpus(&self) -> f64 {
        self.free_cpus
            .unwrap_or_else(|| (self.cpus - self.load.ceil()).max(0.0))
    }

    fn busy_fraction(&self) -> f64 {
        (self.load / self.cpus).min(1.0)
    }

    fn load_numbers(&self) -> Vec<f64> {
        vec![
            self.load,
            self.free_cpus(),
            self.cpus,
            self.queue_waiting,
            self.memory_mb,
            self.bench[0],
            self.bench[1],
        ]
    }

    fn cpu_numbers(&self) -> Vec<f64> {
        let busy = self.busy_fraction() * 100.0;
        let user = busy * self.user_share;
        vec![
            user,
            0.0,
            busy - user,
            100.0 - busy,
            0.0,
            0.0,
            0.0,
            0.0,
            self.load,
            self.load5,
            self.load15,
            self.load.round(),
            self.procs,
        ]
    }

    fn mem_numbers(&self) -> Vec<f64> {
        let used = 0.15 + 0.7 * self.busy_fraction();
        let total = self.memory_mb;
        let available = total * (1.0 - used);
        let cached = available * 0.4;
        let buffers = available * 0.05;
        vec![
            total,
            available - cached - buffers,
            available,
            buffers,
            cached,
            0.0,
            0.0,
            used * 100.0,
        ]
    }
}

fn bench(b: &Benchmarks, factor: f64) -> [f64; 2] {
    [
        b.specint.map_or(f64::NAN, |v| sane(v, 0.0) * factor),
        b.specfp.map_or(f64::NAN, |v| sane(v, 0.0) * factor),
    ]
}

fn build_hosts(cfg: &SimConfig) -> Vec<SimHost> {
    let mut hosts = Vec::new();
    for h in &cfg.host {
        let seed = h.walk.and_then(|w| w.seed).unwrap_or_else(|| name_seed(&h.name));
        let mut host = SimHost::new(
            h.name.clone(),
            h.cpus,
            h.memory_mb,
            bench(&h.benchmarks, 1.0),
            h.load,
            h.walk.as_ref().map(|w| (w, seed)),
            seed,
            h.os.as_deref().unwrap_or(DEFAULT_OS),
            h.arch.as_deref().unwrap_or(DEFAULT_ARCH),
        );
        host.free_cpus = h.free_cpus.map(|f| sane(f, 0.0));
        host.queue_waiting = sane(h.queue_waiting, 0.0);
        hosts.push(host);
    }
    for g in &cfg.generate {
        let cpus = g.cpus.unwrap_or(GENERATE_CPUS).max(1);
        let walk = g.walk.unwrap_or(WalkSpec {
            min: 0.0,
            max: f64::from(cpus),
            step: GENERATE_STEP,
            seed: None,
        });
        let count = g.count.min(MAX_GENERATE);
        hosts.reserve(count as usize);
        for index in 0..count {
            let seed = mix(g.seed ^ mix(u64::from(index)));
            let factor = g
                .benchmarks
                .map_or(1.0, |_| 0.8 + 0.4 * traits_rng(seed ^ 1).random::<f64>());
            hosts.push(SimHost::new(
                g.host_name(index),
                cpus,
                g.memory_mb.unwrap_or(GENERATE_MEMORY_MB),
                bench(&g.benchmarks.unwrap_or_default(), factor),
                None,
                Some((&walk, seed)),
                seed,
                DEFAULT_OS,
                DEFAULT_ARCH,
            ));
        }
    }
    hosts
}

struct SimState {
    hosts: Vec<SimHost>,
    index: HashMap<String, usize>,
    tick: u64,
    boot_time_s: Option<f64>,
}

/// Changes a running simulation; clones share it with the sensor.
#[derive(Clone)]
pub struct SimHandle {
    state: Arc<Mutex<SimState>>,
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHandle")
            .field("hosts", &self.state.lock().hosts.len())
            .finish()
    }
}

#[derive(Clone, Copy)]
enum Key {
    Load,
    FreeCpus,
    QueueWaiting,
    Cpus,
    MemoryMb,
    Bench(usize),
}

impl Key {
    fn parse(key: &str) -> Option<Key> {
        Some(match key {
            "load" => Key::Load,
            "free_cpus" => Key::FreeCpus,
            "queue_waiting" => Key::QueueWaiting,
            "cpus" => Key::Cpus,
            "memory_mb" => Key::MemoryMb,
            "bench_specint" => Key::Bench(0),
            "bench_specfp" => Key::Bench(1),
            _ => return None,
        })
    }
}

impl SimHandle {
    /// Changes a running host's values: keys `load`, `free_cpus`, `queue_waiting`, `cpus`,
    /// `memory_mb`, `bench_specint`, `bench_specfp`. Setting `load` makes it constant (stops
    /// the walk); setting `free_cpus` fixes it (no longer derived from the load). All values
    /// are checked before any is applied, so a rejected call changes nothing.
    pub fn set(&self, host: &str, values: &[(String, f64)]) -> Result<(), SensorError> {
        let mut checked = Vec::with_capacity(values.len());
        for (key, v) in values {
            let k = Key::parse(key).ok_or_else(|| {
                SensorError::Sim(format!(
                    "unknown key {:?}; valid keys: {}",
                    gma_core::clip(key, 80),
                    SET_KEYS.join(", ")
                ))
            })?;
            if !v.is_finite() || *v < 0.0 {
                return Err(SensorError::Sim(format!(
                    "{key} must be a finite number >= 0, not {v}"
                )));
            }
            if matches!(k, Key::Cpus) && *v < 1.0 {
                return Err(SensorError::Sim(format!("cpus must be at least 1, not {v}")));
            }
            checked.push((k, *v));
        }
        let mut st = self.state.lock();
        let i = *st.index.get(host).ok_or_else(|| {
            SensorError::Sim(format!(
                "unknown host {host:?}; the simulation has {} hosts (list them with hosts())",
                st.hosts.len()
            ))
        })?;
        let h = &mut st.hosts[i];
        for (k, v) in checked {
            match k {
                Key::Load => {
                    h.load = v;
                    h.walk = None;
                }
                Key::FreeCpus => h.free_cpus = Some(v),
                Key::QueueWaiting => h.queue_waiting = v,
                Key::Cpus => h.cpus = v,
                Key::MemoryMb => h.memory_mb = v,
                Key::Bench(b) => h.bench[b] = v,
            }
        }
        Ok(())
    }

    /// Host names, in file order.
    pub fn hosts(&self) -> Vec<String> {
        self.state.lock().hosts.iter().map(|h| h.source.clone()).collect()
    }

    /// A host's current settable values, keyed as in [`SimHandle::set`] (`free_cpus` as
    /// published, derived or fixed; an unknown benchmark is NaN). `None` for an unknown host.
    pub fn get(&self, host: &str) -> Option<Vec<(&'static str, f64)>> {
        let st = self.state.lock();
        let h = &st.hosts[*st.index.get(host)?];
        Some(vec![
            ("load", h.load),
            ("free_cpus", h.free_cpus()),
            ("queue_waiting", h.queue_waiting),
            ("cpus", h.cpus),
            ("memory_mb", h.memory_mb),
            ("bench_specint", h.bench[0]),
            ("bench_specfp", h.bench[1]),
        ])
    }
}

struct SimSensor {
    state: Arc<Mutex<SimState>>,
    period: Duration,
    /// Per-tick smoothing factors of load5/load15: 1 - exp(-period / time constant).
    alpha5: f64,
    alpha15: f64,
}

impl Sensor for SimSensor {
    fn name(&self) -> &str {
        "sim"
    }

    fn schemas(&self) -> Vec<gma_proto::v1::EventSchema> {
        vec![
            schemas::host_load(),
            schemas::host_cpu(),
            schemas::host_mem(),
            schemas::host_info(),
        ]
    }

    fn period(&self) -> Duration {
        self.period
    }

    fn sample(&mut self, now_ns: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let tick = st.tick;
        let info = tick.is_multiple_of(INFO_EVERY_TICKS);
        let boot_time_s = *st.boot_time_s.get_or_insert((now_ns / 1_000_000_000) as f64);
        out.reserve(st.hosts.len() * if info { 4 } else { 3 });
        for h in &mut st.hosts {
            if tick > 0 {
                if let Some(w) = &mut h.walk {
                    h.load = w.next(h.load);
                }
            }
            h.load5 += self.alpha5 * (h.load - h.load5);
            h.load15 += self.alpha15 * (h.load - h.load15);
            out.push(event(
                schemas::HOST_LOAD,
                &h.source,
                now_ns,
                h.load_numbers(),
                Vec::new(),
            ));
            out.push(event(
                schemas::HOST_CPU,
                &h.source,
                now_ns,
                h.cpu_numbers(),
                Vec::new(),
            ));
            out.push(event(
                schemas::HOST_MEM,
                &h.source,
                now_ns,
                h.mem_numbers(),
                Vec::new(),
            ));
            if info {
                // No os id, mounts or packages are simulated: empty, and NaN free disk.
                let strings = vec![
                    h.os.clone(),
                    SIM_KERNEL.to_string(),
                    h.arch.clone(),
                    h.source.clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ];
                let numbers = vec![h.cpus, h.memory_mb, boot_time_s, f64::NAN];
                out.push(event(schemas::HOST_INFO, &h.source, now_ns, numbers, strings));
            }
        }
        st.tick += 1;
        Ok(())
    }
}

/// Starts a simulation: the sensor to sample and a handle to change it while it runs.
pub fn simulation(cfg: SimConfig) -> (Box<dyn Sensor>, SimHandle) {
    let hosts = build_hosts(&cfg);
    let mut index = HashMap::with_capacity(hosts.len());
    for (i, h) in hosts.iter().enumerate() {
        // an unvalidated config may repeat a name: the first one wins for set()
        index.entry(h.source.clone()).or_insert(i);
    }
    let state = Arc::new(Mutex::new(SimState {
        hosts,
        index,
        tick: 0,
        boot_time_s: None,
    }));
    let period = Duration::from_millis(cfg.period_ms.max(1));
    let secs = period.as_secs_f64();
    let sensor = SimSensor {
        state: state.clone(),
        period,
        alpha5: 1.0 - (-secs / 300.0).exp(),
        alpha15: 1.0 - (-secs / 900.0).exp(),
    };
    (Box::new(sensor), SimHandle { state })
}

#[cfg(test)]
mod tests;
