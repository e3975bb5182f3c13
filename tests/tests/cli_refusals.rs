//! The README's secured example through the directory, as the outside user (summary-only):
//! `gma subscribe --directory` gets its summaries, and every refusal — by the producer or by
//! the directory — ends the command at once with the message and exit status 1, instead of a
//! silent wait. Each command runs under a generous deadline: one that does not exit fails the
//! test (a liveness check, not a timing threshold).

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::time::Duration;

use common::*;

/// How long a command may take before it counts as hanging.
const DEADLINE: Duration = Duration::from_secs(60);

const POLICY: &str = r#"default = "deny"
[[rule]]
org = "site1"
actions = ["*"]
effect = "allow"
[[rule]]
org = "partner"
actions = ["directory.search", "directory.watch", "producer.subscribe", "producer.query"]
resources = ["host.*"]
effect = "summary"
# dave may look producers up but not watch the directory.
[[rule]]
cn = "dave"
actions = ["directory.search", "producer.subscribe"]
resources = ["host.*"]
effect = "allow"
"#;

struct Site {
    _tmp: tempfile::TempDir,
    d: String,
    directory: Proc,
    _producer: Proc,
}

impl Site {
    fn start() -> Site {
        let tmp = tempdir();
        let d = tmp.path().to_str().unwrap().to_string();
        make_certs(
            tmp.path(),
            &["ca"],
            &[
                ("ca", "dir-1", "grid"),
                ("ca", "node-a", "site1"),
                ("ca", "alice", "site1"),
                ("ca", "bob", "partner"),
                ("ca", "dave", "elsewhere"),
            ],
        );
        std::fs::write(tmp.path().join("policy.toml"), POLICY).unwrap();
        let tls = |who: &str| {
            vec![
                "--tls-cert".to_string(),
                format!("{d}/certs/{who}.pem"),
                "--tls-key".to_string(),
                format!("{d}/certs/{who}.key"),
                "--tls-client-ca".to_string(),
                format!("{d}/ca/ca.pem"),
                "--tls-ca".to_string(),
                format!("{d}/ca/ca.pem"),
                "--access-policy".to_string(),
                format!("{d}/policy.toml"),
            ]
        };
        let mut args: Vec<String> = ["directory", "--listen", "127.0.0.1:0", "--data"]
            .map(String::from)
            .to_vec();
        args.push(format!("{d}/dir"));
        args.extend(tls("dir-1"));
        let directory = Proc::start(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            "gma directory listening on",
        );
        let sim = sim_file(tmp.path(), "h", 2, 100);
        let mut args: Vec<String> = [
            "producer",
            "--listen",
            "127.0.0.1:0",
            "--no-host-sensors",
            "--simulate",
            sim.to_str().unwrap(),
            "--directory",
            &directory.addr,
        ]
        .map(String::from)
        .to_vec();
        args.extend(tls("node-a"));
        let producer = Proc::start(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            "gma producer listening on",
        );
        let site = Site {
            _tmp: tmp,
            d,
            directory,
            _producer: producer,
        };
        // The producer is in the directory before the tests start.
        assert!(
            wait_until(Duration::from_secs(30), || {
                let r = site.run("alice", &["search", "host.*", "--output", "json"]);
                r.code == 0
                    && serde_json::from_str::<serde_json::Value>(&r.stdout)
                        .is_ok_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            }),
            "the producer did not register: {}",
            site.directory.stderr_text()
        );
        site
    }

    /// `gma ARGS --directory D` as `who`, under the deadline.
    fn run(&self, who: &str, args: &[&str]) -> Run {
        let d = &self.d;
        let (ca, cert, key) = (
            format!("{d}/ca/ca.pem"),
            format!("{d}/certs/{who}.pem"),
            format!("{d}/certs/{who}.key"),
        );
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&[
            "--directory",
            &self.directory.addr,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ]);
        gma(&all, DEADLINE)
    }
}

fn exited(r: &Run, what: &str) {
    assert_ne!(
        r.code, -9,
        "{what} did not exit within {DEADLINE:?}; stdout: {}; stderr: {}",
        r.stdout, r.stderr
    );
}

/// The README's summary example: bob gets summaries of host.load and the command ends.
#[test]
fn a_summary_subscription_through_the_directory_gets_its_summaries() {
    let s = Site::start();
    let r = s.run(
        "bob",
        &[
            "subscribe",
            "host.load",
            "--summary",
            "1m",
            "--count",
            "2",
            "--output",
            "json",
        ],
    );
    exited(&r, "bob's summary subscription");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let events = json_lines(&r.stdout);
    assert_eq!(events.len(), 2, "{}", r.stdout);
    assert!(
        events.iter().all(|v| v["name"] == "host.load.avg1m"),
        "{}",
        r.stdout
    );
}

/// The README's raw variant: the producer refuses; the command says so and exits 1.
#[test]
fn a_raw_subscription_refused_by_the_producer_ends_the_command() {
    let s = Site::start();
    let r = s.run("bob", &["subscribe", "host.load", "--count", "1"]);
    exited(&r, "bob's raw subscription");
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert!(r.stderr.contains("PermissionDenied"), "{}", r.stderr);
    assert!(
        r.stderr.contains("may receive only summaries of \"host.load\""),
        "{}",
        r.stderr
    );
}

/// The directory refuses dave's watch, or bob's search outside host.*: the command ends with
/// the directory's message.
#[test]
fn a_refusal_by_the_directory_ends_the_command() {
    let s = Site::start();
    let r = s.run("dave", &["subscribe", "host.load", "--count", "1"]);
    exited(&r, "dave's subscription");
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("may not directory.watch"), "{}", r.stderr);

    let r = s.run("bob", &["subscribe", "net.*", "--summary", "1m", "--count", "1"]);
    exited(&r, "bob's net.* subscription");
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("may not directory.search"), "{}", r.stderr);
}

/// Only UNAVAILABLE is waited for, and on a terminal the wait is visible: a producer that is
/// in the directory but down gets a "waiting for" line (run under `script`, which gives the
/// command a pseudo-terminal).
#[test]
fn a_wait_is_visible_on_a_terminal() {
    let have_script = std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        have_script,
        "this test needs `script` (util-linux) to give a command a terminal"
    );
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = sim_file(tmp.path(), "w", 1, 100);
    let mut prod = Proc::producer(&[
        "--no-host-sensors",
        "--simulate",
        sim.to_str().unwrap(),
        "--directory",
        &dir.addr,
        "--lease-ttl-ms",
        "3600000",
    ]);
    assert!(
        wait_until(Duration::from_secs(30), || search_ids(&dir.addr, "host.load")
            .is_some_and(|ids| !ids.is_empty())),
        "the producer did not register"
    );
    // Killed: its record stays in the directory (1 h lease), its port answers nothing.
    let gone = prod.addr.clone();
    prod.kill();
    let cmd = format!(
        "{} subscribe host.load --directory {} --count 1",
        gma_bin().display(),
        dir.addr
    );
    let mut script = std::process::Command::new("script");
    script.args(["-qefc", &cmd, "/dev/null"]);
    let sub = Proc::start_cmd(script, &[], "");
    assert!(
        wait_until(DEADLINE, || sub
            .stdout_lines()
            .iter()
            .any(|l| l.starts_with("waiting for") && l.contains(&gone))),
        "no waiting line on the terminal: {:?}",
        sub.stdout_lines()
    );
}
