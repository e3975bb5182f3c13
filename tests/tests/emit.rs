//! `gma emit` against a real producer: inferred schemas, fields by name, precise refusals,
//! batches from standard input, and the events visible to `gma query`.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(10);

fn emit(addr: &str, args: &[&str]) -> Run {
    let mut all = vec!["emit", "--producer", addr, "--source", "w1"];
    all.extend_from_slice(args);
    gma(&all, T)
}

fn seq_of(r: &Run) -> u64 {
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    let s = r.stdout.trim();
    s.strip_prefix("seq ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("want `seq N`, got {s:?}"))
}

fn one_error_line(r: &Run) -> String {
    assert_eq!(
        r.code, 1,
        "expected exit 1; stdout {} stderr {}",
        r.stdout, r.stderr
    );
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one line, got: {}", r.stderr);
    lines[0].to_string()
}

/// The latest event of `name` from the producer, as JSON.
fn latest(addr: &str, name: &str) -> serde_json::Value {
    let r = gma(&["query", name, "--producer", addr, "--output", "json"], T);
    assert_eq!(r.code, 0, "query {name}: {}", r.stderr);
    let mut events = json_lines(&r.stdout);
    assert_eq!(events.len(), 1, "{}", r.stdout);
    events.remove(0)
}

#[test]
fn emit_infers_schema_goes_by_name_and_refuses_precisely() {
    let prod = Proc::producer(&["--no-host-sensors"]);
    let a = prod.addr.as_str();

    let s1 = seq_of(&emit(a, &["app.jobs", "queued=3", "state=busy"]));
    // Another order, a text value that looks like a number, an explicit time.
    let s2 = seq_of(&emit(
        a,
        &[
            "app.jobs",
            "state=42",
            "queued=5",
            "--time",
            "2023-11-14T22:13:20Z",
        ],
    ));
    assert!(s2 > s1, "{s1} then {s2}");
    let e = latest(a, "app.jobs");
    assert_eq!(e["source"], "w1");
    assert_eq!(e["seq"], s2);
    assert_eq!(e["timestamp_ns"], 1_700_000_000_000_000_000u64);
    assert_eq!(e["values"], serde_json::json!({"queued": 5, "state": "42"}));

    let l = one_error_line(&emit(a, &["app.jobs", "queued=1", "state=x", "colour=red"]));
    assert_eq!(
        l,
        "error: event app.jobs: unknown field(s) colour (schema version 1 has fields queued, state)"
    );
    let l = one_error_line(&emit(a, &["app.jobs", "state=x"]));
    assert_eq!(
        l,
        "error: event app.jobs: missing field(s) queued (schema version 1 has fields queued, state; \
         or allow missing fields)"
    );
    let l = one_error_line(&emit(a, &["app.jobs", "queued=many", "state=x"]));
    assert_eq!(
        l,
        "error: event app.jobs: field queued is a number (DOUBLE) but \"many\" is not a number"
    );
    let l = one_error_line(&emit(a, &["app.jobs", "queued"]));
    assert!(l.contains("expected field=value"), "{l}");
    let l = one_error_line(&emit(a, &["app.jobs", "queued=1", "--time", "yesterday"]));
    assert!(l.contains("--time \"yesterday\""), "{l}");
    // Nothing of the refused events reached the producer.
    assert_eq!(latest(a, "app.jobs")["seq"], s2);

    // Refused locally, before the inferred schema could be registered: the next event of the
    // name defines it afresh.
    let l = one_error_line(&gma(
        &[
            "emit",
            "app.fresh",
            "a=1",
            "--producer",
            a,
            "--source",
            "bad source",
        ],
        T,
    ));
    assert!(
        l.starts_with("error: event app.fresh: invalid source \"bad source\""),
        "{l}"
    );
    seq_of(&emit(a, &["app.fresh", "a=1", "b=x"]));

    let s3 = seq_of(&emit(a, &["app.jobs", "state=x", "--allow-missing"]));
    let e = latest(a, "app.jobs");
    assert_eq!(e["seq"], s3);
    assert_eq!(e["values"], serde_json::json!({"queued": null, "state": "x"}));
}

#[test]
fn emit_stdin_sends_lines_in_batches() {
    let prod = Proc::producer(&["--no-host-sensors"]);
    let mut child = Command::new(gma_bin())
        .args(["emit", "--stdin", "--producer", &prod.addr, "--source", "w2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"app.temp celsius=20 room=a\n\n# a comment\napp.temp room=a celsius=21.5\n\
              app.jobs queued=7 state:s=done\n",
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("sent 3 events (last seq "), "{stdout}");

    let t = latest(&prod.addr, "app.temp");
    assert_eq!(t["source"], "w2");
    assert_eq!(t["values"], serde_json::json!({"celsius": 21.5, "room": "a"}));
    let j = latest(&prod.addr, "app.jobs");
    assert_eq!(j["values"], serde_json::json!({"queued": 7, "state": "done"}));
    let last: u64 = stdout
        .trim()
        .trim_start_matches("sent 3 events (last seq ")
        .trim_end_matches(')')
        .parse()
        .unwrap();
    assert_eq!(j["seq"], last);
}
