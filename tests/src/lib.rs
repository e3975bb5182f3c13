//! The test kit of the end-to-end tests (`tests/tests/*.rs`): start real `gma` processes on
//! 127.0.0.1 (port 0), wait on conditions with deadlines (never fixed sleeps as
//! synchronization), run CLI commands; certificates and HTTPS clients ([`secure`]), network
//! namespaces ([`netns`]), a headless browser ([`cdp`]) and a linearizability checker
//! ([`linearizable`]).
// A test kit: a set-up step that fails is a failed test, so unwrap is the right answer here.
#![allow(clippy::unwrap_used)]

pub mod cdp;
pub mod census;
pub mod directory;
pub mod fedsite;
pub mod linearizable;
pub mod netns;
pub mod prometheus;
pub mod python;
pub mod secure;
pub mod slurm;
pub mod slurm_fabric;
pub mod snmpd;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `gma` command under test: this package's `gma-e2e` binary (tests/Cargo.toml), which
/// cargo builds next to the test executables (`target/<profile>/`; tests run from
/// `target/<profile>/deps/`).
pub fn gma_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executables live in target/<profile>/deps");
    let bin = profile_dir.join(format!("gma-e2e{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run the tests through cargo (cargo test -p gma-tests), which builds it",
        bin.display()
    );
    bin
}

/// The agent-only executable `gma-agent` (gma-producer's bin), next to `gma-e2e`. A test run
/// does not build it (it is not a bin of this package): scripts/test.sh builds it first; by hand,
/// `cargo build -p gma-producer --bin gma-agent`.
pub fn agent_bin() -> PathBuf {
    let bin = gma_bin().with_file_name(format!("gma-agent{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: build it with cargo build -p gma-producer --bin gma-agent (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// Polls `pred` every 20 ms until it holds or `timeout` passes.
pub use gma_core::time::wait_until;

/// A port of 127.0.0.1 for a child process that must be told its address before it binds (a
/// directory member and its peers, Prometheus, snmpd, the installed units): reserved outside the
/// kernel's ephemeral range and kept from every other test until this test process ends (see
/// [`gma_core::addr::reserve_port`]). A port found free by binding port 0 could be taken by
/// another test's connection before the child bound it.
pub fn reserved_port() -> u16 {
    static HELD: Mutex<Vec<gma_core::addr::PortLease>> = Mutex::new(Vec::new());
    let lease = gma_core::addr::reserve_port().unwrap_or_else(|e| panic!("no port for a child process: {e}"));
    let port = lease.port();
    HELD.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(lease);
    port
}

/// `127.0.0.1:` and a [`reserved_port`].
pub fn reserved_addr() -> String {
    format!("127.0.0.1:{}", reserved_port())
}

/// Polls `attempt` every 20 ms until it answers `Ok(value)` and returns the value; after
/// `timeout` the test fails naming `what` and the last `Err` (the diagnostic). The one async
/// wait of the kit: a hand-written polling loop in a test should be this (or [`poll_for`]
/// where a timeout is a finding to collect, not a panic).
pub async fn wait_for<T, E, F, Fut>(what: &str, timeout: Duration, attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    match poll_for(timeout, attempt).await {
        Ok(v) => v,
        Err(e) => panic!("timed out after {timeout:?} waiting for {what}; last: {e}"),
    }
}

/// A plaintext gRPC channel to `addr` (`host:port`), once it accepts connections: an endpoint
/// serves once its listener task runs, so this polls, within 30 s.
pub async fn connected(addr: impl std::fmt::Display) -> tonic::transport::Channel {
    let url = format!("http://{addr}");
    wait_for("the endpoint to serve", Duration::from_secs(30), || {
        let url = url.clone();
        async move { tonic::transport::Endpoint::from_shared(url)?.connect().await }
    })
    .await
}

/// [`wait_for`] without the panic: the value, or the last `Err` once `timeout` passed.
pub async fn poll_for<T, E, F, Fut>(timeout: Duration, mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// A running `gma` process; killed (SIGKILL) on drop.
pub struct Proc {
    pub child: Child,
    pub addr: String,
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// Starts `gma args...` and waits until it prints "<marker> <addr>" on stderr.
    pub fn start(args: &[&str], marker: &str) -> Proc {
        Proc::start_cmd(Command::new(gma_bin()), args, marker)
    }

    /// Like [`Proc::start`] with another launcher in front of the arguments (e.g.
    /// `ip netns exec NS gma`); the launcher must exec, so the child is the process itself.
    pub fn start_cmd(mut cmd: Command, args: &[&str], marker: &str) -> Proc {
        let mut child = cmd
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gma");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        {
            let stdout = stdout.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    stdout.lock().unwrap().push(line);
                }
            });
        }
        {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    stderr.lock().unwrap().push(line);
                }
            });
        }
        let mut p = Proc {
            child,
            addr: String::new(),
            stdout,
            stderr,
        };
        if !marker.is_empty() {
            let prefix = format!("{marker} ");
            let ok = wait_until(Duration::from_secs(30), || {
                let lines = p.stderr.lock().unwrap();
                lines.iter().any(|l| l.starts_with(&prefix))
            });
            let lines = p.stderr.lock().unwrap().clone();
            assert!(ok, "gma {args:?} did not print {marker:?}; stderr: {lines:#?}");
            let line = lines.iter().find(|l| l.starts_with(&prefix)).unwrap();
            p.addr = line[prefix.len()..].trim().to_string();
        }
        p
    }

    pub fn directory(data: &Path, listen: &str) -> Proc {
        Proc::start(
            &["directory", "--listen", listen, "--data", data.to_str().unwrap()],
            "gma directory listening on",
        )
    }

    pub fn producer(extra: &[&str]) -> Proc {
        let mut args = vec!["producer", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Proc::start(&args, "gma producer listening on")
    }

    /// `gma-agent --listen 127.0.0.1:0 extra...` (the agent-only executable, [`agent_bin`]).
    pub fn agent(extra: &[&str]) -> Proc {
        let mut args = vec!["--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Proc::start_cmd(Command::new(agent_bin()), &args, "gma producer listening on")
    }

    /// `gma archiver` on port 0, following the producers of `directory`, storing in `data`;
    /// `extra` are more flags (`--pattern app.*`).
    pub fn archiver(directory: &str, data: &Path, extra: &[&str]) -> Proc {
        let mut args = vec![
            "archiver",
            "--listen",
            "127.0.0.1:0",
            "--directory",
            directory,
            "--data",
            data.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Proc::start(&args, "gma archiver listening on")
    }

    /// A producer of the simulated hosts in `sim` (no host sensors), registered in
    /// `directory`; `extra` are more flags.
    pub fn simulated(directory: &str, sim: &Path, extra: &[&str]) -> Proc {
        let mut args = vec![
            "--directory",
            directory,
            "--no-host-sensors",
            "--simulate",
            sim.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Proc::producer(&args)
    }

    /// `gma ROLE --listen 127.0.0.1:0 --directory DIRECTORY --config CONFIG`, waiting for
    /// `gma ROLE listening on` (broker, federation, rescheduler, slurm).
    pub fn role(role: &str, directory: &str, config: &Path) -> Proc {
        Proc::start(
            &[
                role,
                "--listen",
                "127.0.0.1:0",
                "--directory",
                directory,
                "--config",
                config.to_str().unwrap(),
            ],
            &format!("gma {role} listening on"),
        )
    }

    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Result of a finished CLI command.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `gma args...` to completion (killed after `timeout`).
pub fn gma(args: &[&str], timeout: Duration) -> Run {
    let mut child = Command::new(gma_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gma");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let code = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break s.code().unwrap_or(-1);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break -9;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run {
        code,
        stdout: o.join().unwrap(),
        stderr: e.join().unwrap(),
    }
}

/// Parses JSON lines.
pub fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad json line {l:?}: {e}")))
        .collect()
}

/// Producer ids listed by `gma search PATTERN --output json`.
pub fn search_ids(dir: &str, pattern: &str) -> Option<Vec<(String, String)>> {
    let r = gma(
        &["search", pattern, "--directory", dir, "--output", "json"],
        Duration::from_secs(10),
    );
    if r.code != 0 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&r.stdout).ok()?;
    Some(
        v.as_array()?
            .iter()
            .map(|p| {
                (
                    p["id"].as_str().unwrap_or("").to_string(),
                    p["address"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect(),
    )
}

/// A gRPC channel to `addr` over mTLS, trusting `certs`' CA and presenting `who`'s
/// certificate (the layout [`make_certs`] writes: `ca/ca.pem`, `certs/WHO.pem`, `certs/WHO.key`).
pub async fn mtls_channel(certs: &Path, addr: &str, who: &str) -> tonic::transport::Channel {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let pem = |p: &str| std::fs::read(certs.join(p)).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem("ca/ca.pem")))
        .domain_name("127.0.0.1")
        .identity(Identity::from_pem(
            pem(&format!("certs/{who}.pem")),
            pem(&format!("certs/{who}.key")),
        ));
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// `gma federation add` in the directory at `directory`: the site `site` at `endpoint`, with
/// `--role ROLE` when given (parent, child). Panics with its stderr when it fails.
pub fn federation_add(directory: &str, site: &str, endpoint: &str, role: Option<&str>) {
    let mut args = vec![
        "federation",
        "add",
        "--directory",
        directory,
        "--site",
        site,
        "--endpoint",
        endpoint,
    ];
    if let Some(role) = role {
        args.extend_from_slice(&["--role", role]);
    }
    let r = gma(&args, Duration::from_secs(30));
    assert_eq!(r.code, 0, "{}", r.stderr);
}

/// `gma federation status --output json` of the federation endpoint at `fed`; the error is
/// the command's stderr, or why its output is not JSON.
pub fn federation_status(fed: &str) -> Result<serde_json::Value, String> {
    let r = gma(
        &["federation", "status", "--federation", fed, "--output", "json"],
        Duration::from_secs(30),
    );
    if r.code != 0 {
        return Err(r.stderr);
    }
    serde_json::from_str(&r.stdout).map_err(|e| format!("{e}: {}", r.stdout))
}

/// `gma job list --output json` of the federation endpoint at `fed`, by job id. Panics with
/// the command's stderr when it fails.
pub fn federation_jobs(fed: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let r = gma(
        &["job", "list", "--federation", fed, "--output", "json"],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("gma job list prints JSON");
    v.as_array()
        .expect("gma job list prints an array")
        .iter()
        .map(|j| (j["id"].as_str().unwrap_or_default().to_string(), j.clone()))
        .collect()
}

/// `gma broker select --job JOB --broker BROKER --output json`, run to completion.
pub fn broker_select(broker: &str, job: &Path) -> Run {
    gma(
        &[
            "broker",
            "select",
            "--job",
            job.to_str().expect("a UTF-8 job path"),
            "--broker",
            broker,
            "--output",
            "json",
        ],
        Duration::from_secs(30),
    )
}

/// Starts `gma simres` on a free port with `config_text` (written to `dir/<name>.toml`) and
/// `extra` arguments (e.g. `--directory D`).
pub fn start_simres(dir: &Path, name: &str, config_text: &str, extra: &[&str]) -> Proc {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, config_text).unwrap();
    let mut args = vec![
        "simres",
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Proc::start(&args, "gma simres listening on")
}

/// The reservations `gma simres list` shows at `manager` for `owner` ("" = every owner).
pub fn simres_reservations(manager: &str, owner: &str) -> Vec<serde_json::Value> {
    let r = gma(
        &[
            "simres",
            "list",
            "--manager",
            manager,
            "--owner",
            owner,
            "--output",
            "json",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v.as_array().unwrap().clone()
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("gma-test-").tempdir().unwrap()
}

/// A development PKI made with the real `gma certs`: one CA per name in `cas`
/// (DIR/<ca>/ca.pem, ca.key) and one leaf per `(ca, name, org)` (DIR/certs/<name>.pem, .key).
pub fn make_certs(dir: &Path, cas: &[&str], leaves: &[(&str, &str, &str)]) {
    let d = dir.to_str().expect("utf-8 temp dir");
    for ca in cas {
        let r = gma(
            &["certs", "init", "--out", &format!("{d}/{ca}")],
            Duration::from_secs(20),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    for (ca, name, org) in leaves {
        let (ca_dir, out) = (format!("{d}/{ca}"), format!("{d}/certs"));
        let args = [
            "certs", "issue", "--ca", &ca_dir, "--name", name, "--org", org, "--out", &out,
        ];
        let r = gma(&args, Duration::from_secs(20));
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
}

/// Pushes `events` (with `schema`) into the producer at `producer` through `Ingest/Push`, in
/// one request; the number accepted.
pub fn push_events(
    producer: &str,
    schema: gma_proto::v1::EventSchema,
    events: Vec<gma_proto::v1::Event>,
) -> u32 {
    use gma_proto::v1 as pb;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ch = gma_consumer::connect(producer).await.unwrap();
        let mut c = pb::ingest_client::IngestClient::new(ch);
        c.push(pb::IngestRequest {
            events,
            schemas: vec![schema],
        })
        .await
        .unwrap()
        .into_inner()
        .accepted
    })
}

/// `gma archive ARGS --archiver ADDR` (query, series, export, stats), at most 30 s.
pub fn archive(args: &[&str], archiver: &str) -> Run {
    let mut a = vec!["archive"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--archiver", archiver]);
    gma(&a, Duration::from_secs(30))
}

/// The address a role printed as `gma <role> <what> on ADDR` on stderr (e.g. `metrics`,
/// `prometheus`), waiting for it.
pub fn printed_addr(p: &Proc, role: &str, what: &str) -> String {
    let prefix = format!("gma {role} {what} on ");
    let mut found = None;
    let ok = wait_until(Duration::from_secs(30), || {
        found = p
            .stderr
            .lock()
            .unwrap()
            .iter()
            .find_map(|l| l.strip_prefix(&prefix).map(|a| a.trim().to_string()));
        found.is_some()
    });
    assert!(ok, "{role} did not print {prefix:?}; stderr: {}", p.stderr_text());
    found.unwrap()
}

/// `GET path` over HTTP/1.1 on `addr` (one connection, `Connection: close`): (status, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header end"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status"))?;
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Ok((status, dechunk(body)));
    }
    Ok((status, body.to_string()))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A simulation file for `gma producer --simulate`: `hosts` hosts named `<prefix>NN` whose
/// load walks (so their charts move), sampled every `period_ms`.
pub fn sim_file(dir: &Path, prefix: &str, hosts: usize, period_ms: u64) -> PathBuf {
    let mut text = format!("period_ms = {period_ms}\n");
    for i in 0..hosts {
        text.push_str(&format!(
            "[[host]]\nname = \"{prefix}{i:02}\"\ncpus = 8\nmemory_mb = 4096\nwalk = {{ min = 0.5, max = 7.0, step = 0.5, seed = {} }}\n",
            i + 1
        ));
    }
    let path = dir.join(format!("{prefix}sim.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Pushes `items` (timestamp ns, value) to the producer at `producer` as events `name` of
/// source `source` with one double field `v` (schema version 1).
pub fn push_numbers(producer: &str, name: &str, source: &str, items: &[(i64, f64)]) {
    use gma_proto::v1 as pb;
    let schema = pb::EventSchema {
        name: name.into(),
        version: 1,
        fields: vec![gma_core::event::dbl("v", "", "")],
        description: String::new(),
    };
    let events = items
        .iter()
        .map(|(ts, v)| pb::Event {
            name: name.into(),
            source: source.into(),
            timestamp_ns: *ts,
            seq: 0,
            values: vec![pb::Value {
                kind: Some(pb::value::Kind::Number(*v)),
            }],
        })
        .collect();
    push_events(producer, schema, events);
}
