//! Arguments shared by several subcommands: output format, TLS and security flags, the
//! Prometheus listener, the slow-consumer policy. Each subcommand's own arguments live in its
//! module; cli.rs assembles the command.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// Help heading of the flags every command takes (`--log` and the client TLS flags).
pub const GLOBAL_HEADING: &str = "Global options";
/// Help heading of the flags of a served endpoint (role commands only).
pub const SERVING_HEADING: &str = "Serving (TLS and authorization of this role's endpoints)";
/// Help heading of `--metrics-listen`.
pub const METRICS_HEADING: &str = "Prometheus";

/// TLS of every connection this process makes (every command), and the certificate a role
/// serves.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientTlsArgs {
    /// CA certificate (PEM) servers are verified against; turns TLS on for connections.
    #[arg(long, global = true, env = "GMA_TLS_CA", help_heading = GLOBAL_HEADING)]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate chain (PEM): served by roles, presented as a client.
    #[arg(long, global = true, env = "GMA_TLS_CERT", help_heading = GLOBAL_HEADING)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, global = true, env = "GMA_TLS_KEY", help_heading = GLOBAL_HEADING)]
    pub tls_key: Option<PathBuf>,
}

/// The flags of a served endpoint: taken by role commands only (a client command has none).
#[derive(Args, Debug, Clone, Default)]
pub struct ServerArgs {
    /// Require client certificates signed by this CA (mTLS) on served endpoints.
    #[arg(long, env = "GMA_TLS_CLIENT_CA", help_heading = SERVING_HEADING)]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback address (refused otherwise).
    #[arg(long, help_heading = SERVING_HEADING)]
    pub allow_plaintext: bool,
    /// Authorization policy (TOML) for the roles this process serves; deny by default when
    /// given. Without one every identity may do everything.
    #[arg(long, env = "GMA_ACCESS_POLICY", help_heading = SERVING_HEADING)]
    pub access_policy: Option<PathBuf>,
    /// Serve the Prometheus endpoints (--metrics-listen, --prometheus) in plain HTTP without
    /// authorization even next to a TLS role (refused otherwise).
    #[arg(long, help_heading = SERVING_HEADING)]
    pub metrics_insecure: bool,
}

impl ClientTlsArgs {
    pub fn client(&self) -> gma_core::tls::ClientTls {
        gma_core::tls::ClientTls {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone().filter(|_| self.tls_ca.is_some()),
            key: self.tls_key.clone().filter(|_| self.tls_ca.is_some()),
        }
    }

    /// The server settings of a role with these flags, or `None` when no TLS flag was given
    /// (the config file decides).
    pub fn server(&self, s: &ServerArgs) -> Option<gma_core::tls::ServerTls> {
        let any = self.tls_cert.is_some() || self.tls_key.is_some() || s.tls_client_ca.is_some();
        (any || s.allow_plaintext).then(|| gma_core::tls::ServerTls {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            client_ca: s.tls_client_ca.clone(),
            allow_plaintext: s.allow_plaintext,
            ca: self.tls_ca.clone(),
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Prometheus exposition of a role's own metrics.
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsArgs {
    /// Serve Prometheus /metrics (the role's counters and latency histograms) on this address,
    /// e.g. 127.0.0.1:9100 (overrides `metrics_listen` in --config).
    #[arg(long, help_heading = METRICS_HEADING)]
    pub metrics_listen: Option<String>,
}

/// What the producer does when a subscriber falls behind.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Conflate to the newest value per series.
    Latest,
    /// Skip the oldest events, reported as a gap.
    DropOldest,
    /// Hold events for this subscriber (archivers), within the producer's block reserve.
    Block,
}
