//! TLS for every endpoint (rustls: servers accept through [`crate::conn`], clients connect through
//! tonic), and the identity of a peer.
//!
//! One process has one TLS identity (certificate + key) and one set of trust anchors:
//!
//! - as a **server** ([`ServerTls`]) it presents its certificate; with a client CA it requires
//!   and verifies client certificates (mTLS). Without a certificate it serves plaintext, which
//!   is refused on a non-loopback address unless explicitly allowed.
//! - as a **client** ([`ClientTls`], installed once per process with [`install_client`]) every
//!   outgoing connection — to the directory, producers, consumers, raft peers — verifies the
//!   server against the CA and presents the certificate when one is configured. [`endpoint`]
//!   is the one place clients build their endpoints.
//!
//! The identity of a peer is the subject (CN, O) of its verified certificate
//! ([`peer_identity`]); without one it is [`Identity::anonymous`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity as TlsIdentity};

use crate::authz::{identity_from_der, Identity};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {err}")]
    Read { path: PathBuf, err: std::io::Error },
    #[error("tls: {0}")]
    Config(String),
    #[error("refusing plaintext on {0}: it is not a loopback address; give --tls-cert and --tls-key (or allow plaintext explicitly)")]
    Plaintext(SocketAddr),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|err| TlsError::Read {
        path: path.to_path_buf(),
        err,
    })
}

/// A role's TLS settings (`[tls]` in role configs, the same keys as the flags `--tls-cert`,
/// `--tls-key`, `--tls-client-ca`, `--tls-ca`, `--allow-plaintext`): the server side uses
/// `cert`, `key`, `client_ca`; the client side (outgoing connections) `ca`, `cert`, `key`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerTls {
    /// PEM certificate chain presented to clients.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// PEM CA: when set, clients must present a certificate it signed (mTLS).
    pub client_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback address (never needed on loopback).
    pub allow_plaintext: bool,
    /// PEM CA that the servers this role connects to must chain to (client side; turns TLS on
    /// for outgoing connections). The role presents `cert` to them.
    pub ca: Option<PathBuf>,
}

/// The `[tls]` section of a role config (server and client sides).
pub type TlsConfig = ServerTls;

impl ServerTls {
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    /// The client side of these settings.
    pub fn client(&self) -> ClientTls {
        ClientTls {
            ca: self.ca.clone(),
            cert: self.cert.clone().filter(|_| self.ca.is_some()),
            key: self.key.clone().filter(|_| self.ca.is_some()),
        }
    }

    /// Refuses a plaintext listener on `bind` unless it is a loopback address or plaintext is
    /// allowed, and a client CA without a certificate. Call it before binding: it needs the
    /// address only.
    pub fn check_plaintext(&self, bind: SocketAddr) -> Result<(), TlsError> {
        if self.cert.is_none() && self.key.is_none() {
            if self.client_ca.is_some() {
                return Err(TlsError::Config(
                    "a client CA needs a server certificate and key too".into(),
                ));
            }
            if !bind.ip().is_loopback() && !self.allow_plaintext {
                return Err(TlsError::Plaintext(bind));
            }
        }
        Ok(())
    }

    /// [`ServerTls::check_plaintext`] for a listen address given as text (`HOST:PORT`), before
    /// binding: every address the name resolves to must be allowed. One that does not resolve
    /// is left to the bind, which says so.
    pub fn check_listen(&self, listen: &str) -> Result<(), TlsError> {
        use std::net::ToSocketAddrs;
        let Ok(addrs) = listen.to_socket_addrs() else {
            return Ok(());
        };
        for a in addrs {
            self.check_plaintext(a)?;
        }
        Ok(())
    }

    /// The rustls config of a gRPC listener (ALPN `h2`; with `client_ca`, client certificates
    /// signed by it are required), `None` for plaintext — for [`crate::conn::Incoming::grpc`].
    pub fn rustls_config(
        &self,
        bind: SocketAddr,
    ) -> Result<Option<std::sync::Arc<tokio_rustls::rustls::ServerConfig>>, TlsError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls;
        self.check_plaintext(bind)?;
        let (cert, key) = match (&self.cert, &self.key) {
            (None, None) => return Ok(None),
            (Some(c), Some(k)) => (c, k),
            _ => {
                return Err(TlsError::Config(
                    "give both a certificate and its key (--tls-cert and --tls-key)".into(),
                ))
            }
        };
        let pems = |path: &Path| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            let certs = CertificateDer::pem_slice_iter(&read(path)?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::Config(format!("{}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(TlsError::Config(format!(
                    "{}: no certificate in it",
                    path.display()
                )));
            }
            Ok(certs)
        };
        let chain = pems(cert)?;
        let key = PrivateKeyDer::from_pem_slice(&read(key)?)
            .map_err(|e| TlsError::Config(format!("{}: {e}", key.display())))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in pems(ca)? {
                    roots
                        .add(c)
                        .map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                        .build()
                        .map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut cfg = builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some(std::sync::Arc::new(cfg)))
    }
}

/// A client's TLS settings (`--tls-ca`, `--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTls {
    /// PEM CA that server certificates must chain to. Setting it turns TLS on.
    pub ca: Option<PathBuf>,
    /// PEM certificate presented to servers that require one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl ClientTls {
    pub fn enabled(&self) -> bool {
        self.ca.is_some()
    }

    pub fn client_config(&self) -> Result<Option<ClientTlsConfig>, TlsError> {
        let Some(ca) = &self.ca else {
            if self.cert.is_some() || self.key.is_some() {
                return Err(TlsError::Config(
                    "a client certificate needs --tls-ca (the CA servers are verified against)".into(),
                ));
            }
            return Ok(None);
        };
        let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => cfg = cfg.identity(TlsIdentity::from_pem(read(c)?, read(k)?)),
            (None, None) => {}
            _ => {
                return Err(TlsError::Config(
                    "give both a client certificate and its key (--tls-cert and --tls-key)".into(),
                ))
            }
        }
        Ok(Some(cfg))
    }
}

static CLIENT: OnceLock<Option<ClientTlsConfig>> = OnceLock::new();

/// Sets the TLS every outgoing connection of this process uses (once, at start).
pub fn install_client(tls: &ClientTls) -> Result<(), TlsError> {
    let cfg = tls.client_config()?;
    CLIENT
        .set(cfg)
        .map_err(|_| TlsError::Config("client TLS installed twice".into()))
}

/// Installs `tls` unless client TLS is already installed (flags win over config files) or
/// `tls` is empty.
pub fn install_client_if_unset(tls: &ClientTls) -> Result<(), TlsError> {
    if CLIENT.get().is_some() || !tls.enabled() {
        return tls.client_config().map(|_| ());
    }
    let cfg = tls.client_config()?;
    let _ = CLIENT.set(cfg);
    Ok(())
}

/// Whether outgoing connections use TLS.
pub fn client_tls_on() -> bool {
    matches!(CLIENT.get(), Some(Some(_)))
}

/// An endpoint for `addr` (`host:port`, `http://...` or `https://...`) with this process's
/// client TLS: with TLS installed every connection is `https` and verified.
pub fn endpoint(addr: &str) -> Result<Endpoint, crate::Error> {
    let bare = addr.trim_start_matches("http://").trim_start_matches("https://");
    let tls = CLIENT.get().and_then(|c| c.clone());
    let uri = if tls.is_some() {
        format!("https://{bare}")
    } else {
        crate::addr::endpoint_uri(addr)
    };
    let mut ep = Endpoint::from_shared(uri.clone())
        .map_err(|e| crate::Error::Address(format!("bad address {uri}: {e}")))?;
    if let Some(cfg) = tls {
        // Certificates name hosts, not ports; an IP SAN covers a numeric host.
        let host = bare.rsplit_once(':').map(|(h, _)| h).unwrap_or(bare);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ep = ep
            .tls_config(cfg.domain_name(host.to_string()))
            .map_err(|e| crate::Error::Address(format!("tls for {uri}: {e}")))?;
    }
    Ok(ep
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20)))
}

/// The identity (subject CN and O) of the first certificate in the PEM file `path`, e.g. a
/// role's own `[tls] cert`.
pub fn pem_identity(path: &Path) -> Result<Identity, TlsError> {
    let bytes = read(path)?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes)
        .map_err(|e| TlsError::Config(format!("{}: not a PEM certificate: {e}", path.display())))?;
    identity_from_der(&pem.contents).map_err(|e| TlsError::Config(format!("{}: {e}", path.display())))
}

/// The identity of the peer of a request: the subject of its verified client certificate, or
/// anonymous (plaintext, or TLS without a client certificate).
pub fn peer_identity<T>(req: &tonic::Request<T>) -> Identity {
    req.peer_certs()
        .and_then(|certs| certs.first().and_then(|c| identity_from_der(c.as_ref()).ok()))
        .unwrap_or_else(Identity::anonymous)
}

/// The message of a status with its causes (a transport failure's reason is in its source
/// chain: "transport error" alone says nothing), plus a hint for the usual TLS mistakes.
pub fn explain(s: &tonic::Status) -> String {
    let mut msg = s.message().to_string();
    let mut cause = std::error::Error::source(s);
    while let Some(c) = cause {
        let t = c.to_string();
        if !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
        cause = c.source();
    }
    let hint = if msg.contains("CertificateRequired") {
        Some("the server requires a client certificate: give --tls-cert and --tls-key")
    } else if msg.contains("UnknownIssuer")
        || msg.contains("BadCertificate")
        || msg.contains("DecryptError")
        || msg.contains("invalid peer certificate")
    {
        Some("a certificate is not signed by the CA the other side trusts (check --tls-ca, --tls-client-ca and which CA issued the certificates)")
    } else if msg.contains("NotValidForName") {
        Some("the server certificate does not name the address connected to (issue it with --san HOST)")
    } else if msg.contains("InvalidContentType") || msg.contains("CorruptMessage") {
        Some("TLS against a plaintext server: drop --tls-ca for this server, or start it with --tls-cert/--tls-key")
    } else if !client_tls_on()
        && (msg.contains("connection reset")
            || msg.contains("broken pipe")
            || msg.contains("frame with invalid size")
            || msg.contains("connection closed"))
    {
        Some("if the server uses TLS, give --tls-ca (and --tls-cert/--tls-key when it requires client certificates)")
    } else {
        None
    };
    if let Some(h) = hint {
        msg.push_str(" (");
        msg.push_str(h);
        msg.push(')');
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_on_loopback_unless_allowed() {
        let none = ServerTls::default();
        assert!(none
            .rustls_config("127.0.0.1:7000".parse().unwrap())
            .unwrap()
            .is_none());
        let e = none.rustls_config("10.1.2.3:7000".parse().unwrap()).unwrap_err();
        assert!(
            e.to_string().contains("refusing plaintext on 10.1.2.3:7000"),
            "{e}"
        );
        let allowed = ServerTls {
            allow_plaintext: true,
            ..ServerTls::default()
        };
        assert!(allowed
            .rustls_config("10.1.2.3:7000".parse().unwrap())
            .unwrap()
            .is_none());
    }

    #[test]
    fn half_configurations_are_errors() {
        let cert_only = ServerTls {
            cert: Some("c.pem".into()),
            ..ServerTls::default()
        };
        assert!(cert_only
            .rustls_config("127.0.0.1:1".parse().unwrap())
            .unwrap_err()
            .to_string()
            .contains("both a certificate and its key"));
        let ca_only = ServerTls {
            client_ca: Some("ca.pem".into()),
            ..ServerTls::default()
        };
        assert!(ca_only.rustls_config("127.0.0.1:1".parse().unwrap()).is_err());
        let missing = ServerTls {
            cert: Some("/nonexistent/c.pem".into()),
            key: Some("/nonexistent/k.pem".into()),
            ..ServerTls::default()
        };
        assert!(missing
            .rustls_config("127.0.0.1:1".parse().unwrap())
            .unwrap_err()
            .to_string()
            .contains("cannot read /nonexistent/c.pem"));
        let client = ClientTls {
            cert: Some("c.pem".into()),
            key: Some("k.pem".into()),
            ca: None,
        };
        assert!(client
            .client_config()
            .unwrap_err()
            .to_string()
            .contains("--tls-ca"));
        assert!(ClientTls::default().client_config().unwrap().is_none());
    }
}
