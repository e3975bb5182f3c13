//! gma-relay: a compound consumer/producer (a GMA "intermediary"), run by `gma relay` through
//! [`run`]`(config, listener, shutdown)`.
//!
//! It subscribes, through the directory, to the producers of a site and republishes under its
//! own directory record:
//!
//! - `site.load` (source = the site name), every `period_ms`: a summary of the latest
//!   `host.load` of every host (event source) seen, over the hosts that are up;
//! - every event whose name matches a `relay` pattern, unchanged (name, source, timestamp,
//!   values; the relay assigns its own seqs), with the schema the upstream stream declared.
//!
//! Consumers near the relay subscribe to it instead of to every producer, with every producer
//! feature (resume, filters, summaries, policies): the relay *is* a producer.
//!
//! Loops: the relay never follows its own record nor any record whose id starts with
//! `relay-<site>@` (the default id of a relay of the same site) or whose attributes carry
//! `relay_site = <site>`; it never relays `site.load`; and it drops an event that is not newer
//! than the last one it relayed of the same series (so an event that comes back round a loop,
//! or arrives twice by two paths, is published once). See docs/relay.md.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Exclusions, Subscriber, SubscriberOptions};
use gma_core::codec::{OwnedEvent, SeriesInfo};
use gma_core::event::{dbl, schema, EventData};
use gma_core::pattern::Pattern;
use gma_core::time::now_ns;
use gma_producer::{Hub, ProducerConfig};
use gma_proto::v1 as pb;
use serde::Deserialize;
use tokio::net::TcpListener;

pub mod telemetry;

/// Why a relay cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The configuration is invalid (the message names the key to change).
    #[error("{0}")]
    Config(String),
    /// The relay's own producer could not be set up.
    #[error("{0}")]
    Producer(String),
    /// The relay's producer or subscriber stopped.
    #[error("{0}")]
    Stopped(String),
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
}

/// `return Err(RelayError::Config(format!(...)))`.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err(RelayError::Config(format!($($t)*)))
    };
}

/// `RelayError::Config(format!(...))`.
macro_rules! config_err {
    ($($t:tt)*) => {
        RelayError::Config(format!($($t)*))
    };
}

/// The summary event the relay publishes.
pub const SITE_LOAD: &str = "site.load";
/// The upstream event the summary is computed from.
const HOST_LOAD: &str = "host.load";
/// Record attribute naming the site a relay serves (skipped by relays of that site).
pub const RELAY_SITE_ATTRIBUTE: &str = "relay_site";
/// Staleness threshold, when `stale_ms` is not configured, for a host whose period is not
/// known yet (fewer than two `host.load` events seen).
const DEFAULT_STALE_MS: u64 = 5000;
/// Staleness threshold, when `stale_ms` is not configured: this many periods of the host.
const STALE_PERIODS: i64 = 3;

/// The relay's TOML file (`gma relay --config FILE`; flags override `listen` and `directory`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    #[serde(default)]
    pub listen: Option<String>,
    /// The registration keys ([`gma_core::registration::Registration`]): `site`, the site name,
    /// the source of `site.load` (required); `directory` (required); `id`, the record id
    /// (default `relay-<site>@<address>`); `advertise`, `org`, `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    /// `site.load` period.
    #[serde(default = "default_period_ms")]
    pub period_ms: u64,
    /// A host is up while its latest `host.load` is younger than this. Unset: three times the
    /// host's own period (as observed), 5000 ms until the period is known.
    #[serde(default)]
    pub stale_ms: Option<u64>,
    /// Event-name patterns republished unchanged.
    #[serde(default)]
    pub relay: Vec<String>,
    /// Source patterns to follow (default: all).
    #[serde(default)]
    pub sources: Vec<String>,
    /// Events kept for resuming consumers of the relay.
    #[serde(default = "default_buffer_events")]
    pub buffer_events: usize,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

fn default_period_ms() -> u64 {
    1000
}
fn default_buffer_events() -> usize {
    ProducerConfig::default().buffer_events
}

impl RelayConfig {
    /// Checks every key; the message names the key to change.
    pub fn validate(&self) -> Result<(), RelayError> {
        let site = &self.registration.site;
        if site.is_empty() {
            bail!("missing field `site`: give the relay's site name (site = \"...\")");
        }
        gma_core::pattern::validate_source(site)
            .map_err(|e| config_err!("site {site:?} is not a valid source name: {e}"))?;
        if self.period_ms == 0 || self.period_ms > 3_600_000 {
            bail!("period_ms must be within 1..=3600000");
        }
        if let Some(s) = self.stale_ms {
            if s == 0 || s > 86_400_000 {
                bail!("stale_ms must be within 1..=86400000");
            }
        }
        for p in &self.relay {
            let pat = Pattern::event(p).map_err(|e| config_err!("relay: {e}"))?;
            if pat.matches(SITE_LOAD) && pat.is_exact() {
                bail!("relay: {SITE_LOAD} is the relay's own summary and is never relayed");
            }
        }
        gma_core::pattern::source_patterns(&self.sources).map_err(|e| config_err!("sources: {e}"))?;
        self.endpoint
            .validate()
            .and_then(|()| self.registration.validate())
            .map_err(|e| RelayError::Config(e.to_string()))?;
        Ok(())
    }
}

/// The `site.load` schema.
pub fn site_load_schema() -> pb::EventSchema {
    schema(
        SITE_LOAD,
        "summary of the latest host.load of a site's hosts, by a gma relay",
        vec![
            dbl("hosts_up", "hosts", "hosts whose latest host.load is not stale"),
            dbl(
                "hosts_known",
                "hosts",
                "hosts that published host.load since the relay started",
            ),
            dbl(
                "free_cpus_sum",
                "cpus",
                "free CPUs over the up hosts (0 when none is up)",
            ),
            dbl(
                "free_cpus_max",
                "cpus",
                "most free CPUs of one up host (NaN when none is up)",
            ),
            dbl(
                "total_cpus_sum",
                "cpus",
                "logical CPUs over the up hosts (0 when none is up)",
            ),
            dbl(
                "load_mean",
                "tasks",
                "mean 1-minute load of the up hosts (NaN when none is up)",
            ),
            dbl(
                "load_max",
                "tasks",
                "highest 1-minute load of an up host (NaN when none is up)",
            ),
            dbl(
                "memory_mb_sum",
                "MiB",
                "memory over the up hosts (0 when none is up)",
            ),
        ],
    )
}

/// The latest `host.load` of one host.
#[derive(Debug, Clone, Copy)]
struct HostLoad {
    timestamp_ns: i64,
    /// Interval between its last two `host.load` events, once seen.
    period_ns: Option<i64>,
    load1: f64,
    free_cpus: f64,
    total_cpus: f64,
    memory_mb: f64,
}

/// The site summary's inputs: the latest `host.load` per host.
#[derive(Debug, Default)]
pub struct SiteSummary {
    hosts: BTreeMap<String, HostLoad>,
    stale_ms: Option<u64>,
}

/// Max that propagates NaN (a host reporting NaN makes the max undefined, as it does a sum).
fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

impl SiteSummary {
    pub fn new(stale_ms: Option<u64>) -> SiteSummary {
        SiteSummary {
            hosts: BTreeMap::new(),
            stale_ms,
        }
    }

    /// Takes one `host.load` event (older or duplicate events of a host are ignored).
    pub fn observe(&mut self, e: &OwnedEvent) {
        let r = e.as_ref();
        let n = |f: &str| r.number(f).unwrap_or(f64::NAN);
        let ts = e.timestamp_ns;
        let prev = self.hosts.get(&e.series.source);
        if prev.is_some_and(|p| p.timestamp_ns >= ts) {
            return;
        }
        let period_ns = prev.map(|p| ts - p.timestamp_ns);
        self.hosts.insert(
            e.series.source.clone(),
            HostLoad {
                timestamp_ns: ts,
                period_ns,
                load1: n("load1"),
                free_cpus: n("free_cpus"),
                total_cpus: n("total_cpus"),
                memory_mb: n("memory_mb"),
            },
        );
    }

    fn stale_ns(&self, h: &HostLoad) -> i64 {
        match (self.stale_ms, h.period_ns) {
            (Some(ms), _) => ms as i64 * 1_000_000,
            (None, Some(p)) => p.saturating_mul(STALE_PERIODS),
            (None, None) => DEFAULT_STALE_MS as i64 * 1_000_000,
        }
    }

    /// The `site.load` values at `now_ns`, in schema field order.
    pub fn values(&self, now_ns: i64) -> Vec<f64> {
        let mut up = 0usize;
        let (mut free_sum, mut free_max) = (0.0, f64::NEG_INFINITY);
        let (mut total_sum, mut mem_sum) = (0.0, 0.0);
        let (mut load_sum, mut load_max) = (0.0, f64::NEG_INFINITY);
        for h in self.hosts.values() {
            if now_ns - h.timestamp_ns >= self.stale_ns(h) {
                continue;
            }
            up += 1;
            free_sum += h.free_cpus;
            free_max = max_nan(free_max, h.free_cpus);
            total_sum += h.total_cpus;
            mem_sum += h.memory_mb;
            load_sum += h.load1;
            load_max = max_nan(load_max, h.load1);
        }
        let (free_max, load_mean, load_max) = if up == 0 {
            (f64::NAN, f64::NAN, f64::NAN)
        } else {
            (free_max, load_sum / up as f64, load_max)
        };
        vec![
            up as f64,
            self.hosts.len() as f64,
            free_sum,
            free_max,
            total_sum,
            load_mean,
            load_max,
            mem_sum,
        ]
    }
}

/// Republishes matching events into the relay's hub.
struct Relayer {
    patterns: Vec<Pattern>,
    /// Schemas added to the hub, by event name: (version, fields).
    schemas: HashMap<String, (u32, Arc<[pb::FieldSpec]>)>,
    /// Timestamp of the last event relayed, per (name, source).
    last: HashMap<(String, String), i64>,
    warned: HashSet<String>,
    errors: u64,
}

impl Relayer {
    fn new(patterns: Vec<Pattern>) -> Relayer {
        Relayer {
            patterns,
            schemas: HashMap::new(),
            last: HashMap::new(),
            warned: HashSet::new(),
            errors: 0,
        }
    }

    fn wants(&self, name: &str) -> bool {
        name != SITE_LOAD && self.patterns.iter().any(|p| p.matches(name))
    }

    /// Makes sure the hub knows the schema `series` was declared with. False: the event cannot
    /// be relayed (a conflicting definition; logged once per name and version).
    fn ensure_schema(&mut self, hub: &Hub, series: &SeriesInfo) -> bool {
        if let Some((v, fields)) = self.schemas.get(&series.name) {
            if *v == series.schema_version && **fields == *series.fields {
                return true;
            }
            if *v > series.schema_version {
                // An older version: the hub keeps the newer; series created with the older one
                // still take these events (publish checks the layout).
                return true;
            }
        }
        let schema = pb::EventSchema {
            name: series.name.clone(),
            version: series.schema_version,
            fields: series.fields.to_vec(),
            description: String::new(),
        };
        match hub.add_schemas(&[schema]) {
            Ok(()) => {
                self.schemas.insert(
                    series.name.clone(),
                    (series.schema_version, series.fields.clone()),
                );
                true
            }
            Err(e) => {
                if self
                    .warned
                    .insert(format!("{}/{}", series.name, series.schema_version))
                {
                    tracing::warn!(event = %series.name, version = series.schema_version, error = %e,
                        "cannot relay: conflicting schema");
                }
                false
            }
        }
    }

    /// Relays the matching events of one upstream batch; returns how many were published.
    fn relay(&mut self, hub: &Hub, events: &[OwnedEvent]) -> usize {
        let mut out = Vec::new();
        for e in events {
            let s = &e.series;
            if !self.wants(&s.name) || !self.ensure_schema(hub, s) {
                continue;
            }
            let key = (s.name.clone(), s.source.clone());
            match self.last.get_mut(&key) {
                // Not newer than what we relayed: a duplicate (two paths) or a loop.
                Some(t) if *t >= e.timestamp_ns => continue,
                Some(t) => *t = e.timestamp_ns,
                None => {
                    self.last.insert(key, e.timestamp_ns);
                }
            }
            out.push(EventData {
                name: s.name.clone(),
                source: s.source.clone(),
                timestamp_ns: e.timestamp_ns,
                numbers: e.numbers.clone(),
                strings: e.strings.clone(),
            });
        }
        if out.is_empty() {
            return 0;
        }
        metrics::counter!(telemetry::EVENTS).increment(out.len() as u64);
        if let (_, Err(err)) = hub.publish(&out) {
            self.errors += 1;
            if self.errors == 1 || self.errors.is_multiple_of(100) {
                tracing::warn!(error = %err, errors = self.errors, "relayed events rejected");
            }
        }
        out.len()
    }
}

/// Runs a relay until `shutdown` resolves: its own producer on `listener` (registered in the
/// directory) and the subscription to the site's producers. TLS and the access policy are those
/// of `cfg` (the caller applies its flags).
pub async fn run(
    cfg: RelayConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    cfg.validate()?;
    let directory = cfg
        .registration
        .required_directory()
        .map_err(|e| RelayError::Config(e.to_string()))?;
    let site = cfg.registration.site.clone();
    let bound = listener.local_addr()?;
    let id = cfg
        .registration
        .record_id(&format!("relay-{site}"), &cfg.registration.address(bound));
    let p = gma_producer::Producer::embedded(
        "relay",
        &cfg.endpoint,
        gma_producer::Identity {
            buffer_events: cfg.buffer_events,
            // Archives get relayed events from their origin producers; pushing them again from
            // here would store them twice. Consumers of the relay subscribe to it.
            push: false,
            ..gma_producer::Identity::new(
                &site,
                gma_core::registration::Registration {
                    id: Some(id.clone()),
                    ..cfg.registration.clone()
                },
            )
        },
        &[site_load_schema()],
    )
    .map_err(|e| RelayError::Producer(e.to_string()))?;
    let hub = p.hub.clone();

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut producer = tokio::spawn(p.run(listener, async move {
        let _ = stop_rx.wait_for(|v| *v).await;
    }));

    let relay_patterns = gma_core::pattern::event_patterns(&cfg.relay).unwrap_or_default();
    let mut patterns = vec![HOST_LOAD.to_string()];
    patterns.extend(cfg.relay.iter().filter(|p| p.as_str() != HOST_LOAD).cloned());
    let mut sub = Subscriber::start_excluding(
        SubscriberOptions {
            directory,
            stream: StreamOptions {
                patterns,
                sources: cfg.sources.clone(),
                consumer_id: id.clone(),
                ..StreamOptions::default()
            },
            capacity: 256,
            default_resume: None,
        },
        HashMap::new(),
        Exclusions {
            ids: vec![id.clone(), format!("relay-{site}@*")],
            attributes: vec![(RELAY_SITE_ATTRIBUTE.into(), site.clone())],
        },
    );
    let mut relayer = Relayer::new(relay_patterns);
    let mut summary = SiteSummary::new(cfg.stale_ms);
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.period_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            r = &mut producer => {
                break match r {
                    Ok(Ok(())) => Err(RelayError::Stopped("the relay's producer stopped".into())),
                    Ok(Err(e)) => Err(RelayError::Stopped(format!("producer failed: {e}"))),
                    Err(e) => Err(RelayError::Stopped(format!("producer task failed: {e}"))),
                };
            }
            _ = tick.tick() => {
                let now = now_ns();
                let ev = EventData {
                    name: SITE_LOAD.into(),
                    source: site.clone(),
                    timestamp_ns: now,
                    numbers: summary.values(now),
                    strings: Vec::new(),
                };
                metrics::counter!(telemetry::SITE_LOAD).increment(1);
                if let (_, Err(e)) = hub.publish(&[ev]) {
                    tracing::warn!(error = %e, "cannot publish {SITE_LOAD}");
                }
            }
            d = sub.recv() => match d {
                None => break Err(RelayError::Stopped("the relay's subscriber stopped".into())),
                Some(Delivery::Events { producer: from, events, .. }) => {
                    if from == id {
                        continue;
                    }
                    for e in events.iter().filter(|e| e.series.name == HOST_LOAD) {
                        summary.observe(e);
                    }
                    relayer.relay(&hub, &events);
                }
                Some(Delivery::Discovered { producer, address }) => {
                    tracing::info!(%producer, %address, "following producer");
                }
                Some(Delivery::Gap { producer, gap }) => {
                    tracing::warn!(%producer, from_seq = gap.from_seq, to_seq = gap.to_seq,
                        dropped = gap.dropped, reason = %gap.reason, "upstream gap");
                }
                Some(Delivery::Gone { producer, reason }) => {
                    tracing::info!(%producer, %reason, "producer left the directory");
                }
                Some(Delivery::Reconnecting { producer, error }) => {
                    tracing::debug!(%producer, %error, "reconnecting");
                }
                Some(Delivery::DirectoryDown { error }) => {
                    tracing::info!(%error, "directory unreachable; streams continue");
                }
                Some(Delivery::DirectoryRefused { error }) => {
                    break Err(RelayError::Stopped(format!("the directory refused the relay's watch: {error}")));
                }
                Some(Delivery::Refused { producer, error }) => {
                    tracing::warn!(%producer, %error, "producer refused the relay's subscription");
                }
                Some(Delivery::Subscribed { .. }) => {}
            },
        }
    };
    drop(sub);
    let _ = stop_tx.send(true);
    if !producer.is_finished() {
        // The producer removes its record on the way out (bounded by its own timeout).
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut producer).await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire contract: field names, types and units, in order.
    #[test]
    fn site_load_schema_is_pinned() {
        assert_eq!(
            gma_core::event::signature(&site_load_schema()),
            "site.load v1: hosts_up double hosts, hosts_known double hosts, free_cpus_sum double cpus, free_cpus_max double cpus, total_cpus_sum double cpus, load_mean double tasks, load_max double tasks, memory_mb_sum double MiB"
        );
    }
}
