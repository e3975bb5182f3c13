//! The HTTP/1.1 POST of one remote-write request, on one kept-alive connection (hyper's client
//! connection; reconnected after any failure), over TCP or TLS (rustls).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::ClientConfig;

use super::RemoteWriteError as E;

/// How much of an error response's body is kept for the log.
const ERROR_BODY_BYTES: usize = 1024;

/// The answer to one attempt.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// 2xx.
    Acked,
    /// 5xx, 429, a connection failure or a timeout: the same request is tried again.
    Retry(String),
    /// Any other status: the remote refuses the request; retrying cannot help.
    Refused(StatusCode, String),
}

/// A remote-write endpoint.
pub struct Client {
    uri: Uri,
    /// `host:port` to connect to.
    authority: String,
    /// https: the TLS configuration and the name the certificate must hold.
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    headers: HeaderMap,
    timeout: Duration,
    conn: Option<SendRequest<Full<Bytes>>>,
}

impl Client {
    /// `headers` are added to every request (after the protocol's own).
    /// `tls` is required for an https `uri` and refused for http.
    pub fn new(
        uri: Uri,
        tls: Option<Arc<ClientConfig>>,
        headers: HeaderMap,
        timeout: Duration,
    ) -> Result<Client, E> {
        let host = uri
            .host()
            .ok_or_else(|| E::config(format!("remote_write.url {uri}: no host")))?;
        let (tls, default_port) = match (uri.scheme_str(), tls) {
            (Some("http"), None) => (None, 80),
            (Some("https"), Some(cfg)) => {
                // `[::1]` in a URL is `::1` in a certificate.
                let name = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(name.to_string())
                    .map_err(|e| E::config(format!("remote_write.url {uri}: {e}")))?;
                (Some((tokio_rustls::TlsConnector::from(cfg), name)), 443)
            }
            _ => {
                return Err(E::config(format!(
                    "remote_write.url {uri}: http:// without TLS settings or https:// with them"
                )))
            }
        };
        let authority = format!("{host}:{}", uri.port_u16().unwrap_or(default_port));
        let mut all = HeaderMap::new();
        for (k, v) in [
            ("content-encoding", "snappy"),
            ("content-type", "application/x-protobuf"),
            ("x-prometheus-remote-write-version", "0.1.0"),
            ("user-agent", crate::remote_write::USER_AGENT),
        ] {
            all.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        if let Some(a) = uri.authority() {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                all.insert(hyper::header::HOST, v);
            }
        }
        all.extend(headers);
        Ok(Client {
            uri,
            authority,
            tls,
            headers: all,
            timeout,
            conn: None,
        })
    }

    /// Sends `body` once (within the timeout).
    pub async fn post(&mut self, body: Bytes) -> Outcome {
        match tokio::time::timeout(self.timeout, self.attempt(body)).await {
            Ok(Ok((status, _))) if status.is_success() => Outcome::Acked,
            Ok(Ok((status, text))) => {
                if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                    Outcome::Retry(format!("{status}: {text}"))
                } else {
                    Outcome::Refused(status, text)
                }
            }
            Ok(Err(e)) => {
                self.conn = None;
                Outcome::Retry(e.to_string())
            }
            Err(_) => {
                self.conn = None;
                Outcome::Retry(format!("no answer within {:?}", self.timeout))
            }
        }
    }

    async fn attempt(&mut self, body: Bytes) -> Result<(StatusCode, String), E> {
        let mut conn = match self.conn.take() {
            Some(c) if !c.is_closed() => c,
            _ => self.connect().await?,
        };
        conn.ready().await.map_err(|source| E::Http {
            what: "connection".into(),
            source,
        })?;
        let target = self.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = Request::post(target).body(Full::new(body))?;
        *req.headers_mut() = self.headers.clone();
        let resp = conn.send_request(req).await.map_err(|source| E::Http {
            what: "send".into(),
            source,
        })?;
        let status = resp.status();
        // The body is read (up to a bound) so the connection can carry the next request.
        let text = match Limited::new(resp.into_body(), 64 * 1024).collect().await {
            Ok(b) => {
                let b = b.to_bytes();
                String::from_utf8_lossy(&b[..b.len().min(ERROR_BODY_BYTES)])
                    .trim()
                    .to_string()
            }
            Err(e) => {
                // The connection is in an unknown state: not reused.
                return Ok((status, format!("(unreadable body: {e})")));
            }
        };
        self.conn = Some(conn);
        Ok((status, text))
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, E> {
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(self.cannot("connect"))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => self.http(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(self.cannot("tls with"))?;
                self.http(tls).await
            }
        }
    }

    /// The error of a step (`connect`, `tls with`) that failed with the receiver.
    fn cannot(&self, what: &'static str) -> impl FnOnce(std::io::Error) -> E + '_ {
        move |source| E::Connect {
            what,
            authority: self.authority.clone(),
            source,
        }
    }

    /// HTTP/1.1 over `io`; the connection runs in its own task.
    async fn http<T>(&self, io: T) -> Result<SendRequest<Full<Bytes>>, E>
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|source| E::Http {
                what: format!("handshake with {}", self.authority),
                source,
            })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "remote write connection closed");
            }
        });
        Ok(send)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A peer that answers each request on its connections with the next status of `statuses`
    /// and hands the request heads (and body lengths) it read to the test.
    async fn peer(statuses: Vec<u16>) -> (String, tokio::sync::mpsc::UnboundedReceiver<(String, usize)>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut statuses = statuses.into_iter();
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    let Ok(n) = s.read(&mut chunk).await else { break };
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() < end + 4 + len {
                        continue;
                    }
                    buf.drain(..end + 4 + len);
                    tx.send((head, len)).unwrap();
                    let Some(status) = statuses.next() else { return };
                    let body = "nope";
                    let resp = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    s.write_all(resp.as_bytes()).await.unwrap();
                }
            }
        });
        (addr, rx)
    }

    fn client(addr: &str) -> Client {
        let cfg: crate::remote_write::RemoteWriteConfig = toml::from_str(&format!(
            "url = \"http://{addr}/api/v1/write\"\nheaders = {{ X-Scope-OrgID = \"t1\" }}\n[basic_auth]\nusername = \"u\"\npassword = \"p\"\n"
        ))
        .unwrap();
        let s = cfg.check().unwrap();
        Client::new(s.uri, s.tls, s.headers, Duration::from_secs(5)).unwrap()
    }

    #[tokio::test]
    async fn statuses_map_to_ack_retry_and_refusal_and_the_protocol_headers_are_sent() {
        let (addr, mut heads) = peer(vec![204, 429, 503, 400, 200]).await;
        let mut c = client(&addr);
        let body = Bytes::from_static(b"0123456789");
        assert_eq!(c.post(body.clone()).await, Outcome::Acked);
        let (head, len) = heads.recv().await.unwrap();
        assert_eq!(len, 10);
        let lower = head.to_ascii_lowercase();
        assert!(lower.starts_with("post /api/v1/write http/1.1"), "{head}");
        for h in [
            "content-encoding: snappy",
            "content-type: application/x-protobuf",
            "x-prometheus-remote-write-version: 0.1.0",
            "x-scope-orgid: t1",
            "authorization: basic dtpw",
            &format!("host: {addr}"),
        ] {
            assert!(lower.contains(h), "{h} missing in {head}");
        }
        assert!(matches!(c.post(body.clone()).await, Outcome::Retry(m) if m.contains("429")));
        assert!(matches!(c.post(body.clone()).await, Outcome::Retry(m) if m.contains("503")));
        assert_eq!(
            c.post(body.clone()).await,
            Outcome::Refused(StatusCode::BAD_REQUEST, "nope".into())
        );
        assert_eq!(c.post(body.clone()).await, Outcome::Acked);
        // Every request reached the peer.
        for _ in 0..4 {
            heads.recv().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_receiver_that_is_not_there_is_retried() {
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut c = client(&format!("127.0.0.1:{port}"));
        assert!(matches!(c.post(Bytes::new()).await, Outcome::Retry(m) if m.contains("connect")));
    }
}
