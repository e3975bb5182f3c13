//! HTTPS for the dashboard and the roles' Prometheus endpoints: the rustls server config (the
//! ring provider tonic uses too). The certificate and key are the role's `[tls]` `cert` and
//! `key` (or `--tls-cert`/`--tls-key`); with a client CA (`client_ca`, `--tls-client-ca`) the
//! handshake verifies client certificates against it, required or optional ([`ClientAuth`]).
//!
//! Connections are accepted by [`gma_core::conn::serve_http`] with this config: the caps and
//! timeouts of `[limits]`, handshakes in their own tasks bounded by `handshake_timeout_ms` (a
//! failed one is dropped and logged at debug), and every request carrying a
//! [`gma_core::conn::Peer`]: the peer's address and the identity (subject CN and O, like the
//! gRPC roles) of its verified client certificate.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;

use crate::DashboardError;

/// The rustls server configuration [`server_config`] builds.
pub type ServerConfig = rustls::ServerConfig;

/// Client certificates asked of HTTPS clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate asked.
    None,
    /// Verified when given; a client without one still connects (other ways to authenticate
    /// remain: a proxy's header, a bearer token).
    Optional,
    /// The handshake fails without a certificate of the client CA.
    Required,
}

fn pem_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, DashboardError> {
    let bad =
        |e: &dyn std::fmt::Display| DashboardError::Config(format!("tls {what} {}: {e}", path.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&e))?;
    if certs.is_empty() {
        return Err(DashboardError::Config(format!(
            "tls {what} {}: no certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// The rustls server config of `cert` (PEM chain) and `key` (PEM private key), verifying client
/// certificates against `client_ca` as `auth` says (`ClientAuth::None` ignores `client_ca`).
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    auth: ClientAuth,
) -> Result<Arc<rustls::ServerConfig>, DashboardError> {
    let certs = pem_certs(cert, "cert")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| DashboardError::Config(format!("tls key {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| DashboardError::Config(format!("tls: {e}")))?;
    let builder = match (client_ca, auth) {
        (Some(ca), ClientAuth::Optional | ClientAuth::Required) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in pem_certs(ca, "client CA")? {
                roots
                    .add(c)
                    .map_err(|e| DashboardError::Config(format!("tls client CA {}: {e}", ca.display())))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| DashboardError::Config(format!("tls client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| DashboardError::Config(format!("tls: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// The dashboard answers over HTTPS with the configured certificate.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_https_with_the_configured_certificate() {
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = crate::DashboardConfig {
            // Nothing listens there: the feeds retry in the background, the page still serves.
            directory: Some("127.0.0.1:1".into()),
            endpoint: gma_core::endpoint::Endpoint {
                tls: gma_core::tls::ServerTls {
                    cert: Some(cert),
                    key: Some(key),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        };
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(crate::run(
            config,
            listener,
            async move {
                let _ = stop_rx.wait_for(|v| *v).await;
            },
            None,
        ));
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        roots.add(ck.cert.der().clone()).unwrap();
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let client = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("ok"), "{text}");
        // A plaintext client gets no page.
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
        assert!(!String::from_utf8_lossy(&buf).contains("200"));
        let _ = stop_tx.send(true);
        server.await.unwrap().unwrap();
    }
}
