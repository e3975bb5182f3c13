//! gma-monitor: action monitors (the GMA "process monitor" and "overview monitor"), run by
//! `gma monitor` through [`run`]`(config, listener, shutdown)`.
//!
//! A monitor runs rules over one or several event streams and runs a command when a rule holds:
//! restart a process when it dies, page only when both the primary and the backup are down.
//! The semantics are documented in `docs/monitor.md`; in short:
//!
//! - a **per-event rule** pushes its `when` to the producers (threshold crossings only) and
//!   fires on `enter`, once per key (the event's source) until the series leaves again, never
//!   twice within `hold_down_ms` for the same key;
//! - an **all_of rule** subscribes to every event of its listed sources, evaluates `when`
//!   locally (it needs every event to know a source is alive), and fires when every listed
//!   source holds the condition or has been silent for `stale_ms`; its key is the rule.
//!
//! The decisions are the pure [`Rules`] state machine (fed events, marks and times, no clock
//! inside); the async shell subscribes, feeds it, runs commands (one at a time per rule,
//! queued), and publishes every firing as a `monitor.firing` event of its own producer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Exclusions, Subscriber, SubscriberOptions};
use gma_core::codec::{Mark, OwnedEvent};
use gma_core::event::{dbl, schema, text, EventData};
use gma_core::filter::{Bound, Filter};
use gma_core::registration::Registration;
use gma_producer::{Hub, Identity, Producer};
use gma_proto::v1 as pb;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

pub mod telemetry;

/// Why a monitor cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The configuration is invalid (the message names the rule and the key to change).
    #[error("{0}")]
    Config(String),
    /// The monitor's own producer could not be set up.
    #[error("{0}")]
    Producer(String),
    /// The monitor's own producer stopped with an error.
    #[error("monitor's producer failed: {0}")]
    Stopped(String),
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
}

/// `return Err(MonitorError::Config(format!(...)))`.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err(MonitorError::Config(format!($($t)*)))
    };
}

/// `MonitorError::Config(format!(...))`.
macro_rules! config_err {
    ($($t:tt)*) => {
        MonitorError::Config(format!($($t)*))
    };
}

/// Default of `hold_down_ms`.
pub const DEFAULT_HOLD_DOWN_MS: u64 = 60_000;
/// Default of `command_timeout_ms`.
pub const DEFAULT_COMMAND_TIMEOUT_MS: u64 = 30_000;
/// Default of `stale_ms` (all_of rules).
pub const DEFAULT_STALE_MS: u64 = 5_000;
/// Longest `command_timeout_ms` and `stale_ms` accepted (one day).
pub const MAX_MS: u64 = 86_400_000;
/// Bytes of a command's stdout and of its stderr kept (and logged); the rest is read and dropped.
pub const OUTPUT_CAP: usize = 64 * 1024;
/// Firings of one rule waiting while its command runs; more are dropped (and reported).
pub const QUEUE_PER_RULE: usize = 64;
/// Longest rule name accepted, in bytes.
pub const MAX_RULE_NAME: usize = 128;
/// Name of the events a monitor publishes.
pub const FIRING_EVENT: &str = "monitor.firing";
/// How long the output of a command that exited is still read (a process it left running in
/// the background may hold the pipes open).
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// The monitor's TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorConfig {
    /// Listen address of the monitor's producer; `--listen` overrides.
    #[serde(default)]
    pub listen: Option<String>,
    /// The registration keys ([`gma_core::registration::Registration`]): `directory`
    /// (required; `--directory` overrides), `id`, the record id (default
    /// `monitor@<address>`), `advertise`, `site`, `org`, `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    /// Source of its `monitor.firing` events (default: the host name).
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleConfig>,
    /// Where the rules added at run time (`gma agent rule-add`) are kept across restarts
    /// (`control.json`, docs/control.md); none = until the monitor stops.
    #[serde(default)]
    pub state_dir: Option<std::path::PathBuf>,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

/// One `[[rule]]` table, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub name: String,
    pub events: Vec<String>,
    #[serde(default)]
    pub sources: Option<Vec<String>>,
    pub when: String,
    pub command: Vec<String>,
    #[serde(default)]
    pub hold_down_ms: Option<u64>,
    #[serde(default)]
    pub command_timeout_ms: Option<u64>,
    #[serde(default)]
    pub all_of: Option<Vec<String>>,
    #[serde(default)]
    pub stale_ms: Option<u64>,
}

/// The overview part of a rule: the sources that must all hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllOf {
    pub sources: Vec<String>,
    pub stale_ms: u64,
}

/// A validated rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    pub events: Vec<String>,
    /// Source patterns of the subscription (empty = any); for all_of rules, the listed sources.
    pub sources: Vec<String>,
    pub when: Filter,
    pub command: Vec<String>,
    pub hold_down_ms: u64,
    pub command_timeout_ms: u64,
    pub all_of: Option<AllOf>,
}

impl Rule {
    fn policy(&self) -> Policy {
        Policy {
            name: self.name.clone(),
            hold_down_ms: self.hold_down_ms,
            all_of: self.all_of.clone(),
        }
    }
}

/// Points at column `col` (1-based characters) of a one-line `text`.
fn caret(text: &str, col: usize) -> String {
    if text.contains('\n') {
        return String::new();
    }
    format!("\n    {text}\n    {}^", " ".repeat(col.saturating_sub(1)))
}

/// Checks every rule once; each message names the rule and the key to change.
pub fn validate(cfg: &MonitorConfig) -> Result<Vec<Rule>, MonitorError> {
    if cfg.rules.is_empty() {
        bail!("no [[rule]] tables: a monitor needs at least one rule");
    }
    if let Some(s) = &cfg.source {
        gma_core::pattern::validate_source(s).map_err(|e| config_err!("source: {e}"))?;
    }
    if let Some(id) = &cfg.registration.id {
        if id.trim().is_empty() || id.len() > 256 {
            bail!("id must be 1 to 256 bytes");
        }
    }
    cfg.registration
        .validate()
        .map_err(|e| MonitorError::Config(e.to_string()))?;
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(cfg.rules.len());
    for (i, r) in cfg.rules.iter().enumerate() {
        let who = if r.name.is_empty() {
            format!("rule #{}", i + 1)
        } else {
            format!("rule {:?}", r.name)
        };
        if r.name.trim().is_empty() {
            bail!("{who}: name must not be empty");
        }
        if r.name.len() > MAX_RULE_NAME || r.name.chars().any(|c| c.is_control()) {
            bail!("{who}: name must be at most {MAX_RULE_NAME} bytes without control characters");
        }
        if !names.insert(r.name.as_str()) {
            bail!("{who}: another rule has the same name; names must be unique");
        }
        gma_core::pattern::event_patterns(&r.events).map_err(|e| config_err!("{who}: events: {e}"))?;
        if r.when.trim().is_empty() {
            bail!("{who}: when must not be empty (the condition the rule acts on)");
        }
        let when = Filter::parse(&r.when)
            .map_err(|e| config_err!("{who}: when: {e}{}", caret(&r.when, e.position)))?;
        if r.command.is_empty() || r.command[0].is_empty() {
            bail!("{who}: command must name a program: command = [\"program\", \"arg\", ...]");
        }
        if let Some(n) = r.command.iter().position(|a| a.contains('\0')) {
            bail!("{who}: command argument {n} contains a NUL byte");
        }
        let hold_down_ms = r.hold_down_ms.unwrap_or(DEFAULT_HOLD_DOWN_MS);
        let command_timeout_ms = r.command_timeout_ms.unwrap_or(DEFAULT_COMMAND_TIMEOUT_MS);
        if command_timeout_ms == 0 || command_timeout_ms > MAX_MS {
            bail!("{who}: command_timeout_ms must be within 1..={MAX_MS}");
        }
        let (sources, all_of) = match &r.all_of {
            None => {
                if r.stale_ms.is_some() {
                    bail!("{who}: stale_ms applies to all_of rules only; add all_of or remove stale_ms");
                }
                let sources = r.sources.clone().unwrap_or_default();
                gma_core::pattern::source_patterns(&sources)
                    .map_err(|e| config_err!("{who}: sources: {e}"))?;
                (sources, None)
            }
            Some(list) => {
                if r.sources.is_some() {
                    bail!(
                        "{who}: give either sources (patterns) or all_of (the source names that must \
                         all hold), not both"
                    );
                }
                if list.is_empty() {
                    bail!("{who}: all_of must list at least one source");
                }
                let mut seen = HashSet::new();
                for s in list {
                    gma_core::pattern::validate_source(s).map_err(|e| config_err!("{who}: all_of: {e}"))?;
                    if !seen.insert(s.as_str()) {
                        bail!("{who}: all_of lists {s:?} twice");
                    }
                }
                let stale_ms = r.stale_ms.unwrap_or(DEFAULT_STALE_MS);
                if stale_ms == 0 || stale_ms > MAX_MS {
                    bail!("{who}: stale_ms must be within 1..={MAX_MS}");
                }
                (
                    list.clone(),
                    Some(AllOf {
                        sources: list.clone(),
                        stale_ms,
                    }),
                )
            }
        };
        out.push(Rule {
            name: r.name.clone(),
            events: r.events.clone(),
            sources,
            when,
            command: r.command.clone(),
            hold_down_ms,
            command_timeout_ms,
            all_of,
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Decisions (pure)
// ---------------------------------------------------------------------------------------------

/// What the decisions need of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    pub hold_down_ms: u64,
    pub all_of: Option<AllOf>,
}

/// Where an event came from.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The producer (directory record id) that delivered it.
    pub producer: &'a str,
    /// Event name.
    pub name: &'a str,
    pub source: &'a str,
}

/// A decision to run a rule's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    /// Index of the rule.
    pub rule: usize,
    /// The hold-down key: the source (per-event rules) or the rule name (all_of rules).
    pub key: String,
    /// GMA_SOURCE: the event's source, or the listed sources joined by ',' (all_of).
    pub source: String,
    /// GMA_NAME: the triggering event's name ("" when a source's silence completed the rule).
    pub name: String,
    /// Firings of this key suppressed by the hold-down since its previous firing.
    pub suppressed: u64,
}

/// The hold-down of one key.
#[derive(Debug, Default)]
struct HoldDown {
    last_fired: Option<u64>,
    suppressed: u64,
}

impl HoldDown {
    /// A would-be firing at `now`: `Some(suppressed since the last firing)` when it may fire,
    /// `None` (and one more suppressed) within the hold-down.
    fn attempt(&mut self, now: u64, hold_down_ms: u64) -> Option<u64> {
        if let Some(t) = self.last_fired {
            if now.saturating_sub(t) < hold_down_ms {
                self.suppressed += 1;
                return None;
            }
        }
        self.last_fired = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[derive(Debug)]
struct Member {
    source: String,
    inside: bool,
    last_ms: Option<u64>,
}

#[derive(Debug)]
enum State {
    PerEvent {
        /// Series (producer, event name, source) inside the condition.
        inside: HashSet<(String, String, String)>,
        keys: HashMap<String, HoldDown>,
    },
    AllOf {
        members: Vec<Member>,
        stale_ms: u64,
        /// When the rule started: a source never heard from is stale `stale_ms` after it.
        since_ms: u64,
        /// Fires on the next time every member holds (re-armed when one stops holding).
        armed: bool,
        hold: HoldDown,
    },
}

/// The decisions of every rule of a monitor. Times are milliseconds on any monotonic clock.
#[derive(Debug)]
pub struct Rules {
    policies: Vec<Policy>,
    states: Vec<State>,
}

impl Rules {
    pub fn new(policies: Vec<Policy>, now_ms: u64) -> Rules {
        let states = policies
            .iter()
            .map(|p| match &p.all_of {
                None => State::PerEvent {
                    inside: HashSet::new(),
                    keys: HashMap::new(),
                },
                Some(a) => State::AllOf {
                    members: a
                        .sources
                        .iter()
                        .map(|s| Member {
                            source: s.clone(),
                            inside: false,
                            last_ms: None,
                        })
                        .collect(),
                    stale_ms: a.stale_ms,
                    since_ms: now_ms,
                    armed: true,
                    hold: HoldDown::default(),
                },
            })
            .collect();
        Rules { policies, states }
    }

    /// One event for rule `rule`. For a per-event rule `mark` is the producer's crossing mark
    /// (`None` events are ignored). For an all_of rule it is the locally evaluated condition:
    /// `Enter` = holds, `Leave` = does not, `None` = unknown (the event only shows the source is
    /// alive).
    pub fn event(&mut self, rule: usize, seen: Seen<'_>, mark: Mark, now_ms: u64) -> Option<Firing> {
        let policy = self.policies.get(rule)?;
        match self.states.get_mut(rule)? {
            State::PerEvent { inside, keys } => {
                let series = (
                    seen.producer.to_string(),
                    seen.name.to_string(),
                    seen.source.to_string(),
                );
                match mark {
                    Mark::None => None,
                    Mark::Leave => {
                        inside.remove(&series);
                        None
                    }
                    Mark::Enter => {
                        if !inside.insert(series) {
                            return None; // still inside: not again until it leaves
                        }
                        let hold = keys.entry(seen.source.to_string()).or_default();
                        let suppressed = hold.attempt(now_ms, policy.hold_down_ms)?;
                        Some(Firing {
                            rule,
                            key: seen.source.to_string(),
                            source: seen.source.to_string(),
                            name: seen.name.to_string(),
                            suppressed,
                        })
                    }
                }
            }
            State::AllOf { members, .. } => {
                let m = members.iter_mut().find(|m| m.source == seen.source)?;
                m.last_ms = Some(now_ms);
                match mark {
                    Mark::Enter => m.inside = true,
                    Mark::Leave => m.inside = false,
                    Mark::None => {}
                }
                self.check_all(rule, seen.name, now_ms)
            }
        }
    }

    /// The producer's subscription of rule `rule` started again (reconnect, producer restart):
    /// its crossing state restarts from "unknown", so what its series were inside is forgotten
    /// (the next `enter` fires again, subject to the hold-down).
    pub fn resubscribed(&mut self, rule: usize, producer: &str) {
        if let Some(State::PerEvent { inside, .. }) = self.states.get_mut(rule) {
            inside.retain(|(p, _, _)| p != producer);
        }
    }

    /// Time passed: all_of rules completed by a source going silent fire.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Firing> {
        (0..self.states.len())
            .filter_map(|i| self.check_all(i, "", now_ms))
            .collect()
    }

    /// Per listed source of an all_of rule: whether it holds now (inside or stale).
    pub fn holding(&self, rule: usize, now_ms: u64) -> Vec<(String, bool)> {
        match self.states.get(rule) {
            Some(State::AllOf {
                members,
                stale_ms,
                since_ms,
                ..
            }) => members
                .iter()
                .map(|m| (m.source.clone(), holds(m, *stale_ms, *since_ms, now_ms)))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn check_all(&mut self, rule: usize, name: &str, now_ms: u64) -> Option<Firing> {
        let policy = self.policies.get(rule)?;
        let State::AllOf {
            members,
            stale_ms,
            since_ms,
            armed,
            hold,
        } = self.states.get_mut(rule)?
        else {
            return None;
        };
        if !members.iter().all(|m| holds(m, *stale_ms, *since_ms, now_ms)) {
            *armed = true;
            return None;
        }
        if !*armed {
            return None;
        }
        *armed = false;
        let suppressed = hold.attempt(now_ms, policy.hold_down_ms)?;
        Some(Firing {
            rule,
            key: policy.name.clone(),
            source: members
                .iter()
                .map(|m| m.source.as_str())
                .collect::<Vec<_>>()
                .join(","),
            name: name.to_string(),
            suppressed,
        })
    }
}

fn holds(m: &Member, stale_ms: u64, since_ms: u64, now_ms: u64) -> bool {
    m.inside || now_ms.saturating_sub(m.last_ms.unwrap_or(since_ms)) >= stale_ms
}

// ---------------------------------------------------------------------------------------------
// Commands and firing events
// ---------------------------------------------------------------------------------------------

/// `monitor.firing`: one per firing, after its command finished.
pub fn firing_schema() -> pb::EventSchema {
    schema(
        FIRING_EVENT,
        "an action monitor's rule fired and ran its command",
        vec![
            text("rule", "the rule that fired"),
            text(
                "key",
                "hold-down key: the source, or the rule name for all_of rules",
            ),
            text(
                "outcome",
                "ok, exit N, killed by signal N, timeout, spawn failed: ..., dropped: ...",
            ),
            dbl(
                "exit_status",
                "",
                "the command's exit code (NaN if it did not exit)",
            ),
            dbl("duration_ms", "ms", "how long the command ran"),
            dbl(
                "suppressed",
                "",
                "firings of this key suppressed by the hold-down since the last one",
            ),
        ],
    )
}

/// What running a command gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub outcome: String,
    pub exit_status: f64,
    pub duration_ms: f64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Reads `r` to its end, keeping the first `cap` bytes.
async fn read_capped(mut r: impl AsyncRead + Unpin, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

fn describe(status: std::process::ExitStatus) -> (String, f64) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => ("ok".into(), 0.0),
        (Some(c), _) => (format!("exit {c}"), c as f64),
        (None, Some(s)) => (format!("killed by signal {s}"), f64::NAN),
        (None, None) => ("exited (status unknown)".into(), f64::NAN),
    }
}

/// Kills the command's process group (it runs in a group of its own), then the command itself.
async fn kill_group(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        // `kill` is the one way to signal a group without libc (and unsafe code).
        let _ = tokio::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await;
    }
    let _ = child.kill().await;
}

/// Runs `argv` with `env`, stdin on /dev/null, output captured, killed after `timeout`.
pub async fn run_command(argv: &[String], env: &[(&str, &str)], timeout: Duration) -> Outcome {
    let started = Instant::now();
    // Milliseconds, to the microsecond.
    let elapsed = |s: Instant| s.elapsed().as_micros() as f64 / 1000.0;
    let Some((program, args)) = argv.split_first() else {
        return Outcome {
            outcome: "spawn failed: empty command".into(),
            exit_status: f64::NAN,
            duration_ms: 0.0,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome {
                outcome: format!("spawn failed: {e}"),
                exit_status: f64::NAN,
                duration_ms: elapsed(started),
                stdout: Vec::new(),
                stderr: Vec::new(),
            }
        }
    };
    let out = child
        .stdout
        .take()
        .map(|o| tokio::spawn(read_capped(o, OUTPUT_CAP)));
    let err = child
        .stderr
        .take()
        .map(|e| tokio::spawn(read_capped(e, OUTPUT_CAP)));
    let (outcome, exit_status) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => describe(status),
        Ok(Err(e)) => (format!("wait failed: {e}"), f64::NAN),
        Err(_) => {
            kill_group(&mut child).await;
            ("timeout".into(), f64::NAN)
        }
    };
    let duration_ms = elapsed(started);
    let collect = |h: Option<tokio::task::JoinHandle<Vec<u8>>>| async move {
        let Some(h) = h else { return Vec::new() };
        let abort = h.abort_handle();
        match tokio::time::timeout(OUTPUT_GRACE, h).await {
            Ok(Ok(v)) => v,
            _ => {
                abort.abort();
                Vec::new()
            }
        }
    };
    let stdout = collect(out).await;
    let stderr = collect(err).await;
    Outcome {
        outcome,
        exit_status,
        duration_ms,
        stdout,
        stderr,
    }
}

/// The `monitor.firing` event of a finished (or dropped) firing.
fn firing_event(source: &str, rule: &str, key: &str, o: &Outcome, suppressed: u64) -> EventData {
    EventData {
        name: FIRING_EVENT.into(),
        source: source.to_string(),
        timestamp_ns: gma_core::time::now_ns(),
        numbers: vec![o.exit_status, o.duration_ms, suppressed as f64],
        strings: vec![rule.to_string(), key.to_string(), o.outcome.clone()],
    }
}

/// Publishes the firing event and prints it as one JSON line on stdout.
fn publish(hub: &Hub, e: EventData) {
    let (seq, r) = hub.publish(std::slice::from_ref(&e));
    if let Err(err) = r {
        tracing::warn!("cannot publish a monitor.firing event: {err}");
    }
    let schema = firing_schema();
    println!("{}", e.to_json(seq, &schema.fields));
}

struct Job {
    firing: Firing,
    /// The triggering event as JSON ("" when a tick fired the rule).
    event: String,
}

/// Runs one rule's commands, one at a time, in firing order.
async fn worker(rule: Rule, mut rx: mpsc::Receiver<Job>, hub: Arc<Hub>, source: String) {
    while let Some(job) = rx.recv().await {
        let f = &job.firing;
        let suppressed = f.suppressed.to_string();
        let env = [
            ("GMA_RULE", rule.name.as_str()),
            ("GMA_KEY", f.key.as_str()),
            ("GMA_SOURCE", f.source.as_str()),
            ("GMA_NAME", f.name.as_str()),
            ("GMA_EVENT", job.event.as_str()),
            ("GMA_SUPPRESSED", suppressed.as_str()),
        ];
        let o = run_command(
            &rule.command,
            &env,
            Duration::from_millis(rule.command_timeout_ms),
        )
        .await;
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        if o.outcome == "ok" {
            tracing::info!(
                "rule {} ({}): command ok in {:.0} ms; stdout: {:?}; stderr: {:?}",
                rule.name,
                f.key,
                o.duration_ms,
                stdout.trim_end(),
                stderr.trim_end()
            );
        } else {
            tracing::warn!(
                "rule {} ({}): command {:?} failed: {} after {:.0} ms; stdout: {:?}; stderr: {:?}",
                rule.name,
                f.key,
                rule.command,
                o.outcome,
                o.duration_ms,
                stdout.trim_end(),
                stderr.trim_end()
            );
        }
        metrics::counter!(telemetry::FIRINGS, "outcome" => if o.outcome == "ok" { "ok" } else { "failed" })
            .increment(1);
        metrics::histogram!(telemetry::COMMAND_SECONDS).record(o.duration_ms / 1000.0);
        publish(&hub, firing_event(&source, &rule.name, &f.key, &o, f.suppressed));
    }
}

// ---------------------------------------------------------------------------------------------
// The async shell
// ---------------------------------------------------------------------------------------------

/// Runs a monitor until `shutdown` resolves: its own producer on `listener` (registered in the
/// directory, serving its `monitor.firing` events) and the rules of `cfg`, subscribed through
/// the directory. TLS and the access policy are those of `cfg` (the caller applies its flags).
pub async fn run(
    cfg: MonitorConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MonitorError> {
    let rules = validate(&cfg)?;
    let directory = cfg
        .registration
        .required_directory()
        .map_err(|e| MonitorError::Config(e.to_string()))?;
    let source = cfg.source.clone().unwrap_or_else(gma_producer::host_name);
    let bound = listener.local_addr()?;
    let id = cfg
        .registration
        .record_id("monitor", &cfg.registration.address(bound));
    let mut producer = Producer::embedded(
        "monitor",
        &cfg.endpoint,
        Identity::new(
            &source,
            Registration {
                id: Some(id.clone()),
                ..cfg.registration.clone()
            },
        ),
        &[firing_schema()],
    )
    .map_err(|e| MonitorError::Producer(e.to_string()))?;
    producer.config.state_dir = cfg.state_dir.clone();
    let set = Arc::new(RuleSet {
        directory,
        id,
        hub: producer.hub.clone(),
        source,
        running: std::sync::Mutex::new(BTreeMap::new()),
    });
    for rule in rules {
        set.start(rule, false);
    }
    producer.rule_host = Some(set.clone());
    let r = producer.run(listener, shutdown).await;
    set.stop_all();
    r.map_err(|e| MonitorError::Stopped(e.to_string()))
}

/// The rules a monitor runs, one engine task each (rules are independent): those of its
/// configuration and those added at run time through its producer's `Control` service
/// (`AddRule`, `RemoveRule`; docs/control.md).
pub struct RuleSet {
    directory: String,
    id: String,
    hub: Arc<Hub>,
    source: String,
    running: std::sync::Mutex<BTreeMap<String, Running>>,
}

struct Running {
    described: String,
    runtime: bool,
    task: tokio::task::JoinHandle<()>,
}

/// A rule in one line: `name: events when condition`.
fn describe_rule(r: &Rule) -> String {
    format!(
        "{}: {} when {}{}",
        r.name,
        r.events.join(","),
        r.when.text(),
        if r.all_of.is_some() { " (all_of)" } else { "" }
    )
}

impl RuleSet {
    fn running(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start(&self, rule: Rule, runtime: bool) -> String {
        let described = describe_rule(&rule);
        let name = rule.name.clone();
        let task = tokio::spawn(engine(
            vec![rule],
            self.directory.clone(),
            self.id.clone(),
            self.hub.clone(),
            self.source.clone(),
        ));
        self.running().insert(
            name,
            Running {
                described: described.clone(),
                runtime,
                task,
            },
        );
        described
    }

    fn stop_all(&self) {
        for (_, r) in std::mem::take(&mut *self.running()) {
            r.task.abort();
        }
    }
}

impl gma_producer::control::RuleHost for RuleSet {
    fn add(&self, toml_text: &str) -> Result<(String, String), gma_core::Refusal> {
        use gma_core::{Refusal, Refuse};
        let cfg: MonitorConfig = toml::from_str(toml_text)
            .map_err(|e| Refusal::invalid_argument(format!("the rule is not a valid [[rule]] table: {e}")))?;
        if cfg.rules.len() != 1
            || cfg.registration != Registration::default()
            || cfg.listen.is_some()
            || cfg.source.is_some()
            || cfg.state_dir.is_some()
        {
            return Err(Refusal::invalid_argument(
                "give exactly one [[rule]] table and nothing else (name, events, when, command, ...)",
            ));
        }
        let rule = validate(&cfg)
            .map_err(|e| Refusal::invalid_argument(e.to_string()))?
            .into_iter()
            .next()
            .ok_or_else(|| Refusal::invalid_argument("give one [[rule]] table"))?;
        if self.running().contains_key(&rule.name) {
            return Err(Refusal::already_exists(format!(
                "a rule named {:?} is running; remove it first or choose another name",
                rule.name
            )));
        }
        let name = rule.name.clone();
        let described = self.start(rule, true);
        Ok((name, described))
    }

    fn remove(&self, name: &str) -> Result<String, gma_core::Refusal> {
        use gma_core::{Refusal, Refuse};
        let mut running = self.running();
        match running.get(name) {
            Some(r) if r.runtime => {}
            Some(_) => {
                return Err(Refusal::failed_precondition(format!(
                    "rule {name:?} is of the configuration: remove it from the config file"
                )))
            }
            None => return Err(Refusal::not_found(format!("no rule named {name:?} runs here"))),
        }
        let r = running
            .remove(name)
            .ok_or_else(|| Refusal::not_found(format!("no rule named {name:?}")))?;
        r.task.abort();
        Ok(r.described)
    }

    fn list(&self) -> Vec<String> {
        self.running()
            .values()
            .map(|r| format!("{}{}", r.described, if r.runtime { " [runtime]" } else { "" }))
            .collect()
    }
}

/// What the shell remembers per rule to keep its logs useful and short.
#[derive(Default)]
struct Noise {
    /// Producers that rejected the subscription (INVALID_ARGUMENT), reported once each.
    rejected: HashSet<String>,
    /// Producers whose stream is broken (reported once per outage).
    failing: HashSet<String>,
    directory_down: bool,
    /// all_of rules: the compiled `when` per (event name, schema version); None = does not apply.
    bound: HashMap<(String, u32), Option<Bound>>,
}

fn consumer_id(id: &str, rule: &str) -> String {
    let mut s = format!("{id}/{rule}");
    while s.len() > 256 {
        s.pop();
    }
    s
}

fn mark_word(m: Mark) -> &'static str {
    match m {
        Mark::Enter => "enter",
        Mark::Leave => "leave",
        Mark::None => "unknown",
    }
}

/// all_of rules: the condition on this event, as a mark (Enter = holds).
fn evaluate(rule: &Rule, noise: &mut Noise, e: &OwnedEvent) -> Mark {
    let key = (e.series.name.clone(), e.series.schema_version);
    let bound =
        noise
            .bound
            .entry(key)
            .or_insert_with(|| match rule.when.bind(&e.series.name, &e.series.fields) {
                Ok(Some(b)) => Some(b),
                Ok(None) => {
                    tracing::warn!(
                    "rule {}: `when` refers to no field of {} events; they only show their source is alive",
                    rule.name,
                    e.series.name
                );
                    None
                }
                Err(err) => {
                    tracing::error!(
                        "rule {}: `when` does not fit the schema of {}: {err}{}",
                        rule.name,
                        e.series.name,
                        caret(rule.when.text(), err.position)
                    );
                    None
                }
            });
    match bound.as_ref().and_then(|b| b.eval(&e.numbers, &e.strings)) {
        Some(true) => Mark::Enter,
        Some(false) => Mark::Leave,
        None => Mark::None,
    }
}

async fn engine(rules: Vec<Rule>, directory: String, id: String, hub: Arc<Hub>, source: String) {
    let (tx, mut rx) = mpsc::channel::<(usize, Delivery)>(256);
    let mut forwarders = Vec::new();
    let mut workers = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        // Never its own record: a rule on monitor.firing watches other monitors.
        let own = Exclusions {
            ids: vec![id.clone()],
            ..Exclusions::default()
        };
        let mut sub = Subscriber::start_excluding(
            SubscriberOptions {
                directory: directory.clone(),
                stream: StreamOptions {
                    patterns: rule.events.clone(),
                    sources: rule.sources.clone(),
                    consumer_id: consumer_id(&id, &rule.name),
                    // all_of rules need every event (a silent source is a down source).
                    when: if rule.all_of.is_some() {
                        String::new()
                    } else {
                        rule.when.text().to_string()
                    },
                    ..StreamOptions::default()
                },
                capacity: 64,
                default_resume: None,
            },
            HashMap::new(),
            own,
        );
        let tx = tx.clone();
        forwarders.push(tokio::spawn(async move {
            while let Some(d) = sub.recv().await {
                if tx.send((i, d)).await.is_err() {
                    return;
                }
            }
        }));
        let (jtx, jrx) = mpsc::channel(QUEUE_PER_RULE);
        workers.push(jtx);
        tokio::spawn(worker(rule.clone(), jrx, hub.clone(), source.clone()));
    }
    drop(tx);
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let mut machine = Rules::new(rules.iter().map(Rule::policy).collect(), now());
    let mut noise: Vec<Noise> = rules.iter().map(|_| Noise::default()).collect();
    let tick_ms = rules
        .iter()
        .filter_map(|r| r.all_of.as_ref().map(|a| (a.stale_ms / 4).clamp(10, 1000)))
        .min();
    let mut tick = tokio::time::interval(Duration::from_millis(tick_ms.unwrap_or(1000)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let dispatch = |f: Firing, event: String| {
        let rule = &rules[f.rule];
        if f.suppressed > 0 {
            tracing::info!(
                "rule {} fires for {} ({} suppressed by the hold-down since its last firing)",
                rule.name,
                f.key,
                f.suppressed
            );
        } else {
            tracing::info!("rule {} fires for {}", rule.name, f.key);
        }
        if let Err(mpsc::error::TrySendError::Full(job)) = workers[f.rule].try_send(Job { firing: f, event })
        {
            tracing::warn!(
                "rule {}: {QUEUE_PER_RULE} firings already wait for its command; dropping this one",
                rule.name
            );
            let o = Outcome {
                outcome: format!("dropped: {QUEUE_PER_RULE} firings already queued"),
                exit_status: f64::NAN,
                duration_ms: 0.0,
                stdout: Vec::new(),
                stderr: Vec::new(),
            };
            publish(
                &hub,
                firing_event(&source, &rule.name, &job.firing.key, &o, job.firing.suppressed),
            );
        }
    };
    loop {
        let (i, d) = tokio::select! {
            d = rx.recv() => match d {
                Some(d) => d,
                None => return,
            },
            _ = tick.tick(), if tick_ms.is_some() => {
                for f in machine.tick(now()) {
                    dispatch(f, String::new());
                }
                continue;
            }
        };
        let rule = &rules[i];
        let noise = &mut noise[i];
        if !matches!(d, Delivery::DirectoryDown { .. }) {
            noise.directory_down = false;
        }
        match d {
            Delivery::Events { producer, events, .. } => {
                for e in &events {
                    let mark = if rule.all_of.is_some() {
                        evaluate(rule, noise, e)
                    } else {
                        e.mark
                    };
                    tracing::debug!(
                        "rule {}: {} from {} seq {} ({}) via {}",
                        rule.name,
                        e.series.name,
                        e.series.source,
                        e.seq,
                        mark_word(mark),
                        producer
                    );
                    let seen = Seen {
                        producer: &producer,
                        name: &e.series.name,
                        source: &e.series.source,
                    };
                    let fired = machine.event(i, seen, mark, now());
                    if rule.all_of.is_some() {
                        let state: Vec<String> = machine
                            .holding(i, now())
                            .iter()
                            .map(|(s, h)| format!("{s}={}", if *h { "holds" } else { "clear" }))
                            .collect();
                        tracing::debug!("rule {}: {}", rule.name, state.join(" "));
                    }
                    match fired {
                        Some(f) => dispatch(f, e.as_ref().to_json()),
                        None if mark == Mark::Enter && rule.all_of.is_none() => tracing::info!(
                            "rule {}: {} from {} entered; no firing (still inside, or within the hold-down)",
                            rule.name,
                            e.series.name,
                            e.series.source
                        ),
                        None => {}
                    }
                }
            }
            Delivery::Subscribed {
                producer,
                subscription_id,
            } => {
                noise.failing.remove(&producer);
                noise.rejected.remove(&producer);
                machine.resubscribed(i, &producer);
                tracing::info!(
                    "rule {}: subscribed to producer {producer} (subscription {subscription_id})",
                    rule.name
                );
            }
            Delivery::Reconnecting { producer, error } => {
                let lower = error.to_ascii_lowercase();
                if lower.contains("invalidargument") || lower.contains("invalid argument") {
                    if noise.rejected.insert(producer.clone()) {
                        tracing::error!(
                            "rule {}: producer {producer} REJECTS the rule's subscription (fix `when` or \
                             `events` in the config; retrying): {error}",
                            rule.name
                        );
                    }
                } else if noise.failing.insert(producer.clone()) {
                    tracing::warn!(
                        "rule {}: stream from producer {producer} broke, reconnecting: {error}",
                        rule.name
                    );
                }
            }
            Delivery::Refused { producer, error } => {
                if noise.rejected.insert(producer.clone()) {
                    tracing::error!(
                        "rule {}: producer {producer} REFUSES the rule's subscription (fix `when` or `events` \
                         in the config and restart the monitor): {error}",
                        rule.name
                    );
                }
            }
            Delivery::Discovered { producer, address } => {
                tracing::info!("rule {}: found producer {producer} at {address}", rule.name);
            }
            Delivery::Gap { producer, gap } => tracing::warn!(
                "rule {}: producer {producer} could not deliver {} events (seq {}..{}: {}); a crossing may \
                 have been missed",
                rule.name,
                gap.dropped,
                gap.from_seq,
                gap.to_seq,
                gap.reason
            ),
            Delivery::Gone { producer, reason } => {
                noise.failing.remove(&producer);
                tracing::info!(
                    "rule {}: producer {producer} left the directory ({reason})",
                    rule.name
                );
            }
            Delivery::DirectoryDown { error } => {
                if !noise.directory_down {
                    noise.directory_down = true;
                    tracing::warn!(
                        "rule {}: directory unreachable (running streams continue): {error}",
                        rule.name
                    );
                }
            }
            Delivery::DirectoryRefused { error } => tracing::error!(
                "rule {}: the directory refused its watch; the rule sees no producer until it is allowed (restart then): {error}",
                rule.name
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_event(hold: u64) -> Policy {
        Policy {
            name: "restart".into(),
            hold_down_ms: hold,
            all_of: None,
        }
    }

    fn all_of(hold: u64, stale: u64) -> Policy {
        Policy {
            name: "page".into(),
            hold_down_ms: hold,
            all_of: Some(AllOf {
                sources: vec!["a".into(), "b".into()],
                stale_ms: stale,
            }),
        }
    }

    fn seen(source: &str) -> Seen<'_> {
        Seen {
            producer: "p1",
            name: "proc.event",
            source,
        }
    }

    fn keys(v: &[Firing]) -> Vec<(&str, u64)> {
        v.iter().map(|f| (f.key.as_str(), f.suppressed)).collect()
    }

    #[test]
    fn per_event_fires_on_enter_once_until_leave() {
        let mut r = Rules::new(vec![per_event(0)], 0);
        let f = r.event(0, seen("h1"), Mark::Enter, 10).unwrap();
        assert_eq!(
            (f.key.as_str(), f.source.as_str(), f.name.as_str()),
            ("h1", "h1", "proc.event")
        );
        // Still inside (e.g. a duplicate enter): nothing.
        assert_eq!(r.event(0, seen("h1"), Mark::Enter, 20), None);
        assert_eq!(r.event(0, seen("h1"), Mark::None, 25), None);
        assert_eq!(r.event(0, seen("h1"), Mark::Leave, 30), None);
        assert!(r.event(0, seen("h1"), Mark::Enter, 40).is_some());
        // Keys are independent.
        assert!(r.event(0, seen("h2"), Mark::Enter, 41).is_some());
    }

    #[test]
    fn hold_down_suppresses_and_counts() {
        let mut r = Rules::new(vec![per_event(1000)], 0);
        assert_eq!(r.event(0, seen("h1"), Mark::Enter, 0).unwrap().suppressed, 0);
        for t in [100, 300, 500] {
            assert_eq!(r.event(0, seen("h1"), Mark::Leave, t), None);
            assert_eq!(
                r.event(0, seen("h1"), Mark::Enter, t + 1),
                None,
                "within hold-down"
            );
        }
        // Another key is not held down.
        assert!(r.event(0, seen("h2"), Mark::Enter, 600).is_some());
        r.event(0, seen("h1"), Mark::Leave, 900);
        // Exactly hold_down_ms after the firing: allowed, reports the 3 suppressed.
        let f = r.event(0, seen("h1"), Mark::Enter, 1000).unwrap();
        assert_eq!(f.suppressed, 3);
        r.event(0, seen("h1"), Mark::Leave, 1001);
        assert_eq!(r.event(0, seen("h1"), Mark::Enter, 1999), None);
        r.event(0, seen("h1"), Mark::Leave, 2000);
        assert_eq!(r.event(0, seen("h1"), Mark::Enter, 2000).unwrap().suppressed, 1);
    }

    #[test]
    fn a_suppressed_firing_is_not_postponed() {
        let mut r = Rules::new(vec![per_event(1000)], 0);
        assert!(r.event(0, seen("h1"), Mark::Enter, 0).is_some());
        r.event(0, seen("h1"), Mark::Leave, 10);
        assert_eq!(r.event(0, seen("h1"), Mark::Enter, 20), None);
        // Still inside after the hold-down: no late firing.
        assert_eq!(r.event(0, seen("h1"), Mark::Enter, 5000), None);
        assert!(r.tick(5000).is_empty());
    }

    #[test]
    fn resubscription_forgets_inside_state_of_that_producer_only() {
        let mut r = Rules::new(vec![per_event(0)], 0);
        assert!(r.event(0, seen("h1"), Mark::Enter, 0).is_some());
        let other = Seen {
            producer: "p2",
            ..seen("h9")
        };
        assert!(r.event(0, other, Mark::Enter, 0).is_some());
        r.resubscribed(0, "p1");
        // The new subscription never sends the leave (its state starts unknown): the next enter
        // is a new condition.
        assert!(r.event(0, seen("h1"), Mark::Enter, 5).is_some());
        assert_eq!(r.event(0, other, Mark::Enter, 5), None);
    }

    #[test]
    fn series_are_per_event_name_and_producer() {
        let mut r = Rules::new(vec![per_event(0)], 0);
        assert!(r.event(0, seen("h1"), Mark::Enter, 0).is_some());
        let load = Seen {
            name: "host.load",
            ..seen("h1")
        };
        let f = r.event(0, load, Mark::Enter, 1).unwrap();
        assert_eq!(f.name, "host.load");
    }

    fn ev(r: &mut Rules, source: &str, mark: Mark, t: u64) -> Option<Firing> {
        r.event(
            0,
            Seen {
                producer: "sim",
                name: "host.load",
                source,
            },
            mark,
            t,
        )
    }

    #[test]
    fn all_of_fires_only_when_every_source_holds_once() {
        let mut r = Rules::new(vec![all_of(60_000, 5000)], 0);
        assert_eq!(ev(&mut r, "a", Mark::Leave, 10), None);
        assert_eq!(ev(&mut r, "b", Mark::Leave, 10), None);
        assert_eq!(ev(&mut r, "a", Mark::Enter, 100), None);
        assert_eq!(ev(&mut r, "b", Mark::Leave, 110), None);
        assert_eq!(ev(&mut r, "zzz", Mark::Enter, 115), None, "not a listed source");
        let f = ev(&mut r, "b", Mark::Enter, 120).unwrap();
        assert_eq!(f.key, "page");
        assert_eq!(f.source, "a,b");
        assert_eq!(f.name, "host.load");
        assert_eq!(f.suppressed, 0);
        // Both stay down: no more firings, by events or ticks.
        for t in (200..3000).step_by(100) {
            assert_eq!(ev(&mut r, "a", Mark::Enter, t), None);
            assert_eq!(ev(&mut r, "b", Mark::Enter, t + 1), None);
            assert!(r.tick(t + 2).is_empty());
        }
        assert_eq!(r.holding(0, 3000), vec![("a".into(), true), ("b".into(), true)]);
    }

    #[test]
    fn all_of_rearms_when_one_recovers_and_respects_hold_down() {
        let mut r = Rules::new(vec![all_of(1000, 5000)], 0);
        ev(&mut r, "a", Mark::Enter, 0);
        assert!(ev(&mut r, "b", Mark::Enter, 0).is_some());
        ev(&mut r, "b", Mark::Leave, 100);
        assert_eq!(ev(&mut r, "b", Mark::Enter, 200), None, "hold-down");
        ev(&mut r, "b", Mark::Leave, 300);
        ev(&mut r, "a", Mark::Leave, 400);
        ev(&mut r, "a", Mark::Enter, 1500);
        let f = ev(&mut r, "b", Mark::Enter, 1600).unwrap();
        assert_eq!(f.suppressed, 1);
        // Unknown values only refresh liveness.
        assert_eq!(ev(&mut r, "a", Mark::None, 1700), None);
        assert_eq!(r.holding(0, 1700), vec![("a".into(), true), ("b".into(), true)]);
    }

    #[test]
    fn silence_counts_as_down_and_fires_on_a_tick() {
        let mut r = Rules::new(vec![all_of(60_000, 500)], 1000);
        // Never heard from either: stale 500 ms after the start.
        assert!(r.tick(1499).is_empty());
        let f = r.tick(1500);
        assert_eq!(keys(&f), vec![("page", 0)]);
        assert_eq!(f[0].name, "");
        // Both report healthy: re-armed.
        ev(&mut r, "a", Mark::Leave, 1600);
        ev(&mut r, "b", Mark::Leave, 1600);
        assert!(r.tick(1700).is_empty());
        // a goes down; b goes silent: stale at 2100 -> fires without a new event, but the
        // hold-down (60 s) suppresses it; after the hold-down a new episode fires.
        ev(&mut r, "a", Mark::Enter, 1800);
        assert!(r.tick(2099).is_empty());
        assert!(r.tick(2100).is_empty(), "held down");
        ev(&mut r, "b", Mark::Leave, 70_000);
        ev(&mut r, "a", Mark::Enter, 70_000);
        assert!(r.tick(70_100).is_empty());
        let f = r.tick(70_500);
        assert_eq!(keys(&f), vec![("page", 1)]);
    }

    #[test]
    fn an_event_from_a_live_source_keeps_it_from_being_stale() {
        let mut r = Rules::new(vec![all_of(0, 500)], 0);
        ev(&mut r, "a", Mark::Enter, 0);
        for t in (100..2000).step_by(100) {
            assert_eq!(ev(&mut r, "b", Mark::Leave, t), None);
            assert!(r.tick(t + 50).is_empty());
        }
        // b stops reporting: stale 500 ms after its last event, and a is still down.
        assert!(r.tick(2399).is_empty());
        assert_eq!(keys(&r.tick(2400)), vec![("page", 0)]);
    }

    #[test]
    fn rules_are_independent() {
        let mut r = Rules::new(vec![per_event(0), all_of(0, 1_000_000)], 0);
        assert!(r.event(0, seen("a"), Mark::Enter, 0).is_some());
        assert_eq!(r.event(1, seen("a"), Mark::Enter, 0), None);
        let f = r.event(1, seen("b"), Mark::Enter, 0).unwrap();
        assert_eq!(f.rule, 1);
        assert!(r.tick(10).is_empty());
    }

    fn parse(text: &str) -> Result<Vec<Rule>, MonitorError> {
        let cfg: MonitorConfig =
            gma_core::config::parse_toml(text, "m.toml").map_err(|e| MonitorError::Config(e.to_string()))?;
        validate(&cfg)
    }

    const GOOD: &str = r#"
directory = "127.0.0.1:7000"
[[rule]]
name = "restart-web"
events = ["proc.event"]
sources = ["*"]
when = 'watch == "web" and kind == "abnormal_exit"'
command = ["sh", "-c", "echo restart"]
[[rule]]
name = "page-db"
events = ["host.load"]
when = 'free_cpus == 0'
all_of = ["db-primary", "db-backup"]
command = ["true"]
hold_down_ms = 0
stale_ms = 2000
"#;

    #[test]
    fn config_defaults_and_all_of() {
        let rules = parse(GOOD).unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].hold_down_ms, DEFAULT_HOLD_DOWN_MS);
        assert_eq!(rules[0].command_timeout_ms, DEFAULT_COMMAND_TIMEOUT_MS);
        assert_eq!(rules[0].sources, vec!["*".to_string()]);
        assert!(rules[0].all_of.is_none());
        assert_eq!(rules[1].hold_down_ms, 0);
        assert_eq!(
            rules[1].all_of,
            Some(AllOf {
                sources: vec!["db-primary".into(), "db-backup".into()],
                stale_ms: 2000
            })
        );
        assert_eq!(
            rules[1].sources,
            vec!["db-primary".to_string(), "db-backup".to_string()]
        );
    }

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../config/monitor.toml");
        let rules = parse(text).unwrap();
        assert!(rules.iter().any(|r| r.all_of.is_some()));
    }

    #[test]
    fn config_errors_are_precise() {
        let cases: &[(&str, &str)] = &[
            ("[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"true\"]\nhold = 1\n", "line 6"),
            ("", "at least one rule"),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v >> 1'\ncommand = [\"true\"]\n",
                "rule \"x\": when: at column 4",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = ''\ncommand = [\"true\"]\n",
                "when must not be empty",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = []\nwhen = 'v > 1'\ncommand = [\"true\"]\n",
                "rule \"x\": events",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = []\n",
                "command must name a program",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\nstale_ms = 5\n",
                "stale_ms applies to all_of rules only",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\nall_of = []\n",
                "all_of must list at least one source",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\nall_of = [\"a\", \"a\"]\n",
                "all_of lists \"a\" twice",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\nall_of = [\"h*\"]\n",
                "all_of: ",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\nall_of = [\"a\"]\nsources = [\"b\"]\n",
                "not both",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\ncommand_timeout_ms = 0\n",
                "command_timeout_ms must be within",
            ),
            (
                "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\n[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\n",
                "same name",
            ),
            (
                "[[rule]]\nname = \"\"\nevents = [\"a\"]\nwhen = 'v > 1'\ncommand = [\"t\"]\n",
                "rule #1: name must not be empty",
            ),
            ("[[rule]]\nname = \"x\"\nevents = [\"a\"]\ncommand = [\"t\"]\n", "missing field `when`"),
        ];
        for (text, want) in cases {
            let err = parse(text).map(|_| ()).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "config {text:?}: error {err:?} lacks {want:?}"
            );
        }
    }

    #[test]
    fn when_errors_point_at_the_column() {
        let err = parse(
            "[[rule]]\nname = \"x\"\nevents = [\"a\"]\nwhen = 'kind == \"a\" andd v'\ncommand = [\"t\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("at column 13"), "{err}");
        assert!(
            err.contains("\n    kind == \"a\" andd v\n                ^"),
            "{err}"
        );
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn commands_report_exit_signal_timeout_and_spawn_failure() {
        let rt = rt();
        let o = rt.block_on(run_command(
            &sh("echo \"$GMA_RULE:$GMA_SOURCE\"; echo err >&2"),
            &[("GMA_RULE", "r1"), ("GMA_SOURCE", "h1")],
            Duration::from_secs(10),
        ));
        assert_eq!(o.outcome, "ok");
        assert_eq!(o.exit_status, 0.0);
        assert_eq!(o.stdout, b"r1:h1\n");
        assert_eq!(o.stderr, b"err\n");
        let o = rt.block_on(run_command(&sh("exit 3"), &[], Duration::from_secs(10)));
        assert_eq!((o.outcome.as_str(), o.exit_status), ("exit 3", 3.0));
        let o = rt.block_on(run_command(&sh("kill -9 $$"), &[], Duration::from_secs(10)));
        assert_eq!(o.outcome, "killed by signal 9");
        assert!(o.exit_status.is_nan());
        let t0 = Instant::now();
        // The grandchild (sleep) holds the pipes: the whole group must die for this to end fast.
        let o = rt.block_on(run_command(
            &sh("sleep 30; true"),
            &[],
            Duration::from_millis(200),
        ));
        assert_eq!(o.outcome, "timeout");
        assert!(o.exit_status.is_nan());
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        let o = rt.block_on(run_command(
            &["/nonexistent/gma-no-such-program".to_string()],
            &[],
            Duration::from_secs(1),
        ));
        assert!(o.outcome.starts_with("spawn failed: "), "{}", o.outcome);
    }

    #[test]
    fn command_output_is_capped() {
        let rt = rt();
        let o = rt.block_on(run_command(
            &sh("head -c 200000 /dev/zero"),
            &[],
            Duration::from_secs(10),
        ));
        assert_eq!(o.outcome, "ok");
        assert_eq!(o.stdout.len(), OUTPUT_CAP);
    }

    #[test]
    fn firing_events_fit_their_schema() {
        let hub = Hub::new(1, 16);
        hub.add_schemas(&[firing_schema()]).unwrap();
        let o = Outcome {
            outcome: "exit 3".into(),
            exit_status: 3.0,
            duration_ms: 12.0,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        let (_, r) = hub.publish(&[firing_event("ops", "r", "h1", &o, 2)]);
        r.unwrap();
    }

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn firing_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&firing_schema()),
            "monitor.firing v1: rule string, key string, outcome string, exit_status double, duration_ms double ms, suppressed double"
        );
    }
}
