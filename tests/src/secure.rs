//! A secured site for the door tests, made with the real `gma certs` and real processes: a CA,
//! the roles' certificate `node1` (org `site1`), an inside user `alice` (org `site1`), an
//! outside user `bob` (org `partner`, summaries of `host.*` only), and a certificate of
//! another CA (`eve`). The policy is the README's secured set-up plus the archive, dashboard
//! and metrics doors. [`https`] is a small HTTPS client (rustls) presenting a certificate or
//! headers, for the HTTP doors.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_rustls::rustls;

use super::*;

/// Inside (`site1`) may do everything; `partner` receives summaries of `host.*` only (live and
/// from the archive) and may ask the broker for placements; everyone else nothing.
pub const POLICY: &str = r#"default = "deny"

[[rule]]
org = "site1"
actions = ["*"]
effect = "allow"

[[rule]]
org = "partner"
actions = ["directory.search", "directory.watch", "producer.subscribe", "producer.query", "archive.query"]
resources = ["host.*"]
effect = "summary"

[[rule]]
org = "partner"
actions = ["broker.select"]
effect = "allow"
"#;

/// Rules for the HTTP doors, appended to [`POLICY`]: `partner` may open the dashboard and read
/// the roles' metrics, and receives `gma.rpc` raw (so its dashboard stream has something to
/// show).
pub const POLICY_HTTP: &str = r#"
[[rule]]
org = "partner"
actions = ["dashboard.read", "metrics.read"]
effect = "allow"

[[rule]]
org = "partner"
actions = ["producer.subscribe"]
resources = ["gma.rpc"]
effect = "allow"
"#;

pub struct Secure {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
}

impl Secure {
    /// Certificates and the policy file (`policy` appended to [`POLICY`]).
    pub fn new(policy_extra: &str) -> Secure {
        Secure::with_policy(&format!("{POLICY}{policy_extra}"), &[])
    }

    /// The certificates of [`Secure::new`] and `extra` leaves (`(ca, name, org)`), and
    /// `policy` as the whole policy file.
    pub fn with_policy(policy: &str, extra: &[(&str, &str, &str)]) -> Secure {
        let tmp = tempdir();
        let dir = tmp.path().to_path_buf();
        let mut leaves = vec![
            ("ca", "node1", "site1"),
            ("ca", "alice", "site1"),
            ("ca", "bob", "partner"),
            ("other-ca", "eve", "site1"),
        ];
        leaves.extend_from_slice(extra);
        make_certs(&dir, &["ca", "other-ca"], &leaves);
        std::fs::write(dir.join("policy.toml"), policy).unwrap();
        Secure { _tmp: tmp, dir }
    }

    pub fn path(&self, p: &str) -> String {
        self.dir.join(p).to_str().unwrap().to_string()
    }

    /// The flags of a role: mTLS served with `node1`'s certificate, TLS for its own
    /// connections, the policy.
    pub fn role_flags(&self) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.path("ca/ca.pem"),
            "--tls-cert".into(),
            self.path("certs/node1.pem"),
            "--tls-key".into(),
            self.path("certs/node1.key"),
            "--tls-client-ca".into(),
            self.path("ca/ca.pem"),
            "--access-policy".into(),
            self.path("policy.toml"),
        ]
    }

    /// The flags of a client command run as `who`.
    pub fn user_flags(&self, who: &str) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.path("ca/ca.pem"),
            "--tls-cert".into(),
            self.path(&format!("certs/{who}.pem")),
            "--tls-key".into(),
            self.path(&format!("certs/{who}.key")),
        ]
    }

    /// Starts `gma args... <role flags>` and waits for `marker`.
    pub fn start(&self, args: &[&str], marker: &str) -> Proc {
        let flags = self.role_flags();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(flags.iter().map(String::as_str));
        Proc::start(&all, marker)
    }

    /// A one-member directory with mTLS and the policy.
    pub fn directory(&self) -> Proc {
        let data = self.path("dir-data");
        self.start(
            &["directory", "--listen", "127.0.0.1:0", "--data", &data],
            "gma directory listening on",
        )
    }

    /// A producer of two simulated hosts (`h1`, `h2`, 10 samples/s) registered in `directory`,
    /// deriving the summaries of `host.load` for good (`host.load.avg1m`, ...).
    pub fn producer(&self, directory: &str, extra: &[&str]) -> Proc {
        let cmd = self.producer_cmd(directory);
        let mut args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        self.start(&args, "gma producer listening on")
    }

    /// The arguments of [`Secure::producer`] before the role's flags: `producer --config FILE`.
    pub fn producer_cmd(&self, directory: &str) -> Vec<String> {
        let sim = self.dir.join("sim.toml");
        std::fs::write(
            &sim,
            "period_ms = 100\n\
             [[host]]\nname = \"h1\"\ncpus = 4\nmemory_mb = 1024\nload = 1.5\n\
             [[host]]\nname = \"h2\"\ncpus = 8\nmemory_mb = 2048\nwalk = { min = 0.0, max = 4.0, step = 0.1, seed = 3 }\n",
        )
        .unwrap();
        let cfg = self.dir.join("producer.toml");
        std::fs::write(
            &cfg,
            format!(
                "listen = \"127.0.0.1:0\"\ndirectory = \"{directory}\"\nhost_sensors = false\n\
                 lease_ttl_ms = 2000\nrpc_events_ms = 500\nsimulate = \"{}\"\n\
                 summaries = [\"host.load\"]\n",
                sim.display()
            ),
        )
        .unwrap();
        vec![
            "producer".into(),
            "--config".into(),
            cfg.to_str().unwrap().to_string(),
        ]
    }

    /// Runs `gma args...` as `who` (its certificate, the CA).
    pub fn run_as(&self, who: &str, args: &[&str]) -> Run {
        let flags = self.user_flags(who);
        let mut all: Vec<&str> = args.to_vec();
        all.extend(flags.iter().map(String::as_str));
        gma(&all, Duration::from_secs(30))
    }

    /// `GET path` over HTTPS on `addr`, trusting this site's CA, presenting `who`'s
    /// certificate (a name in `certs/`) when given. See [`https`].
    pub fn get(
        &self,
        addr: &str,
        path: &str,
        who: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<(u16, String), String> {
        https(self, addr, path, who, headers, |_| false)
    }
}

/// `GET path` over HTTPS (HTTP/1.1, `Connection: close`) on `addr` with `headers`, trusting
/// `site`'s CA and presenting `who`'s certificate when given. Reads until the server closes,
/// or until `enough` holds of the text read so far (for endless streams such as SSE), or 10 s
/// pass. Returns (status, body); a refused handshake is an `Err` naming the cause.
pub fn https(
    site: &Secure,
    addr: &str,
    path: &str,
    who: Option<&str>,
    headers: &[(&str, &str)],
    enough: impl Fn(&str) -> bool,
) -> Result<(u16, String), String> {
    https_request(site, "GET", addr, path, who, headers, enough)
}

/// [`https`] with another method (`POST` with an empty body: parameters in `path`).
pub fn https_request(
    site: &Secure,
    method: &str,
    addr: &str,
    path: &str,
    who: Option<&str>,
    headers: &[(&str, &str)],
    enough: impl Fn(&str) -> bool,
) -> Result<(u16, String), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(site.dir.join("ca/ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let cfg = match who {
        Some(w) => {
            let (cert, key) = match w.split_once('/') {
                // "other-ca/eve": a certificate of another CA is still under certs/.
                Some((_, name)) => (format!("certs/{name}.pem"), format!("certs/{name}.key")),
                None => (format!("certs/{w}.pem"), format!("certs/{w}.key")),
            };
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(site.dir.join(cert))
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
            let key = PrivateKeyDer::from_pem_file(site.dir.join(key)).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from("127.0.0.1").unwrap().to_owned();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    // The handshake may wait on a busy server: a long timeout for it, the short one (a step of
    // the response loop, which has its own deadline) only once the request is sent.
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if method != "GET" {
        req.push_str("Content-Length: 0\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tls.write_all(req.as_bytes())
        .and_then(|()| tls.flush())
        .map_err(|e| format!("handshake or write: {e}"))?;
    tls.sock
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    read_response(&mut tls, enough)
}

/// `GET path` over plain HTTP on `addr` with `headers` (see [`https`]).
pub fn http(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    enough: impl Fn(&str) -> bool,
) -> Result<(u16, String), String> {
    http_from("127.0.0.1", addr, path, headers, enough)
}

/// [`http`] from the local address `from` (another loopback address, `127.0.0.2`, plays a
/// client that is not the trusted proxy).
pub fn http_from(
    from: &str,
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    enough: impl Fn(&str) -> bool,
) -> Result<(u16, String), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tcp = rt
        .block_on(async {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.bind(format!("{from}:0").parse().unwrap())?;
            s.connect(addr.parse().unwrap()).await
        })
        .map_err(|e| e.to_string())?;
    let mut tcp = tcp.into_std().map_err(|e| e.to_string())?;
    tcp.set_nonblocking(false).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    read_response(&mut tcp, enough)
}

fn read_response(s: &mut impl Read, enough: impl Fn(&str) -> bool) -> Result<(u16, String), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    let mut closed = false;
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            // A peer that closes without close_notify: what was read stands.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                closed = true;
                break;
            }
            Err(e) if raw.is_empty() => return Err(format!("read: {e}")),
            Err(_) => break,
        }
        let text = String::from_utf8_lossy(&raw);
        if enough(&text) || Instant::now() >= deadline {
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP response: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status: {head:?}"))?;
    // A stream cut short (SSE) is returned as read, chunk sizes and all.
    if closed && head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Ok((status, dechunk(body)));
    }
    Ok((status, body.to_string()))
}
