//! Connections cannot be held hostage (issue 26, defect 5): real `gma` processes attacked
//! with many connections that never finish what they started. Slow-header HTTP connections do
//! not keep the dashboard from answering and are closed after the header timeout; TCP
//! connections that never send the HTTP/2 preface (or the TLS handshake) to a producer are
//! closed after the handshake timeout; the per-address cap closes the excess at once, leaves
//! other addresses alone and says so in the log. Every wait is on a condition with a deadline.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use common::*;

/// Generous: conditions that hold in about a second must hold within this.
const DEADLINE: Duration = Duration::from_secs(60);

/// `n` TCP connections to `addr` from the local address `from` (any 127.0.0.0/8 address is
/// this machine), each sending `first` once; non-blocking, for [`closed`].
fn open(rt: &tokio::runtime::Runtime, addr: &str, from: &str, n: usize, first: &[u8]) -> Vec<TcpStream> {
    use std::io::Write;
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let from: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
    (0..n)
        .map(|_| {
            let s = rt.block_on(async {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind(from).unwrap();
                sock.connect(addr).await.unwrap()
            });
            let mut s = s.into_std().unwrap();
            s.set_nonblocking(false).unwrap();
            if !first.is_empty() {
                s.write_all(first).unwrap();
            }
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect()
}

/// Whether the server closed `s` (end of stream or reset); reads and drops anything it sent.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

fn count_closed(conns: &mut [TcpStream]) -> usize {
    conns.iter_mut().map(|s| closed(s) as usize).sum()
}

/// Makes room for `n` more file descriptors in this process (and the roles it starts) with
/// `prlimit` when the soft limit is lower: the attack needs them on both sides.
fn ensure_files(n: u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let v: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard): (u64, u64) = (v[3].parse().unwrap(), v[4].parse().unwrap_or(u64::MAX));
    if soft >= n {
        return;
    }
    assert!(
        hard >= n,
        "this test needs {n} open files and the hard limit is {hard}: raise it (ulimit -Hn)"
    );
    let pid = std::process::id().to_string();
    let st = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={n}:{hard}")])
        .status()
        .expect("prlimit (util-linux) raises the open-file limit for this test");
    assert!(st.success(), "prlimit could not raise the open-file limit to {n}");
}

#[test]
fn slow_headers_do_not_hold_the_dashboard() {
    ensure_files(8192);
    let tmp = tempdir();
    let cfg = tmp.path().join("dash.toml");
    // Nothing listens at the directory: the page still serves (its feeds retry).
    std::fs::write(
        &cfg,
        "listen = \"127.0.0.1:0\"\ndirectory = \"127.0.0.1:1\"\n[limits]\nheader_read_timeout_ms = 3000\n",
    )
    .unwrap();
    let dash = Proc::start(
        &["dashboard", "--config", cfg.to_str().unwrap()],
        "gma dashboard listening on",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 1,000 connections that start a request and never finish its headers.
    let mut slow = open(
        &rt,
        &dash.addr,
        "127.0.0.2",
        1000,
        b"GET /api/snapshot HTTP/1.1\r\nHost: x\r\n",
    );
    // The page still answers, while they are open.
    let (code, body) = http_get(&dash.addr, "/healthz").unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
    assert!(
        count_closed(&mut slow) < slow.len(),
        "every slow connection was closed before /healthz answered: the test shows nothing"
    );
    // And the slow ones are closed (after the header timeout), every one of them.
    let mut n = 0;
    assert!(
        wait_until(DEADLINE, || {
            n = count_closed(&mut slow);
            n == slow.len()
        }),
        "{n} of {} slow-header connections closed; dashboard stderr: {}",
        slow.len(),
        dash.stderr_text()
    );
    let (code, _) = http_get(&dash.addr, "/healthz").unwrap();
    assert_eq!(code, 200);
}

/// A producer configured with `limits` (TOML lines of `[limits]`), plaintext or with TLS.
fn producer(dir: &std::path::Path, limits: &str, tls: bool) -> Proc {
    let d = dir.to_str().unwrap();
    let cfg = dir.join(format!("producer-{tls}.toml"));
    let mut text = "host_sensors = false\n".to_string();
    if tls {
        text.push_str(&format!(
            "[tls]\ncert = \"{d}/certs/node1.pem\"\nkey = \"{d}/certs/node1.key\"\n"
        ));
    }
    text.push_str(&format!("[limits]\n{limits}\n"));
    std::fs::write(&cfg, text).unwrap();
    Proc::start(
        &[
            "producer",
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        "gma producer listening on",
    )
}

/// A gRPC `Version` call to the plaintext producer at `addr` (from 127.0.0.1).
fn version(rt: &tokio::runtime::Runtime, addr: &str) -> Result<String, String> {
    use gma_proto::v1::producer_client::ProducerClient;
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        ProducerClient::new(ch)
            .version(gma_proto::v1::VersionRequest {})
            .await
            .map(|r| r.into_inner().server)
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    })
}

/// A raw connection from `from` that sends the HTTP/2 preface and an empty SETTINGS frame:
/// `true` once the server answers (it was accepted), `false` if it closes the connection
/// (refused), waiting for one or the other.
fn accepted_from(rt: &tokio::runtime::Runtime, addr: &str, from: &str) -> bool {
    let hello = [PREFACE.as_slice(), &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat();
    let mut c = open(rt, addr, from, 1, &hello);
    let mut answer = None;
    let decided = wait_until(DEADLINE, || {
        let mut buf = [0u8; 64];
        answer = match c[0].read(&mut buf) {
            Ok(0) => Some(false),
            Ok(_) => Some(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(_) => Some(false),
        };
        answer.is_some()
    });
    assert!(
        decided,
        "the server neither answered nor closed a connection from {from}"
    );
    answer.unwrap()
}

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[test]
fn connections_without_a_preface_or_handshake_are_closed() {
    ensure_files(8192);
    let tmp = tempdir();
    make_certs(tmp.path(), &["ca"], &[("ca", "node1", "site1")]);
    let limits = "handshake_timeout_ms = 2000";
    let plain = producer(tmp.path(), limits, false);
    let tls = producer(tmp.path(), limits, true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 2,000 idle TCP connections that never send the HTTP/2 preface (from two addresses, each
    // under the default per-address cap), and 200 to the TLS producer that never start the TLS
    // handshake.
    let mut idle = open(&rt, &plain.addr, "127.0.0.2", 1000, b"");
    idle.extend(open(&rt, &plain.addr, "127.0.0.4", 1000, b""));
    let mut idle_tls = open(&rt, &tls.addr, "127.0.0.2", 200, b"");
    // A client that starts the preface and stops half way.
    let mut half = open(&rt, &plain.addr, "127.0.0.3", 1, b"PRI * HTTP/2.0\r\n");
    // The producer answers meanwhile.
    let v = version(&rt, &plain.addr);
    assert!(v.is_ok(), "{v:?}");
    let mut n = 0;
    assert!(
        wait_until(DEADLINE, || {
            n = count_closed(&mut idle) + count_closed(&mut idle_tls) + count_closed(&mut half);
            n == 2201
        }),
        "{n} of 2201 idle connections closed; producer stderr: {}",
        plain.stderr_text()
    );
    let v = version(&rt, &plain.addr);
    assert!(v.is_ok(), "{v:?}");
    // Not a preface at all: closed at once (no need to wait for the timeout).
    let mut http1 = open(&rt, &plain.addr, "127.0.0.3", 1, b"GET / HTTP/1.1\r\n\r\n");
    assert!(wait_until(DEADLINE, || closed(&mut http1[0])));
}

#[test]
fn the_per_address_cap_closes_the_excess() {
    ensure_files(8192);
    let tmp = tempdir();
    // Idle connections are kept long enough for the test to count them.
    let p = producer(
        tmp.path(),
        "max_connections_per_address = 20\nhandshake_timeout_ms = 120000",
        false,
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut conns = open(&rt, &p.addr, "127.0.0.2", 30, b"");
    let mut n = 0;
    assert!(
        wait_until(DEADLINE, || {
            n = count_closed(&mut conns);
            n >= 10
        }),
        "{n} of the 10 connections over the cap closed; producer stderr: {}",
        p.stderr_text()
    );
    assert_eq!(n, 10, "exactly the excess is closed");
    // The address at its cap gets no more; another address is served.
    assert!(
        !accepted_from(&rt, &p.addr, "127.0.0.2"),
        "a 21st connection from 127.0.0.2"
    );
    assert!(accepted_from(&rt, &p.addr, "127.0.0.3"), "127.0.0.3 was refused");
    assert_eq!(count_closed(&mut conns), 10, "the 20 under the cap stay open");
    let log = p.stderr_text();
    assert!(log.contains("closed a new connection from 127.0.0.2"), "{log}");
    assert!(log.contains("max_connections_per_address = 20"), "{log}");
    // Closing some frees their places.
    conns.truncate(5);
    assert!(
        wait_until(DEADLINE, || accepted_from(&rt, &p.addr, "127.0.0.2")),
        "no place freed after closing 25 connections from 127.0.0.2"
    );
}
