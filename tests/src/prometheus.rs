//! A throw-away Prometheus server for the remote-write tests (docs/remote-write.md; the recipe
//! of the project's notes on real parts, §4): Debian's `prometheus` 2.42 under a temp dir, on
//! 127.0.0.1 and a free port, with its remote-write receiver on (`POST /api/v1/write`), no
//! scrape jobs. [`Prometheus::stop`] and [`Prometheus::start_again`] take it down and bring it
//! back on the same port with the same data (an outage); dropping it stops it.
//!
//! [`prometheus_or_skip`] turns "cannot start" into a failure under `CI=true` and a skip message
//! elsewhere. scripts/test.sh installs `prometheus` when missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::netns::in_ci;
use crate::slurm::which;
use crate::{http_get, wait_until};

/// A running (or stopped) server.
pub struct Prometheus {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
    /// HTTPS: the CA of its certificate (queries go through `curl --cacert`).
    ca: Option<PathBuf>,
}

/// Percent-encodes a query-string value.
pub fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Prometheus {
    /// Starts a server on a [`crate::reserved_port`] and waits until it is ready (at most 30 s).
    pub fn start() -> Result<Prometheus, String> {
        Prometheus::start_with(None)
    }

    /// [`Prometheus::start`] serving HTTPS only, with `cert`/`key` (PEM), whose CA is `ca`
    /// (`--web.config.file`); its readiness is its log line, its queries go through curl.
    pub fn start_tls(cert: &Path, key: &Path, ca: &Path) -> Result<Prometheus, String> {
        Prometheus::start_with(Some((cert, key, ca)))
    }

    fn start_with(tls: Option<(&Path, &Path, &Path)>) -> Result<Prometheus, String> {
        if !which("prometheus") {
            return Err("prometheus is not installed (apt-get install prometheus)".into());
        }
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        std::fs::write(
            dir.path().join("prometheus.yml"),
            "global: {scrape_interval: 15s, evaluation_interval: 15s}\nscrape_configs: []\n",
        )
        .map_err(|e| format!("prometheus.yml: {e}"))?;
        if let Some((cert, key, _)) = tls {
            if !which("curl") {
                return Err("curl is not installed (apt-get install curl)".into());
            }
            std::fs::write(
                dir.path().join("web.yml"),
                format!(
                    "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                    cert.display(),
                    key.display()
                ),
            )
            .map_err(|e| format!("web.yml: {e}"))?;
        }
        let mut p = Prometheus {
            dir,
            port: crate::reserved_port(),
            child: None,
            ca: tls.map(|t| t.2.to_path_buf()),
        };
        p.launch()?;
        Ok(p)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn launch(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("prometheus.log"))
            .map_err(|e| format!("log file: {e}"))?;
        let mut cmd = Command::new("prometheus");
        if self.ca.is_some() {
            cmd.arg(format!(
                "--web.config.file={}",
                self.dir.path().join("web.yml").display()
            ));
        }
        let child = cmd
            .arg(format!(
                "--config.file={}",
                self.dir.path().join("prometheus.yml").display()
            ))
            .arg(format!("--storage.tsdb.path={}", self.data().display()))
            .arg(format!("--web.listen-address={}", self.address()))
            .arg("--web.enable-remote-write-receiver")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn prometheus: {e}"))?;
        self.child = Some(child);
        let addr = self.address();
        let ready = wait_until(Duration::from_secs(30), || {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return true;
            }
            match self.ca {
                None => http_get(&addr, "/-/ready").is_ok_and(|(s, _)| s == 200),
                Some(_) => self.log().contains("Server is ready to receive web requests."),
            }
        });
        let exited = matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))));
        if !ready || exited {
            self.stop();
            return Err(format!(
                "prometheus did not become ready on {addr}; log: {}",
                self.log()
            ));
        }
        Ok(())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The remote-write receiver's URL.
    pub fn write_url(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}/api/v1/write", self.address())
    }

    /// `GET path`: (status, body); over HTTPS with curl.
    fn get(&self, path: &str) -> Result<(u16, String), String> {
        let Some(ca) = &self.ca else {
            return http_get(&self.address(), path).map_err(|e| format!("GET {path}: {e}"));
        };
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", "--cacert"])
            .arg(ca)
            .arg(format!("https://{}{path}", self.address()))
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text
            .rsplit_once('\n')
            .ok_or_else(|| format!("curl {path}: {}", String::from_utf8_lossy(&out.stderr)))?;
        let code = code
            .trim()
            .parse()
            .map_err(|_| format!("curl {path}: {}", String::from_utf8_lossy(&out.stderr)))?;
        Ok((code, body.to_string()))
    }

    /// Kills the server (SIGKILL) and waits for it: the port refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same data.
    pub fn start_again(&mut self) -> Result<(), String> {
        self.stop();
        self.launch()
    }

    /// `GET /api/v1/query?query=Q&time=T` (T in seconds, millisecond precision): the `data`
    /// of a successful answer.
    pub fn query(&self, q: &str, time_ms: i64) -> Result<serde_json::Value, String> {
        let path = format!(
            "/api/v1/query?query={}&time={}.{:03}",
            urlencode(q),
            time_ms.div_euclid(1000),
            time_ms.rem_euclid(1000)
        );
        let (status, body) = self.get(&path)?;
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("GET {path}: {status}: {e}: {body}"))?;
        if status != 200 || v["status"] != "success" {
            return Err(format!("GET {path}: {status}: {body}"));
        }
        Ok(v["data"].clone())
    }

    /// The raw samples Prometheus holds for `selector` (one series) with
    /// `from_ms <= t <= to_ms`: a range-vector query (`selector[Nms]` at `to_ms`), so every
    /// stored sample, as (milliseconds, value).
    pub fn raw_samples(&self, selector: &str, from_ms: i64, to_ms: i64) -> Result<Vec<(i64, f64)>, String> {
        let span = (to_ms - from_ms + 1).max(1);
        let data = self.query(&format!("{selector}[{span}ms]"), to_ms)?;
        let result = data["result"]
            .as_array()
            .ok_or_else(|| format!("no result array: {data}"))?;
        if result.len() > 1 {
            return Err(format!("{selector} matches {} series: {data}", result.len()));
        }
        let Some(series) = result.first() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for pair in series["values"].as_array().into_iter().flatten() {
            let t = pair[0].as_f64().ok_or_else(|| format!("bad time in {pair}"))?;
            let v = pair[1]
                .as_str()
                .ok_or_else(|| format!("bad value in {pair}"))?
                .parse::<f64>()
                .map_err(|e| format!("bad value in {pair}: {e}"))?;
            let ms = (t * 1000.0).round() as i64;
            if ms >= from_ms {
                out.push((ms, v));
            }
        }
        Ok(out)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A started server; `None` (a printed SKIPPED) when it cannot start, a panic under `CI=true`.
pub fn prometheus_or_skip(test: &str) -> Option<Prometheus> {
    match Prometheus::start() {
        Ok(p) => Some(p),
        Err(e) if in_ci() => panic!("CI=true and {test} needs prometheus, which cannot start here: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: prometheus cannot start here ({e}); under CI=true this fails");
            None
        }
    }
}
