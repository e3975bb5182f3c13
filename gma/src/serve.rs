//! What every serving subcommand shares: binding its listener (plaintext refused off loopback),
//! the shutdown signal, and the security flags (`--tls-*`, `--access-policy`) applied over the
//! role's config (the other shared flags: [`crate::args::EndpointArgs::apply`]; opening a
//! role's endpoint: [`crate::runtime`]).

use std::path::PathBuf;

use anyhow::Context;
use tokio::net::TcpListener;

/// Set once SIGTERM or SIGINT arrived (after [`catch_shutdown_signals`]).
static SHUTDOWN: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>> = std::sync::OnceLock::new();

/// Catches SIGTERM and SIGINT for the whole life of a serving process, from its first moment:
/// a signal that arrives while the role is still starting (after it printed "listening on",
/// while it opens its store) is remembered and starts the drain as soon as the role runs,
/// instead of killing the process by the default action or being lost. Called by `main` inside
/// the runtime, for the commands that drain on [`shutdown_signal`].
pub fn catch_shutdown_signals() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    if SHUTDOWN.set(rx).is_err() {
        return Ok(());
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = tx.send(true);
    });
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM: at once when one already arrived since
/// [`catch_shutdown_signals`]; without that set-up, from the first poll on.
pub async fn shutdown_signal() {
    if let Some(mut rx) = SHUTDOWN.get().cloned() {
        let _ = rx.wait_for(|stopped| *stopped).await;
        return;
    }
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
