//! The command-line flags every serving process shares, and what they set up: the TLS flags of
//! the process ([`ClientTlsArgs`]), the flags of a served endpoint ([`EndpointArgs`]) and of a
//! role that listens and registers ([`RoleArgs`]), the security they lay over a role's config
//! (process-wide, [`set_security`] / [`apply_security`]), binding a listener (plaintext refused
//! off loopback) and the shutdown signal. Here rather than in the `gma` command so that an
//! executable with one role (`gma-agent`, the producer crate) parses and starts the same way.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use tokio::net::TcpListener;

use crate::endpoint::Endpoint;
use crate::registration::Registration;

/// Help heading of the flags every command takes that are about the `gma` process itself
/// (`--log`).
pub const GLOBAL_HEADING: &str = "Global options";
/// Help heading of the TLS flags every command takes (its connections; a role's certificate).
pub const CLIENT_HEADING: &str = "TLS of this process (every command)";
/// Help heading of the flags every serving role shares (role commands only).
pub const SERVING_HEADING: &str = "Serving (the flags every role shares)";

/// TLS of every connection this process makes (every command), and the certificate a role
/// serves.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientTlsArgs {
    /// CA certificate (PEM) servers are verified against; turns TLS on for connections.
    #[arg(long, global = true, env = "GMA_TLS_CA", help_heading = CLIENT_HEADING)]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate chain (PEM): served by roles, presented as a client.
    #[arg(long, global = true, env = "GMA_TLS_CERT", help_heading = CLIENT_HEADING)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, global = true, env = "GMA_TLS_KEY", help_heading = CLIENT_HEADING)]
    pub tls_key: Option<PathBuf>,
}

/// The flags of a served endpoint, one for each key of [`Endpoint`] (`[tls]` through
/// `--tls-client-ca`/`--allow-plaintext` and the global `--tls-*`, `access_policy`,
/// `metrics_listen`, `rpc_events_ms`; `[limits]` only in --config) plus `--metrics-insecure`.
/// Taken by role commands only (a client command serves nothing); [`EndpointArgs::apply`] lays
/// them over the role's config.
#[derive(Args, Debug, Clone, Default)]
pub struct EndpointArgs {
    /// Require client certificates signed by this CA (mTLS) on served endpoints.
    #[arg(long, env = "GMA_TLS_CLIENT_CA", help_heading = SERVING_HEADING)]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback address (refused otherwise).
    #[arg(long, help_heading = SERVING_HEADING)]
    pub allow_plaintext: bool,
    /// Authorization policy (TOML) of this role's endpoints; deny by default when given
    /// (overrides `access_policy` in --config). Without one every identity may do everything.
    #[arg(long, env = "GMA_ACCESS_POLICY", help_heading = SERVING_HEADING)]
    pub access_policy: Option<PathBuf>,
    /// Serve Prometheus /metrics (the role's counters and latency histograms) on this address,
    /// e.g. 127.0.0.1:9100 (overrides `metrics_listen` in --config).
    #[arg(long, help_heading = SERVING_HEADING)]
    pub metrics_listen: Option<String>,
    /// Serve the Prometheus endpoints (--metrics-listen, --prometheus) in plain HTTP without
    /// authorization even next to a TLS role (refused otherwise).
    #[arg(long, help_heading = SERVING_HEADING)]
    pub metrics_insecure: bool,
    /// Period of the gma.rpc events about this role's RPCs, in milliseconds (0 = none; default
    /// 10000; overrides `rpc_events_ms` in --config). The directory and the archiver publish
    /// them through a companion producer; the dashboard, the sink and app-sim publish none.
    #[arg(long, help_heading = SERVING_HEADING)]
    pub rpc_events_ms: Option<u64>,
}

/// The flags of a role that listens and registers in a directory: `--config`, `--listen`,
/// `--directory` and the [`EndpointArgs`]. A role command flattens it and declares its own
/// flags only; it says what its config holds with
/// `#[command(mut_arg("config", |a| a.help("...")))]` (and `.required(true)` when the role
/// cannot run without one), reads it with [`RoleArgs::load`] or [`RoleArgs::config_file`], and
/// lays the shared flags over it with [`RoleArgs::apply`].
#[derive(Args, Debug, Clone, Default)]
pub struct RoleArgs {
    /// TOML config of the role (its keys are in the role's documentation).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address of this role's endpoint (overrides `listen` in --config; each role's
    /// default is in its documentation).
    #[arg(long, help_heading = SERVING_HEADING)]
    pub listen: Option<String>,
    /// Directory address(es), ADDR[,ADDR...] (overrides `directory` in --config).
    #[arg(long, help_heading = SERVING_HEADING)]
    pub directory: Option<String>,
    #[command(flatten)]
    pub endpoint: EndpointArgs,
}

/// A config's listen address: `String` (the role has a default) or `Option<String>`.
pub trait ListenAddr {
    fn set(&mut self, addr: String);
}

impl ListenAddr for String {
    fn set(&mut self, addr: String) {
        *self = addr;
    }
}

impl ListenAddr for Option<String> {
    fn set(&mut self, addr: String) {
        *self = Some(addr);
    }
}

/// Where a config keeps its directory address: the registration section of a role that
/// registers, or a bare `Option<String>` (the dashboard only looks the fabric up there).
pub trait DirectoryAddr {
    fn set(&mut self, addr: String);
}

impl DirectoryAddr for Option<String> {
    fn set(&mut self, addr: String) {
        *self = Some(addr);
    }
}

impl DirectoryAddr for Registration {
    fn set(&mut self, addr: String) {
        self.directory = Some(addr);
    }
}

impl EndpointArgs {
    /// Lays these flags over a role's endpoint section: `--metrics-listen` and
    /// `--rpc-events-ms` when given, then the TLS and policy flags
    /// ([`apply_security`], which also installs the section's client TLS for
    /// the connections the role makes).
    pub fn apply(&self, endpoint: &mut Endpoint) -> anyhow::Result<()> {
        if let Some(m) = &self.metrics_listen {
            endpoint.metrics_listen = Some(m.clone());
        }
        if let Some(ms) = self.rpc_events_ms {
            endpoint.rpc_events_ms = Some(ms);
        }
        apply_security(&mut endpoint.tls, &mut endpoint.access_policy)
    }

    /// For a role that publishes no `gma.rpc` events (`role`: "the dashboard", ...):
    /// `--rpc-events-ms` is refused rather than ignored.
    pub fn refuse_rpc_events(&self, role: &str) -> anyhow::Result<()> {
        if self.rpc_events_ms.is_some() {
            bail!("{role} publishes no gma.rpc events: leave out --rpc-events-ms");
        }
        Ok(())
    }
}

impl RoleArgs {
    /// The role's config: read from --config, or the role's defaults without one.
    pub fn load<C: serde::de::DeserializeOwned + Default>(&self) -> anyhow::Result<C> {
        Ok(match &self.config {
            Some(p) => crate::config::load_toml(p)?,
            None => C::default(),
        })
    }

    /// The --config a role cannot run without: its path, or an error that says how to give it
    /// (`give {what} with --config FILE ({note})`).
    pub fn config_file(&self, what: &str, note: &str) -> anyhow::Result<&Path> {
        match &self.config {
            Some(p) => Ok(p),
            None => bail!("give {what} with --config FILE ({note})"),
        }
    }

    /// Lays the shared flags over a role's loaded config: `--listen`, `--directory`, then the
    /// endpoint flags ([`EndpointArgs::apply`]).
    pub fn apply(
        &self,
        listen: &mut impl ListenAddr,
        directory: &mut impl DirectoryAddr,
        endpoint: &mut Endpoint,
    ) -> anyhow::Result<()> {
        if let Some(l) = &self.listen {
            listen.set(l.clone());
        }
        if let Some(d) = &self.directory {
            directory.set(d.clone());
        }
        self.endpoint.apply(endpoint)
    }
}

impl ClientTlsArgs {
    pub fn client(&self) -> crate::tls::ClientTls {
        crate::tls::ClientTls {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone().filter(|_| self.tls_ca.is_some()),
            key: self.tls_key.clone().filter(|_| self.tls_ca.is_some()),
        }
    }

    /// The server settings of a role with these flags, or `None` when no TLS flag was given
    /// (the config file decides).
    pub fn server(&self, s: &EndpointArgs) -> Option<crate::tls::ServerTls> {
        let any = self.tls_cert.is_some() || self.tls_key.is_some() || s.tls_client_ca.is_some();
        (any || s.allow_plaintext).then(|| crate::tls::ServerTls {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            client_ca: s.tls_client_ca.clone(),
            allow_plaintext: s.allow_plaintext,
            ca: self.tls_ca.clone(),
        })
    }
}

/// Ends a command that failed: `error: ` and the error with its causes (each cause not already
/// in the message), on stderr; exit status 1.
pub fn exit_with(e: &anyhow::Error) -> ! {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    eprintln!("error: {msg}");
    std::process::exit(1);
}

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
pub async fn bind_checked(addr: &str, tls: &crate::tls::ServerTls) -> anyhow::Result<TcpListener> {
    tls.check_listen(addr)?;
    bind(addr).await
}

/// `--allow-plaintext` was given.
pub fn allow_plaintext_flag() -> bool {
    server_tls_flags().is_some_and(|t| t.allow_plaintext)
}

type Security = (Option<crate::tls::ServerTls>, Option<PathBuf>);
static SECURITY: std::sync::OnceLock<Security> = std::sync::OnceLock::new();

/// The server TLS and policy given by flags (`--tls-cert`, `--access-policy`, ...), overriding role
/// configs.
pub fn set_security(tls: Option<crate::tls::ServerTls>, policy: Option<PathBuf>) {
    let _ = SECURITY.set((tls, policy));
}

/// The `[tls]` given by flags, if any TLS flag was given.
pub fn server_tls_flags() -> Option<crate::tls::ServerTls> {
    SECURITY.get().and_then(|s| s.0.clone())
}

/// The `--access-policy` file, if given.
pub fn policy_flag() -> Option<PathBuf> {
    SECURITY.get().and_then(|s| s.1.clone())
}

/// Applies the flags over a role config's `[tls]` and `policy`, and installs the config's
/// client side for outgoing connections when the flags did not set one.
pub fn apply_security(tls: &mut crate::tls::ServerTls, policy: &mut Option<PathBuf>) -> anyhow::Result<()> {
    if let Some(t) = server_tls_flags() {
        *tls = t;
    }
    if let Some(p) = policy_flag() {
        *policy = Some(p);
    }
    crate::tls::install_client_if_unset(&tls.client())?;
    Ok(())
}
