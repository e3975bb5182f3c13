//! What every serving subcommand shares: binding its listener (plaintext refused off loopback),
//! the shutdown signal, and the security flags (`--tls-*`, `--access-policy`) applied over the
//! role's config.

use std::path::PathBuf;

use anyhow::Context;
use tokio::net::TcpListener;

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

pub async fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// [`bind`] for a server role with these TLS settings: a plaintext listener off loopback
/// (without `allow_plaintext`) is refused before the socket is bound.
pub async fn bind_checked(addr: &str, tls: &gma_core::tls::ServerTls) -> anyhow::Result<TcpListener> {
    tls.check_listen(addr)?;
    bind(addr).await
}

/// `--allow-plaintext` was given.
pub fn allow_plaintext_flag() -> bool {
    server_tls_flags().is_some_and(|t| t.allow_plaintext)
}

type Security = (Option<gma_core::tls::ServerTls>, Option<PathBuf>);
static SECURITY: std::sync::OnceLock<Security> = std::sync::OnceLock::new();

/// The server TLS and policy given by flags (`--tls-cert`, `--access-policy`, ...), overriding role
/// configs.
pub fn set_security(tls: Option<gma_core::tls::ServerTls>, policy: Option<PathBuf>) {
    let _ = SECURITY.set((tls, policy));
}

/// The `[tls]` given by flags, if any TLS flag was given.
pub fn server_tls_flags() -> Option<gma_core::tls::ServerTls> {
    SECURITY.get().and_then(|s| s.0.clone())
}

/// The `--access-policy` file, if given.
pub fn policy_flag() -> Option<PathBuf> {
    SECURITY.get().and_then(|s| s.1.clone())
}

/// Applies the flags over a role config's `[tls]` and `policy`, and installs the config's
/// client side for outgoing connections when the flags did not set one.
pub fn apply_security(
    tls: &mut gma_core::tls::ServerTls,
    policy: &mut Option<PathBuf>,
) -> anyhow::Result<()> {
    if let Some(t) = server_tls_flags() {
        *tls = t;
    }
    if let Some(p) = policy_flag() {
        *policy = Some(p);
    }
    gma_core::tls::install_client_if_unset(&tls.client())?;
    Ok(())
}

/// Applies the shared serving flags over a role's endpoint section: `--metrics-listen` (when
/// given), then the TLS and policy flags ([`apply_security`]).
pub fn apply_endpoint(
    endpoint: &mut gma_core::endpoint::Endpoint,
    metrics_listen: Option<String>,
) -> anyhow::Result<()> {
    if metrics_listen.is_some() {
        endpoint.metrics_listen = metrics_listen;
    }
    apply_security(&mut endpoint.tls, &mut endpoint.access_policy)
}
