//! The archiver role: configuration, ingest (subscriptions → keep-policy → store, group
//! commit), directory registration, retention, and the `Archive` gRPC endpoint.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use gma_consumer::registrar::{self, Catalog, Registration};
use gma_consumer::stream::StreamOptions;
use gma_consumer::subscriber::{Delivery, Subscriber, SubscriberOptions};
use gma_core::guard::{load_policy, Gate};
use gma_core::pattern::Pattern;
use gma_core::rpc::{RpcLayer, RpcStats};
use gma_proto::v1::{self as pb, archive_server::ArchiveServer};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::keep::{KeepRule, Keeper};
use crate::provenance::Stamper;
use crate::service::ArchiveService;
use crate::store::{Store, StoreOptions};
use crate::Counters;

/// The record attribute holding the archiver's `Archive` address (also its record's `address`;
/// the record says `gma.pull = true`, so producers do not push to it: it subscribes).
pub const ARCHIVE_ADDRESS_ATTR: &str = "archive.address";
/// The `manner` of archiver consumer records.
pub const MANNER: &str = "archive";

/// One `[[retention]]` rule: samples of matching events older than `max_age` are deleted.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionRule {
    pub pattern: String,
    /// `7d`, `12h`, `90m`, ...
    pub max_age: String,
}

/// Storage tuning (`[store]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreTuning {
    /// Rows per sealed chunk.
    pub chunk_rows: usize,
    /// Checkpoint (fold sealed chunks into the chunk log, trim the write-ahead log) when the
    /// write-ahead log grew by this many MiB ...
    pub checkpoint_wal_mib: u64,
    /// ... or this many seconds after the last checkpoint.
    pub checkpoint_interval_s: u64,
    /// The most MiB of write-ahead log a checkpoint keeps for rows still in open chunks (the
    /// open chunks whose first row lies in older segments are sealed then); 0 seals every open
    /// chunk at every checkpoint. Bounds the open rows in memory and the replay at start.
    pub wal_keep_mib: u64,
    /// The most MiB sled keeps in its page cache for the index (chunk index and stream
    /// dictionary pages); sled's own default is 1 GiB.
    pub index_cache_mib: u64,
}

impl Default for StoreTuning {
    fn default() -> Self {
        let d = StoreOptions::default();
        StoreTuning {
            chunk_rows: d.chunk_rows,
            checkpoint_wal_mib: d.checkpoint_wal_bytes >> 20,
            checkpoint_interval_s: d.checkpoint_interval.as_secs(),
            wal_keep_mib: d.wal_keep_bytes >> 20,
            index_cache_mib: d.index_cache_bytes >> 20,
        }
    }
}

/// `gma archiver --config FILE`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiverConfig {
    pub listen: String,
    /// The registration keys ([`gma_core::registration::Registration`]): `directory`, where
    /// producers are discovered and the archiver registers; `id`, the record id (default
    /// `archiver@<address>`), also the consumer id producers see; `advertise`, `site`, `org`,
    /// `lease_ttl_ms`.
    #[serde(flatten)]
    pub registration: gma_core::registration::Registration,
    /// Where the store lives (created if missing).
    pub data_dir: PathBuf,
    /// Event-name patterns archived.
    pub patterns: Vec<String>,
    /// Source patterns (empty = every source).
    pub sources: Vec<String>,
    /// How far behind a producer may let the archiver fall before it stops its writers' ring
    /// from overwriting (block policy reserve; 0 = producer default).
    pub queue_events: u32,
    /// Decoded deliveries (each at most [`MAX_BATCH`] events) that may wait for the ingest
    /// loop, all producers together: beyond them the subscriptions stop reading and the
    /// producers hold the events (block policy). Bounds the memory of events received and not
    /// yet appended (at start, a catch-up of every producer's ring).
    pub ingest_queue: usize,
    pub retention: Vec<RetentionRule>,
    /// How often retention runs.
    pub retention_interval_s: u64,
    pub keep: Vec<KeepRule>,
    /// Store each event's producer run and seq with it (fields `_gma_run`, `_gma_seq`), so
    /// the archive can be checked seq by seq ([`crate::provenance`]). A data directory keeps
    /// the setting it was created with.
    pub provenance: bool,
    pub store: StoreTuning,
    /// `[remote_write]`: forward what is archived to a Prometheus-compatible store
    /// ([`crate::remote_write`], docs/remote-write.md).
    pub remote_write: Option<crate::remote_write::RemoteWriteConfig>,
    /// Where to serve the Prometheus HTTP query API (PromQL over the archive,
    /// docs/promql.md), e.g. `127.0.0.1:9300`; none by default. Behind the endpoint's TLS
    /// (HTTPS with its certificate, client certificates of its client CA required) and policy.
    pub http_listen: Option<String>,
    /// Bounds of one PromQL query (`[promql]`).
    pub promql: crate::promql::PromqlConfig,
    /// The shared endpoint keys (`[tls]`, `access_policy`, `[limits]`, `metrics_listen`,
    /// `rpc_events_ms`): see [`gma_core::endpoint::Endpoint`].
    #[serde(flatten)]
    pub endpoint: gma_core::endpoint::Endpoint,
}

impl Default for ArchiverConfig {
    fn default() -> Self {
        ArchiverConfig {
            listen: "127.0.0.1:7300".into(),
            registration: Default::default(),
            data_dir: PathBuf::new(),
            patterns: vec!["*".into()],
            sources: Vec::new(),
            queue_events: 0,
            ingest_queue: DEFAULT_INGEST_QUEUE,
            retention: Vec::new(),
            retention_interval_s: 60,
            keep: Vec::new(),
            provenance: false,
            store: StoreTuning::default(),
            remote_write: None,
            http_listen: None,
            promql: Default::default(),
            endpoint: Default::default(),
        }
    }
}

pub use crate::error::Error as ArchiverError;

/// A validated configuration.
struct Checked {
    retention: Vec<(Pattern, i64)>,
    keeper: Keeper,
    gate: Gate,
    store: StoreOptions,
    remote_write: Option<crate::remote_write::Settings>,
}

impl ArchiverConfig {
    fn check(&self) -> Result<Checked, ArchiverError> {
        let bad = |m: String| ArchiverError::Config(m);
        if self.data_dir.as_os_str().is_empty() {
            return Err(bad("data_dir is required (--data DIR)".into()));
        }
        gma_core::pattern::event_patterns(&self.patterns).map_err(|e| bad(e.to_string()))?;
        gma_core::pattern::source_patterns(&self.sources).map_err(|e| bad(e.to_string()))?;
        let mut retention = Vec::new();
        for (i, r) in self.retention.iter().enumerate() {
            let p = Pattern::event(&r.pattern).map_err(|e| bad(format!("retention rule {}: {e}", i + 1)))?;
            let age = gma_core::time::parse_duration(&r.max_age)
                .map_err(|e| bad(format!("retention rule {}: max_age: {e}", i + 1)))?;
            if age <= 0 {
                return Err(bad(format!("retention rule {}: max_age must be positive", i + 1)));
            }
            retention.push((p, age));
        }
        if self.ingest_queue == 0 || self.ingest_queue > MAX_INGEST_QUEUE {
            return Err(bad(format!(
                "ingest_queue must lie in 1..={MAX_INGEST_QUEUE} (deliveries)"
            )));
        }
        if self.retention_interval_s == 0 {
            return Err(bad("retention_interval_s must be at least 1".into()));
        }
        if self.store.chunk_rows < 2 || self.store.chunk_rows > 1 << 20 {
            return Err(bad("store.chunk_rows must lie in 2..=1048576".into()));
        }
        if self.store.checkpoint_wal_mib == 0 || self.store.checkpoint_interval_s == 0 {
            return Err(bad(
                "store.checkpoint_wal_mib and store.checkpoint_interval_s must be at least 1".into(),
            ));
        }
        if self.store.wal_keep_mib > 1 << 20 {
            return Err(bad("store.wal_keep_mib must lie in 0..=1048576".into()));
        }
        if self.store.index_cache_mib == 0 || self.store.index_cache_mib > 1 << 20 {
            return Err(bad("store.index_cache_mib must lie in 1..=1048576".into()));
        }
        self.promql.validate()?;
        if let Some(h) = &self.http_listen {
            self.endpoint
                .tls
                .check_listen(h)
                .map_err(|e| bad(format!("http_listen {h}: {e}")))?;
        }
        let keeper = Keeper::new(&self.keep)?;
        let remote_write = self.remote_write.as_ref().map(|r| r.check()).transpose()?;
        self.endpoint
            .validate()
            .and_then(|()| self.registration.validate())
            .map_err(|e| bad(e.to_string()))?;
        let policy = load_policy(self.endpoint.access_policy.as_ref()).map_err(|e| bad(e.to_string()))?;
        Ok(Checked {
            retention,
            keeper,
            gate: Gate::new(policy, self.endpoint.limits.clone()),
            store: StoreOptions {
                chunk_rows: self.store.chunk_rows,
                checkpoint_wal_bytes: self.store.checkpoint_wal_mib << 20,
                checkpoint_interval: Duration::from_secs(self.store.checkpoint_interval_s),
                wal_keep_bytes: self.store.wal_keep_mib << 20,
                index_cache_bytes: self.store.index_cache_mib << 20,
                ..StoreOptions::default()
            },
            remote_write,
        })
    }

    /// Checks the configuration without starting anything (for `gma archiver` to fail early).
    pub fn validate(&self) -> Result<(), ArchiverError> {
        self.check().map(|_| ())
    }
}

/// The archiver's consumer record.
struct Record {
    id: String,
    address: String,
    cfg: ArchiverConfig,
}

impl Catalog for Record {
    fn version(&self) -> u64 {
        1
    }

    fn record(&self) -> (pb::Record, Vec<pb::EventSchema>, u64) {
        let mut attributes = BTreeMap::new();
        attributes.insert(ARCHIVE_ADDRESS_ATTR.to_string(), self.address.clone());
        // The archiver subscribes itself: producers must not also push to it.
        attributes.insert(gma_consumer::PULL_ATTRIBUTE.to_string(), "true".to_string());
        let rec = pb::ConsumerRecord {
            id: self.id.clone(),
            address: self.address.clone(),
            accepts: self.cfg.patterns.clone(),
            manner: MANNER.into(),
            site: self.cfg.registration.site.clone(),
            org: self.cfg.registration.org.clone(),
            attributes: attributes.into_iter().collect(),
        };
        (
            pb::Record {
                record: Some(pb::record::Record::Consumer(rec)),
            },
            Vec::new(),
            1,
        )
    }
}

/// Most deliveries written per group commit.
const GROUP_DELIVERIES: usize = 256;
/// Most events per delivery (the archiver's subscriptions' batch size).
pub const MAX_BATCH: u32 = 4096;
/// Default of `ingest_queue` (deliveries); 1024 before: at 10,000 hosts the catch-up of the
/// producers' rings at start waited there decoded, all at once.
pub const DEFAULT_INGEST_QUEUE: usize = 32;
/// Most `ingest_queue` deliveries.
pub const MAX_INGEST_QUEUE: usize = 4096;

/// Runs the archiver on `listener` until `shutdown`; then stops ingest, makes everything
/// durable (flush + checkpoint) and returns.
pub async fn run(
    config: ArchiverConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ArchiverError> {
    run_with_rpc(config, listener, shutdown, RpcStats::new("archiver")).await
}

/// [`run`], recording every RPC served into `rpc` (published as `gma.rpc` by the caller).
pub async fn run_with_rpc(
    config: ArchiverConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    rpc: Arc<RpcStats>,
) -> Result<(), ArchiverError> {
    let Checked {
        retention,
        keeper,
        gate,
        store: store_opts,
        remote_write,
    } = config.check()?;
    let bound = listener.local_addr()?;
    let tls = config
        .endpoint
        .tls
        .rustls_config(bound)
        .map_err(|e| ArchiverError::Config(e.to_string()))?;
    let address = config.registration.address(bound);
    let id = config.registration.record_id("archiver", &address);
    let dir = config.data_dir.clone();
    crate::provenance::check_marker(&dir, config.provenance)?;
    let store = Arc::new(
        tokio::task::spawn_blocking(move || Store::open(&dir, store_opts))
            .await
            .map_err(|e| ArchiverError::Config(format!("store open task failed: {e}")))??,
    );
    let counters = Arc::new(Counters::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    // Held by ingest from a group's appends until they are durable (remote write lists the
    // series under it, so it never sends what a crash could take back).
    let durable_gate = Arc::new(tokio::sync::Mutex::new(()));
    let forwarder = match remote_write {
        Some(settings) => Some(crate::remote_write::spawn(
            crate::remote_write::Forwarder {
                settings,
                store: store.clone(),
                gate: durable_gate.clone(),
                data_dir: config.data_dir.clone(),
            },
            stop_rx.clone(),
        )?),
        None => None,
    };

    let ingest = config.registration.directory.clone().map(|directory| {
        let sub = Subscriber::start(
            SubscriberOptions {
                directory: directory.clone(),
                stream: StreamOptions {
                    patterns: config.patterns.clone(),
                    sources: config.sources.clone(),
                    consumer_id: id.clone(),
                    max_batch: MAX_BATCH,
                    // The archiver must never lose: producers keep its backlog pinned (within
                    // their reserve) instead of overwriting it.
                    policy: pb::SlowPolicy::Block,
                    queue_events: config.queue_events,
                    ..StreamOptions::default()
                },
                capacity: config.ingest_queue,
                // A producer never seen before is archived from the oldest event it holds.
                default_resume: Some(gma_consumer::stream::ResumePoint {
                    epoch: 0,
                    next_seq: 1,
                }),
            },
            store.resume_points(),
        );
        tokio::spawn(ingest_loop(
            sub,
            store.clone(),
            keeper,
            config.provenance.then(Stamper::default),
            counters.clone(),
            durable_gate.clone(),
            stop_rx.clone(),
        ))
    });
    let registrar = config.registration.directory.clone().map(|directory| {
        let reg = Registration {
            directory,
            kind: pb::RecordKind::Consumer,
            id: id.clone(),
            ttl_ms: config.registration.lease_ttl_ms,
        };
        let catalog: Arc<dyn Catalog> = Arc::new(Record {
            id: id.clone(),
            address: address.clone(),
            cfg: config.clone(),
        });
        let registration = registrar::run(reg, catalog, stop_rx.clone());
        // A refused registration is logged by the registrar; the archive keeps serving.
        tokio::spawn(async move {
            let _ = registration.await;
        })
    });
    let retention_task = (!retention.is_empty()).then(|| {
        tokio::spawn(retention_loop(
            store.clone(),
            retention,
            Duration::from_secs(config.retention_interval_s),
            counters.clone(),
            stop_rx.clone(),
        ))
    });

    let gate = Arc::new(gate);
    let http = match &config.http_listen {
        Some(addr) => Some(serve_promql(&config, addr, &store, &gate, stop_rx.clone()).await?),
        None => None,
    };
    let service = ArchiveServer::new(ArchiveService {
        store: store.clone(),
        gate: gate.clone(),
        counters: counters.clone(),
    })
    .max_decoding_message_size(gma_core::MAX_MESSAGE_BYTES);
    let incoming = gma_core::conn::Incoming::grpc(listener, tls, &config.endpoint.limits, "archiver");
    tracing::info!(%address, %id, "archiver serving");
    let mut stop_serving = stop_rx.clone();
    let signal = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stop_serving.wait_for(|s| *s) => {}
        }
    };
    let server = gma_core::conn::grpc_server(&config.endpoint.limits).layer(RpcLayer::new(rpc));
    let services = gma_core::conn::Services::new().add_service(service);
    let served = gma_core::conn::serve_grpc(server, services, incoming, signal).await;
    let _ = stop_tx.send(true);
    if let Some(t) = ingest {
        let _ = t.await;
    }
    for t in [registrar, retention_task, forwarder, http].into_iter().flatten() {
        let _ = t.await;
    }
    // Everything received is made durable and the log folded into chunks.
    store.flush().await?;
    store.checkpoint().await?;
    tracing::info!("archiver stopped");
    served.map_err(ArchiverError::from)
}

/// Serves the PromQL API ([`crate::promql`]) on `addr` until `stop`, behind the endpoint's
/// TLS (its certificate; client certificates of its client CA required, as on the gRPC
/// listener) and the archive's gate. Prints `gma archiver promql on ADDR` on stderr.
async fn serve_promql(
    config: &ArchiverConfig,
    addr: &str,
    store: &Arc<Store>,
    gate: &Arc<gma_core::guard::Gate>,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, ArchiverError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| ArchiverError::Config(format!("http_listen {addr}: {e}")))?;
    let bound = listener.local_addr()?;
    // The gRPC listener's rustls config, speaking HTTP/1.1 instead of h2.
    let tls = config
        .endpoint
        .tls
        .rustls_config(bound)
        .map_err(|e| ArchiverError::Config(format!("http_listen: {e}")))?
        .map(|c| {
            let mut c = (*c).clone();
            c.alpn_protocols = vec![b"http/1.1".to_vec()];
            Arc::new(c)
        });
    let app = crate::promql::http::router(Arc::new(crate::promql::http::Shared {
        store: store.clone(),
        gate: gate.clone(),
        config: config.promql.clone(),
    }));
    let limits = config.endpoint.limits.clone();
    eprintln!("gma archiver promql on {bound}");
    tracing::info!(%bound, tls = tls.is_some(), "PromQL API serving");
    Ok(tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        gma_core::conn::serve_http(listener, tls, app, &limits, "archiver-promql", shutdown).await
    }))
}

/// Receives deliveries, applies the keep-policy, appends them to the store and makes each
/// group durable before the next: a resume point is on disk only with its events.
async fn ingest_loop(
    mut sub: Subscriber,
    store: Arc<Store>,
    mut keeper: Keeper,
    mut stamper: Option<Stamper>,
    counters: Arc<Counters>,
    durable_gate: Arc<tokio::sync::Mutex<()>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let first = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            d = sub.recv() => d,
        };
        let Some(first) = first else { return };
        let mut group = vec![first];
        while group.len() < GROUP_DELIVERIES {
            match sub.recv().now_or_never() {
                Some(Some(d)) => group.push(d),
                _ => break,
            }
        }
        let durable = durable_gate.lock().await;
        let mut samples = 0u64;
        let mut failed = false;
        for d in group {
            match d {
                Delivery::Events {
                    producer,
                    mut events,
                    resume,
                } => {
                    counters.note_received(
                        &producer,
                        resume.epoch,
                        resume.next_seq.saturating_sub(1),
                        events.len() as u64,
                    );
                    // Defense in depth: producers refuse such timestamps at ingest, but an
                    // archived one outside the range could never be queried.
                    let before = events.len();
                    events.retain(|e| gma_core::time::valid_timestamp_ns(e.timestamp_ns));
                    if events.len() < before {
                        let n = (before - events.len()) as u64;
                        metrics::counter!(crate::telemetry::BAD_TIMESTAMPS).increment(n);
                        tracing::warn!(%producer, dropped = n, "events with a timestamp outside 1..={} not archived", gma_core::time::MAX_TIMESTAMP_NS);
                    }
                    let kept = keeper.filter(&mut events);
                    counters.add(&counters.kept_abnormal, kept.abnormal);
                    counters.add(&counters.sampled_out, kept.sampled_out);
                    if let Some(st) = stamper.as_mut() {
                        st.stamp(&producer, resume.epoch, &mut events);
                    }
                    samples += events
                        .iter()
                        .map(|e| (e.numbers.len() + e.strings.len()) as u64)
                        .sum::<u64>();
                    if let Err(e) = store.append(&producer, resume, &events) {
                        tracing::error!(error = %e, %producer, "cannot store events; stopping ingest");
                        failed = true;
                        break;
                    }
                }
                Delivery::Gap { producer, gap } => {
                    tracing::warn!(%producer, ?gap, "events lost before reaching the archiver");
                    metrics::counter!(crate::telemetry::GAP_EVENTS).increment(gap.dropped);
                    counters.add(&counters.gap_events, gap.dropped);
                }
                Delivery::Discovered { producer, .. } => counters.follow(&producer, true),
                Delivery::Gone { producer, .. } => counters.follow(&producer, false),
                Delivery::Refused { producer, error } => {
                    tracing::warn!(%producer, %error, "producer refused the archiver's subscription")
                }
                Delivery::DirectoryRefused { error } => tracing::error!(
                    %error,
                    "the directory refused the archiver's watch: nothing is archived until it is allowed (restart then)"
                ),
                _ => {}
            }
        }
        if failed {
            return;
        }
        if let Err(e) = store.flush().await {
            tracing::error!(error = %e, "cannot flush the store; stopping ingest");
            return;
        }
        drop(durable);
        counters.ingested(samples);
        metrics::counter!(crate::telemetry::SAMPLES).increment(samples);
        if store.needs_checkpoint() {
            if let Err(e) = store.checkpoint().await {
                tracing::error!(error = %e, "checkpoint failed; stopping ingest");
                return;
            }
        }
    }
}

async fn retention_loop(
    store: Arc<Store>,
    rules: Vec<(Pattern, i64)>,
    every: Duration,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let now = gma_core::time::now_ns();
        let mut deleted = 0;
        for (pattern, age) in &rules {
            let started = Instant::now();
            let s = store.clone();
            let p = pattern.clone();
            let cutoff = now.saturating_sub(*age);
            match tokio::task::spawn_blocking(move || s.delete_older_than(&p, cutoff)).await {
                Ok(Ok(n)) => {
                    deleted += n;
                    counters.add(&counters.retention_deleted, n);
                    if n > 0 {
                        tracing::info!(pattern = pattern.as_str(), deleted = n, took = ?started.elapsed(), "retention");
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "retention failed"),
                Err(e) => tracing::warn!(error = %e, "retention task failed"),
            }
        }
        // Make the deletions durable now rather than at the next checkpoint.
        if deleted > 0 {
            if let Err(e) = store.commit().await {
                tracing::warn!(error = %e, "retention: cannot commit the deletions");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_cache_term_reaches_the_store_and_zero_is_refused() {
        let mut c = ArchiverConfig {
            data_dir: PathBuf::from("/nonexistent/archive"),
            ..ArchiverConfig::default()
        };
        assert_eq!(c.check().unwrap().store.index_cache_bytes, 64 << 20);
        c.store.index_cache_mib = 16;
        assert_eq!(c.check().unwrap().store.index_cache_bytes, 16 << 20);
        assert_eq!(c.check().unwrap().store.index_cache_bytes, 16 << 20);
        for bad in [0, MAX_INGEST_QUEUE + 1] {
            let c = ArchiverConfig {
                ingest_queue: bad,
                ..c.clone()
            };
            match c.check() {
                Ok(_) => panic!("ingest_queue = {bad} was accepted"),
                Err(e) => assert!(e.to_string().contains("ingest_queue must lie in 1..=4096"), "{e}"),
            }
        }
        assert_eq!(ArchiverConfig::default().ingest_queue, 32);
        c.store.index_cache_mib = 0;
        match c.check() {
            Ok(_) => panic!("index_cache_mib = 0 was accepted"),
            Err(e) => assert!(e.to_string().contains("store.index_cache_mib"), "{e}"),
        }
    }
}
