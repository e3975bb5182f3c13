//! Runtime control of a producer's sensors (docs/control.md): the `Control` gRPC service lists
//! the sensors with their periods and measured cost, sets a sensor's period, enables or
//! disables a sensor, adds or removes a process watch, and (on a monitor) adds or removes a rule. Every call is the policy action
//! `producer.control` on the resource naming the operation ([`OP_LIST`] ...), every call (allowed
//! or denied) is published as a `gma.audit` event, and every change is written to
//! `<state_dir>/control.json` (temporary file, fsync, rename, fsync of the directory) and
//! applied again at the next start.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_core::authz::{Action, Decision, Identity};
use gma_core::event::{schema, text, EventData};
use gma_core::time::now_ns;
use gma_core::Refuse;
use gma_proto::v1 as pb;
use gma_sensors::process::ProcessWatch;
use gma_sensors::Sensor;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::hub::Hub;

/// The audit event's name.
pub const GMA_AUDIT: &str = "gma.audit";
/// The resources of `producer.control`: one per operation.
pub const OP_LIST: &str = "sensors.list";
pub const OP_PERIOD: &str = "sensor.period";
pub const OP_ENABLE: &str = "sensor.enable";
pub const OP_DISABLE: &str = "sensor.disable";
pub const OP_WATCH: &str = "watch.add";
pub const OP_UNWATCH: &str = "watch.remove";
pub const OP_RULE_ADD: &str = "rule.add";
pub const OP_RULE_REMOVE: &str = "rule.remove";
/// The largest rule a request may carry (TOML text).
pub const MAX_RULE_BYTES: usize = 16 * 1024;
/// At most this many rules added at run time.
pub const MAX_RUNTIME_RULES: usize = 64;

/// Where a monitor's rules run: the monitor role gives its producer one, so that `AddRule` and
/// `RemoveRule` reach its engine. Errors are refusals with their code.
pub trait RuleHost: Send + Sync {
    /// Validates and starts the rule in `toml` (one `[[rule]]` table); returns its name and a
    /// description.
    fn add(&self, toml: &str) -> Result<(String, String), gma_core::Refusal>;
    /// Stops a rule added with [`RuleHost::add`]; returns its description.
    fn remove(&self, name: &str) -> Result<String, gma_core::Refusal>;
    /// Every rule, described.
    fn list(&self) -> Vec<String>;
}
/// The longest period a sensor may be given (1 h), ms.
pub const MAX_PERIOD_MS: u64 = 3_600_000;
/// At most this many process watches added at run time.
pub const MAX_RUNTIME_WATCHES: usize = 64;
/// A runtime watch's sensor is named `process/<watch name>`.
pub const WATCH_PREFIX: &str = "process/";
/// The state file in `state_dir`.
pub const STATE_FILE: &str = "control.json";

/// `gma.audit` (source = the producer): one control call, allowed or denied.
pub fn audit_schema() -> pb::EventSchema {
    schema(
        GMA_AUDIT,
        "one runtime control call on this producer: who asked what, the setting before and after, \
         and whether the policy allowed it",
        vec![
            text("who", "the authenticated identity (CN/O), or anonymous"),
            text(
                "action",
                "the policy action and operation (producer.control:sensor.period)",
            ),
            text(
                "target",
                "the sensor or watch the call names (empty for a listing)",
            ),
            text(
                "before",
                "the setting before the call (empty when denied or refused)",
            ),
            text(
                "after",
                "the setting after the call (empty when denied or refused)",
            ),
            text(
                "outcome",
                "allowed, denied (by the policy) or refused (bad input: the message)",
            ),
        ],
    )
}

/// How a sensor runs: its period and whether it samples at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub period: Duration,
    pub enabled: bool,
}

impl Setting {
    fn describe(&self) -> String {
        format!("period_ms={} enabled={}", self.period.as_millis(), self.enabled)
    }
}

/// One running sensor as the control service sees it: its setting (which its loop follows) and
/// its measured cost.
pub struct Slot {
    pub name: String,
    pub configured: Duration,
    setting: watch::Sender<Setting>,
    /// Samples taken and the wall time they took, ns.
    pub samples: AtomicU64,
    pub sample_ns: AtomicU64,
    runtime_watch: bool,
}

impl Slot {
    /// Counts one sample that took `took`.
    pub fn record(&self, took: Duration) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        self.sample_ns
            .fetch_add(took.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    pub fn setting(&self) -> Setting {
        *self.setting.borrow()
    }
}

/// What `control.json` keeps: the changes made through the service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct State {
    /// Period overrides, ms, by sensor name.
    pub periods: BTreeMap<String, u64>,
    /// Disabled sensors.
    pub disabled: BTreeSet<String>,
    /// Process watches added at run time.
    pub watches: Vec<WatchSpec>,
    /// Monitor rules added at run time: name and TOML text.
    pub rules: Vec<RuleSpec>,
}

/// A monitor rule added at run time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub name: String,
    pub toml: String,
}

/// A process watch added at run time (a `[[process]]` table without `command`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchSpec {
    pub name: String,
    pub comm: Option<String>,
    pub cmdline: Option<String>,
    pub pid: Option<u32>,
    pub period_ms: u64,
    pub cpu_pct_max: Option<f64>,
    pub rss_mb_max: Option<f64>,
}

impl WatchSpec {
    fn watch(&self) -> ProcessWatch {
        ProcessWatch {
            name: self.name.clone(),
            comm: self.comm.clone(),
            cmdline: self.cmdline.clone(),
            pid: self.pid,
            command: None,
            restart: false,
            cpu_pct_max: self.cpu_pct_max,
            rss_mb_max: self.rss_mb_max,
        }
    }

    fn describe(&self) -> String {
        let sel = if let Some(c) = &self.comm {
            format!("comm={c:?}")
        } else if let Some(c) = &self.cmdline {
            format!("cmdline={c:?}")
        } else {
            format!("pid={}", self.pid.unwrap_or(0))
        };
        format!("watch {:?} {sel} period_ms={}", self.name, self.period_ms)
    }
}

/// Reads the state file in `dir` (none yet = the empty state).
pub fn load_state(dir: &Path) -> Result<State, Error> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            Error::Config(format!(
                "{}: {e}; fix or remove the file (it holds the control changes)",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
        Err(e) => Err(Error::Config(format!("cannot read {}: {e}", path.display()))),
    }
}

/// Writes `state` to the state file in `dir` atomically: a temporary file written and fsynced,
/// renamed over the old one, the directory fsynced.
pub fn save_state(dir: &Path, state: &State) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(STATE_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Checks a period given through the service or found in the state file.
pub fn check_period(ms: u64) -> Result<Duration, Error> {
    if ms == 0 || ms > MAX_PERIOD_MS {
        return Err(Error::invalid_argument(format!(
            "period_ms {ms} is out of range: give 1..={MAX_PERIOD_MS} (1 ms to 1 h)"
        )));
    }
    Ok(Duration::from_millis(ms))
}

/// Spawns the loop of a sensor (the producer's `sensor_loop`).
pub type Spawner = Arc<dyn Fn(Box<dyn Sensor>, Arc<Slot>, watch::Receiver<Setting>) + Send + Sync>;

/// The sensors of one producer and the control state.
pub struct Control {
    slots: Mutex<BTreeMap<String, Arc<Slot>>>,
    state: Mutex<State>,
    state_dir: Option<PathBuf>,
    hub: Arc<Hub>,
    source: String,
    default_period: Duration,
    started: Instant,
    spawner: Mutex<Option<Spawner>>,
    /// Serializes the changes (read state, apply, persist) so the file follows the calls.
    change: tokio::sync::Mutex<()>,
    /// Sensors the CPU budget slowed, with the period they had before (not persisted).
    slowed: Mutex<BTreeMap<String, u64>>,
    /// The agent's CPU at the last budget check, percent of one CPU.
    measured: Mutex<Option<f64>>,
    /// cpu_budget_pct, when the producer keeps one.
    pub budget_pct: Option<f64>,
    /// A monitor's rules.
    rule_host: Mutex<Option<Arc<dyn RuleHost>>>,
}

/// One sensor over the last budget check (what [`Control::costs`] measures).
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    pub name: String,
    /// Its samples' wall time over the check, percent of the check.
    pub cost_pct: f64,
    pub period_ms: u64,
    /// The period it had before the budget slowed it (none: not slowed).
    pub base_ms: Option<u64>,
    pub enabled: bool,
}

impl Control {
    /// The control of a producer whose source is `source`, with the state read from `state_dir`
    /// (none: changes are kept until the producer stops).
    pub fn new(
        hub: Arc<Hub>,
        source: String,
        default_period: Duration,
        state_dir: Option<PathBuf>,
        budget_pct: Option<f64>,
    ) -> Result<Arc<Control>, Error> {
        let state = match &state_dir {
            Some(d) => load_state(d)?,
            None => State::default(),
        };
        for (name, ms) in &state.periods {
            check_period(*ms).map_err(|e| Error::Config(format!("state file, sensor {name:?}: {e}")))?;
        }
        hub.add_schemas(&[audit_schema()])
            .map_err(|e| Error::Config(format!("gma.audit: {e}")))?;
        Ok(Arc::new(Control {
            slots: Mutex::new(BTreeMap::new()),
            state: Mutex::new(state),
            state_dir,
            hub,
            source,
            default_period,
            started: Instant::now(),
            spawner: Mutex::new(None),
            change: tokio::sync::Mutex::new(()),
            slowed: Mutex::new(BTreeMap::new()),
            measured: Mutex::new(None),
            budget_pct,
            rule_host: Mutex::new(None),
        }))
    }

    /// Sets how runtime watches are started (the producer's sensor loop).
    pub fn set_spawner(&self, spawner: Spawner) {
        *self.spawner.lock() = Some(spawner);
    }

    /// Registers a sensor configured with `configured`; returns its slot and the receiver its
    /// loop follows, with the persisted period and enabled flag applied.
    pub fn register(&self, name: &str, configured: Duration) -> (Arc<Slot>, watch::Receiver<Setting>) {
        self.register_as(name, configured, false)
    }

    fn register_as(
        &self,
        name: &str,
        configured: Duration,
        runtime_watch: bool,
    ) -> (Arc<Slot>, watch::Receiver<Setting>) {
        let state = self.state.lock();
        let period = state
            .periods
            .get(name)
            .and_then(|ms| check_period(*ms).ok())
            .unwrap_or(configured);
        let enabled = !state.disabled.contains(name);
        drop(state);
        let (tx, rx) = watch::channel(Setting { period, enabled });
        let slot = Arc::new(Slot {
            name: name.to_string(),
            configured,
            setting: tx,
            samples: AtomicU64::new(0),
            sample_ns: AtomicU64::new(0),
            runtime_watch,
        });
        self.slots.lock().insert(name.to_string(), slot.clone());
        (slot, rx)
    }

    /// Starts the process watches persisted in the state file (after [`Control::set_spawner`]).
    /// A watch that cannot start any more (a bad pattern in a hand-edited file) is logged and
    /// skipped.
    pub fn start_persisted_watches(&self) {
        let state = self.state.lock().clone();
        let slots = self.slots.lock().keys().cloned().collect::<BTreeSet<String>>();
        let stale = state
            .periods
            .keys()
            .chain(state.disabled.iter())
            .filter(|n| !n.starts_with(WATCH_PREFIX) && !slots.contains(*n));
        for name in stale {
            tracing::warn!(
                sensor = %name,
                "the control state names a sensor this producer does not run; the entry is kept and unused"
            );
        }
        for w in state.watches {
            if let Err(e) = self.start_watch(&w) {
                tracing::warn!(watch = %w.name, error = %e, "cannot start a persisted process watch");
            }
        }
    }

    fn start_watch(&self, w: &WatchSpec) -> Result<(), Error> {
        let spawner = self.spawner.lock().clone().ok_or_else(|| {
            Error::failed_precondition("this producer is not running its sensors yet; retry")
        })?;
        let period = if w.period_ms == 0 {
            self.default_period
        } else {
            check_period(w.period_ms)?
        };
        let sensor = gma_sensors::process::ProcessSensor::new(
            &self.source,
            period,
            vec![w.watch()],
            PathBuf::from("/proc"),
        )
        .map_err(|e| Error::invalid_argument(e.to_string()))?;
        let (slot, rx) = self.register_as(&format!("{WATCH_PREFIX}{}", w.name), period, true);
        spawner(Box::new(sensor), slot, rx);
        Ok(())
    }

    /// The sensors and their cost, the agent's CPU and its budget.
    pub fn listing(&self) -> pb::ListSensorsResponse {
        pb::ListSensorsResponse {
            sensors: self.list(),
            agent_cpu_pct: self.measured.lock().unwrap_or(-1.0),
            cpu_budget_pct: self.budget_pct.unwrap_or(0.0),
            rules: self
                .rule_host
                .lock()
                .as_ref()
                .map(|h| h.list())
                .unwrap_or_default(),
        }
    }

    /// The sensors and their cost.
    pub fn list(&self) -> Vec<pb::SensorInfo> {
        let up = self.started.elapsed().as_nanos().max(1) as f64;
        let slowed = self.slowed.lock().clone();
        self.slots
            .lock()
            .values()
            .map(|s| {
                let set = s.setting();
                let n = s.samples.load(Ordering::Relaxed);
                let ns = s.sample_ns.load(Ordering::Relaxed) as f64;
                pb::SensorInfo {
                    name: s.name.clone(),
                    period_ms: set.period.as_millis() as u64,
                    configured_period_ms: s.configured.as_millis() as u64,
                    enabled: set.enabled,
                    samples: n,
                    mean_sample_us: if n == 0 { 0.0 } else { ns / n as f64 / 1000.0 },
                    cost_pct: ns / up * 100.0,
                    runtime_watch: s.runtime_watch,
                    slowed_from_ms: slowed.get(&s.name).copied().unwrap_or(0),
                }
            })
            .collect()
    }

    /// Each sensor's sampling since the last call (`prev` keeps the totals), as a share of
    /// `wall_s` seconds, with its period and whether the budget slowed it.
    pub fn costs(&self, prev: &mut std::collections::HashMap<String, u64>, wall_s: f64) -> Vec<Cost> {
        let slowed = self.slowed.lock().clone();
        let slots: Vec<Arc<Slot>> = self.slots.lock().values().cloned().collect();
        prev.retain(|k, _| slots.iter().any(|s| &s.name == k));
        slots
            .iter()
            .map(|s| {
                let total = s.sample_ns.load(Ordering::Relaxed);
                let before = prev.insert(s.name.clone(), total).unwrap_or(total);
                let set = s.setting();
                Cost {
                    name: s.name.clone(),
                    cost_pct: total.saturating_sub(before) as f64 / 1e9 / wall_s.max(1e-3) * 100.0,
                    period_ms: set.period.as_millis() as u64,
                    base_ms: slowed.get(&s.name).copied(),
                    enabled: set.enabled,
                }
            })
            .collect()
    }

    /// Records the agent's CPU at a budget check.
    pub fn set_measured(&self, cpu_pct: f64) {
        *self.measured.lock() = Some(cpu_pct);
    }

    /// Sets a sensor's period for the budget (not persisted), remembering the period it had
    /// before the first slowing; back at that period it is no longer slowed. False when the
    /// sensor is gone.
    pub fn throttle(&self, name: &str, to_ms: u64) -> bool {
        let Some(slot) = self.slots.lock().get(name).cloned() else {
            return false;
        };
        let Ok(period) = check_period(to_ms) else {
            return false;
        };
        let before = slot.setting();
        let mut slowed = self.slowed.lock();
        let base = *slowed
            .entry(name.to_string())
            .or_insert(before.period.as_millis() as u64);
        if to_ms <= base {
            slowed.remove(name);
        }
        slot.setting.send_replace(Setting { period, ..before });
        true
    }

    /// The producer's source name.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Publishes one event of the producer's own.
    pub fn publish(&self, ev: EventData) {
        if let (_, Err(e)) = self.hub.publish(&[ev]) {
            tracing::warn!(error = %e, "cannot publish a control event");
        }
    }

    fn slot(&self, name: &str) -> Result<Arc<Slot>, Error> {
        let slots = self.slots.lock();
        slots.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = slots.keys().map(String::as_str).collect();
            Error::not_found(format!(
                "no sensor named {name:?} on this producer (running: {}); `gma agent sensors` lists them",
                known.join(", ")
            ))
        })
    }

    fn persist(&self) -> Result<(), Error> {
        let Some(dir) = &self.state_dir else {
            return Ok(());
        };
        let state = self.state.lock().clone();
        save_state(dir, &state).map_err(|e| {
            Error::internal(format!(
                "cannot persist the change to {}: {e}; the change is live but lost at restart",
                dir.join(STATE_FILE).display()
            ))
        })
    }

    /// Sets a sensor's period; returns (before, after).
    pub async fn set_period(&self, name: &str, ms: u64) -> Result<(String, String), Error> {
        let period = check_period(ms)?;
        let _g = self.change.lock().await;
        let slot = self.slot(name)?;
        let before = slot.setting();
        let after = Setting { period, ..before };
        {
            let mut st = self.state.lock();
            if period == slot.configured {
                st.periods.remove(name);
            } else {
                st.periods.insert(name.to_string(), ms);
            }
            if let Some(w) = st
                .watches
                .iter_mut()
                .find(|w| format!("{WATCH_PREFIX}{}", w.name) == name)
            {
                w.period_ms = ms;
            }
        }
        self.persist()?;
        // The operator's period wins over the budget's.
        self.slowed.lock().remove(name);
        slot.setting.send_replace(after);
        Ok((before.describe(), after.describe()))
    }

    /// Enables or disables a sensor; returns (before, after).
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(String, String), Error> {
        let _g = self.change.lock().await;
        let slot = self.slot(name)?;
        let before = slot.setting();
        let after = Setting { enabled, ..before };
        {
            let mut st = self.state.lock();
            if enabled {
                st.disabled.remove(name);
            } else {
                st.disabled.insert(name.to_string());
            }
        }
        self.persist()?;
        slot.setting.send_replace(after);
        Ok((before.describe(), after.describe()))
    }

    /// Adds a process watch; returns (before, after).
    pub async fn watch(&self, w: WatchSpec) -> Result<(String, String), Error> {
        w.watch()
            .validate()
            .map_err(|e| Error::invalid_argument(e.to_string()))?;
        if w.period_ms != 0 {
            check_period(w.period_ms)?;
        }
        let _g = self.change.lock().await;
        let name = format!("{WATCH_PREFIX}{}", w.name);
        if self.slots.lock().contains_key(&name) {
            return Err(Error::already_exists(format!(
                "a process watch named {:?} is already running; remove it first (gma agent unwatch)",
                w.name
            )));
        }
        if self.state.lock().watches.len() >= MAX_RUNTIME_WATCHES {
            return Err(Error::resource_exhausted(format!(
                "at most {MAX_RUNTIME_WATCHES} process watches may be added at run time; remove one first"
            )));
        }
        self.start_watch(&w)?;
        self.state.lock().watches.push(w.clone());
        if let Err(e) = self.persist() {
            self.state.lock().watches.retain(|x| x.name != w.name);
            self.slots.lock().remove(&name);
            return Err(e);
        }
        Ok((String::new(), w.describe()))
    }

    /// Makes `host` the home of monitor rules and starts the rules persisted for it (a rule
    /// that no longer validates is logged and skipped).
    pub fn set_rule_host(&self, host: Arc<dyn RuleHost>) {
        let rules = self.state.lock().rules.clone();
        for r in rules {
            if let Err(e) = host.add(&r.toml) {
                tracing::warn!(rule = %r.name, error = %e, "cannot start a persisted monitor rule");
            }
        }
        *self.rule_host.lock() = Some(host);
    }

    fn rule_host(&self) -> Result<Arc<dyn RuleHost>, Error> {
        self.rule_host.lock().clone().ok_or_else(|| {
            Error::failed_precondition("this producer runs no monitor rules; address a `gma monitor`")
        })
    }

    /// Adds a monitor rule; returns (before, after).
    pub async fn add_rule(&self, toml: &str) -> Result<(String, String), Error> {
        if toml.len() > MAX_RULE_BYTES {
            return Err(Error::invalid_argument(format!(
                "the rule is {} bytes of TOML, at most {MAX_RULE_BYTES}",
                toml.len()
            )));
        }
        let host = self.rule_host()?;
        let _g = self.change.lock().await;
        if self.state.lock().rules.len() >= MAX_RUNTIME_RULES {
            return Err(Error::resource_exhausted(format!(
                "at most {MAX_RUNTIME_RULES} rules may be added at run time; remove one first"
            )));
        }
        let (name, described) = host.add(toml)?;
        self.state.lock().rules.push(RuleSpec {
            name: name.clone(),
            toml: toml.to_string(),
        });
        if let Err(e) = self.persist() {
            self.state.lock().rules.retain(|r| r.name != name);
            let _ = host.remove(&name);
            return Err(e);
        }
        Ok((String::new(), described))
    }

    /// Removes a monitor rule added at run time; returns (before, after).
    pub async fn remove_rule(&self, name: &str) -> Result<(String, String), Error> {
        let host = self.rule_host()?;
        let _g = self.change.lock().await;
        if !self.state.lock().rules.iter().any(|r| r.name == name) {
            return Err(Error::not_found(format!(
                "no rule named {name:?} was added at run time (rules of the configuration are removed \
                 from the configuration)"
            )));
        }
        self.state.lock().rules.retain(|r| r.name != name);
        self.persist()?;
        let before = host.remove(name)?;
        Ok((before, String::new()))
    }

    /// Removes a process watch added at run time; returns (before, after).
    pub async fn unwatch(&self, watch: &str) -> Result<(String, String), Error> {
        let _g = self.change.lock().await;
        let name = format!("{WATCH_PREFIX}{watch}");
        let spec = self
            .state
            .lock()
            .watches
            .iter()
            .find(|w| w.name == watch)
            .cloned();
        let Some(spec) = spec else {
            return Err(Error::not_found(format!(
                "no process watch named {watch:?} was added at run time (watches of the configuration \
                 are removed from the configuration)"
            )));
        };
        {
            let mut st = self.state.lock();
            st.watches.retain(|w| w.name != watch);
            st.periods.remove(&name);
            st.disabled.remove(&name);
        }
        self.persist()?;
        // Dropping the slot drops its setting's sender: the sensor's loop ends.
        self.slots.lock().remove(&name);
        Ok((spec.describe(), String::new()))
    }

    /// Publishes one `gma.audit` event.
    pub fn audit(&self, who: &Identity, op: &str, target: &str, before: &str, after: &str, outcome: &str) {
        let ev = EventData {
            name: GMA_AUDIT.to_string(),
            source: self.source.clone(),
            timestamp_ns: now_ns(),
            numbers: Vec::new(),
            strings: vec![
                who.to_string(),
                format!("{}:{op}", Action::ProducerControl),
                target.to_string(),
                before.to_string(),
                after.to_string(),
                outcome.to_string(),
            ],
        };
        self.publish(ev);
    }
}

/// The `Control` gRPC service.
pub struct ControlService {
    pub control: Arc<Control>,
    pub gate: Arc<gma_core::guard::Gate>,
}

/// Longest sensor or watch name a request may carry.
const MAX_NAME: usize = 256;

impl ControlService {
    /// Admits and authorizes `op`; a denial is audited.
    fn authorize<T>(&self, req: &Request<T>, op: &str, target: &str) -> Result<Identity, Status> {
        let who = self.gate.admit(req).map_err(Error::from)?;
        // Only an allow grant steers: a summary-only grant has nothing to serve here.
        let refusal = match self.gate.authorize(&who, Action::ProducerControl, &[op]) {
            Ok(g) if g.decision == Decision::Allow => return Ok(who),
            Ok(g) => self
                .gate
                .summary_only(&who, op, &g, "control needs an allow producer.control grant"),
            Err(e) => e,
        };
        self.control.audit(&who, op, target, "", "", "denied");
        Err(Error::from(refusal).into())
    }

    /// Audits the result of an allowed call and turns it into the response.
    fn answer(
        &self,
        who: &Identity,
        op: &str,
        target: &str,
        r: Result<(String, String), Error>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        match r {
            Ok((before, after)) => {
                self.control.audit(who, op, target, &before, &after, "allowed");
                Ok(Response::new(pb::ControlResponse { before, after }))
            }
            Err(e) => {
                let s: Status = e.into();
                self.control
                    .audit(who, op, target, "", "", &format!("refused: {}", s.message()));
                Err(s)
            }
        }
    }

    /// A call about one named sensor, watch or rule (`what` and the name): authorizes `op` on
    /// the name, checks the name's length, runs `call`, audits the result and answers.
    async fn on_named<T, F>(
        &self,
        req: &Request<T>,
        op: &str,
        (what, name): (&str, &str),
        call: impl FnOnce() -> F,
    ) -> Result<Response<pb::ControlResponse>, Status>
    where
        F: std::future::Future<Output = Result<(String, String), Error>>,
    {
        let target = name.chars().take(MAX_NAME).collect::<String>();
        let who = self.authorize(req, op, &target)?;
        let result = match bounded(what, name) {
            Ok(()) => call().await,
            Err(e) => Err(e),
        };
        self.answer(&who, op, &target, result)
    }
}

fn bounded(what: &str, s: &str) -> Result<(), Error> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err(Error::invalid_argument(format!(
            "{what} must be 1..={MAX_NAME} bytes; `gma agent sensors` lists the names"
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl pb::control_server::Control for ControlService {
    async fn list_sensors(
        &self,
        req: Request<pb::ListSensorsRequest>,
    ) -> Result<Response<pb::ListSensorsResponse>, Status> {
        let who = self.authorize(&req, OP_LIST, "")?;
        let listing = self.control.listing();
        self.control.audit(&who, OP_LIST, "", "", "", "allowed");
        Ok(Response::new(listing))
    }

    async fn set_period(
        &self,
        req: Request<pb::SetPeriodRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let r = req.get_ref();
        self.on_named(&req, OP_PERIOD, ("sensor", &r.sensor), || {
            self.control.set_period(&r.sensor, r.period_ms)
        })
        .await
    }

    async fn set_enabled(
        &self,
        req: Request<pb::SetEnabledRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let r = req.get_ref();
        let op = if r.enabled { OP_ENABLE } else { OP_DISABLE };
        self.on_named(&req, op, ("sensor", &r.sensor), || {
            self.control.set_enabled(&r.sensor, r.enabled)
        })
        .await
    }

    async fn watch(
        &self,
        req: Request<pb::ProcessWatchRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let r = req.get_ref();
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let pos = |v: f64| (v != 0.0).then_some(v);
        let spec = WatchSpec {
            name: r.name.clone(),
            comm: opt(&r.comm),
            cmdline: opt(&r.cmdline),
            pid: (r.pid != 0).then_some(r.pid),
            period_ms: r.period_ms,
            cpu_pct_max: pos(r.cpu_pct_max),
            rss_mb_max: pos(r.rss_mb_max),
        };
        self.on_named(&req, OP_WATCH, ("watch name", &r.name), || {
            self.control.watch(spec)
        })
        .await
    }

    async fn add_rule(
        &self,
        req: Request<pb::AddRuleRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let target = rule_name_of(&req.get_ref().toml);
        let who = self.authorize(&req, OP_RULE_ADD, &target)?;
        let result = self.control.add_rule(&req.get_ref().toml).await;
        self.answer(&who, OP_RULE_ADD, &target, result)
    }

    async fn remove_rule(
        &self,
        req: Request<pb::RemoveRuleRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let r = req.get_ref();
        self.on_named(&req, OP_RULE_REMOVE, ("rule name", &r.name), || {
            self.control.remove_rule(&r.name)
        })
        .await
    }

    async fn unwatch(
        &self,
        req: Request<pb::RemoveWatchRequest>,
    ) -> Result<Response<pb::ControlResponse>, Status> {
        let r = req.get_ref();
        self.on_named(&req, OP_UNWATCH, ("watch name", &r.name), || {
            self.control.unwatch(&r.name)
        })
        .await
    }
}

/// The `name = "..."` of a rule's TOML, for the audit event (empty when absent).
fn rule_name_of(toml: &str) -> String {
    toml.lines()
        .find_map(|l| l.trim().strip_prefix("name"))
        .and_then(|r| r.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').chars().take(MAX_NAME).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn state_round_trips_through_the_file() {
        let dir = std::env::temp_dir().join(format!("gma-control-{}", std::process::id()));
        assert_eq!(load_state(&dir).unwrap(), State::default());
        let mut s = State::default();
        s.periods.insert("host.cpu".into(), 250);
        s.disabled.insert("host.disk".into());
        s.watches.push(WatchSpec {
            name: "sleeper".into(),
            pid: Some(42),
            ..Default::default()
        });
        save_state(&dir, &s).unwrap();
        assert_eq!(load_state(&dir).unwrap(), s);
        std::fs::write(dir.join(STATE_FILE), b"{\"nope\": 1}").unwrap();
        assert!(load_state(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn periods_out_of_range_are_refused() {
        assert!(check_period(0).is_err());
        assert!(check_period(MAX_PERIOD_MS + 1).is_err());
        assert_eq!(check_period(250).unwrap(), Duration::from_millis(250));
    }
}
