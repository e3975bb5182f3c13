//! The role runtime of the binary: what every role command does once its config is loaded and
//! the shared flags applied ([`crate::args::RoleArgs::apply`]): open its endpoint (Prometheus
//! `/metrics`, the checked listener) and, for the roles without a hub of their own, run the
//! companion producer that publishes their `gma.rpc` events.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gma_core::endpoint::Endpoint;
use gma_core::rpc::RpcStats;
use tokio::net::TcpListener;

use crate::serve::{bind_checked, shutdown_signal};

/// Opens a role's endpoint: serves its Prometheus `/metrics` when `metrics_listen` is set
/// (behind the endpoint's TLS and policy), binds `listen` (plaintext refused off loopback
/// without `allow_plaintext`) and prints `gma ROLE listening on ADDR`.
pub async fn open_endpoint(role: &str, listen: &str, endpoint: &Endpoint) -> anyhow::Result<TcpListener> {
    crate::telemetry::serve_endpoint_metrics(role, endpoint).await?;
    let listener = bind_checked(listen, &endpoint.tls).await?;
    eprintln!("gma {role} listening on {}", listener.local_addr()?);
    Ok(listener)
}

/// How long a stopping role waits for its companion producer to remove its record.
const COMPANION_STOP: Duration = Duration::from_secs(4);

/// Starts the companion producer of a role without a hub of its own (the directory, the
/// archiver; [`crate::telemetry::companion`]) when `rpc_events_ms` > 0 and there is a
/// `directory` to register in. Returns the shutdown future to run the role with: on SIGTERM
/// or Ctrl-C it stops the companion first (removing its record while the role still serves),
/// then resolves.
pub async fn with_companion(
    role: &'static str,
    rpc: Arc<RpcStats>,
    directory: Option<String>,
    near: SocketAddr,
    endpoint: &Endpoint,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let companion = match directory {
        Some(directory) if endpoint.rpc_events_ms() > 0 => {
            let c = crate::telemetry::Companion {
                role,
                rpc,
                directory,
                near,
                endpoint: endpoint.clone(),
            };
            let stopped = async move {
                let _ = stop_rx.wait_for(|v| *v).await;
            };
            Some(crate::telemetry::companion(c, stopped).await?)
        }
        _ => None,
    };
    Ok(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
        if let Some(c) = companion {
            let _ = tokio::time::timeout(COMPANION_STOP, c).await;
        }
    })
}
