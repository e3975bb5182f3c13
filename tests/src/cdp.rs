//! A small Chrome DevTools Protocol client for browser tests: starts headless Chromium (Debian's
//! `chromium`, installed by `scripts/test.sh`), opens one page over the browser's websocket
//! (flat sessions), evaluates JavaScript and takes screenshots. Blocking, with deadlines.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

/// Where Debian installs Chromium; `GMA_CHROMIUM` overrides.
pub fn chromium_path() -> String {
    std::env::var("GMA_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

pub struct Chrome {
    child: Child,
    ws: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Chrome {
    /// Starts headless Chromium with nothing allowed beyond loopback and attaches to a new
    /// blank page. Panics with what to do when Chromium is missing.
    pub fn launch() -> Chrome {
        let bin = chromium_path();
        assert!(
            Path::new(&bin).exists(),
            "Chromium is not installed at {bin}: run ./scripts/test.sh (it installs Debian's chromium \
             package when missing), or `apt-get install chromium`, or set GMA_CHROMIUM"
        );
        let profile = tempfile::Builder::new()
            .prefix("gma-chromium-")
            .tempdir()
            .unwrap();
        let mut child = Command::new(&bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-default-apps",
                "--disable-extensions",
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--window-size=1400,1800",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID" on stderr.
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{bin} did not print its DevTools address within 60 s"));
        let hostport = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let stream = TcpStream::connect(&hostport).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (ws, _) = tungstenite::client(url.as_str(), stream).expect("devtools websocket");
        let mut c = Chrome {
            child,
            ws,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = c.call_browser("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = c.call_browser(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        c.session = attached["sessionId"].as_str().unwrap().to_string();
        c.call("Page.enable", json!({}));
        c.call("Runtime.enable", json!({}));
        c
    }

    fn send(&mut self, method: &str, params: Value, session: bool) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if session {
            msg["sessionId"] = json!(self.session);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .expect("devtools send");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "no answer to {method} within 60 s");
            let m = match self.ws.read() {
                Ok(Message::Text(t)) => t,
                Ok(_) => continue,
                Err(e) => panic!("devtools read ({method}): {e}"),
            };
            let v: Value = serde_json::from_str(m.as_str()).unwrap();
            if v["id"].as_u64() == Some(id) {
                if let Some(err) = v.get("error") {
                    panic!("{method} failed: {err}");
                }
                return v["result"].clone();
            }
            // Events (and answers to nothing we wait for) are skipped.
        }
    }

    fn call_browser(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, false)
    }

    /// A command to the page's session.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, true)
    }

    pub fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url}));
        assert!(r.get("errorText").is_none(), "navigate {url}: {r}");
    }

    /// Evaluates `expr` in the page and returns its value (JSON); `None` on a thrown exception
    /// (e.g. the page is still loading).
    pub fn eval(&mut self, expr: &str) -> Option<Value> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        if r.get("exceptionDetails").is_some() {
            return None;
        }
        Some(r["result"]["value"].clone())
    }

    /// A PNG of the whole page.
    pub fn screenshot(&mut self, path: &Path) {
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        let data = base64_decode(r["data"].as_str().expect("screenshot data"));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, data).unwrap();
    }
}

impl Drop for Chrome {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (with padding), as DevTools sends screenshots.
pub fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let Some(v) = val(c) else { continue };
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
