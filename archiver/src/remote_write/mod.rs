//! Remote write: the archiver forwards what it archives to a Prometheus-compatible store
//! (Prometheus, Thanos receive, Mimir, Cortex, VictoriaMetrics) with the Prometheus
//! remote-write 1.0 protocol. docs/remote-write.md is the user's page.
//!
//! A forwarder task of the archiver role reads from the *store* (durable data, what
//! `gma archive query` returns: numeric fields, after the keep policy), never from the ingest
//! path, so what it sends survives restarts and a remote that is down only delays it.
//!
//! - [`batch`]: per archived series, the samples after its resume point, in timestamp order, at
//!   most one per millisecond (Prometheus' resolution), at most `batch_samples` per request.
//! - [`wire`]: the `WriteRequest` protobuf (prost) compressed as a snappy block.
//! - [`client`]: the HTTP POST (hyper), with the protocol's headers.
//! - [`state`]: the resume state (`DATA/remote_write.json`, fsynced).
//! - [`forwarder`]: the loop: list, build, record in flight, send (retry with backoff),
//!   record acknowledged.

pub mod batch;
pub mod client;
pub mod error;
pub mod forwarder;
pub mod state;
pub mod wire;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use tokio_rustls::rustls::{self, ClientConfig};

pub use error::RemoteWriteError;
pub use forwarder::{spawn, Forwarder};

use RemoteWriteError as E;

/// The User-Agent of the requests.
pub const USER_AGENT: &str = concat!("gma-archiver/", env!("CARGO_PKG_VERSION"));

/// Most samples one request may carry (`batch_samples`).
pub const MAX_BATCH_SAMPLES: usize = 100_000;

/// `[remote_write]` of the archiver's configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteWriteConfig {
    /// The receiver, e.g. `http://127.0.0.1:9090/api/v1/write` (Prometheus with
    /// `--web.enable-remote-write-receiver`), or `https://...` with `ca_file`.
    pub url: String,
    /// https: PEM certificate(s) the receiver's certificate must chain to (for a public CA, the
    /// system bundle, e.g. /etc/ssl/certs/ca-certificates.crt). Required for https.
    pub ca_file: Option<PathBuf>,
    /// https: a client certificate (PEM chain) and its key, for receivers that require one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Most samples per request.
    pub batch_samples: usize,
    /// The bound of the backlog: samples older than this (against the clock) that were never
    /// sent are skipped and counted (`gma_archiver_remote_write_samples_skipped_total`), e.g.
    /// `1h` — Prometheus itself refuses samples about an hour older than its newest. `0` = no
    /// bound (everything archived is sent, however old).
    pub max_backlog: String,
    /// Backoff after a failed attempt: starts here, doubles up to `max_backoff_ms`.
    pub min_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// One attempt's timeout (connect, send, answer).
    pub timeout_ms: u64,
    /// How often the store is looked at for new samples when everything was sent.
    pub interval_ms: u64,
    /// Extra headers of every request (e.g. `X-Scope-OrgID` for Mimir/Cortex tenants).
    pub headers: BTreeMap<String, String>,
    pub basic_auth: Option<BasicAuth>,
}

impl Default for RemoteWriteConfig {
    fn default() -> Self {
        RemoteWriteConfig {
            url: String::new(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            batch_samples: 2000,
            max_backlog: "1h".into(),
            min_backoff_ms: 100,
            max_backoff_ms: 5000,
            timeout_ms: 10_000,
            interval_ms: 250,
            headers: BTreeMap::new(),
            basic_auth: None,
        }
    }
}

/// `[remote_write.basic_auth]`: `password` or `password_file` (first line).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// A checked `[remote_write]`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: String,
    pub uri: hyper::Uri,
    /// Set for https.
    pub tls: Option<Arc<ClientConfig>>,
    pub headers: HeaderMap,
    pub batch_samples: usize,
    /// `None`: no bound.
    pub max_backlog_ms: Option<i64>,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    pub timeout: Duration,
    pub interval: Duration,
}

/// Headers the protocol sets itself.
const RESERVED: [&str; 6] = [
    "content-encoding",
    "content-type",
    "content-length",
    "x-prometheus-remote-write-version",
    "host",
    "transfer-encoding",
];

impl RemoteWriteConfig {
    /// Checks every key; the error names the key and says what to do.
    pub fn check(&self) -> Result<Settings, RemoteWriteError> {
        let uri: hyper::Uri = self.url.parse().map_err(|e| {
            E::config(format!(
                "remote_write.url {:?}: {e} (e.g. http://127.0.0.1:9090/api/v1/write)",
                self.url
            ))
        })?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(E::config(format!(
                "remote_write.url {:?}: must be http(s)://HOST[:PORT]/PATH",
                self.url
            )));
        }
        let tls = self.tls(uri.scheme_str() == Some("https"))?;
        if self.batch_samples == 0 || self.batch_samples > MAX_BATCH_SAMPLES {
            return Err(E::config(format!(
                "remote_write.batch_samples must lie in 1..={MAX_BATCH_SAMPLES}"
            )));
        }
        let max_backlog_ms = match self.max_backlog.trim() {
            "0" | "" => None,
            s => {
                let ns = gma_core::time::parse_duration(s)
                    .map_err(|e| E::config(format!("remote_write.max_backlog: {e}")))?;
                if ns <= 0 {
                    return Err(E::config(
                        "remote_write.max_backlog must be positive (or 0 for no bound)",
                    ));
                }
                Some(ns / batch::NS_PER_MS)
            }
        };
        if self.min_backoff_ms == 0 || self.max_backoff_ms < self.min_backoff_ms {
            return Err(E::config(
                "remote_write: min_backoff_ms must be at least 1 and max_backoff_ms at least min_backoff_ms",
            ));
        }
        if self.timeout_ms == 0 || self.interval_ms == 0 {
            return Err(E::config(
                "remote_write: timeout_ms and interval_ms must be at least 1",
            ));
        }
        let mut headers = HeaderMap::new();
        for (k, v) in &self.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| E::config(format!("remote_write.headers: {k:?} is not a header name: {e}")))?;
            if RESERVED.contains(&name.as_str()) {
                return Err(E::config(format!(
                    "remote_write.headers: {k} is set by the protocol; remove it"
                )));
            }
            let value = HeaderValue::from_str(v)
                .map_err(|e| E::config(format!("remote_write.headers.{k}: not a header value: {e}")))?;
            headers.insert(name, value);
        }
        if let Some(b) = &self.basic_auth {
            if headers.contains_key(hyper::header::AUTHORIZATION) {
                return Err(E::config(
                    "remote_write: basic_auth and an Authorization header exclude each other; keep one",
                ));
            }
            let password = match (&b.password, &b.password_file) {
                (Some(p), None) => p.clone(),
                (None, Some(f)) => std::fs::read_to_string(f)
                    .map_err(|e| {
                        E::config(format!(
                            "remote_write.basic_auth.password_file {}: {e}",
                            f.display()
                        ))
                    })?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                _ => {
                    return Err(E::config(
                        "remote_write.basic_auth: set exactly one of password and password_file",
                    ))
                }
            };
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{}:{password}", b.username));
            let mut value = HeaderValue::from_str(&format!("Basic {token}"))
                .map_err(|e| E::config(format!("remote_write.basic_auth: {e}")))?;
            value.set_sensitive(true);
            headers.insert(hyper::header::AUTHORIZATION, value);
        }
        Ok(Settings {
            url: self.url.clone(),
            uri,
            tls,
            headers,
            batch_samples: self.batch_samples,
            max_backlog_ms,
            min_backoff: Duration::from_millis(self.min_backoff_ms),
            max_backoff: Duration::from_millis(self.max_backoff_ms),
            timeout: Duration::from_millis(self.timeout_ms),
            interval: Duration::from_millis(self.interval_ms),
        })
    }
}

/// The PEM certificates of `path` (at least one).
fn pem_certs(key: &str, path: &Path) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, E> {
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| E::config(format!("remote_write.{key} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(E::config(format!(
            "remote_write.{key} {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

impl RemoteWriteConfig {
    /// The TLS client configuration of an https URL.
    fn tls(&self, https: bool) -> Result<Option<Arc<ClientConfig>>, E> {
        if !https {
            if self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some() {
                return Err(E::config(
                    "remote_write: ca_file, cert_file and key_file need an https:// url",
                ));
            }
            return Ok(None);
        }
        let ca = self.ca_file.as_ref().ok_or_else(|| E::config(
            "remote_write: an https url needs ca_file (the PEM CA of the receiver's certificate; for a public CA the system bundle, e.g. /etc/ssl/certs/ca-certificates.crt)",
        ))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in pem_certs("ca_file", ca)? {
            roots
                .add(c)
                .map_err(|e| E::config(format!("remote_write.ca_file {}: {e}", ca.display())))?;
        }
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| E::config(format!("remote_write: tls: {e}")))?
            .with_root_certificates(roots);
        let cfg = match (&self.cert_file, &self.key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(c), Some(k)) => {
                use rustls_pki_types::pem::PemObject;
                let key = rustls_pki_types::PrivateKeyDer::from_pem_file(k)
                    .map_err(|e| E::config(format!("remote_write.key_file {}: {e}", k.display())))?;
                builder
                    .with_client_auth_cert(pem_certs("cert_file", c)?, key)
                    .map_err(|e| E::config(format!("remote_write.cert_file {}: {e}", c.display())))?
            }
            _ => {
                return Err(E::config(
                    "remote_write: give both cert_file and key_file, or neither",
                ))
            }
        };
        Ok(Some(Arc::new(cfg)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings of a `[remote_write]` section, or the message of its error (a TOML one
    /// included).
    fn cfg(toml_text: &str) -> Result<Settings, String> {
        let c: RemoteWriteConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        c.check().map_err(|e| e.to_string())
    }

    #[test]
    fn a_good_section_checks_and_bad_keys_are_named() {
        let s = cfg("url = \"http://127.0.0.1:9090/api/v1/write\"\nheaders = { X-Scope-OrgID = \"t1\" }\n[basic_auth]\nusername = \"u\"\npassword = \"p\"\n").unwrap();
        assert_eq!(s.batch_samples, 2000);
        assert_eq!(s.max_backlog_ms, Some(3_600_000));
        assert_eq!(s.headers["x-scope-orgid"], "t1");
        assert_eq!(s.headers["authorization"], "Basic dTpw");
        for (text, want) in [
            ("url = \"https://x/api/v1/write\"", "needs ca_file"),
            (
                "url = \"http://x/w\"\nca_file = \"/etc/hostname\"",
                "need an https",
            ),
            (
                "url = \"https://x/w\"\nca_file = \"/nonexistent/ca.pem\"",
                "ca_file /nonexistent/ca.pem",
            ),
            ("url = \"ftp://x/w\"", "must be http(s)"),
            ("url = \"nope\"", "remote_write.url"),
            ("url = \"http://x/w\"\nbatch_samples = 0", "batch_samples"),
            ("url = \"http://x/w\"\nmax_backlog = \"soon\"", "max_backlog"),
            (
                "url = \"http://x/w\"\nheaders = { Content-Type = \"x\" }",
                "set by the protocol",
            ),
            (
                "url = \"http://x/w\"\n[basic_auth]\nusername = \"u\"",
                "exactly one",
            ),
            (
                "url = \"http://x/w\"\nmin_backoff_ms = 10\nmax_backoff_ms = 5",
                "max_backoff_ms",
            ),
            ("url = \"http://x/w\"\nbogus = 1", "bogus"),
        ] {
            let e = cfg(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        assert_eq!(
            cfg("url = \"http://x/w\"\nmax_backlog = \"0\"")
                .unwrap()
                .max_backlog_ms,
            None
        );
    }
}
