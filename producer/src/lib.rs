//! gma-producer: a GMA producer.
//!
//! Sensors (host, agent, simulated hosts, and events pushed through `Ingest`) publish into the
//! [`hub`]: a bounded log of recent events plus a latest-value cache. Consumers `Query` the cache
//! or `Subscribe` to a stream read from the log with their own cursor ([`subscription`]), and
//! resume after a reconnect from their last seq. The [`registrar`] keeps the producer's record
//! and schemas in the directory under a lease, and re-registers by itself after the directory
//! comes back; streaming never depends on the directory being up.
//!
//! - [`hub`]: log, cache, schema registry, seq assignment.
//! - [`subscription`]: cursors, gaps, Unsubscribe registry, Query.
//! - [`service`]: the gRPC services (Producer, Ingest, Simulator).
//! - [`registrar`]: directory registration and lease keeping.
//! - [`error`]: the one error type and its mapping to gRPC status codes.
//! - [`cli`]: the agent's flags and start-up, shared by `gma producer` and `gma-agent`.
//! - [`budget`]: keeps the agent's own CPU within `cpu_budget_pct` by slowing its costliest
//!   sensors (`gma.budget` events).
//! - [`control`]: the `Control` service (sensor periods, enable/disable, runtime process
//!   watches), its `gma.audit` events and its state file (docs/control.md).
//! - [`derive`]: rolling summaries and forecasts as derived series.
//! - [`push`]: producer-initiated streams to consumers that accept them (`Consumer.Deliver`).
//! - [`prometheus`]: the latest sensor values in Prometheus text format (`gma producer
//!   --prometheus ADDR`).
//! - [`otlp`]: OTLP/gRPC metrics in (`gma producer --otlp-listen ADDR`, docs/otlp.md).
//! - [`telemetry`]: the names of the Prometheus metrics this crate records.
//! - `sampling`: the sensors of a period sampled together, once a tick, in one publish.
//! - `tick`: the clock of a sampling period (a kernel timer on Linux: one wake-up a tick).
//!
//! Every producer also monitors itself: its gRPC server runs behind a [`gma_core::rpc::RpcLayer`]
//! and, every `rpc_events_ms`, it publishes one `gma.rpc` event per RPC method into its own hub.

pub mod budget;
pub mod chunk;
pub mod cli;
pub mod control;
pub mod derive;
pub mod error;
pub mod hub;
pub mod otlp;
pub mod prometheus;
pub mod push;
pub mod registrar;
mod sampling;
pub mod send;
pub mod service;
pub mod subscription;
pub mod telemetry;
mod tick;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gma_core::registration::Registration;
use gma_core::rpc::RpcStats;
use gma_core::time::now_ns;
use gma_proto::v1 as pb;
use gma_sensors::sim::{SimConfig, SimHandle};
use gma_sensors::{AgentCounters, HostSensorConfig, Sensor};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The producer's one error type (start-up and RPCs; `From<Error> for tonic::Status`).
pub use error::Error;
/// The name [`Producer::new`] and [`Producer::run`] have always used for it.
pub use error::Error as ProducerError;
pub use hub::{Hub, SeriesHandle};
pub use subscription::Registry;

/// Producer configuration (`gma producer --config FILE`; flags override).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProducerConfig {
    /// Listen address (`127.0.0.1:7001`); used by the binary.
    pub listen: String,
    /// Source name of this host's events; default: the kernel host name.
    pub source: Option<String>,
    /// The registration keys (`directory`, none = standalone; `id`, default
    /// `<source>@<advertised address>`; `advertise`, `site`, `org`, `lease_ttl_ms`): see
    /// [`gma_core::registration::Registration`].
    #[serde(flatten)]
    pub registration: Registration,
    /// Host sensor sample period.
    pub period_ms: u64,
    /// `host.info` period.
    pub info_period_ms: u64,
    /// Per-sensor period overrides, by sensor name (`host.disk = 5000`, `sim = 500`).
    pub sensor_period_ms: std::collections::BTreeMap<String, u64>,
    /// Where the control changes (`gma agent set|enable|disable|watch`) are kept across
    /// restarts (`control.json`); none = they last until the producer stops.
    pub state_dir: Option<PathBuf>,
    /// Keep the agent's own CPU within this percent of one CPU by lengthening the periods of
    /// its costliest sensors (and restoring them when it fits); none = no budget.
    pub cpu_budget_pct: Option<f64>,
    /// How often the budget is checked.
    pub budget_check_ms: u64,
    /// Events kept for resuming consumers (the resume window).
    pub buffer_events: usize,
    /// Bytes those events may take at most (ring slots and values, `gma_producer::hub::
    /// stored_bytes`), the ring's memory as a configuration term: the oldest events go first
    /// when it is full, as past `buffer_events`. None = bounded by `buffer_events` only.
    pub buffer_bytes: Option<usize>,
    /// Run the real host sensors (/proc, /sys).
    pub host_sensors: bool,
    /// Packages whose versions `host.info` reports in `software` (at most 64 Debian package
    /// names); none = `gma_sensors::info::DEFAULT_PACKAGES`, `[]` = none.
    pub packages: Option<Vec<String>>,
    /// Every host command a sensor runs (`df`, `dpkg-query`, `sinfo`, `squeue`) is killed
    /// after this.
    pub command_timeout_ms: u64,
    /// Run the batch-queue sensor (`batch.queue`; off by itself without a batch system).
    pub batch: bool,
    /// `batch.queue` period.
    pub batch_period_ms: u64,
    /// The slurm.conf the batch sensor uses; none = `$SLURM_CONF`, else `/etc/slurm`.
    pub slurm_conf: Option<PathBuf>,
    /// Run the benchmark sensor (`host.bench`, its scores in `host.load`).
    pub bench: bool,
    /// Run time of each of the three benchmark kernels.
    pub bench_ms: u64,
    /// A later benchmark run waits this long after the last, and for an idle host.
    pub bench_every_s: u64,
    /// Run the security-event sensor (`host.auth`; off by itself without a journal or an
    /// auth log).
    pub auth: bool,
    /// The auth log `host.auth` follows; none = the journal when the host runs one, else
    /// `/var/log/auth.log` or `/var/log/secure`.
    pub auth_log: Option<PathBuf>,
    /// Simulated hosts (TOML file, see docs/simulation.md).
    pub simulate: Option<PathBuf>,
    /// Event-name patterns whose series always get 1m/10m/60m summaries (`<name>.avg1m` ...).
    pub summaries: Vec<String>,
    /// Event-name patterns whose series always get forecasts (`<name>.forecast`).
    pub forecasts: Vec<String>,
    /// Stream to consumers registered in the directory as accepting pushed events.
    pub push: bool,
    /// Watched processes (`[[process]]` tables): `proc.event` and `proc.usage`.
    pub process: Vec<gma_sensors::process::ProcessWatch>,
    /// SNMP devices (`[[snmp]]` tables, docs/snmp.md): `net.snmp.if`, `net.snmp.device`,
    /// `net.snmp.change`, polled every `snmp_period_ms`; listed in the directory record's
    /// attributes.
    pub snmp: Vec<gma_sensors::snmp::SnmpDevice>,
    /// Poll period of the SNMP devices. Default 10 s.
    pub snmp_period_ms: u64,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`: the `gma.rpc` period of this producer's own RPCs, 0 = none).
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
    /// Where the binary serves the latest sensor values as Prometheus gauges (`--prometheus`).
    pub prometheus: Option<String>,
    /// Where the binary accepts OTLP/gRPC metrics (`--otlp-listen`, docs/otlp.md): the
    /// producer's TLS, client CA and access policy apply there too.
    pub otlp_listen: Option<String>,
    /// The role this producer serves (`producer`, or the role embedding it: `rescheduler`,
    /// `relay`, ...): the `gma_<role>_rpc_*` metric prefix and the `role` of `gma.rpc` events.
    #[serde(skip)]
    pub role: String,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            listen: "127.0.0.1:0".into(),
            source: None,
            registration: Registration::default(),
            period_ms: 1000,
            info_period_ms: 60_000,
            sensor_period_ms: Default::default(),
            state_dir: None,
            cpu_budget_pct: None,
            budget_check_ms: 10_000,
            buffer_events: DEFAULT_BUFFER_EVENTS,
            buffer_bytes: None,
            host_sensors: true,
            packages: None,
            command_timeout_ms: 5000,
            batch: true,
            batch_period_ms: 10_000,
            slurm_conf: None,
            bench: true,
            bench_ms: 100,
            bench_every_s: 3600,
            auth: true,
            auth_log: None,
            simulate: None,
            summaries: Vec::new(),
            forecasts: Vec::new(),
            push: true,
            process: Vec::new(),
            snmp: Vec::new(),
            snmp_period_ms: 10_000,
            endpoint: Default::default(),
            prometheus: None,
            otlp_listen: None,
            role: "producer".into(),
        }
    }
}

/// Who a role's own producer is ([`Producer::embedded`]); the rest comes from the role's
/// endpoint.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Source name of its events.
    pub source: String,
    /// Where and as what it registers (the role's registration section).
    pub registration: Registration,
    /// Events kept for resuming consumers.
    pub buffer_events: usize,
    /// Stream its events to consumers that accept pushed events (archives).
    pub push: bool,
}

impl Identity {
    /// Source `source`, registered as `registration` says, with the producer defaults for the
    /// rest.
    pub fn new(source: impl Into<String>, registration: Registration) -> Identity {
        let d = ProducerConfig::default();
        Identity {
            source: source.into(),
            registration,
            buffer_events: d.buffer_events,
            push: d.push,
        }
    }
}

/// Reads the kernel host name (no shelling out).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A producer before it serves: its hub, sensors and simulation handle.
pub struct Producer {
    pub config: ProducerConfig,
    pub hub: Arc<Hub>,
    pub registry: Arc<Registry>,
    pub sim: Option<SimHandle>,
    pub counters: Arc<AgentCounters>,
    pub deriver: Arc<derive::Deriver>,
    /// Authorization policy and per-identity limits in front of every RPC (built once).
    pub gate: Arc<gma_core::guard::Gate>,
    /// The RPC figures of this producer's server (and, for a companion producer, of the role
    /// it publishes for: see [`Producer::with_rpc_stats`]).
    pub rpc: Arc<RpcStats>,
    /// A monitor's rules, steered through `Control/AddRule` and `RemoveRule`.
    pub rule_host: Option<Arc<dyn control::RuleHost>>,
    /// The listener of the OTLP metrics service ([`otlp`]), if any ([`Producer::with_otlp`]).
    otlp: Option<TcpListener>,
    sensors: Vec<Box<dyn Sensor>>,
}

impl Producer {
    /// Builds the hub and sensors and registers their schemas in the hub.
    pub fn new(config: ProducerConfig) -> Result<Producer, ProducerError> {
        if config.period_ms == 0 || config.period_ms > 3_600_000 {
            return Err(ProducerError::Config(
                "period_ms must be within 1..=3600000".into(),
            ));
        }
        if let Some(b) = config.cpu_budget_pct {
            if !(b > 0.0 && b <= 10_000.0) {
                return Err(ProducerError::Config(format!(
                    "cpu_budget_pct {b} must be within (0, 10000] (percent of one CPU)"
                )));
            }
        }
        if config.budget_check_ms < 100 || config.budget_check_ms > 3_600_000 {
            return Err(ProducerError::Config(
                "budget_check_ms must be within 100..=3600000".into(),
            ));
        }
        if config.buffer_events == 0 || config.buffer_events > 50_000_000 {
            return Err(ProducerError::Config(
                "buffer_events must be within 1..=50000000".into(),
            ));
        }
        if let Some(b) = config.buffer_bytes {
            if !(MIN_BUFFER_BYTES..=MAX_BUFFER_BYTES).contains(&b) {
                return Err(ProducerError::Config(format!(
                    "buffer_bytes {b} must be within {MIN_BUFFER_BYTES}..={MAX_BUFFER_BYTES} (or left out: bounded by buffer_events only)"
                )));
            }
        }
        let source = config.source.clone().unwrap_or_else(host_name);
        gma_core::pattern::validate_source(&source).map_err(|e| ProducerError::Config(e.to_string()))?;
        config
            .endpoint
            .validate()
            .and_then(|()| config.registration.validate())
            .map_err(|e| ProducerError::Config(e.to_string()))?;
        // The error names the file (cannot read / line and column of the mistake).
        let policy = gma_core::guard::load_policy(config.endpoint.access_policy.as_ref())
            .map_err(|e| ProducerError::Config(format!("policy: {e}")))?;
        let gate = Arc::new(gma_core::guard::Gate::new(policy, config.endpoint.limits.clone()));
        let epoch = now_ns().max(1) as u64;
        let hub = Hub::with_limits(
            epoch,
            hub::RingLimits {
                events: config.buffer_events,
                bytes: config.buffer_bytes,
                block_reserve: config.buffer_events,
            },
        );
        let counters = Arc::new(AgentCounters::default());
        let mut sensors: Vec<Box<dyn Sensor>> = Vec::new();
        let period = Duration::from_millis(config.period_ms);
        if config.host_sensors {
            let mut hc = HostSensorConfig {
                source: source.clone(),
                period,
                info_period: Duration::from_millis(config.info_period_ms.max(config.period_ms)),
                command_timeout: Duration::from_millis(config.command_timeout_ms.max(1)),
                batch: config.batch,
                batch_period: Duration::from_millis(config.batch_period_ms.max(1)),
                slurm_conf: config.slurm_conf.clone(),
                bench: config.bench,
                bench_budget: Duration::from_millis(config.bench_ms.clamp(1, 10_000)),
                bench_every: Duration::from_secs(config.bench_every_s.max(1)),
                auth: config.auth,
                auth_log: config.auth_log.clone(),
                ..HostSensorConfig::default()
            };
            if let Some(p) = &config.packages {
                gma_sensors::info::validate_packages(p).map_err(|e| ProducerError::Config(e.to_string()))?;
                hc.packages.clone_from(p);
            }
            sensors.extend(gma_sensors::host_sensors(&hc));
            sensors.push(gma_sensors::agent_sensor(&source, period, counters.clone()));
        }
        let mut sim = None;
        if let Some(path) = &config.simulate {
            let cfg = SimConfig::load(path)?;
            let (sensor, handle) = gma_sensors::sim::simulation(cfg);
            sensors.push(sensor);
            sim = Some(handle);
        }
        if !config.process.is_empty() {
            sensors.push(Box::new(gma_sensors::process::ProcessSensor::new(
                &source,
                period,
                config.process.clone(),
                PathBuf::from("/proc"),
            )?));
        }
        if !config.snmp.is_empty() {
            if config.snmp_period_ms == 0 || config.snmp_period_ms > 3_600_000 {
                return Err(ProducerError::Config(
                    "snmp_period_ms must be within 1..=3600000".into(),
                ));
            }
            sensors.push(Box::new(gma_sensors::snmp::SnmpSensor::new(
                Duration::from_millis(config.snmp_period_ms),
                config.snmp.clone(),
            )?));
        }
        for (name, ms) in &config.sensor_period_ms {
            if !sensors.iter().any(|s| s.name() == name) {
                let known: Vec<&str> = sensors.iter().map(|s| s.name()).collect();
                return Err(ProducerError::Config(format!(
                    "sensor_period_ms names unknown sensor {name:?} (running: {})",
                    known.join(", ")
                )));
            }
            if *ms == 0 || *ms > 3_600_000 {
                return Err(ProducerError::Config(format!(
                    "sensor_period_ms.{name} must be within 1..=3600000"
                )));
            }
        }
        if config.endpoint.rpc_events_ms() > 0 {
            hub.add_schemas(&[gma_core::rpc::rpc_schema()])
                .map_err(|e| ProducerError::Config(format!("gma.rpc: {e}")))?;
        }
        if config.role.is_empty() || !config.role.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(ProducerError::Config(format!(
                "role {:?} must be lowercase letters and '_'",
                config.role
            )));
        }
        let rpc = RpcStats::new(&config.role);
        for s in &sensors {
            hub.add_schemas(&s.schemas())
                .map_err(|e| ProducerError::Config(format!("sensor {}: {e}", s.name())))?;
        }
        let deriver = Arc::new(derive::Deriver::default());
        let config_rule = |patterns: &[String], windows: &[gma_core::rolling::Window], forecast: bool| {
            if patterns.is_empty() {
                return Ok(());
            }
            let selector = subscription::Selector {
                patterns: gma_core::pattern::event_patterns(patterns)
                    .map_err(|e| ProducerError::Config(format!("summaries/forecasts: {e}")))?,
                sources: Vec::new(),
            };
            deriver
                .activate(&hub, &selector, windows, forecast)
                .map(|_| ())
                .map_err(|e| ProducerError::Config(e.to_string()))
        };
        config_rule(&config.summaries, &gma_core::rolling::WINDOWS, false)?;
        config_rule(&config.forecasts, &[], true)?;
        Ok(Producer {
            config: ProducerConfig {
                source: Some(source),
                ..config
            },
            hub,
            registry: Arc::new(Registry::default()),
            sim,
            counters,
            deriver,
            gate,
            rpc,
            rule_host: None,
            otlp: None,
            sensors,
        })
    }

    /// Serves the OTLP metrics service ([`otlp`]) on `listener` too, with this producer's TLS,
    /// limits and access policy, until the producer stops.
    pub fn with_otlp(mut self, listener: TcpListener) -> Producer {
        self.otlp = Some(listener);
        self
    }

    /// The producer of a role's own events (a broker's decisions, a relay's site load, the
    /// directory's and the archiver's `gma.rpc`): no host sensors; TLS, policy, limits and the
    /// `gma.rpc` period from the role's `endpoint`; `role` names its metrics and `gma.rpc`
    /// events; `who` says which source and record it is; `schemas` are registered in its hub.
    pub fn embedded(
        role: &str,
        endpoint: &gma_core::endpoint::Endpoint,
        who: Identity,
        schemas: &[pb::EventSchema],
    ) -> Result<Producer, ProducerError> {
        let Identity {
            source,
            registration,
            buffer_events,
            push,
        } = who;
        let p = Producer::new(ProducerConfig {
            source: Some(source),
            registration,
            buffer_events,
            host_sensors: false,
            push,
            endpoint: endpoint.clone(),
            role: role.into(),
            ..ProducerConfig::default()
        })?;
        if !schemas.is_empty() {
            p.hub
                .add_schemas(schemas)
                .map_err(|e| ProducerError::Config(format!("{role} schemas: {e}")))?;
        }
        Ok(p)
    }

    /// Records this producer's RPCs into `stats` (and publishes `stats` as `gma.rpc`) instead
    /// of its own: a role without a hub of its own (the directory, the archiver) runs a
    /// companion producer that shares the role's figures.
    pub fn with_rpc_stats(mut self, stats: Arc<RpcStats>) -> Producer {
        self.rpc = stats;
        self
    }

    /// Serves on `listener` until `shutdown` resolves: sensors sample, the registrar keeps the
    /// directory record, consumers are served.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ProducerError> {
        self.run_with(listener, shutdown, |routes| routes).await
    }

    /// Like [`Producer::run`], with the role's own gRPC services added to the same endpoint by
    /// `extra` (a broker serves `Broker` beside the producer of its decision events).
    pub async fn run_with(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        extra: impl FnOnce(gma_core::conn::Services) -> gma_core::conn::Services,
    ) -> Result<(), ProducerError> {
        let Producer {
            config,
            hub,
            registry,
            sim,
            counters,
            deriver,
            gate,
            rpc,
            rule_host,
            otlp,
            sensors,
        } = self;
        let bound = listener.local_addr()?;
        let tls = config.endpoint.tls.rustls_config(bound)?;
        let address = config.registration.address(bound);
        let (stop_tx, stop_rx) = watch::channel(false);
        let stop_tx = Arc::new(stop_tx);
        let control = control::Control::new(
            hub.clone(),
            config.source.clone().unwrap_or_default(),
            Duration::from_millis(config.period_ms),
            config.state_dir.clone(),
            config.cpu_budget_pct,
        )?;
        hub.add_schemas(&[budget::budget_schema()])
            .map_err(|e| ProducerError::Config(format!("gma.budget: {e}")))?;
        let sensor_tasks = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sampling = sampling::Sampling::new(hub.clone(), counters.clone(), stop_rx.clone());
        let spawner: control::Spawner = {
            let (sampling, tasks) = (sampling.clone(), sensor_tasks.clone());
            Arc::new(move |sensor, slot, setting| {
                let task = tokio::spawn(sampling::sensor_loop(sensor, slot, setting, sampling.clone()));
                tasks.lock().push(task);
            })
        };
        for sensor in sensors {
            let period = config
                .sensor_period_ms
                .get(sensor.name())
                .map(|ms| Duration::from_millis(*ms))
                .unwrap_or_else(|| sensor.period());
            let (slot, setting) = control.register(sensor.name(), period);
            spawner(sensor, slot, setting);
        }
        hub.add_schemas(&gma_sensors::process::process_schemas())
            .map_err(|e| ProducerError::Config(format!("proc.event: {e}")))?;
        control.set_spawner(spawner);
        control.start_persisted_watches();
        if let Some(host) = rule_host {
            control.set_rule_host(host);
        }
        if let Some(b) = config.cpu_budget_pct {
            tokio::spawn(budget::run(
                control.clone(),
                b,
                Duration::from_millis(config.budget_check_ms),
                stop_rx.clone(),
            ));
        }
        tokio::spawn(derive::run(deriver.clone(), hub.clone(), stop_rx.clone()));
        if config.endpoint.rpc_events_ms() > 0 {
            sampling.publish_rpc(
                rpc.clone(),
                config.source.clone().unwrap_or_default(),
                Duration::from_millis(config.endpoint.rpc_events_ms()),
            );
        }
        let mut registrar_task = None;
        // A refusal of the first registration stops the producer (see registrar::run).
        let (refused_tx, refused_rx) = tokio::sync::oneshot::channel::<ProducerError>();
        if let Some(dir) = &config.registration.directory {
            let id = config
                .registration
                .record_id(config.source.as_deref().unwrap_or_default(), &address);
            let reg = registrar::Registration {
                directory: dir.clone(),
                id: id.clone(),
                address: address.clone(),
                ttl_ms: config.registration.lease_ttl_ms,
                site: config.registration.site.clone(),
                org: config.registration.org.clone(),
                attributes: gma_sensors::snmp::directory_attributes(&config.snmp),
            };
            let registration = registrar::run(reg, hub.clone(), stop_rx.clone());
            registrar_task = Some(tokio::spawn(async move {
                if let Err(e) = registration.await {
                    let _ = refused_tx.send(e);
                }
            }));
            if config.push {
                let pusher = push::Pusher {
                    gate: gate.clone(),
                    hub: hub.clone(),
                    registry: registry.clone(),
                    deriver: deriver.clone(),
                    config: push::PushConfig {
                        directory: dir.clone(),
                        producer_id: id,
                        address: address.clone(),
                    },
                };
                tokio::spawn(pusher.run(stop_rx.clone()));
            }
        }
        tracing::info!(%address, "producer serving");
        let max = gma_core::MAX_MESSAGE_BYTES;
        let producer = service::ProducerService {
            hub: hub.clone(),
            registry: registry.clone(),
            deriver,
            gate: gate.clone(),
        };
        // On shutdown: stop sensors and the registrar (which removes our record), and end every
        // subscription stream so the server's graceful shutdown does not wait on consumers.
        let stopping = stop_tx.clone();
        let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
        let refused = Arc::new(parking_lot::Mutex::new(None::<ProducerError>));
        let refusal = refused.clone();
        let shutdown = async move {
            tokio::select! {
                _ = shutdown => {}
                Ok(e) = refused_rx => *refusal.lock() = Some(e),
            }
            // Sensors stop first; then every stream sends the events it has not sent yet and
            // ends (bounded: a consumer that does not read is cut off after DRAIN_TIMEOUT).
            let _ = stopping.send(true);
            let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
            // A sensor in the middle of a sample publishes it before it stops.
            let tasks = std::mem::take(&mut *sensor_tasks.lock());
            for t in tasks {
                let _ = tokio::time::timeout_at(deadline, t).await;
            }
            registry.drain();
            while !registry.is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let n = registry.cancel_every();
            tracing::info!(cut_off = n, "producer shutting down");
            let _ = drained_tx.send(());
        };
        let otlp_task = match otlp {
            Some(l) => {
                let tls = config.endpoint.tls.rustls_config(l.local_addr()?)?;
                let server = gma_core::conn::grpc_server(&config.endpoint.limits)
                    .layer(gma_core::rpc::RpcLayer::new(rpc.clone()));
                let services = gma_core::conn::Services::new().add_service(otlp::OtlpMetricsServer::new(
                    otlp::OtlpMetrics {
                        hub: hub.clone(),
                        gate: gate.clone(),
                    },
                ));
                let incoming = gma_core::conn::Incoming::grpc(l, tls, &config.endpoint.limits, "producer");
                let mut stop = stop_rx.clone();
                let stopped = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                Some(tokio::spawn(gma_core::conn::serve_grpc(
                    server, services, incoming, stopped,
                )))
            }
            None => None,
        };
        let services = gma_core::conn::Services::new()
            .add_service(send::ProducerGrpc::new(producer, max))
            .add_service(
                pb::ingest_server::IngestServer::new(service::IngestService {
                    hub: hub.clone(),
                    gate: gate.clone(),
                })
                .max_decoding_message_size(max),
            )
            .add_service(
                pb::control_server::ControlServer::new(control::ControlService {
                    control,
                    gate: gate.clone(),
                })
                .max_decoding_message_size(max),
            )
            .add_service(
                pb::simulator_server::SimulatorServer::new(service::SimulatorService { sim, gate })
                    .max_decoding_message_size(max),
            );
        let server =
            gma_core::conn::grpc_server(&config.endpoint.limits).layer(gma_core::rpc::RpcLayer::new(rpc));
        let incoming = gma_core::conn::Incoming::grpc(listener, tls, &config.endpoint.limits, "producer");
        let serve = gma_core::conn::serve_grpc(server, extra(services), incoming, shutdown);
        // Closing a connection gracefully (HTTP/2 GOAWAY) waits for the consumer to answer a
        // PING: a consumer that does not run (stopped with SIGSTOP, swapped out) would hold the
        // producer's exit until its keep-alive timeout. Once the streams are drained,
        // connections get CLOSE_TIMEOUT to close, then are cut.
        let cut = async move {
            if drained_rx.await.is_ok() {
                tokio::time::sleep(CLOSE_TIMEOUT).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            r = serve => r,
            () = cut => {
                tracing::warn!("connections still open {CLOSE_TIMEOUT:?} after the drain (a consumer not answering); cut off");
                Ok(())
            }
        };
        let _ = stop_tx.send(true);
        if let Some(t) = otlp_task {
            match tokio::time::timeout(CLOSE_TIMEOUT, t).await {
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the OTLP listener failed"),
                Ok(Err(e)) => tracing::warn!(error = %e, "the OTLP listener's task failed"),
                Ok(Ok(Ok(()))) | Err(_) => {}
            }
        }
        if let Some(t) = registrar_task {
            // The registrar removes our record on the way out (bounded by its own timeout).
            let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
        }
        if let Some(e) = refused.lock().take() {
            return Err(e);
        }
        result.map_err(ProducerError::from)
    }
}

/// Smallest `buffer_bytes`: one page.
/// The ring's size in events unless configured (`buffer_events`): the resume window, and under
/// the block policy how far the slowest subscription may lag.
pub const DEFAULT_BUFFER_EVENTS: usize = 100_000;

pub const MIN_BUFFER_BYTES: usize = 4096;
/// Largest `buffer_bytes`: 64 GiB.
pub const MAX_BUFFER_BYTES: usize = 64 << 30;

/// How long a stopping producer lets its streams deliver the events they have not sent yet.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a stopping producer waits, after the drain, for its connections to close.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Convenience: build and run a producer.
pub async fn run(
    config: ProducerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ProducerError> {
    Producer::new(config)?.run(listener, shutdown).await
}
