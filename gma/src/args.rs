//! Arguments shared by several subcommands: output format, the TLS of this process, the flags
//! every serving role shares ([`RoleArgs`], [`EndpointArgs`]), the slow-consumer policy. Each
//! subcommand's own arguments live in its module; cli.rs assembles the command.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Args, ValueEnum};
use gma_core::endpoint::Endpoint;
use gma_core::registration::Registration;

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
    /// ([`crate::serve::apply_security`], which also installs the section's client TLS for
    /// the connections the role makes).
    pub fn apply(&self, endpoint: &mut Endpoint) -> anyhow::Result<()> {
        if let Some(m) = &self.metrics_listen {
            endpoint.metrics_listen = Some(m.clone());
        }
        if let Some(ms) = self.rpc_events_ms {
            endpoint.rpc_events_ms = Some(ms);
        }
        crate::serve::apply_security(&mut endpoint.tls, &mut endpoint.access_policy)
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
            Some(p) => gma_core::config::load_toml(p)?,
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
    pub fn client(&self) -> gma_core::tls::ClientTls {
        gma_core::tls::ClientTls {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone().filter(|_| self.tls_ca.is_some()),
            key: self.tls_key.clone().filter(|_| self.tls_ca.is_some()),
        }
    }

    /// The server settings of a role with these flags, or `None` when no TLS flag was given
    /// (the config file decides).
    pub fn server(&self, s: &EndpointArgs) -> Option<gma_core::tls::ServerTls> {
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

/// The directory a role registers in, required: the error says how to give it.
pub fn require_directory(directory: &Option<String>) -> anyhow::Result<()> {
    if directory.as_deref().is_none_or(|d| d.trim().is_empty()) {
        bail!("give the directory with --directory ADDR (or directory in --config)");
    }
    Ok(())
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Also spelled `text`.
    #[value(alias = "text")]
    Table,
    Json,
}

impl Output {
    /// Prints a list: a JSON array of `json(item)`, or one `line(item)` an item and then the
    /// count (`3 jobs`, with `noun` = "jobs").
    pub fn print_list<T>(
        self,
        items: &[T],
        noun: &str,
        json: impl Fn(&T) -> serde_json::Value,
        line: impl Fn(&T) -> String,
    ) {
        match self {
            Output::Json => println!("{}", serde_json::Value::Array(items.iter().map(json).collect())),
            Output::Table => {
                for x in items {
                    println!("{}", line(x));
                }
                println!("{} {noun}", items.len());
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_reads_its_config_or_its_defaults_and_says_how_to_give_a_required_one() {
        let none = RoleArgs::default();
        let e = none.config_file("the resources", "docs/broker.md").unwrap_err();
        assert_eq!(
            e.to_string(),
            "give the resources with --config FILE (docs/broker.md)"
        );
        let defaults: Endpoint = none.load().expect("defaults without --config");
        assert_eq!(defaults.rpc_events_ms, Endpoint::default().rpc_events_ms);

        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("role.toml");
        std::fs::write(&path, "rpc_events_ms = 7\n").expect("write config");
        let given = RoleArgs {
            config: Some(path.clone()),
            ..Default::default()
        };
        assert_eq!(given.config_file("x", "y").expect("given"), path.as_path());
        let read: Endpoint = given.load().expect("read --config");
        assert_eq!(read.rpc_events_ms, Some(7));
    }
}
