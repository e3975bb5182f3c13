//! Configuration and the `run` entry point: open the store, serve gRPC, expire leases, stop.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gma_core::MAX_MESSAGE_BYTES;
use gma_proto::v1::directory_server::DirectoryServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

use crate::error::DirError;
use crate::service::{DirectoryService, Shared, BROADCAST_CAPACITY};
use crate::state::{Command, Limits};
use crate::store::Store;

/// How long shutdown waits for open connections to finish before closing the store anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The directory's configuration (the `[directory]` TOML of `gma directory --config`).
/// Every field but `data_dir` has a default.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryConfig {
    /// Where the sled database lives (created if missing).
    pub data_dir: PathBuf,
    /// Lease TTL when a registration asks for 0.
    #[serde(default = "defaults::default_ttl_ms")]
    pub default_ttl_ms: u64,
    /// Smallest lease TTL a client may ask for.
    #[serde(default = "defaults::min_ttl_ms")]
    pub min_ttl_ms: u64,
    /// Largest lease TTL a client may ask for.
    #[serde(default = "defaults::max_ttl_ms")]
    pub max_ttl_ms: u64,
    /// How often due leases are expired; a dead holder disappears within TTL + one tick.
    #[serde(default = "defaults::expiry_tick_ms")]
    pub expiry_tick_ms: u64,
    /// Changes kept for Watch resumption.
    #[serde(default = "defaults::history_limit")]
    pub history_limit: usize,
    /// Most producer + consumer records the directory holds.
    #[serde(default = "defaults::max_records")]
    pub max_records: usize,
}

mod defaults {
    pub fn default_ttl_ms() -> u64 {
        10_000
    }
    pub fn min_ttl_ms() -> u64 {
        500
    }
    pub fn max_ttl_ms() -> u64 {
        3_600_000
    }
    pub fn expiry_tick_ms() -> u64 {
        200
    }
    pub fn history_limit() -> usize {
        10_000
    }
    pub fn max_records() -> usize {
        1_000_000
    }
}

impl Default for DirectoryConfig {
    /// The defaults with an empty `data_dir`, which [`run`] rejects: set it.
    fn default() -> Self {
        DirectoryConfig {
            data_dir: PathBuf::new(),
            default_ttl_ms: defaults::default_ttl_ms(),
            min_ttl_ms: defaults::min_ttl_ms(),
            max_ttl_ms: defaults::max_ttl_ms(),
            expiry_tick_ms: defaults::expiry_tick_ms(),
            history_limit: defaults::history_limit(),
            max_records: defaults::max_records(),
        }
    }
}

impl DirectoryConfig {
    /// The defaults with `data_dir` set.
    pub fn new(data_dir: impl Into<PathBuf>) -> DirectoryConfig {
        DirectoryConfig {
            data_dir: data_dir.into(),
            ..DirectoryConfig::default()
        }
    }

    /// Checks the values make sense together.
    pub fn validate(&self) -> Result<(), DirError> {
        let bad = |m: String| Err(DirError::Config(m));
        if self.data_dir.as_os_str().is_empty() {
            return bad("data_dir is required: set it to a directory the server may write".into());
        }
        if self.min_ttl_ms == 0 || self.min_ttl_ms > self.max_ttl_ms {
            return bad(format!(
                "min_ttl_ms ({}) must be at least 1 and at most max_ttl_ms ({})",
                self.min_ttl_ms, self.max_ttl_ms
            ));
        }
        if self.default_ttl_ms < self.min_ttl_ms || self.default_ttl_ms > self.max_ttl_ms {
            return bad(format!(
                "default_ttl_ms ({}) must lie in [min_ttl_ms, max_ttl_ms] = [{}, {}]",
                self.default_ttl_ms, self.min_ttl_ms, self.max_ttl_ms
            ));
        }
        if self.expiry_tick_ms == 0 {
            return bad("expiry_tick_ms must be at least 1".into());
        }
        if self.history_limit == 0 {
            return bad("history_limit must be at least 1".into());
        }
        if self.max_records == 0 {
            return bad("max_records must be at least 1".into());
        }
        Ok(())
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_records: self.max_records,
            history_limit: self.history_limit,
        }
    }
}

/// Runs a single-node directory on `listener` until `shutdown` completes.
///
/// Opens (or creates) the store in `config.data_dir`, gives every stored lease one fresh TTL
/// (`ExtendAll`), expires due leases every `expiry_tick_ms`, and serves the `Directory` gRPC
/// service. On shutdown it stops accepting connections, ends open Watch and KeepAlive
/// streams, waits up to 5 s for connections to close, then flushes and closes the store.
pub async fn run(
    config: DirectoryConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DirError> {
    config.validate()?;
    let local = listener
        .local_addr()
        .map_err(|e| DirError::Transport(format!("the listener has no local address: {e}")))?;
    let advertised = gma_core::addr::advertised(local);
    let (store, state) = Store::open(&config.data_dir, config.limits()).await?;
    tracing::info!(
        listen = %local,
        data_dir = %config.data_dir.display(),
        revision = state.revision(),
        producers = state.counts().producers,
        consumers = state.counts().consumers,
        "directory starting"
    );
    let tick = Duration::from_millis(config.expiry_tick_ms);
    let shared = Arc::new(Shared::new(config, state, store, advertised, BROADCAST_CAPACITY));
    // Leases stored before a restart get a full TTL from now (as a new etcd leader does).
    shared.write(|now_ms| Command::ExtendAll { now_ms }).await?;

    let ticker = tokio::spawn(expiry_loop(shared.clone(), tick));
    let service = DirectoryServer::new(DirectoryService::new(shared.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        if let Ok(c) = &conn {
            // Small request/response messages: do not wait for Nagle.
            let _ = c.set_nodelay(true);
        }
        conn
    });
    let on_shutdown = shared.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!("directory shutting down");
        on_shutdown.begin_shutdown();
    };
    let mut stopping = shared.stop_signal();
    let served = tokio::select! {
        r = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, signal) => {
            r.map_err(|e| DirError::Transport(e.to_string()))
        }
        _ = async {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("connections still open {SHUTDOWN_GRACE:?} after shutdown; closing the store anyway");
            Ok(())
        }
    };
    shared.begin_shutdown();
    if let Err(e) = ticker.await {
        tracing::warn!(error = %e, "expiry task failed");
    }
    let closed = shared.close().await;
    tracing::info!("directory stopped");
    served.and(closed)
}

/// Expires due leases every `tick` until shutdown.
async fn expiry_loop(shared: Arc<Shared>, tick: Duration) {
    let mut stop = shared.stop_signal();
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = interval.tick() => {}
        }
        match shared.expire_due().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "expired leases"),
            Err(e) => tracing::warn!(error = %e, "cannot expire leases"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c: DirectoryConfig = gma_core::config::parse_toml("data_dir = \"/tmp/d\"\n", "t").unwrap();
        assert_eq!(c.default_ttl_ms, 10_000);
        assert_eq!(c.min_ttl_ms, 500);
        assert_eq!(c.max_ttl_ms, 3_600_000);
        assert_eq!(c.expiry_tick_ms, 200);
        assert_eq!(c.history_limit, 10_000);
        assert_eq!(c.max_records, 1_000_000);
        assert!(c.validate().is_ok());
        let e =
            gma_core::config::parse_toml::<DirectoryConfig>("data_dir = \"d\"\nttl = 1\n", "t").unwrap_err();
        assert!(e.to_string().contains("unknown field `ttl`"), "{e}");
        assert!(gma_core::config::parse_toml::<DirectoryConfig>("default_ttl_ms = 1\n", "t").is_err());
    }

    #[test]
    fn config_validation() {
        assert!(DirectoryConfig::default().validate().is_err());
        let ok = DirectoryConfig::new("/tmp/x");
        assert!(ok.validate().is_ok());
        for bad in [
            DirectoryConfig {
                min_ttl_ms: 0,
                ..ok.clone()
            },
            DirectoryConfig {
                default_ttl_ms: 100,
                ..ok.clone()
            },
            DirectoryConfig {
                min_ttl_ms: 10,
                max_ttl_ms: 5,
                ..ok.clone()
            },
            DirectoryConfig {
                expiry_tick_ms: 0,
                ..ok.clone()
            },
            DirectoryConfig {
                history_limit: 0,
                ..ok.clone()
            },
            DirectoryConfig {
                max_records: 0,
                ..ok.clone()
            },
        ] {
            assert!(matches!(bad.validate(), Err(DirError::Config(_))), "{bad:?}");
        }
    }
}
