//! The security-event sensor with a real producer (issue 24, item 4): a producer follows a
//! temporary auth log (`auth_log`; this test host runs no journal), records appended to it
//! arrive at `gma subscribe host.auth` one event each, in order, with nothing secret in them;
//! records of other programs are not events; a rotated log is followed.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::io::Write;
use std::time::Duration;

use common::*;

fn append(path: &std::path::Path, text: &str) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

#[test]
fn auth_log_records_arrive_as_host_auth_events_with_nothing_secret() {
    let tmp = tempdir();
    let log = tmp.path().join("auth.log");
    // What was logged before the agent started is not reported.
    std::fs::write(
        &log,
        "2026-11-26T20:00:00.000000+00:00 vm sshd[9]: Accepted password for old from 10.0.0.9 port 1 ssh2\n",
    )
    .unwrap();
    let cfg = tmp.path().join("producer.toml");
    std::fs::write(
        &cfg,
        format!(
            "auth_log = \"{}\"\nbatch = false\nbench = false\npackages = []\n",
            log.display()
        ),
    )
    .unwrap();
    let prod = Proc::producer(&["--source", "authhost", "--config", cfg.to_str().unwrap()]);
    let sub = Proc::start(
        &[
            "subscribe",
            "host.auth",
            "--producer",
            &prod.addr,
            "--output",
            "json",
        ],
        "",
    );
    let events = |sub: &Proc| json_lines(&sub.stdout_lines().join("\n"));
    let is_marker = |e: &serde_json::Value| e["values"]["user"] == "marker";
    // The sensor starts at the file's end: marker logins are appended until one arrives, so
    // the records below are certainly new to it.
    let marker = "Nov 26 22:00:00 vm sshd[10]: Accepted publickey for marker from 10.0.0.1 port 1 ssh2\n";
    assert!(
        wait_until(Duration::from_secs(30), || {
            append(&log, marker);
            events(&sub).iter().any(is_marker)
        }),
        "no host.auth event; producer stderr: {}",
        prod.stderr_text()
    );
    let records = "\
Nov 26 22:01:00 vm sshd[11]: Failed password for invalid user admin from 203.0.113.9 port 4242 ssh2
Nov 26 22:01:01 vm kernel: [  1.0] something else entirely
Nov 26 22:01:02 vm sudo:      bob : TTY=pts/0 ; PWD=/home/bob ; USER=root ; COMMAND=/usr/bin/mysql -pTOPSECRET
Nov 26 22:01:03 vm passwd[12]: pam_unix(passwd:chauthtok): password changed for carol
";
    append(&log, records);
    // Rotated: a new file in its place, followed from its start.
    std::fs::rename(&log, tmp.path().join("auth.log.1")).unwrap();
    std::fs::write(
        &log,
        "Nov 26 22:02:00 vm sshd[13]: pam_unix(sshd:session): session closed for user alice\n",
    )
    .unwrap();
    let want = [
        ("auth_failure", "admin", "sshd", "203.0.113.9", "password"),
        ("sudo", "bob", "sudo", "", "root /usr/bin/mysql"),
        ("password_change", "carol", "passwd", "", ""),
        ("logout", "alice", "sshd", "", ""),
    ];
    let rest = |sub: &Proc| -> Vec<(String, String, String, String, String)> {
        let all = events(sub);
        // Markers first (those appended after the sensor started), then the records in order.
        let markers = all.iter().take_while(|e| is_marker(e)).count();
        all[markers..]
            .iter()
            .map(|e| {
                let v = &e["values"];
                let s = |k: &str| v[k].as_str().unwrap_or("?").to_string();
                (s("kind"), s("user"), s("service"), s("remote"), s("detail"))
            })
            .collect()
    };
    let mut got = Vec::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            got = rest(&sub);
            got.len() >= want.len()
        }),
        "events after the markers: {got:?}; producer stderr: {}",
        prod.stderr_text()
    );
    let got: Vec<(&str, &str, &str, &str, &str)> = got
        .iter()
        .map(|g| {
            (
                g.0.as_str(),
                g.1.as_str(),
                g.2.as_str(),
                g.3.as_str(),
                g.4.as_str(),
            )
        })
        .collect();
    assert_eq!(got, want);
    let all = events(&sub);
    assert!(all.iter().all(|e| e["source"] == "authhost"), "{all:?}");
    let text = sub.stdout_lines().join("\n");
    assert!(!text.contains("TOPSECRET") && !text.contains("\"old\""), "{text}");
}
