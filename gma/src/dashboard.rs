//! `gma dashboard`: the live web dashboard (a real-time consumer; see docs/dashboard.md).

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use gma_dashboard::DashboardConfig;

use crate::args::RoleArgs;
use crate::runtime::open_endpoint;
use crate::serve::shutdown_signal;

#[derive(Args, Debug)]
#[command(mut_arg("listen", |a| a.help("HTTP listen address of the page (overrides `listen` in --config; default 127.0.0.1:7500)")))]
#[command(mut_arg("config", |a| a.help("TOML config (listen, directory, archiver, patterns, cluster_poll_ms, federation, federation_poll_ms, history_points, broadcast_capacity, metrics_listen, plain_http, access_policy, [tls], [auth], [limits])")))]
pub struct DashboardArgs {
    /// An archiver's address: enables the history panel.
    #[arg(long)]
    pub archiver: Option<String>,
    /// Serve plain HTTP although --tls-cert is given (it then only identifies the dashboard's
    /// own connections into the fabric): behind an authenticating proxy on the same host.
    #[arg(long)]
    pub plain_http: bool,
    /// Header an authenticating reverse proxy sets with the user name (e.g. X-Forwarded-User);
    /// accepted only from --auth-trusted-proxy addresses.
    #[arg(long)]
    pub auth_proxy_user_header: Option<String>,
    /// Header the proxy sets with the user's organization or groups (first value = the O).
    #[arg(long)]
    pub auth_proxy_org_header: Option<String>,
    /// Address (or CIDR block) the proxy connects from; repeatable.
    #[arg(long)]
    pub auth_trusted_proxy: Vec<String>,
    /// TOML file of bearer tokens for scripts ([[token]]: token, cn, org).
    #[arg(long)]
    pub auth_tokens: Option<PathBuf>,
    /// Federation endpoint(s), ADDR[,ADDR...]: the hierarchy panel shows the tree around each
    /// (overrides `federation` in --config).
    #[arg(long, value_delimiter = ',')]
    pub federation: Vec<String>,
    #[command(flatten)]
    pub role: RoleArgs,
}

pub async fn run(a: DashboardArgs) -> anyhow::Result<()> {
    let mut cfg: DashboardConfig = a.role.load()?;
    a.role.endpoint.refuse_rpc_events("the dashboard")?;
    a.role
        .apply(&mut cfg.listen, &mut cfg.directory, &mut cfg.endpoint)?;
    if a.archiver.is_some() {
        cfg.archiver = a.archiver;
    }
    if !a.federation.is_empty() {
        cfg.federation = a.federation;
    }
    if a.plain_http {
        cfg.plain_http = true;
    }
    if a.auth_proxy_user_header.is_some() {
        cfg.auth.proxy_user_header = a.auth_proxy_user_header;
    }
    if a.auth_proxy_org_header.is_some() {
        cfg.auth.proxy_org_header = a.auth_proxy_org_header;
    }
    if !a.auth_trusted_proxy.is_empty() {
        cfg.auth.trusted_proxies = a.auth_trusted_proxy;
    }
    if a.auth_tokens.is_some() {
        cfg.auth.tokens_file = a.auth_tokens;
    }
    cfg.validate().map_err(|e| anyhow!("{e}"))?;
    // The dashboard always serves /metrics on its own port; --metrics-listen adds another.
    let handle = crate::telemetry::recorder()?;
    // The dashboard's TLS as it serves browsers: plain with --plain-http even with a
    // certificate. The metrics endpoint takes it (and the policy); the listener is checked
    // with it before binding.
    let mut served = cfg.endpoint.clone();
    if !cfg.https() {
        (served.tls.cert, served.tls.key, served.tls.client_ca) = (None, None, None);
    }
    let listener = open_endpoint("dashboard", &cfg.listen, &served).await?;
    let bound = listener.local_addr()?;
    let scheme = if cfg.https() { "https" } else { "http" };
    if scheme == "http" {
        crate::telemetry::check_plain_http("the dashboard", bound, cfg.endpoint.tls.allow_plaintext)?;
    }
    eprintln!("gma dashboard url {scheme}://{bound}/");
    gma_dashboard::run(cfg, listener, shutdown_signal(), Some(handle))
        .await
        .map_err(|e| anyhow!("dashboard failed: {e}"))
}
