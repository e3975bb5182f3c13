//! Action monitors with real processes: a directory, producers (a supervised process, simulated
//! hosts) and `gma monitor` running commands when its rules hold.

#![allow(clippy::unwrap_used)]

use gma_tests as common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// The monitor's log filter: its decisions are logged at debug/info.
const LOG: &str = "warn,gma_monitor=debug";

/// Removes ANSI colour sequences from a log line.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn logs(p: &Proc) -> Vec<String> {
    p.stderr.lock().unwrap().iter().map(|l| strip_ansi(l)).collect()
}

fn count_logs(p: &Proc, needle: &str) -> usize {
    logs(p).iter().filter(|l| l.contains(needle)).count()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The monitor.firing JSON lines the monitor printed.
fn firings(p: &Proc) -> Vec<serde_json::Value> {
    p.stdout_lines()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["name"] == "monitor.firing")
        .collect()
}

fn start_monitor(dir: &str, config: &Path) -> Proc {
    Proc::start(
        &[
            "--log",
            LOG,
            "monitor",
            "--config",
            config.to_str().unwrap(),
            "--directory",
            dir,
            "--listen",
            "127.0.0.1:0",
        ],
        "gma monitor listening on",
    )
}

/// The latest `proc.event` of the producer, if any.
fn latest_proc_event(prod: &str) -> Option<serde_json::Value> {
    let r = gma(
        &["query", "proc.event", "--producer", prod, "--output", "json"],
        Duration::from_secs(10),
    );
    if r.code != 0 {
        return None;
    }
    json_lines(&r.stdout).pop()
}

/// Waits for the latest proc.event to be the victim's `start` with a pid other than `not`.
fn wait_start(prod: &str, not: Option<u64>) -> u64 {
    let mut pid = None;
    let ok = wait_until(Duration::from_secs(10), || {
        let Some(e) = latest_proc_event(prod) else {
            return false;
        };
        let v = &e["values"];
        if v["watch"] == "victim" && v["kind"] == "start" {
            let p = v["pid"].as_f64().unwrap_or(0.0) as u64;
            if p > 0 && Some(p) != not {
                pid = Some(p);
                return true;
            }
        }
        false
    });
    assert!(
        ok,
        "no start event of the victim (last: {:?})",
        latest_proc_event(prod)
    );
    pid.unwrap()
}

fn kill9(pid: u64) {
    let st = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -9 {pid}");
}

/// Kills `pid` if it is still one of our `sleep 300`s (cleanup; never fails).
fn reap(pid: u64) {
    if std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"sleep\x00300\x00") {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
}

#[test]
fn restart_rule_fires_once_when_the_supervised_process_is_killed() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let pcfg = tmp.path().join("producer.toml");
    std::fs::write(
        &pcfg,
        "period_ms = 200\n[[process]]\nname = \"victim\"\ncommand = [\"sleep\", \"300\"]\nrestart = true\n",
    )
    .unwrap();
    let mut prod = Proc::producer(&[
        "--config",
        pcfg.to_str().unwrap(),
        "--directory",
        &dir.addr,
        "--no-host-sensors",
        "--source",
        "node1",
    ]);
    let first = wait_start(&prod.addr, None);

    let marker = tmp.path().join("fired");
    let mcfg = tmp.path().join("monitor.toml");
    std::fs::write(
        &mcfg,
        format!(
            "source = \"ops\"\n[[rule]]\nname = \"restart-victim\"\nevents = [\"proc.event\"]\n\
             when = 'watch == \"victim\" and kind == \"abnormal_exit\"'\n\
             command = [\"sh\", \"-c\", \"echo fired >> {}\"]\nhold_down_ms = 60000\n",
            marker.display()
        ),
    )
    .unwrap();
    let mon = start_monitor(&dir.addr, &mcfg);
    // The monitor follows the producer before the victim dies.
    assert!(
        wait_until(Duration::from_secs(10), || count_logs(
            &mon,
            "rule restart-victim: subscribed to producer"
        ) > 0),
        "monitor never subscribed: {}",
        mon.stderr_text()
    );

    kill9(first);
    assert!(
        wait_until(Duration::from_secs(10), || !lines(&marker).is_empty()),
        "the rule did not run its command; monitor log:\n{}",
        mon.stderr_text()
    );
    assert!(wait_until(Duration::from_secs(10), || !firings(&mon).is_empty()));
    let f = &firings(&mon)[0];
    let v = &f["values"];
    assert_eq!(f["source"], "ops", "{f}");
    assert_eq!(v["rule"], "restart-victim", "{f}");
    assert_eq!(v["key"], "node1", "{f}");
    assert_eq!(v["outcome"], "ok", "{f}");
    assert_eq!(v["exit_status"], 0.0, "{f}");
    assert_eq!(v["suppressed"], 0.0, "{f}");

    // Later events: the supervisor restarts the victim (a `start`: the condition leaves), and
    // it dies again within the hold-down (enters again): no second firing.
    let second = wait_start(&prod.addr, Some(first));
    assert!(
        wait_until(Duration::from_secs(10), || logs(&mon)
            .iter()
            .any(|l| l.contains("proc.event from node1") && l.contains("(leave)"))),
        "the monitor never saw the restart; log:\n{}",
        mon.stderr_text()
    );
    kill9(second);
    assert!(
        wait_until(Duration::from_secs(10), || count_logs(
            &mon,
            "rule restart-victim: proc.event from node1 entered; no firing"
        ) == 1),
        "the second death was not seen; log:\n{}",
        mon.stderr_text()
    );
    let third = wait_start(&prod.addr, Some(second));
    assert_eq!(
        count_logs(&mon, "rule restart-victim fires"),
        1,
        "{}",
        mon.stderr_text()
    );
    assert_eq!(lines(&marker), vec!["fired".to_string()]);
    assert_eq!(firings(&mon).len(), 1, "{:?}", mon.stdout_lines());

    // The firing is an event of the monitor's own producer, found through the directory.
    let r = gma(
        &[
            "subscribe",
            "monitor.firing",
            "--directory",
            &dir.addr,
            "--count",
            "1",
            "--output",
            "json",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 0, "stderr: {}", r.stderr);
    let seen = json_lines(&r.stdout);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["values"]["rule"], "restart-victim");
    assert_eq!(seen[0]["values"]["outcome"], "ok");

    prod.terminate();
    for pid in [first, second, third] {
        reap(pid);
    }
}

#[test]
fn all_of_rule_pages_once_when_both_hosts_are_down() {
    let tmp = tempdir();
    let dir = Proc::directory(&tmp.path().join("dir"), "127.0.0.1:0");
    let sim = tmp.path().join("sim.toml");
    std::fs::write(
        &sim,
        "period_ms = 100\n\
         [[host]]\nname = \"db-primary\"\ncpus = 4\nmemory_mb = 1024\nload = 0.5\n\
         [[host]]\nname = \"db-backup\"\ncpus = 4\nmemory_mb = 1024\nload = 0.5\n",
    )
    .unwrap();
    let prod = Proc::producer(&[
        "--directory",
        &dir.addr,
        "--no-host-sensors",
        "--source",
        "simulator",
        "--simulate",
        sim.to_str().unwrap(),
    ]);
    let marker = tmp.path().join("paged");
    let mcfg = tmp.path().join("monitor.toml");
    std::fs::write(
        &mcfg,
        format!(
            "source = \"ops\"\n\
             [[rule]]\nname = \"page-db\"\nevents = [\"host.load\"]\nwhen = 'free_cpus == 0'\n\
             all_of = [\"db-primary\", \"db-backup\"]\nhold_down_ms = 60000\n\
             command = [\"sh\", \"-c\", 'echo \"$GMA_RULE $GMA_KEY $GMA_SOURCE $GMA_NAME\" >> {}']\n\
             [[rule]]\nname = \"bad-when\"\nevents = [\"host.load\"]\nwhen = 'free_cpus == \"none\"'\n\
             command = [\"true\"]\n",
            marker.display()
        ),
    )
    .unwrap();
    let mon = start_monitor(&dir.addr, &mcfg);
    let state = |p: &str, b: &str| format!("rule page-db: db-primary={p} db-backup={b}");
    assert!(
        wait_until(Duration::from_secs(10), || count_logs(
            &mon,
            &state("clear", "clear")
        ) > 0),
        "the monitor never saw both hosts up; log:\n{}",
        mon.stderr_text()
    );
    let set = |host: &str, v: &str| {
        let r = gma(
            &["sim", "set", host, v, "--producer", &prod.addr],
            Duration::from_secs(10),
        );
        assert_eq!(r.code, 0, "sim set: {}", r.stderr);
    };

    // One host down: the rule does not fire.
    set("db-primary", "free_cpus=0");
    assert!(wait_until(Duration::from_secs(10), || count_logs(
        &mon,
        &state("holds", "clear")
    ) >= 3));
    assert_eq!(count_logs(&mon, "rule page-db fires"), 0, "{}", mon.stderr_text());
    assert!(lines(&marker).is_empty());

    // Both down: it fires, once.
    set("db-backup", "free_cpus=0");
    assert!(
        wait_until(Duration::from_secs(10), || !lines(&marker).is_empty()),
        "no page; log:\n{}",
        mon.stderr_text()
    );
    assert_eq!(
        lines(&marker),
        vec!["page-db page-db db-primary,db-backup host.load".to_string()]
    );
    // Both stay down while the hosts keep publishing (10 more evaluations of both down).
    let both = state("holds", "holds");
    let at = count_logs(&mon, &both);
    assert!(wait_until(Duration::from_secs(10), || count_logs(&mon, &both) >= at + 10));
    assert_eq!(count_logs(&mon, "rule page-db fires"), 1, "{}", mon.stderr_text());
    assert_eq!(lines(&marker).len(), 1);
    assert!(wait_until(Duration::from_secs(10), || !firings(&mon).is_empty()));
    let f = firings(&mon);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["values"]["rule"], "page-db");
    assert_eq!(f[0]["values"]["key"], "page-db");
    assert_eq!(f[0]["values"]["outcome"], "ok");

    // The rule whose `when` does not fit host.load is refused by the producer, loudly.
    assert!(
        wait_until(Duration::from_secs(10), || logs(&mon)
            .iter()
            .any(|l| l.contains("rule bad-when: producer") && l.contains("column"))),
        "{}",
        mon.stderr_text()
    );
}

#[test]
fn a_bad_when_fails_at_startup_with_its_column() {
    let tmp = tempdir();
    let cfg = tmp.path().join("m.toml");
    std::fs::write(
        &cfg,
        "[[rule]]\nname = \"r\"\nevents = [\"host.load\"]\nwhen = 'free_cpus == 0 andd load > 1'\n\
         command = [\"true\"]\n",
    )
    .unwrap();
    let r = gma(
        &[
            "monitor",
            "--config",
            cfg.to_str().unwrap(),
            "--directory",
            "127.0.0.1:1",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("rule \"r\": when: at column 16"),
        "{}",
        r.stderr
    );
    let cfg2 = tmp.path().join("m2.toml");
    std::fs::write(&cfg2, "[[rule]]\nname = \"r\"\nevnts = [\"x\"]\n").unwrap();
    let r = gma(
        &["monitor", "--config", cfg2.to_str().unwrap()],
        Duration::from_secs(10),
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("line 3") && r.stderr.contains("evnts"),
        "{}",
        r.stderr
    );
}
